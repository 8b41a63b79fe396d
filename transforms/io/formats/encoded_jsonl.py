"""Encoded values in JSON lines: a string field per line, most often a text
(``input.decode: text``; ``bytes`` compares its UTF-8 bytes).

Lines are read and parsed as the numeric reader reads them (``jsonl.pieces``), blocks
of at most ``rows`` lines and ``max_bytes`` of them, and each table's strings become
values as a Parquet string column's do (``encoded_parquet.table_values``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from transforms.io.formats.base import InvalidRecord, TensorSpec, Unit, Values
from transforms.io.formats.encoded_parquet import check_value_schema, table_values
from transforms.io.formats.jsonl import flat, in_fields, pieces, sample


def check(path: str, spec: TensorSpec) -> tuple[str, str] | None:
    """(first value, where) after checking that the fields exist and the tensor field
    holds strings in the first lines; None when none of them holds one."""
    found = sample(path)
    if found is None:
        return None
    with in_fields():
        check_value_schema(path, flat(found[0]), spec)
    for vals in read_values(Unit(0, path), spec, len(found[1]), 1 << 62):
        if vals.values:
            return vals.values[0], f"field {spec.tensor!r}"
        break
    return None


def read_values(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int) -> Iterator[Values]:
    for got in pieces(unit, spec, rows, max_bytes):
        if isinstance(got, InvalidRecord):
            yield Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                         [got])
        else:
            yield table_values(unit, got[1], got[0], spec)


def values_at(path: str, spec: TensorSpec, positions: Iterable[int]) -> dict[int, bytes | str]:
    """The stored values at ``positions``: the file is read up to the last one wanted,
    with the job's own reader (positions mean the same)."""
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

