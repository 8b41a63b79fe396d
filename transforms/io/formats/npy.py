"""NumPy ``.npy`` input: the first axis of the file's one array is the records.

Why a format of its own: ``np.save`` is how most embeddings and token windows are kept
(SemDeDup, FAISS pipelines), and converting them to Parquet is a second copy on disk.
A ``.npy`` file is a short header then the values as one C-order block, so a record is
a fixed-width run of bytes: units are row ranges read with one positioned read (a
ranged request on an object store), as HDF5's are, and the header's shape counts the
records before any work.

What is never read: an array of Python objects (``np.save`` pickled them, and the job
never unpickles input) and one of records with fields. An array saved in Fortran order
(``np.save(f, a.T)``) is read from a local file through a memory map (its rows are not
contiguous) and refused on an object store. A file shorter than its header says (an
interrupted write or copy) keeps its whole rows; the rest is one invalid record.
The file holds no ids and no other columns: ids are ``<path>:<row>``.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
from numpy.lib import format as npformat

from transforms.canonical import DTYPE_CODES
from transforms.io import fs
from transforms.io.formats import base
from transforms.io.formats.base import Chunk, InputError, InvalidRecord, TensorSpec, Unit

_WRITE_STEP_BYTES = 32 << 20  # values copied per step of ``write``
_HEADER_READERS = {(1, 0): npformat.read_array_header_1_0,
                   (2, 0): npformat.read_array_header_2_0}


@dataclass(frozen=True)
class Header:
    """What a ``.npy`` header says: the array's dtype and shape, where its values start."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    offset: int  # bytes before the first value
    size: int  # the file's bytes

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 0

    @property
    def width(self) -> int:
        """Bytes of one record's values."""
        return self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))

    @property
    def whole_rows(self) -> int:
        """Records whose values the file holds in full (fewer than ``rows`` if cut short)."""
        if self.fortran:
            return self.rows if self.size >= self.offset + self.rows * self.width else 0
        return min(self.rows, (self.size - self.offset) // self.width) if self.width else self.rows


def header(f: io.RawIOBase | io.BufferedIOBase, size: int | None = None) -> Header:
    """The header of the ``.npy`` data at ``f``'s position (a file's start, or an ``.npz``
    member's: ``size``, where its data end); ValueError if it is none."""
    version = npformat.read_magic(f)
    read = _HEADER_READERS.get(version)
    with warnings.catch_warnings():  # a Python 2 header ("3L") is read, not worth a word
        warnings.simplefilter("ignore", UserWarning)
        if read is None:  # version 3.0: a UTF-8 header, read as 2.0's (numpy's own reader)
            shape, fortran, dtype = npformat._read_array_header(f, version)  # noqa: SLF001
        else:
            shape, fortran, dtype = read(f)
    offset = f.tell()
    if size is None:
        f.seek(0, io.SEEK_END)
        size = f.tell()
    return Header(dtype, tuple(shape), bool(fortran), offset, size)


def _header_of(path: str) -> Header | Exception:
    try:
        with fs.open_ranged(path) as f:
            return header(f)
    except (OSError, ValueError, SyntaxError) as e:
        return e


def read_dtype(h: Header, spec: TensorSpec) -> np.dtype:
    """The dtype the records are read as: the header's in native byte order; raw 2-byte
    values (``np.save`` writes ml_dtypes' bfloat16 as ``V2``) as bfloat16 if asked."""
    if h.dtype.kind == "V" and h.dtype.itemsize == 2 and spec.dtype == "bfloat16" \
            and h.dtype.names is None:
        return np.dtype(ml_dtypes.bfloat16)
    return h.dtype.newbyteorder("=")


def check(path: str, spec: TensorSpec) -> TensorSpec:
    for key, name in (("input.id", spec.id), ("keep", spec.rank)):
        if name is not None:
            raise InputError(f"{path}: {key}: a .npy file holds one array, no column "
                             f"{name!r}: remove {key} (ids are <file>:<row>; keep first or "
                             "last)")
    h = _header_of(path)
    if isinstance(h, Exception):
        return spec  # reported by read() as an unreadable file
    return checked(path, h, spec, "its array", f"np.load('{path}')")


def checked(path: str, h: Header, spec: TensorSpec, name: str, load: str) -> TensorSpec:
    """``spec`` with the shape and dtype of the array ``name`` (``load``: the Python that
    loads it, for the fix of records with fields), or the one line that refuses it."""
    what = f"{name} ({h.dtype.str}, shape {list(h.shape)})"
    if not h.shape:
        raise InputError(f"{path}: input.path: {what} has no axes: save an array whose "
                         "first axis is the records")
    if h.dtype.hasobject:
        raise InputError(f"{path}: input.path: {what} holds Python objects, which np.save "
                         "pickles and this job never unpickles: save numbers (np.stack the "
                         "rows into one numeric array)")
    if h.dtype.names is not None:
        first = h.dtype.names[0]
        raise InputError(f"{path}: input.path: {what} holds records with fields "
                         f"{list(h.dtype.names)}: save the field to compare as an array of "
                         f"its own, e.g. python -c \"import numpy as np; np.save('{first}.npy',"
                         f" {load}['{first}'])\"")
    if h.fortran and not fs.is_local(path):
        raise InputError(f"{path}: input.path: {what} is saved in Fortran order, so its "
                         "records are not contiguous bytes: save it in C order, "
                         "np.save(path, np.ascontiguousarray(a))")
    dtype = read_dtype(h, spec).name
    if h.dtype.kind == "V" and dtype != "bfloat16":
        raise InputError(f"{path}: input.dtype: {what} holds raw {h.dtype.itemsize}-byte "
                         "values: np.save writes bfloat16 (ml_dtypes) so; if these are, set "
                         "input.dtype: bfloat16")
    if dtype not in DTYPE_CODES:
        raise InputError(f"{path}: input.path: {what} holds {dtype}, not numbers: save a "
                         "numeric or bool array")
    if spec.ragged:  # near.metric jaccard: each row's values as a token sequence
        if h.dtype.kind not in "iu" or len(h.shape) != 2:
            raise InputError(f"{path}: near.metric: jaccard compares rows of token ids; "
                             f"{what} is not a 2-d array of integers: use l2 or cosine")
        return replace(spec, shape=None, dtype=dtype)
    if spec.dtype is not None and spec.dtype != dtype:
        raise InputError(f"{path}: input.dtype: {what} holds {dtype}, not {spec.dtype}: set "
                         f"input.dtype: {dtype} or leave it out")
    shape = h.shape[1:]
    if spec.shape is not None and tuple(spec.shape) != shape:
        raise InputError(f"{path}: input.shape: {what} holds records of shape {list(shape)}, "
                         f"not {list(spec.shape)}: fix input.shape or leave it out")
    return replace(spec, shape=shape, dtype=dtype)


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """Row ranges of about ``target_rows`` records; the header counts them (a file cut
    short: its whole rows and one for the rest)."""
    h = _header_of(path)
    if isinstance(h, Exception) or not h.shape:
        return [Unit(file_index, path, 0, None)]
    return base.row_units(path, file_index, h.whole_rows + (h.whole_rows < h.rows), h.width,
                          target_rows)


def values_of(f: io.IOBase, h: Header, dtype: np.dtype, a: int, b: int,
              mapped: np.ndarray | None = None) -> np.ndarray:
    """Records ``a:b`` as a native C-order array (``mapped``: a Fortran-order file's map)."""
    if mapped is not None:
        rows = np.ascontiguousarray(mapped[a:b])
        return rows.view(dtype) if rows.dtype.kind == "V" else rows.astype(dtype, copy=False)
    f.seek(h.offset + a * h.width)
    out = np.empty((b - a, *h.shape[1:]), h.dtype if h.dtype.kind != "V" else dtype)
    view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
    got = f.readinto(view) if len(view) else 0
    if got != len(view):
        raise OSError(f"read {got:,} of {len(view):,} bytes at byte {h.offset + a * h.width:,}")
    return out.astype(dtype, copy=False)


def _opened(path: str, h: Header):
    """The file (a positioned reader) and, for a local Fortran-order file, its map (none
    where the file is cut short: its records are all cut, the map would overrun it)."""
    f = fs.open_ranged(path)
    mapped = None
    if h.fortran and 0 < h.rows == h.whole_rows:
        mapped = np.memmap(f, h.dtype, "r", h.offset, h.shape, order="F")
    return f, mapped


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    h = _header_of(unit.path)
    if isinstance(h, Exception):
        yield Chunk.of_invalid(unit.file_index, [base.unreadable_file(
            unit.path, f"unreadable .npy file: {base.error_line(h)}")])
        return
    dtype = read_dtype(h, spec)
    whole = h.whole_rows
    stop = whole + (whole < h.rows) if unit.stop is None else unit.stop
    batch_rows = base.rows_within(batch_rows, batch_bytes, h.width)
    f, mapped = _opened(unit.path, h)
    with f:
        a = unit.start
        while a < min(stop, whole):
            b = min(a + batch_rows, stop, whole)
            positions = np.arange(a, b, dtype=np.int64)
            ids = base.default_ids(unit.path, positions)
            try:
                tensors = values_of(f, h, dtype, a, b, mapped)
            except OSError as e:  # the file changed or a store failed: these rows
                yield Chunk(unit.file_index, positions[:0], ids[:0], np.empty((0,)),
                            invalid=[InvalidRecord(p, i, f"unreadable rows: {base.error_line(e)}")
                                     for p, i in zip(positions.tolist(), ids, strict=True)])
                a = b
                continue
            digests = None
            if spec.ragged:
                tensors, digests = base.ragged_rows(
                    np.arange(b - a + 1, dtype=np.int64) * h.shape[1],
                    tensors.reshape(-1))
            yield Chunk(unit.file_index, positions, ids, tensors, digests=digests)
            a = b
    if whole < h.rows and unit.start <= whole < stop:
        yield Chunk.of_invalid(unit.file_index, [InvalidRecord(
            whole, f"{unit.path}:{whole}", _cut_short(h))])


def _cut_short(h: Header) -> str:
    missing = h.rows - h.whole_rows
    return (f"the file ends at byte {h.size:,}, before its header's {h.rows:,} records "
            f"({h.offset + h.rows * h.width:,} bytes): records {h.whole_rows:,} to "
            f"{h.rows - 1:,} ({missing:,}) are missing or cut (an interrupted write or copy?)")


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """A ``.npy`` file of ``src``'s whole records but those at ``drop``, in C order with
    the source's dtype (byte order included); returns the records written."""
    h = _header_of(src)
    if isinstance(h, Exception) or not h.shape:
        return 0
    h = replace(h, shape=(h.whole_rows, *h.shape[1:]))
    skip = np.unique(np.asarray(drop, dtype=np.int64))
    skip = skip[(skip >= 0) & (skip < h.rows)]
    f, mapped = _opened(src, h)
    with f, fs.local_file_for(dst) as local, open(local, "wb") as out:
        copy_rows(f, h, skip, out, mapped)
    return h.rows - len(skip)


def copy_rows(f: io.IOBase, h: Header, skip: np.ndarray, out: io.IOBase,
              mapped: np.ndarray | None = None) -> None:
    """A ``.npy`` of ``h``'s rows but those at ``skip`` (sorted), read from ``f`` and
    written to ``out`` in C order with ``h``'s dtype, a step of rows at a time."""
    meta = {"descr": npformat.dtype_to_descr(h.dtype), "fortran_order": False,
            "shape": (h.rows - len(skip), *h.shape[1:])}
    try:
        npformat.write_array_header_1_0(out, meta)
    except ValueError:  # a header over 64 KiB (a very long shape)
        npformat.write_array_header_2_0(out, meta)
    step = max(1, _WRITE_STEP_BYTES // max(1, h.width))
    for a in range(0, h.rows, step):
        b = min(a + step, h.rows)
        keep = base.kept_rows(skip, a, b)
        if keep.any():
            rows = values_of(f, h, h.dtype, a, b, mapped)
            out.write(memoryview(np.ascontiguousarray(rows[keep]).reshape(-1).view(np.uint8)))


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tensors at ``positions`` of one file (a few records: the report's page)."""
    h = _header_of(path)
    out: dict[int, np.ndarray] = {}
    if isinstance(h, Exception) or not h.shape:
        return out
    f, mapped = _opened(path, h)
    with f:
        return rows_at(f, h, read_dtype(h, spec), positions, h.whole_rows, mapped)


def rows_at(f: io.IOBase, h: Header, dtype: np.dtype, positions: list[int], n: int,
            mapped: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """The records at ``positions`` (those below ``n`` that can be read), by position."""
    out: dict[int, np.ndarray] = {}
    for p in sorted({int(p) for p in positions}):
        if 0 <= p < n:
            try:
                out[p] = values_of(f, h, dtype, p, p + 1, mapped)[0]
            except OSError:
                pass
    return out
