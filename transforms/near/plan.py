"""Partitions for the near search: k-means cells, which cells each row must meet, and the cost.

Why cells: one flat search over n rows costs n^2 d. Rows are split into k-means cells
(``train``) and each cell is searched on its own: its *home* rows (nearest centroid)
against every row that joined it (``assign``).

Exact mode: a row y (home q) joins cell p when the ball of the search radius r around it
reaches p's half of the bisector between the two centroids,
    |y - c_p|^2 - |y - c_q|^2 <= 2 r |c_p - c_q|    (+ rounding slack).
Proof: f(z) = |z - c_p|^2 - |z - c_q|^2 is affine in z with gradient 2 (c_q - c_p), so for
any x within r of y, f(x) >= f(y) - 2 r |c_p - c_q|; a home row x of p has f(x) <= 0.
So every pair within r meets in the home cell of one of its rows: no pair is lost,
whatever the centroids. In high dimensions the bound is tight where the older triangle
rule (|y - c_p| <= |y - c_q| + 2 r) put every row into nearly every cell.

Bounded mode: a row joins at most ``probes`` cells, those whose bisector is nearest
(home first); pairs can be lost only between two rows that had more cells to join
than that (*capped* rows). Work and shuffle then grow as n x probes, never n^2.

``predict`` measures both on held-out sample rows before any search, and ``plan``
picks exact when it costs no more joins per row than the bounded mode's cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from transforms.near.project import Projection, projection, sample_step
from transforms.near.search import UNIT_ROUNDOFF, Vectors, centred, gamma, rows_for

MODES = ("auto", "exact", "bounded")
KMEANS_ITERATIONS = 15
TRAIN_PER_CELL = 64  # k-means sample rows per cell (FAISS warns below 39)
Progress = Callable[[str, int, int], None]  # (what, done, total)


def partition_count(n: int, single_index_rows: int, partition_rows: int) -> int:
    """One cell up to ``single_index_rows``; above, cells of ``partition_rows`` rows, but
    at least sqrt(n) rows each, so assigning (n x cells x d) never outgrows the search."""
    if n <= single_index_rows:
        return 1
    return math.ceil(n / max(partition_rows, math.isqrt(n)))


def train(sample: np.ndarray, partitions: int, seed: int = 0,
          progress: Progress | None = None, merge_within: float = 0.0
          ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, centroids relative to it), float64, from sample rows of the search space
    (float32 or float64; centred a block at a time).
    Recall in exact mode never depends on the centroids, only the cost does.
    ``merge_within``: centroids closer than this to a larger cell's are dropped
    (``_merge_close``)."""
    import faiss

    d = sample.shape[1]
    mean = sample.mean(axis=0, dtype=np.float64) if len(sample) else np.zeros(d)
    k = max(1, min(partitions, len(sample)))
    if k == 1:
        return mean, np.zeros((1, d))
    rng = np.random.default_rng(seed)
    if len(sample) > TRAIN_PER_CELL * k:  # taken here so every iteration sees one set
        sample = sample[np.sort(rng.choice(len(sample), TRAIN_PER_CELL * k, replace=False))]
    z = centred(sample, mean, np.float32).v
    centroids = None
    steps = KMEANS_ITERATIONS + 1  # the iterations, then splitting oversized cells
    for it in range(KMEANS_ITERATIONS):
        km = faiss.Kmeans(d, k, niter=1, seed=seed + it, max_points_per_centroid=len(z),
                          min_points_per_centroid=1)  # a small sample is on purpose
        km.train(z, init_centroids=centroids)
        centroids = km.centroids
        if progress is not None:
            progress("k-means", it + 1, steps)
    centroids = _merge_close(z, _split_large(z, centroids, seed), merge_within)
    centroids = centroids.astype(np.float64)
    if progress is not None:
        progress("k-means", steps, steps)
    return mean, centroids


def _split_large(z: np.ndarray, centroids: np.ndarray, seed: int) -> np.ndarray:
    """Cells of skewed data (a few big topics) can hold many times the mean: searching one
    costs its size squared. A cell with more than twice the mean share of the sample is
    replaced by a k-means of its own rows into cells of about the mean size (still one
    flat set of centroids, so the join rule holds unchanged)."""
    import faiss

    k = len(centroids)
    home = faiss.knn(z, centroids, 1)[1][:, 0]
    sizes = np.bincount(home, minlength=k)
    mean_size = len(z) / k
    out = [centroids[sizes <= 2 * mean_size]]
    for c in np.flatnonzero(sizes > 2 * mean_size).tolist():
        rows = z[home == c]
        parts = min(math.ceil(sizes[c] / mean_size), len(rows) // 40)
        if parts < 2:
            out.append(centroids[c:c + 1])
            continue
        km = faiss.Kmeans(z.shape[1], parts, niter=KMEANS_ITERATIONS, seed=seed + c,
                          max_points_per_centroid=len(rows), min_points_per_centroid=1)
        km.train(rows)
        out.append(km.centroids)
    return np.concatenate(out)


def _merge_close(z: np.ndarray, centroids: np.ndarray, within: float) -> np.ndarray:
    """A crowd (thousands of copies of one record, blank records) draws many k-means
    centroids into a region smaller than the tolerance. Each of its records would then
    join every one of those cells (the bisector rule cannot separate points closer than
    the radius), and each cell would hold the crowd again. Centroids within ``within``
    of a larger cell's centroid are dropped, largest cells first, so a crowd lives in
    one cell (any set of centroids keeps the join rule exact)."""
    import faiss

    if within <= 0 or len(centroids) < 2:
        return centroids
    c = np.ascontiguousarray(centroids, np.float32)
    sizes = np.bincount(faiss.knn(z, c, 1)[1][:, 0], minlength=len(c))
    kept: list[int] = []
    for i in np.argsort(-sizes, kind="stable").tolist():
        if not kept or np.min(np.linalg.norm(c[kept] - c[i], axis=1)) > within:
            kept.append(i)
    return centroids[np.sort(kept)]


@dataclass
class Prediction:
    """What a search would cost, measured on held-out sample rows and scaled to n rows.
    Work counts (query, data) row pairs compared; the flat search compares n^2."""

    rows: int
    sample: int
    cells: int
    joins_exact: float  # cells per row, mean, exact mode
    joins_bounded: float  # the same with the probe cap
    capped: float  # share of rows with more cells to join than the cap
    work_exact: float
    work_bounded: float
    largest_exact: int  # rows in the largest cell (memory of one search)
    largest_bounded: int

    @property
    def work_all_pairs(self) -> float:
        return float(self.rows) ** 2

    def as_dict(self) -> dict:
        return {**self.__dict__, "work_all_pairs": self.work_all_pairs}


@dataclass
class Partitions:
    """Cells and the rule rows join them by. ``probes`` None: exact."""

    mean: np.ndarray  # (d,) float64: search vectors are centred on it
    centroids: np.ndarray  # (cells, d) float64, relative to ``mean``
    radius: float  # L2 search radius in the search space (a superset of the tolerance)
    probes: int | None = None
    mode: str = "exact"
    reason: str = ""
    prediction: Prediction | None = None
    projection: Projection | None = None  # the cells' prefilter (``near.project``)
    gap: np.ndarray = field(init=False, repr=False)  # (cells, cells) |c_p - c_q|

    def __post_init__(self) -> None:
        c = self.centroids
        sq = np.einsum("ij,ij->i", c, c)
        self.gap = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * c @ c.T, 0))
        np.fill_diagonal(self.gap, 0)

    def __len__(self) -> int:
        return len(self.centroids)

    def describe(self) -> dict:
        return {"mode": self.mode, "reason": self.reason, "cells": len(self),
                "probes": self.probes,
                "prediction": None if self.prediction is None else self.prediction.as_dict()}


@dataclass
class Assignment:
    """Row ``rows[k]`` joins cell ``cells[k]``; ``home``: each row's own cell; ``wanted``:
    how many cells each row would join in exact mode; ``capped``: it joined fewer."""

    home: np.ndarray
    rows: np.ndarray
    cells: np.ndarray
    wanted: np.ndarray
    capped: np.ndarray


def assign(z: Vectors, parts: Partitions, probes: int | None = -1,
           progress: Progress | None = None) -> Assignment:
    """Cells each row (``z``: centred on ``parts.mean``) joins; ``probes``: the cap (-1:
    the plan's, None: exact); ``progress("assign", rows done, rows)`` after each block.

    One matrix product gives f_p = |c_p|^2 - 2 z.c_p (|z - c_p|^2 less |z|^2) for every
    cell; the rule is then f_p - 2 r' |c_p - c_home| <= f_home + e, one pass. The
    slack r' - r covers where storing moved the vectors, e the rounding of the product
    and of those passes, for this row and for any neighbour's own choice of home (see
    the module docstring). Bounded mode ranks only the cells that passed, by their
    distance to the bisector."""
    probes = parts.probes if probes == -1 else probes
    n, k = len(z.v), len(parts)
    if k == 1 or n == 0:  # one cell; or nothing to assign (a sample of two distinct rows)
        ones = np.ones(n, np.int64)
        return Assignment(np.zeros(n, np.int64), np.arange(n, dtype=np.int64),
                          np.zeros(n, np.int64), ones, np.zeros(n, bool))
    c, dim, dt = parts.centroids, parts.centroids.shape[1], z.v.dtype
    csq = np.einsum("ij,ij->i", c, c)
    u, g = UNIT_ROUNDOFF[dt], gamma(dim + 1, dt)
    cmax, gmax = math.sqrt(csq.max()), float(parts.gap.max())
    ca = np.empty((dim + 1, k), dt)
    ca[:dim], ca[dim] = -2 * c.T, csq
    widest = parts.gap.max(axis=1)  # per home: its largest gap, for a first cut
    homes, rows, cells, wanted = [], [], [], []
    block = rows_for(z.v.itemsize * (dim + 1), 64 << 20, max(256, (1 << 22) // k), 1)
    for a in range(0, n, block):
        za = np.empty((min(block, n - a), dim + 1), dt)
        za[:, :dim], za[:, dim] = z.v[a:a + block], 1
        f = za @ ca
        h = f.argmin(axis=1)
        fh = f[np.arange(len(f)), h].astype(np.float64)
        nz = z.norm[a:a + block]
        r2 = 2 * (parts.radius + 1.01 * u * (2 * nz + parts.radius))
        err = 1.02 * (2 * g + 8 * u) * (2 * nz * cmax + cmax * cmax + r2 * gmax)
        # first cut with each home's widest gap (one pass), then the rule on what is left
        cut = (fh + r2 * widest[h] + err) * (1 + 4 * u) + 1e-30
        rr, pp = np.divmod(np.flatnonzero(f <= cut.astype(dt)[:, None]), k)
        ok = f[rr, pp] - r2[rr] * parts.gap[h[rr], pp] <= fh[rr] + err[rr]
        rr, pp = rr[ok], pp[ok]  # the home cell passes (gap 0)
        want = np.bincount(rr, minlength=len(f))
        if probes is not None and probes < k:
            margin = (f[rr, pp] - fh[rr]) / np.maximum(2 * parts.gap[h[rr], pp], 1e-300)
            margin[pp == h[rr]] = -1.0
            o = np.lexsort((margin, rr))
            rr, pp = rr[o], pp[o]
            first = np.searchsorted(rr, rr)
            keep = np.arange(len(rr)) - first < probes
            rr, pp = rr[keep], pp[keep]
        homes.append(h)
        rows.append(a + rr)
        cells.append(pp)
        wanted.append(want)
        if progress is not None:
            progress("assign", a + len(f), n)
    rows_a, cells_a = np.concatenate(rows).astype(np.int64), np.concatenate(cells)
    want_a = np.concatenate(wanted)
    joined = np.bincount(rows_a, minlength=n)
    return Assignment(np.concatenate(homes).astype(np.int64), rows_a,
                      cells_a.astype(np.int64), want_a, joined < want_a)


def predict(held: Vectors, parts: Partitions, rows: int, probes: int,
            progress: Progress | None = None) -> Prediction:
    """Both modes' joins, capped share, work and largest cell on held-out rows."""
    k, s = len(parts), max(len(held.v), 1)
    scale = rows / s
    figures = []
    for step, cap in enumerate((None, probes), 1):
        a = assign(held, parts, cap)
        if progress is not None:
            progress("cost prediction", step, 2)
        home = np.bincount(a.home, minlength=k) * scale
        members = np.bincount(a.cells, minlength=k) * scale
        figures.append((len(a.rows) / s, float((home * members).sum()),
                        int(math.ceil(members.max(initial=0))), float(a.capped.mean())
                        if len(a.capped) else 0.0))
    (je, we, le, _), (jb, wb, lb, capped) = figures
    return Prediction(rows, len(held.v), k, je, jb, capped, we, wb, le, lb)


def plan(sample: np.ndarray, rows: int, radius: float, mode: str, probes: int, cells: int,
         seed: int = 0, progress: Progress | None = None) -> Partitions:
    """Centroids from the sample rows (search space, float32 or float64) and the mode: ``auto``
    takes exact when its predicted joins per row are within ``probes``."""
    if mode not in MODES:
        raise ValueError(f"near.mode must be one of {', '.join(MODES)}, got {mode!r}")
    if cells <= 1 or len(sample) < 2:
        mean, centroids = train(sample, 1)
        return Partitions(mean, centroids, radius, None, "exact",
                          "one cell: every row is compared with every other")
    held = np.arange(len(sample)) % 5 == 4  # one row in five predicts, the others train
    mean, centroids = train(sample[~held], cells, seed, progress, merge_within=radius)
    parts = Partitions(mean, centroids, radius)
    p = predict(centred(sample[held], mean, np.float32), parts, rows, probes, progress)
    exact = mode == "exact" or (mode == "auto" and p.joins_exact <= probes)
    why = (f"exact cells would join each record to {p.joins_exact:.1f} of {len(parts)} cells; "
           f"bounded to {p.joins_bounded:.1f} ({probes} probes, {p.capped:.0%} of records "
           "capped)")
    if mode == "auto":
        why = ("auto chose " + ("exact" if exact else "bounded") + ": " + why)
    parts.mode, parts.probes = ("exact", None) if exact else ("bounded", probes)
    parts.reason, parts.prediction = why, p
    train_rows = np.flatnonzero(~held)
    parts.projection = projection(centred(sample[train_rows[:: sample_step(
        len(train_rows), sample.shape[1])]], mean, np.float32).v)
    return parts
