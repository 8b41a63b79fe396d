"""The nearest-neighbour sample behind the report's distance histogram: each sampled
record's nearest other record in its cell, found from the search's own products (no pair
listed, so a crowd costs no more) and verified in float64."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from transforms.near.search import Vectors, pairs_within, rows_for
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
    has = best >= 0
    d, ab, ba = verify_rows(x, rows[has], x, best[has], spec)
    dist[has] = np.where(np.isnan(d), np.inf, d)
    within[has] = ab | ba
    return best, dist, within


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
