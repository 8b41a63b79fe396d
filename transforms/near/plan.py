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

Two levels (``levels=2``): about 1,000 coarse cells (``coarse_count``), each cut into its own fine
cells. A row joins coarse cells by the rule above, and inside each coarse cell it joined,
the fine cells by the same rule against its nearest fine centroid there. A pair within
r still meets in the home fine cell of one of its rows (its home coarse cell's nearest
fine centroid): the other row joins that coarse cell (first level), and inside it that
fine cell (the proof again, over that coarse cell's fine centroids). So cells keep
``partition_rows`` rows at any n, and assigning costs n x (coarse + joined x fine) x d
instead of n x P x d. Bounded mode ranks a fine cell by the larger of its two bisector
distances.

``predict`` measures both on held-out sample rows before any search, and ``plan``
picks exact when it costs no more joins per row than the bounded mode's cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from transforms.near.project import Projection, projection, sample_step
from transforms.near.search import (
    UNIT_ROUNDOFF,
    Vectors,
    centred,
    gamma,
    rows_for,
    to_device,
)

MODES = ("auto", "exact", "bounded")
KMEANS_ITERATIONS = 15
TRAIN_PER_CELL = 64  # k-means sample rows per cell (FAISS warns below 39)
COARSE_CELLS = 1_000  # two levels: coarse cells, at least (``coarse_count``)
COARSE_PROBES = 4  # bounded, two levels: coarse cells whose fine cells a row considers, x probes
PLANNED_MAX = float(np.finfo(np.float32).max) / 4  # sample values beyond: left out (below)
Progress = Callable[[str, int, int], None]  # (what, done, total)


def partition_count(n: int, single_index_rows: int, partition_rows: int, levels: int = 1
                    ) -> int:
    """One cell up to ``single_index_rows``; above, cells of ``partition_rows`` rows. One
    level: at least sqrt(n) rows each, so assigning (n x cells x d) never outgrows the
    search; two levels assign in about coarse + 12 fine cells' x d per row (``coarse_count``),
    so cells keep their size."""
    if n <= single_index_rows:
        return 1
    if levels == 2:
        return math.ceil(n / partition_rows)
    return math.ceil(n / max(partition_rows, math.isqrt(n)))


def planned_rows(sample: np.ndarray) -> np.ndarray:
    """The sample rows the plan trains on: those whose values, centred on their mean,
    stay finite in float32 (a float64 record holding 1e39 made the mean inf, so every
    centred distance NaN, and the job found no pair at all). Left out, such a record is
    still searched, in float64 (``near.space.search_vectors``)."""
    with np.errstate(invalid="ignore"):  # reductions: no copy of the sample (NaN: out)
        return (sample.max(axis=1, initial=-np.inf) <= PLANNED_MAX) & (
            sample.min(axis=1, initial=np.inf) >= -PLANNED_MAX)


def train(sample: np.ndarray, partitions: int, seed: int = 0,
          progress: Progress | None = None, merge_within: float = 0.0, dev=None
          ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, centroids relative to it), float64, from sample rows of the search space
    (float32 or float64; centred a block at a time).
    Recall in exact mode never depends on the centroids, only the cost does.
    ``merge_within``: centroids closer than this to a larger cell's are dropped
    (``_merge_close``). ``dev``: a torch device for the products (``kmeans``)."""
    d = sample.shape[1]
    mean = sample.mean(axis=0, dtype=np.float64) if len(sample) else np.zeros(d)
    k = max(1, min(partitions, len(sample)))
    if k == 1:
        return mean, np.zeros((1, d))
    rng = np.random.default_rng(seed)
    if len(sample) > TRAIN_PER_CELL * k:  # taken here so every iteration sees one set
        sample = sample[np.sort(rng.choice(len(sample), TRAIN_PER_CELL * k, replace=False))]
    z = centred(sample, mean, np.float32).v
    steps = KMEANS_ITERATIONS + 1  # the iterations, then splitting oversized cells
    zt = None if dev is None else to_device(z, dev)  # the sample goes up once
    centroids = kmeans(z, k, seed, None if progress is None else
                       lambda it: progress("k-means", it, steps), zt)
    centroids = _merge_close(z, _split_large(z, centroids, seed, zt), merge_within, zt)
    centroids = centroids.astype(np.float64)
    if progress is not None:
        progress("k-means", steps, steps)
    return mean, centroids


def kmeans(z: np.ndarray, k: int, seed: int, done: Callable[[int], None] | None = None,
           zt=None) -> np.ndarray:
    """(k, d) float32 centroids of the float32 rows ``z``: KMEANS_ITERATIONS of Lloyd's
    iterations from k distinct rows drawn at random, an empty cell taking half of a
    cell drawn by its size (FAISS's rule). Not FAISS's own k-means: its products run
    through the BLAS FAISS ships, half the speed of numpy's on this machine (160,000 x
    3,153 x 128: 4.9 against 2.6 CPU s an iteration), and at 8M records the plan's
    k-means was a sixth of the job's CPU. ``done(i)`` after each iteration. ``zt``: the
    rows as a torch tensor: the products and the assignment on its device (float32
    without TF32, as here); the sums stay here, in one order (a GPU's ``index_add_``
    adds in whatever order its threads finish: the centroids would change from run to
    run). Where the device's products round a near-tie the other way, a row joins
    another cell and the centroids differ from numpy's."""
    rng = np.random.default_rng(seed)
    n, d = z.shape
    c = z[np.sort(rng.choice(n, k, replace=False))].astype(np.float32)
    sign = np.where(np.arange(d) % 2 == 0, 1.0, -1.0).astype(np.float32) / 1024
    for it in range(KMEANS_ITERATIONS):
        home = nearest_centroid(z, c, zt)
        o = np.argsort(home, kind="stable")
        counts = np.bincount(home, minlength=k)
        filled = np.flatnonzero(counts)
        starts = np.concatenate([[0], np.cumsum(counts[filled])[:-1]])
        c[filled] = (np.add.reduceat(z[o], starts, axis=0, dtype=np.float64)
                     / counts[filled, None]).astype(np.float32)
        for e in np.flatnonzero(counts == 0).tolist():  # rare: split a cell drawn by size
            big = np.maximum(counts - 1, 0)
            j = int(rng.choice(k, p=big / big.sum()))
            c[e], c[j] = c[j] * (1 + sign), c[j] * (1 - sign)
            counts[e] = counts[j] // 2
            counts[j] -= counts[e]
        if done is not None:
            done(it + 1)
    return c


def _nearest_torch(zt, c: np.ndarray):
    """``nearest_centroid`` on ``zt``'s device (TF32 off), as a tensor there."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    ct = to_device(np.asarray(c, np.float32), zt.device)
    ctm, csq = -2 * ct.T, (ct * ct).sum(dim=1)
    out = torch.empty(len(zt), dtype=torch.int64, device=zt.device)
    block = rows_for(4 * len(c), 256 << 20, len(zt), 256)
    for a in range(0, len(zt), block):
        f = zt[a:a + block] @ ctm
        f += csq
        out[a:a + block] = f.argmin(dim=1)
    return out


def nearest_centroid(z: np.ndarray, c: np.ndarray, zt=None) -> np.ndarray:
    """Each row's nearest centroid by float32 products (|c|^2 - 2 z.c), a block of rows
    at a time (``zt``: the rows on a torch device, where the products then run)."""
    if zt is not None:
        return _nearest_torch(zt, c).cpu().numpy()
    c = np.ascontiguousarray(c, np.float32)
    ct, csq = -2 * c.T, np.einsum("ij,ij->i", c, c)
    out = np.empty(len(z), np.int64)
    block = rows_for(4 * len(c), 64 << 20, len(z), 256)  # a block's scores: 64 MB
    for a in range(0, len(z), block):
        f = np.asarray(z[a:a + block], np.float32) @ ct
        f += csq
        out[a:a + block] = f.argmin(axis=1)
    return out


def _split_large(z: np.ndarray, centroids: np.ndarray, seed: int, zt=None) -> np.ndarray:
    """Cells of skewed data (a few big topics) can hold many times the mean: searching one
    costs its size squared. A cell with more than twice the mean share of the sample is
    replaced by a k-means of its own rows into cells of about the mean size (still one
    flat set of centroids, so the join rule holds unchanged)."""
    k = len(centroids)
    home = nearest_centroid(z, centroids, zt)
    sizes = np.bincount(home, minlength=k)
    mean_size = len(z) / k
    out = [centroids[sizes <= 2 * mean_size]]
    for c in np.flatnonzero(sizes > 2 * mean_size).tolist():
        mine = np.flatnonzero(home == c)
        parts = min(math.ceil(sizes[c] / mean_size), len(mine) // 40)
        if parts < 2:
            out.append(centroids[c:c + 1])
            continue
        out.append(kmeans(z[mine], parts, seed + c, None,
                          None if zt is None else zt[to_device(mine, zt.device)]))
    return np.concatenate(out)


def _merge_close(z: np.ndarray, centroids: np.ndarray, within: float, zt=None
                 ) -> np.ndarray:
    """A crowd (thousands of copies of one record, blank records) draws many k-means
    centroids into a region smaller than the tolerance. Each of its records would then
    join every one of those cells (the bisector rule cannot separate points closer than
    the radius), and each cell would hold the crowd again. Centroids within ``within``
    of a larger cell's centroid are dropped, largest cells first, so a crowd lives in
    one cell (any set of centroids keeps the join rule exact)."""
    if within <= 0 or len(centroids) < 2:
        return centroids
    c = np.ascontiguousarray(centroids, np.float32)
    sizes = np.bincount(nearest_centroid(z, c, zt), minlength=len(c))
    kept: list[int] = []
    for i in np.argsort(-sizes, kind="stable").tolist():
        if not kept or np.min(np.linalg.norm(c[kept] - c[i], axis=1)) > within:
            kept.append(i)
    return centroids[np.sort(kept)]


def assign_width(cells: int, coarse: int | None, joins: float, probes: int | None) -> float:
    """Centroids one record is scored against when assigned: every cell's (one level), or
    the coarse cells' and the fine cells of the coarse cells it considers (two levels):
    bounded mode (``probes``), its COARSE_PROBES x probes candidates; exact, those it
    joins, at most its ``joins`` (it joins a fine cell in each)."""
    if not coarse:
        return float(cells)
    considered = joins if probes is None else min(coarse, COARSE_PROBES * probes)
    return coarse + considered * cells / coarse


def train_width(cells: int, coarse: int | None) -> float:
    """Centroids one sample row meets in each k-means iteration: every cell's (one
    level), or the coarse cells' and then its own coarse cell's share of the fine ones."""
    return float(cells) if not coarse else coarse + cells / coarse


def coarse_count(cells: int) -> int:
    """Two levels: COARSE_CELLS coarse cells (fewer where there would be under 4 fine cells
    in each), or sqrt(cells) where that is more. A record then meets about as many
    centroids as with sqrt(cells) coarse cells (it scores the fine cells of
    COARSE_PROBES x probes coarse cells), but coarse cells this small hold its
    neighbours' homes: on the growth benchmark's embeddings (docs/near.md) 0.09% of the
    planted pairs met in no cell at 2M records, against 0.29% with sqrt(cells)."""
    return max(2, round(math.sqrt(cells)), min(cells // 4, COARSE_CELLS))


def train_levels(sample: np.ndarray, partitions: int, seed: int = 0,
                 progress: Progress | None = None, merge_within: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two levels from the sample rows: (mean, fine centroids relative to it grouped by
    coarse cell, coarse centroids relative to it, each coarse cell's first fine cell and
    the end). ``coarse_count`` coarse cells; each coarse cell's sample rows train
    its share of the fine cells (``train``, so oversized cells split and crowds merge
    inside it)."""
    k1 = coarse_count(partitions)
    mean, coarse = train(sample, k1, seed, progress, merge_within)
    z = centred(sample, mean, np.float32).v
    home = nearest_centroid(z, coarse)
    fine, start = [], [0]
    for c in range(len(coarse)):
        rows = sample[home == c]
        k = max(1, round(partitions * len(rows) / max(len(sample), 1)))
        if len(rows) < 2:
            cents = coarse[c:c + 1]
        else:
            m, rel = train(rows, k, seed + 1 + c, None, merge_within)
            cents = rel + (m - mean)
        fine.append(cents)
        start.append(start[-1] + len(cents))
        if progress is not None:
            progress("k-means (fine cells)", c + 1, len(coarse))
    return mean, np.concatenate(fine), coarse, np.asarray(start, np.int64)


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
    coarse: np.ndarray | None = None  # two levels: (k, d) coarse centroids, relative to mean
    start: np.ndarray | None = None  # ... coarse cell c's fine cells: start[c]:start[c + 1]
    gap: np.ndarray = field(init=False, repr=False)  # one level: (cells, cells) |c_p - c_q|

    def __post_init__(self) -> None:
        self.gap = _gaps(self.centroids) if self.coarse is None else np.zeros((0, 0))

    def __len__(self) -> int:
        return len(self.centroids)

    @property
    def levels(self) -> int:
        return 1 if self.coarse is None else 2

    @cached_property
    def level_gaps(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Two levels: the coarse cells' gaps, and each coarse cell's fine cells' gaps."""
        cuts = self.start.tolist()
        return _gaps(self.coarse), [_gaps(self.centroids[a:b]) for a, b in
                                    zip(cuts[:-1], cuts[1:], strict=True)]

    def describe(self) -> dict:
        return {"mode": self.mode, "reason": self.reason, "cells": len(self),
                "levels": self.levels,
                "coarse_cells": None if self.coarse is None else len(self.coarse),
                "probes": self.probes,
                "prediction": None if self.prediction is None else self.prediction.as_dict()}


def _gaps(c: np.ndarray) -> np.ndarray:
    """|c_p - c_q| for every two centroids."""
    sq = np.einsum("ij,ij->i", c, c)
    gap = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * c @ c.T, 0))
    np.fill_diagonal(gap, 0)
    return gap


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
           progress: Progress | None = None, dev=None) -> Assignment:
    """Cells each row (``z``: centred on ``parts.mean``) joins; ``probes``: the cap (-1:
    the plan's, None: exact); ``progress("assign", rows done, rows)`` after each block;
    ``dev``: a torch device for one level's products (``_joins``).
    Two levels: the coarse cells first, then the fine cells inside each coarse cell
    joined (``_joins`` at each level; see the module docstring)."""
    probes = parts.probes if probes == -1 else probes
    n, k = len(z.v), len(parts)
    if k == 1 or n == 0:  # one cell; or nothing to assign (a sample of two distinct rows)
        ones = np.ones(n, np.int64)
        return Assignment(np.zeros(n, np.int64), np.arange(n, dtype=np.int64),
                          np.zeros(n, np.int64), ones, np.zeros(n, bool))
    if parts.coarse is None:
        home, rows, cells, _, want = _joins(z, parts.centroids, parts.gap, parts.radius,
                                            probes, progress, dev)
        joined = np.bincount(rows, minlength=n)
        return Assignment(home, rows, cells, want, joined < want)
    if probes is not None:
        return _bounded_two(z, parts, probes, progress)
    coarse_gap, fine_gaps = parts.level_gaps
    h1, r1, c1, m1, _ = _joins(z, parts.coarse, coarse_gap, parts.radius, None, progress)
    home = np.zeros(n, np.int64)
    want = np.zeros(n, np.int64)
    rows, cells = [], []
    o = np.argsort(c1, kind="stable")
    cuts = np.searchsorted(c1[o], np.arange(len(parts.coarse) + 1))
    for c in range(len(parts.coarse)):
        at = o[cuts[c]:cuts[c + 1]]
        if not len(at):
            continue
        r, first = r1[at], int(parts.start[c])
        sub, radius = _projected(z.take(r), h1[r], m1[at], c, parts.coarse, coarse_gap,
                                 parts.radius)
        h, rr, pp, _, ww = _joins(sub, parts.centroids[first:parts.start[c + 1]],
                                  fine_gaps[c], radius, None)
        mine = h1[r] == c
        home[r[mine]] = first + h[mine]
        want[r] += ww
        rows.append(r[rr])
        cells.append(first + pp)
    return Assignment(home, np.concatenate(rows), np.concatenate(cells), want,
                      np.zeros(n, bool))


def _bounded_two(z: Vectors, parts: Partitions, probes: int,
                 progress: Progress | None = None) -> Assignment:
    """Bounded mode over two levels: the fine cells of a row's COARSE_PROBES x ``probes``
    nearest coarse cells (home first, then by bisector) are its candidates, and among
    them the one-level rule and ranking apply as if they were all the cells: home the
    nearest candidate centroid, at most ``probes`` cells that pass the rule, nearest
    bisectors first. Cells whose coarse cell was not a candidate are not met (recall is
    measured); in high dimensions the exact two-level rule joins many coarse cells
    (their bisectors pass near most records), so bounded mode does not use it."""
    n = len(z.v)
    coarse_gap, _ = parts.level_gaps
    h1, r1, c1, _, w1 = _joins(z, parts.coarse, coarse_gap, parts.radius,
                               COARSE_PROBES * probes, progress)
    widest = int(np.diff(parts.start).max())
    block = max(1024, (1 << 24) // (COARSE_PROBES * probes * widest))  # few, large products
    csq = np.einsum("ij,ij->i", parts.centroids, parts.centroids)
    home = np.zeros(n, np.int64)
    rows, cells, passed = [], [], []
    for a in range(0, n, block):  # r1 is sorted by row and holds every row (its home)
        k = slice(*np.searchsorted(r1, [a, a + block]).tolist())
        h, rr, pp, ok = _bounded_block(z, parts, csq, r1[k], c1[k], probes, a)
        home[a:a + len(h)] = h
        rows.append(rr)
        cells.append(pp)
        passed.append(ok)
    rows_a, cells_a = np.concatenate(rows), np.concatenate(cells)
    want = np.bincount(np.concatenate(passed), minlength=n)
    joined1 = np.bincount(r1, minlength=n)
    joined = np.bincount(rows_a, minlength=n)
    return Assignment(home, rows_a, cells_a, want, (joined < want) | (joined1 < w1))


def _bounded_block(z: Vectors, parts: Partitions, csq: np.ndarray, r1: np.ndarray,
                   c1: np.ndarray, probes: int, first: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_bounded_two`` for the rows ``first``... of one block (``r1``, each of them
    at least once, joined coarse cell ``c1``): (home of each row, row, cell, the row of
    each cell that passed the rule before the cap). One pass finds each row's nearest
    candidate centroid, a second applies the rule, both on each coarse cell's dense
    (rows x fine cells) scores."""
    cent, start, dt = parts.centroids, parts.start, z.v.dtype
    best = np.full(int(r1.max(initial=first - 1)) - first + 1, np.inf)
    home = np.zeros(len(best), np.int64)
    scored = []
    o = np.argsort(c1, kind="stable")
    c1o, r1o = c1[o], r1[o]
    cut = np.flatnonzero(np.diff(c1o)) + 1
    for lo, hi in zip(np.r_[0, cut].tolist(), np.r_[cut, len(c1o)].tolist(),
                      strict=True):
        c, r = int(c1o[lo]), r1o[lo:hi]
        a, b = int(start[c]), int(start[c + 1])
        f = (z.v[r] @ (-2 * cent[a:b].T).astype(dt) + csq[a:b].astype(dt)).astype(np.float64)
        j = f.argmin(axis=1)
        fm = f[np.arange(len(r)), j]
        li = r - first
        better = fm < best[li]
        best[li[better]], home[li[better]] = fm[better], a + j[better]
        scored.append((c, r, li, f))
    u, g = z.u, gamma(cent.shape[1] + 1, dt)
    cmax = math.sqrt(csq.max())
    rows, cells, margins = [], [], []
    for c, r, li, f in scored:
        a = int(start[c])
        h, fh = home[li], best[li][:, None]
        b = int(start[c + 1])
        hs, at = np.unique(h, return_inverse=True)  # rows share homes: gaps once per home
        gap = np.sqrt(np.maximum(csq[hs][:, None] + csq[None, a:b]
                                 - 2 * (cent[hs] @ cent[a:b].T), 0))[at]
        nz = z.norm[r]
        r2, err = _rule_terms(parts.radius, nz, u, g, cmax, 2 * cmax)
        own = (a + np.arange(f.shape[1]))[None, :] == h[:, None]
        rr, pp = np.nonzero((f - r2[:, None] * gap <= fh + err[:, None]) | own)
        rows.append(r[rr])
        cells.append(a + pp)
        margins.append(np.where(own[rr, pp], -1.0, (f[rr, pp] - fh[rr, 0])
                                / np.maximum(2 * gap[rr, pp], 1e-300)))
    rows, cells, margin = (np.concatenate(x) for x in (rows, cells, margins))
    kept = _nearest_bisectors(rows - first, margin, probes)
    return home, rows[kept], cells[kept], rows


def _nearest_bisectors(rows: np.ndarray, margin: np.ndarray, probes: int) -> np.ndarray:
    """Bounded mode's cap: the places of each row's ``probes`` pairs of least margin (its
    home first), in row then margin order."""
    o = _by_row_and_margin(rows, margin)
    r = rows[o]
    return o[np.arange(len(r)) - np.searchsorted(r, r) < probes]


def _by_row_and_margin(rows: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """The order of (row, margin) pairs by row, then margin (-1, a row's home, first),
    then place: one stable sort of a 64-bit key, the row's bits above the margin's
    leading bits (a float >= 0 orders as its bits do), ten times faster than np.lexsort
    on a block's 15M pairs (a third of the two-level assignment). Margins within
    2^(b - 52) of each other (relative; b: the rows' bits, 22 for a block of 4M) count
    as equal. ``rows``: >= 0; from 2^30 on, np.lexsort."""
    top = max(1, int(rows.max(initial=0)).bit_length())
    if top > 30:
        return np.lexsort((margin, rows))
    low = 64 - top  # bits of the margin; its float64 bits are below 2^63
    m = np.maximum(np.asarray(margin, np.float64), 0.0).view(np.uint64) >> np.uint64(64 - low)
    key = np.where(margin < 0, np.uint64(0), m + np.uint64(1))
    key |= rows.astype(np.uint64) << np.uint64(low)
    return np.argsort(key, kind="stable")


def _projected(z: Vectors, home: np.ndarray, low: np.ndarray, c: int, coarse: np.ndarray,
               gap: np.ndarray, radius: float) -> tuple[Vectors, np.ndarray]:
    """Rows joining coarse cell ``c`` from another home: where their neighbours in ``c``
    can be. A neighbour x of y (|x - y| <= r') on c's side of the bisector H between
    c and y's home, at distance >= delta from y, lies within sqrt(r'^2 - delta^2) of
    y + delta n (n: H's unit normal towards c): with x - y = a n + w, a >= delta,
    |x - (y + delta n)|^2 = a^2 + |w|^2 - 2 a delta + delta^2 <= r'^2 - delta^2. So
    those rows join c's fine cells from that point with that radius, far fewer than
    from their own place; ``low`` is a lower bound of delta (any smaller delta keeps
    the bound), -1 for home rows, which keep their place and radius."""
    far = low > 0
    rad = np.full(len(z.v), radius)
    if not far.any():
        return z, rad
    v, norm = z.v.copy(), z.norm.copy()
    hc, d = home[far], low[far]
    n = (coarse[c] - coarse[hc]) / gap[hc, c][:, None]
    moved = z.v[far].astype(np.float64) + d[:, None] * n
    v[far] = moved
    norm[far] = np.linalg.norm(moved, axis=1)
    r_ = _stored_radius(radius, z.norm[far], z.u)  # where storing moved y, too
    rad[far] = np.sqrt(np.maximum(r_ * r_ - d * d, 0.0)) + 4 * z.u * norm[far]  # the cast
    return Vectors(v, norm), rad


def _stored_radius(radius, nz: np.ndarray, u: float):
    """r': the radius widened by where storing moved rows of norms ``nz``."""
    return radius + 1.01 * u * (2 * nz + radius)


def _rule_terms(radius, nz: np.ndarray, u: float, g: float, cmax: float, gap_max: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """(2 r', e) of the rule f_p - 2 r' |c_p - c_home| <= f_home + e for rows of norms
    ``nz``: e bounds the rounding of the scores (centroid norms up to ``cmax``, gaps up
    to ``gap_max``), for this row and for any neighbour's own choice of home."""
    r2 = 2 * _stored_radius(radius, nz, u)
    return r2, 1.02 * (2 * g + 8 * u) * (2 * nz * cmax + cmax * cmax + r2 * gap_max)


def _joins(z: Vectors, c: np.ndarray, gap: np.ndarray, radius: float | np.ndarray,
           probes: int | None, progress: Progress | None = None, dev=None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One level's rule: (home, row, cell, a lower bound of the row's distance to the
    bisector, cells wanted per row) for the rows of ``z`` and the centroids ``c``
    (relative to z's centre), ``gap`` their distances, ``radius`` one or per row; at
    most ``probes`` cells per row (None: all the rule passes).

    One matrix product gives f_p = |c_p|^2 - 2 z.c_p (|z - c_p|^2 less |z|^2) for every
    cell; the rule is then f_p - 2 r' |c_p - c_home| <= f_home + e, one pass. The
    slack r' - r covers where storing moved the vectors, e the rounding of the product
    and of those passes, for this row and for any neighbour's own choice of home (see
    the module docstring). Bounded mode ranks only the cells that passed, by their
    distance to the bisector (the home: -1). ``dev``: a torch device for the products and
    the passes over every score (``_scores``)."""
    n, k = len(z.v), len(c)
    if k == 1:
        zero = np.zeros(n, np.int64)
        return zero, np.arange(n, dtype=np.int64), zero, np.full(n, -1.0), np.ones(n, np.int64)
    dim, dt = c.shape[1], z.v.dtype
    csq = np.einsum("ij,ij->i", c, c)
    u, g = UNIT_ROUNDOFF[dt], gamma(dim + 1, dt)
    cmax, gmax = math.sqrt(csq.max()), float(gap.max())
    ca = np.empty((dim + 1, k), dt)
    ca[:dim], ca[dim] = -2 * c.T, csq
    widest = gap.max(axis=1)  # per home: its largest gap, for a first cut
    homes, rows, cells, margins, wanted = [], [], [], [], []
    block = rows_for(z.v.itemsize * (dim + 1), 64 << 20, max(256, (1 << 22) // k), 1)
    if dev is not None:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        ca, widest = to_device(ca, dev), to_device(widest, dev)
        block *= 4  # the scores stay on the device: fewer, larger products
    for a in range(0, n, block):
        za = np.empty((min(block, n - a), dim + 1), dt)
        za[:, :dim], za[:, dim] = z.v[a:a + block], 1
        nz = z.norm[a:a + block]
        ra = radius if np.isscalar(radius) else radius[a:a + block]
        r2, err = _rule_terms(ra, nz, u, g, cmax, gmax)
        h, fh, rr, pp, f = _scores(za, ca, widest, r2, err, u)
        ok = f - r2[rr] * gap[h[rr], pp] <= fh[rr] + err[rr]
        rr, pp, f = rr[ok], pp[ok], f[ok]  # the home cell passes (gap 0)
        want = np.bincount(rr, minlength=len(za))
        # twice the rounding: this row's scores, and a neighbour's own choice of home
        margin = np.maximum(f - fh[rr] - 2 * err[rr], 0) / np.maximum(
            2 * gap[h[rr], pp], 1e-300)
        margin[pp == h[rr]] = -1.0
        if probes is not None and probes < k:
            kept = _nearest_bisectors(rr, margin, probes)
            rr, pp, margin = rr[kept], pp[kept], margin[kept]
        homes.append(h)
        rows.append(a + rr)
        cells.append(pp)
        margins.append(margin)
        wanted.append(want)
        if progress is not None:
            progress("assign", a + len(za), n)
    return (np.concatenate(homes).astype(np.int64), np.concatenate(rows).astype(np.int64),
            np.concatenate(cells).astype(np.int64), np.concatenate(margins),
            np.concatenate(wanted))


def _scores(za: np.ndarray, ca, widest, r2: np.ndarray, err: np.ndarray, u: float
            ) -> tuple[np.ndarray, ...]:
    """``_joins``' pass over every score of a block: f = za @ ca, each row's home (the
    smallest f) and its f (float64), and the (row, cell, f) whose f passes the first cut
    with the home's widest gap. ``ca`` (and ``widest``) a torch tensor: on its device,
    where only what passes is copied back."""
    if isinstance(ca, np.ndarray):
        f = za @ ca
        h = f.argmin(axis=1)
        fh = f[np.arange(len(f)), h].astype(np.float64)
        cut = _first_cut(fh, r2, widest[h], err, u)
        rr, pp = np.divmod(np.flatnonzero(f <= cut.astype(f.dtype)[:, None]), f.shape[1])
        return h, fh, rr, pp, f[rr, pp]
    import torch

    dev = ca.device
    f = to_device(za, dev) @ ca
    h = f.argmin(dim=1)
    fh = f.gather(1, h[:, None])[:, 0].to(torch.float64)
    cut = _first_cut(fh, to_device(r2, dev), widest[h], to_device(err, dev), u)
    rr, pp = torch.nonzero(f <= cut.to(f.dtype)[:, None], as_tuple=True)
    return (h.cpu().numpy(), fh.cpu().numpy(), rr.cpu().numpy(), pp.cpu().numpy(),
            f[rr, pp].cpu().numpy())


def _first_cut(fh, r2, widest, err, u: float):
    """The largest score a cell can have and still pass the rule, with the home's widest
    gap for every cell (numpy arrays or torch tensors alike), rounded up."""
    return (fh + r2 * widest + err) * (1 + 4 * u) + 1e-30


def predict(held: Vectors, parts: Partitions, rows: int, probes: int,
            progress: Progress | None = None, dev=None) -> Prediction:
    """Both modes' joins, capped share, work and largest cell on held-out rows."""
    k, s = len(parts), max(len(held.v), 1)
    scale = rows / s
    figures = []
    for step, cap in enumerate((None, probes), 1):
        a = assign(held, parts, cap, dev=dev)
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
         seed: int = 0, progress: Progress | None = None, levels: int = 1,
         dev=None) -> Partitions:
    """Centroids from the sample rows (search space, float32 or float64) in one level or
    two (``levels``) and the mode: ``auto`` takes exact when its predicted joins per row
    are within ``probes``. ``dev``: a torch device for one level's k-means and
    prediction."""
    if mode not in MODES:
        raise ValueError(f"near.mode must be one of {', '.join(MODES)}, got {mode!r}")
    sample = sample[planned_rows(sample)]
    if cells <= 1 or len(sample) < 2:
        mean, centroids = train(sample, 1)
        return Partitions(mean, centroids, radius, None, "exact",
                          "one cell: every row is compared with every other")
    held = np.arange(len(sample)) % 5 == 4  # one row in five predicts, the others train
    if levels == 2:
        mean, fine, coarse, start = train_levels(sample[~held], cells, seed, progress,
                                                 merge_within=radius)
        parts = Partitions(mean, fine, radius, coarse=coarse, start=start)
    else:
        mean, centroids = train(sample[~held], cells, seed, progress, merge_within=radius,
                                dev=dev)
        parts = Partitions(mean, centroids, radius)
    p = predict(centred(sample[held], mean, np.float32), parts, rows, probes, progress, dev)
    exact = mode == "exact" or (mode == "auto" and p.joins_exact <= probes)
    cut = "" if parts.coarse is None else f" (two levels: {len(parts.coarse)} coarse)"
    why = (f"exact cells would join each record to {p.joins_exact:.1f} of {len(parts)} "
           f"cells{cut}; "
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
