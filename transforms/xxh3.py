"""Vectorized seeded XXH3-128 over the rows of a byte matrix.

Why this exists: python-xxhash hashes one buffer per call, so short rows cost a
Python call each, and it cannot run on a GPU. This module computes exactly the
same 128-bit XXH3 values as the C library for every row of an ``(n, L)`` uint8
matrix at once, with array operations only, on two backends:

* ``NUMPY`` -- uint64 arrays, used on CPU for short rows;
* ``torch_ops(device)`` -- int64 tensors (wrapping arithmetic, logical shifts
  emulated with masks), used for CUDA tensors so only digests leave the device.

Results are returned as ``(lo, hi)``: the low and high 64-bit halves of the
XXH128 value (the C library's ``XXH128_hash_t``). The tests compare every input
length 0..2100 against python-xxhash bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2, P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P64_4, P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
PRIME_MX1, PRIME_MX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25

SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
INIT_ACC = (P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1)
STRIPE = 64
BLOCK = 1024  # 16 stripes per block with the 192-byte default secret


def _s64(off: int, secret: bytes = SECRET) -> int:
    return int.from_bytes(secret[off : off + 8], "little")


def _s32(off: int) -> int:
    return int.from_bytes(SECRET[off : off + 4], "little")


def _custom_secret(seed: int) -> bytes:
    """XXH3_initCustomSecret: the secret the long-input path uses for a non-zero seed."""
    out = bytearray()
    for i in range(0, len(SECRET), 16):
        out += ((_s64(i) + seed) & M64).to_bytes(8, "little")
        out += ((_s64(i + 8) - seed) & M64).to_bytes(8, "little")
    return bytes(out)


class _NumpyOps:
    """uint64 arithmetic on numpy arrays (wraps modulo 2**64 natively)."""

    def c(self, v: int) -> np.uint64:
        return np.uint64(v & M64)

    def shr(self, x, s: int):
        return x >> np.uint64(s)

    def shl(self, x, s: int):
        return x << np.uint64(s)

    def words(self, b, start: int, nwords: int):
        """Little-endian 64-bit words ``b[:, start : start + 8*nwords]`` as (n, nwords)."""
        return np.ascontiguousarray(b[:, start : start + 8 * nwords]).view("<u8")

    def rd32(self, b, off: int):
        return np.ascontiguousarray(b[:, off : off + 4]).view("<u4")[:, 0].astype(np.uint64)

    def byte(self, b, i: int):
        return b[:, i].astype(np.uint64)

    def full(self, like, v: int):
        return np.full(like.shape[0], v & M64, dtype=np.uint64)

    def table(self, rows: list[list[int]]):
        return np.array(rows, dtype=np.uint64)

    def sum1(self, x):
        return x.sum(axis=1, dtype=np.uint64)


class _TorchOps:
    """The same operations on torch int64 tensors (two's complement wrap-around)."""

    def __init__(self, device: Any):
        import torch

        self.torch = torch
        self.device = device

    def c(self, v: int) -> int:
        v &= M64
        return v - (1 << 64) if v >= 1 << 63 else v

    def shr(self, x, s: int):
        return (x >> s) & ((1 << (64 - s)) - 1)

    def shl(self, x, s: int):
        return x << s

    def _dense(self, x):
        """A copy with standard strides (``contiguous()`` keeps odd strides of size-1 dims)."""
        return self.torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)

    def words(self, b, start: int, nwords: int):
        return self._dense(b[:, start : start + 8 * nwords]).view(self.torch.int64)

    def rd32(self, b, off: int):
        return self._dense(b[:, off : off + 4]).view(self.torch.int32)[:, 0].long() & M32

    def byte(self, b, i: int):
        return b[:, i].long()

    def full(self, like, v: int):
        return self.torch.full((like.shape[0],), self.c(v), dtype=self.torch.int64,
                               device=self.device)

    def table(self, rows: list[list[int]]):
        return self.torch.tensor([[self.c(v) for v in r] for r in rows], dtype=self.torch.int64,
                                 device=self.device)

    def sum1(self, x):
        return x.sum(dim=1)


NUMPY = _NumpyOps()


def torch_ops(device: Any) -> _TorchOps:
    return _TorchOps(device)


def _rd64(xp, b, off: int):
    return xp.words(b, off, 1)[:, 0]


def _mult128(xp, a, b):
    """Full 64x64 -> 128-bit product via 32-bit halves: returns (lo, hi)."""
    a_lo, a_hi = a & xp.c(M32), xp.shr(a, 32)
    if isinstance(b, int):
        b_lo, b_hi = xp.c(b & M32), xp.c(b >> 32)
    else:
        b_lo, b_hi = b & xp.c(M32), xp.shr(b, 32)
    lo_lo, hi_lo = a_lo * b_lo, a_hi * b_lo
    lo_hi, hi_hi = a_lo * b_hi, a_hi * b_hi
    cross = xp.shr(lo_lo, 32) + (hi_lo & xp.c(M32)) + lo_hi
    upper = xp.shr(hi_lo, 32) + xp.shr(cross, 32) + hi_hi
    lower = xp.shl(cross, 32) | (lo_lo & xp.c(M32))
    return lower, upper


def _fold64(xp, a, b):
    lo, hi = _mult128(xp, a, b)
    return lo ^ hi


def _xorshift(xp, x, s: int):
    return x ^ xp.shr(x, s)


def _avalanche_xxh64(xp, h):
    h = _xorshift(xp, h, 33) * xp.c(P64_2)
    h = _xorshift(xp, h, 29) * xp.c(P64_3)
    return _xorshift(xp, h, 32)


def _avalanche(xp, h):
    h = _xorshift(xp, h, 37) * xp.c(PRIME_MX1)
    return _xorshift(xp, h, 32)


def _swap32(xp, x):
    m8 = xp.c(0xFF)
    return (xp.shl(x & m8, 24) | xp.shl(xp.shr(x, 8) & m8, 16)
            | xp.shl(xp.shr(x, 16) & m8, 8) | (xp.shr(x, 24) & m8))


def _swap64(xp, x):
    return xp.shl(_swap32(xp, x & xp.c(M32)), 32) | _swap32(xp, xp.shr(x, 32))


def _mix16(xp, b, off: int, soff: int, seed: int):
    return _fold64(xp, _rd64(xp, b, off) ^ xp.c(_s64(soff) + seed),
                   _rd64(xp, b, off + 8) ^ xp.c(_s64(soff + 8) - seed))


def _mix32(xp, lo, hi, b, off1: int, off2: int, soff: int, seed: int):
    lo = lo + _mix16(xp, b, off1, soff, seed)
    lo = lo ^ (_rd64(xp, b, off2) + _rd64(xp, b, off2 + 8))
    hi = hi + _mix16(xp, b, off2, soff + 16, seed)
    hi = hi ^ (_rd64(xp, b, off1) + _rd64(xp, b, off1 + 8))
    return lo, hi


def _len0(xp, b, seed: int):
    lo = _avalanche_xxh64(xp, xp.full(b, seed ^ _s64(64) ^ _s64(72)))
    hi = _avalanche_xxh64(xp, xp.full(b, seed ^ _s64(80) ^ _s64(88)))
    return lo, hi


def _len1to3(xp, b, n: int, seed: int):
    c1, c2, c3 = xp.byte(b, 0), xp.byte(b, n >> 1), xp.byte(b, n - 1)
    combl = xp.shl(c1, 16) | xp.shl(c2, 24) | c3 | xp.c(n << 8)
    sw = _swap32(xp, combl)
    combh = (xp.shl(sw, 13) | xp.shr(sw, 19)) & xp.c(M32)
    lo = _avalanche_xxh64(xp, combl ^ xp.c((_s32(0) ^ _s32(4)) + seed))
    hi = _avalanche_xxh64(xp, combh ^ xp.c((_s32(8) ^ _s32(12)) - seed))
    return lo, hi


def _len4to8(xp, b, n: int, seed: int):
    swapped = int.from_bytes((seed & M32).to_bytes(4, "little"), "big")
    seed ^= swapped << 32
    in64 = xp.rd32(b, 0) + xp.shl(xp.rd32(b, n - 4), 32)
    keyed = in64 ^ xp.c((_s64(16) ^ _s64(24)) + seed)
    lo, hi = _mult128(xp, keyed, (P64_1 + (n << 2)) & M64)
    hi = hi + xp.shl(lo, 1)
    lo = lo ^ xp.shr(hi, 3)
    lo = _xorshift(xp, lo, 35) * xp.c(PRIME_MX2)
    lo = _xorshift(xp, lo, 28)
    return lo, _avalanche(xp, hi)


def _len9to16(xp, b, n: int, seed: int):
    in_lo, in_hi = _rd64(xp, b, 0), _rd64(xp, b, n - 8)
    mlo, mhi = _mult128(xp, in_lo ^ in_hi ^ xp.c((_s64(32) ^ _s64(40)) - seed), P64_1)
    mlo = mlo + xp.c((n - 1) << 54)
    in_hi = in_hi ^ xp.c((_s64(48) ^ _s64(56)) + seed)
    mhi = mhi + in_hi + (in_hi & xp.c(M32)) * xp.c(P32_2 - 1)
    mlo = mlo ^ _swap64(xp, mhi)
    hlo, hhi = _mult128(xp, mlo, P64_2)
    hhi = hhi + mhi * xp.c(P64_2)
    return _avalanche(xp, hlo), _avalanche(xp, hhi)


def _finish_mid(xp, lo, hi, n: int, seed: int):
    h_lo = lo + hi
    h_hi = lo * xp.c(P64_1) + hi * xp.c(P64_4) + xp.c((n - seed) * P64_2)
    return _avalanche(xp, h_lo), xp.c(0) - _avalanche(xp, h_hi)


def _len17to128(xp, b, n: int, seed: int):
    lo, hi = xp.full(b, n * P64_1), xp.full(b, 0)
    for i in range((n - 1) // 32, -1, -1):
        lo, hi = _mix32(xp, lo, hi, b, 16 * i, n - 16 * (i + 1), 32 * i, seed)
    return _finish_mid(xp, lo, hi, n, seed)


def _len129to240(xp, b, n: int, seed: int):
    lo, hi = xp.full(b, n * P64_1), xp.full(b, 0)
    for i in range(32, 160, 32):
        lo, hi = _mix32(xp, lo, hi, b, i - 32, i - 16, i - 32, seed)
    lo, hi = _avalanche(xp, lo), _avalanche(xp, hi)
    for i in range(160, n + 1, 32):
        lo, hi = _mix32(xp, lo, hi, b, i - 32, i - 16, 3 + i - 160, seed)
    lo, hi = _mix32(xp, lo, hi, b, n - 16, n - 32, 136 - 17 - 16, -seed)
    return _finish_mid(xp, lo, hi, n, seed)


_LANE_SWAP = [1, 0, 3, 2, 5, 4, 7, 6]


def _accumulate(xp, acc, w, keys):
    """Add ``S`` stripes ``w`` (n, S, 8) to ``acc`` (n, 8); order-free inside a block."""
    dk = w ^ keys
    acc = acc + xp.sum1((dk & xp.c(M32)) * xp.shr(dk, 32))
    return acc + xp.sum1(w)[:, _LANE_SWAP]


def _merge(xp, acc, sec: bytes, soff: int, start: int):
    r = xp.full(acc, start)
    for i in range(4):
        r = r + _fold64(xp, acc[:, 2 * i] ^ xp.c(_s64(soff + 16 * i, sec)),
                        acc[:, 2 * i + 1] ^ xp.c(_s64(soff + 16 * i + 8, sec)))
    return _avalanche(xp, r)


def _long(xp, b, n: int, seed: int):
    rows = b.shape[0]
    sec = _custom_secret(seed) if seed else SECRET
    stripe_keys = xp.table([[_s64(8 * (s + i), sec) for i in range(8)] for s in range(16)])
    scramble_keys = xp.table([[_s64(128 + 8 * i, sec) for i in range(8)]])[0]
    last_keys = xp.table([[_s64(121 + 8 * i, sec) for i in range(8)]])
    acc = xp.table([list(INIT_ACC)]) + xp.full(b, 0)[:, None]
    nb_blocks = (n - 1) // BLOCK
    for blk in range(nb_blocks):
        w = xp.words(b, blk * BLOCK, BLOCK // 8).reshape(rows, 16, 8)
        acc = _accumulate(xp, acc, w, stripe_keys)
        acc = _xorshift(xp, acc, 47) ^ scramble_keys
        acc = acc * xp.c(P32_1)
    nb_stripes = ((n - 1) - BLOCK * nb_blocks) // STRIPE
    if nb_stripes:
        w = xp.words(b, nb_blocks * BLOCK, nb_stripes * 8).reshape(rows, nb_stripes, 8)
        acc = _accumulate(xp, acc, w, stripe_keys[:nb_stripes])
    w = xp.words(b, n - STRIPE, 8).reshape(rows, 1, 8)
    acc = _accumulate(xp, acc, w, last_keys)
    lo = _merge(xp, acc, sec, 11, n * P64_1)
    hi = _merge(xp, acc, sec, 192 - 64 - 11, ~(n * P64_2))
    return lo, hi


def xxh3_128_rows(b, seed: int = 0, xp=NUMPY):
    """Seeded XXH3-128 of every row of the (n, L) uint8 matrix ``b``: ``(lo, hi)`` arrays."""
    n = b.shape[1]
    seed &= M64
    if n == 0:
        return _len0(xp, b, seed)
    if n <= 3:
        return _len1to3(xp, b, n, seed)
    if n <= 8:
        return _len4to8(xp, b, n, seed)
    if n <= 16:
        return _len9to16(xp, b, n, seed)
    if n <= 128:
        return _len17to128(xp, b, n, seed)
    if n <= 240:
        return _len129to240(xp, b, n, seed)
    return _long(xp, b, n, seed)
