"""The exact fingerprint computed on a torch tensor's own device (CUDA, or CPU in tests).

Why: when a batch already lives on a GPU (training-time filters), copying it to
the host to hash it costs more than hashing it there. This kernel canonicalises
on the device with integer bit views, runs the vectorized XXH3-128 of
``transforms.xxh3`` with torch ops, and copies back only the 16-byte digests.
It gives bit-identical digests to the numpy path (tested on CPU tensors).

Exception, documented in docs/fingerprint.md: rows longer than
``DEVICE_MAX_ROW_BYTES`` need one sequential kernel round per KiB of row, so
their canonical bytes are copied to the host and hashed by the C library there.
"""

from __future__ import annotations

import numpy as np
import torch

from transforms.canonical import FLOAT_BITS, header, refuse_meta
from transforms.digests import DIGEST_DTYPE, hash_rows, header_key, pack_digests
from transforms.xxh3 import torch_ops, xxh3_128_rows

DEVICE_MAX_ROW_BYTES = 64 << 10
CHUNK_BYTES = 64 << 20  # bounds the device temporaries of one kernel call

_NAMES = {
    torch.bool: "bool", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
    torch.int64: "int64", torch.uint8: "uint8", torch.uint16: "uint16",
    torch.uint32: "uint32", torch.uint64: "uint64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
    torch.complex32: "complex32", torch.complex64: "complex64", torch.complex128: "complex128",
}
_SIGNED_VIEW = {16: torch.int16, 32: torch.int32, 64: torch.int64}


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def canonical_bytes(t: torch.Tensor) -> torch.Tensor:
    """(N, L) uint8 tensor of canonical row bytes, on ``t``'s device."""
    n = t.shape[0]
    if t.dtype == torch.bool:
        return t.reshape(n, -1).to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    if _NAMES[t.dtype] in FLOAT_BITS:  # the same constants as the numpy path
        utype, sign, inf, qnan = FLOAT_BITS[_NAMES[t.dtype]]
        width = 8 * np.dtype(utype).itemsize
        bits = t.contiguous().view(_SIGNED_VIEW[width])
        magnitude = bits & _signed(sign - 1, width)
        bits = torch.where(bits == _signed(sign, width), torch.zeros_like(bits), bits)
        bits = torch.where(magnitude > inf, torch.full_like(bits, qnan), bits)
        t = bits
    flat = t.contiguous().reshape(n, -1)
    if flat.shape[1] == 0:
        return torch.empty((n, 0), dtype=torch.uint8, device=t.device)
    return flat.view(torch.uint8)


def fingerprint_batch_torch(batch: torch.Tensor) -> np.ndarray:
    """Digests of the rows of a torch tensor, computed on its device; returns ``V16`` array."""
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"backend='torch' needs a torch.Tensor, got {type(batch).__name__}")
    if batch.dtype not in _NAMES:
        raise TypeError(f"unsupported dtype {batch.dtype}")
    refuse_meta(batch)
    if batch.layout != torch.strided or batch.is_quantized:
        raise TypeError(f"unsupported torch tensor ({batch.layout}, dtype {batch.dtype})")
    if batch.dim() == 0:
        raise ValueError("fingerprint_batch needs a batch: a tensor whose first axis is records")
    t = batch.detach().resolve_conj().resolve_neg()
    name = _NAMES[t.dtype]
    key = header_key(header(b"TDFP", name, tuple(int(d) for d in t.shape[1:])))
    n = t.shape[0]
    if n == 0:
        return np.empty(0, dtype=DIGEST_DTYPE)
    b = canonical_bytes(t)
    width = b.shape[1]
    if width > DEVICE_MAX_ROW_BYTES and b.device.type != "cpu":
        return hash_rows(b.cpu().numpy(), "uint8", key)
    xp = torch_ops(b.device)
    step = max(1, CHUNK_BYTES // max(width, 1))
    parts = []
    for start in range(0, n, step):
        lo, hi = xxh3_128_rows(b[start : start + step], 0, xp)
        parts.append(torch.stack([lo, hi]).cpu().numpy().view(np.uint64))
    halves = np.concatenate(parts, axis=1)
    return pack_digests(halves[0], halves[1], key)
