"""HDF5 input: the first axis of an N-D dataset is the records; units are row ranges.

Why row ranges aligned to chunks: HDF5 reads (and decompresses) whole chunks, so a
unit that starts and ends on a chunk boundary never decodes a chunk twice, and one
big file is read in parallel. A corrupt chunk costs only its own rows: a failing
slice is split at chunk boundaries until the unreadable chunks are isolated.

The records dataset is the tensor dataset the job names (``spec.tensor``); called
without a spec, ``plan`` and ``write`` take the file's largest dataset (by number of
elements; the first in name order on a tie). N is the length of its first axis.
``write`` filters every dataset whose first axis has length N (the tensor, ids,
ranks, labels...) with the same rows, and copies everything else as it is.

Files on other Beam filesystems (gs://, ...) are read through a seekable reader that
h5py uses as a Python file object (its "fileobj" driver): only the metadata and the
chunks a unit needs are fetched, and the chunk cache keeps a chunk that two batches
share from being fetched twice. Output to them is written locally and uploaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import h5py
import numpy as np

from transforms import fs
from transforms.canonical import DTYPE_CODES
from transforms.formats.base import (
    Chunk,
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    default_ids,
    error_line,
    rows_within,
)

# What h5py raises for unreadable files, objects and chunks (not ValueError: InputError is one).
_H5_ERRORS = (OSError, RuntimeError, KeyError)
# Chunk cache per open file: holds a chunk that a batch boundary cuts, so it is decoded once.
_CACHE_BYTES = 32 << 20
# Rows of the records dataset that write() copies per step (rounded to whole chunks).
_WRITE_STEP_BYTES = 32 << 20


@contextmanager
def _opened(path: str) -> Iterator[h5py.File | Exception]:
    """The file open for reading during the block, or why it cannot be opened. h5py never
    closes a file object it was given, so a non-local file's reader is closed here."""
    raw = None
    try:
        if fs.is_local(path):
            f = h5py.File(path, "r", rdcc_nbytes=_CACHE_BYTES)
        else:
            raw = fs.open_read(path)
            f = h5py.File(raw, "r", rdcc_nbytes=_CACHE_BYTES)
    except _H5_ERRORS as e:
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


def _row_chunk(ds: h5py.Dataset) -> int:
    """Rows per chunk along axis 0 (1 for a contiguous dataset: any row range reads alone)."""
    return ds.chunks[0] if ds.chunks else 1


def _records_dataset(f: h5py.File, spec: TensorSpec | None = None) -> h5py.Dataset | None:
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


def _dataset(f: h5py.File, path: str, key: str, name: str) -> h5py.Dataset:
    obj = f.get(name)
    if obj is None:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        raise InputError(f"{path}: {key}: no dataset {name!r}; the file has datasets "
                         f"{', '.join(names) or '(none)'}: set {key} to one of them")
    if not isinstance(obj, h5py.Dataset):
        raise InputError(f"{path}: {key}: {name!r} is a {type(obj).__name__.lower()}, not a "
                         "dataset: name a dataset inside it")
    return obj


def _is_id_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" or h5py.check_string_dtype(dtype) is not None


def _is_rank_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf"


def check(path: str, spec: TensorSpec) -> TensorSpec:
    with _opened(path) as f:
        if isinstance(f, Exception):
            return spec  # reported as invalid by read()
        try:
            return _check(f, path, spec)
        except _H5_ERRORS:
            return spec  # a corrupt object header: reported as invalid by read()


def _check(f: h5py.File, path: str, spec: TensorSpec) -> TensorSpec:
    ds = _dataset(f, path, "input.tensor", spec.tensor)
    if not ds.shape:
        raise InputError(f"{path}: input.tensor: dataset {spec.tensor!r} has no axes (shape "
                         f"{ds.shape}): name a dataset whose first axis is the records")
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
    for key, name, ok, kinds in (("input.id", spec.id, _is_id_dtype, "strings or integers"),
                                 ("keep", spec.rank, _is_rank_dtype, "numbers")):
        if name is None:
            continue
        side = _dataset(f, path, key, name)
        if side.shape != (len(ds),):
            raise InputError(f"{path}: {key}: dataset {name!r} has shape {side.shape}, not "
                             f"({len(ds)},): it needs one value per record of {spec.tensor!r}")
        if not ok(side.dtype):
            raise InputError(f"{path}: {key}: dataset {name!r} holds {side.dtype}, not {kinds}: "
                             f"name a dataset of {kinds}")
    return replace(spec, shape=shape, dtype=dtype)


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """Units of about ``target_rows`` whole chunks of the records dataset; the last unit
    runs to the end (stop None), so the units cover the tensor even if it is shorter
    or longer than the records dataset."""
    with _opened(path) as f:
        if isinstance(f, Exception):
            return [Unit(file_index, path, 0, None)]
        try:
            ds = _records_dataset(f, spec)
        except _H5_ERRORS:
            ds = None
        n, chunk = (len(ds), _row_chunk(ds)) if ds is not None else (0, 1)
    step = max(1, round(target_rows / chunk)) * chunk
    starts = list(range(0, n, step)) or [0]
    stops: list[int | None] = [*starts[1:], None]
    return [Unit(file_index, path, a, b) for a, b in zip(starts, stops, strict=True)]


def _runs(mask: np.ndarray, base: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of the True runs of ``mask``, offset by ``base``."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return [(base + a, base + b) for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(),
                                                  strict=True)]


def _split(lo: int, hi: int, chunk: int) -> int:
    """The chunk boundary inside (lo, hi) nearest its middle (the range spans 2+ chunks)."""
    first, last = (lo // chunk + 1) * chunk, (hi - 1) // chunk * chunk
    return min(max((lo + hi) // 2 // chunk * chunk, first), last)


def _read_rows(ds: h5py.Dataset, a: int, b: int,
               want: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
    """Rows [a, b) of ``ds`` (rows not in ``want`` may be skipped) and the unreadable
    wanted rows as (start, stop, reason) ranges. One read when the slice is sound;
    otherwise the wanted runs are read and each failing read is split at chunk
    boundaries until it lies inside one chunk, which is then unreadable."""
    try:
        return ds[a:b], []
    except _H5_ERRORS as e:
        first_error: BaseException | None = e
    out = np.empty((b - a, *ds.shape[1:]), dtype=ds.dtype)
    bad: list[tuple[int, int, str]] = []
    chunk = _row_chunk(ds)
    stack: list[tuple[int, int, BaseException | None]] = [
        (lo, hi, first_error if (lo, hi) == (a, b) else None)
        for lo, hi in reversed(_runs(want, a))]
    while stack:
        lo, hi, error = stack.pop()
        if error is None:
            try:
                out[lo - a:hi - a] = ds[lo:hi]
                continue
            except _H5_ERRORS as e:
                error = e
        if lo // chunk == (hi - 1) // chunk:
            bad.append((lo, hi, f"unreadable {ds.name}[{lo}:{hi}]: {error_line(error)}"))
        else:
            mid = _split(lo, hi, chunk)
            stack += [(mid, hi, None), (lo, mid, None)]
    return out, bad


def _as_ids(values: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Id dataset values -> object array of str (bytes decoded as UTF-8), and the rows
    whose bytes are not UTF-8: invalid records (as in TFRecord), named with their bytes
    escaped so the report still shows which they were."""
    if values.dtype.kind in "iu":
        return values.astype(str).astype(object), []
    out, bad = [], []
    for p, v in enumerate(values.tolist()):
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(p)
                v = v.decode("utf-8", "backslashreplace")
        out.append(str(v))
    return np.array(out, dtype=object), bad


def _chunk(unit: Unit, a: int, b: int, ds: h5py.Dataset, id_ds: h5py.Dataset | None,
           rank_ds: h5py.Dataset | None) -> Chunk:
    positions = np.arange(a, b, dtype=np.int64)
    want = np.ones(b - a, dtype=bool)
    reasons: dict[int, str] = {}  # row offset -> why it is invalid (first failure wins)

    def rows(d: h5py.Dataset) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
        values, bad = _read_rows(d, a, b, want)
        for lo, hi, why in bad:
            for p in range(lo - a, hi - a):
                reasons.setdefault(p, why)
        return values, bad

    tensors, _ = rows(ds)
    if id_ds is None:
        ids = default_ids(unit.path, positions)
    else:
        values, bad_ids = rows(id_ds)
        ids, not_text = _as_ids(values)
        for p in not_text:
            reasons.setdefault(p, f"{id_ds.name}: id is not UTF-8")
        for lo, hi, _ in bad_ids:
            ids[lo - a:hi - a] = default_ids(unit.path, positions[lo - a:hi - a])
    rank = None if rank_ds is None else rows(rank_ds)[0].astype(np.float64)
    if not reasons:
        return Chunk(unit.file_index, positions, ids, tensors, rank)
    invalid = [InvalidRecord(a + p, ids[p], why) for p, why in sorted(reasons.items())]
    ok = np.ones(b - a, dtype=bool)
    ok[list(reasons)] = False
    return Chunk(unit.file_index, positions[ok], ids[ok], tensors[ok],
                 None if rank is None else rank[ok], invalid)


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    with _opened(unit.path) as f:
        if isinstance(f, Exception):
            yield Chunk.of_invalid(unit.file_index, [InvalidRecord(
                0, unit.path, f"unreadable HDF5 file: {error_line(f)}")])
            return
        try:
            ds, id_ds, rank_ds = (None if name is None else f[name]
                                  for name in (spec.tensor, spec.id, spec.rank))
        except _H5_ERRORS as e:  # check() saw the names, so the object itself is corrupt
            yield Chunk.of_invalid(unit.file_index, [InvalidRecord(
                unit.start, unit.path, f"unreadable HDF5 dataset: {error_line(e)}")])
            return
        stop = len(ds) if unit.stop is None else min(unit.stop, len(ds))
        batch_rows = rows_within(batch_rows, batch_bytes,
                                 ds.dtype.itemsize * int(np.prod(ds.shape[1:])))
        chunk = _row_chunk(ds)
        a = unit.start
        while a < stop:
            b = a + batch_rows
            if b // chunk * chunk > a:  # end batches on chunk boundaries where they fit
                b = b // chunk * chunk
            b = min(b, stop)
            yield _chunk(unit, a, b, ds, id_ds, rank_ds)
            a = b


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """Copy ``src`` without the rows in ``drop`` (see the module docstring for which
    datasets are filtered). Rows that turn out unreadable only now (in a dataset that
    read() does not read) are left out of every filtered dataset so they stay aligned:
    the copy is redone without them, and the count returned is honest."""
    with _opened(src) as f:
        if isinstance(f, Exception):
            return 0
        records = _records_dataset(f, spec)
        n = 0 if records is None else len(records)
        skip = np.unique(np.asarray(drop, dtype=np.int64))
        skip = skip[(skip >= 0) & (skip < n)]
        with fs.local_file_for(dst) as local:
            while True:
                written, unreadable = _copy_file(f, local, records, skip)
                if not len(unreadable):
                    return written
                skip = np.union1d(skip, unreadable)


def _copy_file(f: h5py.File, dst: str, records: h5py.Dataset | None,
               skip: np.ndarray) -> tuple[int, np.ndarray]:
    """One copy pass: (rows written, rows found unreadable)."""
    n = 0 if records is None else len(records)
    with h5py.File(dst, "w", track_order=_tracks_order(f["/"]), rdcc_nbytes=_CACHE_BYTES) as out:
        pairs: list[tuple[h5py.Dataset, h5py.Dataset]] = []
        _copy_group(f["/"], out["/"], n, n - len(skip), pairs, {})
        if not pairs:
            return n - len(skip), np.empty(0, np.int64)
        chunk = _row_chunk(records)
        row_bytes = max(1, records.dtype.itemsize * records.size // n)
        step = max(1, _WRITE_STEP_BYTES // row_bytes // chunk) * chunk
        written, unreadable = 0, []
        for a in range(0, n, step):
            b = min(a + step, n)
            keep = np.ones(b - a, dtype=bool)
            lo, hi = np.searchsorted(skip, [a, b])
            keep[skip[lo:hi] - a] = False
            if not keep.any():
                continue
            parts = []
            for s, _ in pairs:
                values, bad = _read_rows(s, a, b, keep)
                for r0, r1, _ in bad:
                    keep[r0 - a:r1 - a] = False
                    unreadable.append(np.arange(r0, r1))
                parts.append(values)
            k = int(keep.sum())
            if k:
                for (_, o), values in zip(pairs, parts, strict=True):
                    o[written:written + k] = values if k == b - a else values[keep]
            written += k
    return written, np.concatenate(unreadable) if unreadable else np.empty(0, np.int64)


def _tracks_order(g: h5py.Group) -> bool:
    return bool(g.id.get_create_plist().get_link_creation_order())


def _copy_attrs(src: h5py.HLObject, dst: h5py.HLObject) -> None:
    for name in src.attrs:
        dst.attrs.create(name, src.attrs[name], dtype=src.attrs.get_id(name).dtype)


def _copy_group(src: h5py.Group, dst: h5py.Group, n: int, n_out: int,
                pairs: list[tuple[h5py.Dataset, h5py.Dataset]],
                seen: dict[object, str]) -> None:
    """Copy a group's attributes and members; a dataset of ``n`` rows is created empty
    with ``n_out`` rows and paired with its source, to be filled by the caller."""
    _copy_attrs(src, dst)
    for name in src:
        link = src.get(name, getlink=True)
        if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
            dst[name] = link
            continue
        obj = src[name]
        if obj.id in seen:  # another hard link to an object already copied
            dst[name] = dst.file[seen[obj.id]]
            continue
        seen[obj.id] = f"{dst.name.rstrip('/')}/{name}"
        if isinstance(obj, h5py.Group):
            _copy_group(obj, dst.create_group(name, track_order=_tracks_order(obj)),
                        n, n_out, pairs, seen)
        elif isinstance(obj, h5py.Dataset) and n and obj.shape and obj.shape[0] == n:
            pairs.append((obj, _new_rows_dataset(obj, dst, name, n_out)))
        else:
            src.copy(obj, dst, name=name)  # H5Ocopy: bytes, filters and attributes as they are


def _new_rows_dataset(src: h5py.Dataset, group: h5py.Group, name: str,
                      n_out: int) -> h5py.Dataset:
    """An empty dataset like ``src`` with ``n_out`` rows: its creation property list is
    copied, so every filter (with its options), fill value and layout is kept. A fixed
    first axis stays fixed at the new length; an unlimited one stays unlimited. No
    creation time is stamped (as h5py's own ``create_dataset``): two runs, or two
    runners, write the same bytes."""
    dcpl = src.id.get_create_plist()
    dcpl.set_obj_track_times(False)
    shape = (n_out, *src.shape[1:])
    maxshape: tuple[int | None, ...] = shape
    if dcpl.get_layout() == h5py.h5d.CHUNKED:
        max0 = src.maxshape[0]
        if max0 is not None and max0 <= src.shape[0]:
            max0 = n_out
        maxshape = (max0, *src.maxshape[1:])
        rows = src.chunks[0] if max0 is None else min(src.chunks[0], max(1, max0))
        dcpl.set_chunk((rows, *src.chunks[1:]))
    elif dcpl.get_layout() == h5py.h5d.VIRTUAL or dcpl.get_external_count():
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)  # never write into the source's files
        dcpl.set_obj_track_times(False)
    space = h5py.h5s.create_simple(shape, tuple(h5py.h5s.UNLIMITED if m is None else m
                                                for m in maxshape))
    tid = src.id.get_type()
    lcpl = h5py.h5p.create(h5py.h5p.LINK_CREATE)
    lcpl.set_char_encoding(h5py.h5t.CSET_UTF8)
    out = h5py.Dataset(h5py.h5d.create(group.id, name.encode(), tid.copy() if tid.committed()
                                       else tid, space, dcpl=dcpl, lcpl=lcpl))
    _copy_attrs(src, out)
    return out


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tensors at ``positions`` of one file, for showing a few records (the report's
    page): one read per row, so only their chunks are decoded. Unreadable rows are left
    out."""
    out: dict[int, np.ndarray] = {}
    with _opened(path) as f:
        if isinstance(f, Exception):
            return out
        try:
            ds = f[spec.tensor]
        except _H5_ERRORS:
            return out
        for p in sorted(set(int(p) for p in positions)):
            if 0 <= p < len(ds):
                try:
                    out[p] = ds[p]
                except _H5_ERRORS:
                    pass
    return out
