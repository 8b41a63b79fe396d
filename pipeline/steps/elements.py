"""What flows between the Beam steps: the element types and every output tag.

Why explicit types: the shuffle moves only these small arrays (digests, order
keys, ids), never tensors, and each step's input and output is visible here.
Chunks of rows (``Chunk``) come from ``transforms.io.formats.base``.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from pipeline.steps.removed import Removed, concat_runs
from transforms.canonical import dtype_named
from transforms.io import fs, spill
from transforms.io.formats.base import InvalidRecord, records_of
from transforms.near.sets import Sets

__all__ = ["FileDecision", "FileResult", "KeyBatch", "ReadFacts",
           "VecBatch", "SetBatch", "KINDS",
           "CHUNKS", "FACTS", "FILES", "KEYS", "VECTORS",
           "REMOVED", "SEEN", "REFERENCE_FILES", "SURVIVORS", "NEAR_REPORT", "DECISIONS",
           "KEPT", "INVALID"]

# Output tags: the keys of the dicts of PCollections the steps return.
CHUNKS = "chunks"  # ReadTensors: Chunk
FACTS = "facts"  # ReadTensors: (file_index, ReadFacts)
FILES = "files"  # ReadTensors: (file_index, path)
KEYS = "keys"  # Fingerprint: (shard, KeyBatch)
VECTORS = "vectors"  # Fingerprint: VecBatch (near stage on; SetBatch for jaccard)
REMOVED = "removed"  # DedupExact, DedupNear: (file_index, Removed); Dedup over records: dicts
SEEN = "seen"  # DedupExact: (file_index, rows that reached the duplicate check)
EMBEDDED = "embedded"  # Dedup(embed=): (file_index, rows the model embedded)
SURVIVORS = "survivors"  # DedupExact: (shard, KeyBatch) this run's rows exact dedup kept
NEAR_REPORT = "near_report"  # DedupNear: one NearReport
DECISIONS = "decisions"  # Dedup over ReadTensors: FileDecision
KEPT = "kept"  # Dedup over records: the records kept
INVALID = "invalid"  # Dedup over records: records that cannot be compared, with the reason

# A reference set's files are numbered from here (keep_order fits file indexes < 2**23):
# their records are protected, never removed.
REFERENCE_FILES = 1 << 22

def _take_opt(a: pa.Array | None, idx: np.ndarray) -> pa.Array | None:
    return None if a is None else a.take(pa.array(idx, pa.int64()))


@dataclass
class KeyBatch:
    """Fingerprint -> Exact: the digests of some rows of one shard, with their order keys."""

    words: np.ndarray  # (n, 2) uint64 digest (hi, lo)
    file_index: np.ndarray  # (n,) int32
    position: np.ndarray  # (n,) int64
    ids: pa.Array  # (n,) string record ids
    rank: np.ndarray | None = None  # (n,) float64 keep-by values
    tier: np.ndarray | None = None  # (n,) int8 NEW | STORE | REFERENCE (transforms.exact)
    run: pa.Array | None = None  # (n,) string: the earlier run a stored record came from

    def __len__(self) -> int:
        return len(self.position)

    def take(self, idx: np.ndarray) -> KeyBatch:
        return KeyBatch(self.words[idx], self.file_index[idx], self.position[idx],
                        self.ids.take(pa.array(idx, pa.int64())),
                        None if self.rank is None else self.rank[idx],
                        None if self.tier is None else self.tier[idx], _take_opt(self.run, idx))

    @staticmethod
    def concat(batches: list[KeyBatch]) -> KeyBatch:
        rank = None if batches[0].rank is None else np.concatenate([b.rank for b in batches])
        tier = None if all(b.tier is None for b in batches) else np.concatenate(
            [np.zeros(len(b), np.int8) if b.tier is None else b.tier for b in batches])
        return KeyBatch(np.concatenate([b.words for b in batches]),
                        np.concatenate([b.file_index for b in batches]),
                        np.concatenate([b.position for b in batches]),
                        pa.concat_arrays([b.ids for b in batches]), rank, tier,
                        concat_runs([b.run for b in batches], [len(b) for b in batches]))


@dataclass
class VecBatch:
    """Fingerprint -> Near: some rows' values (flattened) with their digests and keep order.

    ``prio``/``order`` come from ``transforms.exact.keep_order``, so the near stage ranks
    records exactly as the exact stage does (protected reference/store rows first)."""

    words: np.ndarray  # (n, 2) uint64 digest (hi, lo)
    prio: np.ndarray  # (n,) float64, smaller = preferred
    order: np.ndarray  # (n,) int64 input order (negated for keep: last)
    file_index: np.ndarray  # (n,) int32
    position: np.ndarray  # (n,) int64
    ids: pa.Array  # (n,) string record ids
    x: np.ndarray  # (n, d) values in the input dtype; (n, 0) once no longer needed
    run: pa.Array | None = None  # (n,) string: the earlier run a stored record came from
    spilled: tuple[str, int] | None = None  # (file, d): x is (n, 0) until ``loaded()``

    def __len__(self) -> int:
        return len(self.position)

    def take(self, idx: np.ndarray, values: bool = True) -> VecBatch:
        if values and self.spilled is not None:
            raise ValueError("take() of a spilled VecBatch: call loaded() first")
        x = self.x[idx] if values else np.empty((len(idx), 0), self.x.dtype)
        return VecBatch(self.words[idx], self.prio[idx], self.order[idx], self.file_index[idx],
                        self.position[idx], self.ids.take(pa.array(idx, pa.int64())), x,
                        _take_opt(self.run, idx))

    def spill(self, folder: str) -> VecBatch:
        """The same rows with their values written to a file in ``folder`` (any
        filesystem): the element a runner holds and shuffles is then a few bytes per row."""
        path = fs.join(folder, f"{uuid.uuid4().hex}.values")
        fs.write_scratch(path, np.ascontiguousarray(self.x).reshape(-1).view(np.uint8))
        return dataclasses.replace(self, x=np.empty((len(self), 0), self.x.dtype),
                                   spilled=(path, self.x.shape[1]))

    def spill_rows(self, idx: np.ndarray, folder: str) -> VecBatch:
        """``take(idx).spill(folder)`` without a copy of all the taken values at once (a
        crowd's cell spills all its rows): they are written in blocks of about 64 MB."""
        rows = np.asarray(idx, np.int64)
        step = max(1, (64 << 20) // max(1, self.x[:1].nbytes))
        path = fs.join(folder, f"{uuid.uuid4().hex}.values")
        fs.write_scratch(path, (np.ascontiguousarray(self.x[rows[a:a + step]]).reshape(-1)
                                .view(np.uint8).data for a in range(0, len(rows), step)))
        return dataclasses.replace(self.take(rows, values=False),
                                   spilled=(path, self.x.shape[1]))

    def loaded(self) -> VecBatch:
        """The values back in memory (itself when they are)."""
        if self.spilled is None:
            return self
        path, dim = self.spilled
        x = np.frombuffer(fs.read_bytes(path), self.x.dtype).reshape(len(self), dim)
        return dataclasses.replace(self, x=x, spilled=None)

    def picked(self, idx: np.ndarray) -> VecBatch:
        """``take(idx)`` with values, reading only those rows from a spill file: the
        samples' few rows of a chunk on an object store, not its whole file (which the
        two samples downloaded twice over)."""
        if self.spilled is None:
            return self.take(idx)
        path, dim = self.spilled
        x = np.empty((len(idx), dim), self.x.dtype)
        fs.read_rows_into(path, np.asarray(idx, np.int64), x, np.arange(len(idx)))
        return dataclasses.replace(self.take(idx, values=False), x=x)

    @property
    def width(self) -> int:
        """Values per record (also of a spilled batch)."""
        return self.x.shape[1] if self.spilled is None else self.spilled[1]

    def to_arrow(self, **flags: np.ndarray) -> pa.RecordBatch:
        """The rows as one Arrow record batch, plus boolean ``flags`` columns (for spill
        files). Values travel as fixed-width bytes with their dtype in the schema, so
        every dtype the job reads (bfloat16 included) round-trips bit for bit."""
        x = np.ascontiguousarray(self.x)
        width = x.shape[1] * x.dtype.itemsize
        raw = pa.py_buffer(x.reshape(-1).view(np.uint8))
        cols = {"hi": self.words[:, 0], "lo": self.words[:, 1], "prio": self.prio,
                "order": self.order, "file_index": self.file_index,
                "position": self.position, "ids": self.ids,
                "x": pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(self),
                                                          [None, raw]),
                **({} if self.run is None else {"run": self.run}), **flags}
        rb = pa.RecordBatch.from_pydict(cols)
        return rb.replace_schema_metadata({"dtype": x.dtype.name, "dim": str(x.shape[1])})

    @staticmethod
    def from_arrow(rb: pa.RecordBatch) -> tuple[VecBatch, dict[str, np.ndarray]]:
        """``to_arrow``'s batch back: the VecBatch and its flags (values: ``arrow_values``)."""
        x = arrow_values(rb)

        def arr(name: str) -> np.ndarray:
            return rb.column(name).to_numpy(zero_copy_only=False)

        names = set(rb.schema.names)
        flags = {k: arr(k) for k in names - {"hi", "lo", "prio", "order", "file_index",
                                             "position", "ids", "x", "run"}}
        words = np.stack([arr("hi"), arr("lo")], axis=1)
        return VecBatch(words, arr("prio"), arr("order"), arr("file_index"), arr("position"),
                        rb.column("ids"), x, rb.column("run") if "run" in names else None), flags

    @staticmethod
    def concat(batches: list[VecBatch]) -> VecBatch:
        cat = [np.concatenate([getattr(b, f) for b in batches])
               for f in ("words", "prio", "order", "file_index", "position")]
        return VecBatch(*cat, pa.concat_arrays([b.ids for b in batches]),
                        np.concatenate([b.x for b in batches]),
                        concat_runs([b.run for b in batches], [len(b) for b in batches]))


def arrow_values(rb: pa.RecordBatch) -> np.ndarray:
    """A ``VecBatch.to_arrow`` batch's values, a view of its ``x`` column; none (zero a
    row) where that column was left out: a cell's reader sorts its rows without them and
    takes each row's values from its own batch."""
    meta = rb.schema.metadata
    dtype, dim = dtype_named(meta[b"dtype"].decode()), int(meta[b"dim"])
    if "x" not in rb.schema.names:
        return np.empty((len(rb), 0), dtype)
    col = rb.column("x")
    width = dim * dtype.itemsize
    raw = np.frombuffer(col.buffers()[1], np.uint8, count=len(rb) * width,
                        offset=col.offset * width)
    return raw.view(dtype).reshape(len(rb), dim)


@dataclass
class SetBatch:
    """Fingerprint -> Near (jaccard): some rows' shingle sets with their digests and keep
    order (as ``VecBatch``). The sets wait in a file (``spill``); the element the runner
    holds and shuffles carries the rows' keys and the file's name."""

    words: np.ndarray  # (n, 2) uint64 digest (hi, lo)
    prio: np.ndarray  # (n,) float64, smaller = preferred
    order: np.ndarray  # (n,) int64
    file_index: np.ndarray  # (n,) int32
    position: np.ndarray  # (n,) int64
    ids: pa.Array  # (n,) string record ids
    sets: Sets | None = None  # the rows' shingle sets; None while spilled (or not needed)
    spilled: str | None = None  # the file holding ``sets`` (``loaded()`` reads it)
    run: pa.Array | None = None  # store run ids (null: this run's records), or None
    unit: str | None = None  # what the sets are made of (word, char, token); None: unknown

    def __len__(self) -> int:
        return len(self.position)

    def take(self, idx: np.ndarray) -> SetBatch:
        """The rows ``idx``, their sets too when in memory (a spilled batch's rows keep
        only their keys)."""
        return SetBatch(self.words[idx], self.prio[idx], self.order[idx], self.file_index[idx],
                        self.position[idx], self.ids.take(pa.array(idx, pa.int64())),
                        None if self.sets is None else self.sets.take(idx),
                        run=_take_opt(self.run, idx), unit=self.unit)

    def spill(self, folder: str) -> SetBatch:
        """The same rows with their keys and sets written to a file in ``folder`` (Arrow
        IPC): the element then carries the keys and the file's name; a step that needs
        a few rows reads them back by name alone (``read``)."""
        path = fs.join(folder, f"{uuid.uuid4().hex}.sets")
        sets = pa.LargeListArray.from_arrays(pa.array(self.sets.offsets, pa.int64()),
                                             pa.array(self.sets.hashes, pa.uint64()))
        rb = pa.RecordBatch.from_pydict({
            "hi": self.words[:, 0], "lo": self.words[:, 1], "prio": self.prio,
            "order": self.order, "file_index": self.file_index, "position": self.position,
            "ids": self.ids, "sets": sets,
            **({} if self.run is None else {"run": self.run})})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, rb.schema) as w:
            w.write_batch(rb)
        fs.write_scratch(path, sink.getvalue())
        return dataclasses.replace(self, sets=None, spilled=path)

    @staticmethod
    def read(path: str) -> SetBatch:
        """A spilled batch back from its file alone: keys and sets (a local file mapped:
        a step taking a few of its rows reads only their pages)."""
        src = pa.memory_map(path) if fs.is_local(path) else pa.py_buffer(fs.read_bytes(path))
        rb = pa.ipc.open_file(src).get_batch(0)  # local: mapped, only the rows used are read

        def arr(name: str) -> np.ndarray:
            return rb.column(name).to_numpy(zero_copy_only=False)

        col = rb.column("sets")
        n = len(rb)
        sets = Sets(np.asarray(col.offsets, np.int64), col.values.to_numpy(zero_copy_only=False),
                    np.zeros(n, bool))
        return SetBatch(np.stack([arr("hi"), arr("lo")], axis=1), arr("prio"), arr("order"),
                        arr("file_index"), arr("position"), rb.column("ids"), sets,
                        run=rb.column("run") if "run" in rb.schema.names else None)

    def loaded(self) -> SetBatch:
        """The sets back in memory (itself when they are)."""
        if self.spilled is None:
            return self
        return dataclasses.replace(self, sets=SetBatch.read(self.spilled).sets, spilled=None)

    @staticmethod
    def concat(batches: list[SetBatch]) -> SetBatch:
        cat = [np.concatenate([getattr(b, f) for b in batches])
               for f in ("words", "prio", "order", "file_index", "position")]
        sets = (None if any(b.sets is None for b in batches)
                else Sets.concat([b.sets for b in batches]))
        return SetBatch(*cat, pa.concat_arrays([b.ids for b in batches]), sets,
                        run=concat_runs([b.run for b in batches], [len(b) for b in batches]),
                        unit=next((b.unit for b in batches if b.unit), None))


# Why a record was removed: a copy of / near a record of this run, of a reference set
# (never removed itself), or of the store of earlier runs.


spill.register(VecBatch)  # the near stage writes batches to its scratch files


KINDS = ("exact", "near", "reference_exact", "reference_near", "store_exact", "store_near")


def where_key(file_index: np.ndarray, position: np.ndarray) -> np.ndarray:
    """(file, position) as one int64 (as ``keep_order`` packs it); -1 where file < 0."""
    f = np.asarray(file_index, np.int64)
    return np.where(f < 0, -1, (f << 40) | np.asarray(position, np.int64))


def group_roots(removed_at: np.ndarray, survivor_at: np.ndarray, digest: np.ndarray
                ) -> np.ndarray:
    """Each removal's group: the digest of the record its whole group keeps.

    ``removed_at`` / ``survivor_at``: ``where_key`` of each removed record and of the
    record it names; ``digest``: (n, 2) the named record's digest. An exact copy of a
    record that the near stage removed names that record; its group is the near
    survivor's, so every member of a group (exact and near) carries one id. Chains are
    followed to their end (at most one step in the job: near survivors are never
    removed)."""
    digest = np.array(digest, np.uint64, copy=True)
    if not len(removed_at):
        return digest
    order = np.argsort(removed_at, kind="stable")
    keys = removed_at[order]
    at = survivor_at.copy()
    for _ in range(64):
        slot = np.minimum(np.searchsorted(keys, at), len(keys) - 1)
        hit = (at >= 0) & (keys[slot] == at)
        if not hit.any():
            break
        src = order[slot[hit]]
        digest[hit] = digest[src]
        at[hit] = survivor_at[src]
    return digest


_HEX = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")


def digest_hex(words: np.ndarray) -> pa.Array:
    """(n, 2) uint64 digests -> Arrow strings of 32 hex digits (``bytes.hex()`` of the
    16-byte fingerprint), without a Python loop."""
    raw = np.ascontiguousarray(np.asarray(words, np.uint64).astype(">u8")).view(np.uint8)
    hexed = _HEX[raw.reshape(-1, 16)].view("S32").ravel()
    return pa.array(hexed, pa.binary(32)).cast(pa.string())


@dataclass
class ReadFacts:
    """Read -> Decide: how many records a chunk read, and which of them were invalid."""

    n_read: int
    invalid: list[InvalidRecord] = field(default_factory=list)
    long: int = 0  # texts longer than the embedding model takes (embed.long)


@dataclass(frozen=True)
class Tally:
    """How many records of one file a kind removed (a ``Removed`` without its rows)."""

    kind: str
    rows: int

    def __len__(self) -> int:
        return self.rows


@dataclass
class FileDecision:
    """Decide -> Write: everything known about one input file before it is rewritten."""

    file_index: int
    path: str
    n_read: int
    removed: list[Removed | Tally]  # one entry per kind, sorted by position
    invalid: list[InvalidRecord]  # sorted by position (counted: the first and whole-file ones)
    invalid_records: int | None = None  # counted: how many invalid records ``invalid`` had

    def counted(self) -> FileDecision:
        """This decision with each kind's removals as a count (``Tally``) and its invalid
        records as a count, the first one and any whole-file one: what the report's one
        worker needs once the file's rows are written."""
        bad = records_of(self.invalid)
        return FileDecision(self.file_index, self.path, self.n_read,
                            [Tally(r.kind, len(r)) for r in self.removed],
                            [r for r in self.invalid if r.whole_file] + bad[:1], len(bad))

    def invalid_count(self) -> int:
        """Invalid records (an unreadable file holds none)."""
        return (len(records_of(self.invalid)) if self.invalid_records is None
                else self.invalid_records)

    def drop(self) -> np.ndarray:
        """Sorted positions the clean copy leaves out: duplicates and invalid records (an
        unreadable file has none: its copy is no file)."""
        parts = [r.position for r in self.removed]
        parts.append(np.array([r.position for r in records_of(self.invalid)], dtype=np.int64))
        return np.unique(np.concatenate(parts)).astype(np.int64)


@dataclass
class FileResult:
    """Write -> Report: the outcome for one input file."""

    decision: FileDecision  # counted (``FileDecision.counted``): no removal rows
    output: str | None  # written file, relative to output.path; None if nothing was readable
    kept: int
    notes: list[str] = field(default_factory=list)  # what the copy could not keep as it was
    shown: dict[int, np.ndarray] | None = None  # tensors the report asked for, read by the copy
