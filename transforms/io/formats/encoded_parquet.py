"""Encoded values in Parquet: a binary or string column, or Hugging Face ``Image()``.

``datasets`` stores an image as ``struct<bytes: binary, path: string>``; a row with
null bytes but a path refers to a file, read here relative to the Parquet file (as
``datasets`` resolves it), or reported invalid with the reason. Row groups are read as
the numeric reader reads them (one at a time, the next one prefetched), then cut into
slices of at most ``rows`` values and ``max_bytes`` encoded bytes.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.io import fs
from transforms.io.formats.base import (
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    Values,
    byte_slices,
    default_ids,
    default_ids_arrow,
    error_line,
    read_columns,
    unreadable_file,
)
from transforms.io.formats.parquet import (
    check_columns,
    groups_at,
    numeric,
    plain_type,
    text_list,
    text_parts,
    unsupported,
    value_kind,
)
from transforms.io.formats.parquet_files import (
    group_reason,
    joined,
    open_file,
    prefetched,
    total_rows,
)


def _beside(path: str, rel: str) -> str:
    """``rel`` (a path stored in the file) resolved against the Parquet file's folder."""
    if "://" in rel or os.path.isabs(rel):
        return rel
    if fs.is_local(path):
        return os.path.join(os.path.dirname(path), rel)
    return posixpath.join(posixpath.dirname(path), rel)


def _read_file(path: str) -> bytes:
    with fs.open_read(path) as f:
        return f.read()


def _column(col: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    """(values, paths or None) of a value column (the struct's fields for ``Image()``)."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if text_list(col.type):
        return text_parts(col), None
    if plain_type(col.type) != col.type:
        col = col.cast(plain_type(col.type))
    if pa.types.is_struct(col.type):
        paths = (pc.struct_field(col, "path") if col.type.get_field_index("path") >= 0
                 else None)
        return pc.struct_field(col, "bytes"), paths
    return col, None


def _python_values(data: pa.Array) -> list:
    """The column's values as Python objects. A string column's value that is not UTF-8
    (writers that do not validate leave them: Spark, Hive, C++) stays bytes, which
    decoding reports as an invalid record with the reason, as in a binary column: the
    whole column's conversion failed the job ("UnicodeDecodeError ... [while running
    'Read/ReadChunks/Run']", naming no file, row or column)."""
    try:
        return data.to_pylist()
    except UnicodeDecodeError:
        raw = data.cast(pa.large_binary() if pa.types.is_large_string(data.type)
                        else pa.binary())  # no copy, no check
    values = raw.to_pylist()
    for i, v in enumerate(values):
        if v is not None:
            try:
                values[i] = v.decode("utf-8")
            except UnicodeDecodeError:
                pass
    return values


def _resolve(data: pa.Array, paths: pa.Array | None, file: str, name: str
             ) -> tuple[list, dict[int, str]]:
    """Values with a path-only row's file read in; {row: reason} for the unusable rows."""
    bad: dict[int, str] = {}
    values, where = _python_values(data), None if paths is None else paths.to_pylist()
    null = ("null (no bytes and no path)" if paths is not None else
            "null (no text)" if value_kind(data.type) == "text" else "null (no bytes)")
    for i, v in enumerate(values):
        if v is not None:
            continue
        p = None if where is None else where[i]
        if p is None:
            bad[i] = f"column {name!r}: {null}"
            continue
        try:
            values[i] = _read_file(_beside(file, p))
        except OSError as e:
            bad[i] = f"column {name!r}: no bytes, and its path {p!r} cannot be read " \
                     f"({error_line(e)})"
    return values, bad


def check(path: str, spec: TensorSpec) -> tuple[bytes | str, str] | None:
    """(first value, where) after checking that the columns exist and the tensor column
    holds encoded values; None when the file has no usable value to try."""
    pf = open_file(path)
    if isinstance(pf, Exception):
        return None
    check_value_schema(path, pf.schema_arrow, spec)
    for rg in range(pf.metadata.num_row_groups):
        try:
            for batch in pf.iter_batches(batch_size=64, row_groups=[rg], columns=[spec.tensor]):
                data, paths = _column(batch.column(0))
                values, bad = _resolve(data, paths, path, spec.tensor)
                first = next((i for i, v in enumerate(values) if i not in bad), None)
                if first is not None:
                    return values[first], f"column {spec.tensor!r}"
        except (OSError, pa.ArrowException):
            continue  # a damaged row group: its records are reported invalid by the reader
    return None


def check_value_schema(path: str, schema: pa.Schema, spec: TensorSpec) -> None:
    """The columns exist and the tensor column holds encoded values (a Parquet file's
    schema, or the one JSON lines' first lines hold)."""
    check_columns(path, schema, spec)
    t = schema.field(spec.tensor).type
    kind = value_kind(t)
    if kind is None and numeric(t):
        raise InputError(f"{path}: input.decode: column {spec.tensor!r} holds {t}, not encoded "
                         "values (binary, string, or struct<bytes, path> as Hugging Face "
                         "datasets writes images): set input.decode: none for numeric tensors")
    if kind is None:
        raise InputError(unsupported(path, spec.tensor, t))
    if kind == "text" and spec.decode is not None and spec.decode.kind == "image":
        raise InputError(f"{path}: input.decode: column {spec.tensor!r} holds text ({t}), not "
                         "image bytes: set input.decode: text")


def table_values(unit: Unit, table: pa.Table, first: int, spec: TensorSpec) -> Values:
    """The values of ``table``'s rows, at positions ``first``, ``first + 1``, ...: a null
    value or id is an invalid record with its reason (JSON lines' tables too)."""
    n = table.num_rows
    positions = np.arange(first, first + n, dtype=np.int64)
    data, paths = _column(table.column(spec.tensor).combine_chunks())
    values, bad = _resolve(data, paths, unit.path, spec.tensor)
    if spec.id is None:
        ids = default_ids_arrow(unit.path, positions)
    else:
        ids = table.column(spec.id).combine_chunks().cast(pa.string())
        if ids.null_count:
            for i in np.flatnonzero(~ids.is_valid().to_numpy(zero_copy_only=False)).tolist():
                bad.setdefault(i, f"column {spec.id!r}: null id")
            ids = pc.coalesce(ids, default_ids_arrow(unit.path, positions))
    rank = None
    if spec.rank is not None:
        rank = table.column(spec.rank).cast(pa.float64()).to_numpy()
    ok = np.ones(n, dtype=bool)
    ok[list(bad)] = False
    keep = np.flatnonzero(ok)
    invalid = [InvalidRecord(int(positions[i]), ids[i].as_py(), why)
               for i, why in sorted(bad.items())]
    return Values(unit.file_index, positions[keep], ids.take(pa.array(keep)),
                  [values[i] for i in keep.tolist()], None if rank is None else rank[keep],
                  invalid)


def read_values(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int) -> Iterator[Values]:
    pf = open_file(unit.path)
    if isinstance(pf, Exception):
        yield Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                     [unreadable_file(unit.path, f"unreadable Parquet file: {error_line(pf)}")])
        return
    stop = total_rows(pf) if unit.stop is None else unit.stop
    columns = read_columns(spec)
    for rg, first, n, table in joined(prefetched(unit.path, pf, unit.start, stop, columns,
                                                 whole=True), rows, max_bytes,
                                      lambda t: t.column(spec.tensor).nbytes):
        if isinstance(table, Exception):
            positions = np.arange(first, first + n, dtype=np.int64)
            why = group_reason(rg, table)
            yield Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                         [InvalidRecord(int(p), i, why) for p, i in zip(
                             positions.tolist(), default_ids(unit.path, positions), strict=True)])
            continue
        data = _column(table.column(spec.tensor).combine_chunks())[0]
        lengths = pc.binary_length(data).fill_null(0).to_numpy(zero_copy_only=False)
        for a, b in byte_slices(lengths, rows, max_bytes):
            yield table_values(unit, table.slice(a, b - a), first + a, spec)


def values_at(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, bytes | str]:
    """The stored values at ``positions`` (only the row groups holding them are read)."""
    out: dict[int, bytes | str] = {}
    for offset, local, table in groups_at(path, [spec.tensor], positions):
        data, paths = _column(table.column(0).combine_chunks().take(pa.array(local)))
        values, bad = _resolve(data, paths, path, spec.tensor)
        out.update({offset + p: v for i, (p, v) in enumerate(zip(local, values, strict=True))
                    if i not in bad})
    return out


def pieces_values(unit: Unit, spec: TensorSpec,
                  pieces: Iterable[tuple[int, pa.Table] | InvalidRecord]) -> Iterator[Values]:
    """The values of a format's pieces (JSON lines', Arrow streams'): (first position,
    table) or an invalid record."""
    for got in pieces:
        if isinstance(got, InvalidRecord):
            yield Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                         [got])
        else:
            yield table_values(unit, got[1], got[0], spec)


def values_by_reading(read_values: Callable[..., Iterator[Values]], path: str,
                      spec: TensorSpec, positions: Iterable[int]) -> dict[int, bytes | str]:
    """``values_at`` of a format without an index: the file read with its own
    ``read_values`` up to the last position wanted (positions mean the same)."""
    want = set(int(p) for p in positions)
    out: dict[int, bytes | str] = {}
    if not want:
        return out
    last = max(want)
    for vals in read_values(Unit(0, path), spec, 4096, 64 << 20):
        out.update((p, v) for p, v in zip(vals.positions.tolist(), vals.values, strict=True)
                   if p in want)
        done = [r.position for r in vals.invalid] + vals.positions.tolist()
        if done and max(done) >= last:
            break
    return out


def reading(pieces: Callable[..., Iterable[tuple[int, pa.Table] | InvalidRecord]]
            ) -> tuple[Callable[..., Iterator[Values]], Callable[..., dict[int, bytes | str]]]:
    """(``read_values``, ``values_at``) of a format without an index whose ``pieces``
    yields (first position, table) and invalid records (JSON lines, Arrow streams)."""
    def read_values(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int
                    ) -> Iterator[Values]:
        return pieces_values(unit, spec, pieces(unit, spec, rows, max_bytes))

    def values_at(path: str, spec: TensorSpec, positions: Iterable[int]
                  ) -> dict[int, bytes | str]:
        return values_by_reading(read_values, path, spec, positions)

    return read_values, values_at
