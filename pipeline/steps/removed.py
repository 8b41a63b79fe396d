"""Removed: the records of one input file that the clean copy drops, and why; large ones
wait in a file and only its name crosses the runner.

Why a file: a removal line (ids, positions, the survivor's place and digest; about 80
bytes) is small, but an input where most records are copies has millions of them, and
Beam's runner decodes and re-encodes every element it groups, flattens or hands on as a
side input. From the exact and near steps to the report a file's removals cross it ten
times or so: 2M removed copies took ~28 s and held the lines in every process on the way.
``Removed.spill`` writes a large one once (Arrow IPC) and returns a stand-in that pickles
as the file's name; its columns are read back when first used, by the steps that do
(Decide's merge of several parts, the copy's drop list, the report).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np
import pyarrow as pa

from transforms.exact import NEW, REFERENCE, STORE
from transforms.io import fs


class Located(Protocol):
    """Rows with where they live and what they are (``KeyBatch``, ``VecBatch``)."""

    file_index: np.ndarray
    position: np.ndarray
    ids: pa.Array
    run: pa.Array | None
    words: np.ndarray


TIER_PREFIX = {NEW: "", STORE: "store_", REFERENCE: "reference_"}
SPILL_ROWS = 16_384  # fewer removal lines cross the runner inline (a file costs a create)


def concat_runs(runs: list[pa.Array | None], sizes: list[int]) -> pa.Array | None:
    """Store run ids (null for this run's and reference records), None when none has any."""
    if all(r is None for r in runs):
        return None
    return pa.concat_arrays([pa.nulls(n, pa.string()) if r is None else r
                             for r, n in zip(runs, sizes, strict=True)])


@dataclass
class Removed:
    """Exact/Near -> Decide: records of one file to drop, what each duplicates, and how.

    Where the survivor lives travels along (a few ints per removed row): its file index
    and position (-1 for a record of an earlier run, which only ``duplicate_of_run``
    names), and its digest, from which the report derives the group id
    (``group_roots``). A spilled one (``spill``) reads its columns on first use."""

    position: np.ndarray  # (n,) int64
    record_id: pa.Array  # (n,) string
    duplicate_of: pa.Array  # (n,) string: the surviving record's id
    kind: str  # one of KINDS
    distance: np.ndarray  # (n,) float64; 0.0 for exact kinds
    duplicate_of_run: pa.Array | None = None  # (n,) string: store kinds, the record's run
    duplicate_of_file: np.ndarray | None = None  # (n,) int32: the survivor's file; -1: store
    duplicate_of_position: np.ndarray | None = None  # (n,) int64: its position; -1: store
    group: np.ndarray | None = None  # (n, 2) uint64: the survivor's digest (hi, lo)

    def __getattribute__(self, name: str):
        # a stand-in's columns (defaults included: those are class attributes) on first use
        if name in _COLUMNS:
            state = object.__getattribute__(self, "__dict__")
            if "position" not in state:
                state.update(_read(state["_file"]))
        return object.__getattribute__(self, name)

    def __reduce_ex__(self, protocol):
        state = object.__getattribute__(self, "__dict__")
        if "_file" in state:  # the file's name, not its lines
            return _stand_in, (state["_file"], state["kind"], state["_rows"])
        return super().__reduce_ex__(protocol)

    def __len__(self) -> int:
        state = object.__getattribute__(self, "__dict__")
        return state["_rows"] if "_rows" in state else len(self.position)

    def spill(self, folder: str | None, at_least: int = SPILL_ROWS) -> Removed:
        """This, or (``at_least`` rows or more, and a ``folder`` every worker can reach)
        a stand-in for it whose lines wait in a new file in ``folder``."""
        state = object.__getattribute__(self, "__dict__")
        if folder is None or "_file" in state or len(self) < at_least:
            return self
        path = fs.join(folder, f"{uuid.uuid4().hex}.arrows")
        table = self._table()
        with fs.local_file_for(path) as local, pa.OSFile(local, "wb") as sink, \
                pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return _stand_in(path, self.kind, len(self))

    def survivor_file(self) -> np.ndarray:
        return (np.full(len(self), -1, np.int32) if self.duplicate_of_file is None
                else self.duplicate_of_file)

    def survivor_position(self) -> np.ndarray:
        return (np.full(len(self), -1, np.int64) if self.duplicate_of_position is None
                else self.duplicate_of_position)

    def survivor_digest(self) -> np.ndarray:
        return np.zeros((len(self), 2), np.uint64) if self.group is None else self.group

    def _table(self) -> pa.Table:
        cols = {"position": pa.array(self.position, pa.int64()),
                "record_id": self.record_id, "duplicate_of": self.duplicate_of,
                "distance": pa.array(self.distance, pa.float64())}
        if self.duplicate_of_run is not None:
            cols["duplicate_of_run"] = self.duplicate_of_run
        if self.duplicate_of_file is not None:
            cols["duplicate_of_file"] = pa.array(self.duplicate_of_file, pa.int32())
        if self.duplicate_of_position is not None:
            cols["duplicate_of_position"] = pa.array(self.duplicate_of_position, pa.int64())
        if self.group is not None:
            g = np.asarray(self.group, np.uint64)
            cols["group_hi"], cols["group_lo"] = pa.array(g[:, 0]), pa.array(g[:, 1])
        return pa.table(cols).replace_schema_metadata({"kind": self.kind})

    @staticmethod
    def concat_sorted(parts: list[Removed]) -> Removed:
        """Parts of one kind as one Removed sorted by position."""
        pos = np.concatenate([p.position for p in parts])
        order = np.argsort(pos, kind="stable")
        take = pa.array(order)
        runs = concat_runs([p.duplicate_of_run for p in parts], [len(p) for p in parts])
        return Removed(pos[order], pa.concat_arrays([p.record_id for p in parts]).take(take),
                       pa.concat_arrays([p.duplicate_of for p in parts]).take(take),
                       parts[0].kind, np.concatenate([p.distance for p in parts])[order],
                       None if runs is None else runs.take(take),
                       np.concatenate([p.survivor_file() for p in parts])[order],
                       np.concatenate([p.survivor_position() for p in parts])[order],
                       np.concatenate([p.survivor_digest() for p in parts])[order])


_COLUMNS = frozenset(f.name for f in fields(Removed)) - {"kind"}


def _stand_in(path: str, kind: str, rows: int) -> Removed:
    """A Removed whose columns are read from ``path`` when first used."""
    r = object.__new__(Removed)
    object.__getattribute__(r, "__dict__").update(_file=path, kind=kind, _rows=rows)
    return r


def _read(path: str) -> dict:
    """A spilled Removed's columns (our own scratch file, written by ``spill``)."""
    with fs.arrow_source(path) as source:
        t = pa.ipc.open_file(source).read_all().combine_chunks()
    col = {name: t.column(name).chunk(0) if t.column(name).num_chunks
           else pa.array([], t.schema.field(name).type) for name in t.column_names}

    def numbers(name: str, dtype) -> np.ndarray | None:
        return np.array(col[name].to_numpy(zero_copy_only=False), dtype) if name in col else None

    group = None
    if "group_hi" in col:
        group = np.stack([numbers("group_hi", np.uint64), numbers("group_lo", np.uint64)], 1)
    return {"position": numbers("position", np.int64), "record_id": col["record_id"],
            "duplicate_of": col["duplicate_of"], "distance": numbers("distance", np.float64),
            "duplicate_of_run": col.get("duplicate_of_run"),
            "duplicate_of_file": numbers("duplicate_of_file", np.int32),
            "duplicate_of_position": numbers("duplicate_of_position", np.int64),
            "group": group}


def removed_by_file(batch: Located, removed: np.ndarray, kept: np.ndarray,
                    kind: str, distance: np.ndarray, kept_tier: np.ndarray | None = None
                    ) -> Iterator[tuple[int, Removed]]:
    """Split removals (sorted by input order) into one ``Removed`` per input file and kind;
    ``kept_tier`` (tier of each removal's survivor) names the kind: ``kind``,
    ``store_<kind>`` or ``reference_<kind>``. Each row carries where its survivor lives
    (file index and position; -1 for a stored record of an earlier run) and its digest."""
    if kept_tier is None:
        kept_tier = np.zeros(len(removed), np.int8)
    for tier in np.unique(kept_tier).tolist():
        mine = np.flatnonzero(kept_tier == tier)
        files = batch.file_index[removed[mine]]
        cuts = np.flatnonzero(np.diff(files)) + 1
        for part in np.split(mine, cuts):
            if len(part):
                r, k = pa.array(removed[part]), pa.array(kept[part])
                at = kept[part]
                k_file = batch.file_index[at].astype(np.int32)
                k_pos = np.where(k_file < 0, -1, batch.position[at]).astype(np.int64)
                yield int(batch.file_index[removed[part[0]]]), Removed(
                    batch.position[removed[part]], batch.ids.take(r), batch.ids.take(k),
                    TIER_PREFIX[tier] + kind, distance[part],
                    None if batch.run is None else batch.run.take(k), k_file, k_pos,
                    np.ascontiguousarray(batch.words[at], np.uint64))
