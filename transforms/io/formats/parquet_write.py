"""Parquet output: the clean copy of an input file, mirroring its writer's settings.

The copy keeps the input's schema (with its metadata), codecs, encodings and row-group
boundaries; its row groups are read ahead (and filtered) in other threads while this
one encodes, which is the copy's slowest part.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.io import fs
from transforms.io.formats.base import TensorSpec, error_line
from transforms.io.formats.parquet_files import footer_note, open_file, prefetched, total_rows

DICTIONARY_PAGE_LIMIT = 1 << 20  # Arrow's default: a dictionary page this big was abandoned
# A row group that loses fewer than one row in this many is written from slices of its
# kept runs instead of a filtered copy. Measured on 65,536 x 384 float32 lists, snappy,
# one drop in 45: filter and encode 0.23 s a group, slices 0.15 s (the filtered copy is
# slower to encode too); at one drop in 8 both take the same, at one in 2 filter wins.
SLICES_BELOW = 16


# Codec names as ColumnChunkMetaData.compression reports them -> ParquetWriter's names.
# pyarrow reports LZ4_RAW as "LZ4" and the deprecated Hadoop-framed LZ4 as "UNKNOWN"
# (it reads that codec but cannot write it); it writes no LZO at all.
_CODECS = {"UNCOMPRESSED": "none", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli",
           "LZ4": "lz4", "ZSTD": "zstd"}
# Codecs pyarrow cannot write -> the nearest it can, and the codec read, in words. pyarrow
# reports the deprecated LZ4 codec as UNKNOWN whether its pages are Hadoop-framed or raw
# LZ4 blocks (an old parquet-cpp's): it tells them apart only while decoding a page.
_MAPPED = {"UNKNOWN": ("lz4", "LZ4_RAW", "the deprecated LZ4 codec (Hadoop-framed or raw "
                       "blocks)"),
           "LZO": ("snappy", "SNAPPY", "LZO")}
# Encodings a writer can be asked for per column (others are chosen by the writer itself).
_ENCODINGS = ("BYTE_STREAM_SPLIT", "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY",
              "DELTA_BYTE_ARRAY")


def _codec(name: str, column: str) -> tuple[str, str | None]:
    """(writer codec, note or None) for a column's input codec: the same codec when
    pyarrow can write it, else its nearest equivalent with a note saying so."""
    if name in _CODECS:
        return _CODECS[name], None
    codec, written, read = _MAPPED.get(name, ("snappy", "SNAPPY", f"codec {name}"))
    return codec, (f"column {column!r}: read as {read}, which pyarrow cannot write; "
                   f"written as {written}")


def _writer_plan(pf: pq.ParquetFile) -> tuple[dict, list[str]]:
    """(ParquetWriter options, notes) that mirror the input: the format version, each
    column's codec (one pyarrow cannot write is mapped, and noted), INT96 timestamps,
    decimals stored as integers, per-column encodings (byte stream split, delta), and
    dictionary encoding only for columns whose input dictionary was kept. A column whose
    dictionary page hit the size limit fell back to plain pages, so building a dictionary
    again would only cost time (~15% of the copy for float tensors)."""
    schema = pf.schema
    physical = [schema.column(i).physical_type for i in range(len(schema))]
    options: dict = {"version": pf.metadata.format_version,
                     "use_deprecated_int96_timestamps": "INT96" in physical,
                     "write_page_checksum": True,
                     "use_compliant_nested_type": _compliant_names(pf.schema_arrow)}
    decimals = [p for i, p in enumerate(physical)
                if schema.column(i).converted_type == "DECIMAL"]
    if decimals and all(p in ("INT32", "INT64") for p in decimals):
        options["store_decimal_as_integer"] = True
    if pf.metadata.num_row_groups == 0:
        return {**options, "compression": "snappy"}, []
    rg = pf.metadata.row_group(0)
    cols = [rg.column(j) for j in range(rg.num_columns)]
    codecs, notes = {}, []
    for c in cols:
        codecs[c.path_in_schema], note = _codec(c.compression, c.path_in_schema)
        notes += [note] if note else []
    names = set(codecs.values())
    encoding = {c.path_in_schema: e for c in cols for e in _ENCODINGS if e in c.encodings}
    dictionary = [c.path_in_schema for c in cols if c.has_dictionary_page
                  and c.data_page_offset - c.dictionary_page_offset < DICTIONARY_PAGE_LIMIT
                  and c.path_in_schema not in encoding]
    if encoding:
        options["column_encoding"] = encoding
    return {**options, "compression": names.pop() if len(names) == 1 else codecs,
            "use_dictionary": dictionary}, notes + [n for n in [footer_note(pf)] if n]


def _compliant_names(schema: pa.Schema) -> bool:
    """Whether lists are written with Parquet's standard child name ``element``: only when
    the copy then reads back with the input's Arrow schema. A list child of another name
    (``item``, which pyarrow before 13 and many Spark/Hive writers wrote; a legacy list's
    ``array`` or field name) would come back as ``element``, so such a schema's lists are
    written with their Arrow names. Tried on an empty copy of the schema (no rows: ~1 ms)."""
    if not any(pa.types.is_nested(f.type) for f in schema):
        return True
    sink = pa.BufferOutputStream()
    try:
        with pq.ParquetWriter(sink, schema, use_compliant_nested_type=True) as w:
            w.write_table(schema.empty_table())
        back = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema_arrow
    except (OSError, pa.ArrowException):  # a schema pyarrow cannot write: the copy says why
        return True
    return _names(back) == _names(schema)  # Schema.equals ignores list child names


def _names(t: pa.Schema | pa.DataType | pa.Field) -> list[str]:
    """Every field name of a schema or type, nested ones (list children) included."""
    if isinstance(t, pa.Field):
        return [t.name, *_names(t.type)]
    fields = (list(t) if isinstance(t, pa.Schema) else
              [t.field(i) for i in range(t.num_fields)])
    return [n for f in fields for n in _names(f)]


def write_notes(src: str) -> list[str]:
    """What the clean copy of ``src`` cannot keep as it was (codecs pyarrow cannot
    write), one line each, for the file's entry in summary.json."""
    pf = open_file(src)
    return [] if isinstance(pf, Exception) else _writer_plan(pf)[1]



def _filtered(table: pa.Table, mask: pa.Array) -> pa.Table:
    """``table.filter(mask)`` for view columns too (string_view, binary_view: Arrow has no
    take or filter for them), filtered as their large types and cast back."""
    views = {i: f.type for i, f in enumerate(table.schema)
             if pa.types.is_string_view(f.type) or pa.types.is_binary_view(f.type)}
    if not views:
        return table.filter(mask)
    for i, t in views.items():
        wide = pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()
        table = table.set_column(i, table.field(i).with_type(wide), table.column(i).cast(wide))
    out = table.filter(mask)
    for i, t in views.items():
        out = out.set_column(i, table.field(i).with_type(t), out.column(i).cast(t))
    return out

def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None,
          seen: Callable[[pa.Table, int, int], None] | None = None) -> int:
    """``seen(table, first, n)``: called with each readable row group, whole, before its
    drops (in a read-ahead thread)."""
    pf = open_file(src)
    if isinstance(pf, Exception):
        return 0
    written = 0

    def kept(table: pa.Table, first: int, n: int) -> pa.Table:
        if seen is not None:
            seen(table, first, n)
        lo, hi = np.searchsorted(drop, [first, first + n])
        if hi == lo:
            return table
        gone = drop[lo:hi] - first
        if (hi - lo) * SLICES_BELOW <= n:  # few drops: the kept runs, not copied
            starts, ends = np.r_[0, gone + 1], np.r_[gone, n]
            return pa.concat_tables([table.slice(a, b - a) for a, b in
                                     zip(starts.tolist(), ends.tolist(), strict=True) if b > a])
        keep = np.ones(n, dtype=bool)
        keep[gone] = False
        return _filtered(table, pa.array(keep))

    with fs.local_file_for(dst) as local, pq.ParquetWriter(
            local, pf.schema_arrow, **_writer_plan(pf)[0]) as out:
        for rg, first, n, table in prefetched(src, pf, 0, total_rows(pf), then=kept):
            if isinstance(table, Exception):
                # every row of a group the read pass found unreadable is invalid, so in
                # `drop`; one it read (all its columns) must not fail now
                if np.count_nonzero((drop >= first) & (drop < first + n)) < n:
                    raise RuntimeError(f"{src}: row group {rg} was read by the read pass "
                                       f"but the copy cannot read it: {error_line(table)}")
                continue
            out.write_table(table, row_group_size=max(table.num_rows, 1))
            written += table.num_rows
    return written
