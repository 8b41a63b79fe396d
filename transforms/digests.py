"""Digests of canonical rows: the hashing kernel under every fingerprint.

A digest is ``XXH3-128(canonical bytes) XOR XXH3-128(header)`` as 16 bytes in the
canonical big-endian order (``docs/fingerprint.md``). ``hash_rows`` hashes a batch's rows
on the CPU: rows of up to ``VECTOR_MAX_ROW_BYTES`` with array operations in two threads,
longer rows with one C call each on cache-sized blocks, rows over ``STREAM_SLICE_BYTES``
slice by slice. Why a module of its own: the numpy front end (``transforms.fingerprint``)
and the torch device kernel (``transforms.fingerprint_torch``) both end here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from transforms.canonical import canonical_bits
from transforms.xxh3 import xxh3_128_rows

SCHEME = "xxh3-128-xor-header/v1"
DIGEST_BYTES = 16
DIGEST_DTYPE = np.dtype(f"V{DIGEST_BYTES}")

VECTOR_MAX_ROW_BYTES = 64  # measured crossover with the per-row C loop (docs/fingerprint.md)
VECTOR_MIN_ROWS = 256  # below this the per-call overhead of array ops dominates
VECTOR_BLOCK_ROWS = 65536  # keeps the vectorized temporaries in L2
LOOP_BLOCK_BYTES = 512 << 10  # C-loop block: canonicalised and hashed while in L2
STREAM_SLICE_BYTES = 1 << 20  # rows above this are checked and hashed slice by slice


def header_key(hdr: bytes) -> np.ndarray:
    """XXH3-128 of a header as (hi, lo) uint64: XORed into every digest of that header."""
    k = xxhash.xxh3_128_intdigest(hdr)
    return np.array([k >> 64, k & ((1 << 64) - 1)], dtype=np.uint64)


def pack_digests(lo: np.ndarray, hi: np.ndarray, key: np.ndarray) -> np.ndarray:
    """(lo, hi) 64-bit halves XOR header key -> 16-byte big-endian digests."""
    out = np.empty((len(lo), 2), dtype=">u8")
    out[:, 0] = hi ^ key[0]
    out[:, 1] = lo ^ key[1]
    return out.view(DIGEST_DTYPE).reshape(-1)


def _loop_hash(b: np.ndarray) -> np.ndarray:
    """XXH3-128 of each row of an (n, L) uint8 block with the C library, as (n, 2) uint64."""
    digests = b"".join(map(xxhash.xxh3_128_digest, b))
    return np.frombuffer(digests, dtype=">u8").reshape(-1, 2)


def _stream_hash(row: np.ndarray, name: str) -> bytes:
    """XXH3-128 of one large record, canonicalised and hashed slice by slice (read once)."""
    flat = row.reshape(-1)
    step = max(1, STREAM_SLICE_BYTES // max(flat.itemsize, 1))
    h = xxhash.xxh3_128()
    for s in range(0, flat.shape[0], step):
        h.update(canonical_bits(flat[s : s + step], name))
    return h.digest()


def hash_rows(arr: np.ndarray, name: str, key: np.ndarray) -> np.ndarray:
    """Digests of the rows of ``arr`` (first axis = records) under a header key.

    Short rows: vectorized XXH3 in two threads (numpy releases the GIL). Longer
    rows: one C call per row on L2-sized canonical blocks, in this thread
    (python-xxhash holds the GIL, so a second thread would only wait).
    """
    n = arr.shape[0]
    if n == 0:
        return np.empty(0, dtype=DIGEST_DTYPE)
    row_bytes = arr.nbytes // n

    def canonical(lo: int, hi: int) -> np.ndarray:
        return canonical_bits(arr[lo:hi], name).reshape(hi - lo, -1).view(np.uint8)

    if row_bytes <= VECTOR_MAX_ROW_BYTES and n >= VECTOR_MIN_ROWS:
        def vector_block(lo: int) -> np.ndarray:
            hi = min(n, lo + VECTOR_BLOCK_ROWS)
            return pack_digests(*xxh3_128_rows(canonical(lo, hi)), key)

        starts = range(0, n, VECTOR_BLOCK_ROWS)
        if len(starts) == 1:
            return vector_block(0)
        with ThreadPoolExecutor(2) as pool:
            return np.concatenate(list(pool.map(vector_block, starts)))
    if row_bytes > STREAM_SLICE_BYTES:
        raw = b"".join(_stream_hash(arr[i], name) for i in range(n))
        halves = np.frombuffer(raw, dtype=">u8").reshape(-1, 2)
    else:
        step = max(1, LOOP_BLOCK_BYTES // max(row_bytes, 1))
        halves = np.concatenate([_loop_hash(canonical(s, min(n, s + step)))
                                 for s in range(0, n, step)])
    return pack_digests(halves[:, 1], halves[:, 0], key)
