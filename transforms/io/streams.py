"""Spilled rows by key: one file of Arrow IPC streams, one stream per key, read back by
byte range. What the near stages shuffle is then a (path, offset, size) per key and file,
not the rows (the local runner holds a shuffle in memory).

Why streams and not one IPC file: a reader of one key would parse a footer listing every
key's batch (1,278 cells x 16 chunks x 1,278 entries at 1M rows).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Protocol

import pyarrow as pa

from transforms.io import fs


class Span(Protocol):
    path: str
    offset: int
    size: int


def write_streams(path: str, rb: pa.RecordBatch, runs: Sequence[tuple[int, int]]
                  ) -> list[tuple[int, int]]:
    """Write rows ``[lo, hi)`` of ``rb`` for each run as a stream of its own, one after
    another in ``path``; returns each run's (offset, size) in the file."""
    out = []
    with fs.local_file_for(path) as local, pa.OSFile(local, "wb") as sink:
        for lo, hi in runs:
            at = sink.tell()
            with pa.ipc.new_stream(sink, rb.schema) as writer:
                writer.write_batch(rb.slice(lo, hi - lo))
            out.append((at, sink.tell() - at))
    return out


def read_streams(spans: Iterable[Span]) -> list[tuple[Span, pa.RecordBatch]]:
    """Each span's rows, in (path, offset) order, each file opened once."""
    out = []
    for path, group in itertools.groupby(sorted(spans, key=lambda c: (c.path, c.offset)),
                                         key=lambda c: c.path):
        with fs.open_read(path) as f:
            for c in group:
                f.seek(c.offset)
                out.append((c, pa.ipc.open_stream(pa.py_buffer(f.read(c.size))).read_next_batch()))
    return out
