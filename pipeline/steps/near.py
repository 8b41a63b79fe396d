"""Near: VecBatch (exact survivors' values) -> (file_index, Removed kind "near") + NearReport.

Sample -> Plan -> Assign -> Search -> Merge, all over the plain kernels
(``transforms.near.find``, ``near.plan``, ``near.recall``): a bottom-k sample of digests
trains k-means cells and predicts what each mode costs, and the plan picks exact or
bounded (one worker, printed); every chunk's rows are assigned to their home cell and
the cells they must (exact) or may (bounded, at most ``probes``) meet; each cell is
searched and verified on its own worker (GroupByKey on the cell); the verified pairs,
keyed by exact digest, are merged and grouped on one worker. Only pairs travel to
the merge, never vectors (except, for ``grouping: components``, the vectors of records
that have a pair). A seeded sample of about ``recall_sample`` records, picked in the
planning pass (``near_sample``), is compared with every chunk by brute force, and the
merge measures recall against it.

Exact copies are collapsed by digest inside each cell (all copies of a value land in
the same cells), so the search sees exact survivors only and the record that stands
for a digest is the one exact dedup kept. Reference-set and stored records join as
protected rows (they rank first and are never removed), so a record near one of them
is removed as ``reference_near`` / ``store_near``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np

from pipeline import progress
from pipeline.steps.elements import NEAR_REPORT, REMOVED, VecBatch
from pipeline.steps.near_cells import SURE, assign_batch, decide_split
from pipeline.steps.near_gather import GatherCells
from pipeline.steps.near_merge import (
    GatherKnown,
    NearReport,
    asked_keys,
    known_removals,
    lines_by_file,
    merge_cells,
)
from pipeline.steps.near_sample import RecallRows, Sample
from pipeline.steps.tagged import SplitOutputs
from transforms import cores
from transforms.io import fs, layout, spill
from transforms.io.agreed import first_written
from transforms.near.find import may_stratify, stratified, true_partners
from transforms.near.plan import Partitions, Prediction, assign, plan
from transforms.near.project import Projection
from transforms.near.recall import PARTNERS, POOL, Truth, draw, in_sample
from transforms.near.search import rows_for
from transforms.near.space import search_radius, search_vectors, value_scale
from transforms.near.spec import NearSpec

__all__ = ["DedupNear", "NearReport"]

HISTOGRAM_ROWS = 20_000  # about this many records get a nearest-neighbour distance (kNN)
RECALL_BLOCK_ROWS = 16_384  # a chunk's rows per brute-force call (progress between them)
BUCKET_BYTES = 64 << 20  # a bucket of cells holds about this many bytes of its rows' values
MIN_BUCKETS = 16  # ... and there are at least this many (where there are as many cells)
TRUTH = "truth"  # AssignCells' second output: the recall sample's partners in each chunk
RECALL_MSECS = beam.metrics.Metrics.counter("tensordedup", "near_recall_msecs")


@dataclass
class Plan:
    parts: Partitions  # cells, the join rule (exact or bounded) and the prediction
    n: int  # rows (before exact copies are collapsed)
    nn_mod: int  # rows whose digest % nn_mod == 0 get a nearest-neighbour distance
    sample: VecBatch | None = None  # the recall sample (values spilled), or none
    sample_capped: np.ndarray | None = None  # drawn in strata: each sampled row's flag
    per_bucket: int = 1  # cells whose rows travel together (``buckets``)

    @property
    def radius(self) -> float:
        return self.parts.radius


# the agreed plan (first_written) is written as data, these classes by name
spill.register(Plan, Partitions, Prediction, Projection)


def _one_size(widths: set[int]) -> set[int]:
    """Distances need one size: variable-size input (ragged lists, serialized tensors of
    several shapes) reaches the near stage with records of several."""
    sizes = sorted(widths)
    if len(sizes) > 1:
        raise ValueError(f"near: records hold {sizes[0]:,} and {sizes[-1]:,} values; "
                         "distances compare tensors of one shape: set input.shape to the "
                         "shape to compare (in a library pipeline: Dedup(shape=...) over "
                         "records, TensorSpec(shape=...) for ReadTensors; records of other "
                         "shapes are then reported invalid), or remove near")
    return widths


def _say(what: str, done: int, total: int) -> None:
    progress.step(f"near {what}", done, total)


class SampleForPlan(beam.CombineFn):
    """VecBatch -> Plan (cells, mode, search radius and the recall sample, its values in
    ``recall_folder``) on one worker; the first plan made is kept at ``agree_at`` and
    any recomputation returns it (``agreed``)."""

    def __init__(self, spec: NearSpec, agree_at: str, recall_folder: str):
        self.spec, self.agree_at, self.recall_folder = spec, agree_at, recall_folder

    def create_accumulator(self) -> Sample:
        pool = POOL if may_stratify(self.spec) else 1  # candidates for a stratified draw
        return Sample([], [], [], RecallRows(self.spec.recall_sample * pool))

    def add_input(self, acc: Sample, batch: VecBatch) -> Sample:
        acc.widths = _one_size(acc.widths | {batch.width})
        acc.n += len(batch)
        if self.spec.metric == "allclose":  # its radius needs the largest |value|
            batch = batch.loaded()
            acc.scale = max(acc.scale, value_scale(batch.x, self.spec))
        acc.add(batch, self.spec)
        return acc

    def compact(self, acc: Sample) -> Sample:
        """Before Beam moves a worker's partial sample to the merge: cut to the cap (it
        may hold a quarter more rows: tens of MB at 384 dimensions)."""
        return acc.compact()

    def merge_accumulators(self, accs: Iterable[Sample]) -> Sample:
        out = Sample.merged(list(accs))
        _one_size(out.widths)
        return out

    def extract_output(self, acc: Sample) -> Plan:
        if not acc.lo:
            return Plan(plan(np.zeros((0, 1)), 0, 0.0, "exact", 1, 1), 0, 1)
        sample = acc.rows(self.spec)
        radius = search_radius(self.spec, sample.shape[1], acc.scale)
        cells = self.spec.cells(acc.n, sample.shape[1])
        if cells > 1 and len(sample) > 1:  # (one distinct value: one cell, no k-means)
            progress.note(f"near: planning about {cells:,} cells from {len(sample):,} "
                          f"sampled records of {acc.n:,} (k-means, then the cost of each "
                          "mode)")
        with cores.threads(None):  # the rest of the job waits on the plan
            parts = plan(sample, acc.n, radius, self.spec.mode, self.spec.probes, cells,
                         progress=_say, levels=self.spec.levels)
        if cells <= 1 and self.spec.mode != "exact":  # said, not silently exact
            parts.reason = (("auto chose exact: " if self.spec.mode == "auto" else
                             "near.mode: bounded needs more than one cell: ")
                            + f"{acc.n:,} records fit one (near.single_index_rows: "
                            f"{self.spec.single_index_rows:,}), where every record is "
                            "compared with every other")
        progress.note(f"near: {parts.mode} search in {len(parts):,} cell(s)"
                      + (f" ({_cost_line(parts)})" if parts.prediction else
                         f" ({parts.reason})" if cells <= 1 else ""))
        rows, capped = acc.recall.sample(sample.shape[1], self.recall_folder,
                                         lambda c: self._draw(c, parts, acc.fresh))
        return first_written(self.agree_at, Plan(
            parts, acc.n, max(1, acc.n // HISTOGRAM_ROWS), rows, capped,
            buckets(parts, acc.n, max(acc.widths) * sample.dtype.itemsize)))

    def _draw(self, rows: VecBatch, parts: Partitions, n: int
              ) -> tuple[np.ndarray, np.ndarray | None]:
        """The recall sample among its candidates: in strata by their capped flags
        (assigned as the search will assign them) where only capped records can be
        missed (``near.recall``), else uniform."""
        size = self.spec.recall_sample
        if not stratified(self.spec, parts):
            return in_sample(rows.words, n, size), None
        capped = assign(search_vectors(rows.x, self.spec, parts.radius, parts.mean,
                                       np.float32), parts).capped
        share = float(capped.mean()) if len(capped) else 0.0  # (rows: this run's only)
        return draw(rows.words, n, size, capped, share), capped


def buckets(parts: Partitions, n: int, row_bytes: int) -> int:
    """Cells per bucket: a chunk writes one slice per bucket of cells, not per cell, and
    a worker decides a bucket's cells one by one. Slices grow as chunks x buckets: one per
    cell made 977k of them for 8M records in 8,008 cells (writing and reading their
    streams, and the shuffle's elements, cost 62 s of a 405 s job). A bucket holds about
    BUCKET_BYTES of its rows' values (cells are searched one at a time, so this bounds
    what a bucket's slices carry where rows travel with their values), and a job has at
    least MIN_BUCKETS of them, so a small job's cells still spread over its workers."""
    p = parts.prediction
    if p is None or len(parts) <= 1:
        return 1
    joins = p.joins_exact if parts.mode == "exact" else p.joins_bounded
    fit = int(BUCKET_BYTES // max(1.0, n * joins / len(parts) * row_bytes))
    return max(1, min(fit, -(-len(parts) // MIN_BUCKETS)))


def _cost_line(parts: Partitions) -> str:
    """The mode's reason and its predicted work against one flat search over all rows."""
    p = parts.prediction
    work = p.work_exact if parts.mode == "exact" else p.work_bounded
    return (f"{parts.reason}; predicted work {work / p.work_all_pairs:.2%} of all-pairs, "
            f"largest cell {(p.largest_exact if parts.mode == 'exact' else p.largest_bounded):,}"
            " rows")


def chunk_partners(batch: VecBatch, plan: Plan, spec: NearSpec,
                   sample: VecBatch | None = None) -> Iterator[Truth]:
    """Brute force of the recall sample against one chunk: each sampled record's nearest
    earlier partners within tolerance (it within them, as the reference), other records
    only, and how many candidates there were; and the sampled keys protected rows here
    hold (``Truth.held``). The chunk is compared in blocks of
    RECALL_BLOCK_ROWS rows (fewer for wide records); the sample's values are read from
    their spill file (a side input of 2,000 wide records was held four times over), or
    given (``sample``: the plan's, read already)."""
    progress.tick("near recall", 0, 0, "chunks", units=0, total_records=plan.n)
    sample = plan.sample if sample is None else sample
    if sample is None:
        progress.tick("near recall", 0, len(batch), "chunks", total_records=plan.n)
        return
    batch, sample = batch.loaded(), sample.loaded()
    held = Truth.held_by(sample.words, batch.words, batch.prio)
    if held.held:
        yield held
    step = rows_for(8 * batch.x.shape[1], 32 << 20, RECALL_BLOCK_ROWS)
    for a in range(0, len(batch), step):
        b = min(a + step, len(batch))
        part = batch.take(np.arange(a, b))
        si, dj, d, count = true_partners(
            sample.x, (sample.prio, sample.order), part.x, (part.prio, part.order), spec,
            plan.radius, plan.parts.mean, PARTNERS, plan.parts.projection)
        other = (sample.words[si] != part.words[dj]).any(axis=1)
        si, dj, d = si[other], dj[other], d[other]
        counts = {tuple(w): int(c) for w, c in zip(sample.words.tolist(), count.tolist(),
                                                    strict=True) if c}
        if counts:
            yield Truth(sample.words[si], part.words[dj], d, part.prio[dj], part.order[dj],
                        counts).cut()
        progress.tick("near recall", 0, b - a, "chunks", units=0, total_records=plan.n)
    progress.tick("near recall", 0, 0, "chunks")


class AssignAndCheck(beam.DoFn):
    """A chunk -> the cells its rows join (``assign_batch``) and, tagged TRUTH, the recall
    sample's partners in it (``chunk_partners``): one step, so a chunk's values are read
    once (as two steps each read the chunk's file: on an object store its values were
    downloaded twice), and the recall sample's values once per worker, not per chunk
    (2,000 x 768 floats: 6 MB for each of 45,000 chunks at a billion records). The
    recall's seconds are counted apart (RECALL_MSECS) for the capacity plan's rates.
    ``carry``: the cells' rows travel in the elements (``assign_batch``)."""

    def __init__(self, spec: NearSpec, spill: str, carry: bool = False):
        self.spec, self.spill, self.carry = spec, spill, carry
        self._sample: tuple[object, VecBatch] | None = None

    def setup(self) -> None:
        self._sample = None

    def process(self, batch: VecBatch, plan: Plan) -> Iterator[object]:
        loaded = batch.loaded()
        start = time.perf_counter()
        for t in chunk_partners(loaded, plan, self.spec, self._recall_sample(plan)):
            yield beam.pvalue.TaggedOutput(TRUTH, t)
        RECALL_MSECS.inc(round((time.perf_counter() - start) * 1000))
        yield from assign_batch(batch, plan, self.spec, self.spill, loaded, self.carry)

    def _recall_sample(self, plan: Plan) -> VecBatch | None:
        if plan.sample is None:
            return None
        key = plan.sample.spilled or id(plan.sample)
        if self._sample is None or self._sample[0] != key:
            self._sample = (key, plan.sample.loaded())
        return self._sample[1]


class GatherTruth(beam.CombineFn):
    """Every chunk's partners, cut to the nearest few per sampled record as they come."""

    def create_accumulator(self) -> Truth:
        return Truth.empty()

    def add_input(self, acc: Truth, t: Truth) -> Truth:
        return acc.add(t)

    def merge_accumulators(self, accs) -> Truth:
        out = Truth.empty()
        for a in accs:
            out = out.add(a)
        return out

    def extract_output(self, acc: Truth) -> Truth:
        return acc


def _drop_spill(done: object, spills: tuple[str, ...]) -> object:
    """``done`` (every cell decided, or the report made): the spilled vectors (or the
    recall sample and the plan) are no longer needed."""
    for path in spills:
        fs.delete_tree(path)
    return done


class DedupNear(beam.PTransform):
    """VecBatch -> {REMOVED: (file_index, Removed), NEAR_REPORT: NearReport}.

    Args:
      spec: the metric, tolerance and search settings.
      spill: a directory (any filesystem) for the cells' vectors while they wait for
        their search; deleted once every cell was searched. The recall sample's values
        wait in its sibling ``<spill>-recall``, and the plan every task uses (with,
        for components grouping, the linked records' values in ``links/``, and the
        cells' joined outputs in ``cells/``) in ``<spill>-plan``, until the report is
        made.
      borderline_pairs: pairs kept on each side of the tolerance for the report.
      keep_spill: leave all three to whoever deletes ``spill``'s parent (the job's
        Publish): a runner that recomputes a lost worker's finished steps (Dask) may
        read them again after the search.
      carry_rows: the cells' rows travel through the runner's shuffle, not as
        references into ``spill`` files: for a runner whose shuffle is a service or
        disk (Dataflow), where the spill is on an object store and each reference
        would cost a cell a ranged request (40,000 per cell at a billion records).
        The local runner's and Dask's shuffles hold what they move in memory.
    """

    def __init__(self, spec: NearSpec, *, spill: str, borderline_pairs: int = 500,
                 keep_spill: bool = False, carry_rows: bool = False):
        super().__init__()
        self.spec, self.per_side, self.spill = spec, borderline_pairs, spill.rstrip("/")
        self.recall_spill = layout.recall_spill(self.spill)
        self.plan_spill = layout.plan_spill(self.spill)
        self.keep_spill, self.carry_rows = keep_spill, carry_rows

    def expand(self, vecs):
        plan = beam.pvalue.AsSingleton(vecs | "SampleAndPlan" >> beam.CombineGlobally(
            SampleForPlan(self.spec, fs.join(self.plan_spill, "plan.spill"),
                          self.recall_spill)))
        assigned = vecs | "AssignCells" >> SplitOutputs(
            AssignAndCheck(self.spec, self.spill, self.carry_rows), plan, main="cells",
            tags=(TRUTH,))
        truth = beam.pvalue.AsSingleton(
            assigned[TRUTH] | "GatherTruth" >> beam.CombineGlobally(GatherTruth()))
        decided = (assigned["cells"]
                   | "GroupByCell" >> beam.GroupByKey()
                   | "DecideCells" >> SplitOutputs(decide_split, plan, self.spec,
                                                   self.per_side,
                                                   fs.join(self.plan_spill, "links"),
                                                   main="cells", tags=(SURE,)))
        cells = (decided["cells"]
                 | "GatherCells" >> beam.CombineGlobally(
                     GatherCells(self.per_side, fs.join(self.plan_spill, "cells")))
                 | "DropSpill" >> beam.Map(_drop_spill, self._drops(self.spill)))
        # the cells' removals go to their files from where the cells ran; the merge gets
        # those it asks about (records it settles or depends on, the recall's)
        asked = beam.pvalue.AsSingleton(cells | "AskedKeys" >> beam.Map(asked_keys, truth))
        known = beam.pvalue.AsSingleton(
            decided[SURE] | "KnownRemovals" >> beam.FlatMap(known_removals, asked)
            | "GatherKnown" >> beam.CombineGlobally(GatherKnown()))
        out = cells | "MergeCells" >> SplitOutputs(
            merge_cells, plan, self.spec, self.per_side, truth, known, main=REMOVED,
            tags=(NEAR_REPORT,))
        sent = (decided[SURE]  # a shard of cells at once: lines per file, not per cell
                | "GatherSure" >> beam.CombinePerKey(GatherKnown())
                | "SureByFile" >> beam.FlatMap(lambda kv: lines_by_file(kv[1])))
        out[REMOVED] = (out[REMOVED], sent) | "NearRemovals" >> beam.Flatten()
        out[NEAR_REPORT] = out[NEAR_REPORT] | "DropRecallSample" >> beam.Map(
            _drop_spill, self._drops(self.recall_spill, self.plan_spill))  # sample judged
        return out

    def _drops(self, *folders: str) -> tuple[str, ...]:
        return () if self.keep_spill else folders
