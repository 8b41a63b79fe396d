"""Float64 verification of candidate pairs with the user's metric: what every removal
rests on (the searches only propose pairs; ``transforms.near``).

Why apart from the search: the search's rounding is bounded, this is the exact rule
(l2, 1 - cos, numpy.isclose), evaluated the same way by the kernel, the job's cells,
the merge and the recall check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from transforms.near_search import rows_for

if TYPE_CHECKING:
    from transforms.near import NearSpec


def exact_distance(a: np.ndarray, b: np.ndarray, spec: NearSpec
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(distance, within) for row pairs, in float64; ``b`` is the kept (reference) record.

    l2: Euclidean; cosine: 1 - cos (NaN for a zero vector: never within); allclose:
    the largest |a_i - b_i|, within when numpy.isclose(a, b, rtol, atol) holds everywhere.
    """
    a, b = a.astype(np.float64), b.astype(np.float64)
    if spec.metric == "l2":
        d = np.linalg.norm(a - b, axis=1)
        return d, d <= spec.threshold
    if spec.metric == "cosine":
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        d = 1.0 - np.clip(cos, -1.0, 1.0)
        return d, d <= spec.threshold
    diff = np.abs(a - b)
    return diff.max(axis=1, initial=0.0), (diff <= spec.atol + spec.rtol * np.abs(b)).all(axis=1)


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
    step = rows_for(16 * max(1, xa.reshape(len(xa), -1).shape[1]), 32 << 20, 1 << 20, 64)
    parts = [verify(xa[a[k:k + step]], xb[b[k:k + step]], spec) for k in range(0, len(a), step)]
    if not parts:
        return np.empty(0), np.empty(0, bool), np.empty(0, bool)
    return tuple(np.concatenate(c) for c in zip(*parts, strict=True))
