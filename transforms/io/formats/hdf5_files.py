"""HDF5 files as the format's reader and its clean copy open them: the file (local, or a
seekable reader for other filesystems) with its chunk cache, the records dataset, and rows
read around unreadable chunks, which are isolated by splitting a failing read at chunk
boundaries.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import h5py
import numpy as np

from transforms.io import fs
from transforms.io.formats.base import InputError, TensorSpec, error_line, no_such_name

# What h5py raises for unreadable files, objects and chunks (not ValueError: InputError is one).
H5_ERRORS = (OSError, RuntimeError, KeyError)
# Chunk cache per open file: holds a chunk that a batch boundary cuts, so it is decoded once.
CHUNK_CACHE_BYTES = 32 << 20


@contextmanager
def opened_h5(path: str) -> Iterator[h5py.File | Exception]:
    """The file open for reading during the block, or why it cannot be opened. h5py never
    closes a file object it was given, so a non-local file's reader is closed here."""
    raw = None
    try:
        if fs.is_local(path):
            f = h5py.File(path, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
        else:
            raw = fs.open_read(path)
            f = h5py.File(raw, "r", rdcc_nbytes=CHUNK_CACHE_BYTES)
    except H5_ERRORS as e:
        f = e
    try:
        if isinstance(f, Exception):
            yield f
        else:
            with f:
                yield f
    finally:
        if raw is not None:
            raw.close()


def row_chunk(ds: h5py.Dataset) -> int:
    """Rows per chunk along axis 0 (1 for a contiguous dataset: any row range reads alone)."""
    return ds.chunks[0] if ds.chunks else 1


def records_dataset(f: h5py.File, spec: TensorSpec | None = None) -> h5py.Dataset | None:
    """The tensor dataset, or without a spec the largest dataset with at least one axis."""
    if spec is not None:
        ds = f.get(spec.tensor)
        return ds if isinstance(ds, h5py.Dataset) and ds.shape else None
    best: list[h5py.Dataset] = []

    def visit(_: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset) and obj.shape and (not best or obj.size > best[0].size):
            best[:] = [obj]

    f.visititems(visit)
    return best[0] if best else None


def open_dataset(f: h5py.File, path: str, key: str, name: str) -> h5py.Dataset:
    """The dataset ``name`` of an open file, or one line naming what the file has."""
    obj = f.get(name)
    if obj is None:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        have = no_such_name(name, names, "the file has datasets", f"set {key} to one of them")
        raise InputError(f"{path}: {key}: no dataset {name!r} {have}")
    if not isinstance(obj, h5py.Dataset):
        raise InputError(f"{path}: {key}: {name!r} is a {type(obj).__name__.lower()}, not a "
                         "dataset: name a dataset inside it")
    return obj


def _runs(mask: np.ndarray, base: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of the True runs of ``mask``, offset by ``base``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return [(base + a, base + b) for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(),
                                                  strict=True)]


def _split(lo: int, hi: int, chunk: int) -> int:
    """The chunk boundary inside (lo, hi) nearest its middle (the range spans 2+ chunks)."""
    first, last = (lo // chunk + 1) * chunk, (hi - 1) // chunk * chunk
    return min(max((lo + hi) // 2 // chunk * chunk, first), last)


def read_dataset_rows(ds: h5py.Dataset, a: int, b: int,
               want: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
    """Rows [a, b) of ``ds`` (rows not in ``want`` may be skipped) and the unreadable
    wanted rows as (start, stop, reason) ranges. One read when the slice is sound;
    otherwise the wanted runs are read and each failing read is split at chunk
    boundaries until it lies inside one chunk, which is then unreadable."""
    try:
        return ds[a:b], []
    except H5_ERRORS as e:
        first_error: BaseException | None = e
    out = np.empty((b - a, *ds.shape[1:]), dtype=ds.dtype)
    bad: list[tuple[int, int, str]] = []
    chunk = row_chunk(ds)
    stack: list[tuple[int, int, BaseException | None]] = [
        (lo, hi, first_error if (lo, hi) == (a, b) else None)
        for lo, hi in reversed(_runs(want, a))]
    while stack:
        lo, hi, error = stack.pop()
        if error is None:
            try:
                out[lo - a:hi - a] = ds[lo:hi]
                continue
            except H5_ERRORS as e:
                error = e
        if lo // chunk == (hi - 1) // chunk:
            bad.append((lo, hi, f"unreadable {ds.name}[{lo}:{hi}]: {error_line(error)}"))
        else:
            mid = _split(lo, hi, chunk)
            stack += [(mid, hi, None), (lo, mid, None)]
    return out, bad


def vlen_numbers(dtype: np.dtype) -> np.dtype | None:
    """The element dtype of a dataset of variable-length rows of numbers; None for fixed
    rows and for variable-length strings or bytes (h5py gives ``str`` / ``bytes``)."""
    base = h5py.check_vlen_dtype(dtype)
    return base if isinstance(base, np.dtype) else None


def int_sequences(ds: h5py.Dataset) -> np.dtype | None:
    """The integer dtype of a 1-d dataset of variable-length integer rows (token ids,
    read as sequences of any length), else None."""
    base = vlen_numbers(ds.dtype)
    return base if base is not None and base.kind in "iu" and ds.ndim == 1 else None


def value_kind(dtype: np.dtype) -> str | None:
    """"binary" or "text" for a dataset of encoded values, else None."""
    if h5py.check_vlen_dtype(dtype) == np.dtype(np.uint8) or dtype.kind == "V":
        return "binary"
    info = h5py.check_string_dtype(dtype)
    if info is not None:
        return "text" if info.encoding == "utf-8" else "binary"
    return None
