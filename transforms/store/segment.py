"""Digest segments: sorted, fixed-width files of (digest, run, record id) that a lookup reads
by byte ranges, so asking about N digests reads about N small pages, however large the
segment is (a Parquet scan reads every row group once N is a sizeable fraction of them).

Why fixed width: row i of every column sits at a computable offset, so a lookup fetches
only the buckets (about ``BUCKET_ROWS`` rows, 4 KiB of keys) that can hold its digests,
then the run and record id of its hits, all through ``seek``/``read`` on any Beam
filesystem. Digests are uniform hashes, so bucket b simply holds the rows whose ``hi``
bits after the ``skip`` top bits that all its digests share (a range part of the job's
shards shares a few) equal b; a directory of bucket start rows replaces a search.

    header   MAGIC, rows, bucket bits, skip, runs-table length (u64 each)
    runs     JSON list of [run_id, attempt]: what the ``run`` column indexes
    dir      (2**bits + 1) u64: first row of each bucket
    keys     rows x (hi, lo) u64, sorted
    run      rows x u32
    offs     (rows + 1) u64: record id i is blob[offs[i]:offs[i+1]] (UTF-8)
    blob
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from transforms.io import fs

MAGIC = b"TDSEG001"
BUCKET_ROWS = 256  # rows per bucket on average: 4 KiB of keys, the unit a lookup reads
KEY = np.dtype([("hi", "<u8"), ("lo", "<u8")])
_HEAD = np.dtype([("rows", "<u8"), ("bits", "<u8"), ("skip", "<u8"), ("runs_len", "<u8")])
_GAP_LOCAL, _GAP_REMOTE = 4 << 10, 4 << 20  # read through gaps this small (one request)


@dataclass(frozen=True)
class Layout:
    """Where each column of a segment starts (bytes from the file's start)."""

    rows: int
    bits: int
    skip: int
    runs: tuple[tuple[str, str], ...]
    dir: int
    keys: int
    run: int
    offs: int
    blob: int


def keys_of(words: np.ndarray) -> np.ndarray:
    """(n, 2) uint64 (hi, lo) -> (n,) structured keys: sort and compare as 128-bit numbers."""
    return np.ascontiguousarray(words, dtype="<u8").view(KEY).reshape(-1)


def bucket_bits(rows: int) -> int:
    """Directory size: about ``BUCKET_ROWS`` rows per bucket."""
    return max(0, int(np.ceil(np.log2(max(rows, 1) / BUCKET_ROWS))))


def bucket_of(hi: np.ndarray, bits: int, skip: int) -> np.ndarray:
    """The ``bits`` digest bits after the ``skip`` top bits the segment's digests share
    (0 when bits is 0). A digest outside the segment's range lands in some bucket and
    matches nothing there."""
    if not bits:
        return np.zeros(len(hi), np.uint64)
    return (hi << np.uint64(skip)) >> np.uint64(64 - bits)


def encode(words: np.ndarray, run: np.ndarray, ids: pa.Array,
           runs: list[tuple[str, str]]) -> bytes:
    """One segment's bytes. Rows are sorted here by (digest, run)."""
    keys = keys_of(words)
    run = np.asarray(run, "<u4")
    if not len(keys) == len(run) == len(ids):
        raise ValueError(f"{len(keys)} digests, {len(run)} run indexes, {len(ids)} ids")
    if len(run) and int(run.max()) >= len(runs):
        raise ValueError(f"run index {int(run.max())} but only {len(runs)} runs")
    order = np.lexsort((run, keys["lo"], keys["hi"]))
    keys, run = keys[order], run[order]
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    ids = ids.cast(pa.large_string()).take(pa.array(order, pa.int64()))
    skip = 64 - (int(keys["hi"][0]) ^ int(keys["hi"][-1])).bit_length() if len(keys) else 64
    bits = bucket_bits(len(keys)) if skip < 64 else 0
    directory = np.searchsorted(bucket_of(keys["hi"], bits, skip),
                                np.arange(2**bits + 1, dtype=np.uint64)).astype("<u8")
    offsets = np.frombuffer(ids.buffers()[1], np.int64, len(ids) + 1, ids.offset * 8)
    blob = ids.buffers()[2]
    start = int(offsets[0])
    body = json.dumps([list(r) for r in runs]).encode()
    head = np.array([(len(keys), bits, skip, len(body))], _HEAD).tobytes()
    return b"".join([MAGIC, head, body, directory.tobytes(), keys.tobytes(), run.tobytes(),
                     (offsets - start).astype("<u8").tobytes(),
                     b"" if blob is None else blob.slice(start, int(offsets[-1]) - start)])


def layout(f: BinaryIO) -> Layout:
    """Read a segment's header and runs table."""
    f.seek(0)
    start = f.read(len(MAGIC) + _HEAD.itemsize)
    if start[:len(MAGIC)] != MAGIC:
        raise ValueError(f"not a digest segment (starts with {start[:len(MAGIC)]!r})")
    rows, bits, skip, runs_len = (int(v) for v in np.frombuffer(start[len(MAGIC):], _HEAD)[0])
    runs = tuple(tuple(r) for r in json.loads(f.read(runs_len)))
    d = len(start) + runs_len
    keys = d + 8 * (2**bits + 1)
    run = keys + KEY.itemsize * rows
    offs = run + 4 * rows
    return Layout(rows, bits, skip, runs, d, keys, run, offs, offs + 8 * (rows + 1))


@dataclass
class Hits:
    """Matches of sorted query keys in one segment: query position, the segment's run
    index and the record id of each matching row (a digest may match several rows)."""

    query: np.ndarray
    run: np.ndarray
    ids: pa.Array
    runs: tuple[tuple[str, str], ...]  # the segment's runs table, which ``run`` indexes


def search(path: str, queries: np.ndarray, stats: dict[str, int] | None = None) -> Hits:
    """Find sorted, unique structured ``queries`` (``keys_of``) in the segment at ``path``,
    reading only the directory entries, buckets, runs and ids that can matter."""
    stats = {} if stats is None else stats
    gap = _GAP_LOCAL if fs.is_local(path) else _GAP_REMOTE
    with fs.open_ranged(path) as f:
        lay = layout(f)
        stats["bytes_read"] = stats.get("bytes_read", 0) + lay.dir
        if not lay.rows or not len(queries):
            return Hits(np.empty(0, np.int64), np.empty(0, np.uint32), pa.array([], pa.string()),
                        lay.runs)
        reader = _Ranges(f, gap, stats)
        wanted = np.unique(bucket_of(queries["hi"], lay.bits, lay.skip)).astype(np.int64)
        bounds = reader.rows(lay.dir, np.dtype("<u8"), np.stack([wanted, wanted + 1], 1).ravel())
        first, last = bounds[0::2].astype(np.int64), bounds[1::2].astype(np.int64)
        rows = reader.spans(lay.keys, KEY, first, last - first)
        row_no = _span_index(first, last - first)
        query, pos = _equal(rows, queries)
        at = row_no[pos]
        run = reader.rows(lay.run, np.dtype("<u4"), at)
        ends = reader.rows(lay.offs, np.dtype("<u8"), np.stack([at, at + 1], 1).ravel())
        a, b = ends[0::2].astype(np.int64), ends[1::2].astype(np.int64)
        data = reader.spans(lay.blob, np.dtype("u1"), a, b - a)
        offsets = np.concatenate([[0], np.cumsum(b - a)]).astype(np.int32)
        ids = pa.StringArray.from_buffers(len(at), pa.py_buffer(offsets), pa.py_buffer(data))
        return Hits(query, run, ids, lay.runs)


def read_all(path: str) -> tuple[np.ndarray, np.ndarray, pa.Array, tuple[tuple[str, str], ...]]:
    """A whole segment: (keys, run indexes, record ids, runs table), for compaction."""
    with fs.open_read(path) as f:
        lay = layout(f)
        f.seek(lay.keys)
        body = f.read()
    n = lay.rows
    base = lay.keys
    keys = np.frombuffer(body, KEY, n, 0)
    run = np.frombuffer(body, "<u4", n, lay.run - base)
    offs = np.frombuffer(body, "<u8", n + 1, lay.offs - base).astype(np.int64)
    blob = body[lay.blob - base:]
    ids = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(blob))
    return keys, run, ids, lay.runs


def _equal(rows: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(query, row) pairs of equal keys, both sorted: a search on ``hi`` alone (fast
    unsigned compares; a structured search is several times slower) then ``lo`` checked."""
    a = np.searchsorted(rows["hi"], queries["hi"], "left")
    b = np.searchsorted(rows["hi"], queries["hi"], "right")
    query = np.repeat(np.arange(len(queries)), b - a)
    pos = _span_index(a, b - a)
    same = rows["lo"][pos] == queries["lo"][query]
    return query[same], pos[same]


def _span_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + c)`` for each span, without a Python loop."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    if not total:
        return np.empty(0, np.int64)
    begin = np.cumsum(counts) - counts
    return np.repeat(np.asarray(starts, np.int64) - begin, counts) + np.arange(total)


class _Ranges:
    """Ranged reads of fixed-width rows: nearby spans are merged into one read (a seek is
    a request on an object store), and only the wanted bytes are kept."""

    def __init__(self, f: BinaryIO, gap: int, stats: dict[str, int]):
        self.f, self.gap, self.stats = f, gap, stats

    def rows(self, base: int, dtype: np.dtype, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` (any order, repeats allowed) of the column starting at ``base``."""
        index = np.asarray(index, np.int64)
        uniq, back = np.unique(index, return_inverse=True)
        return self.spans(base, dtype, uniq, np.ones(len(uniq), np.int64))[back]

    def spans(self, base: int, dtype: np.dtype, starts: np.ndarray, counts: np.ndarray
              ) -> np.ndarray:
        """Rows ``starts[i]:starts[i] + counts[i]`` for every i, concatenated in that order;
        ``starts`` must be ascending (as sorted queries give them)."""
        size = dtype.itemsize
        begin = base + np.asarray(starts, np.int64) * size
        end = begin + np.asarray(counts, np.int64) * size
        keep = end > begin
        begin, end = begin[keep], end[keep]
        if not len(begin):
            return np.empty(0, dtype)
        reach = np.maximum.accumulate(end)
        new = np.concatenate([[True], begin[1:] > reach[:-1] + self.gap])
        group = np.cumsum(new) - 1
        g_begin, g_end = begin[new], np.maximum.reduceat(end, np.flatnonzero(new))
        chunks = []
        for a, b in zip(g_begin.tolist(), g_end.tolist(), strict=True):
            self.f.seek(a)
            chunks.append(self.f.read(b - a))
        self.stats["reads"] = self.stats.get("reads", 0) + len(chunks)
        self.stats["bytes_read"] = self.stats.get("bytes_read", 0) + int((g_end - g_begin).sum())
        # every span and group starts a whole number of rows from ``base``: the joined
        # reads are themselves an array of rows
        rows = np.frombuffer(b"".join(chunks), dtype)
        g_base = (np.cumsum(g_end - g_begin) - (g_end - g_begin)) // size
        first = g_base[group] + (begin - g_begin[group]) // size
        return rows[_span_index(first, (end - begin) // size)]


def range_part(hi: np.ndarray, parts: int) -> np.ndarray:
    """Range parts of the digest's top bits: part p holds one contiguous slice of the
    sorted digest space (the job's shards, a compaction's parts)."""
    return ((np.asarray(hi, np.uint64) >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)
