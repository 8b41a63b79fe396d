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
from transforms.io.formats.base import error_line

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
    copies: reading 3 M rows x 128 float32 took 1.3 s without it against 1.6-1.9 s.
    Page CRCs are verified where the writer stored them (parquet-mr and Spark do by
    default): a page whose bytes changed is a read error, so its row group's records are
    invalid, never deduplicated (and copied) as other values. Reading 100 MB of float32
    lists took 0.176 s with it against 0.158 s."""
    try:
        if fs.is_local(path):
            return pq.ParquetFile(path, pre_buffer=False, page_checksum_verification=True)
        return pq.ParquetFile(fs.open_read(path), page_checksum_verification=True)
    except (OSError, pa.ArrowException) as e:
        return e


def total_rows(pf: pq.ParquetFile) -> int:
    """Rows of the file as its row groups hold them: what is read and copied. The
    footer's own count can disagree (parquet-testing's repeated_no_annotation.parquet
    says 0 for a group of 6); ``footer_note`` says so."""
    return sum(pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups))


def footer_note(pf: pq.ParquetFile) -> str | None:
    """A line for the file's notes when the footer's row count is not its row groups'."""
    rows = total_rows(pf)
    if rows == pf.metadata.num_rows:
        return None
    return (f"the footer says {pf.metadata.num_rows:,} rows, its row groups hold {rows:,}: "
            "read and copied by its row groups (the copy's footer says what it holds)")


class ColumnError(OSError):
    """A row group's column that the job does not read (neither the tensor, the id nor the
    keep column) but the clean copy holds, which cannot be read."""

    def __init__(self, column: str, cause: BaseException):
        super().__init__(f"column {column!r} (not read for dedup, but copied): "
                         f"{error_line(cause)}")


def group_reason(rg: int, e: BaseException) -> str:
    """An unreadable row group's reason, for each of its records."""
    return f"unreadable row group {rg}: {e if isinstance(e, ColumnError) else error_line(e)}"


def _steps(pf: pq.ParquetFile, rg: int) -> int:
    meta = pf.metadata.row_group(rg)
    return max(1, DECODE_BYTES * meta.num_rows // max(1, meta.total_byte_size))


def _rows_read(pf: pq.ParquetFile, rg: int, columns: list[str]) -> int:
    """Decode (and drop) row group ``rg``'s ``columns``; the rows they gave."""
    return sum(b.num_rows for b in pf.iter_batches(batch_size=_steps(pf, rg), row_groups=[rg],
                                                   columns=columns))


def short_read(pf: pq.ParquetFile, rg: int, got: int) -> OSError | None:
    """The error for row group ``rg`` when a read gave ``got`` rows, not the group's: a
    column chunk that holds fewer values than its group has rows (parquet-testing's
    ARROW-GH-41317.parquet) reads in batches as fewer rows, without an error."""
    n = pf.metadata.row_group(rg).num_rows
    return None if got == n else OSError(f"gives {got:,} rows where its row group has {n:,}")


def check_rest(pf: pq.ParquetFile, rg: int, columns: list[str]) -> None:
    """Decode (and drop) row group ``rg``'s columns other than ``columns``, raising a
    ``ColumnError`` naming the first one that cannot be read (or gives too few rows).
    Why: the read pass reads only the columns dedup needs and the copy all of them, so
    a group damaged elsewhere was found only by the copy, after every decision (the run
    failed, as if the file had changed). Checked here, its records are invalid like any
    unreadable group's. Only as many bytes as the read itself decodes (smallest columns
    first): beside 384-float embeddings, 50 kB images cost 15 times the read; a damaged
    column left unchecked fails the copy, naming the group and the error."""
    rest = _cheapest(pf, rg, columns)
    if not rest:
        return
    try:
        e = short_read(pf, rg, _rows_read(pf, rg, rest))
    except (OSError, pa.ArrowException) as err:
        e = err
    if e is None:
        return
    for name in rest:  # which one: only when one failed
        try:
            one = short_read(pf, rg, _rows_read(pf, rg, [name]))
        except (OSError, pa.ArrowException) as err:
            one = err
        if one is not None:
            raise ColumnError(name, one)
    raise ColumnError(", ".join(rest), e)


def _cheapest(pf: pq.ParquetFile, rg: int, columns: list[str]) -> list[str]:
    """The columns other than ``columns``, smallest first, while their stored bytes add
    up to at most those of ``columns`` in row group ``rg``."""
    meta = pf.metadata.row_group(rg)
    size: dict[str, int] = {}
    j = 0
    for f in pf.schema_arrow:  # each top-level column's leaves, in order (names may hold dots)
        n = _leaves(f.type)
        size[f.name] = size.get(f.name, 0) + sum(
            meta.column(k).total_compressed_size for k in range(j, min(j + n, meta.num_columns)))
        j += n
    budget = sum(size.get(n, 0) for n in columns)
    out, spent = [], 0
    rest = sorted((n for n in dict.fromkeys(pf.schema_arrow.names) if n not in columns),
                  key=lambda n: size.get(n, 0))
    for name in rest:
        spent += size.get(name, 0)
        if spent > budget:
            break
        out.append(name)
    return out


def _leaves(t: pa.DataType) -> int:
    """Parquet leaf columns an Arrow type is stored as."""
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if hasattr(t, "value_type") and not pa.types.is_dictionary(t):  # lists of any kind
        return _leaves(t.value_type)
    return 1


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
               then: Callable[[pa.Table, int, int], pa.Table] | None = None,
               whole: bool = False) -> tuple[int, int, int, pa.Table | Exception]:
    """(row group, first position, rows, its table or the read error), read with this
    thread's own reader of ``path`` (a remote file's reader seeks: threads can't share
    one); ``then(table, first, n)`` runs here too, beside the caller. ``whole``: the
    group's other columns must be readable too (``check_rest``)."""
    files = _readers.__dict__.setdefault("files", {})
    if path not in files:
        files[path] = open_file(path)
    pf = files[path]
    try:
        if isinstance(pf, Exception):
            raise pf
        table = _decoded(pf, rg, columns)
        if whole and columns is not None:
            check_rest(pf, rg, columns)
    except (OSError, pa.ArrowException) as e:
        return rg, first, n, e
    return rg, first, n, table if then is None else then(table, first, n)


def _decoded(pf: pq.ParquetFile, rg: int, columns: list[str] | None) -> pa.Table:
    """A whole row group, decoded about DECODE_BYTES at a time (a table of several
    chunks: nothing is copied to join them)."""
    batches = list(pf.iter_batches(batch_size=_steps(pf, rg), row_groups=[rg],
                                   columns=columns))
    table = pa.Table.from_batches(batches) if batches else pf.read_row_group(rg, columns=columns)
    short = short_read(pf, rg, table.num_rows)
    if short is not None:
        raise short
    return table


def ahead_depth(pf: pq.ParquetFile, groups: list[tuple[int, int, int]]) -> int:
    """How many of ``groups`` to read at once ahead of the caller: ``ahead.depth()``,
    fewer when that many of the largest would hold more than ``AHEAD_BYTES`` decoded (a
    row group of wide tensors can be GBs), never fewer than one."""
    largest = max((pf.metadata.row_group(rg).total_byte_size for rg, _, _ in groups),
                  default=0)
    return max(1, min(depth(), AHEAD_BYTES // max(largest, 1)))


def read_groups(path: str, pf: pq.ParquetFile, groups: list[tuple[int, int, int]],
                columns: list[str] | None = None,
                then: Callable[[pa.Table, int, int], pa.Table] | None = None,
                whole: bool = False) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """(row group, first position, rows, table or the read error) for ``groups`` ((row
    group, first position, rows), as ``row_groups`` gives them), each whole, read ahead
    (``ahead_depth``; ``then`` and ``whole``'s check run in the reader)."""
    return in_order((partial(read_group, path, rg, first, n, columns, then, whole)
                     for rg, first, n in groups), ahead_depth(pf, groups))


def joined(pieces: Iterator[tuple[int, int, int, pa.Table | Exception]], rows: int,
           max_bytes: int | None = None, size: Callable[[pa.Table], int] | None = None
           ) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """``pieces`` (row group, first position, rows, table or read error) with consecutive
    readable tables joined while they hold at most ``rows`` rows and, by ``size``, at
    most ``max_bytes`` (one larger table passes alone); a joined table is numbered by its
    first group, an error passes as it is, in order. Why: Hugging Face ``datasets``
    wrote 1,000 rows per row group (100 for images) from 2022 until its 5.x releases
    (which aim at 100 MB groups), and many Hub datasets keep that layout; a chunk per
    group cost a 250,000 x 128 near job 28% more wall time (44% more CPU) than chunks
    of 65,536 rows, a text job twice its recall estimate (each chunk meets the whole
    recall sample)."""
    held: list[pa.Table] = []
    rg0 = first = have = nbytes = 0
    for rg, start, n, table in pieces:
        more = 0 if isinstance(table, Exception) or size is None else size(table)
        if held and (isinstance(table, Exception) or have + n > rows or (
                max_bytes is not None and nbytes + more > max_bytes)):
            yield rg0, first, have, pa.concat_tables(held)
            held = []
        if isinstance(table, Exception):
            yield rg, start, n, table
            continue
        if not held:
            rg0, first, have, nbytes = rg, start, 0, 0
        held.append(table)
        have, nbytes = have + n, nbytes + more
    if held:
        yield rg0, first, have, pa.concat_tables(held)


def prefetched(path: str, pf: pq.ParquetFile, start: int, stop: int,
               columns: list[str] | None = None,
               then: Callable[[pa.Table, int, int], pa.Table] | None = None,
               whole: bool = False) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """``read_groups`` of the row groups in [start, stop)."""
    return read_groups(path, pf, list(row_groups(pf, start, stop)), columns, then, whole)
