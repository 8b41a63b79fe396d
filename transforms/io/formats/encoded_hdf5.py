"""Encoded values in HDF5: a 1-D dataset of variable-length uint8 arrays (the usual way to
store image files in HDF5), of variable-length bytes or strings, or of opaque values.

Rows are read in steps sized from the bytes per row seen so far, so a step holds about
``max_bytes`` of encoded data; a step that cannot be read makes its rows invalid.
"""

from __future__ import annotations

from collections.abc import Iterator

import h5py
import numpy as np

from transforms.io.formats.base import (
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    Values,
    as_ids,
    default_ids,
    error_line,
    unreadable_file,
)
from transforms.io.formats.hdf5 import check_sides
from transforms.io.formats.hdf5_files import H5_ERRORS, open_dataset, opened_h5, value_kind


def _as_value(v: object) -> bytes | str:
    if isinstance(v, np.ndarray):
        return v.tobytes()
    if isinstance(v, np.void):
        return v.tobytes()
    return v  # bytes, or str from a UTF-8 string dataset


def check(path: str, spec: TensorSpec) -> tuple[bytes | str, str] | None:
    with opened_h5(path) as f:
        if isinstance(f, Exception):
            return None
        ds = open_dataset(f, path, "input.tensor", spec.tensor)
        if value_kind(ds.dtype) is None or len(ds.shape) != 1:
            raise InputError(f"{path}: input.decode: dataset {spec.tensor!r} holds {ds.dtype} "
                             f"of shape {list(ds.shape)}, not one encoded value per record "
                             "(variable-length uint8 or bytes): set input.decode: none for "
                             "numeric tensors")
        check_sides(f, path, spec, len(ds))
        if not len(ds):
            return None
        try:
            first = _as_value(ds[0])
        except H5_ERRORS:
            return None
    return first, f"dataset {spec.tensor!r}"


def _step(ds: h5py.Dataset, id_ds: h5py.Dataset | None, rank_ds: h5py.Dataset | None,
          unit: Unit, a: int, b: int) -> Values:
    positions = np.arange(a, b, dtype=np.int64)
    try:
        raw = ds[a:b]
        ids, not_text = (default_ids(unit.path, positions), []) if id_ds is None else as_ids(
            id_ds[a:b])
        rank = None if rank_ds is None else rank_ds[a:b].astype(np.float64)
    except H5_ERRORS as e:
        why = f"unreadable {ds.name}[{a}:{b}]: {error_line(e)}"
        return Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                      [InvalidRecord(int(p), i, why) for p, i in zip(
                          positions.tolist(), default_ids(unit.path, positions), strict=True)])
    ok = np.ones(b - a, dtype=bool)
    ok[not_text] = False
    invalid = [InvalidRecord(a + p, ids[p], f"{id_ds.name}: id is not UTF-8") for p in not_text]
    keep = np.flatnonzero(ok)
    return Values(unit.file_index, positions[keep], ids[keep],
                  [_as_value(raw[i]) for i in keep.tolist()],
                  None if rank is None else rank[keep], invalid)


def read_values(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int) -> Iterator[Values]:
    with opened_h5(unit.path) as f:
        if isinstance(f, Exception):
            yield Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                         [unreadable_file(unit.path, f"unreadable HDF5 file: {error_line(f)}")])
            return
        ds, id_ds, rank_ds = (None if name is None else f[name]
                              for name in (spec.tensor, spec.id, spec.rank))
        stop = len(ds) if unit.stop is None else min(unit.stop, len(ds))
        a, step = unit.start, min(rows, 64)
        while a < stop:
            b = min(a + step, stop)
            vals = _step(ds, id_ds, rank_ds, unit, a, b)
            yield vals
            size = sum(len(v) for v in vals.values)
            if vals.values:  # next step: about max_bytes at the bytes per row seen
                step = int(np.clip(max_bytes * len(vals.values) // max(size, 1), 1, rows))
            a = b


def values_at(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, bytes | str]:
    with opened_h5(path) as f:
        if isinstance(f, Exception):
            return {}
        ds = f[spec.tensor]
        want = sorted(p for p in set(int(p) for p in positions) if 0 <= p < len(ds))
        try:
            return {p: _as_value(v) for p, v in zip(want, ds[want] if want else [],
                                                    strict=True)}
        except H5_ERRORS:
            return {}
