"""Arrow IPC input (``input.format: arrow``): what Hugging Face ``datasets`` keeps on disk
(``save_to_disk``'s ``data-00000-of-00001.arrow`` files and its cache: IPC streams) and
Arrow IPC files (``pyarrow.ipc.new_file``, Feather v2), told apart by their first bytes.

Why read them as they are: a dataset saved with ``save_to_disk`` was refused with the
command that writes it as Parquet, a second copy of the data on disk (images too). Its
record batches are Arrow tables already, so they go through the Parquet readers' table
code (``parquet.table_chunks``, ``encoded_parquet.table_values``): vectors, token ids,
texts and ``Image()`` structs behave as in Parquet. A local file is memory-mapped (no
copy of its values). A stream has no index, so a file is one read unit (``datasets``
cuts its shards at 500 MB). The clean copy is a file of the same kind holding the kept
rows, with the schema and its metadata (the ``datasets`` features) unchanged, so
``Dataset.from_file`` reads it. A file cut short keeps the records before the cut, and
the rest of it is one invalid record with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np
import pyarrow as pa

from transforms.io import fs
from transforms.io.formats.base import (
    InvalidRecord,
    TensorSpec,
    Unit,
    default_id,
    error_line,
    read_columns,
    rows_by_reading,
    rows_within,
    unreadable_file,
)
from transforms.io.formats.parquet import check_schema, pieces_reader

FILE_MAGIC = b"ARROW1"  # an IPC file starts (and ends) with it
STREAM_START = b"\xff\xff\xff\xff"  # an IPC stream's first message's continuation marker


def kind_of(head: bytes) -> str | None:
    """"file" or "stream" by a file's first bytes, or None."""
    if head.startswith(FILE_MAGIC):
        return "file"
    return "stream" if head.startswith(STREAM_START) and len(head) > 8 else None


@contextmanager
def _opened(path: str, ranged: bool = False) -> Iterator[tuple[str, object]]:
    """(kind, reader) of the file: an ``ipc.RecordBatchFileReader`` or a stream reader.
    Raises OSError or pa.ArrowException when it cannot be opened. ``ranged``: on an
    object store, reads fetch what they ask for (the schema only)."""
    if fs.is_local(path):
        source = pa.memory_map(path)
    else:
        source = pa.PythonFile((fs.open_ranged if ranged else fs.open_read)(path), mode="r")
    with source:
        kind = "file" if source.read(len(FILE_MAGIC)) == FILE_MAGIC else "stream"
        source.seek(0)
        yield kind, (pa.ipc.open_file(source) if kind == "file" else
                     pa.ipc.open_stream(source))


def _batches(kind: str, reader) -> Iterator[pa.RecordBatch]:
    if kind == "file":
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    else:
        yield from reader


def schema(path: str) -> pa.Schema | None:
    """The file's schema, or None when it cannot be opened (``read`` reports it)."""
    try:
        with _opened(path, ranged=True) as (_, reader):
            return reader.schema
    except (OSError, pa.ArrowException):
        return None


def pieces(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int | None
           ) -> Iterator[tuple[int, pa.Table] | InvalidRecord]:
    """The file's records as (first position, table of the job's columns) of at most
    ``rows`` records and ``max_bytes`` of them, small batches joined (``datasets``
    writes 1,000 rows, 100 images, a batch); then, where the file cannot be read on, the
    rest as one InvalidRecord (a file with no readable record as an unreadable one)."""
    columns = read_columns(spec)
    position = 0
    with ExitStack() as stack:
        try:
            batches = _batches(*stack.enter_context(_opened(unit.path)))
        except (OSError, pa.ArrowException) as e:
            yield unreadable_file(unit.path, f"unreadable Arrow IPC file: {error_line(e)}")
            return
        held: list[pa.RecordBatch] = []
        have, cut = 0, None
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowException) as e:
                batch, cut = None, e
            if batch is None:
                break
            if not batch.num_rows:
                continue
            batch = batch.select(columns)
            step = rows_within(rows, max_bytes, batch.nbytes / batch.num_rows)
            for a in range(0, batch.num_rows, step):
                piece = batch.slice(a, step)
                if held and have + piece.num_rows > step:
                    yield position, pa.Table.from_batches(held)
                    position, held, have = position + have, [], 0
                held.append(piece)
                have += piece.num_rows
        if held:
            yield position, pa.Table.from_batches(held)
            position += have
        if cut is not None and position:
            yield InvalidRecord(position, default_id(unit.path, position),
                                f"the file cannot be read from here on ({error_line(cut)})")
        elif cut is not None:  # no record: the file as a whole
            yield unreadable_file(unit.path, f"unreadable Arrow IPC file: {error_line(cut)}")


# ---------------------------------------------------------------------------- the format


def check(path: str, spec: TensorSpec) -> TensorSpec:
    found = schema(path)
    return spec if found is None else check_schema(path, found, spec)


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """One unit per file: a stream has no index of its batches. A local file's records
    are counted (its batches' headers, memory-mapped: no value is read), so the
    progress and a dry run know them; on an object store that would read the file."""
    return [Unit(file_index, path, 0, _rows(path) if fs.is_local(path) else None)]


def _rows(path: str) -> int | None:
    try:
        with _opened(path) as (kind, reader):
            return sum(batch.num_rows for batch in _batches(kind, reader))
    except (OSError, pa.ArrowException):  # the reader reports it
        return None


read = pieces_reader(pieces)


def first_batches(path: str, columns: list[str], max_bytes: int) -> Iterator[pa.RecordBatch]:
    """The file's first record batches of ``columns``, about ``max_bytes`` of them; none
    where it cannot be read (the reader reports it)."""
    try:
        with _opened(path) as (kind, reader):
            read = 0
            for batch in _batches(kind, reader):
                yield batch.select(columns)
                read += batch.nbytes
                if read >= max_bytes:
                    return
    except (OSError, pa.ArrowException):
        return


def first_values(path: str, name: str) -> list:
    """The column's first values as strings (ids); [] where there are none to tell."""
    for batch in first_batches(path, [name], 1):
        try:
            return batch.column(0).cast(pa.string()).to_pylist()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # not ids: the check says so
            return []
    return []


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """The rows not in ``drop``, in a file of ``src``'s kind with its schema (metadata
    too); what cannot be read is not copied, and a file that cannot be opened gives no
    copy."""
    drop = np.asarray(drop, np.int64)
    written = position = 0
    with ExitStack() as stack:
        try:
            kind, reader = stack.enter_context(_opened(src))
        except (OSError, pa.ArrowException):
            return 0
        local = stack.enter_context(fs.local_file_for(dst))
        out = stack.enter_context((pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(
            local, reader.schema))
        try:
            for batch in _batches(kind, reader):
                n = batch.num_rows
                lo, hi = np.searchsorted(drop, [position, position + n])
                if hi > lo:
                    keep = np.ones(n, bool)
                    keep[drop[lo:hi] - position] = False
                    batch = batch.filter(pa.array(keep))
                if batch.num_rows:
                    out.write_batch(batch)
                written += batch.num_rows
                position += n
        except (OSError, pa.ArrowException):
            pass  # the rest cannot be read: the job reported it as one invalid record
    return written


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    return rows_by_reading(read, path, spec, positions)
