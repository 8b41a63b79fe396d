"""Encoded values in JSON lines: a string field per line, most often a text
(``input.decode: text``; ``bytes`` compares its UTF-8 bytes).

Lines are read and parsed as the numeric reader reads them (``jsonl.pieces``), blocks
of at most ``rows`` lines and ``max_bytes`` of them, and each table's strings become
values as a Parquet string column's do (``encoded_parquet.table_values``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from transforms.io.formats.base import TensorSpec, Unit, Values
from transforms.io.formats.encoded_parquet import (
    check_value_schema,
    reading,
)
from transforms.io.formats.jsonl import flat, in_fields, pieces, sample

read_values, values_at = reading(pieces)


def check(path: str, spec: TensorSpec) -> tuple[str, str] | None:
    """(first value, where) after checking that the fields exist and the tensor field
    holds strings in the first lines; None when none of them holds one."""
    found = sample(path)
    if found is None:
        return None
    with in_fields():
        check_value_schema(path, flat(found[0]), spec)
    return first_value(read_values, path, spec, len(found[1]), f"field {spec.tensor!r}")


def first_value(read_values: Callable[..., Iterator[Values]], path: str, spec: TensorSpec,
                lines: int, where: str) -> tuple[str, str] | None:
    """(the first of a file's first ``lines`` values, ``where``), or None if none is one."""
    for vals in read_values(Unit(0, path), spec, lines, 1 << 62):
        if vals.values:
            return vals.values[0], where
        break
    return None
