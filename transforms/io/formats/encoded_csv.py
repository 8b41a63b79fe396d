"""Encoded values in CSV: a text column (``input.decode: text``; ``bytes`` compares its
UTF-8 bytes), read as the numeric reader reads the lines (``csv.pieces``), each
table's strings becoming values as a Parquet string column's do."""

from __future__ import annotations

from transforms.io.formats.base import TensorSpec
from transforms.io.formats.csv import pieces, sample
from transforms.io.formats.encoded_jsonl import first_value
from transforms.io.formats.encoded_parquet import check_value_schema, reading

read_values, values_at = reading(pieces)


def check(path: str, spec: TensorSpec) -> tuple[str, str] | None:
    """(first value, where) after checking that the columns exist and the tensor column
    holds strings in the first lines; None when none of them holds one."""
    found = sample(path)
    if found is None:
        return None
    check_value_schema(path, found[0], spec)
    return first_value(read_values, path, spec, len(found[1]), f"column {spec.tensor!r}")
