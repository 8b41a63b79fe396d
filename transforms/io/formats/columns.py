"""A record made of several numeric columns, one value each (``input.tensor: [a, b, c]``):
a feature table as pandas writes it, one column per feature. The table formats (Parquet,
Arrow IPC, JSON lines) read the named columns and join each row's values into one vector
of their common dtype, so everything after the read sees one ``fixed_size_list`` column
named ``TensorSpec.tensor`` and the clean copy keeps the rows as they were."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from transforms.io.formats.base import InputError, TensorSpec

EXACT_INT = 2 ** 53  # integers a float64 holds exactly; larger ones would merge as floats


def named(columns: list[str] | tuple[str, ...]) -> str:
    """How messages and the report name the vector the columns make."""
    shown = list(columns) if len(columns) <= 6 else [columns[0], "...", columns[-1]]
    return f"[{', '.join(shown)}]" + (f" ({len(columns)} columns)" if len(columns) > 6 else "")


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
