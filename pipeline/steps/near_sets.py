"""Near (jaccard): SetBatch (shingle sets of texts or token sequences, spilled) ->
(file_index, Removed kind "near") + NearReport.

Plan -> Keys -> GroupByKey(key shard) -> Groups -> Components -> GroupByKey(component)
-> Decide -> Merge, over the kernel ``transforms.near.sets``:

- **Plan** (one worker, small): a bottom-k sample of the records by digest hash gives
  the recall sample (with its sets) and, for ``mode: auto``, the pairs the exact join's
  groups would hold (estimated from the sample's prefix hashes), so the mode is chosen
  before any key is made, the same on every runner.
- **Keys** (every worker): each chunk's sets, read back from their file, give its rows'
  group keys: MinHash-LSH bands (bounded) or prefix hashes (exact); rows travel as
  (key, digest, keep order, where) lines to the key's shard, never their sets.
- **Groups** (every worker, per shard): rows of one digest collapse to the one exact
  dedup kept; keys shared by two digests or more are candidate groups.
- **Components** (one worker): which grouped records can affect each other's decisions
  (connected through shared groups): the group memberships of grouped records only, as
  integers (a record in no group is kept without a comparison). Memberships travel
  between Groups, Components and Decide as spilled files (``MemberSlice``).
- **Decide** (every worker, per component): the component's sets, read from their
  files, decided in keep order by the kernel (``decide``: each record against the kept
  records of its groups, verified by its true Jaccard). A crowd is one component on one
  worker holding the crowd's sets only.
- **Merge** (one worker): a line per removed record, as for vectors.

Exact copies never count twice (a digest stands for its copies), reference records are
protected (never removed; a record near one goes as ``reference_near``). Recall: the
sample against every chunk through each chunk's prefix index (exact), judged by the
sampled records' decisions (``transforms.near.recall``).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline import progress
from pipeline.steps.borderline import BORDERLINE_SCHEMA
from pipeline.steps.elements import NEAR_REPORT, REMOVED, SetBatch
from pipeline.steps.near import GatherTruth
from pipeline.steps.near_merge import NearReport
from pipeline.steps.removed import removed_by_file
from pipeline.steps.tagged import SplitOutputs
from transforms.exact import is_protected, tier_of
from transforms.io import fs
from transforms.io.streams import read_streams, write_streams
from transforms.near.components import component_labels
from transforms.near.recall import PARTNERS, Truth, judge, splitmix64
from transforms.near.sets import (
    J_BINS,
    MISSED,
    Sets,
    auto_choice,
    band_keys,
    check_groups,
    decide,
    expected_pairs,
    frequent_tokens,
    join_work,
    length_fits,
    lsh_params,
    overlaps,
    prefix_tokens,
    signatures,
)
from transforms.near.spec import NearSpec
from transforms.store.segment import keys_of

__all__ = ["DedupNearSets"]

PLAN_SAMPLE = 20_000  # records whose prefix hashes estimate the exact join's work (auto)
KEY_SHARDS = 64  # shards of the group keys' shuffle
TRUTH_PAIRS = 2_000_000  # recall brute force: candidate pairs listed at once, at most
TRUTH_CANDIDATES = 4096  # ... and verified per sampled record and chunk (a crowd's member)
TRUTH_HASHES = 1 << 20  # ... as long as their hashes are no more than this (long texts)
TRUTH_CHUNKS = 4  # ... and over the input, at most this many chunks' worth of them
TRUTH_LISTED = 8 * TRUTH_CANDIDATES  # candidates listed per sampled record and chunk, at most
LISTED_PER_VERIFIED = 64  # ... and at most this many times those it verifies there
CHECKED = "checked"  # Groups -> Merge: the pairs the groups verified (exact mode)


def _rank_hash(words: np.ndarray) -> np.ndarray:
    """A seeded hash of each digest: the bottom-k samples take the smallest."""
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(words[:, 0] ^ np.uint64(0x43)) ^ words[:, 1])


def _best_per_digest(b: SetBatch) -> SetBatch:
    """One row per digest: the first in keep order (the one exact dedup kept)."""
    if not len(b):
        return b
    o = np.lexsort((b.order, b.prio, b.words[:, 1], b.words[:, 0]))
    w = b.words[o]
    return b.take(np.sort(o[np.r_[True, (w[1:] != w[:-1]).any(axis=1)]]))


def _joined(acc: SetBatch | None, batch: SetBatch, k: int) -> SetBatch:
    """``acc`` and a batch's bottom-k rows, cut to the bottom k."""
    mine = _bottom(batch, k)
    return mine if acc is None else _bottom(SetBatch.concat([acc, mine]), k)


def _bottom(b: SetBatch, k: int) -> SetBatch:
    """The rows of the k smallest digest hashes (one row per digest)."""
    b = _best_per_digest(b)
    if len(b) <= k:
        return b
    return b.take(np.sort(np.argsort(_rank_hash(b.words), kind="stable")[:k]))


@dataclass
class SetPlan:
    """What every step of the stage reads: the mode and its keys, and the recall sample."""

    mode: str
    why: str
    bands: int
    rows: int
    n: int  # records that entered the stage
    sample: SetBatch | None  # the recall sample, its sets in memory (a few MB)
    frequent: tuple | None = None  # exact: the shingles common in the sample (ordered last)
    unit: str = "word"  # the sets' unit, as the records gave it (``FROM_DATA``) or as set


@dataclass
class _Acc:
    n: int  # records seen
    plan: SetBatch | None  # the bottom-k rows so far, their sets in memory
    unit: str | None = None  # the first batch's unit
    recall: SetBatch | None = None  # the bottom-k of this run's records (not protected)


class PlanSets(beam.CombineFn):
    """SetBatch -> SetPlan: bottom-k samples (the mode's estimate, recall), on one worker."""

    def __init__(self, spec: NearSpec):
        self.spec = spec
        self.k = PLAN_SAMPLE if spec.mode != "bounded" else 0  # the mode's sample

    def create_accumulator(self) -> _Acc:
        return _Acc(0, None)

    def add_input(self, acc: _Acc, batch: SetBatch) -> _Acc:
        acc.n += len(batch)
        acc.unit = acc.unit or batch.unit
        if self.k or self.spec.recall_sample:
            batch = batch.loaded()
        if self.k:
            acc.plan = _joined(acc.plan, batch, self.k)
        if self.spec.recall_sample:  # drawn among this run's records only: with a store,
            # drawn among all, the sample shrank as the store grew (1,871 to 401 in 4 days)
            acc.recall = _joined(acc.recall, batch.take(np.flatnonzero(
                ~is_protected(batch.prio))), self.spec.recall_sample)
        return acc

    def merge_accumulators(self, accs: Iterable[_Acc]) -> _Acc:
        accs = list(accs)
        parts = [a.plan for a in accs if a.plan is not None]
        recall = [a.recall for a in accs if a.recall is not None]
        return _Acc(sum(a.n for a in accs),
                    _bottom(SetBatch.concat(parts), self.k) if parts else None,
                    next((a.unit for a in accs if a.unit), None),
                    _bottom(SetBatch.concat(recall), self.spec.recall_sample)
                    if recall else None)

    def extract_output(self, acc: _Acc) -> SetPlan:
        spec, sh = self.spec, self.spec.shingles
        mode, why = spec.mode, f"near.mode: {spec.mode}"
        frequent = (frequent_tokens(acc.plan.sets) if acc.plan is not None
                    and spec.mode != "bounded" else None)
        if mode == "auto":
            mode, why = _auto_mode(acc.plan, acc.n, spec.threshold, frequent)
        bands, rows = lsh_params(spec.threshold, sh.permutations, sh.bands) \
            if mode == "bounded" else (0, 0)
        sample = acc.recall if acc.recall is not None and len(acc.recall) else None
        if mode == "bounded":
            curve = expected_pairs(bands, rows, spec.threshold)
            how = (f"MinHash-LSH, {bands} bands x {rows} rows: a pair at J = "
                   f"{spec.threshold:g} is a candidate with chance {curve['at_threshold']:.4f}, "
                   f"at J = {max(spec.threshold - 0.1, 0):.2g}: {curve['below_0_1']:.4f}")
        else:
            how = "prefix-filter join (every pair at or above the threshold is found)"
        unit = acc.unit or sh.unit
        progress.note(f"near: jaccard >= {spec.threshold:g} over {unit} {sh.n}-grams of "
                      f"{acc.n:,} records, {mode} ({why}): {how}")
        return SetPlan(mode, why, bands, rows, acc.n, sample,
                       frequent if mode == "exact" else None, unit)


def _auto_mode(sample: SetBatch | None, n: int, threshold: float, frequent: tuple | None
               ) -> tuple[str, str]:
    """``choose_mode``'s rule on a uniform sample (by digest hash) of the records: a key
    held by c sampled records is held by about c / f of all (f: the sampled share)."""
    if sample is None or not len(sample):
        return "exact", "auto: no record to compare"
    f = len(sample) / max(n, 1)
    _, keys = prefix_tokens(sample.sets, threshold, frequent)
    _, counts = np.unique(keys, return_counts=True)
    return auto_choice(join_work(counts[counts > 1] / f), n,
                       f", estimated from {len(sample):,} sampled records")


@dataclass
class KeyRows:
    """Keys -> Groups: one line per (group key, row): its digest, keep order and where its
    set waits (a spill file, by index into ``paths``, and the row in it)."""

    key: np.ndarray  # (m,) uint64 group key (band hash or prefix hash)
    words: np.ndarray  # (m, 2) uint64 digest
    prio: np.ndarray  # (m,) float64
    order: np.ndarray  # (m,) int64
    row: np.ndarray  # (m,) int64: the row in its spill file
    file: np.ndarray  # (m,) int32: index into ``paths``
    paths: list  # the spill files the rows come from

    def __len__(self) -> int:
        return len(self.key)

    @staticmethod
    def concat(parts: list[KeyRows]) -> KeyRows:
        starts = np.cumsum([0] + [len(p.paths) for p in parts[:-1]])
        return KeyRows(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("key", "words", "prio", "order", "row")),
                       np.concatenate([p.file + s for p, s in zip(parts, starts, strict=True)]),
                       [f for p in parts for f in p.paths])


@dataclass
class KeySlice:
    """Keys -> Groups: one chunk's key lines of one shard, spilled: an Arrow IPC stream of
    one record batch at bytes [offset, offset + size) of ``path``, whose rows' sets wait
    in ``sets``. Only these travel through the shuffle (the runner's local shuffle held
    every line in memory: 14M lines at 1M documents x 14 bands)."""

    path: str
    offset: int
    size: int
    sets: str


_LINE_COLUMNS = ("key", "hi", "lo", "prio", "order", "row")


def chunk_keys(batch: SetBatch, plan: SetPlan, spec: NearSpec, shards: int
               ) -> Iterator[tuple[int, KeySlice]]:
    """A chunk's group keys, split by key shard into one file beside its sets (one IPC
    stream per shard); its sets are read from their file."""
    progress.tick("near keys", 0, len(batch), "chunks", units=0, total_records=plan.n)
    sets = batch.loaded().sets
    if plan.mode == "bounded":
        k = band_keys(signatures(sets, plan.bands * plan.rows, spec.device), plan.bands,
                      plan.rows)
        rec, key = np.repeat(np.arange(len(batch)), plan.bands), k.reshape(-1)
    else:
        rec, key = prefix_tokens(sets, spec.threshold, plan.frequent)
        _write_prefixes(batch.spilled, rec, key, len(batch))
    shard = (splitmix64(key) % np.uint64(shards)).astype(np.int64)
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shards + 1)).tolist()
    r = rec[order]
    rb = pa.RecordBatch.from_arrays(
        [key[order], batch.words[r, 0], batch.words[r, 1], batch.prio[r], batch.order[r], r],
        names=list(_LINE_COLUMNS))
    path = f"{batch.spilled.removesuffix('.sets')}.keys"
    used = [s for s in range(shards) if bounds[s + 1] > bounds[s]]
    spans = write_streams(path, rb, [(bounds[s], bounds[s + 1]) for s in used])
    for s, (at, size) in zip(used, spans, strict=True):
        yield s, KeySlice(path, at, size, batch.spilled)


def _prefix_path(sets_path: str) -> str:
    return f"{sets_path.removesuffix('.sets')}.prefix"


def _write_prefixes(sets_path: str, rec: np.ndarray, key: np.ndarray, n: int) -> None:
    """Exact mode: each row's prefix hashes in their order, beside its set (Groups reads
    them by row: recomputing them there took most of its time)."""
    offsets = np.r_[0, np.cumsum(np.bincount(rec, minlength=n))]
    col = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(key, pa.uint64()))
    rb = pa.RecordBatch.from_arrays([col], names=["prefix"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, rb.schema) as w:
        w.write_batch(rb)
    fs.write_scratch(_prefix_path(sets_path), sink.getvalue())


def _prefixes(rows: KeyRows, first: np.ndarray) -> Sets:
    """The prefix hashes (in order) of the records of lines ``first``, read from the
    files beside their sets, each file once."""

    def read(sets_path: str, at: np.ndarray) -> Sets:
        path = _prefix_path(sets_path)
        src = pa.memory_map(path) if fs.is_local(path) else pa.py_buffer(fs.read_bytes(path))
        col = pa.ipc.open_file(src).get_batch(0).column("prefix")
        return Sets(np.asarray(col.offsets, np.int64),
                    col.values.to_numpy(zero_copy_only=False)).take(at)

    parts, order = _per_file(rows, first, read)
    return Sets.gather(parts, order)


def _per_file(rows: KeyRows, first: np.ndarray, read) -> tuple[list, np.ndarray]:
    """``read(spill path, rows in it)`` for the records of lines ``first``, each file
    once, and the order that puts the parts' rows back in the order of ``first``."""
    parts, at = [], []
    f = rows.file[first]
    for u in np.unique(f).tolist():
        mine = np.flatnonzero(f == u)
        parts.append(read(rows.paths[u], rows.row[first[mine]]))
        at.append(mine)
    order = np.empty(len(first), np.int64)
    order[np.concatenate(at)] = np.arange(len(first))
    return parts, order


def read_lines(slices: Iterable[KeySlice]) -> KeyRows:
    """A shard's key lines from their files (each file opened once), converted to NumPy
    once for all slices (per slice took longer than reading the rows, as for cells)."""
    read = read_streams(slices)
    rb = pa.Table.from_batches([b for _, b in read]).combine_chunks()
    col = {n: rb.column(n).to_numpy() for n in _LINE_COLUMNS}
    file = np.repeat(np.arange(len(read), dtype=np.int32), [len(b) for _, b in read])
    return KeyRows(col["key"], np.stack([col["hi"], col["lo"]], axis=1), col["prio"],
                   col["order"], col["row"], file, [c.sets for c, _ in read])


@dataclass
class Members:
    """Groups -> Components -> Decide: the members of candidate groups."""

    group: np.ndarray  # (m,) uint64 group key
    rows: KeyRows  # the member rows (one per digest and group)
    components: int = 0  # Components -> Decide: the connected components they form

    def __len__(self) -> int:
        return len(self.group)


@dataclass
class MemberSlice:
    """Groups -> Components -> Decide: ``Members`` spilled, an Arrow IPC stream at bytes
    [offset, offset + size) of ``path``, with the spill files its rows name. Only these
    handles go through the runner: at 1M documents the lines of a crowd's groups (3.4M)
    passed through the runner's process twice, which held 1 GB of them."""

    path: str
    offset: int
    size: int
    paths: list
    components: int = 0


_MEMBER_COLUMNS = ("group", *_LINE_COLUMNS, "file")


def spill_members(folder_of: str, name: str, m: Members) -> MemberSlice:
    """``m`` written to a new file ``name-<random>.members`` beside the spill file
    ``folder_of`` (a rerun of the step writes a file of its own)."""
    r = m.rows
    rb = pa.RecordBatch.from_arrays(
        [m.group, r.key, r.words[:, 0], r.words[:, 1], r.prio, r.order, r.row, r.file],
        names=list(_MEMBER_COLUMNS))
    path = f"{folder_of.rpartition('/')[0]}/{name}-{secrets.token_hex(4)}.members"
    ((at, size),) = write_streams(path, rb, [(0, len(rb))])
    return MemberSlice(path, at, size, r.paths, m.components)


def read_members(slices: Iterable[MemberSlice]) -> Members:
    """The members of ``slices``, read from their files, as one ``Members``."""
    parts = []
    for s, rb in read_streams(slices):
        c = {n: rb.column(n).to_numpy() for n in _MEMBER_COLUMNS}
        rows = KeyRows(c["key"], np.stack([c["hi"], c["lo"]], axis=1), c["prio"], c["order"],
                       c["row"], c["file"], list(s.paths))
        parts.append(Members(c["group"], rows, s.components))
    if len(parts) == 1:
        return parts[0]
    return Members(np.concatenate([p.group for p in parts]),
                   KeyRows.concat([p.rows for p in parts]), sum(p.components for p in parts))


def shard_groups(item: tuple[int, Iterable[KeySlice]], plan: SetPlan, spec: NearSpec
                 ) -> Iterator[MemberSlice | beam.pvalue.TaggedOutput]:
    """A shard's keys -> the groups of two digests or more (one row per digest: the best
    in keep order, as exact dedup kept). Exact mode: the groups are checked here
    (``_checked_groups``) and only what links near records goes on."""
    shard, slices = item
    slices = list(slices)
    rows = read_lines(slices)
    name = f"groups-{shard:05d}"
    if not len(rows):
        return
    o = np.lexsort((rows.order, rows.prio, rows.words[:, 1], rows.words[:, 0], rows.key))
    k, w = rows.key[o], rows.words[o]
    first = np.r_[True, (k[1:] != k[:-1]) | (w[1:] != w[:-1]).any(axis=1)]
    o, k = o[first], k[first]
    start = np.r_[True, k[1:] != k[:-1]]
    gid = np.cumsum(start) - 1
    size = np.bincount(gid)
    shared = size[gid] > 1
    if not shared.any():
        return
    if plan.mode != "exact":
        yield spill_members(slices[0].path, name, Members(k[shared], _take_rows(rows, o[shared])))
        return
    group, lines, checked = _checked_groups(rows, o[shared], gid[shared], k[shared],
                                            spec.threshold)
    checked.groups, checked.largest = int(np.count_nonzero(size > 1)), int(size.max())
    yield beam.pvalue.TaggedOutput(CHECKED, checked)
    if len(group):
        yield spill_members(slices[0].path, name, Members(group, _take_rows(rows, lines)))


@dataclass
class Checked:
    """Groups -> Merge (exact mode): the pairs verified where the groups were found: how
    many, their J (J_BINS bins), the near misses nearest the threshold (removal side,
    candidate side, J), the groups (of two records or more) and the largest."""

    compared: int = 0
    verified: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(J_BINS, np.int64))
    missed: tuple | None = None
    groups: int = 0
    largest: int = 0

    def add(self, other: Checked) -> Checked:
        missed = [m for m in (self.missed, other.missed) if m is not None]
        if len(missed) == 2:
            j = np.concatenate([missed[0][2], missed[1][2]])
            top = np.argsort(-j, kind="stable")[:MISSED]
            missed = [tuple(SetBatch.concat([a, b]).take(top) for a, b in zip(
                missed[0][:2], missed[1][:2], strict=True)) + (j[top],)]
        return Checked(self.compared + other.compared, self.verified + other.verified,
                       missed[0] if missed else None, self.groups + other.groups,
                       max(self.largest, other.largest))


class SumChecked(beam.CombineFn):
    """Every shard's ``Checked``, added up (on one worker: a few numbers and MISSED pairs)."""

    def create_accumulator(self) -> Checked:
        return Checked()

    def add_input(self, acc: Checked, c: Checked) -> Checked:
        return acc.add(c)

    def merge_accumulators(self, accs: Iterable[Checked]) -> Checked:
        out = Checked()
        for a in accs:
            out = out.add(a)
        return out

    def extract_output(self, acc: Checked) -> Checked:
        return acc


def _checked_groups(rows: KeyRows, lines: np.ndarray, gid: np.ndarray, key: np.ndarray,
                    threshold: float) -> tuple[np.ndarray, np.ndarray, Checked]:
    """Exact mode: the groups (``lines``: one per record and group; ``gid`` numbers the
    groups, ``key`` their keys) checked where they are found, over their records' sets
    read from their files. A group of at most PAIR_GROUP records has its pairs verified
    and those at J >= threshold go on as groups of two (keyed by both digests); a pair
    is verified in one group only, that of the first prefix hash the two records share
    (``first_shared``; when that group is larger, its membership links them): a near
    pair shares dozens of prefix hashes, in as many shards. A larger one (a crowd, or a phrase
    common to many records) goes on with only its members near another member
    (``linked_members``). Returns the groups that go on, as (group key, line) lines,
    and what was checked. Unchecked, the groups linked every record that shares a rare
    shingle with another into one component, decided on one worker (at 1M documents,
    most of them); now records meet in a component only through near pairs."""
    _, node = np.unique(keys_of(rows.words[lines]), return_inverse=True)
    line_of = np.zeros(int(node.max(initial=-1)) + 1, np.int64)
    line_of[node] = lines
    recs = _records(rows, line_of)
    rank = np.empty(len(recs), np.int64)
    rank[np.lexsort((recs.order, recs.prio))] = np.arange(len(recs))
    a, b, j, goes, found = check_groups(gid, node, key, recs.sets, _prefixes(rows, line_of),
                                        rank, threshold)
    keys = dataclasses.replace(recs, sets=None)
    a_first = rank[a] < rank[b]
    d, c = np.where(a_first, b, a), np.where(a_first, a, b)  # d: the record decided later
    missed = None
    miss = np.flatnonzero(j < threshold)
    if len(miss):
        by = miss[np.lexsort((-j[miss], d[miss]))]  # each record's highest J first
        best = by[np.r_[True, d[by][1:] != d[by][:-1]]]
        top = best[np.lexsort((d[best], -j[best]))][:MISSED]
        missed = (keys.take(d[top]), keys.take(c[top]), j[top])
    near = np.flatnonzero(j >= threshold)
    edge = np.repeat(_edge_key(recs.words[a[near]], recs.words[b[near]]), 2)
    ends = np.stack([line_of[a[near]], line_of[b[near]]], axis=1).reshape(-1)
    return np.concatenate([edge, key[goes]]), np.concatenate([ends, lines[goes]]), Checked(
        len(found), np.bincount(np.minimum((found * J_BINS).astype(np.int64), J_BINS - 1),
                                minlength=J_BINS), missed)


def _edge_key(wa: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """A group key for the pair of digests (wa, wb): a hash of both (a collision with
    another group's key only merges two groups, whose members are verified anyway)."""
    with np.errstate(over="ignore"):
        h = splitmix64(wa[:, 0] ^ np.uint64(0x9E3779B97F4A7C15))
        for col in (wa[:, 1], wb[:, 0], wb[:, 1]):
            h = splitmix64(h ^ col)
    return h


def _take_rows(rows: KeyRows, idx: np.ndarray) -> KeyRows:
    """The lines ``idx``, naming only the spill files they use."""
    used, file = np.unique(rows.file[idx], return_inverse=True)
    return KeyRows(rows.key[idx], rows.words[idx], rows.prio[idx], rows.order[idx],
                   rows.row[idx], file.astype(np.int32), [rows.paths[u] for u in used])


class Gather(beam.CombineFn):
    """Every element, on one worker."""

    def create_accumulator(self) -> list:
        return []

    def add_input(self, acc: list, x) -> list:
        acc.append(x)
        return acc

    def merge_accumulators(self, accs: Iterable[list]) -> list:
        return [x for a in accs for x in a]

    def extract_output(self, acc: list) -> list:
        return acc


def components(members: list[MemberSlice], shards: int
               ) -> Iterator[tuple[int, MemberSlice]]:
    """Groups linked through shared records (what one decision can depend on), on one
    worker as integers per grouped record; the components go out in ``shards`` batches
    (a batch's decisions read each spill file once, not once per component), each
    spilled beside the groups' lines."""
    if not members:
        return
    m = read_members(members)
    group, rows = m.group, m.rows
    _, node = np.unique(keys_of(rows.words), return_inverse=True)
    _, g = np.unique(group, return_inverse=True)
    o = np.lexsort((node, g))  # link each group's members to its first one
    first_of = np.r_[True, g[o][1:] != g[o][:-1]]
    head = np.maximum.accumulate(np.where(first_of, np.arange(len(o)), 0))
    label = component_labels(int(node.max()) + 1, node[o], node[o][head])
    comp = label[node]
    shard = comp % shards
    by = np.argsort(shard, kind="stable")
    cuts = np.flatnonzero(np.diff(shard[by])) + 1
    for part in np.split(by, cuts):
        s = int(shard[part[0]])
        yield s, spill_members(members[0].path, f"decide-{s:05d}", Members(
            group[part], _take_rows(rows, part), len(np.unique(comp[part]))))


@dataclass
class Decided:
    """Decide -> Merge: a batch of components' removals, both ends' rows and their J."""

    removed: SetBatch
    kept: SetBatch
    j: np.ndarray
    compared: int
    groups: int
    largest: int
    records: int
    components: int
    verified: np.ndarray  # the verified pairs' J, counted in J_BINS bins
    missed: tuple  # (record, candidate, J): near misses below the threshold (keys only)


def decide_component(item: tuple[int, Iterable[MemberSlice]], plan: SetPlan, spec: NearSpec
                     ) -> Decided:
    """A batch of components decided in keep order over their members' sets (read from
    their files, each file once): independent components decide alike together."""
    m = read_members(item[1])
    n_components, group, rows = m.components, m.group, m.rows
    uk, node = np.unique(keys_of(rows.words), return_inverse=True)
    first = np.zeros(len(uk), np.int64)
    first[node[::-1]] = np.arange(len(node))[::-1]  # one line per record
    recs = _records(rows, first)
    _, gid = np.unique(group, return_inverse=True)
    rank = np.empty(len(uk), np.int64)
    rank[np.lexsort((recs.order, recs.prio))] = np.arange(len(uk))
    sig = (signatures(recs.sets, plan.bands * plan.rows, spec.device)
           if plan.mode == "bounded" else None)
    dec = decide(gid.astype(np.int64), node.astype(np.int64), recs.sets, rank, spec.threshold,
                 spec.grouping, is_protected(recs.prio), sig, tier_of(recs.prio, recs.order))
    sizes = np.bincount(gid)
    keys = dataclasses.replace(recs, sets=None)  # only the ends' keys go on
    d, c, j = dec.missed
    return Decided(keys.take(dec.removed), keys.take(dec.kept), dec.j, dec.compared,
                   len(sizes), int(sizes.max()), len(uk), n_components, dec.verified,
                   (keys.take(d), keys.take(c), j))


def _records(rows: KeyRows, first: np.ndarray) -> SetBatch:
    """The records of lines ``first`` (one each), keys and sets read from their spill
    files, each file once."""
    parts, order = _per_file(rows, first, lambda path, at: SetBatch.read(path).take(at))
    sets = Sets.gather([p.sets for p in parts], order)
    keys = SetBatch.concat([dataclasses.replace(p, sets=None) for p in parts]).take(order)
    return dataclasses.replace(keys, sets=sets)


def chunk_truth(batch: SetBatch, plan: SetPlan, spec: NearSpec) -> Iterator[Truth]:
    """The recall sample against one chunk: each sampled record's earlier partners (in
    keep order) at J >= threshold, through the chunk's prefix index (complete). Sampled
    records go in batches of at most TRUTH_PAIRS candidate pairs, and each keeps its
    PARTNERS nearest and PARTNERS latest partners with the count of all: a sampled
    member of a 100,000-copy crowd meets the whole crowd (1.6 billion candidate pairs
    held at once took 12 GB).
    A prefix token listing more than TRUTH_CANDIDATES records of the chunk offers its
    first TRUTH_CANDIDATES. A sampled record verifies at most TRUTH_CANDIDATES in a
    chunk, fewer for a long text (TRUTH_HASHES of theirs), and TRUTH_CHUNKS times that
    over the input: each chunk its share (PARTNERS at least), those sharing the most
    prefix tokens with it, listed from every k-th of its prefix tokens (TRUTH_LISTED at
    most, and LISTED_PER_VERIFIED times those it verifies): a crowd of 1,000 copies of a
    3,600-word text took 70 of a job's 90 s listing and verifying them, and a cap per
    chunk alone verified a crowd's copies in every chunk once the chunks were many. Such
    a record counts as truncated (``Recall.truncated``) and is judged on the partners
    found, as inside vector crowds. Sampled keys the chunk's protected rows hold are
    yielded apart (``Truth.held``)."""
    s = plan.sample
    if s is None or not len(s):
        return
    b = _best_per_digest(batch.loaded())
    held = Truth.held_by(s.words, b.words, b.prio)
    if held.held:
        yield held
    rec, keys = prefix_tokens(b.sets, spec.threshold, plan.frequent)
    o = np.argsort(keys, kind="stable")
    skeys, srec = keys[o], rec[o]
    srec_s, stok = prefix_tokens(s.sets, spec.threshold, plan.frequent)
    lo, hi = np.searchsorted(skeys, stok), np.searchsorted(skeys, stok, side="right")
    long = np.zeros(len(s), bool)  # a token of the record's lists more than TRUTH_CANDIDATES
    long[srec_s[hi - lo > TRUTH_CANDIDATES]] = True
    hi = np.minimum(hi, lo + TRUTH_CANDIDATES)  # the chunk's first records of such a token
    # what a sampled record verifies here: the chunk's share of TRUTH_CHUNKS chunks'
    # worth (a cap per chunk alone: 150x a chunk's own work on 12 chunks of crowds)
    cap = np.minimum(TRUTH_CANDIDATES, TRUTH_HASHES // np.maximum(s.sets.sizes, 1))
    share = TRUTH_CHUNKS * len(batch) / max(plan.n, 1)
    most_s = np.maximum(PARTNERS, (cap * min(1.0, share)).astype(np.int64))
    # a record listing more than it may takes every k-th of its prefix tokens: a
    # crowd member's prefix of 700 tokens (a 3,600-word text) listed the crowd 700 times
    # over; its partners share most of those tokens, so a spread of them finds them (its
    # rarest tokens alone are the ones its own edits made)
    total = np.bincount(srec_s, weights=hi - lo, minlength=len(s))
    listed = np.minimum(TRUTH_LISTED, LISTED_PER_VERIFIED * most_s)
    stride = np.maximum(1, np.ceil(total / listed)).astype(np.int64)[srec_s]
    skip = (np.arange(len(srec_s)) - np.searchsorted(srec_s, srec_s)) % stride != 0
    long[srec_s[skip]] = True
    hi = np.where(skip, lo, hi)
    per = np.bincount(srec_s, weights=hi - lo, minlength=len(s))  # candidates per record
    cut, counts = [], {}
    first = 0
    while first < len(s):
        last = first + max(1, int(np.searchsorted(np.cumsum(per[first:]), TRUTH_PAIRS)))
        mine = (srec_s >= first) & (srec_s < last)
        n_hit = (hi - lo)[mine]
        at = np.repeat(lo[mine], n_hit) + (np.arange(int(n_hit.sum()))
                                            - np.repeat(np.cumsum(n_hit) - n_hit, n_hit))
        # each (sampled record, candidate) once, with the prefix tokens they share: one
        # sort for the batch (a sort per sampled record cost a third of the recall's time)
        pair, shared_all = np.unique(np.repeat(srec_s[mine], n_hit) * len(b) + srec[at],
                                     return_counts=True)
        pair_s, pair_c = pair // len(b), pair % len(b)
        cuts = np.flatnonzero(np.r_[True, pair_s[1:] != pair_s[:-1], True]).tolist()
        first = last
        if not len(pair_s):
            continue
        out_s, out_p, out_j = [], [], []
        for a, z in zip(cuts[:-1], cuts[1:], strict=True):  # a sampled record: its candidates
            i = int(pair_s[a])
            c, shared = pair_c[a:z], shared_all[a:z]
            earlier = (b.prio[c] < s.prio[i]) | ((b.prio[c] == s.prio[i])
                                                 & (b.order[c] < s.order[i]))
            x = s.sets.row(i)
            ok = earlier & (b.words[c] != s.words[i]).any(axis=1) & length_fits(
                b.sets.sizes[c], len(x), spec.threshold)
            c, shared = c[ok], shared[ok]
            most = int(most_s[i])
            crowd = bool(long[i]) or len(c) > most
            if len(c) > most:  # those sharing most prefix tokens
                c = c[np.argsort(-shared, kind="stable")[:most]]
            if not len(c):
                continue
            j = overlaps(b.sets, x, c)
            keep = np.flatnonzero(j >= spec.threshold)
            if not len(keep):
                continue
            counts[tuple(s.words[i].tolist())] = len(keep) + crowd * (PARTNERS + 1)
            out_s.append(np.full(len(keep), i))
            out_p.append(c[keep])
            out_j.append(j[keep])
        if out_s:  # each batch's records cut to the partners they keep (``Truth.cut``)
            si, pi, jj = np.concatenate(out_s), np.concatenate(out_p), np.concatenate(out_j)
            cut.append(Truth(s.words[si], b.words[pi], 1.0 - jj, b.prio[pi], b.order[pi],
                             {}).cut())
    if cut:  # the batches hold distinct sampled records: their cuts are the whole's
        yield Truth.concat(cut, counts)


def merge_sets(parts: list[Decided], plan: SetPlan, spec: NearSpec, per_side: int,
               truth: Truth, checked: Checked
               ) -> Iterator[tuple[int, object] | beam.pvalue.TaggedOutput]:
    """Every component's removals -> removals per file (kind near) and the NearReport
    (with the pairs the groups verified themselves: ``checked``)."""
    sh = spec.shingles
    stats = {"metric": "jaccard", "unit": plan.unit, "size": sh.n, "normalize": sh.normalize,
             "threshold_jaccard": spec.threshold, "mode": plan.mode, "mode_reason": plan.why,
             "bands": plan.bands, "rows": plan.rows, "records_entered": plan.n,
             "partitions": 1, "histogram_every": 1}
    if plan.mode == "bounded":
        stats["s_curve"] = expected_pairs(plan.bands, plan.rows, spec.threshold)
    done = [p for p in parts if len(p.removed)]
    removed = 0
    dist = np.empty(0)
    gone: dict = {}
    border = BORDERLINE_SCHEMA.empty_table()
    if done:
        rec = SetBatch.concat([p.removed for p in done])
        ref = SetBatch.concat([p.kept for p in done])
        j = np.concatenate([p.j for p in done])
        ends = SetBatch.concat([rec, ref])
        m = removed = len(rec)
        dist = 1.0 - j
        by_input = np.lexsort((rec.position, rec.file_index))
        yield from removed_by_file(ends, by_input, m + by_input, "near", dist[by_input],
                                   tier_of(ref.prio[by_input], ref.order[by_input]))
        asked = set(map(tuple, np.concatenate([truth.sample, truth.partner]).tolist()))
        gone = {a: (b, d) for a, b, d in zip(map(tuple, rec.words.tolist()),
                                             map(tuple, ref.words.tolist()), dist.tolist(),
                                             strict=True) if a in asked}
        border = _borderline(rec, ref, dist, per_side, True)
    missed = [p.missed for p in parts if len(p.missed[2])] + (
        [checked.missed] if checked.missed is not None else [])
    if missed:
        j = np.concatenate([m[2] for m in missed])
        border = pa.concat_tables([border, _borderline(
            SetBatch.concat([m[0] for m in missed]), SetBatch.concat([m[1] for m in missed]),
            1.0 - j, per_side, False)])
    judged = None
    if spec.recall_sample and plan.sample is not None:
        sampled = set(map(tuple, plan.sample.words.tolist()))
        judged = judge(truth, sampled, gone, spec.grouping == "components").as_dict()
    exact = plan.mode == "exact"  # its groups were counted where they were found
    stats.update(removed=int(removed), pairs_within_tolerance=int(removed),
                 compared=int(sum(p.compared for p in parts) + checked.compared),
                 candidate_groups=int(checked.groups if exact else sum(p.groups for p in parts)),
                 largest_group=int(checked.largest if exact
                                   else max((p.largest for p in parts), default=0)),
                 components=int(sum(p.components for p in parts)),
                 records_searched=int(sum(p.records for p in parts)),
                 recall=judged, recall_removed=None if judged is None
                 else judged["recall_removed"])
    verified = checked.verified + (np.sum([p.verified for p in parts], axis=0) if parts
                                   else 0)
    yield beam.pvalue.TaggedOutput(NEAR_REPORT, NearReport(
        dist, border, stats, {"verified_j": np.asarray(verified, np.int64).tolist()}))


def _borderline(rec: SetBatch, ref: SetBatch, dist: np.ndarray, per_side: int,
                within: bool) -> pa.Table:
    """The verified pairs nearest the threshold on one side: removals with the lowest J
    (``within``), or near misses with the highest."""
    pick = np.argsort(-dist if within else dist, kind="stable")[:per_side]
    r, k = rec.take(pick), ref.take(pick)
    return pa.table({"record_id": r.ids, "neighbour_id": k.ids, "distance": dist[pick],
                     "within": np.full(len(pick), within),
                     "record_file": r.file_index.astype(np.int32), "record_row": r.position,
                     "neighbour_file": k.file_index.astype(np.int32),
                     "neighbour_row": k.position}, schema=BORDERLINE_SCHEMA)


class DedupNearSets(beam.PTransform):
    """SetBatch (sets spilled) -> {REMOVED: (file_index, Removed), NEAR_REPORT: NearReport}.

    Args:
      spec: a jaccard ``NearSpec`` (threshold: the minimum Jaccard; ``shingles``).
      borderline_pairs: verified pairs nearest the threshold kept for the report.
      shards: shards of the group keys' shuffle, and batches of components decided.
    """

    def __init__(self, spec: NearSpec, *, borderline_pairs: int = 500,
                 shards: int = KEY_SHARDS):
        super().__init__()
        if not spec.is_sets:
            raise ValueError("DedupNearSets takes a jaccard NearSpec; DedupNear the others")
        self.spec, self.per_side, self.shards = spec, borderline_pairs, shards

    def expand(self, sets):
        plan = beam.pvalue.AsSingleton(sets | "Plan" >> beam.CombineGlobally(
            PlanSets(self.spec)))
        truth = beam.pvalue.AsSingleton(
            sets | "RecallBruteForce" >> beam.FlatMap(chunk_truth, plan, self.spec)
            | "GatherTruth" >> beam.CombineGlobally(GatherTruth()))
        groups = (sets
                  | "Keys" >> beam.FlatMap(chunk_keys, plan, self.spec, self.shards)
                  | "GroupByKeyShard" >> beam.GroupByKey()
                  | "Groups" >> SplitOutputs(shard_groups, plan, self.spec, main="members",
                                           tags=(CHECKED,)))
        checked = beam.pvalue.AsSingleton(groups[CHECKED] | "SumChecked" >> beam.CombineGlobally(
            SumChecked()))
        return (groups["members"]
                | "GatherGroups" >> beam.CombineGlobally(Gather())
                | "Components" >> beam.FlatMap(components, self.shards)
                | "GroupByComponent" >> beam.GroupByKey()
                | "Decide" >> beam.Map(decide_component, plan, self.spec)
                | "GatherDecisions" >> beam.CombineGlobally(Gather())
                | "Merge" >> SplitOutputs(merge_sets, plan, self.spec, self.per_side, truth,
                                          checked, main=REMOVED, tags=(NEAR_REPORT,)))

