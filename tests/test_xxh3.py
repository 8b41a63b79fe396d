"""The vectorized XXH3-128 must equal python-xxhash bit for bit, on both backends."""

import numpy as np
import pytest
import torch
import xxhash

from transforms.xxh3 import torch_ops, xxh3_128_rows

# every length of every code path and its boundaries: 0, 1-3, 4-8, 9-16, 17-128, 129-240, long
LENGTHS = list(range(0, 300)) + [319, 320, 321, 1023, 1024, 1025, 1087, 1088, 2047, 2048, 2049,
                                 3071, 4103]
SEEDS = [0, 1, 0x9E3779B185EBCA87, 2**64 - 1]


def _ref(rows: np.ndarray, seed: int) -> list[int]:
    return [xxhash.xxh3_128_intdigest(r.tobytes(), seed) for r in rows]


def _ints(lo, hi) -> list[int]:
    m = 2**64 - 1
    return [((int(h) & m) << 64) | (int(lo_) & m) for lo_, h in zip(lo, hi, strict=True)]


@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_backend_matches_c_library(seed):
    rng = np.random.default_rng(seed & 0xFFFF)
    for n in LENGTHS:
        rows = rng.integers(0, 256, (3, n), dtype=np.uint8)
        assert _ints(*xxh3_128_rows(rows, seed)) == _ref(rows, seed), f"length {n}"


@pytest.mark.parametrize("seed", [0, 0x9E3779B185EBCA87])
def test_torch_backend_matches_c_library(seed):
    rng = np.random.default_rng(7)
    xp = torch_ops("cpu")
    for n in LENGTHS:
        rows = rng.integers(0, 256, (3, n), dtype=np.uint8)
        got = _ints(*xxh3_128_rows(torch.from_numpy(rows), seed, xp))
        assert got == _ref(rows, seed), f"length {n}"


def test_rows_are_independent_of_batch_size():
    rows = np.random.default_rng(1).integers(0, 256, (500, 40), dtype=np.uint8)
    lo, hi = xxh3_128_rows(rows)
    lo1, hi1 = xxh3_128_rows(rows[123:124])
    assert (lo[123], hi[123]) == (lo1[0], hi1[0])
