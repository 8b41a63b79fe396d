"""CSV input (``.csv``, ``.tsv``; as is, gzip, bz2 or zstd compressed): a header line
naming the columns, then one record per line; one unit per file.

Why a format of its own: feature tables and labelled texts mostly arrive as CSV
(Kaggle, spreadsheets, ``DataFrame.to_csv``), and a copy as Parquet first doubles them on
disk and loses the layout users keep. Read as JSON lines are (``jsonl.pieces`` with this
module's ``Dialect``): a record is a non-blank line after the header, its position its
ordinal among them; lines are parsed by pyarrow's CSV reader a block at a time, only
the columns the job names, with the types the first lines hold (a feature table's
numbers, a text column with ``input.decode: text``); a block that fails to parse is
halved until each bad line stands alone. The delimiter is a comma, or a tab where the
header holds tabs and no comma. The clean copy is the header and the kept lines, byte
for byte, compressed as the input was.

A quoted field holding a line break is not read: each of its lines is an invalid
record (the quote's parity tells them), and such a field among the first lines stops
the run before any work with the command that writes the file as Parquet.
"""

from __future__ import annotations

import csv as pycsv
import json
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.csv as pv

from transforms.io.formats import jsonl
from transforms.io.formats.base import (
    InputError,
    TensorSpec,
    Unit,
    error_line,
    read_columns,
    rows_by_reading,
)
from transforms.io.formats.parquet import check_schema, pieces_reader

_HEADER, _DELIMITER = b"csv_header", b"csv_delimiter"  # the sample schema's metadata
SPAN = ("a quoted field runs past the end of its line: a record holding a line break is "
        "not read (each CSV record is one line; write the file as Parquet to keep such "
        "fields)")
INSIDE = "a line inside a quoted field opened on an earlier line (a record holding a line break)"


def delimiter(header: bytes) -> str:
    return "\t" if b"\t" in header and b"," not in header else ","


def _opens(line: bytes) -> bool:
    """Whether a line leaves a quoted field open (an odd number of quote characters:
    an escaped quote is two)."""
    return line.count(b'"') % 2 == 1


def records(path: str, head: bool = False) -> Iterator[tuple[int, bytes | str]]:
    """``jsonl.records`` without the header (the first non-blank line), positions from 0
    at the line below it; the lines of a quoted field that spans lines are ``Bad``."""
    inside = False
    for position, line in jsonl.records(path, head):
        if isinstance(line, str):
            yield (position - 1 if position > 0 else -1), line
            return
        if position == 0:
            continue
        if inside or _opens(line):
            yield position - 1, jsonl.Bad(INSIDE if inside else SPAN)
            inside = inside != _opens(line)
            continue
        yield position - 1, line


def _header(path: str) -> bytes | None:
    first = next(jsonl.records(path, head=True), None)
    return None if first is None or isinstance(first[1], str) else first[1]


def _names(header: bytes, sep: str) -> list[str]:
    return next(pycsv.reader([header.decode("utf-8", "replace").removeprefix("\ufeff")],
                             delimiter=sep))


def _sample(path: str) -> jsonl.Sample:
    """(every column with the type its first lines hold, the header and delimiter in the
    schema's metadata; those lines) or None where the file holds no header."""
    header = _header(path)
    if header is None:
        return None
    sep = delimiter(header)
    names = _names(header, sep)
    lines: list[bytes] = []
    size = 0
    for _, line in records(path, head=True):
        if isinstance(line, jsonl.Bad):
            continue
        if isinstance(line, str):
            break
        lines.append(line)
        size += len(line)
        if len(lines) >= jsonl.CHECK_LINES or size >= jsonl.CHECK_BYTES:
            break
    meta = {_HEADER: json.dumps(names), _DELIMITER: sep}
    try:
        fields = _read(lines, names, sep, None, None).schema
    except pa.ArrowInvalid:  # a bad line among them: the type most lines hold
        held = jsonl.held_types(lines, lambda one: _read(one, names, sep, None, None).schema)
        fields = pa.schema([(n, held.get(n, pa.null())) for n in names])
    return fields.with_metadata(meta), lines


def sample(path: str) -> jsonl.Sample:
    return jsonl.kept_sample(path, _sample)


def _read(lines: list[bytes], names: list[str], sep: str, include: list[str] | None,
          types: dict[str, pa.DataType] | None) -> pa.Table:
    data = b"\n".join(lines)
    if not lines:
        return pa.table({n: pa.array([], pa.null()) for n in names})
    return pv.read_csv(
        pa.BufferReader(data),
        read_options=pv.ReadOptions(column_names=names, block_size=len(data) + 1,
                                    use_threads=False),
        parse_options=pv.ParseOptions(delimiter=sep),
        convert_options=pv.ConvertOptions(include_columns=include, column_types=types))


def _schema(fields: pa.Schema, spec: TensorSpec) -> pa.Schema:
    """The columns the job reads, with their first lines' types (one null in every first
    line: a string, or a number for ``keep``), and the header."""
    out = []
    for name in read_columns(spec):
        t = fields.field(name).type if fields.get_field_index(name) >= 0 else pa.null()
        if pa.types.is_null(t):
            t = pa.float64() if name == spec.rank or name in spec.columns else pa.string()
        out.append(pa.field(name, t))
    return pa.schema(out, metadata=fields.metadata)


def _parse(lines: list[bytes], schema: pa.Schema) -> pa.Table:
    meta = schema.metadata or {}
    names = json.loads(meta.get(_HEADER, b"[]")) or schema.names
    table = _read(lines, names, meta.get(_DELIMITER, b",").decode(), schema.names,
                  {f.name: f.type for f in schema})
    if table.num_rows != len(lines):
        raise pa.ArrowInvalid(f"{table.num_rows} CSV rows on {len(lines)} line(s)")
    return table


def _why(line: bytes, error: Exception, schema: pa.Schema) -> str:
    """Why one line is not a row of the header's columns, in words."""
    meta = schema.metadata or {}
    names = json.loads(meta.get(_HEADER, b"[]"))
    try:
        got = _names(line, meta.get(_DELIMITER, b",").decode())
    except pycsv.Error as e:
        return f"not a CSV row ({error_line(e)})"
    if names and len(got) != len(names):
        return f"{len(got)} fields, not the header's {len(names)}"
    for f in schema:
        value = got[names.index(f.name)] if f.name in names else ""
        if value and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)):
            try:
                float(value) if pa.types.is_floating(f.type) else int(value)
            except ValueError:
                what = "an integer" if pa.types.is_integer(f.type) else "a number"
                return f"column {f.name!r} holds {value[:40]!r}, not {what} as in the first lines"
    return f"values unlike the first lines' ({error_line(error)})"


CSV = jsonl.Dialect(sample, _schema, records, _parse, _why)
pieces = partial(jsonl.pieces, dialect=CSV)


def check(path: str, spec: TensorSpec) -> TensorSpec:
    """The spec with the dtype and shape the file's first lines hold; a quoted field
    running past its line among them (a record holding a line break) is refused with
    the command that writes the file as Parquet."""
    found = sample(path)
    if found is None:
        return spec
    names = json.loads(found[0].metadata[_HEADER])
    if all(_number(n) for n in names):
        base = path.rsplit("/", 1)[-1]
        raise InputError(
            f"{path}: its first line ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}) "
            "is numbers, not a header naming the columns: a CSV file's first line is its "
            "header; add one, e.g. python -c \"import pandas as pd; pd.read_csv('"
            f"{base}', header=None).add_prefix('c').to_csv('{_headed(base)}', index=False)\""
            " (columns c0, c1, ...), and read that")
    for n, line in records(path, head=True):
        if isinstance(line, jsonl.Bad):
            raise InputError(
                f"{path}: record {n} holds a quoted field that runs past the end of its "
                "line: CSV records holding line breaks are not read (each record is one "
                "line here): write the file as Parquet first, e.g. python -c \"import "
                f"pyarrow.csv as r, pyarrow.parquet as pq; pq.write_table(r.read_csv("
                f"'{path}', parse_options=r.ParseOptions(newlines_in_values=True)), "
                "'out.parquet')\", and read that with input.format: parquet")
        if isinstance(line, str) or n >= jsonl.CHECK_LINES:
            break
    # a column empty in every first line is numbers as far as they tell
    fields = pa.schema([f.with_type(pa.float64()) if pa.types.is_null(f.type) else f
                        for f in found[0]])
    resolved = check_schema(path, fields, spec)
    return resolved if found[1] else replace(resolved, dtype=None)  # no row: tells nothing


def _number(name: str) -> bool:
    try:
        float(name)
    except ValueError:
        return False
    return True


def _headed(name: str) -> str:
    stem, dot, rest = name.partition(".")
    return f"{stem}-header{dot}{rest}"


def first_values(path: str, name: str) -> list:
    """The column's values in the file's first lines as strings (ids)."""
    found = sample(path)
    if found is None or found[0].get_field_index(name) < 0:
        return []
    try:
        col = _parse(found[1], _schema(found[0], TensorSpec(name))).column(name)
        return col.cast(pa.string()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return []


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """One unit per file: lines have no index, so a file cannot be split."""
    return [Unit(file_index, path, 0, None)]


read = pieces_reader(pieces)


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """The header and the lines of the records not in ``drop``, byte for byte, compressed
    as ``src`` is (``jsonl.write``, the header being its line 0)."""
    written = jsonl.write(src, dst, np.asarray(drop, np.int64) + 1, spec)
    return max(0, written - 1)


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    return rows_by_reading(read, path, spec, positions)
