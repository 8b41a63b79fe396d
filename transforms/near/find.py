"""Near-duplicate search and grouping over plain arrays: matrix products find candidates,
float64 decides.

Why two steps: a float32 search is fast but rounds; a removal must never depend on it.
Candidates come from an L2 search whose radius is a proven superset of the user's
tolerance, compared with a per-row bound on the rounding error
(``transforms.near.search``), so no pair within tolerance is lost at any magnitude;
every candidate pair is then verified with the exact metric in float64, so precision
is 1.0 whatever the index. Grouping visits records in keep order.

Scale without one big search: rows are split into k-means cells and each cell decides
its own records in keep order (``transforms.near.plan``: exact cells by the bisector
rule, or a bounded number of cells per row; ``transforms.near.greedy``: each record
meets only earlier kept or open records, so crowds of copies cost no pair list); the
few records whose fate hangs on another cell are settled together afterwards
(``resolve_open``), and a brute-force sample judges the decisions
(``transforms.near.recall``). ``find_near`` runs the same steps in one process; the
Beam stage runs them on workers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from transforms.canonical import to_numpy
from transforms.near.batched import Known, cell_candidates, device_vectors, resident
from transforms.near.components import component_labels
from transforms.near.greedy import STATE_KEPT, STATE_OPEN, STATE_REMOVED, Decisions, decide
from transforms.near.plan import Assignment, Partitions, Progress, assign, plan
from transforms.near.project import (
    Projection,
    project,
    projected_radius,
    projection,
    sample_step,
)
from transforms.near.recall import PARTNERS, Recall, Strata, Truth, draw, judge
from transforms.near.search import (
    Vectors,
    earlier_candidates,
    rows_for,
    use_cuda,
)
from transforms.near.space import (
    approximate_index,
    finite_rows,
    largest_norm,
    search_radius,
    search_space,
    search_vectors,
    space_blocks,
    value_scale,
)
from transforms.near.spec import NearSpec, check_rank, complex_refusal
from transforms.near.verify import exact_distance, flat_rows, verify_rows

SAMPLE_ROWS = 200_000  # planning sample cap (rows) ...
SAMPLE_BYTES = 128 << 20  # ... and bytes (one worker holds it)
BLOCK_ROWS = 65_536  # rows assigned or brute-forced at once in one process
PROJECT_QUERIES = 256  # fewer sampled rows: the projection costs more than it saves
CELLS_PER_WINDOW = 512  # cells whose candidates are found together on a torch device


@dataclass
class NearResult:
    """``find_near``'s answer: removals (rows of the input, in keep order of the removed
    rows) and what the search did."""

    removed: np.ndarray
    kept: np.ndarray
    distance: np.ndarray
    partitions: Partitions
    pairs: float  # pairs within tolerance (each once; an estimate when ``estimated``)
    estimated: bool  # inside crowds, pairs with removed rows were counted on a sample
    recall: Recall | None
    capped: np.ndarray  # rows that met fewer cells than exact mode would (bounded mode)


def sample_cap(dim: int) -> int:
    """How many rows a planning sample holds: at most SAMPLE_ROWS, and SAMPLE_BYTES of
    float32 values."""
    return max(1, min(SAMPLE_ROWS, SAMPLE_BYTES // (4 * max(dim, 1))))


def sample_for_plan(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Rows to plan from (``sample_cap`` of them at most)."""
    return np.sort(np.random.default_rng(seed).choice(n, min(n, sample_cap(dim)),
                                                      replace=False))


def _blocks(n: int, dim: int = 1) -> Iterator[slice]:
    step = rows_for(8 * dim, 256 << 20, BLOCK_ROWS)
    for a in range(0, n, step):
        yield slice(a, min(n, a + step))


def true_partners(sample_x: np.ndarray, sample_rank: tuple, data_x: np.ndarray,
                  data_rank: tuple, spec: NearSpec, radius: float, center: np.ndarray,
                  k: int, basis: Projection | None = None, dev=None
                  ) -> tuple[np.ndarray, ...]:
    """Brute force for the recall check: each sampled row's earlier data rows (by
    ``*_rank``: (prio, order)) within tolerance, it within them as the reference; only
    the ``k`` nearest candidates by the products are verified (inside a crowd a record
    has thousands). With ``basis``, pairs go through a projected product first
    (``near.project``: a proven lower bound of the distance, no pair lost) when the
    sample is big enough to pay for the projection. Returns (sample row, data row,
    distance, candidates per sample row). ``dev``: the products on this torch device
    (``earlier_candidates``; no projection).
    The sample's search vectors are made a slice at a time (2,000 wide records are
    256 MB in float64)."""
    if not len(sample_x):  # no record sampled (a store held them all): no shape kept
        sample_x = sample_x.reshape(0, *data_x.shape[1:])
    dim = math.prod(sample_x.shape[1:])  # (reshape(0, -1) cannot tell it)
    y = search_vectors(data_x, spec, radius, center,
                       norm_at_least=largest_norm(sample_x, spec, center))
    dtype = y.v.dtype
    pr = basis if len(sample_x) >= PROJECT_QUERIES and dev is None else None
    yp = None if pr is None else project(y, pr)
    found = []
    step = rows_for(8 * dim, 32 << 20, len(sample_x))
    for a in range(0, max(1, len(sample_x)), step):  # one empty slice for no sample
        s = slice(a, a + step)
        q = search_vectors(sample_x[s], spec, radius, center, dtype)
        narrow = None
        if pr is not None:
            qp = project(q, pr)
            narrow = (qp, yp, projected_radius(pr, radius, q, y))
        si, dj, count = earlier_candidates(q, y, radius, (sample_rank[0][s], sample_rank[1][s]),
                                           data_rank, k, narrow, dev)
        found.append((si + a, dj, count))
    si, dj, count = (np.concatenate(c) for c in zip(*found, strict=True))
    d, ab, _ = verify_rows(sample_x, si, data_x, dj, spec)
    return si[ab], dj[ab], d[ab], count


def decide_cell(x: np.ndarray, home: np.ndarray, spec: NearSpec, radius: float,
                center: np.ndarray | None, *, exact: bool = True,
                z: Vectors | None = None, known: Known | None = None,
                rows: np.ndarray | None = None, **kw) -> Decisions:
    """``near.greedy.decide`` over rows of ``x`` in keep order (see there), with this
    spec's metric, search space, index and device (``z``: the search vectors when the
    caller has them; ``known``: the cell's candidate pairs from ``near.batched``;
    ``rows``: the cell is ``x[rows]``, with ``known`` read pair by pair: copying a cell
    whose few candidates touch a few dozen of its rows cost as much as deciding it)."""
    if rows is not None and known is None:  # the search reads every row: one copy
        x, rows = x[rows], None
    pick = (lambda r: r) if rows is None else rows.__getitem__
    if known is not None:  # the vectors only if a search beyond the candidates needs them
        vectors = (lambda: search_vectors(x if rows is None else x[rows], spec, radius,
                                          center)) if z is None else z
        index = None
    else:
        vectors = search_vectors(x, spec, radius, center) if z is None else z
        index = approximate_index(vectors, spec)
    return decide(len(home), vectors, lambda a, b: verify_rows(x, pick(a), x, pick(b), spec),
                  radius, home=home, components=spec.grouping == "components", exact=exact,
                  device=spec.device, index=index, known=known, **kw)


def assign_rows(x: np.ndarray, spec: NearSpec, radius: float, parts: Partitions,
                progress: Progress | None = None, dev=None) -> Assignment:
    """``plan.assign`` of rows of ``x`` from float32 search vectors (made on ``dev``
    where given). A row whose centred values are beyond float32 (a float64 record
    holding 1e39) is inf there and no cell took it; such rows all join cell 0 alone:
    they are compared with each other and with that cell's rows (in float64), not with
    other cells' (their distances to the centroids are lost to rounding anyway)."""
    z = (search_vectors(x, spec, radius, parts.mean, np.float32) if dev is None
         else device_vectors(x, spec, parts.mean, dev))
    wide = ~np.isfinite(z.norm)
    if not wide.any():
        return assign(z, parts, progress=progress, dev=dev)
    ok, w = np.flatnonzero(~wide), np.flatnonzero(wide)
    a = assign(z.take(ok), parts, progress=progress, dev=dev)
    home = np.zeros(len(wide), np.int64)
    wanted, capped = np.ones(len(wide), np.int64), np.zeros(len(wide), bool)
    home[ok], wanted[ok], capped[ok] = a.home, a.wanted, a.capped
    return Assignment(home, np.concatenate([ok[a.rows], w]),
                      np.concatenate([a.cells, np.zeros(len(w), np.int64)]), wanted, capped)


def resolve_open(x: np.ndarray, pos: np.ndarray, home: np.ndarray, best_dist: np.ndarray,
                 best_pos: np.ndarray, spec: NearSpec, radius: float,
                 tier: np.ndarray | None = None, best_tier: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records cells left open or in doubt (``home``), with the records they
    depend on that were kept (``home`` False), settled together in keep order (``pos``:
    their places, any numbers that sort as keep order). ``best_dist``/``best_pos``: a
    kept candidate a cell found for a doubtful record (inf: none). ``tier`` /
    ``best_tier``: the records' and the candidates' tiers (``greedy.decide``). Returns
    (removed, dup, distance) over the rows of ``x``: dup -1 means the cell's candidate
    stands."""
    order = np.argsort(pos, kind="stable")
    sp = pos[order]
    ext = np.searchsorted(sp, best_pos[order]) - 0.5  # the candidate's place among them
    z = search_space(x[order], spec)
    d = decide_cell(x[order], home[order], spec, radius, z.mean(axis=0) if len(z) else None,
                    kept=~home[order], best_dist=best_dist[order],
                    best_rank=np.where(np.isfinite(best_dist[order]), ext, np.inf),
                    census=False, tier=None if tier is None else tier[order],
                    best_tier=None if best_tier is None else
                    np.where(np.isfinite(best_dist[order]), best_tier[order], 0))
    gone = np.flatnonzero(d.state == STATE_REMOVED)
    dup = np.where(d.dup[gone] >= 0, order[np.maximum(d.dup[gone], 0)], -1)
    return order[gone], dup, d.dist[gone]


def near_rows(x, rank: np.ndarray, spec: NearSpec) -> np.ndarray:
    """``x`` (numpy, torch, TensorFlow...: ``to_numpy``) as (records, values), checked as
    the job checks its input: real numbers, one rank per record, a vector metric."""
    if spec.is_sets:
        raise ValueError("find_near compares vectors; metric jaccard compares shingle sets "
                         "of texts or token sequences: use transforms.near.sets.find_near_sets")
    try:
        arr, name = to_numpy(x)
    except TypeError as e:
        raise TypeError(f"find_near compares numbers: {e}") from None
    if refused := complex_refusal(name):
        raise TypeError(refused)
    check_rank(len(arr), rank)
    return flat_rows(arr)


def find_near(x: np.ndarray, rank: np.ndarray, spec: NearSpec, partitions: int | None = None,
              progress: Progress | None = None, torch_device=None) -> NearResult:
    """Near-duplicate removals among the rows of ``x`` (n, ...), in one process.

    ``rank``: each row's place in keep order (smaller = preferred, all distinct). Rows
    with NaN/inf never take part (the caller reports or keeps them). ``partitions``:
    cells (None: from ``spec``); in exact mode with a flat index the result does not
    depend on them. ``progress(what, done, total)`` hears about long steps.
    ``torch_device``: the plan's k-means, the assignment and the cells' candidates (many
    cells per launch, ``near.batched``) on this torch device (default: the GPU where
    ``spec.device`` resolves to one and the cells are searched flat).
    """
    x = near_rows(x, rank, spec)
    ok = np.flatnonzero(finite_rows(x))
    xs = x if len(ok) == len(x) else x[ok]  # no copy of the (maybe large) input when it can
    rs = np.asarray(rank)[ok].astype(np.int64)
    n, dim = xs.shape
    pos = np.empty(n, np.int64)
    pos[np.argsort(rs, kind="stable")] = np.arange(n)
    radius = search_radius(spec, dim, value_scale(xs, spec))
    cells = spec.cells(n, dim) if partitions is None else partitions
    dev = batch_device(spec) if torch_device is None else torch_device
    parts = plan(search_space(xs[sample_for_plan(n, dim)], spec), n, radius, spec.mode,
                 spec.probes, cells, progress=progress, levels=spec.levels, dev=dev)
    homes, rows, joined, capped = [], [], [], np.zeros(len(x), bool)
    for b in _blocks(n, dim):
        a = assign_rows(xs[b], spec, radius, parts, dev=dev)
        capped[ok[b]] = a.capped
        homes.append(a.home)
        rows.append(a.rows + b.start)
        joined.append(a.cells)
        if progress is not None:
            progress("assign", b.stop, n)
    home = np.concatenate(homes) if homes else np.empty(0, np.int64)
    rows_a = np.concatenate(rows) if rows else np.empty(0, np.int64)
    cells_a = np.concatenate(joined) if joined else np.empty(0, np.int64)
    order = np.lexsort((pos[rows_a], cells_a))
    bounds = np.searchsorted(cells_a[order], np.arange(len(parts) + 1))
    state = np.zeros(n, np.int8)
    dup, dist = np.full(n, -1, np.int64), np.full(n, np.nan)
    doubt, refs = np.zeros(n, bool), np.zeros(n, bool)
    links, pairs, estimated = [], 0.0, False
    on_dev = None if dev is None else resident(xs, spec, dev)
    known: list[Known | None] = []
    for p in range(len(parts)):
        members = rows_a[order[bounds[p]:bounds[p + 1]]]
        mine = home[members] == p
        if dev is not None and p % CELLS_PER_WINDOW == 0:  # the next cells' candidates
            ps = list(range(p, min(p + CELLS_PER_WINDOW, len(parts))))
            known = cell_candidates(on_dev, [rows_a[order[bounds[c]:bounds[c + 1]]]
                                             for c in ps],
                                    parts.mean + parts.centroids[ps], spec, radius, dev)
        if len(members):
            kn = known[p % CELLS_PER_WINDOW] if dev is not None else None
            d = decide_cell(xs, mine, spec, radius, parts.mean + parts.centroids[p],
                            exact=parts.mode == "exact", projection=parts.projection,
                            known=kn, rows=members)
            h = members[mine]
            state[h], doubt[h], dist[h] = d.state[mine], d.doubt[mine], d.dist[mine]
            dup[h] = np.where(d.dup[mine] >= 0, members[np.maximum(d.dup[mine], 0)], -1)
            refs[members[d.open_refs]] = True
            exact_d, sampled_d = d.census.distances()
            pairs += len(exact_d) + len(sampled_d) * d.census.weight
            estimated |= d.census.estimated
            if d.label is not None:
                links.append((members, members[d.label]))
        if progress is not None:
            progress("search", p + 1, len(parts))
    if spec.grouping == "representative":
        unsure = (state == STATE_OPEN) | doubt
        s = np.flatnonzero(unsure | (refs & (state == STATE_KEPT)))
        if len(s):
            bd = np.where(doubt[s], dist[s], np.inf)
            bp = np.where(doubt[s], pos[np.maximum(dup[s], 0)], 0)
            gone, by, dd = resolve_open(xs[s], pos[s], unsure[s], bd, bp, spec, radius)
            g = s[gone]
            state[g] = STATE_REMOVED
            dup[g] = np.where(by >= 0, s[np.maximum(by, 0)], dup[g])
            dist[g] = dd
            state[s[unsure[s] & (state[s] != STATE_REMOVED)]] = STATE_KEPT
        removed = np.flatnonzero(state == STATE_REMOVED)
        kept, dist_r = dup[removed], dist[removed]
    else:
        removed, kept = _component_keepers(n, links, pos)
        dist_r, _ = exact_distance(xs[removed], xs[kept], spec)
    by_rank = np.argsort(pos[removed], kind="stable")
    removed, kept, dist_r = removed[by_rank], kept[by_rank], dist_r[by_rank]
    recall = None
    if spec.recall_sample > 0 and n:
        recall = measure_recall(xs, pos, spec, removed, kept, dist_r,
                                capped=capped[ok] if stratified(spec, parts) else None,
                                dev=dev)
    return NearResult(ok[removed], ok[kept], dist_r, parts, pairs, estimated, recall, capped)


def batch_device(spec: NearSpec):
    """The torch device whose batched products find the cells' candidates, or None (the
    cells are searched one by one): the GPU where ``spec.device`` resolves to one and
    the cells are searched flat."""
    if spec.index in ("ivf", "hnsw") or not use_cuda(spec.device):
        return None
    import torch

    return torch.device("cuda")


def _component_keepers(n: int, links: list[tuple[np.ndarray, np.ndarray]], pos: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Components of all cells' links (row, its cell's label row); each keeps its first
    row in keep order. Returns (removed, kept)."""
    a = np.concatenate([lk[0] for lk in links]) if links else np.empty(0, np.int64)
    b = np.concatenate([lk[1] for lk in links]) if links else np.empty(0, np.int64)
    label = component_labels(n, a, b)
    first = np.full(n, n, np.int64)
    np.minimum.at(first, label, pos)
    kept = np.argsort(pos)[first[label]]  # the row at each component's first position
    removed = np.flatnonzero(kept != np.arange(n))
    return removed, kept[removed]


def may_stratify(spec: NearSpec) -> bool:
    """Whether these settings can give a search whose recall sample is drawn in strata
    (``stratified``), before the plan says which mode it takes."""
    return spec.levels == 1 and spec.index not in ("ivf", "hnsw") and spec.mode != "exact"


def stratified(spec: NearSpec, parts: Partitions) -> bool:
    """Whether the recall sample is drawn in strata (``near.recall``): bounded mode over one
    level of cells searched flat, where only capped records can be missed."""
    return (may_stratify(spec) and parts.mode == "bounded" and parts.coarse is None
            and len(parts) > 1)


def measure_recall(xs: np.ndarray, rank: np.ndarray, spec: NearSpec, removed: np.ndarray,
                   kept: np.ndarray, dist: np.ndarray, sample: int | None = None,
                   capped: np.ndarray | None = None, dev=None) -> Recall:
    """Judge the decisions (rows ``removed`` in favour of ``kept``) on a seeded sample of
    about ``sample`` rows (default ``spec.recall_sample``; ``len(xs)``: every row) by
    brute force (``near.recall``). Rows must be finite. ``capped``: each row's flag from
    a search where only capped rows can be missed (``stratified``): the sample is drawn
    in strata. ``dev``: the brute force's products on this torch device."""
    xs = flat_rows(xs)
    n, pos = len(xs), np.asarray(rank)
    radius = search_radius(spec, xs.shape[1], value_scale(xs, spec))
    center = np.mean([z.mean(axis=0) for _, z in space_blocks(xs, spec, None)], axis=0)
    keys = np.stack([np.zeros(n, np.uint64), np.arange(n, dtype=np.uint64)], axis=1)
    size = spec.recall_sample if sample is None else sample
    sample = np.flatnonzero(draw(keys, n, size, capped,
                                 0.0 if capped is None else float(capped.mean())))
    basis = None if dev is not None else projection(search_vectors(
        xs[::sample_step(n, xs.shape[1])], spec, radius, center, np.float32).v)  # all blocks
    truth = Truth.empty()
    zero = np.zeros(n)
    for blk in _blocks(n, xs.shape[1]):
        si, dj, d, count = true_partners(xs[sample], (zero[sample], pos[sample]), xs[blk],
                                         (zero[blk], pos[blk]), spec, radius, center,
                                         PARTNERS, basis, dev)
        s, dj = sample[si], dj + blk.start
        truth = truth.add(Truth(keys[s], keys[dj], d, zero[dj], pos[dj],
                                {(0, int(r)): int(c) for r, c in
                                 zip(sample.tolist(), count.tolist(), strict=True) if c}))
    gone = {(0, int(r)): ((0, int(k)), float(d)) for r, k, d in
            zip(removed.tolist(), kept.tolist(), dist.tolist(), strict=True)}
    strata = None if capped is None else Strata(
        {(0, int(r)) for r in sample[capped[sample]].tolist()}, n, int(capped.sum()),
        len(removed) if spec.grouping == "representative" else 0)
    return judge(truth, {(0, int(r)) for r in sample.tolist()}, gone,
                 spec.grouping == "components", strata)


def near_duplicates(x: np.ndarray, rank: np.ndarray, spec: NearSpec,
                    partitions: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``find_near``'s (removed, kept, distance): row indices and float64 distances."""
    r = find_near(x, rank, spec, partitions)
    return r.removed, r.kept, r.distance
