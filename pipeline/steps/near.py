"""Near: VecBatch (exact survivors' values) -> (file_index, Removed kind "near") + NearReport.

Sample -> Plan -> Assign -> Search -> Merge, all over the plain kernels
(``transforms.near``, ``near_plan``, ``near_recall``): a bottom-k sample of digests
trains k-means cells and predicts what each mode costs, and the plan picks exact or
bounded (one worker, printed); every chunk's rows are assigned to their home cell and
the cells they must (exact) or may (bounded, at most ``probes``) meet; each cell is
searched and verified on its own worker (GroupByKey on the cell); the verified pairs,
keyed by exact digest, are merged and grouped on one worker. Only pairs travel to
the merge, never vectors (except, for ``grouping: components``, the vectors of records
that have a pair). A seeded sample of about ``recall_sample`` records is compared with
every chunk by brute force, and the merge measures recall against it.

Exact copies are collapsed by digest inside each cell (all copies of a value land in
the same cells), so the search sees exact survivors only and the record that stands
for a digest is the one exact dedup kept. Reference-set and stored records join as
protected rows (they rank first and are never removed), so a record near one of them
is removed as ``reference_near`` / ``store_near``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline.steps import progress
from pipeline.steps.borderline import BORDERLINE_SCHEMA, borderline_sample, merge_borderline
from pipeline.steps.elements import NEAR_REPORT, REMOVED, Removed, VecBatch, removed_by_file
from pipeline.steps.tagged import SplitOutputs
from transforms import fs, near
from transforms.exact import is_protected, tier_of
from transforms.near_plan import Partitions, assign, plan
from transforms.near_recall import estimate, in_sample

HISTOGRAM_ROWS = 20_000  # about this many records get a nearest-neighbour distance (kNN)
RECALL_BLOCK_ROWS = 16_384  # a chunk's rows per brute-force call (progress between them)


@dataclass
class Sample:
    """Accumulator: the rows with the smallest digests (a uniform sample that does not
    depend on chunking or worker order), the row count and the largest |value|. Rows
    arrive in parts and are cut back to the cap when they hold twice as many, so each
    row is copied a few times at most; once the cap is full, only rows below the
    largest digest kept (``below``) can still enter."""

    lo: list[np.ndarray]  # (k,) uint64 digest word, per part
    v: list[np.ndarray]  # (k, d) float32 rows of the search space, per part
    n: int = 0
    scale: float = 0.0
    below: int = 1 << 64

    def cap(self) -> int:
        dim = self.v[0].shape[1] if self.v else 1
        return near.sample_cap(dim)

    def compact(self) -> Sample:
        if not self.lo:
            return self
        lo, v = np.concatenate(self.lo), np.concatenate(self.v)
        _, first = np.unique(lo, return_index=True)  # sorted: the smallest digests first
        cap = self.cap()
        keep = first[:cap]
        self.lo, self.v = [lo[keep]], [v[keep]]
        if len(keep) == cap:
            self.below = int(lo[keep[-1]])
        return self


@dataclass
class Plan:
    parts: Partitions  # cells, the join rule (exact or bounded) and the prediction
    n: int  # rows (before exact copies are collapsed)
    nn_mod: int  # rows whose digest % nn_mod == 0 get a nearest-neighbour distance

    @property
    def radius(self) -> float:
        return self.parts.radius


def _say(what: str, done: int, total: int) -> None:
    progress.step(f"near {what}", done, total)


class SampleForPlan(beam.CombineFn):
    """VecBatch -> Plan (cells, mode and search radius) on one worker."""

    def __init__(self, spec: near.NearSpec):
        self.spec = spec

    def create_accumulator(self) -> Sample:
        return Sample([], [])

    def add_input(self, acc: Sample, batch: VecBatch) -> Sample:
        lo = batch.words[:, 1]
        full = acc.below < 1 << 64
        pick = np.flatnonzero(lo < np.uint64(acc.below)) if full else np.arange(len(lo))
        acc.n += len(batch)
        if len(pick) or self.spec.metric == "allclose":
            batch = batch.loaded()
            acc.scale = max(acc.scale, near.value_scale(batch.x, self.spec))
            acc.lo.append(lo[pick])
            acc.v.append(near.search_space(batch.x[pick], self.spec).astype(np.float32))
        if sum(len(p) for p in acc.lo) > 2 * acc.cap():
            acc.compact()
        return acc

    def compact(self, acc: Sample) -> Sample:
        """Before Beam moves a worker's partial sample to the merge: cut to the cap (it
        may hold twice as many rows: hundreds of MB at 384 dimensions)."""
        return acc.compact()

    def merge_accumulators(self, accs: Iterable[Sample]) -> Sample:
        accs = list(accs)
        out = Sample([p for a in accs for p in a.lo], [p for a in accs for p in a.v],
                     sum(a.n for a in accs), max(a.scale for a in accs),
                     min(a.below for a in accs))
        return out.compact()

    def extract_output(self, acc: Sample) -> Plan:
        if not acc.v:
            return Plan(plan(np.zeros((0, 1)), 0, 0.0, "exact", 1, 1), 0, 1)
        acc.compact()
        sample = acc.v[0]
        radius = near.search_radius(self.spec, sample.shape[1], acc.scale)
        cells = self.spec.cells(acc.n)
        if cells > 1:
            progress.note(f"near: planning about {cells:,} cells from {len(sample):,} "
                          f"sampled records of {acc.n:,} (k-means, then the cost of each "
                          "mode)")
        parts = plan(sample.astype(np.float64), acc.n, radius, self.spec.mode,
                     self.spec.probes, cells, progress=_say)
        progress.note(f"near: {parts.mode} search in {len(parts):,} cell(s)"
                      + (f" ({_cost_line(parts)})" if parts.prediction else ""))
        return Plan(parts, acc.n, max(1, acc.n // HISTOGRAM_ROWS))


def _cost_line(parts: Partitions) -> str:
    """The mode's reason and its predicted work against one flat search over all rows."""
    p = parts.prediction
    work = p.work_exact if parts.mode == "exact" else p.work_bounded
    return (f"{parts.reason}; predicted work {work / p.work_all_pairs:.2%} of all-pairs, "
            f"largest cell {(p.largest_exact if parts.mode == 'exact' else p.largest_bounded):,}"
            " rows")


@dataclass
class CellSlice:
    """AssignCells -> SearchCells: one chunk's rows of one cell, spilled to a file (record
    batch ``batch`` of the Arrow IPC file ``path``), so the shuffle moves references and
    no runner holds the vectors of every cell in memory at once."""

    path: str
    batch: int
    rows: int


def assign_batch(batch: VecBatch, plan: Plan, spec: near.NearSpec, spill: str
                 ) -> Iterator[tuple[int, CellSlice]]:
    """A chunk's rows -> the cells they join, written as one spill file (a record batch
    per cell, flags: ``home`` there, and ``capped``: had more cells to meet than the
    bounded mode lets it)."""
    progress.tick("near assign", 0, 0, "chunks", units=0, total_records=plan.n)
    batch = batch.loaded()
    said = [0]

    def rows_done(_: str, done: int, total: int) -> None:
        progress.tick("near assign", 0, done - said[0], "chunks", units=0,
                      total_records=plan.n)
        said[0] = done

    a = assign(near.search_vectors(batch.x, spec, plan.radius, plan.parts.mean, np.float32),
               plan.parts, progress=rows_done)
    rows_done("assign", len(batch), len(batch))  # one cell: assign() had nothing to do
    order = np.argsort(a.cells, kind="stable")
    rows, cells = a.rows[order], a.cells[order]
    home = a.home[rows] == cells
    rb = batch.take(rows).to_arrow(home=home, capped=home & a.capped[rows])
    starts = np.flatnonzero(np.r_[True, cells[1:] != cells[:-1]]) if len(cells) else cells
    ends = np.r_[starts[1:], len(cells)]
    path = fs.join(spill, f"{uuid.uuid4().hex}.arrow")
    with fs.local_file_for(path) as local, pa.OSFile(local, "wb") as sink, \
            pa.ipc.new_file(sink, rb.schema) as writer:
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            writer.write_batch(rb.slice(s, e - s))
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        yield int(cells[s]), CellSlice(path, i, e - s)
    progress.tick("near assign", 0, 0, "chunks")


def read_cell(slices: Iterable[CellSlice]) -> tuple[VecBatch, np.ndarray, np.ndarray]:
    """A cell's spilled rows: (rows, home flags, capped flags)."""
    parts = []
    for path, group in itertools.groupby(sorted(slices, key=lambda c: (c.path, c.batch)),
                                         key=lambda c: c.path):
        with fs.open_read(path) as f:
            reader = pa.ipc.open_file(f)
            parts += [VecBatch.from_arrow(reader.get_batch(c.batch)) for c in group]
    batch = VecBatch.concat([b for b, _ in parts])
    # one order whatever the files' names and the shuffle's order: reports are reproducible
    rows = np.lexsort((batch.position, batch.file_index, batch.words[:, 1], batch.words[:, 0]))
    return (batch.take(rows), np.concatenate([f["home"] for _, f in parts])[rows],
            np.concatenate([f["capped"] for _, f in parts])[rows])


@dataclass
class Found:
    """Search -> Merge: one cell's verified pairs (two mentions each) and samples."""

    a: VecBatch  # first ends (values dropped)
    b: VecBatch  # second ends
    dist: np.ndarray
    a_near_b: np.ndarray
    b_near_a: np.ndarray
    nn: np.ndarray  # nearest-neighbour distances of sampled home records
    borderline: pa.Table
    values: VecBatch | None  # components: home records that have a pair, with values
    searched: int  # home records after collapsing exact copies
    arrived: int  # home records before collapsing (each record is home in one cell)
    capped: int  # home records that joined fewer cells than exact mode would
    members: int  # rows searched against (home and joined, after collapsing)


def _collapse(batch: VecBatch) -> np.ndarray:
    """Rows that stand for their digest: the best in keep order (= exact dedup's survivor)."""
    order = np.lexsort((batch.order, batch.prio, batch.words[:, 1], batch.words[:, 0]))
    w = batch.words[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (w[1:] != w[:-1]).any(axis=1)
    return np.sort(order[first])


def search_one(kv: tuple[int, Iterable[CellSlice]], plan: Plan, spec: near.NearSpec,
               per_side: int) -> Found:
    """One cell on one worker: read its rows, collapse exact copies, search, verify,
    sample."""
    progress.tick("near search", len(plan.parts), 0, "cells", units=0)  # starts its clock
    cell = kv[0]
    batch, home, capped_rows = read_cell(kv[1])
    arrived, capped = int(home.sum()), int(capped_rows.sum())
    rows = _collapse(batch)
    batch, home = batch.take(rows), home[rows]
    nn_rows = np.flatnonzero(home & (batch.words[:, 1] % np.uint64(plan.nn_mod) == 0))
    f = near.search_partition(batch.x, home, spec, plan.radius,
                              plan.parts.mean + plan.parts.centroids[cell], nn_rows)
    border = merge_borderline([_borderline(batch, f.a, f.b, f.dist, f.a_near_b | f.b_near_a,
                                           per_side),
                               _borderline(batch, f.near_a, f.near_b, f.near_dist,
                                           f.near_within, per_side)], per_side)
    values = None
    if spec.grouping == "components":
        paired = np.unique(np.concatenate([f.a, f.b]))
        values = batch.take(paired[home[paired]])
    progress.tick("near search", len(plan.parts), arrived, "cells")
    return Found(batch.take(f.a, values=False), batch.take(f.b, values=False), f.dist,
                 f.a_near_b, f.b_near_a, f.nn, border, values, int(home.sum()), arrived,
                 capped, len(batch))


def recall_rows(batch: VecBatch, plan: Plan, spec: near.NearSpec) -> Iterator[VecBatch]:
    """The chunk's rows that are in the recall sample (a seeded hash of the digest)."""
    pick = np.flatnonzero(in_sample(batch.words, plan.n, spec.recall_sample))
    if len(pick):
        yield batch.loaded().take(pick)


def true_pairs(batch: VecBatch, plan: Plan, spec: near.NearSpec, samples: list[VecBatch]
               ) -> Iterator[np.ndarray]:
    """Brute force of the recall sample against one chunk: (m, 4) uint64 rows (sampled
    digest, partner digest) within tolerance, other records only. The chunk is compared
    in blocks of RECALL_BLOCK_ROWS rows (the same pairs: each is verified in float64)."""
    progress.tick("near recall", 0, 0, "chunks", units=0, total_records=plan.n)
    if not samples:
        progress.tick("near recall", 0, len(batch), "chunks", total_records=plan.n)
        return
    batch, sample = batch.loaded(), VecBatch.concat(samples)
    for a in range(0, len(batch), RECALL_BLOCK_ROWS):
        b = min(a + RECALL_BLOCK_ROWS, len(batch))
        si, dj = near.true_pairs(sample.x, batch.x[a:b], spec, plan.radius, plan.parts.mean)
        dj = dj + a
        other = (sample.words[si] != batch.words[dj]).any(axis=1)
        if other.any():
            yield np.concatenate([sample.words[si[other]], batch.words[dj[other]]], axis=1)
        progress.tick("near recall", 0, b - a, "chunks", units=0, total_records=plan.n)
    progress.tick("near recall", 0, 0, "chunks")


def _recall(found: list[Found], samples: list[VecBatch], truth: list[np.ndarray]) -> dict:
    """Recall of the search on the sampled records (digests as keys)."""
    sampled = {tuple(w) for s in samples for w in s.words.tolist()}
    pairs = np.concatenate(truth) if truth else np.empty((0, 4), np.uint64)
    true = {(tuple(r[:2]), tuple(r[2:])) for r in pairs.tolist()}
    lo = np.array(sorted({w[1] for w in sampled}), dtype=np.uint64)
    got = set()
    for f in found:
        hit = np.isin(f.a.words[:, 1], lo) | np.isin(f.b.words[:, 1], lo)
        got |= set(zip(map(tuple, f.a.words[hit].tolist()), map(tuple, f.b.words[hit].tolist()),
                       strict=True))
    return estimate(sampled, true, got).as_dict()


def _borderline(batch: VecBatch, a: np.ndarray, b: np.ndarray, dist: np.ndarray,
                within: np.ndarray, per_side: int) -> pa.Table:
    """Pairs named (later, earlier) in keep order, so each pair has one spelling; each end
    with its file and position (-1 for a stored record of an earlier run)."""
    a_later = (batch.prio[a] > batch.prio[b]) | (
        (batch.prio[a] == batch.prio[b]) & (batch.order[a] > batch.order[b]))
    later, earlier = np.where(a_later, a, b), np.where(a_later, b, a)

    def at(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = batch.file_index[rows]
        return f, np.where(f < 0, -1, batch.position[rows])

    return borderline_sample(batch.ids.take(pa.array(later)), batch.ids.take(pa.array(earlier)),
                             dist, within, per_side, at(later), at(earlier))


# Verified pair distances are counted on a fixed grid anchored at the threshold, so the
# merge sends counts (a few hundred ints), not one float per pair, to the report:
# PAIR_BINS_PER_DECADE bins per decade from PAIR_DECADES_BELOW decades below the
# threshold to PAIR_DECADES_ABOVE above it (allclose distances may exceed atol when
# rtol > 0); bins are (lo, hi], so a pair at the threshold counts at or below it.
PAIR_BINS_PER_DECADE = 40
PAIR_DECADES_BELOW = 12
PAIR_DECADES_ABOVE = 2


def grid_anchor(marker: float) -> float:
    """The grid's anchor: the threshold (allclose: atol), or 1.0 when that is 0."""
    return float(marker) if marker > 0 and np.isfinite(marker) else 1.0


def pair_grid_edges(marker: float) -> np.ndarray:
    """The fixed grid's edges (float64, increasing; the threshold is one of them)."""
    k = np.arange(-PAIR_DECADES_BELOW * PAIR_BINS_PER_DECADE,
                  PAIR_DECADES_ABOVE * PAIR_BINS_PER_DECADE + 1)
    edges = grid_anchor(marker) * 10.0 ** (k / PAIR_BINS_PER_DECADE)
    edges[k == 0] = grid_anchor(marker)
    return edges


def pair_histogram(dist: np.ndarray, marker: float) -> dict:
    """Counts of pair distances on the fixed grid: {"zero", "under" (above 0, below the
    grid), "counts" (per bin), "over" (above the grid)}."""
    d = np.asarray(dist, np.float64)
    edges = pair_grid_edges(marker)
    pos = d[d > 0]
    idx = np.searchsorted(edges, pos, side="left") - 1  # bin i holds (edges[i], edges[i+1]]
    counts = np.bincount(idx[(idx >= 0) & (idx < len(edges) - 1)], minlength=len(edges) - 1)
    return {"zero": int((d <= 0).sum()), "under": int((idx < 0).sum()),
            "counts": counts.astype(np.int64), "over": int((idx >= len(edges) - 1).sum())}


@dataclass
class NearReport:
    """Merge -> Report: what the histogram, the borderline sample and summary.json need.

    ``nn``: nearest-neighbour distances of a sample of records (1 in
    ``stats["histogram_every"]``, by digest); ``pairs``: every verified pair within
    tolerance, each once, counted on the fixed grid (``pair_histogram``)."""

    nn: np.ndarray
    borderline: pa.Table
    stats: dict
    pairs: dict | None = None


def merge_found(found: list[Found], plan: Plan, spec: near.NearSpec, per_side: int,
                samples: list[VecBatch], truth: list[np.ndarray]
                ) -> Iterator[tuple[int, Removed] | beam.pvalue.TaggedOutput]:
    """All partitions' pairs -> removals per file (kind near) and the NearReport.

    Refuses to go on unless every record that entered the stage reached a search (as
    Decide does for the exact stage): a record lost in the shuffle would be kept unchecked."""
    arrived = sum(f.arrived for f in found)
    if arrived != plan.n:
        raise RuntimeError(f"near: {plan.n} records entered the near stage but {arrived} "
                           "reached a partition search: refusing to publish unchecked output")
    ends = VecBatch.concat([f.a for f in found] + [f.b for f in found]) if found else None
    dist = np.concatenate([f.dist for f in found]) if found else np.empty(0)
    removed = np.empty(0, np.int64)
    pair_dist = np.empty(0)
    if ends is not None and len(dist):
        edges = near.merge_pairs(ends.words, ends.prio, ends.order, dist,
                                 np.concatenate([f.a_near_b for f in found]),
                                 np.concatenate([f.b_near_a for f in found]))
        pair_dist = edges.dist  # each pair within tolerance once
        safe = is_protected(ends.prio[edges.node])
        if spec.grouping == "representative":
            removed, kept, d = near.group_representative(edges, safe)
        else:
            removed, kept = near.group_components(edges, safe)
            d = _component_distances(found, ends, edges.node[removed], edges.node[kept], spec)
        rec, ref = edges.node[removed], edges.node[kept]
        by_input = np.lexsort((ends.position[rec], ends.file_index[rec]))
        rec, ref, d = rec[by_input], ref[by_input], d[by_input]
        yield from removed_by_file(ends, rec, ref, "near", d,
                                   tier_of(ends.prio[ref], ends.order[ref]))
    stats = {"records_searched": int(sum(f.searched for f in found)),
             "partitions": len(plan.parts), **plan.parts.describe(),
             "capped_records": int(sum(f.capped for f in found)),
             "rows_searched_against": int(sum(f.members for f in found)),
             "pairs_within_tolerance": int(len(pair_dist)), "removed": int(len(removed)),
             "search_radius_l2": float(plan.radius), "histogram_every": plan.nn_mod,
             "recall": _recall(found, samples, truth) if spec.recall_sample else None}
    nn = np.concatenate([f.nn for f in found]) if found else np.empty(0)
    border = merge_borderline([f.borderline for f in found], per_side) if found else (
        BORDERLINE_SCHEMA.empty_table())
    yield beam.pvalue.TaggedOutput(NEAR_REPORT, NearReport(
        nn, border, stats, pair_histogram(pair_dist, spec.marker)))


def _component_distances(found: list[Found], ends: VecBatch, rec: np.ndarray, ref: np.ndarray,
                         spec: near.NearSpec) -> np.ndarray:
    """Distance from each removed record to its component's keeper (values by digest)."""
    if not len(rec):
        return np.empty(0)
    values = VecBatch.concat([f.values for f in found if f.values is not None])
    keys = _digest_keys(values.words)
    order = np.argsort(keys, kind="stable")

    def lookup(mention: np.ndarray) -> np.ndarray:
        at = order[np.minimum(np.searchsorted(keys[order], _digest_keys(ends.words[mention])),
                              len(order) - 1)]
        if not (values.words[at] == ends.words[mention]).all():
            raise RuntimeError("near: a paired record's values did not reach the merge")
        return values.x[at]

    return near.exact_distance(lookup(rec), lookup(ref), spec)[0]


def _digest_keys(words: np.ndarray) -> np.ndarray:
    """(n, 2) uint64 digests as one sortable structured array."""
    return np.ascontiguousarray(words).view([("hi", "<u8"), ("lo", "<u8")]).ravel()


def _drop_spill(found: list[Found], spill: str) -> list[Found]:
    """Every cell was searched: the spilled vectors are no longer needed."""
    fs.delete_tree(spill)
    return found


class DedupNear(beam.PTransform):
    """VecBatch -> {REMOVED: (file_index, Removed), NEAR_REPORT: NearReport}.

    Args:
      spec: the metric, tolerance and search settings.
      spill: a directory (any filesystem) for the cells' vectors while they wait for
        their search; deleted once every cell was searched.
      borderline_pairs: pairs kept on each side of the tolerance for the report.
    """

    def __init__(self, spec: near.NearSpec, *, spill: str, borderline_pairs: int = 500):
        super().__init__()
        self.spec, self.per_side, self.spill = spec, borderline_pairs, spill

    def expand(self, vecs):
        plan = beam.pvalue.AsSingleton(vecs | "SampleAndPlan" >> beam.CombineGlobally(
            SampleForPlan(self.spec)))
        samples = beam.pvalue.AsList(
            vecs | "RecallSample" >> beam.FlatMap(recall_rows, plan, self.spec))
        truth = beam.pvalue.AsList(
            vecs | "RecallBruteForce" >> beam.FlatMap(true_pairs, plan, self.spec, samples))
        return (vecs
                | "AssignCells" >> beam.FlatMap(assign_batch, plan, self.spec, self.spill)
                | "GroupByCell" >> beam.GroupByKey()
                | "SearchCells" >> beam.Map(search_one, plan, self.spec, self.per_side)
                | "GatherPairs" >> beam.combiners.ToList()
                | "DropSpill" >> beam.Map(_drop_spill, self.spill)
                | "MergePairs" >> SplitOutputs(merge_found, plan, self.spec, self.per_side,
                                               samples, truth, main=REMOVED,
                                               tags=(NEAR_REPORT,)))
