"""A record made of several numeric columns, one value each (``input.tensor: [a, b, c]``):
a feature table as pandas writes it, one column per feature. The table formats (Parquet,
Arrow IPC, JSON lines, CSV) read the named columns and join each row's values into one vector
of their common dtype, so everything after the read sees one ``fixed_size_list`` column
named ``TensorSpec.tensor`` and the clean copy keeps the rows as they were."""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase

import numpy as np
import pyarrow as pa

from transforms.io.formats.base import InputError, TensorSpec, listed_names

EXACT_INT = 2 ** 53  # integers a float64 holds exactly; larger ones would merge as floats


def named(columns: list[str] | tuple[str, ...]) -> str:
    """How messages and the report name the vector the columns make."""
    shown = list(columns) if len(columns) <= 6 else [columns[0], "...", columns[-1]]
    return f"[{', '.join(shown)}]" + (f" ({len(columns)} columns)" if len(columns) > 6 else "")


def is_pattern(name: str) -> bool:
    """Whether a listed column is a glob (``f*``, ``x[0-9]``) over the file's columns."""
    return any(c in name for c in "*?[")


def expanded(path: str, schema: pa.Schema, spec: TensorSpec) -> TensorSpec:
    """``spec`` with each glob among its columns replaced by the numeric columns it
    matches, in the file's order (the id and keep columns never; a text column a glob
    matches is left out, as it makes no number), so ``[f*]`` names a wide table's
    features; a glob that matches no numeric column is refused, listing the columns."""
    if not any(is_pattern(c) for c in spec.columns):
        return spec
    out = []
    for name in spec.columns:
        if not is_pattern(name):
            out.append(name)
            continue
        hits = [c for c in dict.fromkeys(schema.names)
                if fnmatchcase(c, name) and c not in (spec.id, spec.rank)]
        shared = next((c for c in hits if len(schema.get_all_field_indices(c)) > 1), None)
        if shared is not None:
            raise InputError(f"{path}: input.tensor: {name!r} matches {shared!r}, the name of "
                             f"{len(schema.get_all_field_indices(shared))} columns: rename all "
                             "but one of them and write the file again")
        hits = [c for c in hits if _dtype(schema.field(c).type) is not None]
        if not hits:
            raise InputError(f"{path}: input.tensor: {name!r} matches no numeric column; the "
                             f"file has columns {listed_names(schema.names)}")
        out += hits
    columns = tuple(dict.fromkeys(out))
    return replace(spec, columns=columns, tensor=named(columns), shape=(len(columns),))


def _dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype())
    return None


def with_field(path: str, schema: pa.Schema, spec: TensorSpec) -> pa.Schema:
    """``schema`` with the vector's field added (``fixed_size_list`` of the columns' common
    dtype, or ``input.dtype``); a column that holds no plain numbers is refused, naming it
    (each column exists: the caller checked)."""
    dtypes = []
    for name in spec.columns:
        t = schema.field(name).type
        got = _dtype(t)
        if pa.types.is_null(t):
            raise InputError(f"{path}: input.tensor: column {name!r} holds no value in the "
                             "whole file (its type is null): every record would be invalid; "
                             "leave it out of input.tensor")
        if got is None:
            raise InputError(
                f"{path}: input.tensor: column {name!r} holds {t}, not numbers: a list of "
                "columns makes each record's vector of one number per column (a feature "
                "table); leave non-numeric columns out of input.tensor (they are copied to "
                "the output as they are), or name one column of lists or texts instead")
        dtypes.append(got)
    try:
        common = np.dtype(spec.dtype) if spec.dtype else np.result_type(*dtypes)
        leaf = pa.from_numpy_dtype(common)
    except (TypeError, pa.ArrowNotImplementedError):
        raise InputError(f"{path}: input.dtype: {spec.dtype} is not a dtype the columns "
                         "can be read as: use float32, float64 or an integer dtype, or "
                         "leave it out") from None
    if schema.get_field_index(spec.tensor) >= 0:
        raise InputError(f"{path}: input.tensor: the file has a column named "
                         f"{spec.tensor!r}, as the job names the columns' vector: rename it")
    return schema.append(pa.field(spec.tensor, pa.list_(leaf, len(spec.columns))))


def check_int_range(path: str, meta, spec: TensorSpec) -> None:
    """A Parquet file whose statistics show an integer column of the vector above 2^53
    while the vector is float: every such record would be invalid after all the work
    (``assembled``), so the run is refused now, naming the column."""
    if spec.dtype is None or np.dtype(spec.dtype).kind != "f":
        return
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for j in range(rg.num_columns):
            col = rg.column(j)
            stats = col.statistics
            if (col.path_in_schema not in spec.columns or col.physical_type != "INT64"
                    or stats is None or not stats.has_min_max):
                continue
            far = max(abs(int(stats.min)), abs(int(stats.max)))
            if far > EXACT_INT:
                raise InputError(
                    f"{path}: input.tensor: column {col.path_in_schema!r} holds integers up "
                    f"to {far:,} (row group {g}'s statistics), above 2^53, and the vector "
                    f"is {spec.dtype}, which does not hold them exactly (two of them could "
                    "compare equal): leave the column out of input.tensor (it is copied to "
                    "the output as it is), or set input.dtype: int64 if every column holds "
                    "integers")


def assembled(table: pa.Table, spec: TensorSpec) -> tuple[pa.Array, dict[int, str]]:
    """(the rows' vectors as a ``fixed_size_list`` array, null where a row is not read;
    {row: why} for those rows): a null in a column, or an integer above 2^53 where the
    common dtype is a float (two such integers would compare as one float)."""
    k, n = len(spec.columns), table.num_rows
    dtype = np.dtype(spec.dtype) if spec.dtype else np.result_type(
        *(_dtype(table.schema.field(c).type) for c in spec.columns))
    leaf = pa.from_numpy_dtype(dtype)
    out = np.empty((n, k), dtype)
    why: dict[int, str] = {}
    for j, name in enumerate(spec.columns):
        col = table.column(name).combine_chunks()
        bad = ~col.is_valid().to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(bad).tolist():
            why.setdefault(i, f"column {name!r}: null")
        values = col.fill_null(0) if col.null_count else col
        src = values.to_numpy(zero_copy_only=False)
        if dtype.kind == "f" and src.dtype.kind in "iu" and src.dtype.itemsize == 8:
            big = (src > EXACT_INT) if src.dtype.kind == "u" else (
                (src > EXACT_INT) | (src < -EXACT_INT))
            for i in np.flatnonzero(big & ~bad).tolist():
                why.setdefault(i, f"column {name!r}: {src[i]} is above 2^53, which "
                               f"{dtype} does not hold exactly (set input.dtype: int64 if "
                               "every column holds integers)")
        out[:, j] = src.astype(dtype, copy=False) if src.dtype != dtype else src
    mask = np.zeros(n, bool)
    mask[list(why)] = True
    values = pa.array(out.reshape(-1), leaf)
    arr = pa.FixedSizeListArray.from_arrays(values, k, mask=pa.array(mask) if why else None)
    return arr, why
