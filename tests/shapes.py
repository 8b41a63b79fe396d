"""Data shaped like real scraped datasets, for tests and benchmarks of the near stage.

Why: planted pairs in well-spread data (tests/embeddings.py) are the easy case. Real
inputs hold crowds (one item re-encoded thousands of times, so m^2/2 pairs within
tolerance), blank or near-zero records, features whose magnitudes span many orders,
wide image tensors, inputs that are nearly all copies, and NaN rows. Each generator
is numpy only, seeded, sized by its arguments, and documents its shape; the ones that
plant pairs return them so a test or benchmark can score recall.

``write_parquet`` writes any of them as the job reads them (an ``id`` column with the
row index as text, the tensor as nested fixed-size lists in column ``emb``), from one
array or from an iterable of blocks, so a multi-GB input never sits in memory whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from tests.embeddings import embeddings, rotated

__all__ = ["background", "crowd", "with_blanks", "magnitudes", "image_rows", "image_pairs",
           "images", "image_tolerance", "satellites", "identical", "one_distinct", "single",
           "nothing_within", "one_cell", "with_nans", "write_parquet", "tensor_bytes"]


def background(n: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    """(n, dim) float32 unit vectors shaped like sentence embeddings (tests/embeddings.py)."""
    return embeddings(n, dim, clusters=min(2000, max(1, n // 50)), seed=seed)


def _unit(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    u = rng.standard_normal(shape)
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def crowd(center: np.ndarray, m: int, tolerance: float, metric: str = "l2",
          seed: int = 0) -> np.ndarray:
    """(m, d) float32: m records, each within a quarter of ``tolerance`` of ``center`` (a
    (d,) vector), so every pair of them is within the tolerance (m^2/2 pairs).

    l2: the centre plus a random direction scaled to a distance uniform in
    (0, tolerance / 4]. cosine: the centre turned by a cosine distance uniform in
    (0, tolerance / 4] (tests/embeddings.rotated), with the centre's norm. Two members at
    cosine distance a, b from the centre are within 4 max(a, b) <= tolerance of each
    other (1 - cos 2t = 2 (1 - cos t)(1 + cos t)). The float32 rounding moves members by
    about 1e-7 of their norm: keep the tolerance well above that."""
    rng = np.random.default_rng(seed)
    c = np.asarray(center, dtype=np.float64).reshape(1, -1)
    if metric == "l2":
        r = rng.uniform(0, tolerance / 4, (m, 1)) * 0.999
        return (c + _unit(rng, (m, c.shape[1])) * r).astype(np.float32)
    if metric != "cosine":
        raise ValueError(f"metric must be l2 or cosine, got {metric!r}")
    turned = rotated(np.repeat(c, m, 0), rng.uniform(0, tolerance / 4, m) * 0.999, rng)
    return (turned * np.linalg.norm(c)).astype(np.float32)


def satellites(seed: int = 0, m: int = 1500, k: int = 60, d: int = 16, r: float = 0.05
               ) -> np.ndarray:
    """Rows in keep order for l2 tolerance ``r``: a crowd of m (within r/4 of a centre c)
    whose k edge members g = c + 0.45 r u come early, and late satellites
    s = c + 1.4 r u (within 0.95 r of g, over 1.15 r from every other member, so from
    every row a keep-order visit keeps in the crowd) with chains beyond (c + 2.35 r u):
    a satellite reaches the crowd's component only through a removed member."""
    rng = np.random.default_rng(seed)
    bg = rng.standard_normal((1500, d)).astype(np.float32)
    c = bg[0].astype(np.float64)
    members = crowd(c, m, r, "l2", seed=seed + 1)
    u = _unit(rng, (k, d))
    edge, far, farther = ((c + f * r * u).astype(np.float32) for f in (0.45, 1.4, 2.35))
    tail = np.concatenate([members[10:], far, farther])
    return np.concatenate([bg, members[:10], edge, tail[rng.permutation(len(tail))]])


def with_blanks(x: np.ndarray, share: float = 0.1, noise: float = 1e-6,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A copy of ``x`` (n, d) with ``share`` of its rows blank: half exact zeros, half
    near-zero (Gaussian noise of scale ``noise`` per value), as failed decodes and
    padding give; and the rows made blank. Exact zeros are exact copies of each other;
    under l2 the near-zero rows are one crowd with the zeros; under cosine a zero row has
    no direction (never within) and the noise rows point anywhere."""
    rng = np.random.default_rng(seed)
    out = x.copy()
    rows = np.sort(rng.choice(len(x), int(len(x) * share), replace=False))
    zeros, tiny = rows[::2], rows[1::2]
    out[zeros] = 0
    out[tiny] = (rng.standard_normal((len(tiny), x.shape[1])) * noise).astype(x.dtype)
    return out, rows


def magnitudes(n: int, dim: int = 64, lo: float = 1e-3, hi: float = 1e3,
               tolerance: float = 0.01, copies: float = 0.05, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray]:
    """(n, dim) float32 unnormalised features with norms log-uniform in [lo, hi], and the
    (m, 2) (original, copy) rows of ``copies`` x n planted near copies at l2 distances
    uniform in 0.25-0.9 x ``tolerance``, shuffled in. Rows with norms near ``lo`` are
    within an l2 ``tolerance`` of each other when 2 lo < tolerance: a natural crowd."""
    rng = np.random.default_rng(seed)
    n_copy = int(n * copies)
    n_base = n - n_copy
    base = _unit(rng, (n_base, dim)) * np.exp(rng.uniform(np.log(lo), np.log(hi), (n_base, 1)))
    src = rng.choice(n_base, n_copy, replace=False)
    near = base[src] + _unit(rng, (n_copy, dim)) * rng.uniform(0.25, 0.9, (n_copy, 1)) * tolerance
    x = np.concatenate([base, near]).astype(np.float32)
    perm = rng.permutation(n)
    where = np.empty(n, np.int64)
    where[perm] = np.arange(n)
    pairs = np.stack([where[src], where[np.arange(n_base, n)]], axis=1)
    return x[perm], pairs


# Images: blocks of _GROUP records; the last record of each block is a re-encode-like copy
# of an earlier one in the same block, so any row range is generated on its own.
def _group(copies: float) -> int:
    return max(2, round(1 / copies)) if copies > 0 else 0


def image_rows(start: int, stop: int, shape: tuple[int, ...] = (64, 64, 3),
               dtype: str = "uint8", copies: float = 0.05, seed: int = 0) -> np.ndarray:
    """Records [start, stop) of an image set: (stop - start, *shape) of ``dtype`` (uint8
    levels 0-255, or float32 levels / 255). shape is (H, W) or (H, W, C).

    Each record is a smooth random picture (an 8x8 grid of colours blown up, plus
    per-pixel detail of 8 levels), so two distinct records are thousands of levels
    apart (l2). Every ``round(1 / copies)``-th record is a re-encode of an earlier record
    of its block: the same picture with rounding noise (sigma 1 level, l2 about
    1.04 sqrt(values)) or a brightness shift of 1-2 levels (l2 up to 2 sqrt(values)),
    clipped to 0-255; ``image_pairs`` lists them."""
    k = _group(copies)
    shape = tuple(shape)
    h, w = shape[:2]
    c = shape[2] if len(shape) > 2 else 1
    step = k or 1024
    first = start - start % step
    out = np.empty((max(stop, first) - first, h, w, c), np.uint8)
    for a in range(first, stop, step):
        b = min(a + step, stop) if not k else a + k
        rng = np.random.default_rng([seed, a // step])
        grid = rng.uniform(0, 255, (b - a, 8, 8, c))
        big = np.repeat(np.repeat(grid, -(-h // 8), 1), -(-w // 8), 2)[:, :h, :w]
        pic = np.clip(np.rint(big + rng.normal(0, 8, big.shape)), 0, 255)
        if k:
            src = (a // k * 7919) % (k - 1)
            if rng.random() < 0.5:
                moved = pic[src] + np.rint(rng.normal(0, 1, pic[src].shape))
            else:
                moved = pic[src] + rng.choice([-2, -1, 1, 2])
            pic[k - 1] = np.clip(moved, 0, 255)
        n = min(b, stop) - a
        out[a - first:a - first + n] = pic[:n]
    out = out[start - first:].reshape((stop - start, *shape))
    return out if dtype == "uint8" else (out.astype(np.float32) / np.float32(255))


def image_pairs(n: int, copies: float = 0.05) -> np.ndarray:
    """(m, 2) (original, copy) rows of the re-encode copies among an image set's first n."""
    k = _group(copies)
    if not k:
        return np.empty((0, 2), np.int64)
    copy = np.arange(k - 1, n, k, dtype=np.int64)
    block = copy - (k - 1)
    return np.stack([block + (block // k * 7919) % (k - 1), copy], axis=1)


def images(n: int, shape: tuple[int, ...] = (64, 64, 3), dtype: str = "uint8",
           copies: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(n, *shape) image records and their planted (original, copy) rows: ``image_rows``
    over all n (for big sets write ``image_rows`` blocks instead)."""
    return image_rows(0, n, shape, dtype, copies, seed), image_pairs(n, copies)


def image_tolerance(shape: tuple[int, ...], dtype: str = "uint8") -> float:
    """An l2 threshold for an image set: 3 levels RMS per value, above every planted copy
    (at most 2 levels RMS) and far below two distinct pictures (over 11 levels RMS)."""
    t = 3 * float(np.sqrt(np.prod(shape)))
    return t if dtype == "uint8" else t / 255


def identical(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    """(n, dim) float32: n exact copies of one random vector."""
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return np.repeat(v[None], n, 0)


def one_distinct(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    """(n, dim) float32: n - 1 exact copies of one vector and one other record (last)."""
    x = identical(n, dim, seed)
    x[-1] = -x[-1] + 1
    return x


def single(dim: int = 64, seed: int = 0) -> np.ndarray:
    """(1, dim) float32: an input of one record."""
    return identical(1, dim, seed)


def nothing_within(n: int, dim: int = 64, tolerance: float = 0.01, metric: str = "l2",
                   seed: int = 0) -> np.ndarray:
    """(n, dim) float32 with no pair within ``tolerance``. l2: the first value of row i
    is 2 i x tolerance (so rows differ by at least 2 x tolerance), the others are
    Gaussian. cosine: Gaussian directions in ``dim`` dimensions (cosine distance about
    1 +- 4 / sqrt(dim); check with tests/oracle.near_pairs for a tolerance near that)."""
    x = np.random.default_rng(seed).standard_normal((n, dim))
    if metric == "l2":
        x[:, 0] = 2 * tolerance * np.arange(n) * 1.001
    return x.astype(np.float32)


def one_cell(n: int, dim: int = 64, tolerance: float = 0.01, spread: float = 3.0,
             seed: int = 0) -> np.ndarray:
    """(n, dim) float32: every record in one tight ball (Gaussian, RMS radius ``spread``
    x ``tolerance`` about a point far from the origin), so k-means cannot separate them
    and many pairs, but not all, are within an l2 ``tolerance``."""
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal(dim) * 10
    x = centre + rng.standard_normal((n, dim)) * (spread * tolerance / np.sqrt(dim))
    return x.astype(np.float32)


def with_nans(x: np.ndarray, share: float = 0.01, seed: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
    """A copy of float ``x`` with ``share`` of its rows non-finite, in three kinds: all
    NaN, one NaN value, one inf value; and those rows. All-NaN rows are exact copies of
    each other (one canonical NaN)."""
    rng = np.random.default_rng(seed)
    out = x.copy()
    rows = np.sort(rng.choice(len(x), max(1, int(len(x) * share)), replace=False))
    flat = out.reshape(len(x), -1)
    col = rng.integers(0, flat.shape[1], len(rows))
    kind = np.arange(len(rows)) % 3
    flat[rows[kind == 0]] = np.nan
    flat[rows[kind == 1], col[kind == 1]] = np.nan
    flat[rows[kind == 2], col[kind == 2]] = np.inf
    return out, rows


def tensor_bytes(n: int, shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of n tensors as stored (values only): what the issue's memory bound counts."""
    return int(n * np.prod(shape) * np.dtype(dtype).itemsize)


def _blocks(data: np.ndarray | Iterable[np.ndarray], rows: int) -> Iterator[np.ndarray]:
    if isinstance(data, np.ndarray):
        for a in range(0, len(data), rows):
            yield data[a:a + rows]
    else:
        yield from data


def write_parquet(path: str | Path, data: np.ndarray | Iterable[np.ndarray],
                  row_group_rows: int | None = None, list_type: str = "fixed",
                  compression: str = "snappy") -> int:
    """Write records as the job reads them: ``id`` (row index as text) and ``emb`` (nested
    fixed-size lists, or ``list_type="list"`` for variable-size list<...>), one row group
    per block of ``row_group_rows`` (default: about 64 MB of values). ``data``: an array
    or an iterable of blocks (first axis = records). Returns the number of records."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, n = None, 0
    try:
        for block in _blocks(data, row_group_rows or 1 << 62):
            per_row = max(1, block[0].nbytes) if len(block) else 1
            rows = row_group_rows or max(1, (64 << 20) // per_row)
            for a in range(0, len(block), rows):
                part = np.ascontiguousarray(block[a:a + rows])
                col = pa.array(part.reshape(-1))
                for d in reversed(part.shape[1:]):
                    col = (pa.FixedSizeListArray.from_arrays(col, d) if list_type == "fixed"
                           else pa.ListArray.from_arrays(
                               pa.array(np.arange(0, len(col) + 1, d, dtype=np.int32)), col))
                ids = pa.array(np.arange(n, n + len(part)).astype(str))
                table = pa.table({"id": ids, "emb": col})
                if writer is None:
                    writer = pq.ParquetWriter(str(path), table.schema, compression=compression)
                writer.write_table(table, row_group_size=len(part))
                n += len(part)
    finally:
        if writer is not None:
            writer.close()
    return n
