"""Fingerprint store: the digests (and optionally the values) of every record that earlier
runs kept, so that a new run also removes what history already holds (incremental dedup).

Why this layout: each attempt of a run writes its own immutable files, and a small marker
written last (atomically) is the only thing that makes them visible. A crash leaves
unmarked files that no reader opens; a rerun of a run id commits a new attempt and only
then deletes the old one, so a reader sees one attempt of each run id, never two, never
half of one. Exact parts are sorted by digest with small row groups: the key range of each
part (in the marker) and of each row group (Parquet statistics of ``hi``) let a lookup open
only the parts and read only the row groups that can hold the queried digests.

    <store>/STORE.json                                     settings the store was built with
    <store>/commits/<run_id>/<attempt>.json                commit markers (listed cheaply)
    <store>/runs/<run_id>/<attempt>/exact-<part>.parquet   hi, lo (uint64), record_id; sorted
    <store>/runs/<run_id>/<attempt>/vectors-<part>.parquet hi, lo, record_id, x (values)

One writer per run id at a time; runs with different ids may write concurrently.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import ml_dtypes  # noqa: F401  (registers bfloat16 & co. with numpy: np.dtype("bfloat16"))
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transforms import fs

FORMAT = "tensordedup-fingerprint-store"
VERSION = 1
ROW_GROUP_ROWS = 8192  # exact parts: a lookup reads whole row groups, so keep them small
VECTOR_GROUP_BYTES = 16 << 20  # vectors parts: bounds the memory of one row group
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,99}")
DTYPE_KEY = b"tensordedup.dtype"
EXACT_COLUMNS = ["hi", "lo", "record_id"]
_KEY = np.dtype([("hi", np.uint64), ("lo", np.uint64)])
_U64_MAX = np.uint64(2**64 - 1)


class StoreError(ValueError):
    """The store cannot be used as asked (other settings, unknown format, missing part)."""


@dataclass(frozen=True)
class RunInfo:
    """A committed run: the newest committed attempt of its run id."""

    run_id: str
    attempt: str
    records: int  # rows in the exact parts
    committed_at: str  # ISO-8601 UTC
    committed_ns: int  # increases with every commit of the same run id
    parts: tuple[dict, ...]  # exact parts: file, rows, row_groups, min, max (32 hex digits)
    vector_parts: tuple[dict, ...]  # file, rows, dim
    extra: dict  # what the job recorded with the commit

    @property
    def has_vectors(self) -> bool:
        return bool(self.vector_parts)


@dataclass(frozen=True)
class Attempt:
    """One try at writing a run's records. Only strings, so Beam ships it to the workers
    that write the parts in parallel; writing a part again (a retried bundle) overwrites
    the same file."""

    root: str
    run_id: str
    name: str

    @property
    def path(self) -> str:
        return fs.join(self.root, "runs", self.run_id, self.name)

    def write_exact(self, part: int, words: np.ndarray, ids: pa.Array) -> dict:
        """Write one exact part sorted by digest; returns its stats for ``commit``."""
        words, ids = _checked(words, ids)
        order = np.lexsort((words[:, 1], words[:, 0]))
        words = words[order]
        name = f"exact-{part:05d}.parquet"
        self._write(name, _key_table(words, ids.take(pa.array(order))), ROW_GROUP_ROWS)
        n = len(words)
        return {"kind": "exact", "part": part, "file": name, "rows": n,
                "row_groups": max(1, -(-n // ROW_GROUP_ROWS)),
                "min": _hex(words[0]) if n else None, "max": _hex(words[-1]) if n else None}

    def write_vectors(self, part: int, words: np.ndarray, ids: pa.Array,
                      x: np.ndarray) -> dict:
        """Write one part of values ((n, d) in the input dtype, kept bit for bit)."""
        words, ids = _checked(words, ids)
        if x.ndim != 2 or len(x) != len(words):
            raise ValueError(f"x must be ({len(words)}, d), got {x.shape}")
        x = np.ascontiguousarray(x, x.dtype.newbyteorder("="))
        row_bytes = x.shape[1] * x.dtype.itemsize
        try:
            values, width = pa.array(x.reshape(-1), pa.from_numpy_dtype(x.dtype)), x.shape[1]
        except pa.ArrowNotImplementedError:  # bfloat16, complex: Arrow lacks them, keep bytes
            values, width = pa.array(x.reshape(-1).view(np.uint8)), row_bytes
        table = _key_table(words, ids).append_column(
            "x", pa.FixedSizeListArray.from_arrays(values, width))
        table = table.replace_schema_metadata({DTYPE_KEY: x.dtype.name.encode()})
        name = f"vectors-{part:05d}.parquet"
        self._write(name, table, max(1, VECTOR_GROUP_BYTES // max(row_bytes, 1)))
        return {"kind": "vectors", "part": part, "file": name, "rows": len(x),
                "dim": x.shape[1]}

    def _write(self, name: str, table: pa.Table, row_group_rows: int) -> None:
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, row_group_size=row_group_rows, compression="zstd",
                       use_dictionary=False, write_statistics=["hi"])
        fs.write_bytes_atomic(fs.join(self.path, name), memoryview(buf.getvalue()))


class FingerprintStore:
    """A fingerprint store at a path on any Beam filesystem (see the module docstring).

    ``last_lookup_stats`` says what the last ``lookup`` touched: runs, parts (all of the
    runs' exact parts), parts_opened, row_groups (in all parts), row_groups_read,
    bytes_read (footers and column chunks read)."""

    def __init__(self, path: str):
        self.path = path
        self.last_lookup_stats: dict[str, int] = {}

    # settings

    def meta(self) -> dict | None:
        """The settings the store was built with (None before the first commit)."""
        path = self._file("STORE.json")
        if not fs.exists(path):
            return None
        doc = json.loads(fs.read_bytes(path))
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise StoreError(f"{path} is not a version-{VERSION} fingerprint store (format "
                             f"{doc.get('format')!r}, version {doc.get('version')!r}): use a "
                             "new store path or the tensordedup version that wrote it")
        return doc["meta"]

    def check_compatible(self, meta: dict) -> None:
        """Raise ``StoreError`` if the store was built with other settings (digests or
        values of another scheme, dtype or shape cannot be compared)."""
        stored = self.meta()
        if stored is None:
            return
        given = json.loads(json.dumps(meta))
        diffs = [f"{k}: store {_show(stored, k)}, this run {_show(given, k)}"
                 for k in sorted(set(stored) | set(given)) if _show(stored, k) != _show(given, k)]
        if diffs:
            raise StoreError(f"fingerprint store {self.path} was built with other settings "
                             f"({'; '.join(diffs)}): use a new store path, or this store's "
                             "settings")

    # runs

    def runs(self, exclude: str | None = None) -> list[RunInfo]:
        """Committed runs (newest committed attempt of each run id), oldest commit first."""
        return sorted((_run_info(m) for r, m in self._committed("*").items() if r != exclude),
                      key=lambda r: (r.committed_ns, r.run_id))

    def begin(self, run_id: str) -> Attempt:
        """A new attempt of ``run_id``; nothing is visible until ``commit``."""
        _check_run_id(run_id)
        return Attempt(self.path, run_id, f"{time.time_ns():020d}-{secrets.token_hex(4)}")

    def commit(self, attempt: Attempt, parts_stats: list[dict], meta: dict,
               extra: dict | None = None) -> None:
        """Make ``attempt`` the run's visible contribution, replacing earlier attempts.

        ``parts_stats``: what ``write_exact``/``write_vectors`` returned, one per part.
        Order: store settings (checked, written on first commit), the marker (atomic),
        then the other attempts of the run id are deleted, markers first."""
        if attempt.root != self.path:
            raise ValueError(f"attempt of store {attempt.root}, not {self.path}")
        if self.meta() is None:
            fs.write_bytes_atomic(self._file("STORE.json"), _dumps(
                {"format": FORMAT, "version": VERSION, "meta": meta}))
        self.check_compatible(meta)  # also catches a concurrent first commit that won
        exact, vectors = (self._parts(attempt, parts_stats, k) for k in ("exact", "vectors"))
        prior = self._committed(attempt.run_id).get(attempt.run_id)
        ns = max(time.time_ns(), prior["committed_ns"] + 1 if prior else 0)
        fs.write_bytes_atomic(self._marker(attempt.run_id, attempt.name), _dumps({
            "format": FORMAT, "version": VERSION, "run_id": attempt.run_id,
            "attempt": attempt.name, "committed_ns": ns,
            "committed_at": datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(
                timespec="microseconds"),
            "records": sum(p["rows"] for p in exact), "exact": exact, "vectors": vectors,
            "extra": extra or {}}))
        self._prune(attempt.run_id, attempt.name)

    def cleanup_uncommitted(self, run_id: str) -> None:
        """Delete the attempts of ``run_id`` that are not its visible one (crashed or
        abandoned writes); the visible attempt, if any, stays."""
        _check_run_id(run_id)
        visible = self._committed(run_id).get(run_id)
        self._prune(run_id, visible["attempt"] if visible else None)

    # reads

    def lookup(self, words: np.ndarray, exclude_run: str | None = None
               ) -> tuple[np.ndarray, pa.Array, pa.Array]:
        """For each (hi, lo) digest: (found, stored record id, run id), nulls where not
        found. A digest in several runs gets the earliest committed one. Only the row
        groups whose key range holds a pending query digest are read, one at a time."""
        words = _words(words)
        order = np.lexsort((words[:, 1], words[:, 0]))
        keys, his = _keys(words)[order], words[order, 0]
        pending = np.ones(len(words), bool)
        runs = self.runs(exclude=exclude_run)
        stats = dict.fromkeys(("runs", "parts", "parts_opened", "row_groups",
                               "row_groups_read", "bytes_read"), 0)
        stats["runs"] = len(runs)
        hit_q, hit_ids, hit_run = [], [], []
        for r, run in enumerate(runs):
            for part in run.parts:
                stats["parts"] += 1
                stats["row_groups"] += part["row_groups"]
                if not part["rows"]:
                    continue
                a = np.searchsorted(keys, _key(part["min"]), "left")
                b = np.searchsorted(keys, _key(part["max"]), "right")
                if not pending[a:b].any():
                    continue
                path = self._data(run, part["file"])
                for q, ids in _search_part(path, keys, his, pending, stats):
                    hit_q.append(q)
                    hit_ids.append(ids)
                    hit_run.append(np.full(len(q), r))
        self.last_lookup_stats = stats
        found = np.zeros(len(words), bool)
        take, run_of = np.full(len(words), -1), np.full(len(words), -1)
        if hit_q:
            q = order[np.concatenate(hit_q)]
            found[q] = True
            take[q] = np.arange(len(q))
            run_of[q] = np.concatenate(hit_run)
        ids = pa.concat_arrays(hit_ids) if hit_ids else pa.array([], pa.string())
        run_ids = pa.array([run.run_id for run in runs], pa.string())
        return (found, ids.take(pa.array(take, pa.int64(), mask=take < 0)),
                run_ids.take(pa.array(run_of, pa.int64(), mask=run_of < 0)))

    def vectors(self, exclude_run: str | None = None, batch_rows: int = 65536
                ) -> Iterator[tuple[np.ndarray, pa.Array, pa.Array, np.ndarray]]:
        """All stored values, oldest run first, in batches: (words (n, 2) uint64, record
        ids, run ids, x (n, d) in the stored dtype, a read-only view of Arrow memory)."""
        for run in self.runs(exclude=exclude_run):
            run_id = pa.scalar(run.run_id, pa.string())
            for part in run.vector_parts:
                with fs.open_read(self._data(run, part["file"])) as f:
                    pf = pq.ParquetFile(f)
                    dtype = np.dtype(pf.schema_arrow.metadata[DTYPE_KEY].decode())
                    for batch in pf.iter_batches(batch_size=batch_rows):
                        x = batch["x"].flatten().to_numpy(zero_copy_only=False)
                        yield (_batch_words(batch), batch["record_id"],
                               pa.repeat(run_id, len(batch)),
                               x.view(dtype).reshape(-1, part["dim"]))

    # layout

    def _file(self, *parts: str) -> str:
        return fs.join(self.path, *parts)

    def _marker(self, run_id: str, attempt: str) -> str:
        return self._file("commits", run_id, f"{attempt}.json")

    def _data(self, run: RunInfo, name: str) -> str:
        return self._file("runs", run.run_id, run.attempt, name)

    def _committed(self, run_id: str) -> dict[str, dict]:
        """Run id -> marker of its visible attempt (latest commit), for ``run_id`` or "*"."""
        newest: dict[str, dict] = {}
        for path in fs.match(self._file("commits", run_id, "*.json")):
            try:
                m = json.loads(fs.read_bytes(path))
            except OSError:
                if fs.exists(path):
                    raise
                continue  # deleted by a commit that replaced it since the listing
            old = newest.get(m["run_id"])
            if old is None or (m["committed_ns"], m["attempt"]) > (old["committed_ns"],
                                                                   old["attempt"]):
                newest[m["run_id"]] = m
        return newest

    def _parts(self, attempt: Attempt, stats: list[dict], kind: str) -> list[dict]:
        parts = sorted((s for s in stats if s["kind"] == kind), key=lambda s: s["part"])
        for a, b in zip(parts, parts[1:], strict=False):
            if a["part"] == b["part"]:
                raise StoreError(f"run {attempt.run_id}: {kind} part {a['part']} reported "
                                 "twice: pass each part's stats once")
        for p in parts:
            if not fs.exists(fs.join(attempt.path, p["file"])):
                raise StoreError(f"run {attempt.run_id}: {p['file']} is missing from attempt "
                                 f"{attempt.name}: it was never written; rerun the job")
        return parts

    def _prune(self, run_id: str, keep: str | None) -> None:
        """Delete every attempt of ``run_id`` but ``keep``: markers (and leftover temporary
        markers) first, so each turns invisible before its files go."""
        keep_marker = self._marker(run_id, keep) if keep else None
        for path in fs.match(self._file("commits", run_id, "*")):
            if path != keep_marker:
                fs.delete_tree(path)
        prefix = self._file("runs", run_id)
        attempts = {p[len(prefix):].lstrip("/").split("/")[0]
                    for p in fs.match(fs.join(prefix, "**"))}
        for name in sorted(attempts - {keep}):
            fs.delete_tree(fs.join(prefix, name))


def _search_part(path: str, keys: np.ndarray, his: np.ndarray, pending: np.ndarray,
                 stats: dict[str, int]) -> list[tuple[np.ndarray, pa.Array]]:
    """Find the pending sorted query ``keys`` in one exact part, reading only the row
    groups whose ``hi`` statistics range holds one; marks the found ones not pending.
    Returns (sorted query positions, their record ids) per row group with hits."""
    hits = []
    with fs.open_read(path) as f:
        pf = pq.ParquetFile(f)
        md = pf.metadata
        stats["parts_opened"] += 1
        stats["bytes_read"] += md.serialized_size
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            lo, hi = _hi_range(rg.column(0).statistics)
            a, b = np.searchsorted(his, lo, "left"), np.searchsorted(his, hi, "right")
            q = a + np.flatnonzero(pending[a:b])
            if not len(q):
                continue
            table = pf.read_row_group(g, columns=EXACT_COLUMNS)
            stats["row_groups_read"] += 1
            stats["bytes_read"] += sum(rg.column(c).total_compressed_size for c in range(3))
            rows = _keys(_batch_words(table))
            at = np.minimum(np.searchsorted(rows, keys[q]), len(rows) - 1)
            hit = rows[at] == keys[q]
            if hit.any():
                pending[q[hit]] = False
                ids = table["record_id"].take(pa.array(at[hit])).combine_chunks()
                hits.append((q[hit], ids))
    return hits


def _hi_range(st: pq.Statistics | None) -> tuple[np.uint64, np.uint64]:
    """A row group's ``hi`` range; the whole key space if statistics are missing or not
    in unsigned order (min > max: a writer that compared uint64 as signed)."""
    if st is None or not st.has_min_max or st.min > st.max:
        return np.uint64(0), _U64_MAX
    return np.uint64(st.min), np.uint64(st.max)


def _check_run_id(run_id: str) -> None:
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"{run_id!r} is not a usable run id: letters, digits and . _ = -")


def _checked(words: np.ndarray, ids: pa.Array) -> tuple[np.ndarray, pa.Array]:
    words = _words(words)
    if len(ids) != len(words):
        raise ValueError(f"{len(words)} digests but {len(ids)} record ids")
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    return words, ids.cast(pa.string())


def _words(words: np.ndarray) -> np.ndarray:
    words = np.asarray(words)
    if words.dtype != np.uint64 or words.ndim != 2 or words.shape[1] != 2:
        raise ValueError(f"digests must be (n, 2) uint64 (hi, lo), got {words.shape} "
                         f"{words.dtype}: see transforms.exact.digest_words")
    return words


def _keys(words: np.ndarray) -> np.ndarray:
    """(n, 2) uint64 -> (n,) structured (hi, lo): sorts and searches as 128-bit numbers."""
    return np.ascontiguousarray(words).view(_KEY).reshape(-1)


def _key(hex32: str) -> np.ndarray:
    return np.array((int(hex32[:16], 16), int(hex32[16:], 16)), _KEY)


def _hex(word: np.ndarray) -> str:
    return f"{int(word[0]):016x}{int(word[1]):016x}"


def _key_table(words: np.ndarray, ids: pa.Array) -> pa.Table:
    return pa.table({"hi": np.ascontiguousarray(words[:, 0]),
                     "lo": np.ascontiguousarray(words[:, 1]), "record_id": ids})


def _batch_words(batch: pa.Table | pa.RecordBatch) -> np.ndarray:
    return np.column_stack([batch["hi"].to_numpy(), batch["lo"].to_numpy()])


def _run_info(m: dict) -> RunInfo:
    return RunInfo(m["run_id"], m["attempt"], m["records"], m["committed_at"],
                   m["committed_ns"], tuple(m["exact"]), tuple(m["vectors"]), m["extra"])


def _show(doc: dict, key: str) -> str:
    return json.dumps(doc[key], sort_keys=True) if key in doc else "absent"


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()
