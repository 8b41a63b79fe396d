"""Keep-order decisions inside one cell, without holding the pairs within tolerance.

Why: a crowd of m mutual near copies (one image re-encoded 50,000 times, blank
records) has m^2/2 pairs within tolerance, so a search that returns its pairs and a
merge that holds them grow with the pairs, not with the data. Representative grouping
does not need them: records are visited in keep order and one is removed when it is
within tolerance of a record already *kept*. A record therefore needs only its
earlier neighbours that are kept, or whose fate is still open; removed ones cannot
change it. Kept records are pairwise beyond the tolerance, so inside a crowd they are
few: each record of a crowd costs a handful of distances, not m.

``decide`` visits a cell's rows in keep order, in blocks: each block is compared with
the earlier kept rows and the earlier open rows (matrix products with the proven
rounding bound of ``near.search``, then float64 verification), then with its own
rows, and a short loop settles the block in order. A row is

- STATE_KEPT: no earlier neighbour is kept or open (certain: in exact mode every neighbour
  of a home row is in its cell);
- STATE_REMOVED: an earlier neighbour is kept (certain); ``dup`` is the nearest kept one
  of the most protected tier (``tier``: a reference record before a stored one before a
  record of this run, as for exact copies), and ``doubt`` says an open earlier
  neighbour might turn out nearer;
- STATE_OPEN: it depends on a row this cell cannot decide (a row that lives in another cell,
  ``home`` False). Open and doubtful rows are settled by ``decide`` again over just
  them and the rows they depend on (``open_refs``), with every fate known.

Components grouping uses the same visit with every row treated alike (the kept rows
form a net: every other row is within tolerance of one); components of the pairs
visited, plus a check between nets' members where pairs were sampled, are the
cell's components.

The pairs are also *counted* (the report's histogram): every pair of a home row with
an earlier row, each once (in the later row's cell). Pairs between a home row and
earlier removed rows matter only to that count; inside a crowd they are m^2/2, so past
a budget per cell they are counted for a sample of rows and scaled (``Census``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from transforms.near.components import join_skipped, labels_of
from transforms.near.project import Projection, project, projected_radius
from transforms.near.recall import splitmix64
from transforms.near.search import Vectors, pairs_within, rows_for, thresholds, use_cuda

__all__ = ["STATE_KEPT", "STATE_OPEN", "STATE_REMOVED", "Census", "Decisions", "decide"]

STATE_KEPT, STATE_REMOVED, STATE_OPEN = 1, 2, 3
BLOCK = 512  # rows settled together at first (their own pairs: BLOCK^2 / 2 at most) ...
BLOCK_MAX = 2048  # ... up to this many where few of their own pairs are near (``_next_block``)
COLUMNS = 8192  # data rows per product call: BLOCK_MAX x COLUMNS candidates at most
CENSUS_EXACT_PAIRS = 65_536  # pairs with removed rows counted one by one, per cell ...
CENSUS_SAMPLED_PAIRS = 65_536  # ... then about this many more, on a sample of rows
BORDER = 64  # pairs nearest the threshold kept on each side, per cell


@dataclass
class Census:
    """Pairs within tolerance counted by the pass: ``exact`` distances (each pair once)
    and ``sampled`` ones, each standing for ``weight`` pairs (rows sampled past the
    budget)."""

    exact: list[np.ndarray] = field(default_factory=list)
    sampled: list[np.ndarray] = field(default_factory=list)
    weight: float = 1.0
    sampled_rows: int = 0
    budget_rows: int = 0  # rows whose pairs with removed rows were left to the sample

    def distances(self) -> tuple[np.ndarray, np.ndarray]:
        cat = [np.concatenate(p) if p else np.empty(0) for p in (self.exact, self.sampled)]
        return cat[0], cat[1]

    @property
    def estimated(self) -> bool:
        return self.budget_rows > 0


@dataclass
class Decisions:
    """What ``decide`` settled, per row (rows in keep order).

    ``state``: STATE_KEPT | STATE_REMOVED | STATE_OPEN; ``dup``/``dist``: a removed row's
    nearest kept earlier neighbour (-1: the outside candidate given in ``best``) and the distance;
    ``doubt``: removed, but an open earlier neighbour may be nearer; ``open_refs``:
    rows of other cells (``home`` False) that open or doubtful home rows depend on;
    ``label``: components grouping, the component of each row (the smallest row);
    ``border``: (later, earlier, distance, within) of the verified pairs nearest the
    threshold on each side."""

    state: np.ndarray
    dup: np.ndarray
    dist: np.ndarray
    doubt: np.ndarray
    open_refs: np.ndarray
    label: np.ndarray | None
    census: Census
    border: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class _Pairs:
    """Verified pairs (query row, data row) within the search radius, both ways; with a
    projection, candidates pass its narrow product first (``near.project``); with
    ``known`` (the cell's candidate pairs, from ``near.batched``), no product at all."""

    def __init__(self, z: Vectors | Callable[[], Vectors], verify, radius: float,
                 device: str, projection: Projection | None = None,
                 known: tuple[np.ndarray, np.ndarray] | None = None):
        self._z, self.verify, self.radius, self.device = z, verify, radius, device
        self.known = known
        self.zp = self.radius_p = None
        if known is None and projection is not None and len(self.z.v) and not use_cuda(
                device):
            self.zp = project(self.z, projection)
            self.radius_p = projected_radius(projection, radius, self.z, self.z)

    @property
    def z(self) -> Vectors:
        """The search vectors, made when first needed (with ``known``, only by a
        components crowd's search at twice the radius)."""
        if callable(self._z):
            self._z = self._z()
        return self._z

    def between(self, q: np.ndarray, y: np.ndarray, earlier_only: bool = False
                ) -> tuple[np.ndarray, ...]:
        """(q row, y row, distance, q within y, y within q) for the candidate pairs of
        query rows ``q`` and data rows ``y`` (verified in float64; rows, not slots)."""
        out = []
        if len(q) and len(y) and self.known is not None:
            a, b = self.known
            n = max(int(q.max()), int(y.max()), int(a.max(initial=-1)),
                    int(b.max(initial=-1))) + 1
            inq, iny = np.zeros(n, bool), np.zeros(n, bool)
            inq[q], iny[y] = True, True
            hit = inq[a] & iny[b]
            a, b = a[hit], b[hit]
            keep = (a > b) if earlier_only else (a != b)
            if keep.any():
                out.append(self.checked(a[keep], b[keep]))
        elif len(q) and len(y):
            zq = self.z.take(q)
            cols = rows_for(self.z.v.itemsize * self.z.v.shape[1], 64 << 20, COLUMNS, 64)
            for c in range(0, len(y), cols):
                ys = y[c:c + cols]
                narrow = None if self.zp is None else (self.zp.take(q), self.zp.take(ys),
                                                       self.radius_p)
                i, j, _ = pairs_within(zq, self.z.take(ys), self.radius, self.device,
                                       projected=narrow)
                a, b = q[i], ys[j]
                keep = (a > b) if earlier_only else (a != b)
                if keep.any():
                    out.append(self.checked(a[keep], b[keep]))
        if not out:
            e = np.empty(0, np.int64)
            return e, e, np.empty(0), np.empty(0, bool), np.empty(0, bool)
        return tuple(np.concatenate(col) for col in zip(*out, strict=True))

    def candidates(self, q: np.ndarray, y: np.ndarray, times: float):
        """(q rows, y rows) that may lie within ``times`` search radii (unverified), a
        chunk of ``y`` at a time."""
        if not len(q):
            return
        zq = self.z.take(q)
        cols = rows_for(self.z.v.itemsize * self.z.v.shape[1], 64 << 20, COLUMNS, 64)
        for c in range(0, len(y), cols):
            ys = y[c:c + cols]
            i, j, _ = pairs_within(zq, self.z.take(ys), times * self.radius, self.device)
            yield q[i], ys[j]

    def checked(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        """(a, b, distance, a within b, b within a), verified in float64."""
        return (a, b) + tuple(self.verify(a, b))

    def through(self, index, q: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
        """``between`` with the candidates from an approximate index holding rows ``y``
        (in the order they were added), asked with the largest per-row threshold."""
        if not len(q) or not len(y):
            return self.between(q[:0], y)
        zq = self.z.take(q)
        limit = float(thresholds(zq, float(self.z.norm[y].max()), self.radius,
                                 zq.v.shape[1]).max())
        lims, _, ids = index.range_search(np.ascontiguousarray(zq.v, np.float32),
                                          np.nextafter(limit, np.inf) + 1e-300)
        a = q[np.repeat(np.arange(len(q)), np.diff(lims.astype(np.int64)))]
        b = y[ids.astype(np.int64)]
        keep = a != b
        return self.checked(a[keep], b[keep])

    def any_within(self, q: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The query rows within tolerance of at least one data row (earlier data rows
        first; a query stops at its first hit)."""
        hit = []
        cols = max(1, len(y)) if self.known is not None else rows_for(
            self.z.v.itemsize * self.z.v.shape[1], 64 << 20, COLUMNS, 64)
        for c in range(0, len(y), cols):
            if not len(q):
                break
            a, _, _, ab, _ = self.between(q, y[c:c + cols])
            found = np.unique(a[ab])
            hit.append(found)
            q = q[~np.isin(q, found)]
        return np.concatenate(hit) if hit else np.empty(0, np.int64)


class _Border:
    """The verified pairs nearest the threshold on each side, cut to BORDER per side."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, later, earlier, dist, within) -> None:
        measured = ~np.isnan(dist)  # cosine with a zero vector: no distance, no border
        if not measured.all():
            later, earlier, dist, within = (v[measured] for v in (later, earlier, dist, within))
        if len(dist):
            self.parts.append((later, earlier, dist, within))
            if sum(len(p[2]) for p in self.parts) > 8 * BORDER:
                self.parts = [self.cut()]

    def cut(self) -> tuple[np.ndarray, ...]:
        if not self.parts:
            e = np.empty(0, np.int64)
            return e, e, np.empty(0), np.empty(0, bool)
        later, earlier, dist, within = (np.concatenate(c) for c in zip(*self.parts, strict=True))
        keep = []
        for side, key in ((within, -dist), (~within, dist)):
            rows = np.flatnonzero(side)
            keep.append(rows[np.argsort(key[rows], kind="stable")[:BORDER]])
        k = np.concatenate(keep)
        return later[k], earlier[k], dist[k], within[k]


def decide(n: int, z: Vectors | Callable[[], Vectors], verify, radius: float, *,
           home: np.ndarray, kept: np.ndarray | None = None, components: bool = False,
           exact: bool = True, best_dist: np.ndarray | None = None,
           best_rank: np.ndarray | None = None,
           keys: np.ndarray | None = None, census: bool = True, device: str = "cpu",
           index=None, projection: Projection | None = None,
           known: tuple[np.ndarray, np.ndarray] | None = None,
           tier: np.ndarray | None = None, best_tier: np.ndarray | None = None
           ) -> Decisions:
    """Decide the rows of one cell, visited in keep order (row i before row i + 1).

    ``n``: the cell's rows; ``z``: search vectors; ``verify(a, b)``: for rows a[k],
    b[k], (distance, a within b, b within a) in float64 (a crowd's block has
    millions of candidates: the caller verifies them a slice at a time); ``home``: rows
    this cell decides (the others live in another cell: open unless an earlier kept row
    removes them, which is certain only in ``exact`` mode); ``kept``: rows known to be
    kept (protected, or decided elsewhere); ``best_dist``/``best_rank``: a kept
    candidate outside the cell for some rows (distance, and its place in keep order as
    a fractional row number). ``keys``: (n, 2) uint64 identities that choose the census sample.
    ``index``: an empty approximate FAISS index (IVF/HNSW) that holds the kept rows and
    is asked instead of comparing with each (recall below 1, measured by the caller).
    ``projection``: a prefilter for the flat search's products (no pair lost).
    ``known``: every candidate pair of the cell, (query row, data row), a superset of
    what the products would give (``near.batched``); ``z`` may then be a function that
    makes the vectors, asked only if a search beyond them is needed.
    ``tier``: each row's (``transforms.exact`` NEW, STORE, REFERENCE; None: all NEW);
    a removed row's ``dup`` is of the highest tier among its kept neighbours, then the
    nearest (``best_tier``: the tier of ``best_dist``'s candidate).
    """
    own = np.asarray(home, bool)  # this cell's rows: the census counts their pairs
    all_home = own | components
    fixed = np.zeros(n, bool) if kept is None else np.asarray(kept, bool)
    pairs = _Pairs(z, verify, radius, device, projection, known)
    state = np.zeros(n, np.int8)
    dup = np.full(n, -1, np.int64)
    bd = np.full(n, np.inf) if best_dist is None else np.array(best_dist, np.float64)
    br = np.full(n, np.inf) if best_rank is None else np.array(best_rank, np.float64)
    tr = np.zeros(n, np.int8) if tier is None else np.asarray(tier, np.int8)
    bt = np.zeros(n, np.int8) if best_tier is None else np.array(best_tier, np.int8)
    doubt = np.zeros(n, bool)
    taint = np.zeros(n, bool)
    deps: list[tuple[np.ndarray, np.ndarray]] = []  # (home row, open row of another cell)
    edges: list[tuple[np.ndarray, np.ndarray]] = []  # components: (later, earlier) within
    sure_outside = exact and not components
    cen, border = Census(), _Border()
    count = census or components
    tally = [0, 0]  # census pairs and row pairs compared beyond the kept rows (budget)
    lean, lean_at, sample = False, n, np.zeros(n, bool)
    pools: dict[str, list[np.ndarray]] = {"kept": [], "out": [], "open": [], "gone": []}

    def pool(name: str) -> np.ndarray:
        return np.concatenate(pools[name]) if pools[name] else np.empty(0, np.int64)

    def seen(a, b, d, ab, exact_count=True) -> None:
        border.add(a, b, d, ab)
        if exact_count:
            _count(cen, a, d, ab, own)
        if components:
            edges.append((a[ab], b[ab]))

    s, size, own_pairs = 0, BLOCK, [0, 0]  # own_pairs: candidates, pairs compared
    while s < n:
        blk = np.arange(s, min(n, s + size))
        bh = blk[all_home[blk]]
        # 1. earlier kept rows: a kept neighbour removes (the nearest is the dup)
        q = blk if (sure_outside or components) else bh
        a, b, d, ab, _ = (pairs.between(q, pool("kept")) if index is None
                          else pairs.through(index, q, pool("kept")))
        seen(a, b, d, ab)
        _nearest(a[ab], b[ab], d[ab], bd, br, dup, tr, bt)
        # 2. earlier open rows: any leaves a home row open (or its dup in doubt); the
        # open rows of other cells are what open rows depend on, so all of those
        a, b, d, ab, _ = pairs.between(bh, pool("out"))
        seen(a, b, d, ab)
        taint[a[ab]] = True
        deps.append((a[ab], b[ab]))
        if lean:
            taint[pairs.any_within(bh[~taint[bh]], pool("open"))] = True
        else:
            a, b, d, ab, _ = pairs.between(bh, pool("open"))
            seen(a, b, d, ab)
            taint[a[ab]] = True
            tally[0] += int(ab.sum())
            tally[1] += len(bh) * len(pool("open"))
        # 3. earlier removed rows: they change nothing, only the count (and components)
        gone_now = blk[(bd[blk] < np.inf) & ~fixed[blk] & (all_home[blk] | sure_outside)]
        if count:
            rpool = np.concatenate([pool("gone"), gone_now]
                                   + ([pool("open")] if lean else []))
            work = len(bh) * len(rpool)  # expected pairs: this work x the density so far
            if not lean and tally[0] + work * (tally[0] / tally[1] if tally[1] else 0.25) \
                    > CENSUS_EXACT_PAIRS:
                lean, lean_at = True, s  # (this block's open pairs were counted above)
                sample = _census_sample(n, s, own, keys, tally, cen)
            q = bh[sample[bh]] if lean else bh
            a, b, d, ab, _ = pairs.between(q, rpool, earlier_only=True)
            seen(a, b, d, ab, exact_count=not lean)
            if lean:
                cen.sampled.append(d[ab & own[a]])
            else:
                tally[0] += int(ab.sum())
                tally[1] += len(q) * len(rpool)
        # 4. the block's own earlier rows that may still be kept or open
        live = blk[~np.isin(blk, gone_now)]
        if components:
            sides = [(blk, live)]
        else:  # two rows of other cells: not this cell's pair
            sides = [(bh, live), (blk[~all_home[blk]], live[all_home[live]])]
        found = [pairs.between(q, y, earlier_only=True) for q, y in sides]
        a, b, d, ab = (np.concatenate([f[k] for f in found]) for k in range(4))
        own_pairs[0] += len(a)
        own_pairs[1] += sum(len(q) * len(y) for q, y in sides) // 2
        seen(a, b, d, ab)
        _settle(blk, a[ab], b[ab], d[ab], fixed, all_home, sure_outside, state, bd, br,
                dup, taint, doubt, tr, bt)
        outside = ab & ~all_home[b] & (state[b] == STATE_OPEN)
        deps.append((a[outside], b[outside]))
        pools["kept"].append(blk[state[blk] == STATE_KEPT])
        if index is not None and len(pools["kept"][-1]):
            index.add(np.ascontiguousarray(z.v[pools["kept"][-1]], np.float32))
        pools["gone"].append(blk[state[blk] == STATE_REMOVED])
        is_open = state[blk] == STATE_OPEN
        pools["out"].append(blk[is_open & ~all_home[blk]])
        pools["open"].append(blk[is_open & all_home[blk]])
        s, size = s + len(blk), _next_block(*own_pairs)
    label = None
    if components:
        label = labels_of(n, edges)
        if lean:  # rows from the census sample's start on, outside it: pairs skipped
            missed = ~sample & (np.arange(n) >= lean_at)
            label = join_skipped(pairs, state, dup, missed, label, STATE_REMOVED)
    open_refs = np.zeros(n, bool)
    h = np.concatenate([p[0] for p in deps])
    o = np.concatenate([p[1] for p in deps])
    open_refs[o[(state[h] == STATE_OPEN) | doubt[h]]] = True
    dist = np.where(state == STATE_REMOVED, bd, np.nan)
    return Decisions(state, dup, dist, doubt, open_refs, label, cen, border.cut())


def _next_block(candidates: int, compared: int) -> int:
    """Rows to settle together next, from the share of a cell's own pairs so far that
    were candidates: each block gathers the earlier rows it is compared with (in cells
    of 6,000 rows at 8M records, a quarter of a cell's time at 512 rows a block), and
    verifies its own candidates in float64 (a crowd's block: all of its pairs; 1,024 rows
    took a 60,000-record crowd 2.4 times as long as 512). A block grows to where it expects
    no more candidates than rows."""
    size = BLOCK
    # twice the size: (candidates / compared) (2 size)^2 / 2 expected, at most 2 size
    while size < BLOCK_MAX and candidates * size <= compared:
        size *= 2
    return size


def _count(cen: Census, later: np.ndarray, dist: np.ndarray, within: np.ndarray,
           home: np.ndarray) -> None:
    """Exact census: pairs within tolerance whose later row lives in this cell."""
    keep = within & home[later]
    if keep.any():
        cen.exact.append(dist[keep])


def _nearest(a, b, d, bd, br, dup, tr, bt) -> None:
    """Fold verified pairs (a within b, b kept and earlier) into each a's best kept
    candidate: the highest tier, then the nearest, ties by keep order."""
    if not len(a):
        return
    o = np.lexsort((b, d, -tr[b], a))
    a, b, d = a[o], b[o], d[o]
    first = np.r_[True, a[1:] != a[:-1]]
    a, b, d = a[first], b[first], d[first]
    better = _better(tr[b], d, b, bt[a], bd[a], br[a])
    a, b, d = a[better], b[better], d[better]
    bd[a], br[a], dup[a], bt[a] = d, b, b, tr[b]


def _better(t, d, r, bt, bd, br):
    """Whether a candidate (tier, distance, keep-order rank) beats the best so far."""
    return (t > bt) | ((t == bt) & ((d < bd) | ((d == bd) & (r < br))))


def _settle(blk, a, b, d, fixed, home, sure_outside, state, bd, br, dup, taint,
            doubt, tr, bt) -> None:
    """The block's rows in keep order, given the pairs (``a`` later, within ``b``) among
    them. Rows with no such pair are settled at once; a loop takes the others in order
    (a crowd's first block, a few rows elsewhere)."""
    o = np.lexsort((b, d, a))
    a, b, d = a[o], b[o], d[o]
    lo = np.searchsorted(a, blk)
    hi = np.searchsorted(a, blk, side="right")
    alone = lo == hi
    _state(blk[alone], fixed, home, sure_outside, state, bd, taint, doubt)
    st, bdl, brl = state, bd, br
    for r, s, e in zip(blk[~alone].tolist(), lo[~alone].tolist(), hi[~alone].tolist(),
                       strict=True):
        for k in range(s, e):  # this block's earlier neighbours, nearest first
            other = st[b[k]]
            if other == STATE_KEPT:
                dk, bk = d[k], b[k]
                if _better(tr[bk], dk, bk, bt[r], bdl[r], brl[r]):
                    bdl[r], brl[r], dup[r], bt[r] = dk, bk, bk, tr[bk]
            elif other == STATE_OPEN:
                taint[r] = True
        _state(np.array([r]), fixed, home, sure_outside, state, bd, taint, doubt)


def _state(rows, fixed, home, sure_outside, state, bd, taint, doubt) -> None:
    """KEPT / STATE_REMOVED / STATE_OPEN from what is known of each row's earlier neighbours."""
    gone = (bd[rows] < np.inf) & (home[rows] | sure_outside) & ~fixed[rows]
    is_open = ~gone & ~fixed[rows] & (~home[rows] | taint[rows])
    state[rows] = np.where(fixed[rows], STATE_KEPT, np.where(gone, STATE_REMOVED,
                                                       np.where(is_open, STATE_OPEN, STATE_KEPT)))
    doubt[rows] = gone & home[rows] & taint[rows]


def _census_sample(n: int, start: int, home: np.ndarray, keys: np.ndarray | None,
                   tally: list[int], cen: Census) -> np.ndarray:
    """Past the exact budget: the rows after ``start`` whose pairs with removed and open
    rows are counted, chosen by a hash of their key, about CENSUS_SAMPLED_PAIRS pairs
    in all; each counts for (rows left) / (rows sampled)."""
    rest = np.flatnonzero(home[start:]) + start
    density = tally[0] / tally[1] if tally[1] else 1.0  # share of compared pairs within
    per_row = max(1.0, density * float(rest.mean())) if len(rest) else 1.0
    k = int(min(len(rest), max(1, math.ceil(CENSUS_SAMPLED_PAIRS / per_row))))
    ident = (keys[rest, 0] ^ splitmix64(keys[rest, 1]) if keys is not None
             else rest.astype(np.uint64))
    pick = rest[np.argsort(splitmix64(ident), kind="stable")[:k]]
    sample = np.zeros(n, bool)
    sample[pick] = True
    cen.weight, cen.sampled_rows, cen.budget_rows = len(rest) / max(k, 1), k, len(rest)
    return sample
