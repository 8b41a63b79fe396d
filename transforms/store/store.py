"""Fingerprint store: the digests (and optionally the values) of every record that earlier
runs kept, so that a new run also removes what history already holds (incremental dedup).

Why this layout: each attempt of a run writes its own immutable files, and a small marker
written last (atomically) is the only thing that makes them visible. A crash leaves
unmarked files that no reader opens; a rerun of a run id commits a new attempt and only
then deletes the old one, so a reader sees one attempt of each run id, never two, never
half of one.

Exact digests live in digest segments (``transforms.store.segment``): sorted fixed-width
files that a lookup reads by byte ranges, about one 4 KiB bucket per queried digest. Each
run writes one segment per digest-range part; ``compact`` merges runs' segments, size
tier by size tier (``FANIN`` of a tier make one of the next), so a lookup opens a few
segments per part however many runs the store holds, and reads about the same bytes for
N new digests whatever the history. A compaction is committed like a run (its marker
names the run attempts it covers); each visible attempt is served by the newest
compaction covering it, or by its own segments; rows of replaced attempts in a compacted
segment are skipped by lookups and dropped by the next merge.

    <store>/STORE.json                                     settings the store was built with
    <store>/commits/<run_id>/<attempt>.json                commit markers (listed cheaply)
    <store>/runs/<run_id>/<attempt>/exact-<part>.seg       this run's digests, sorted
    <store>/runs/<run_id>/<attempt>/vectors-<part>.parquet hi, lo, record_id, x or sets (jaccard)
    <store>/compactions/<id>.json                          compaction markers
    <store>/compacted/<id>/exact-<part>.seg                merged digests of several runs

One writer at a time (a run's Publish step or ``compact``), enforced for jobs by the
store's lease (``<store>/LEASE.json``, ``transforms.io.lease``, taken by a job that updates
the store before it plans its lookups); readers may run alongside only while nothing
compacts.

What an attempt writes (its part files) is ``transforms.store.parts``; the reads (lookup
plans, lookups, stored values) are ``transforms.store.reads``.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from transforms.io import fs, layout
from transforms.store import segment as digest_segment
from transforms.store.parts import DTYPE_KEY, Attempt, digest_bounds, digest_key
from transforms.store.reads import (
    LookupPlan,
    SegmentRef,
    StoreError,
    StoreReads,
    compaction_pairs,
)
from transforms.store.segment import range_part

# The store's public names; Attempt, SegmentRef, LookupPlan and DTYPE_KEY are defined in
# store_parts and store_reads, and imported from here.
__all__ = ["FORMAT", "VERSION", "FANIN", "RUN_ID", "DTYPE_KEY", "StoreError", "RunInfo",
           "Attempt", "SegmentRef", "LookupPlan", "FingerprintStore"]

FORMAT = "tensordedup-fingerprint-store"
VERSION = 2
FANIN = 4  # compaction: this many units of one size tier merge into one of the next
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,99}")


@dataclass(frozen=True)
class RunInfo:
    """A committed run: the newest committed attempt of its run id."""

    run_id: str
    attempt: str
    records: int  # rows in the exact parts
    committed_at: str  # ISO-8601 UTC
    committed_ns: int  # increases with every commit of the same run id
    parts: tuple[dict, ...]  # exact parts: file, rows, min, max (32 hex digits)
    vector_parts: tuple[dict, ...]  # file, rows, dim
    extra: dict  # what the job recorded with the commit

    @property
    def has_vectors(self) -> bool:
        return bool(self.vector_parts)


class FingerprintStore(StoreReads):
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
        path = self._file(layout.STORE_META)
        if not fs.exists(path):
            if fs.match(self._file("commits", "*", "*.json")):  # not a new store: one
                # that lost its settings would take values of any kind and relabel itself
                raise StoreError(f"{path} is missing, but the store holds committed runs: "
                                 "restore it from a copy, or use a new store path")
            return None
        doc = _json_doc(path)
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise StoreError(f"{path} is not a version-{VERSION} fingerprint store (format "
                             f"{doc.get('format')!r}, version {doc.get('version')!r}): use a "
                             "new store path or the tensordedup version that wrote it")
        return doc["meta"]

    def check_compatible(self, meta: dict) -> dict | None:
        """Raise ``StoreError`` if the store was built with other settings (digests or
        values of another scheme, dtype or shape cannot be compared); else the store's
        settings (``meta``: None before its first commit)."""
        stored = self.meta()
        if stored is None:
            return None
        given = json.loads(json.dumps(meta))
        diffs = [f"{k}: store {_show(stored, k)}, this run {_show(given, k)}"
                 for k in sorted(set(stored) | set(given)) if _show(stored, k) != _show(given, k)]
        if diffs:
            raise StoreError(f"fingerprint store {self.path} was built with other settings "
                             f"({'; '.join(diffs)}): use a new store path, or this store's "
                             "settings")
        return stored

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
        then the other attempts of the run id are deleted, markers first. Committing an
        attempt again is a no-op but for that cleanup (Dataflow may rerun Publish)."""
        if attempt.root != self.path:
            raise ValueError(f"attempt of store {attempt.root}, not {self.path}")
        if self.meta() is None:
            fs.write_bytes_atomic(self._file(layout.STORE_META), _dumps(
                {"format": FORMAT, "version": VERSION, "meta": meta}))
        self.check_compatible(meta)  # also catches a concurrent first commit that won
        exact, vectors = (self._parts(attempt, parts_stats, k) for k in ("exact", "vectors"))
        if fs.exists(self._marker(attempt.run_id, attempt.name)):
            # committed by an earlier call (a retried Publish): keep that marker and its
            # place in the commit order, finish what may not have been done
            self._prune(attempt.run_id, {attempt.run_id: attempt.name})
            return
        prior = self._committed(attempt.run_id).get(attempt.run_id)
        ns = max(time.time_ns(), prior["committed_ns"] + 1 if prior else 0)
        fs.write_bytes_atomic(self._marker(attempt.run_id, attempt.name), _dumps({
            "format": FORMAT, "version": VERSION, "run_id": attempt.run_id,
            "attempt": attempt.name, "committed_ns": ns,
            "committed_at": datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(
                timespec="microseconds"),
            "records": sum(p["rows"] for p in exact), "exact": exact, "vectors": vectors,
            "extra": extra or {}}))
        self._prune(attempt.run_id, {attempt.run_id: attempt.name})

    def is_committed(self, attempt: Attempt) -> bool:
        """Whether ``attempt``'s marker is written (it may be the visible one, or have been
        replaced by a later attempt's since)."""
        return fs.exists(self._marker(attempt.run_id, attempt.name))

    def committed(self, run_id: str) -> dict | None:
        """The visible commit of ``run_id`` ({"records", "committed_at"}), or None: a run
        of that id replaces it."""
        _check_run_id(run_id)
        m = self._committed(run_id).get(run_id)
        return None if m is None else {"records": m["records"],
                                       "committed_at": m["committed_at"]}

    def cleanup_uncommitted(self) -> None:
        """Delete every run id's attempts that are not its visible one (crashed or
        abandoned writes, d x 4 bytes a record for a near store); visible attempts stay.
        Only for a run that holds the store's lease: no other writer can be under way.
        Every run id's, as a stopped run's attempt was left until that run id ran again
        (a dated run id: never)."""
        self._prune("*", {r: m["attempt"] for r, m in self._committed("*").items()})

    # reads: plan, lookup and vectors (StoreReads, transforms.store.reads)

    # compaction

    def compact(self, fanin: int | None = None) -> dict[str, int]:
        """Merge the digest segments of ``fanin`` units (run attempts or compactions) of
        one size tier (rows in [fanin**t, fanin**(t+1))) into one unit, lowest tier first,
        until no tier holds ``fanin``; then delete what the merges replaced. Each record
        is rewritten about log_fanin(history / run size) times over the store's life.
        Returns {"merges", "rows"} (rows written). ``fanin``: default ``FANIN``."""
        fanin = FANIN if fanin is None else fanin
        if fanin < 2:
            raise ValueError(f"fanin must be at least 2, got {fanin}")
        done = {"merges": 0, "rows": 0}
        self._collect_garbage()
        while due := self._due(fanin):
            done["rows"] += self._merge(due)
            done["merges"] += 1
            self._collect_garbage()
        return done

    def _due(self, fanin: int) -> list[SegmentRef]:
        """The segments of the lowest size tier holding ``fanin`` units, or []."""
        units: dict[str, list[SegmentRef]] = {}
        for seg in self.plan().segments:
            units.setdefault(seg.unit, []).append(seg)
        tiers: dict[int, list[str]] = {}
        for unit, segs in units.items():
            rows = sum(s.rows for s in segs)
            tiers.setdefault(int(np.log(max(rows, 1)) / np.log(fanin) + 1e-9), []).append(unit)
        for tier in sorted(tiers):
            if len(tiers[tier]) >= fanin:
                return [s for unit in tiers[tier] for s in units[unit]]
        return []

    def _merge(self, segments: list[SegmentRef]) -> int:
        """Write the live rows of ``segments`` as one compaction, range-parted like the
        widest unit's parts, and commit it with a marker. Returns rows written."""
        cid = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
        pairs = sorted({(r, a, k) for s in segments for r, a, k in s.serves},
                       key=lambda p: p[2])
        index = {(r, a): i for i, (r, a, _) in enumerate(pairs)}
        nparts = max(Counter(s.unit for s in segments).values())
        spans = [range_part(np.array([digest_key(s.min)["hi"], digest_key(s.max)["hi"]]), nparts)
                 for s in segments]  # the output parts each segment's key range overlaps
        parts = []
        for part in range(nparts):
            words, run, ids = [], [], []
            for seg, (lo, hi) in zip(segments, spans, strict=True):
                if not lo <= part <= hi:
                    continue
                keys, r, seg_ids, table = digest_segment.read_all(seg.path)
                mine = {(ru, a) for ru, a, _ in seg.serves}
                to = np.array([index[p] if p in mine else -1 for p in map(tuple, table)] + [-1])
                r = to[r.astype(np.int64)]
                rows = (r >= 0) & (range_part(keys["hi"], nparts) == part)
                words.append(np.column_stack([keys["hi"][rows], keys["lo"][rows]]))
                run.append(r[rows])
                ids.append(seg_ids.filter(pa.array(rows)))
            w = np.concatenate(words) if words else np.empty((0, 2), np.uint64)
            name = f"exact-{part:05d}.seg"
            fs.write_bytes_atomic(self._file("compacted", cid, name), digest_segment.encode(
                w, np.concatenate(run) if run else np.empty(0, np.uint32),
                pa.concat_arrays(ids) if ids else pa.array([], pa.large_string()),
                [(r, a) for r, a, _ in pairs]))
            parts.append({"part": part, "file": name, **digest_bounds(w)})
        ns = time.time_ns()
        fs.write_bytes_atomic(self._file("compactions", f"{cid}.json"), _dumps({
            "format": FORMAT, "version": VERSION, "id": cid, "committed_ns": ns,
            "covers": [[r, a] for r, a, _ in pairs], "parts": parts}))
        return sum(p["rows"] for p in parts)

    def _collect_garbage(self) -> None:
        """Delete what no plan reads: compactions that serve no visible attempt (marker
        first), compaction files without a marker (a merge that crashed), and the own
        segments of attempts a compaction serves."""
        runs, served, compactions = self._resolve(None)
        serving = set(served.values())
        for c in compactions:
            if c["id"] not in serving:
                fs.delete(self._file("compactions", f"{c['id']}.json"))
                fs.delete_tree(self._file("compacted", c["id"]))
        prefix = self._file("compacted")
        for cid in {p[len(prefix):].lstrip("/").split("/")[0]
                    for p in fs.match(fs.join(prefix, "**"))} - serving:
            fs.delete_tree(fs.join(prefix, cid))
        stale = set(fs.match(self._file("runs", "*", "*", "exact-*.seg")))
        for r in runs:
            if (r.run_id, r.attempt) in served:
                for p in r.parts:
                    if (path := self._data(r, p["file"])) in stale:
                        fs.delete(path)

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
        for m in _read_markers(self._file("commits", run_id, "*.json")):
            old = newest.get(m["run_id"])
            if old is None or (m["committed_ns"], m["attempt"]) > (old["committed_ns"],
                                                                   old["attempt"]):
                newest[m["run_id"]] = m
        return newest

    def _resolve(self, exclude_run: str | None
                 ) -> tuple[list[RunInfo], dict[tuple[str, str], str], list[dict]]:
        """Visible runs (oldest first), which compaction serves each attempt (the newest
        covering it), and the compaction markers (newest first)."""
        runs = self.runs(exclude=exclude_run)
        visible = {(r.run_id, r.attempt) for r in runs}
        compactions = sorted(_read_markers(self._file("compactions", "*.json")),
                             key=lambda c: (c["committed_ns"], c["id"]), reverse=True)
        served: dict[tuple[str, str], str] = {}
        for c in compactions:
            for pair in compaction_pairs(c):
                if pair in visible:
                    served.setdefault(pair, c["id"])
        return runs, served, compactions

    def _parts(self, attempt: Attempt, stats: list[dict], kind: str) -> list[dict]:
        """This attempt's parts of one kind, checked: each reported once, each written."""
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

    def _prune(self, run_id: str, keep: dict[str, str]) -> None:
        """Delete every attempt of ``run_id`` ("*": of every run id) but the one ``keep``
        names for its run id: markers (and leftover temporary markers) first, so each
        turns invisible before its files go. One listing of each kind, whatever the run
        ids."""
        for path in fs.match(self._file("commits", run_id, "*")):
            rid = path.rstrip("/").split("/")[-2]
            if rid not in keep or path != self._marker(rid, keep[rid]):
                fs.delete_tree(path)
        prefix = self._file("runs")
        attempts = {tuple(p[len(prefix):].lstrip("/").split("/")[:2])
                    for p in fs.match(fs.join(prefix, run_id, "**"))}
        for rid, name in sorted(attempts):
            if keep.get(rid) != name:
                fs.delete_tree(fs.join(prefix, rid, name))


def _read_markers(pattern: str) -> list[dict]:
    """The JSON markers matching ``pattern``, skipping any deleted since the listing."""
    docs = []
    for path in fs.match(pattern):
        try:
            docs.append(_json_doc(path))
        except OSError:
            if fs.exists(path):
                raise
    return docs


def _json_doc(path: str) -> dict:
    """A store's JSON file (its settings, a commit marker), or StoreError naming it: both
    are written whole, at once, so a damaged one was changed from outside."""
    data = fs.read_bytes(path)
    try:
        doc = json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise StoreError(f"{path} is damaged ({len(data):,} bytes, not JSON: {e}): restore "
                         "it from a copy, or use a new store path") from None
    if not isinstance(doc, dict):
        raise StoreError(f"{path} is damaged (JSON, but not an object): restore it from a "
                         "copy, or use a new store path")
    return doc


def _check_run_id(run_id: str) -> None:
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"{run_id!r} is not a usable run id: letters, digits and . _ = -")



def _run_info(m: dict) -> RunInfo:
    return RunInfo(m["run_id"], m["attempt"], m["records"], m["committed_at"],
                   m["committed_ns"], tuple(m["exact"]), tuple(m["vectors"]), m["extra"])


def _show(doc: dict, key: str) -> str:
    return json.dumps(doc[key], sort_keys=True) if key in doc else "absent"


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()
