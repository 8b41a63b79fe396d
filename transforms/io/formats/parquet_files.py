"""Parquet files as the format's readers and writer open them: the file (local, or a
seekable reader for other filesystems), its row groups in a range, and whole row
groups read ahead in other threads, each thread with its own reader.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.io import fs
from transforms.io.formats.ahead import depth, in_order

AHEAD_BYTES = 256 << 20  # row groups being read ahead hold at most this (at least one group)
# Values decoded per call: Arrow's reader allocates each call's levels and values afresh,
# and 64-100 MB of them went back to the OS and were faulted in (zeroed) again on every
# call: 1M x 384 float32 lists decoded in 3.1-4.0 s as 43,690-row batches, 2.7-2.8 s as
# 8,192; a 65,536-row group of them in 0.21 s whole, 0.16 s in 8 MB batches.
DECODE_BYTES = 8 << 20


def open_file(path: str) -> pq.ParquetFile | Exception:
    """The file's reader, or the error that kept it from opening (the caller reports it).
    Local files are read without pre-buffering: Arrow's coalesced read of a whole column
    chunk into a new buffer saves requests on object stores, but from local disk it only
    copies: reading 3 M rows x 128 float32 took 1.3 s without it against 1.6-1.9 s."""
    try:
        if fs.is_local(path):
            return pq.ParquetFile(path, pre_buffer=False)
        return pq.ParquetFile(fs.open_read(path))
    except (OSError, pa.ArrowException) as e:
        return e


def row_groups(pf: pq.ParquetFile, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """(index, first position, rows) of the row groups inside [start, stop)."""
    offset = 0
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        if start <= offset and offset + n <= stop:
            yield i, offset, n
        offset += n


_readers = threading.local()


def read_group(path: str, rg: int, first: int, n: int, columns: list[str] | None,
               then: Callable[[pa.Table, int, int], pa.Table] | None = None
               ) -> tuple[int, int, int, pa.Table | Exception]:
    """(row group, first position, rows, its table or the read error), read with this
    thread's own reader of ``path`` (a remote file's reader seeks: threads can't share
    one); ``then(table, first, n)`` runs here too, beside the caller."""
    files = _readers.__dict__.setdefault("files", {})
    if path not in files:
        files[path] = open_file(path)
    pf = files[path]
    try:
        if isinstance(pf, Exception):
            raise pf
        table = _decoded(pf, rg, columns)
    except (OSError, pa.ArrowException) as e:
        return rg, first, n, e
    return rg, first, n, table if then is None else then(table, first, n)


def _decoded(pf: pq.ParquetFile, rg: int, columns: list[str] | None) -> pa.Table:
    """A whole row group, decoded about DECODE_BYTES at a time (a table of several
    chunks: nothing is copied to join them)."""
    meta = pf.metadata.row_group(rg)
    step = max(1, DECODE_BYTES * meta.num_rows // max(1, meta.total_byte_size))
    batches = list(pf.iter_batches(batch_size=step, row_groups=[rg], columns=columns))
    return pa.Table.from_batches(batches) if batches else pf.read_row_group(rg, columns=columns)


def ahead_depth(pf: pq.ParquetFile, groups: list[tuple[int, int, int]]) -> int:
    """How many of ``groups`` to read at once ahead of the caller: ``ahead.depth()``,
    fewer when that many of the largest would hold more than ``AHEAD_BYTES`` decoded (a
    row group of wide tensors can be GBs), never fewer than one."""
    largest = max((pf.metadata.row_group(rg).total_byte_size for rg, _, _ in groups),
                  default=0)
    return max(1, min(depth(), AHEAD_BYTES // max(largest, 1)))


def read_groups(path: str, pf: pq.ParquetFile, groups: list[tuple[int, int, int]],
                columns: list[str] | None = None,
                then: Callable[[pa.Table, int, int], pa.Table] | None = None
                ) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """(row group, first position, rows, table or the read error) for ``groups`` ((row
    group, first position, rows), as ``row_groups`` gives them), each whole, read ahead
    (``ahead_depth``; ``then`` runs in the reader)."""
    return in_order((partial(read_group, path, rg, first, n, columns, then)
                     for rg, first, n in groups), ahead_depth(pf, groups))


def prefetched(path: str, pf: pq.ParquetFile, start: int, stop: int,
               columns: list[str] | None = None,
               then: Callable[[pa.Table, int, int], pa.Table] | None = None
               ) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """``read_groups`` of the row groups in [start, stop)."""
    return read_groups(path, pf, list(row_groups(pf, start, stop)), columns, then)
