"""Near (jaccard): SetBatch (shingle sets of texts or token sequences) -> (file_index,
Removed kind "near") + NearReport.

The kernel is ``transforms.near.sets.near_sets``: candidates from MinHash-LSH bands
(bounded) or an exact prefix-filter join (exact), every candidate verified by its true
Jaccard, decisions in keep order (crowds compared with their kept members only). Exact
copies are collapsed first (the record exact dedup kept stands for its digest), and
reference records are protected (never removed; a record near one is removed as
``reference_near``).

Where it runs: the sets are gathered on one worker (``GatherSets``), which holds about
8 bytes per shingle of every record exact dedup kept (docs/text.md sizes it): the first
landing of jaccard; the band shuffle across workers is the next step (issue 43's note).
Recall is measured as for vectors: a seeded sample of records, each compared with every
record through the exact prefix index, judged by its decision (``transforms.near.recall``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline import progress
from pipeline.steps.borderline import BORDERLINE_SCHEMA
from pipeline.steps.elements import NEAR_REPORT, REMOVED, SetBatch
from pipeline.steps.near_merge import NearReport
from pipeline.steps.removed import removed_by_file
from pipeline.steps.tagged import SplitOutputs
from transforms.exact import is_protected, tier_of
from transforms.near.recall import Truth, in_sample, judge
from transforms.near.sets import (
    choose_mode,
    expected_pairs,
    lsh_params,
    near_sets,
    sample_partners,
)
from transforms.near.spec import NearSpec

__all__ = ["DedupNearSets"]


class GatherSets(beam.CombineFn):
    """Every chunk's SetBatch, on one worker."""

    def create_accumulator(self) -> list:
        return []

    def add_input(self, acc: list, batch: SetBatch) -> list:
        acc.append(batch)
        return acc

    def merge_accumulators(self, accs: Iterable[list]) -> list:
        return [b for a in accs for b in a]

    def extract_output(self, acc: list) -> list:
        return acc


def exact_survivors(batch: SetBatch) -> SetBatch:
    """One row per digest: the first in keep order (the one exact dedup kept)."""
    if not len(batch):
        return batch
    o = np.lexsort((batch.order, batch.prio, batch.words[:, 1], batch.words[:, 0]))
    w = batch.words[o]
    first = np.r_[True, (w[1:] != w[:-1]).any(axis=1)]
    return batch.take(np.sort(o[first]))


def decide_sets(batches: list[SetBatch], spec: NearSpec, per_side: int
                ) -> Iterator[tuple[int, object] | beam.pvalue.TaggedOutput]:
    """All sets -> removals per file (kind near) and the NearReport."""
    sh = spec.shingles
    n_in = sum(len(b) for b in batches)
    u = exact_survivors(SetBatch.concat(batches)) if batches else None
    del batches
    n = 0 if u is None else len(u)
    stats = {"metric": "jaccard", "records_searched": n, "partitions": 1,
             "histogram_every": 1, "unit": sh.unit, "size": sh.n, "normalize": sh.normalize,
             "threshold_jaccard": spec.threshold}
    if not n:
        stats.update(mode="exact", removed=0, recall=None, recall_removed=None,
                     pairs_within_tolerance=0, compared=0)
        yield beam.pvalue.TaggedOutput(NEAR_REPORT, NearReport(
            np.empty(0), BORDERLINE_SCHEMA.empty_table(), stats))
        return
    rank = np.empty(n, np.int64)
    rank[np.lexsort((u.order, u.prio))] = np.arange(n)
    protected = is_protected(u.prio)
    mode, why = choose_mode(u.sets, spec.threshold, spec.mode)
    if mode == "bounded":
        bands, rows = lsh_params(spec.threshold, sh.permutations, sh.bands)
        curve = expected_pairs(bands, rows, spec.threshold)
        stats["s_curve"] = curve
        how = (f"MinHash-LSH, {bands} bands x {rows} rows: a pair at J = {spec.threshold:g} "
               f"is a candidate with chance {curve['at_threshold']:.4f}, at J = "
               f"{max(spec.threshold - 0.1, 0):.2g}: {curve['below_0_1']:.4f}")
    else:
        how = "prefix-filter join (every pair at or above the threshold is found)"
    progress.note(f"near: jaccard >= {spec.threshold:g} over {sh.unit} {sh.n}-grams of "
                  f"{n:,} records, {mode} ({why}): {how}")
    res = near_sets(u.sets, rank, spec.threshold, sh, mode=mode, grouping=spec.grouping,
                    protected=protected)
    removed = len(res.removed)
    stats.update(mode=mode, mode_reason=why, bands=res.bands, rows=res.rows,
                 compared=int(res.compared), candidate_groups=int(res.groups),
                 removed=int(removed), pairs_within_tolerance=int(removed),
                 records_entered=int(n_in))
    dist = 1.0 - res.j
    if removed:
        by_input = np.lexsort((u.position[res.removed], u.file_index[res.removed]))
        yield from removed_by_file(u, res.removed[by_input], res.kept[by_input], "near",
                                   dist[by_input], tier_of(u.prio[res.kept[by_input]],
                                                           u.order[res.kept[by_input]]))
    judged = _judge(u, rank, protected, res, spec)
    stats.update(recall=judged, recall_removed=None if judged is None
                 else judged["recall_removed"])
    yield beam.pvalue.TaggedOutput(NEAR_REPORT, NearReport(
        dist, _borderline(u, res, dist, per_side), stats))


def _borderline(u: SetBatch, res, dist: np.ndarray, per_side: int) -> pa.Table:
    """The removals closest to the threshold (the verified pairs with the lowest J)."""
    pick = np.argsort(-dist, kind="stable")[:per_side]
    r, k = res.removed[pick], res.kept[pick]
    return pa.table({"record_id": u.ids.take(pa.array(r, pa.int64())),
                     "neighbour_id": u.ids.take(pa.array(k, pa.int64())),
                     "distance": dist[pick], "within": np.ones(len(pick), bool),
                     "record_file": u.file_index[r].astype(np.int32),
                     "record_row": u.position[r], "neighbour_file": u.file_index[k].astype(
                         np.int32), "neighbour_row": u.position[k]}, schema=BORDERLINE_SCHEMA)


def _judge(u: SetBatch, rank: np.ndarray, protected: np.ndarray, res, spec: NearSpec
           ) -> dict | None:
    """Recall: each sampled record's decision against its true earlier partners."""
    if not spec.recall_sample:
        return None
    sample = np.flatnonzero(in_sample(u.words, len(u), spec.recall_sample) & ~protected)
    s, p, j = sample_partners(u.sets, rank, sample, spec.threshold)
    counts: dict = {}
    for w in u.words[s].tolist():
        counts[tuple(w)] = counts.get(tuple(w), 0) + 1
    truth = Truth(u.words[s], u.words[p], 1.0 - j, u.prio[p], u.order[p], counts).cut()
    asked = set(map(tuple, u.words[np.concatenate([s, p])].tolist()))
    gone = {a: (b, d) for a, b, d in zip(map(tuple, u.words[res.removed].tolist()),
                                         map(tuple, u.words[res.kept].tolist()),
                                         (1.0 - res.j).tolist(), strict=True) if a in asked}
    sampled = set(map(tuple, u.words[sample].tolist()))
    return judge(truth, sampled, gone, spec.grouping == "components").as_dict()


class DedupNearSets(beam.PTransform):
    """SetBatch -> {REMOVED: (file_index, Removed), NEAR_REPORT: NearReport} (jaccard).

    Args:
      spec: a jaccard ``NearSpec`` (threshold: the minimum Jaccard; ``shingles``).
      borderline_pairs: verified pairs nearest the threshold kept for the report.
    """

    def __init__(self, spec: NearSpec, *, borderline_pairs: int = 500):
        super().__init__()
        if not spec.is_sets:
            raise ValueError("DedupNearSets takes a jaccard NearSpec; DedupNear the others")
        self.spec, self.per_side = spec, borderline_pairs

    def expand(self, sets):
        return (sets
                | "GatherSets" >> beam.CombineGlobally(GatherSets())
                | "DecideSets" >> SplitOutputs(decide_sets, self.spec, self.per_side,
                                               main=REMOVED, tags=(NEAR_REPORT,)))
