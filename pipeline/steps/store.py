"""The fingerprint store in the job: lookups in Exact, stored values in Near, the update.

The store itself (layout, atomic commits, pruned lookups) is ``transforms.store.store``;
this module is the thin Beam layer over it. A ``StoreView`` is fixed when the job
starts (the earlier runs it sees, the current run id it ignores, so a rerun never
matches its own earlier attempt) and travels to workers as a few strings.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline.steps.elements import (
    DECISIONS,
    REFERENCE_FILES,
    SURVIVORS,
    VECTORS,
    FileDecision,
    KeyBatch,
    SetBatch,
    VecBatch,
)
from transforms.digests import SCHEME
from transforms.exact import NEW, STORE, Keep, keep_order
from transforms.io import layout
from transforms.io.formats.base import InputError, TensorSpec
from transforms.near.sets import Sets, by_whitespace
from transforms.near.space import finite_rows
from transforms.near.spec import NearSpec
from transforms.store.store import FingerprintStore, LookupPlan, StoreError


def store_meta(resolved: TensorSpec, near: NearSpec | None, settings: dict | None = None
               ) -> dict:
    """What every run appending to one store must share (``settings``: how values were
    made, e.g. decode and embedding model)."""
    sets = near is not None and near.is_sets  # shingle sets of these settings, not values
    return {"fingerprint_scheme": SCHEME, "dtype": resolved.dtype,
            "shape": None if resolved.shape is None else list(resolved.shape),
            "values": near is not None, **(settings or {}),
            **({"shingles": _shingles(near)} if sets else {})}


def _shingles(near: NearSpec) -> dict:
    """The shingle settings a store's sets were made with; where units are found by
    whitespace (``sets.by_whitespace``), that Unicode whitespace counts (since 2026-11:
    before, only ASCII did; a store of those sets is another store)."""
    sh = near.shingles
    out = {"unit": sh.unit, "size": sh.n, "normalize": sh.normalize}
    if by_whitespace(sh):
        out["spaces"] = "unicode"
    return out


@dataclass(frozen=True)
class StoreCommit:
    """This run's attempt at appending to the store (written by workers, committed by
    the Publish step)."""

    path: str
    attempt: object  # transforms.store.store.Attempt (picklable)
    meta: dict

    def described(self, parts: list[dict]) -> dict:
        """summary.json's store section once committed (the merges: ``compact``)."""
        return {"committed": True, "compaction_merges": 0,
                "appended": sum(p["rows"] for p in parts if p["kind"] == "exact")}

    def commit(self, parts: list[dict], extra: dict) -> None:
        """Make this attempt the run's visible one (one marker written)."""
        FingerprintStore(self.path).commit(self.attempt, parts, self.meta, extra)

    def is_committed(self) -> bool:
        """Whether this attempt's marker is written (a commit that failed after it)."""
        return FingerprintStore(self.path).is_committed(self.attempt)

    def compact(self) -> int:
        """Merges due (every FANIN runs of a size tier), after the commit: how many."""
        return FingerprintStore(self.path).compact()["merges"]


@dataclass(frozen=True)
class StoreView:
    path: str
    run_id: str
    meta: dict
    plan: LookupPlan  # the runs committed before this run started, and their segments
    replaces: dict | None = None  # this run id's earlier commit, which this run replaces
    update: bool = True  # the run appends (it then never matches its own run id's records)

    @property
    def own(self) -> str | None:
        """The run id whose records this run is not checked against (``open_view``)."""
        return self.run_id if self.update else None

    @property
    def earlier(self) -> tuple[str, ...]:
        return self.plan.runs

    def describe(self) -> dict:
        return {"path": self.path, "run_id": self.run_id, "earlier_runs": len(self.earlier),
                "committed": False, "appended": 0,
                "replaces_records": None if self.replaces is None else self.replaces["records"]}

    def replacing_line(self, dry_run: bool = False) -> str | None:
        """A rerun of a committed run id replaces its records: said before any work (and
        by ``--dry-run``), since a second batch run under the same (default: today's) id
        would drop the first's."""
        if self.replaces is None or not self.replaces["records"]:
            return None  # nothing to keep: a rerun of a run that kept no record
        r = self.replaces
        return (f"store: run id {self.run_id} already committed {r['records']:,} records "
                f"({r['committed_at'][:19]} UTC); this run "
                f"{'would replace' if dry_run else 'replaces'} them. A different batch "
                "needs its own run id (--run-id)"
                + ("" if dry_run else ": Ctrl-C now to keep them"))

    def matching(self, batch: KeyBatch, keep: str) -> KeyBatch:
        """Stored records whose digests occur among this run's rows of ``batch``."""
        new = batch.words if batch.tier is None else batch.words[batch.tier == NEW]
        words = np.unique(new, axis=0)
        found, ids, runs = FingerprintStore(self.path).lookup(words, plan=self.plan)
        hit = np.flatnonzero(found)
        n = len(hit)
        take = pa.array(hit, pa.int64())
        return KeyBatch(words[hit], np.full(n, -1, np.int32), np.arange(n, dtype=np.int64),
                        ids.take(take), None if batch.rank is None else np.full(n, np.nan),
                        np.full(n, STORE, np.int8), runs.take(take))

    def vectors(self, keep: str) -> Iterator[VecBatch]:
        """Every stored value (all earlier runs) as protected rows for the near stage."""
        for (words, ids, runs, x), where in _stored(
                FingerprintStore(self.path).vectors(self.own), keep):
            yield VecBatch(words, *where, ids, x, runs)

    def sets(self, keep: str, folder: str) -> Iterator[SetBatch]:
        """Every stored shingle set (a jaccard store) as protected rows for the near
        stage, spilled to ``folder`` as the stage reads them."""
        for (words, ids, runs, offsets, hashes), where in _stored(
                FingerprintStore(self.path).sets(self.own), keep):
            yield SetBatch(words, *where, ids, Sets(offsets, hashes, np.zeros(len(ids), bool)),
                           run=runs).spill(folder)

    def begin(self) -> StoreCommit:
        return StoreCommit(self.path, FingerprintStore(self.path).begin(self.run_id),
                           self.meta)

    def refreshed(self) -> StoreView:
        """The view as of now: taken again once the run holds the store's lease, so it
        includes every run committed before (a plan made earlier could miss one)."""
        return open_view(self.path, self.run_id, self.meta, self.update)

    def clear_attempts(self) -> None:
        """Remove the attempts killed runs left uncommitted (any run id's)."""
        FingerprintStore(self.path).cleanup_uncommitted()


def _stored(batches: Iterator[tuple], keep: str) -> Iterator[tuple[tuple, tuple]]:
    """Each stored batch with its rows' (prio, order, file index -1, position): protected
    rows of the store's tier, numbered across batches."""
    start = 0
    for batch in batches:
        n = len(batch[0])
        pos = np.arange(start, start + n, dtype=np.int64)
        start += n
        fi = np.full(n, -1, np.int32)
        prio, order = keep_order(fi, pos, keep, np.full(n, np.nan), np.full(n, STORE, np.int8))
        yield batch, (prio, order, fi, pos)


def open_view(path: str, run_id: str, meta: dict, update: bool = True) -> StoreView:
    """Check the store against this run (raises InputError, one line) and fix its view.
    A run that appends (``update``) is checked against every run but its own run id's,
    which it replaces; a check-only run against every committed run, its own id's too
    (it replaces nothing: a same-day check after the day's commit had skipped that
    commit's records while saying it replaced them), and needs a store to exist."""
    store = FingerprintStore(path)
    try:
        if store.check_compatible(meta) is None and not update:
            raise StoreError(f"no fingerprint store at {path} (no {layout.STORE_META}), and a "
                             "check-only run (store.update: false) checks against an existing "
                             "one: fix store.path, or set store.update: true to start a store")
        plan = store.plan(exclude_run=run_id if update else None)
        replaces = store.committed(run_id) if update else None
    except StoreError as e:
        raise InputError(f"store.path: {e}") from None
    return StoreView(path, run_id, meta, plan, replaces, update)


class StoreVectors(beam.PTransform):
    """PBegin -> VecBatch of every stored value, or SetBatch of every stored shingle set
    (a jaccard store, ``spill``: the folder the sets are spilled to): protected rows for
    Near."""

    def __init__(self, view: StoreView, *, keep: Keep | str = "first",
                 spill: str | None = None):
        super().__init__()
        self.view, self.keep, self.spill = view, Keep.of(keep).rule, spill

    def expand(self, pbegin):
        if self.spill is not None:
            read = beam.FlatMap(lambda v, keep, folder: v.sets(keep, folder), self.keep,
                                self.spill)
        else:
            read = beam.FlatMap(lambda v, keep: v.vectors(keep), self.keep)
        return (pbegin
                | "Start" >> beam.Create([self.view])
                | "ReadStoredValues" >> read
                | "Spread" >> beam.Reshuffle())


def _kept(file_index: np.ndarray, position: np.ndarray, drops: dict[int, np.ndarray]
          ) -> np.ndarray:
    """Rows Decide did not drop (near duplicates found after Exact, for instance)."""
    keep = np.ones(len(position), dtype=bool)
    for f in np.unique(file_index).tolist():
        rows = file_index == f
        keep[rows] = ~np.isin(position[rows], drops.get(f, np.empty(0, np.int64)))
    return keep


def write_digests(shard_batch: tuple[int, KeyBatch], drops: dict, commit: StoreCommit
                  ) -> Iterator[dict]:
    shard, batch = shard_batch
    rows = np.flatnonzero(_kept(batch.file_index, batch.position, drops))
    if len(rows):
        b = batch.take(rows)
        yield commit.attempt.write_exact(shard, b.words, b.ids)


def write_values(batch: VecBatch | SetBatch, drops: dict, commit: StoreCommit
                 ) -> Iterator[dict]:
    """This run's kept rows of ``batch``: their values, or shingle sets (jaccard)."""
    batch = batch.loaded()
    sets = isinstance(batch, SetBatch)
    mine = batch.file_index < REFERENCE_FILES
    if not sets:
        mine &= finite_rows(batch.x)
    rows = np.flatnonzero(mine & _kept(batch.file_index, batch.position, drops))
    if len(rows):
        b = batch.take(rows)
        part = (int(b.file_index[0]) << 40) | int(b.position[0])  # unique per chunk
        if sets:
            yield commit.attempt.write_sets(part, b.words, b.ids, b.sets.offsets, b.sets.hashes)
        else:
            yield commit.attempt.write_vectors(part, b.words, b.ids, b.x)


class StoreUpdate(beam.PTransform):
    """{SURVIVORS: (shard, KeyBatch), DECISIONS: FileDecision, VECTORS: VecBatch (only
    with the near stage)} -> part stats (dicts) of this run's store attempt, committed by
    Publish."""

    def __init__(self, commit: StoreCommit):
        super().__init__()
        self.commit = commit

    def expand(self, streams: dict):
        drops = beam.pvalue.AsDict(streams[DECISIONS] | "DroppedPositions" >> beam.Map(
            lambda d: (d.file_index, d.drop())).with_input_types(FileDecision))
        parts = [streams[SURVIVORS] | "WriteDigests" >> beam.FlatMap(write_digests, drops,
                                                                      self.commit)]
        if VECTORS in streams:
            parts.append(streams[VECTORS] | "WriteValues" >> beam.FlatMap(
                write_values, drops, self.commit))
        return parts | "StoreParts" >> beam.Flatten()
