"""The search space of each metric: the float64 points whose L2 distance the search
bounds (unit vectors for cosine, channel-centred unit vectors for correlation, the values
otherwise), the radius that holds every pair within the user's tolerance, and their
float32 (or float64) search vectors.

Why apart from the driver: the plan, the cells and the recall brute force (in the Beam
steps too) build the same points from the same rows, so that a row has the same search
vector in every part of the search.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial

import numpy as np

from transforms.near.search import Vectors, centred, centred_blocks, precision_for
from transforms.near.spec import NearSpec
from transforms.near.verify import centred_channels, flat_rows, pow2_scaled


def finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows that can be compared by distance (no NaN/inf)."""
    return np.isfinite(x).all(axis=1)


def search_space(x: np.ndarray, spec: NearSpec) -> np.ndarray:
    """float64 points whose L2 distance the search bounds: unit vectors for cosine, unit
    vectors of the channel-centred rows for correlation (``centred_channels``: 1 - r is
    their cosine distance), the values otherwise."""
    if spec.metric == "correlation":
        x64 = centred_channels(x, spec.channels)
    else:
        x64 = np.array(x, dtype=np.float64)
    if spec.metric in ("cosine", "correlation"):
        sq = np.einsum("ij,ij->i", x64, x64)
        odd = np.flatnonzero(~(sq >= 2.0 ** -960) | (sq == np.inf))  # 0, tiny, inf, NaN
        if len(odd):  # rows of 1e200 or 1e-200: scaled first (exact), the same directions
            x64[odd] = pow2_scaled(x64[odd])[0]
            sq[odd] = np.einsum("ij,ij->i", x64[odd], x64[odd])
        norms = np.sqrt(sq)
        x64 /= np.where(norms == 0, 1, norms)[:, None]
    return x64


def value_scale(x: np.ndarray, spec: NearSpec) -> float:
    """The largest |value| (allclose's relative tolerance needs it; 0 for other metrics)."""
    return float(np.abs(x).max(initial=0)) if spec.metric == "allclose" else 0.0


def cosine_rounding(dim: int) -> float:
    """How far a float64 1 - cos over ``dim`` values may be from its exact value."""
    return (dim + 8) * 2.0 ** -52


def search_radius(spec: NearSpec, dim: int, scale: float) -> float:
    """L2 radius in the search space such that every pair within the user's tolerance is
    inside it (float rounding of the search is bounded separately, per pair)."""
    if spec.metric in ("cosine", "correlation"):
        # |a^ - b^|^2 = 2 (1 - cos); normalising errs ~d ulps. Correlation is the cosine
        # of the centred rows: the search and the verification both take their cosine
        # from the same float64 rows (``centred_channels`` gives a row the same bits
        # whatever rows come with it), so this bound is the cosine's, whatever rounding
        # the centring did; the float32 copy of the unit vectors is bounded by the search
        # like any other (``near.search.thresholds``).
        # The verified 1 - cos is rounded too (cos within ~(d + 2) 2^-52 of its value): a
        # pair measured within t may be t + that apart, which matters when t is tiny
        slack = cosine_rounding(dim)
        return math.sqrt(2 * (spec.threshold + slack)) * (1 + 1e-12) + (dim + 8) * 2.0 ** -50
    if spec.metric == "l2":
        return spec.threshold * (1 + 1e-12)
    # allclose: |a_i - b_i| <= atol + rtol |b_i| for all i  =>  L2 <= sqrt(d) * that
    return math.sqrt(dim) * (spec.atol + spec.rtol * scale) * (1 + 1e-12)


def space_blocks(x: np.ndarray, spec: NearSpec, center: np.ndarray | None
                 ) -> Iterator[tuple[slice, np.ndarray]]:
    """The search space minus ``center``, in float64 blocks small enough for the cache."""
    return centred_blocks(x, center, lambda rows: search_space(rows, spec))


def largest_norm(x: np.ndarray, spec: NearSpec, center: np.ndarray | None = None) -> float:
    """The largest |z - center| over the rows' search-space points z."""
    return math.sqrt(max((float(np.einsum("ij,ij->i", z, z).max(initial=0))
                          for _, z in space_blocks(x, spec, center)), default=0.0))


def search_vectors(x: np.ndarray, spec: NearSpec, radius: float,
                   center: np.ndarray | None = None, dtype: np.dtype | None = None,
                   norm_at_least: float = 0.0) -> Vectors:
    """Rows of the search space centred on ``center`` (computed in float64), stored in
    ``dtype`` (None: float32 unless rounding at the larger of these rows' norms and
    ``norm_at_least`` would swamp the radius, see ``precision_for``). Choosing costs no
    pass of its own: the rows are stored in float32 as their norms are found, and made
    again in float64 only where those norms call for it."""
    x = flat_rows(x)
    space = partial(search_space, spec=spec)
    if dtype is not None:
        return centred(x, center, dtype, space)
    z = centred(x, center, np.float32, space)
    # each stored value is within 2^-24 of its own: |z64| <= |z32| / (1 - 2^-24)
    top = max(float(z.norm.max(initial=0)) * (1 + 1e-6), norm_at_least)
    if precision_for(top, x.shape[1], radius) == np.float32:
        return z
    return centred(x, center, np.float64, space)


def approximate_index(z: Vectors, spec: NearSpec):
    """``index: ivf | hnsw``: an empty FAISS index for a cell's kept rows (IVF trained on
    all the cell's rows), which ``near.greedy.decide`` fills as rows are kept and asks
    instead of comparing with every kept row; None for the flat (exact) search."""
    if spec.index not in ("ivf", "hnsw") or len(z.v) < 2:
        return None
    import faiss

    v = np.ascontiguousarray(z.v, np.float32)
    n, d = v.shape
    if spec.index == "hnsw":
        return faiss.IndexHNSWFlat(d, spec.hnsw_m)
    nlist = min(spec.nlist or max(1, min(n // 39, int(4 * math.sqrt(n)))), n)  # a small cell
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
    index.train(v[np.random.default_rng(0).choice(n, min(n, 256 * nlist), replace=False)])
    index.nprobe = min(spec.nprobe, nlist)
    return index
