"""Encoded values in Arrow IPC files: a string, binary or ``Image()`` struct column
(``input.decode: image | text | bytes``), as ``datasets`` saves texts and images.

The file's batches are read as the numeric reader reads them (``arrow.pieces``) and each
table's values become values as a Parquet column's do (``encoded_parquet.table_values``).
"""

from __future__ import annotations

from transforms.io.formats.arrow import pieces, schema
from transforms.io.formats.base import TensorSpec, Unit
from transforms.io.formats.encoded_parquet import (
    check_value_schema,
    reading,
)

FIRST_ROWS = 64  # the first values tried for the check


read_values, values_at = reading(pieces)


def check(path: str, spec: TensorSpec) -> tuple[bytes | str, str] | None:
    """(first value, where) after checking that the columns exist and the tensor column
    holds encoded values; None when the file has no usable value to try."""
    found = schema(path)
    if found is None:
        return None
    check_value_schema(path, found, spec)
    for vals in read_values(Unit(0, path), spec, FIRST_ROWS, 1 << 62):
        if vals.values:
            return vals.values[0], f"column {spec.tensor!r}"
        if vals.positions.size or vals.invalid:
            break
    return None
