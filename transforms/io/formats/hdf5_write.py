"""HDF5 output: the clean copy of an input file, without the dropped rows.

N is the length of the records dataset's first axis (``hdf5`` says which dataset that
is). ``write`` filters every dataset whose first axis has length N (the tensor, ids,
ranks, labels...) with the same rows, and copies everything else as it is. A filtered
dataset is created like its source (``_new_rows_dataset``) but with no creation time, so
a rerun writes the same bytes. Output to other Beam filesystems is written locally and
uploaded.
"""

from __future__ import annotations

import h5py
import numpy as np

from transforms.io import fs
from transforms.io.formats.base import TensorSpec, kept_rows
from transforms.io.formats.hdf5_files import (
    CHUNK_CACHE_BYTES,
    opened_h5,
    read_dataset_rows,
    records_dataset,
    row_chunk,
    vlen_numbers,
)

# Rows of the records dataset that write() copies per step (rounded to whole chunks).
_WRITE_STEP_BYTES = 32 << 20


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """Copy ``src`` without the rows in ``drop`` (see the module docstring for which
    datasets are filtered). Rows that turn out unreadable only now (in a dataset that
    read() does not read) are left out of every filtered dataset so they stay aligned:
    the copy is redone without them, and the count returned is honest."""
    with opened_h5(src) as f:
        if isinstance(f, Exception):
            return 0
        records = records_dataset(f, spec)
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
    with h5py.File(dst, "w", track_order=_tracks_order(f["/"]),
                   rdcc_nbytes=CHUNK_CACHE_BYTES) as out:
        pairs: list[tuple[h5py.Dataset, h5py.Dataset]] = []
        _copy_group(f["/"], out["/"], n, n - len(skip), pairs, {})
        if not pairs:
            return n - len(skip), np.empty(0, np.int64)
        chunk = row_chunk(records)
        row_bytes = max(1, records.dtype.itemsize * records.size // n)
        step = max(1, _WRITE_STEP_BYTES // row_bytes // chunk) * chunk
        written, unreadable = 0, []
        for a in range(0, n, step):
            b = min(a + step, n)
            keep = kept_rows(skip, a, b)
            if not keep.any():
                continue
            parts = []
            for s, _ in pairs:
                values, bad = read_dataset_rows(s, a, b, keep)
                for r0, r1, _ in bad:
                    keep[r0 - a:r1 - a] = False
                    unreadable.append(np.arange(r0, r1))
                parts.append(values)
            k = int(keep.sum())
            if k:
                for (_, o), values in zip(pairs, parts, strict=True):
                    _write_rows(o, written, values if k == b - a else values[keep])
            written += k
    return written, np.concatenate(unreadable) if unreadable else np.empty(0, np.int64)


def _write_rows(ds: h5py.Dataset, start: int, values: np.ndarray) -> None:
    """``ds[start:start + len(values)] = values``. Variable-length rows of numbers go
    through the low-level write: h5py's high-level one turns rows that all have one
    length into a 2-d array and then refuses it ("Can't broadcast (k, m) -> (k,)")."""
    if vlen_numbers(ds.dtype) is None:
        ds[start:start + len(values)] = values
        return
    space = ds.id.get_space()
    space.select_hyperslab((start,), (len(values),))
    ds.id.write(h5py.h5s.create_simple((len(values),)), space,
                np.ascontiguousarray(values), mtype=h5py.h5t.py_create(ds.dtype))


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
