"""Near, merged: every cell's decisions -> removals per file and the NearReport.

Cells decide almost every record themselves (``near_cells``) and send their removals to
their files themselves. What reaches this one worker is the few records whose fate hung
on another cell (with their values, settled here in keep order by the same kernel:
``transforms.near.find.resolve_open``), the cells' removals of those records and of the
recall's sampled ones (``known_removals``, filtered where the cells ran), counts on a
fixed grid and small samples: nothing that grows with the pairs within tolerance, nor
with the removals. Components grouping joins each cell's components (a link per linked
record) by digest.

Recall is judged here too: each sampled record's decision against its brute-force
partners (``transforms.near.recall``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline.steps.borderline import BORDERLINE_SCHEMA, merge_borderline
from pipeline.steps.elements import NEAR_REPORT, VecBatch
from pipeline.steps.near_gather import loaded
from pipeline.steps.near_grid import weighted_sum
from pipeline.steps.removed import removed_by_file
from transforms.exact import is_protected, tier_of
from transforms.near.components import component_labels
from transforms.near.find import resolve_open
from transforms.near.greedy import STATE_KEPT
from transforms.near.recall import Strata, Truth, judge
from transforms.near.search import rows_for
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance
from transforms.store.segment import keys_of

DISTANCE_BYTES = 32 << 20  # float64 values of the removed records whose distance to their
# keeper is computed at once (each block makes about three such copies)


@dataclass
class NearReport:
    """Merge -> Report: what the histogram, the borderline sample and summary.json need.

    ``nn``: nearest-neighbour distances of a sample of records (1 in
    ``stats["histogram_every"]``, by digest); ``pairs``: the pairs within tolerance,
    each once, counted on the fixed grid (``near_grid``; inside crowds partly a scaled
    sample: ``stats["pairs_estimated"]``)."""

    nn: np.ndarray
    borderline: pa.Table
    stats: dict
    pairs: dict | None = None


def settle_unsure(cells: list, spec: NearSpec, radius: float, known: Lines | None
                  ) -> Lines | None:
    """The records cells left open or in doubt, settled together in keep order with the
    kept records they depend on (``known``: the cells' removals among them). Returns
    (removed, the record each duplicates, distance) or None when every cell decided all
    its records."""
    live = [c for c in cells if len(c.unsure)]
    if not live:
        return None
    unsure = VecBatch.concat([c.unsure for c in live])
    role = np.concatenate([c.role for c in live])
    best = VecBatch.concat([c.best for c in live])
    best_dist = np.concatenate([c.best_dist for c in live])
    key = keys_of(unsure.words)
    gone = keys_of(np.empty((0, 2), np.uint64) if known is None else known[0].words)
    home = role != STATE_KEPT  # decided by this cell: open, or removed with a doubt
    ref_ok = ~home & ~np.isin(key, gone) & ~np.isin(key, key[home])
    refs = np.flatnonzero(ref_ok)
    _, first = np.unique(key[refs], return_index=True)  # a ref named by several cells
    rows = np.sort(np.concatenate([np.flatnonzero(home), refs[first]]))
    s, h = unsure.take(rows), home[rows]
    b, bd = best.take(rows, values=False), best_dist[rows]
    prio, order = np.concatenate([s.prio, b.prio]), np.concatenate([s.order, b.order])
    rank = np.empty(len(prio))
    rank[np.lexsort((order, prio))] = np.arange(len(prio))
    r, d, dist = resolve_open(s.x, rank[:len(s)], h, bd, rank[len(s):], spec, radius,
                              tier_of(s.prio, s.order), tier_of(b.prio, b.order))
    local = d >= 0
    dup = VecBatch.concat([s.take(d[local], values=False), b.take(r[~local], values=False)])
    dup = dup.take(np.argsort(np.r_[np.flatnonzero(local), np.flatnonzero(~local)],
                              kind="stable"), values=False)
    return s.take(r, values=False), dup, dist


def component_removals(cells: list, spec: NearSpec
                       ) -> tuple[VecBatch, VecBatch, np.ndarray] | None:
    """Components grouping: the cells' links joined by digest; each component keeps its
    first record in keep order (and its protected records); the others are removed, with
    their distance to that record (which may exceed the threshold: chains). A crowd links
    every record, so what grows with it is held once: the links are dropped from the
    cells once joined, and the linked values are read into one array."""
    links = [c.links for c in cells if c.links is not None and len(c.links[0])]
    if not links:
        return None
    ends = VecBatch.concat([lk[0] for lk in links] + [lk[1] for lk in links])
    del links
    for c in cells:  # joined into ``ends``: nothing after this reads them (the merge's
        c.links = None  # own copies of the cells)
    uniq, inv = np.unique(keys_of(ends.words), return_inverse=True)
    m = len(ends) // 2
    label = component_labels(len(uniq), inv[:m], inv[m:])
    node = np.empty(len(uniq), np.int64)  # one mention per record
    node[inv] = np.arange(len(ends))
    del inv
    by_rank = np.lexsort((ends.order[node], ends.prio[node]))
    labels, at_rank = np.unique(label[by_rank], return_index=True)  # each one's best record
    first = np.full(len(uniq), -1, np.int64)
    first[labels] = by_rank[at_rank]
    keeper = first[label]
    removed = np.flatnonzero((keeper != np.arange(len(uniq))) & ~is_protected(ends.prio[node]))
    rec, ref = ends.take(node[removed], values=False), ends.take(node[keeper[removed]],
                                                                 values=False)
    del ends, node, label, by_rank, first, keeper, removed
    words, x = _linked_values([v for c in cells for v in c.values])
    vkey = keys_of(words)
    at = np.argsort(vkey, kind="stable")
    sorted_key = vkey[at]
    del vkey

    def lookup(w: np.ndarray) -> np.ndarray:
        slot = at[np.minimum(np.searchsorted(sorted_key, keys_of(w)), len(at) - 1)]
        if not (words[slot] == w).all():
            raise RuntimeError("near: a linked record's values did not reach the merge")
        return x[slot]

    dist = np.empty(len(rec))
    step = rows_for(8 * max(1, x.shape[1]), DISTANCE_BYTES, 4096, 1)
    for s in range(0, len(rec), step):  # in blocks: float64 copies of a crowd's rows
        block = slice(s, s + step)      # would be several times its values
        dist[block] = exact_distance(lookup(rec.words[block]), lookup(ref.words[block]),
                                          spec)[0]
    return rec, ref, dist


def _linked_values(parts: list[VecBatch]) -> tuple[np.ndarray, np.ndarray]:
    """(digests, values) of the linked records, the values read from their files one
    part at a time into one array (not each part, then a copy of them all)."""
    width = max((v.width for v in parts), default=0)
    dtype = np.result_type(*[v.x.dtype for v in parts]) if parts else np.float32
    words = np.concatenate([v.words for v in parts]) if parts else np.empty((0, 2), np.uint64)
    x = np.empty((len(words), width), dtype)
    at = 0
    for v in parts:
        x[at:at + len(v)] = v.loaded().x
        at += len(v)
    return words, x


Lines = tuple[VecBatch, VecBatch, np.ndarray]  # removed, the kept record each duplicates, distance


def lines_by_file(lines: Lines) -> Iterator[tuple[int, object]]:
    """Removals -> (file_index, Removed) per file, kind near (or reference/store near)."""
    rec, ref, dist = lines
    ends = VecBatch.concat([rec, ref])
    m = len(rec)
    by_input = np.lexsort((rec.position, rec.file_index))
    yield from removed_by_file(ends, by_input, m + by_input, "near", dist[by_input],
                               tier_of(ref.prio[by_input], ref.order[by_input]))


def asked_keys(cells: list, truth: Truth) -> np.ndarray:
    """The records whose removal the merge must know of, sorted: those the cells left to
    it (settled here beside the kept ones they depend on, which their own cells may have
    removed) and the recall's sampled records and their partners."""
    unsure = [loaded(c).unsure.words for c in cells]
    return np.unique(keys_of(np.concatenate([*unsure, truth.sample, truth.partner])))


def known_removals(sent: tuple[int, Lines], asked: np.ndarray) -> Iterator[Lines]:
    """A cell's removals (``decide_split``: (its shard, lines)) of the records the merge
    asks about (``asked_keys``)."""
    rec, ref, dist = sent[1]
    key = keys_of(rec.words)
    at = np.minimum(np.searchsorted(asked, key), max(len(asked) - 1, 0))
    mine = np.flatnonzero(asked[at] == key) if len(asked) else np.empty(0, np.int64)
    if len(mine):
        yield rec.take(mine, values=False), ref.take(mine, values=False), dist[mine]


class GatherKnown(beam.CombineFn):
    """Lines of several cells -> one Lines (or None): the merge's ``known_removals``, and
    a shard of cells' removals on their way to their files."""

    def create_accumulator(self) -> list:
        return []

    def add_input(self, acc: list, lines: Lines) -> list:
        acc.append(lines)
        return acc

    def merge_accumulators(self, accs) -> list:
        return [p for a in accs for p in a]

    def extract_output(self, acc: list) -> Lines | None:
        return joined(acc)


def joined(parts: list[Lines]) -> Lines | None:
    parts = [p for p in parts if p is not None and len(p[0])]
    if not parts:
        return None
    return (VecBatch.concat([p[0] for p in parts]), VecBatch.concat([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def merge_cells(cells: list, plan, spec: NearSpec, per_side: int, truth: Truth,
                known: Lines | None) -> Iterator[tuple[int, object] | beam.pvalue.TaggedOutput]:
    """All cells' decisions -> the removals settled here, per file (kind near), and the
    NearReport. The cells sent their sure removals on themselves (``decide_split``);
    ``known``: those of them the merge asks about (``asked_keys``).

    Refuses to go on unless every record that entered the stage reached a cell (as
    Decide does for the exact stage): a record lost in the shuffle would be kept
    unchecked."""
    cells = [copy.copy(loaded(c)) for c in cells]  # own copies: their links are dropped
    arrived = sum(c.arrived for c in cells)
    if arrived != plan.n:
        raise RuntimeError(f"near: {plan.n} records entered the near stage but {arrived} "
                           "reached a partition search: refusing to publish unchecked output")
    sent = sum(c.sent for c in cells)
    if spec.grouping == "representative":
        late = settle_unsure(cells, spec, plan.radius, known)
        unsure = 0 if late is None else len(late[0])
    else:
        late, unsure = component_removals(cells, spec), 0
    removed = sent
    if late is not None and len(late[0]):
        removed += len(late[0])
        yield from lines_by_file(late)
    rec, ref, dist = joined([known, late]) or (None, None, np.empty(0))
    strata = None
    if plan.sample_capped is not None:
        strata = Strata(set(map(tuple, plan.sample.words[plan.sample_capped].tolist())),
                        int(sum(c.searched - c.protected for c in cells)),
                        int(sum(c.capped for c in cells)),
                        removed if spec.grouping == "representative" else 0)
    judged = _judge(plan.sample, truth, rec, ref, dist, spec, strata)
    pairs = weighted_sum([(c.pairs, 1.0) for c in cells]
                         + [(c.pairs_sampled, c.weight) for c in cells
                            if c.pairs_sampled is not None], spec.marker)
    n_pairs = int(pairs["counts"].sum() + pairs["zero"] + pairs["under"] + pairs["over"])
    estimated = any(c.sampled_cells for c in cells)
    stats = {"records_searched": int(sum(c.searched for c in cells)),
             "partitions": len(plan.parts), **plan.parts.describe(),
             "capped_records": int(sum(c.capped for c in cells)),
             "rows_searched_against": int(sum(c.members for c in cells)),
             "pairs_compared": int(sum(c.compared for c in cells)),
             "pairs_within_tolerance": n_pairs, "pairs_estimated": estimated,
             "cells_with_sampled_pairs": int(sum(c.sampled_cells for c in cells)),
             "cells_with_sampled_nearest": int(sum(c.nn_sampled_cells for c in cells)),
             "settled_after_search": int(unsure), "removed": int(removed),
             "search_radius_l2": float(plan.radius), "histogram_every": plan.nn_mod,
             "recall": judged,
             "recall_removed": None if judged is None else judged["recall_removed"]}
    nn = np.concatenate([c.nn for c in cells]) if cells else np.empty(0)
    border = merge_borderline([c.borderline for c in cells], per_side) if cells else (
        BORDERLINE_SCHEMA.empty_table())
    yield beam.pvalue.TaggedOutput(NEAR_REPORT, NearReport(nn, border, stats, pairs))


def _judge(sample: VecBatch | None, truth: Truth, rec: VecBatch | None, ref: VecBatch | None,
           dist: np.ndarray, spec: NearSpec, strata: Strata | None) -> dict | None:
    """Recall: each sampled record's decision against its brute-force partners (weighted
    by stratum when ``strata`` says how the sample was drawn)."""
    if not spec.recall_sample:
        return None
    sampled = set() if sample is None else {
        tuple(w) for w, p in zip(sample.words.tolist(), sample.prio.tolist(), strict=True)
        if p != -np.inf}
    gone = {}
    if rec is not None:  # only removals the judgement asks about: a sampled record or a
        # partner of one (a dict of every removal held about 1 KB per removed record)
        asked = keys_of(np.concatenate([truth.sample, truth.partner]))
        mine = np.flatnonzero(np.isin(keys_of(rec.words), asked))
        gone = {tuple(a): (tuple(b), d) for a, b, d in zip(
            rec.words[mine].tolist(), ref.words[mine].tolist(), dist[mine].tolist(),
            strict=True)}
    return judge(truth, sampled, gone, spec.grouping == "components", strata).as_dict()
