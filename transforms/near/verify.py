"""Float64 verification of candidate pairs with the user's metric: what every removal
rests on (the searches only propose pairs; ``transforms.near.find``).

Why apart from the search: the search's rounding is bounded, this is the exact rule
(l2, 1 - cos, 1 - Pearson r, numpy.isclose), evaluated the same way by the kernel, the
job's cells, the merge and the recall check.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from transforms.near.search import rows_for

if TYPE_CHECKING:
    from transforms.near.spec import NearSpec


def flat_rows(x: np.ndarray) -> np.ndarray:
    """``x`` as (records, values), no record too (``reshape(len(x), -1)`` refuses an
    empty array)."""
    x = np.asarray(x)
    return x.reshape(len(x), math.prod(x.shape[1:]))


def centred_channels(x: np.ndarray, channels: int) -> np.ndarray:
    """Rows (n, d) as float64 with each channel's values (d / ``channels`` of them,
    interleaved as in an (h, w, c) image) minus their mean, channel after channel
    (the layout is (n, channels, d / channels) flattened). A channel whose values are
    all equal is exactly 0, whatever the mean's rounding.

    Why it must give the same bits for a row whatever rows come with it: the search
    bounds the distance between the unit vectors of these rows, and the verification
    measures the same rows again; both are then the cosine of one pair of float64
    vectors, and the cosine's rounding bound holds (``transforms.near.find.search_radius``).
    Each mean is a sum along the last axis of a C-contiguous array (numpy's pairwise sum
    over that row's own values: one order for any number of rows)."""
    x = flat_rows(x)
    if x.shape[1] % channels:
        raise ValueError(f"correlation over {channels} channels: records of {x.shape[1]} "
                         "values are not whole pixels")
    x = x.reshape(len(x), x.shape[1] // channels, channels)
    y = np.array(x.transpose(0, 2, 1), dtype=np.float64, order="C")  # a copy, always
    if y.size:
        y -= (y.sum(axis=2) / y.shape[2])[:, :, None]
        y[x.max(axis=1) == x.min(axis=1)] = 0.0
    return y.reshape(len(x), y.shape[1] * y.shape[2])


def directed(x: np.ndarray, spec: NearSpec) -> np.ndarray:
    """Rows that have a direction for cosine (not all zero) or correlation (some channel
    not flat); a row without one is never within tolerance of anything."""
    x = flat_rows(x)
    if spec.metric == "correlation":
        y = x.reshape(len(x), x.shape[1] // spec.channels, spec.channels)
        if not y.size:
            return np.zeros(len(x), bool)
        return (y.max(axis=1) != y.min(axis=1)).any(axis=1)
    return np.any(x != 0, axis=1)


def pow2_scaled(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows scaled by a power of two each, so that the largest |value| is in [0.5, 1);
    that power's exponent per row). Exact: a row of normal floats gets the same bits back
    from any product or norm scaled back, while squares of rows near 1e-160 or 1e160 no
    longer round to 0 or inf (the l2 of two rows 2e-200 apart read 0.0, and 1 - cos of
    rows of 1e200 NaN). Rows of zeros, or with NaN or inf, are left as they are."""
    m = np.abs(x).max(axis=1, initial=0.0)
    _, e = np.frexp(m)
    e = np.where(np.isfinite(m) & (m > 0), e, 0)
    return np.ldexp(x, -e[:, None]), e


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a - b`` in float64, rounded once. 64-bit integers above 2^53 lose their low bits
    as float64 (rows 2^53 and 2^53 + 1 measured 0.0 apart and were removed at l2 0.5),
    so they are subtracted in 32-bit halves, each exact in float64, and summed once."""
    if {a.dtype.kind, b.dtype.kind} <= {"i", "u"} and 8 in (a.dtype.itemsize, b.dtype.itemsize):
        a, b = (v.astype(np.int64 if v.dtype.kind == "i" else np.uint64, copy=False)
                for v in (a, b))
        low = np.uint64(0xFFFFFFFF)
        hi = (a >> 32).astype(np.float64) - (b >> 32).astype(np.float64)
        lo = ((a.astype(np.uint64) & low).astype(np.float64)
              - (b.astype(np.uint64) & low).astype(np.float64))
        return hi * 2.0 ** 32 + lo
    return a.astype(np.float64) - b.astype(np.float64)


def exact_distance(a: np.ndarray, b: np.ndarray, spec: NearSpec
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(distance, within) for row pairs, in float64; ``b`` is the kept (reference) record.

    l2: Euclidean; cosine: 1 - cos (NaN for a zero vector: never within); correlation:
    1 - Pearson r, the cosine of ``centred_channels`` rows (NaN when every channel of a
    row is flat: never within); allclose: the largest |a_i - b_i|, within when
    numpy.isclose(a, b, rtol, atol) holds everywhere.
    """
    a, b = flat_rows(a), flat_rows(b)
    if spec.metric == "l2":
        with np.errstate(over="ignore", invalid="ignore"):
            diff, e = pow2_scaled(difference(a, b))
        d = np.ldexp(np.linalg.norm(diff, axis=1), e)
        return d, d <= spec.threshold
    if spec.metric == "allclose":
        diff = np.abs(difference(a, b))
        return (diff.max(axis=1, initial=0.0),
                (diff <= spec.atol + spec.rtol * np.abs(b.astype(np.float64))).all(axis=1))
    if spec.metric == "correlation":
        a, b = centred_channels(a, spec.channels), centred_channels(b, spec.channels)
    else:  # cosine
        a, b = a.astype(np.float64), b.astype(np.float64)
    (a, _), (b, _) = pow2_scaled(a), pow2_scaled(b)  # 1 - cos does not see the scale
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    d = 1.0 - np.clip(cos, -1.0, 1.0)
    return d, d <= spec.threshold


def verify(xa: np.ndarray, xb: np.ndarray, spec: NearSpec
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distance, a within with b as reference, b within with a as reference) in float64;
    the two differ only for allclose, which is not symmetric."""
    d, ab = exact_distance(xa, xb, spec)
    ba = exact_distance(xb, xa, spec)[1] if spec.metric == "allclose" else ab
    return d, ab, ba


def verify_rows(xa: np.ndarray, a: np.ndarray, xb: np.ndarray, b: np.ndarray,
                spec: NearSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``verify`` of the pairs (xa[a[k]], xb[b[k]]), a slice of pairs at a time: float64
    copies of both ends of every pair at once would be gigabytes for wide records or
    many pairs (32 MB of values per slice)."""
    step = rows_for(16 * max(1, math.prod(xa.shape[1:])), 32 << 20, 1 << 20, 64)
    parts = [verify(xa[a[k:k + step]], xb[b[k:k + step]], spec) for k in range(0, len(a), step)]
    if not parts:
        return np.empty(0), np.empty(0, bool), np.empty(0, bool)
    return tuple(np.concatenate(c) for c in zip(*parts, strict=True))
