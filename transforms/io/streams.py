"""Spilled rows by key: one file of Arrow IPC streams, one stream per key, read back by
byte range. What the near stages shuffle is then a (path, offset, size) per key and file,
not the rows (the local runner holds a shuffle in memory).

Why streams and not one IPC file: a reader of one key would parse a footer listing every
key's batch (1,278 cells x 16 chunks x 1,278 entries at 1M rows).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import pyarrow as pa

from transforms.io import fs

REMOTE_READS = 16  # object store files read at once (each read waits a round trip)


class Span(Protocol):
    path: str
    offset: int
    size: int


def write_streams(path: str, rb: pa.RecordBatch, runs: Sequence[tuple[int, int]]
                  ) -> list[tuple[int, int]]:
    """Write rows ``[lo, hi)`` of ``rb`` for each run as a stream of its own, one after
    another in ``path``; returns each run's (offset, size) in the file."""
    with fs.local_file_for(path) as local, pa.OSFile(local, "wb") as sink:
        return _write_runs(sink, rb, runs)


def stream_bytes(rb: pa.RecordBatch, runs: Sequence[tuple[int, int]]) -> list[bytes]:
    """Rows ``[lo, hi)`` of ``rb`` for each run as the bytes of a stream of its own (what
    ``write_streams`` writes, kept in memory: rows that travel in a runner's shuffle)."""
    sink = pa.BufferOutputStream()
    spans = _write_runs(sink, rb, runs)
    whole = sink.getvalue()
    return [whole.slice(at, size).to_pybytes() for at, size in spans]


def _write_runs(sink: pa.NativeFile, rb: pa.RecordBatch, runs: Sequence[tuple[int, int]]
                ) -> list[tuple[int, int]]:
    out = []
    for lo, hi in runs:
        at = sink.tell()
        with pa.ipc.new_stream(sink, rb.schema) as writer:
            writer.write_batch(rb.slice(lo, hi - lo))
        out.append((at, sink.tell() - at))
    return out


def read_stream_bytes(data: bytes) -> pa.RecordBatch:
    """The record batch of one stream's bytes (``stream_bytes``)."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()


def read_streams(spans: Iterable[Span]) -> list[tuple[Span, pa.RecordBatch]]:
    """Each span's rows, in (path, offset) order, each file opened once. On an object store
    each span is one ranged read of its bytes, and the files are read by REMOTE_READS
    threads at once: a cell holds a slice of nearly every chunk's file (tens of thousands
    at a billion records), and one after another each would wait a round trip."""
    groups = [list(g) for _, g in itertools.groupby(
        sorted(spans, key=lambda c: (c.path, c.offset)), key=lambda c: c.path)]
    if len(groups) < 2 or all(fs.is_local(g[0].path) for g in groups):
        return [r for g in groups for r in _read_file(g)]
    with ThreadPoolExecutor(min(REMOTE_READS, len(groups))) as pool:
        return [r for rows in pool.map(_read_file, groups) for r in rows]


def _read_file(spans: list[Span]) -> list[tuple[Span, pa.RecordBatch]]:
    """Spans of one file, in offset order."""
    with fs.open_ranged(spans[0].path) as f:  # a cell's slice: kilobytes, not 16 MB
        out = []
        for c in spans:
            f.seek(c.offset)
            out.append((c, read_stream_bytes(f.read(c.size))))
        return out
