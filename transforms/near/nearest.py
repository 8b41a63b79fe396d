"""The nearest-neighbour sample behind the report's distance histogram: each sampled
record's nearest other record in its cell, found from the search's own products (no pair
listed, so a crowd costs no more) and verified in float64.

The float32 products cannot order two neighbours whose distances differ by less than
their rounding, and that rounding depends on how BLAS splits the work (its threads):
the same job picked another of two JPEG copies 5.196e-5 and 5.201e-5 from a picture
with one worker than with two, and borderline_pairs.parquet differed between runners.
So every row within the rounding of the float32 nearest is verified, and the nearest in
float64 wins (ties: the first row)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from transforms.near.search import Vectors, augmented, pairs_within, rows_for
from transforms.near.verify import directed, flat_rows, verify_rows

if TYPE_CHECKING:
    from transforms.near.spec import NearSpec


def nearest_distances(x: np.ndarray, z: Vectors, rows: np.ndarray, spec: NearSpec,
                      radius: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``rows`` of ``x`` (search vectors ``z``): the nearest other row by the
    search's products (no pair listed, so a crowd costs no more), its verified distance
    (inf: no other row; cosine, correlation: none with a direction) and whether the two are within
    tolerance either way. Returns
    (neighbour, distance, within)."""
    rows = np.asarray(rows, np.int64)
    best = np.full(len(rows), -1, np.int64)
    dist, within = np.full(len(rows), np.inf), np.zeros(len(rows), bool)
    if not len(rows) or len(x) < 2:
        return best, dist, within
    step = rows_for(z.v.itemsize * z.v.shape[1], 64 << 20, len(rows))
    best = np.concatenate([pairs_within(z.take(rows[a:a + step]), z, radius, spec.device,
                                        own=rows[a:a + step], pairs=False)[2]
                           for a in range(0, len(rows), step)])
    if spec.metric in ("cosine", "correlation"):
        best = _with_direction(x, z, rows, best, radius, spec)
    has = np.flatnonzero(best >= 0)
    d, ab, ba = verify_rows(x, rows[has], x, best[has], spec)
    dist[has] = np.where(np.isnan(d), np.inf, d)
    within[has] = ab | ba
    for a in range(0, len(has), step):
        _nearest_in_float64(x, z, rows, has[a:a + step], best, dist, within, spec)
    return best, dist, within


TIES = 1024  # rows verified per sampled row at most (a crowd of copies apart by less
# than float32 rounding: any of them is as near; past this many, the first rows)


def _nearest_in_float64(x: np.ndarray, z: Vectors, rows: np.ndarray, some: np.ndarray,
                        best: np.ndarray, dist: np.ndarray, within: np.ndarray,
                        spec: NearSpec) -> None:
    """For ``rows[some]``: every row whose search-space distance may be no more than the
    float32 nearest's (``augmented``'s proven bound, each row at its own radius: the
    stored vectors' float64 distance to that nearest, widened by their rounding), verified
    in float64; the nearest of them replaces ``best`` (``dist``, ``within``) in place."""
    if not len(some):
        return
    q = z.take(rows[some])
    gap = np.linalg.norm(q.v.astype(np.float64) - z.v[best[some]].astype(np.float64), axis=1)
    radius = gap * (1 + 1e-12) + 2.02 * z.u * (q.norm + float(z.norm.max(initial=0)))
    found: list[tuple[np.ndarray, np.ndarray]] = []
    taken = np.zeros(len(some), np.int64)
    cols = rows_for(z.v.itemsize * max(q.v.shape[1] + 2, len(some)), 64 << 20, len(z.v), 64)
    for c in range(0, len(z.v), cols):
        qa, ya, _ = augmented(q, z.rows(slice(c, c + cols)), radius)
        hit = qa @ ya.T >= 0
        own = rows[some] - c
        inside = np.flatnonzero((own >= 0) & (own < len(ya)))
        hit[inside, own[inside]] = False  # a row is not its own neighbour
        hit[taken >= TIES] = False
        for r in np.flatnonzero(taken + hit.sum(axis=1) > TIES):  # a crowd: its first rows
            hit[r, np.flatnonzero(hit[r])[TIES - taken[r]:]] = False
        taken += hit.sum(axis=1)
        i, j = np.nonzero(hit)
        found.append((i, j + c))
    i, j = (np.concatenate(f) for f in zip(*found, strict=True))
    if not len(i):  # (each row's float32 nearest passes its own bound: not expected)
        return
    d, ab, ba = verify_rows(x, rows[some][i], x, j, spec)
    d = np.where(np.isnan(d), np.inf, d)
    o = np.lexsort((j, d, i))  # float64 distance, then the first row
    i, j, d, w = i[o], j[o], d[o], (ab | ba)[o]
    head = np.r_[True, i[1:] != i[:-1]]
    i, j, d, w = i[head], j[head], d[head], w[head]
    better = d < dist[some[i]]
    better |= np.isfinite(d) & (d == dist[some[i]]) & (j < best[some[i]])
    t = some[i[better]]
    best[t], dist[t], within[t] = j[better], d[better], w[better]


def _with_direction(x: np.ndarray, z: Vectors, rows: np.ndarray, best: np.ndarray,
                    radius: float, spec: NearSpec) -> np.ndarray:
    """Cosine: a zero vector has no direction, so it is nobody's nearest row and has none
    (correlation: a row whose every channel is flat, centred to zero). In the search
    space it sits at the origin of the unit sphere, nearer to a row than
    any neighbour past cos 0.5, and was chosen (its distance, NaN, showed as inf: "no
    neighbour" in the histogram, borderline pairs at inf). Rows that chose one look
    again among the rows with a direction (copying those rows only then: a crowd's rows
    choose each other)."""
    flat = flat_rows(x)
    asks = directed(flat[rows], spec)  # only the sampled rows and their choices: a
    chose = best >= 0  # pass over the whole cell (a crowd's millions) only when needed
    fine = np.ones(len(rows), bool)
    fine[chose] = directed(flat[best[chose]], spec)
    if asks.all() and fine.all():
        return best
    redo = np.flatnonzero(asks & ~fine)
    best = np.where(asks, best, -1)
    if len(redo):
        at = np.flatnonzero(np.concatenate([directed(flat[a:a + 65536], spec)
                                            for a in range(0, len(flat), 65536)]))
        own = np.searchsorted(at, rows[redo])
        b = pairs_within(z.take(at[own]), z.take(at), radius, spec.device, own=own,
                         pairs=False)[2]
        best[redo] = np.where(b >= 0, at[np.maximum(b, 0)], -1)
    return best
