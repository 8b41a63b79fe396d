"""The reading side of a fingerprint store: the lookup plan fixed when a job starts, the
pruned digest lookups, and the stored values; mixed into ``FingerprintStore``
(``transforms.store.store``), whose commits and layout it reads through."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.canonical import dtype_named
from transforms.io import fs
from transforms.store import segment as digest_segment
from transforms.store.parts import DTYPE_KEY, batch_words, digest_key, stored_words
from transforms.store.segment import keys_of


class StoreError(ValueError):
    """The store cannot be used as asked (other settings, unknown format, missing part)."""


@contextmanager
def _still_there(path: str) -> Iterator[None]:
    """A stored file removed under a reader: a run that updates the store compacted it or
    replaced a run meanwhile (a check-only run takes no lease). One line that says so, not
    a bare FileNotFoundError."""
    try:
        yield
    except FileNotFoundError:
        raise StoreError(f"{path} was removed while this run read the store: another run "
                         "updated it meanwhile (a check-only run, store.update: false, does "
                         "not wait for one): run this one again") from None


@dataclass(frozen=True)
class SegmentRef:
    """A digest segment a lookup may open, and the run attempts it answers for."""

    path: str
    rows: int
    min: str  # 32 hex digits: the smallest and largest digest in the segment
    max: str
    serves: tuple[tuple[str, str, int], ...]  # (run_id, attempt, rank in LookupPlan.runs)
    unit: str  # the run attempt or compaction that wrote it


@dataclass(frozen=True)
class LookupPlan:
    """Which segments answer for which runs, fixed once (when a job starts) and shipped
    to workers, so lookups list no markers."""

    runs: tuple[str, ...]  # visible run ids, oldest commit first: a digest's earliest wins
    segments: tuple[SegmentRef, ...]


class StoreReads:
    """``FingerprintStore``'s reads (see ``transforms.store.store``): ``plan``, ``lookup`` and
    ``vectors``, over the runs, compactions and paths its layout methods resolve."""

    def plan(self, exclude_run: str | None = None) -> LookupPlan:
        """The segments that hold the visible runs' digests (all runs but ``exclude_run``):
        each attempt's newest covering compaction, else its own parts."""
        runs, served, compactions = self._resolve(exclude_run)
        rank = {(r.run_id, r.attempt): i for i, r in enumerate(runs)}
        segments = []
        for c in compactions:
            serves = tuple((*pair, rank[pair]) for pair in compaction_pairs(c)
                           if served.get(pair) == c["id"])
            if serves:
                segments += [SegmentRef(self._file("compacted", c["id"], p["file"]), p["rows"],
                                        p["min"], p["max"], serves, c["id"])
                             for p in c["parts"] if p["rows"]]
        for r in runs:
            pair = (r.run_id, r.attempt)
            if pair not in served:
                segments += [SegmentRef(self._data(r, p["file"]), p["rows"], p["min"], p["max"],
                                        ((*pair, rank[pair]),), f"{r.run_id}/{r.attempt}")
                             for p in r.parts if p["rows"]]
        return LookupPlan(tuple(r.run_id for r in runs), tuple(segments))

    def lookup(self, words: np.ndarray, exclude_run: str | None = None,
               plan: LookupPlan | None = None) -> tuple[np.ndarray, pa.Array, pa.Array]:
        """For each (hi, lo) digest: (found, stored record id, run id), nulls where not
        found. A digest in several runs gets the earliest committed one. Only segments
        whose key range holds a queried digest are opened, and in them only the buckets
        that can hold one are read. ``plan``: a fixed ``plan(exclude_run)``."""
        words = stored_words(words)
        plan = self.plan(exclude_run) if plan is None else plan
        keys, back = np.unique(keys_of(words), return_inverse=True)
        stats = {"runs": len(plan.runs), "segments": len(plan.segments),
                 "segments_opened": 0, "reads": 0, "bytes_read": 0}
        query, rank, ids = [], [], []
        for seg in plan.segments:
            a = int(np.searchsorted(keys, digest_key(seg.min), "left"))
            b = int(np.searchsorted(keys, digest_key(seg.max), "right"))
            if a == b:
                continue
            stats["segments_opened"] += 1
            with _still_there(seg.path):
                hits = digest_segment.search(seg.path, keys[a:b], stats)
            serves = {(r, at): k for r, at, k in seg.serves}
            rank_of = np.array([serves.get(tuple(p), -1) for p in hits.runs], np.int64)
            r = rank_of[hits.run]
            live = r >= 0  # rows of replaced or excluded attempts, or served elsewhere
            query.append(a + hits.query[live])
            rank.append(r[live])
            ids.append(hits.ids.filter(pa.array(live)))
        self.last_lookup_stats = stats
        take, run_of = np.full(len(keys), -1), np.full(len(keys), -1)
        q = np.concatenate(query) if query else np.empty(0, np.int64)
        if len(q):
            r = np.concatenate(rank)
            order = np.lexsort((r, q))  # per query digest, its earliest run first
            first = order[np.concatenate([[True], np.diff(q[order]) != 0])]
            take[q[first]], run_of[q[first]] = first, r[first]
        take, run_of = take[back], run_of[back]
        found = take >= 0
        ids = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
        run_ids = pa.array(plan.runs, pa.string())
        return (found, ids.take(pa.array(take, pa.int64(), mask=~found)),
                run_ids.take(pa.array(run_of, pa.int64(), mask=~found)))

    def vectors(self, exclude_run: str | None = None, batch_rows: int = 65536
                ) -> Iterator[tuple[np.ndarray, pa.Array, pa.Array, np.ndarray]]:
        """All stored values, oldest run first, in batches: (words (n, 2) uint64, record
        ids, run ids, x (n, d) in the stored dtype, a read-only view of Arrow memory)."""
        for run in self.runs(exclude=exclude_run):
            run_id = pa.scalar(run.run_id, pa.string())
            for part in run.vector_parts:
                path = self._data(run, part["file"])
                with _still_there(path), fs.open_read(path) as f:
                    pf = pq.ParquetFile(f)
                    dtype = dtype_named(pf.schema_arrow.metadata[DTYPE_KEY].decode())
                    for batch in pf.iter_batches(batch_size=batch_rows):
                        x = batch["x"].flatten().to_numpy(zero_copy_only=False)
                        yield (batch_words(batch), batch["record_id"],
                               pa.repeat(run_id, len(batch)),
                               x.view(dtype).reshape(-1, part["dim"]))


    def sets(self, exclude_run: str | None = None, batch_rows: int = 65536
             ) -> Iterator[tuple[np.ndarray, pa.Array, pa.Array, np.ndarray, np.ndarray]]:
        """All stored shingle sets (a jaccard store), oldest run first, in batches:
        (words (n, 2) uint64, record ids, run ids, CSR offsets (n + 1,), hashes uint64).
        The store's settings (``check_compatible``) say it holds sets, not vectors."""
        for run in self.runs(exclude=exclude_run):
            run_id = pa.scalar(run.run_id, pa.string())
            for part in run.vector_parts:
                path = self._data(run, part["file"])
                with _still_there(path), fs.open_read(path) as f:
                    pf = pq.ParquetFile(f)
                    for batch in pf.iter_batches(batch_size=batch_rows):
                        col = batch["sets"]
                        offsets = np.asarray(col.offsets, np.int64)
                        hashes = col.values.to_numpy(zero_copy_only=False)[
                            offsets[0]:offsets[-1]]
                        yield (batch_words(batch), batch["record_id"],
                               pa.repeat(run_id, len(batch)), offsets - offsets[0], hashes)


def compaction_pairs(compaction: dict) -> list[tuple[str, str]]:
    """The (run id, attempt) pairs a compaction's merged segments cover."""
    return [tuple(p) for p in compaction["covers"]]
