"""Report, per input file: the rows of duplicates.parquet and invalid.parquet are written
by the workers, one part per input file, in parallel; the report's one worker sees only
counts and the page's pick.

Why: every removal's row built on one worker (the report's tables, its page's largest
groups) was work and memory that grew with n: at 1B records a fifth removed is 200M
rows. Here each file's rows are built beside the file's decision. A row's ``group`` is
the digest of the record its whole group keeps; an exact copy names its exact survivor,
which the near stage may have removed as a copy of another record, possibly in another
file: the survivors' files answer which of the named records they removed, and as
whom (one join keyed by the survivor's file; near survivors are never removed, so one
step reaches the root). The page's largest groups come from group sizes summed per
shard of group ids and the top groups' members trimmed per file, then merged: both of
a size that does not grow with n.

At the end the report joins the parts into one ``duplicates.parquet`` (and
``invalid.parquet``) while they hold at most ``tuning.report_file_rows`` rows; above,
they stay directories of ``part-NNNNN.parquet`` files, NNNNN the input file's index
(``pq.read_table`` reads a file and such a directory alike, rows in input order).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.report.pick import MAX_GROUPS, MAX_LISTED, MAX_MEMBERS, Pick
from pipeline.steps.elements import REFERENCE_FILES, FileDecision, digest_hex, where_key
from pipeline.steps.tagged import SplitOutputs
from transforms.io import fs, layout
from transforms.io.formats.base import records_of

DUPLICATES_SCHEMA = pa.schema([("record_id", pa.string()), ("duplicate_of", pa.string()),
                               ("kind", pa.string()), ("distance", pa.float64()),
                               ("duplicate_of_run", pa.string()),
                               ("file", pa.int32()), ("row", pa.int64()),
                               ("duplicate_of_file", pa.int32()),
                               ("duplicate_of_row", pa.int64()), ("group", pa.string())])
INVALID_SCHEMA = pa.schema([("record_id", pa.string()), ("source", pa.string()),
                            ("reason", pa.string())])
PART_DIGITS = 5  # part-00000.parquet: at least this many digits, as many as the last file needs
KEEP_ROWS = MAX_MEMBERS - 1 + MAX_LISTED  # a group's removed records the page can show
COUNTS = "counts"


@dataclass(frozen=True)
class FileParts:
    """Parts -> Report: the rows one input file's parts hold."""

    file_index: int
    duplicates: int
    invalid: int


def part_name(file_index: int, total_files: int) -> str:
    """``part-NNNNN.parquet``, zero-padded alike for every file of a run (sorted names are
    input order)."""
    width = max(PART_DIGITS, len(str(max(total_files - 1, 0))))
    return f"part-{file_index:0{width}d}.parquet"


# ---------------------------------------------------------------------------- one file


@dataclass
class Roots:
    """Removed records other removals name, sorted by ``where_key``, and the digest of the
    record each one's group keeps."""

    at: np.ndarray  # (m,) int64
    digest: np.ndarray  # (m, 2) uint64

    @staticmethod
    def of(parts: Iterable[tuple[np.ndarray, np.ndarray]]) -> Roots:
        parts = list(parts)
        if not parts:
            return Roots(np.empty(0, np.int64), np.empty((0, 2), np.uint64))
        at = np.concatenate([p[0] for p in parts])
        order = np.argsort(at, kind="stable")
        return Roots(at[order], np.concatenate([p[1] for p in parts])[order])

    def lookup(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit, slot): which of ``at`` are here, and where."""
        if not len(self.at):
            return np.zeros(len(at), bool), np.zeros(len(at), np.int64)
        slot = np.minimum(np.searchsorted(self.at, at), len(self.at) - 1)
        return (at >= 0) & (self.at[slot] == at), slot


def file_rows(decision: FileDecision, roots: Roots) -> tuple[pa.Table, np.ndarray]:
    """One file's rows of duplicates.parquet, by position, and for each whether it names
    the record its group keeps (its survivor was not removed: the page's kept record)."""
    parts = [r for r in decision.removed if len(r)]
    if not parts:
        return DUPLICATES_SCHEMA.empty_table(), np.zeros(0, bool)
    row = np.concatenate([r.position for r in parts]).astype(np.int64)
    s_file = np.concatenate([r.survivor_file() for r in parts]).astype(np.int32)
    s_row = np.concatenate([r.survivor_position() for r in parts]).astype(np.int64)
    group = np.array(np.concatenate([r.survivor_digest() for r in parts]), np.uint64)
    hit, slot = roots.lookup(where_key(s_file, s_row))
    group[hit] = roots.digest[slot[hit]]
    stored = s_file < 0  # a record of an earlier run (store kinds): no file or row here
    cols = {"record_id": pa.concat_arrays([r.record_id for r in parts]),
            "duplicate_of": pa.concat_arrays([r.duplicate_of for r in parts]),
            "kind": pa.array([r.kind for r in parts for _ in range(len(r))], pa.string()),
            "distance": pa.array(np.concatenate([r.distance for r in parts]), pa.float64()),
            "duplicate_of_run": pa.concat_arrays([
                pa.nulls(len(r), pa.string()) if r.duplicate_of_run is None
                else r.duplicate_of_run.cast(pa.string()) for r in parts]),
            "file": pa.array(np.full(len(row), decision.file_index, np.int32)),
            "row": pa.array(row),
            "duplicate_of_file": pa.array(s_file, mask=stored),
            "duplicate_of_row": pa.array(s_row, mask=stored),
            "group": digest_hex(group)}
    order = np.argsort(row, kind="stable")
    return pa.table(cols, schema=DUPLICATES_SCHEMA).take(pa.array(order)), ~hit[order]


def invalid_rows(per_file: list[tuple[str, list]]) -> pa.Table:
    """The invalid records (an unreadable file is no record: summary.json names it)."""
    rows = [(r.record_id, path, r.reason) for path, invalid in per_file
            for r in records_of(invalid)]
    return pa.table({name: [row[i] for row in rows] for i, name in
                     enumerate(INVALID_SCHEMA.names)}, schema=INVALID_SCHEMA)


# ---------------------------------------------------------------------------- the roots' join


def _asks(decision: FileDecision) -> Iterator[tuple[int, tuple[int, np.ndarray]]]:
    """(survivor's file, (this file, the positions there that this file's removals name))."""
    parts = [r for r in decision.removed if len(r)]
    if not parts:
        return
    s_file = np.concatenate([r.survivor_file() for r in parts]).astype(np.int64)
    s_row = np.concatenate([r.survivor_position() for r in parts]).astype(np.int64)
    ok = (s_file >= 0) & (s_file < REFERENCE_FILES)  # reference records are never removed
    for f in np.unique(s_file[ok]).tolist():
        yield f, (decision.file_index, np.unique(s_row[ok & (s_file == f)]))


def _answer(joined: tuple[int, dict[str, Iterable]]
            ) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
    """A survivor file's answer to each asking file: which of the named records it removed
    (their where_key) and the digest of the record each one's group keeps."""
    f, got = joined
    asks, have = list(got["ask"]), list(got["have"])
    parts = [r for d in have for r in d.removed if len(r)]
    if not asks or not parts:
        return
    mine = Roots.of((r.position.astype(np.int64), r.survivor_digest()) for r in parts)
    for asker, rows in asks:
        hit, slot = mine.lookup(rows)
        if hit.any():
            yield asker, (where_key(np.full(int(hit.sum()), f), rows[hit]), mine.digest[slot[hit]])


def _rooted(joined: tuple[int, dict[str, Iterable]]) -> Iterator[tuple[FileDecision, Roots]]:
    _, got = joined
    for d in got["decision"]:
        yield d, Roots.of(got["roots"])


# ---------------------------------------------------------------------------- writing


class _WriteParts(beam.DoFn):
    """(decision, roots) -> FileParts, after writing the file's part of each table; group
    sizes per shard of group ids to COUNTS."""

    def __init__(self, staging: str, total_files: int, shards: int):
        self.staging, self.total_files, self.shards = staging, total_files, shards

    def process(self, element: tuple[FileDecision, Roots]):
        decision, roots = element
        name = part_name(decision.file_index, self.total_files)
        dups, _ = file_rows(decision, roots)
        bad = invalid_rows([(decision.path, decision.invalid)])
        for table, folder in ((dups, layout.DUPLICATES), (bad, layout.INVALID)):
            if table.num_rows:
                with fs.local_file_for(fs.join(self.staging, folder, name)) as local:
                    pq.write_table(table, local)
        if dups.num_rows:
            ids, counts = np.unique(dups.column("group").to_numpy(zero_copy_only=False)
                                    .astype("S32"), return_counts=True)
            shard = np.array([int(i[:8], 16) % self.shards for i in ids.tolist()])
            for s in np.unique(shard).tolist():
                yield beam.pvalue.TaggedOutput(COUNTS, (s, (ids[shard == s], counts[shard == s])))
        yield FileParts(decision.file_index, dups.num_rows, bad.num_rows)


class _SumCounts(beam.CombineFn):
    """Group sizes of one shard: (ids, counts) summed per id."""

    def create_accumulator(self):
        return np.empty(0, "S32"), np.empty(0, np.int64)

    def add_input(self, acc, element):
        return self.merge_accumulators([acc, element])

    def merge_accumulators(self, accs):
        accs = list(accs)
        ids = np.concatenate([a[0] for a in accs]).astype("S32")
        counts = np.concatenate([a[1] for a in accs]).astype(np.int64)
        if not len(ids):
            return ids, counts
        keys, inverse = np.unique(ids, return_inverse=True)
        return keys, np.bincount(inverse, weights=counts, minlength=len(keys)).astype(np.int64)

    def extract_output(self, acc):
        return acc


def top_groups(sized: Iterable[tuple[np.ndarray, np.ndarray]], k: int = MAX_GROUPS
               ) -> dict[str, int]:
    """{group id: removed records} of the ``k`` largest groups, ties by id."""
    parts = list(sized)
    ids = [i.decode() for p in parts for i in p[0].tolist()]
    counts = [c for p in parts for c in p[1].tolist()]
    best = sorted(zip(ids, counts, strict=True), key=lambda t: (-t[1], t[0]))[:k]
    return dict(best)


def _top_of_shard(keyed: tuple[int, tuple[np.ndarray, np.ndarray]]
                  ) -> tuple[np.ndarray, np.ndarray]:
    ids, counts = keyed[1]
    order = np.lexsort((ids, -counts))[:MAX_GROUPS]
    return ids[order], counts[order]


# ---------------------------------------------------------------------------- the page's pick


def trim(rows: pa.Table, names_root: np.ndarray, keep: int = KEEP_ROWS
         ) -> tuple[pa.Table, np.ndarray]:
    """Per group, the ``keep`` rows the page can show (farthest from their survivor
    first, then by place) and one row that names the kept record; the same rows whatever
    pieces the rows came in (a total order)."""
    if not rows.num_rows:
        return rows, names_root
    group = rows.column("group").to_numpy(zero_copy_only=False).astype("S32")
    at = where_key(rows.column("file").to_numpy(), rows.column("row").to_numpy())
    dist = rows.column("distance").to_numpy()
    order = np.lexsort((at, -dist, group))  # by group, then the page's order
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, len(g)])
    rank = np.arange(len(g)) - np.repeat(starts, sizes)
    root = names_root[order]
    within = np.cumsum(root) - np.repeat(np.cumsum(root)[starts] - root[starts], sizes)
    first_root = root & (within == 1)  # the first row naming the kept record, per group
    chosen = np.sort(order[(rank < keep) | first_root])
    return rows.take(pa.array(chosen)), names_root[chosen]


class _PickRows(beam.CombineFn):
    """Every file's rows of the top groups, trimmed as they merge (``trim``)."""

    def create_accumulator(self):
        return DUPLICATES_SCHEMA.empty_table(), np.zeros(0, bool)

    def add_input(self, acc, element):
        return self.merge_accumulators([acc, element])

    def merge_accumulators(self, accs):
        accs = list(accs)
        return trim(pa.concat_tables([a[0] for a in accs]),
                    np.concatenate([a[1] for a in accs]))

    def extract_output(self, acc):
        return acc


def _rows_of_top(element: tuple[FileDecision, Roots], top: dict[str, int]
                 ) -> tuple[pa.Table, np.ndarray]:
    rows, names_root = file_rows(*element)
    if not top or not rows.num_rows:
        return DUPLICATES_SCHEMA.empty_table(), np.zeros(0, bool)
    mask = pc.is_in(rows.column("group"), pa.array(list(top), pa.string())).to_numpy(
        zero_copy_only=False)
    return trim(rows.filter(pa.array(mask)), names_root[mask])


def _pick(rows: tuple[pa.Table, np.ndarray], top: dict[str, int]) -> Pick:
    return Pick(rows[0], rows[1], top)


class ReportParts(beam.PTransform):
    """FileDecision -> {"parts": FileParts per file, "pick": one Pick}: each file's rows
    of duplicates.parquet and invalid.parquet written into ``staging`` as
    ``<table>/part-NNNNN.parquet``, and what the report's page shows of them."""

    def __init__(self, staging: str, *, total_files: int, shards: int):
        super().__init__()
        self.staging, self.total_files, self.shards = staging, total_files, shards

    def expand(self, decisions):
        keyed = decisions | "ByFile" >> beam.Map(lambda d: (d.file_index, d))
        answers = ({"ask": decisions | "Asks" >> beam.FlatMap(_asks), "have": keyed}
                   | "AskSurvivors" >> beam.CoGroupByKey() | "Answer" >> beam.FlatMap(_answer))
        rooted = ({"decision": keyed, "roots": answers} | "Answers" >> beam.CoGroupByKey()
                  | "Roots" >> beam.FlatMap(_rooted))
        written = rooted | "WriteParts" >> SplitOutputs(
            _WriteParts(self.staging, self.total_files, self.shards), main="parts",
            tags=(COUNTS,))
        top = beam.pvalue.AsSingleton(
            written[COUNTS] | "SumSizes" >> beam.CombinePerKey(_SumCounts())
            | "TopOfShard" >> beam.Map(_top_of_shard)
            | "Shards" >> beam.combiners.ToList() | "Top" >> beam.Map(top_groups))
        pick = (rooted | "RowsOfTop" >> beam.Map(_rows_of_top, top)
                | "Trim" >> beam.CombineGlobally(_PickRows())
                | "Pick" >> beam.Map(_pick, top))
        return {"parts": written["parts"], "pick": pick}
