"""A proven prefilter for wide brute-force searches: distances in a few principal
directions are a lower bound of the true distances.

Why: the recall check compares a sample with every record (3,000 x 1M x 384 products,
10 s of a 1M-record near job), and almost every pair is far apart. Projected onto an
orthonormal basis P (d x p), |P^T a - P^T b| <= |a - b|; with the top principal
directions of the data, far pairs stay far in p = 32 of 384 dimensions, so one
product of 34 columns (the sign test of ``near.search.augmented``) rules them out, and
only the pairs it keeps get the full product. No pair is lost: the bound below covers
P's own rounding (its columns are orthonormal only to float64 precision) and the
rounding of the projected vectors, and the projected test is ``augmented``'s proven
one; the basis decides only how many pairs pass.

Bound: P is stored in the search precision, and sigma bounds the largest singular
value of that stored P (Gershgorin on P^T P, computed in float64), so a pair of stored
search vectors within r_v of each other is within sigma r_v projected. The product
P^T v in the search precision errs by at most g_d |P_j| |v| <= g_d sigma |v| per
column (Higham 3.1): eps |v| in all, eps = sqrt(p) g_d sigma. The search vectors are
the stored values of vectors within ``radius``, each moved by at most u |v|, so
r_v = radius + u (|q| + |y|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from transforms.near.search import UNIT_ROUNDOFF, Vectors, gamma

MIN_DIM = 128  # narrower vectors: the full product costs little more than a projected one
DIM = 32  # projected dimensions (of 384: 35% of the variance of MiniLM-like embeddings)
SAMPLE = 4096  # rows the principal directions come from
SAMPLE_BYTES = 64 << 20  # ... at most, as float64 (512 rows of 16k values)


@dataclass
class Projection:
    """An orthonormal basis (d, p) with the constants of the bound above."""

    basis: np.ndarray  # (d, p) in the search precision
    sigma: float  # >= the largest singular value of ``basis``
    eps: float  # a projected, stored vector moves by at most eps x |v|


def sample_step(n: int, d: int) -> int:
    """Every how many of ``n`` rows of ``d`` values one goes into ``projection``'s
    sample: SAMPLE rows, fewer where they would pass SAMPLE_BYTES (never under 2 DIM)."""
    rows = max(2 * DIM, min(SAMPLE, SAMPLE_BYTES // (8 * max(d, 1))))
    return max(1, -(-n // rows))


def projection(y: np.ndarray, dim: int = DIM) -> Projection | None:
    """The top ``dim`` principal directions (about the origin: search vectors are
    centred already) of up to SAMPLE evenly spaced rows of ``y`` (fewer for wide rows:
    the sample stays within SAMPLE_BYTES); None when the rows are too narrow or too few
    for the prefilter to pay, or span no direction. Rows wider than the sample is long
    (images of 16k values) take the directions from the sample's Gram matrix (n x n), not
    the d x d covariance (a 16k x 16k eigh is minutes and gigabytes)."""
    n, d = y.shape
    if d < MIN_DIM or n < 2 * dim:
        return None
    s = np.asarray(y[:: sample_step(n, d)], np.float64)
    if d <= len(s):
        _, vecs = np.linalg.eigh(s.T @ s)
        basis = vecs[:, ::-1][:, :dim]
    else:  # s = U S V^T: the top right singular vectors are s^T u / sqrt(lambda)
        lam, u = np.linalg.eigh(s @ s.T)
        keep = np.flatnonzero(lam > lam[-1] * 1e-9)[::-1][:dim] if lam[-1] > 0 else lam[:0]
        if not len(keep):
            return None
        basis = (s.T @ u[:, keep]) / np.sqrt(lam[keep])
    basis = np.ascontiguousarray(basis).astype(y.dtype)
    b = basis.astype(np.float64)
    gram = np.abs(b.T @ b).sum(axis=1).max() * (1 + 4 * d * UNIT_ROUNDOFF[
        np.dtype(np.float64)])  # Gershgorin, its own rounding included
    sigma = math.sqrt(gram) * (1 + 1e-12)
    return Projection(basis, sigma, math.sqrt(basis.shape[1]) * gamma(d, y.dtype) * sigma)


def project(z: Vectors, pr: Projection) -> Vectors:
    """The projected vectors (in ``z``'s precision) and their norms."""
    v = z.v @ pr.basis
    return Vectors(v, np.sqrt(np.einsum("ij,ij->i", v, v, dtype=np.float64)))


def projected_radius(pr: Projection, radius: float, q: Vectors, y: Vectors) -> float:
    """A radius that every pair of ``q`` and ``y`` within ``radius`` (as the full search
    counts it) is within, projected and stored."""
    s = (float(q.norm.max(initial=0)) + float(y.norm.max(initial=0))) * (1 + 1e-9)
    u = UNIT_ROUNDOFF[q.v.dtype]
    return pr.sigma * radius + (pr.sigma * u + pr.eps) * (1 + u) * s
