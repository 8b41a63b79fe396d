"""Parquet input: a (nested) list column holds one tensor per row; units are row groups.

Why row groups: they are Parquet's unit of independent reading, so a unit never
reads a byte twice and big files are read in parallel. Tensors come out of Arrow
without a Python loop: list levels are validated with vectorized length checks,
then the leaf values are reshaped in one go. Files on other Beam filesystems (gs://,
...) are read through a seekable reader, so only the footer and the column chunks a step
needs are fetched. The clean copy: ``parquet_write``; opening files and reading row
groups ahead: ``parquet_files``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from transforms.canonical import DTYPE_CODES
from transforms.io.formats.ahead import ahead
from transforms.io.formats.base import (
    JACCARD_TEXT_FIX,
    UNIT_BYTES,
    Chunk,
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    default_ids,
    default_ids_arrow,
    error_line,
    listed_names,
    nearest_name,
    ragged_rows,
    read_columns,
    record_nbytes,
    rows_within,
    unreadable_file,
)
from transforms.io.formats.columns import assembled, check_int_range, expanded, with_field
from transforms.io.formats.parquet_files import (
    DECODE_BYTES,
    check_rest,
    group_reason,
    joined,
    open_file,
    read_groups,
    row_groups,
    short_read,
    total_rows,
)
from transforms.io.formats.parquet_write import write, write_notes  # noqa: F401 (the format's)

_LIST_TYPES = (pa.ListType, pa.LargeListType, pa.FixedSizeListType)


def _layout(t: pa.DataType) -> tuple[list[int | None], pa.DataType]:
    """List nesting of a column type: per level the fixed size (None if variable), leaf type."""
    sizes: list[int | None] = []
    while isinstance(t, _LIST_TYPES):
        sizes.append(t.list_size if isinstance(t, pa.FixedSizeListType) else None)
        t = t.value_type
    return sizes, t


_NUMPY_NAMES = {pa.bool_(): "bool", pa.float16(): "float16", pa.float32(): "float32",
                pa.float64(): "float64", **{getattr(pa, n)(): n for n in (
                    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}}


def _leaf_dtype(t: pa.DataType) -> str | None:
    name = _NUMPY_NAMES.get(t)
    return name if name in DTYPE_CODES else None


def plain_type(t: pa.DataType) -> pa.DataType:
    """The type a dictionary-encoded (pandas categorical) or view column's values have
    once read as plain values."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary_view(t):
        return pa.large_binary()
    return t


def value_kind(t: pa.DataType) -> str | None:
    """"binary", "text" or "struct" (``struct<bytes, path>``) for a column of encoded
    values (dictionary-encoded and view columns as their values), else None. A list of
    texts, or of structs holding texts (a chat's ``list<struct<role, content>>``), is
    text too: each record's parts joined (``text_parts``)."""
    t = plain_type(t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or text_list(t):
        return "text"
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and value_kind(
            t.field("bytes").type) == "binary":
        return "struct"
    return None


def _listed(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _holds_text(t: pa.DataType) -> bool:
    """Whether values of ``t`` hold text at any depth (lists and structs; not an image
    struct, whose path is no text)."""
    t = plain_type(t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_struct(t):
        return value_kind(t) != "struct" and any(_holds_text(t.field(i).type)
                                                 for i in range(t.num_fields))
    return _listed(t) and _holds_text(t.value_type)


def text_list(t: pa.DataType) -> bool:
    """A list (any kind but a view) of texts, or of structs or lists holding texts (a
    chat's ``list<struct<role, content>>``): read as one text per record (``text_parts``)."""
    return _listed(t) and _holds_text(t.value_type)


_FIELDS, _ITEMS = pa.scalar("\n", pa.large_string()), pa.scalar("\n\n", pa.large_string())


def _join_rows(values: pa.Array, offsets: np.ndarray, sep: pa.Scalar,
               mask: pa.Array | None = None) -> pa.Array:
    """Row r: the values[offsets[r]:offsets[r + 1]] that are neither null nor empty,
    joined by ``sep`` ("" where none is); null where ``mask``. (Not pyarrow's
    ``binary_join_element_wise(..., null_handling="skip")``: pyarrow 25 drops the rows
    whose values are all null from its result, so the rows after them shift.)"""
    present = pc.fill_null(pc.greater(pc.binary_length(values), 0), False)
    present = present.to_numpy(zero_copy_only=False)
    before = np.zeros(len(present) + 1, np.int64)  # present values before each index
    np.cumsum(present, out=before[1:])
    lists = pa.LargeListArray.from_arrays(pa.array(before[offsets]),
                                          values.filter(pa.array(present)),
                                          mask=mask)
    return pc.binary_join(lists, sep)


def text_parts(arr: pa.Array) -> pa.Array | None:
    """A ``text_list`` column as one text per record (None for an array whose type holds
    no text): every text in it, depth first in the schema's order (so a multimodal
    message's nested ``content`` list is not lost), a struct's fields joined by a line
    break (nulls left out, fields without text such as a turn number ignored), a list's
    items by a blank line; a null list stays null (an invalid record), an empty one is
    empty (likewise). Only the near and exact stages see this text; the clean copy keeps
    the column as stored."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    if not _holds_text(t):
        return None
    if not (pa.types.is_struct(t) or _listed(t)):  # a text
        return arr.cast(pa.large_string())
    if pa.types.is_struct(t):
        parts = [p for i in range(t.num_fields)
                 if (p := text_parts(pc.struct_field(arr, [i]))) is not None]
        n, k = len(arr), len(parts)
        order = (np.arange(n)[:, None] + n * np.arange(k)[None, :]).ravel()  # row by row
        return _join_rows(pa.concat_arrays(parts).take(pa.array(order)),
                          np.arange(0, n * k + 1, k, dtype=np.int64), _FIELDS)
    if pa.types.is_fixed_size_list(t):  # (a cast to a list fails on a null record)
        offsets = (np.arange(len(arr) + 1, dtype=np.int64) + arr.offset) * t.list_size
    else:  # (a copy, from 0: from_arrays takes no mask with a slice of offsets)
        offsets = np.asarray(arr.offsets, np.int64)
    first = int(offsets[0])
    items = text_parts(arr.values.slice(first, int(offsets[-1]) - first))
    return _join_rows(items, offsets - first, _ITEMS, arr.is_null())


def numeric(t: pa.DataType) -> bool:
    """Whether a column holds numeric tensors (numbers, or lists of them at any depth)."""
    return _leaf_dtype(_layout(t)[1]) is not None


def unsupported(path: str, name: str, t: pa.DataType) -> str:
    """The one line for a tensor column that neither ``input.decode: none`` (numbers) nor
    text, bytes or image (one encoded value per record) reads, whichever was set."""
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return (f"{path}: input.tensor: column {name!r} holds {t}, a list view, which is not "
                "read (pyarrow casts list views to lists wrongly): write the column as a list "
                "(list or fixed_size_list, e.g. with Table.cast) and run again")
    return (f"{path}: input.tensor: column {name!r} holds {t}: not numbers, and not one "
            "string, binary or image value per record, so no input.decode reads it "
            "(structs other than Hugging Face Image() or inside a list, timestamps, "
            "decimals and maps are not supported): point input.tensor at a numeric (list) "
            "column, or at a string, binary or image column, or a list holding texts (a "
            "chat's messages), with input.decode: text, bytes or image")


def check_columns(path: str, schema: pa.Schema, spec: TensorSpec) -> None:
    """``input.tensor``, ``input.id`` and ``keep`` each name one column of the file (a
    mistyped name gets the nearest one), the id column holds values that can be ids
    (strings: the read would fail on its cast in the middle of the job) and the keep
    column numbers."""
    for key, name in (*(("input.tensor", c) for c in spec.columns or (spec.tensor,)),
                      ("input.id", spec.id), ("keep", spec.rank)):
        if name is None:
            continue
        found = schema.get_all_field_indices(name)
        if len(found) > 1:
            raise InputError(f"{path}: {key}: the file has {len(found)} columns named {name!r}, "
                             "so the name is ambiguous: rename all but one of them (e.g. with "
                             "Table.rename_columns) and write the file again")
        if not found:
            nested = _nested_field(schema, name)
            if nested:
                raise InputError(f"{path}: {key}: {nested}")
            near = nearest_name(name, schema.names)
            raise InputError(f"{path}: {key}: no column {name!r}"
                             f"{f' (did you mean {near!r}?)' if near else ''}; the file has "
                             f"columns {listed_names(schema.names)}")
    if spec.id is not None:
        t = schema.field(spec.id).type
        try:
            pa.array([], t).cast(pa.string())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            raise InputError(f"{path}: input.id: column {spec.id!r} holds {t}, which cannot "
                             "be an id (ids are strings): name a column of strings or numbers, "
                             "or leave input.id out (ids default to <file>:<row>)") from None
    check_rank(path, schema, spec)


def _nested_field(schema: pa.Schema, name: str) -> str | None:
    """Why a dotted name (``features.embedding``) that names a field inside a struct
    column is not read, and the way out; None if it names none."""
    head, _, rest = name.partition(".")
    if not rest or schema.get_field_index(head) < 0:
        return None
    t = schema.field(head).type
    if not pa.types.is_struct(t):
        return None
    fields = [t.field(i).name for i in range(t.num_fields)]
    return (f"{name!r} is a field inside the struct column {head!r} (its fields: "
            f"{listed_names(fields)}), and only top-level columns are read: write the field "
            f"as a column of its own (pyarrow's Table.flatten() names it {name!r}) and run "
            "again")


# What to set for a column of encoded values (value_kind), with jaccard (ragged) or not.
_ANY_DECODE = ("to decode it set input.decode: image (encoded images, e.g. Hugging Face "
               "Image()), text or bytes")
_DECODE_FIX = {
    ("text", True): JACCARD_TEXT_FIX,
    ("text", False): "to read its texts set input.decode: text",
    ("binary", True): "set input.decode: text to read UTF-8 bytes as texts",
    ("binary", False): _ANY_DECODE,
    ("struct", True): "jaccard compares texts or token ids, not encoded images",
    ("struct", False): _ANY_DECODE,
}


def check(path: str, spec: TensorSpec) -> TensorSpec:
    pf = open_file(path)
    if isinstance(pf, Exception):
        return spec  # reported as invalid by read()
    resolved = check_schema(path, pf.schema_arrow, spec)
    if resolved.columns:
        check_int_range(path, pf.metadata, resolved)
    return resolved


def check_schema(path: str, schema: pa.Schema, spec: TensorSpec) -> TensorSpec:
    """``check`` of a file's Arrow schema (also JSON lines', as their first lines hold
    it): the spec with the dtype and, for fixed-size lists, the shape the column holds
    (and a feature table's column globs expanded)."""
    spec = expanded(path, schema, spec)
    check_columns(path, schema, spec)
    if spec.columns:
        schema = with_field(path, schema, spec)
    t = schema.field(spec.tensor).type
    sizes, leaf = _layout(t)
    dtype = _leaf_dtype(leaf)
    kind = value_kind(t)
    if dtype is None and kind is not None:
        raise InputError(f"{path}: input.tensor: column {spec.tensor!r} holds {leaf}, not "
                         f"numbers: {_DECODE_FIX[kind, spec.ragged]}")
    if dtype is None:
        raise InputError(unsupported(path, spec.tensor, t))
    if spec.ragged and len(sizes) != 1:
        raise InputError(f"{path}: input.tensor: column {spec.tensor!r} holds "
                         f"{schema.field(spec.tensor).type}, not one sequence of integers per "
                         "record (list<int>): jaccard compares token sequences or texts "
                         "(input.decode: text); name such a column")
    if spec.dtype is not None and spec.dtype != dtype:
        raise InputError(f"{path}: input.dtype: column {spec.tensor!r} holds {dtype}, not "
                         f"{spec.dtype}: set input.dtype: {dtype} or leave it out")
    if spec.shape is not None and len(spec.shape) != len(sizes):
        raise InputError(f"{path}: input.shape: column {spec.tensor!r} has {len(sizes)} list "
                         f"level(s), so a shape of {len(sizes)} dimension(s), not "
                         f"{list(spec.shape)}: fix input.shape or leave it out")
    fixed = tuple(sizes) if None not in sizes else None
    # variable-size lists: input.shape picks the records to read (others are invalid, with
    # the reason), so a first row of another shape is no error (ragged data, near needs one)
    if spec.shape is not None and fixed is not None and fixed != tuple(spec.shape):
        raise InputError(f"{path}: input.shape: column {spec.tensor!r} holds tensors of shape "
                         f"{list(fixed)}, not {list(spec.shape)}: fix input.shape or leave it out")
    return replace(spec, dtype=dtype, shape=fixed if fixed is not None else spec.shape)


def check_rank(path: str, schema: pa.Schema, spec: TensorSpec) -> None:
    """``keep: {max|min: column}`` names a numeric column (numeric or encoded records)."""
    if spec.rank is not None and not _is_numeric(schema.field(spec.rank).type):
        raise InputError(f"{path}: keep: column {spec.rank!r} holds "
                         f"{schema.field(spec.rank).type}, not numbers: keep by a numeric column")


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """Whole row groups per unit, about ``target_rows`` records; records of no fixed size
    (texts, encoded images) also at most about UNIT_BYTES, or a single 400 MB
    file of texts was one unit, read, shingled and hashed by one worker while the
    others waited."""
    pf = open_file(path)
    if isinstance(pf, Exception):
        return [Unit(file_index, path, 0, None)]
    units, start, rows, size = [], 0, 0, 0
    most = UNIT_BYTES if spec is None or record_nbytes(spec) is None else float("inf")
    last = pf.metadata.num_row_groups - 1
    for i in range(last + 1):
        rows += pf.metadata.row_group(i).num_rows
        size += pf.metadata.row_group(i).total_byte_size + _path_rows(pf, i, spec) * PATH_BYTES
        if rows - start >= target_rows or size >= most or i == last:
            units.append(Unit(file_index, path, start, rows))
            start, size = rows, 0
    return units or [Unit(file_index, path, 0, 0)]


# An image a path-only row names (a Hugging Face ``Image()`` row with null bytes: the
# index of a folder of image files) counts this many bytes towards its unit, so that
# units hold about 2,048 images: the paths alone are ~100 bytes, and an index of 1M
# photos was planned as 11 units of 87,381, read by 11 workers whatever the cluster.
PATH_BYTES = UNIT_BYTES // 2048


def _path_rows(pf: pq.ParquetFile, rg: int, spec: TensorSpec | None) -> int:
    """Rows of row group ``rg`` whose image is only a path (null ``bytes``, by the
    column chunk's statistics; 0 where they are not kept)."""
    if spec is None or spec.decode is None or spec.decode.kind != "image":
        return 0
    meta = pf.metadata.row_group(rg)
    for j in range(meta.num_columns):
        col = meta.column(j)
        if col.path_in_schema == f"{spec.tensor}.bytes" and col.is_stats_set:
            return col.statistics.null_count or 0
    return 0


def _not_null(col: pa.Array) -> np.ndarray:
    """Writable bool mask of the non-null entries (no work for a column without nulls)."""
    if col.null_count == 0:
        return np.ones(len(col), dtype=bool)
    return col.is_valid().to_numpy(zero_copy_only=False).copy()


def tensor_rows(col: pa.Array, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(ok mask, tensors of the ok rows) of a (nested) list column, without a Python loop.

    A row is ok when it is not null, holds no null, and every list level has the
    length ``shape`` gives. Clean columns (the usual case) cost one length check per
    level and a reshape.
    """
    n = len(col)
    ok = _not_null(col)
    levels = [col]
    for size in shape:
        lengths = pc.list_value_length(levels[-1]).to_numpy(zero_copy_only=False)
        ok[_top_rows(levels, np.flatnonzero(lengths != size))] = False  # null length is NaN
        levels.append(levels[-1].flatten())
    if levels[-1].null_count:  # leaves: millions of values, only checked when nulls exist
        ok[_top_rows(levels, np.flatnonzero(~_not_null(levels[-1])))] = False
    if not ok.all():
        return ok, tensor_rows(col.filter(pa.array(ok)), shape)[1]
    return ok, levels[-1].to_numpy(zero_copy_only=False).reshape((n, *shape))


def _top_rows(levels: list[pa.Array], idx: np.ndarray) -> np.ndarray:
    """Map indices into ``levels[-1]`` (each level the flattened previous one) to top rows."""
    for level in reversed(levels[:-1] if len(idx) else []):
        idx = pc.list_parent_indices(level).to_numpy()[idx]
    return idx


def row_shapes(col: pa.Array, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """(ok mask, (n, depth) shapes) of a variable-size list column, without a Python loop.

    A row is not ok when it is null or ragged (sublists of one level differ in length).
    """
    n = len(col)
    ok = _not_null(col)
    shapes = np.zeros((n, depth), dtype=np.int64)
    level, top = col, np.arange(n)
    for k in range(depth):
        lengths = pc.list_value_length(level).to_numpy(zero_copy_only=False).astype(np.float64)
        lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
        with np.errstate(invalid="ignore"):  # NaN = a null list: the row is not ok
            np.minimum.at(lo, top, lengths)
            np.maximum.at(hi, top, lengths)
        ok &= ~np.isnan(lo) & ~np.isnan(hi) & ((lo == hi) | np.isinf(lo))
        shapes[:, k] = np.where(np.isfinite(lo), np.nan_to_num(lo), 0)
        top = top[pc.list_parent_indices(level).to_numpy()]
        level = level.flatten()
    return ok, shapes


def _tensor_groups(col: pa.Array, shape: tuple[int, ...] | None, depth: int
                   ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """(ok mask, [(row indices, tensors)] per shape). One group when the shape is known;
    with no shape given, rows of each shape are a group (shape is part of identity)."""
    if shape is not None:
        ok, tensors = tensor_rows(col, shape)
        return ok, [(np.flatnonzero(ok), tensors)]
    ok, shapes = row_shapes(col, depth)
    groups = []
    for s in np.unique(shapes[ok], axis=0):
        rows = np.flatnonzero(ok & (shapes == s).all(axis=1))
        sub_ok, tensors = tensor_rows(col.take(pa.array(rows)), tuple(int(d) for d in s))
        ok[rows[~sub_ok]] = False
        groups.append((rows[sub_ok], tensors))
    return ok, groups


def table_chunks(file_index: int, path: str, table: pa.Table, first: int, spec: TensorSpec
            ) -> list[Chunk]:
    """Chunks (one per tensor shape) and the invalid records of a slice of a row group."""
    positions = np.arange(first, first + table.num_rows, dtype=np.int64)
    col, why = (assembled(table, spec) if spec.columns
                else (table.column(spec.tensor).combine_chunks(), {}))
    if spec.ragged:
        return [_ragged_chunk(file_index, path, table, col, positions, spec)]
    sizes = _layout(col.type)[0]
    shape = tuple(spec.shape) if spec.shape is not None else (
        tuple(sizes) if None not in sizes else None)  # fixed_size_list: shape from the type
    tensor_ok, groups = _tensor_groups(col, shape, len(sizes))
    ok = tensor_ok.copy()
    if spec.id is None:
        ids = default_ids_arrow(path, positions)
    else:
        ids = table.column(spec.id).combine_chunks().cast(pa.string())
        if ids.null_count:
            ok &= ids.is_valid().to_numpy(zero_copy_only=False)
            ids = pc.coalesce(ids, default_ids_arrow(path, positions))
    bad_tensor = (f"column {spec.tensor!r}: null, null values, ragged or a shape other than "
                  f"{list(shape)}" if shape else
                  f"column {spec.tensor!r}: null, null values or ragged")
    invalid = [InvalidRecord(int(positions[i]), ids[int(i)].as_py(),
                             why.get(int(i), bad_tensor) if not tensor_ok[i]
                             else f"column {spec.id!r}: null id")
               for i in np.flatnonzero(~ok)]
    rank = None
    if spec.rank is not None:
        rank = table.column(spec.rank).cast(pa.float64()).to_numpy()
    if not invalid and len(groups) == 1:  # the usual case: no copies
        return [Chunk(file_index, positions, ids, groups[0][1], rank)]
    chunks = []
    for rows, tensors in groups:
        keep = ok[rows]
        rows = rows[keep]
        chunks.append(Chunk(file_index, positions[rows], ids.take(pa.array(rows)),
                            tensors[keep], None if rank is None else rank[rows]))
    if invalid or not chunks:
        chunks.append(Chunk.of_invalid(file_index, invalid))
    return chunks


def pieces_reader(pieces: Callable[..., Iterable[tuple[int, pa.Table] | InvalidRecord]]
                  ) -> Callable[..., Iterator[Chunk]]:
    """``read`` of a format whose ``pieces(unit, spec, rows, max_bytes)`` yields (first
    position, table) and invalid records (JSON lines, Arrow streams): its tables cut
    into chunks as a row group's are."""
    def read(unit: Unit, spec: TensorSpec, batch_rows: int,
             batch_bytes: int | None = None) -> Iterator[Chunk]:
        rows = rows_within(batch_rows, batch_bytes, record_nbytes(spec))
        for got in pieces(unit, spec, rows, batch_bytes):
            if isinstance(got, InvalidRecord):
                yield Chunk.of_invalid(unit.file_index, [got])
            else:
                yield from table_chunks(unit.file_index, unit.path, got[1], got[0], spec)

    return read


def _ragged_chunk(file_index: int, path: str, table: pa.Table, col: pa.Array,
                  positions: np.ndarray, spec: TensorSpec) -> Chunk:
    """A list column of integer sequences of any length as one chunk (``ragged_rows``);
    a null list, a null value or a nested list is an invalid record."""
    ids = (default_ids_arrow(path, positions) if spec.id is None
           else table.column(spec.id).combine_chunks().cast(pa.string()))
    if pa.types.is_fixed_size_list(col.type):
        col = col.cast(pa.list_(col.type.value_type))
    flat_ok = (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) and (
        pa.types.is_integer(col.type.value_type))
    ok = _not_null(col) & (ids.is_valid().to_numpy(zero_copy_only=False) if ids.null_count
                           else True)
    if flat_ok and col.flatten().null_count:
        leaf_null = ~_not_null(col.flatten())
        ok[pc.list_parent_indices(col).to_numpy()[leaf_null]] = False
    if not flat_ok:
        ok[:] = False
    why = (f"column {spec.tensor!r}: null, null values, or not a list of integers "
           "(near.metric jaccard compares integer sequences)")
    invalid = [InvalidRecord(int(positions[i]), ids[int(i)].as_py() or "", why)
               for i in np.flatnonzero(~ok)]
    good = col.filter(pa.array(ok)) if not ok.all() else col
    rows = np.flatnonzero(ok)
    offsets = np.asarray(good.offsets, np.int64)
    values = good.flatten().to_numpy(zero_copy_only=False) if flat_ok else np.zeros(0, np.int64)
    tensors, digests = ragged_rows(offsets - offsets[0], values)
    rank = None
    if spec.rank is not None:
        rank = table.column(spec.rank).cast(pa.float64()).to_numpy()[rows]
    return Chunk(file_index, positions[rows], ids.take(pa.array(rows, pa.int64())), tensors,
                 rank, invalid, digests)


def _row_bytes(pf: pq.ParquetFile, rg: int, spec: TensorSpec) -> float:
    """Bytes of one record's tensor: from the spec, else (variable-size lists) the mean
    over this row group, from the number of values its metadata counts (not its stored
    size: dictionary pages shrink that far below the values)."""
    known = record_nbytes(spec)
    if known is not None:
        return known
    if spec.columns:  # one number per column, at most 8 bytes
        return 8 * len(spec.columns)
    meta = pf.metadata.row_group(rg)
    values = sum(meta.column(j).num_values for j in range(meta.num_columns)
                 if meta.column(j).path_in_schema.split(".")[0] == spec.tensor)
    leaf = _leaf_dtype(_layout(pf.schema_arrow.field(spec.tensor).type)[1]) or "float64"
    return values * np.dtype(leaf).itemsize / max(1, meta.num_rows)


def _batches(pf: pq.ParquetFile, start: int, stop: int, columns: list[str], spec: TensorSpec,
             batch_rows: int, batch_bytes: int | None
             ) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """(row group, first position, rows, table or the read error) of the batches of the
    row groups in [start, stop). Why batches, not whole row groups: a row group can hold
    GBs of wide tensors, and Arrow needs about 5x a group's size to read it whole."""
    for rg, first, n in row_groups(pf, start, stop):
        row_bytes = _row_bytes(pf, rg, spec)
        rows = rows_within(batch_rows, batch_bytes, row_bytes)
        step = rows_within(rows, DECODE_BYTES, row_bytes)  # a batch holds whole decodes
        done, held, have = 0, [], 0
        try:
            check_rest(pf, rg, columns)
            for b in pf.iter_batches(batch_size=step, row_groups=[rg], columns=columns):
                if held and have + b.num_rows > rows:
                    yield rg, first + done, have, pa.Table.from_batches(held)
                    done, held, have = done + have, [], 0
                held.append(b)
                have += b.num_rows
            if done + have != n:  # fewer rows than the group holds: none of it is used
                raise short_read(pf, rg, done + have)
            if held:
                yield rg, first + done, have, pa.Table.from_batches(held)
        except (OSError, pa.ArrowException) as e:
            yield rg, first + done, n - done, e


def _pieces(path: str, pf: pq.ParquetFile, start: int, stop: int, columns: list[str],
            spec: TensorSpec, batch_rows: int, batch_bytes: int | None
            ) -> Iterator[tuple[int, int, int, pa.Table | Exception]]:
    """``_batches``, read ahead: when every row group is one batch, whole groups are read
    several at a time (``ahead_depth``; each thread with its own reader) and small ones
    joined into batches (``joined``); else in order, one batch ahead."""
    groups = list(row_groups(pf, start, stop))
    fits = [rows_within(batch_rows, batch_bytes, _row_bytes(pf, rg, spec)) for rg, _, _ in groups]
    if all(most >= n for most, (_, _, n) in zip(fits, groups, strict=True)):
        return joined(read_groups(path, pf, groups, columns, whole=True), min(fits, default=1))
    return ahead(_batches(pf, start, stop, columns, spec, batch_rows, batch_bytes))


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    pf = open_file(unit.path)
    if isinstance(pf, Exception):
        yield Chunk.of_invalid(unit.file_index, [
            unreadable_file(unit.path, f"unreadable Parquet file: {error_line(pf)}")])
        return
    stop = total_rows(pf) if unit.stop is None else unit.stop
    for rg, first, n, table in _pieces(unit.path, pf, unit.start, stop, read_columns(spec), spec,
                                       batch_rows, batch_bytes):
        if isinstance(table, Exception):
            why = group_reason(rg, table)
            for a in range(first, first + n, batch_rows):
                positions = np.arange(a, min(a + batch_rows, first + n), dtype=np.int64)
                yield Chunk.of_invalid(unit.file_index, [
                    InvalidRecord(int(p), i, why)
                    for p, i in zip(positions, default_ids(unit.path, positions), strict=True)])
            continue
        yield from table_chunks(unit.file_index, unit.path, table, first, spec)


def groups_at(path: str, names: list[str], positions: list[int]
              ) -> Iterator[tuple[int, list[int], pa.Table]]:
    """(first position, positions within the group, the group's columns ``names``) for each
    readable row group of one file that holds some of ``positions``: only those groups
    are read, only that column, several at a time (the report's page shows a few
    records of many groups)."""
    pf = open_file(path)
    want = sorted(set(int(p) for p in positions))
    if isinstance(pf, Exception) or not want:
        return
    local = {}
    for rg, first, n in row_groups(pf, 0, total_rows(pf)):
        mine = [p - first for p in want if first <= p < first + n]
        if mine:
            local[rg] = (first, n, mine)
    groups = [(rg, first, n) for rg, (first, n, _) in local.items()]
    for rg, first, _, table in read_groups(path, pf, groups, names):
        if not isinstance(table, Exception):
            yield first, local[rg][2], table


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tensors at ``positions`` (as ``read`` numbers them) of one file, for showing a
    few records. Positions that are invalid or out of range are left out."""
    out: dict[int, np.ndarray] = {}
    for offset, local, table in groups_at(path, list(spec.columns or (spec.tensor,)),
                                          positions):
        out.update(_tensors_at(path, spec, table, offset, local))
    return out


def _tensors_at(path: str, spec: TensorSpec, table: pa.Table, offset: int, local: list[int]
                ) -> dict[int, np.ndarray]:
    """{offset + row: tensor} of some rows of a row group (invalid ones left out)."""
    part = table.select(list(spec.columns or (spec.tensor,))).take(pa.array(local, pa.int64()))
    out = {}
    for chunk in table_chunks(0, path, part, 0, replace(spec, id=None, rank=None)):
        for i, p in enumerate(chunk.positions.tolist()):
            out[offset + local[p]] = chunk.tensors[i]
    return out


def write_showing(src: str, dst: str, drop: np.ndarray, spec: TensorSpec,
                  positions: list[int]) -> tuple[int, dict[int, np.ndarray]]:
    """``write``, and the tensors at ``positions`` as ``read_rows`` gives them, taken from
    the row groups the copy reads anyway: the report's page would read those groups
    again (2.1 s of the 2.2 s report of a 1M x 384 job, for 52 records in 15 groups)."""
    want = np.asarray(sorted(set(positions)), np.int64)
    shown: dict[int, np.ndarray] = {}

    def seen(table: pa.Table, first: int, n: int) -> None:  # in the copy's read threads
        lo, hi = np.searchsorted(want, [first, first + n])
        if hi > lo:
            shown.update(_tensors_at(src, spec, table, first, (want[lo:hi] - first).tolist()))

    return write(src, dst, drop, spec, seen=seen), shown
