"""HDF5 input: the first axis of an N-D dataset is the records; units are row ranges.

Why row ranges aligned to chunks: HDF5 reads (and decompresses) whole chunks, so a
unit that starts and ends on a chunk boundary never decodes a chunk twice, and one
big file is read in parallel. A corrupt chunk costs only its own rows: a failing
slice is split at chunk boundaries until the unreadable chunks are isolated.

The records dataset is the tensor dataset the job names (``spec.tensor``); called
without a spec, ``plan`` and ``write`` take the file's largest dataset (by number of
elements; the first in name order on a tie).

Files on other Beam filesystems (gs://, ...) are read through a seekable reader that
h5py uses as a Python file object (its "fileobj" driver): only the metadata and the
chunks a unit needs are fetched, and the chunk cache keeps a chunk that two batches
share from being fetched twice. The clean copy (which datasets it filters):
``hdf5_write``; opening files and reading rows around unreadable chunks: ``hdf5_files``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import h5py
import numpy as np

from transforms.canonical import DTYPE_CODES
from transforms.io.formats.base import (
    JACCARD_TEXT_FIX,
    UNIT_BYTES,
    Chunk,
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    as_ids,
    default_ids,
    error_line,
    ragged_tensors,
    record_nbytes,
    rows_within,
    unreadable_file,
)
from transforms.io.formats.hdf5_files import (
    H5_ERRORS,
    int_sequences,
    open_dataset,
    opened_h5,
    read_dataset_rows,
    records_dataset,
    row_chunk,
    value_kind,
    vlen_numbers,
)
from transforms.io.formats.hdf5_write import write  # noqa: F401 (the format's)


def _is_id_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or h5py.check_string_dtype(dtype) is not None


def _is_rank_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf"


def check(path: str, spec: TensorSpec) -> TensorSpec:
    with opened_h5(path) as f:
        if isinstance(f, Exception):
            return spec  # reported as invalid by read()
        try:
            return _check(f, path, spec)
        except H5_ERRORS:
            return spec  # a corrupt object header: reported as invalid by read()


def _check(f: h5py.File, path: str, spec: TensorSpec) -> TensorSpec:
    ds = open_dataset(f, path, "input.tensor", spec.tensor)
    if not ds.shape:
        raise InputError(f"{path}: input.tensor: dataset {spec.tensor!r} has no axes (shape "
                         f"{ds.shape}): name a dataset whose first axis is the records")
    check_sides(f, path, spec, len(ds))
    seqs = int_sequences(ds)
    if spec.ragged and seqs is not None:
        return replace(spec, shape=None, dtype=seqs.name)  # sequences of any length
    base = vlen_numbers(ds.dtype)
    ints = base is not None and base.kind in "iu"
    kind = value_kind(ds.dtype)
    if kind is not None:
        fix = (JACCARD_TEXT_FIX if spec.ragged
               else "to read them set input.decode: text, bytes or image")
        raise InputError(f"{path}: input.tensor: dataset {spec.tensor!r} holds {kind} values"
                         f" ({ds.dtype}), not numbers: {fix}")
    if ints:
        raise InputError(f"{path}: input.tensor: dataset {spec.tensor!r} holds sequences of "
                         f"{base.name} of no fixed length: near.metric: jaccard compares them "
                         "(token ids), and exact dedup alone (no near) reads them; distances "
                         "compare records of one shape (a dataset of shape [records, ...])")
    dtype = ds.dtype.name
    if dtype not in DTYPE_CODES:
        raise InputError(f"{path}: input.tensor: dataset {spec.tensor!r} holds {ds.dtype}, not "
                         "numbers: name a numeric or bool dataset")
    if spec.dtype is not None and spec.dtype != dtype:
        raise InputError(f"{path}: input.dtype: dataset {spec.tensor!r} holds {dtype}, not "
                         f"{spec.dtype}: set input.dtype: {dtype} or leave it out")
    shape = tuple(ds.shape[1:])
    if spec.shape is not None and tuple(spec.shape) != shape:
        raise InputError(f"{path}: input.shape: dataset {spec.tensor!r} has shape "
                         f"{list(ds.shape)}, so records of shape {list(shape)}, not "
                         f"{list(spec.shape)}: fix input.shape or leave it out")
    return replace(spec, shape=shape, dtype=dtype)


def check_sides(f: h5py.File, path: str, spec: TensorSpec, records: int) -> None:
    """The id and keep datasets (numeric or encoded records alike): one value per record,
    of a type they can be."""
    for key, name, ok, kinds in (("input.id", spec.id, _is_id_dtype, "strings or integers"),
                                 ("keep", spec.rank, _is_rank_dtype, "numbers")):
        if name is None:
            continue
        side = open_dataset(f, path, key, name)
        if side.shape != (records,):
            raise InputError(f"{path}: {key}: dataset {name!r} has shape {side.shape}, not "
                             f"({records},): it needs one value per record of {spec.tensor!r}")
        if not ok(side.dtype):
            raise InputError(f"{path}: {key}: dataset {name!r} holds {side.dtype}, not {kinds}: "
                             f"name a dataset of {kinds}")


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """Units of about ``target_rows`` whole chunks of the records dataset (with ``spec``,
    the tensor's: the last unit stops at its length, so the dry run counts records from
    the shapes); without ``spec`` the last unit runs to the end (stop None), so the units
    cover the tensor even if it is shorter or longer than the largest dataset. Where the
    spec does not fix a record's size, units also hold at most about UNIT_BYTES of
    values (``_record_nbytes``: variable-length values are sampled, as the dataset
    stores references to them)."""
    with opened_h5(path) as f:
        if isinstance(f, Exception):
            return [Unit(file_index, path, 0, None)]
        try:
            ds = records_dataset(f, spec)
        except H5_ERRORS:
            ds = None
        n, chunk = (len(ds), row_chunk(ds)) if ds is not None else (0, 1)
        if spec is not None and record_nbytes(spec) is None and n:
            target_rows = min(target_rows, int(UNIT_BYTES / _record_nbytes(ds)))
    step = max(1, round(target_rows / chunk)) * chunk
    starts = list(range(0, n, step)) or [0]
    last = n if spec is not None and ds is not None else None
    stops: list[int | None] = [*starts[1:], last]
    return [Unit(file_index, path, a, b) for a, b in zip(starts, stops, strict=True)]


SAMPLED_SPANS = 16  # _record_nbytes reads this many runs of records, spread over the dataset
SPAN_ROWS = 16


def _record_nbytes(ds: h5py.Dataset) -> float:
    """Bytes of a record's values: from the dtype where it fixes them; for
    variable-length values (texts, encoded images, token ids) their mean over
    SAMPLED_SPANS runs of SPAN_ROWS records spread over the dataset (1 where none can be
    read: the reader reports them)."""
    if ds.dtype.kind != "O":
        return max(1.0, float(ds.dtype.itemsize * np.prod(ds.shape[1:], dtype=np.int64)))
    n, sizes = len(ds), []
    for a in np.unique(np.linspace(0, max(0, n - SPAN_ROWS), SAMPLED_SPANS).astype(np.int64)):
        try:
            rows = ds[int(a):int(a) + SPAN_ROWS]
        except H5_ERRORS:
            continue
        sizes += [len(v.encode()) if isinstance(v, str) else
                  len(v) if isinstance(v, bytes) else np.asarray(v).nbytes for v in rows]
    return max(1.0, float(np.mean(sizes))) if sizes else 1.0


def _chunk(unit: Unit, a: int, b: int, ds: h5py.Dataset, id_ds: h5py.Dataset | None,
           rank_ds: h5py.Dataset | None) -> Chunk:
    positions = np.arange(a, b, dtype=np.int64)
    want = np.ones(b - a, dtype=bool)
    reasons: dict[int, str] = {}  # row offset -> why it is invalid (first failure wins)

    def rows(d: h5py.Dataset) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
        values, bad = read_dataset_rows(d, a, b, want)
        for lo, hi, why in bad:
            for p in range(lo - a, hi - a):
                reasons.setdefault(p, why)
        return values, bad

    tensors, _ = rows(ds)
    if id_ds is None:
        ids = default_ids(unit.path, positions)
    else:
        values, bad_ids = rows(id_ds)
        ids, not_text = as_ids(values)
        for p in not_text:
            reasons.setdefault(p, f"{id_ds.name}: id is not UTF-8")
        for lo, hi, _ in bad_ids:
            ids[lo - a:hi - a] = default_ids(unit.path, positions[lo - a:hi - a])
    rank = None if rank_ds is None else rows(rank_ds)[0].astype(np.float64)
    digests = None
    if tensors.dtype == object:  # variable-length integer sequences (TensorSpec.ragged)
        tensors, digests = ragged_tensors(tensors)
    if not reasons:
        return Chunk(unit.file_index, positions, ids, tensors, rank, digests=digests)
    invalid = [InvalidRecord(a + p, ids[p], why) for p, why in sorted(reasons.items())]
    ok = np.ones(b - a, dtype=bool)
    ok[list(reasons)] = False
    return Chunk(unit.file_index, positions[ok], ids[ok], tensors[ok],
                 None if rank is None else rank[ok], invalid,
                 None if digests is None else digests[ok])


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    with opened_h5(unit.path) as f:
        if isinstance(f, Exception):
            yield Chunk.of_invalid(unit.file_index, [unreadable_file(
                unit.path, f"unreadable HDF5 file: {error_line(f)}")])
            return
        try:
            ds, id_ds, rank_ds = (None if name is None else f[name]
                                  for name in (spec.tensor, spec.id, spec.rank))
        except H5_ERRORS as e:  # check() saw the names, so the object itself is corrupt
            yield Chunk.of_invalid(unit.file_index, [unreadable_file(
                unit.path, f"unreadable HDF5 dataset: {error_line(e)}")])
            return
        stop = len(ds) if unit.stop is None else min(unit.stop, len(ds))
        batch_rows = rows_within(batch_rows, batch_bytes,
                                 ds.dtype.itemsize * int(np.prod(ds.shape[1:])))
        chunk = row_chunk(ds)
        a = unit.start
        while a < stop:
            b = a + batch_rows
            if b // chunk * chunk > a:  # end batches on chunk boundaries where they fit
                b = b // chunk * chunk
            b = min(b, stop)
            yield _chunk(unit, a, b, ds, id_ds, rank_ds)
            a = b


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tensors at ``positions`` of one file, for showing a few records (the report's
    page): one read per row, so only their chunks are decoded. Unreadable rows are left
    out."""
    out: dict[int, np.ndarray] = {}
    with opened_h5(path) as f:
        if isinstance(f, Exception):
            return out
        try:
            ds = f[spec.tensor]
        except H5_ERRORS:
            return out
        for p in sorted(set(int(p) for p in positions)):
            if 0 <= p < len(ds):
                try:
                    out[p] = ds[p]
                except H5_ERRORS:
                    pass
    return out
