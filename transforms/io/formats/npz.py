"""NumPy ``.npz`` input: an archive of named arrays (``np.savez``, ``np.savez_compressed``);
the first axis of the array ``input.tensor`` names is the records.

Why beside ``.npy``: ``np.savez(f, embeddings=e, ids=i)`` is how embeddings are kept
with their ids. Each member is a ``.npy`` file (``npy`` reads its header and rows); the
ids and keep values are other arrays of one value per record. A member ``np.savez``
stores uncompressed is read by row ranges at its offset in the file (a ranged request
on an object store); a compressed member (``np.savez_compressed``) is read in order,
so such a file is one unit. The clean copy is an archive like the input: every array
with one row per record (the tensor, ids, labels) without the removed rows, every other
member as it was, each compressed as it was. An array of Python objects with a row
per record (which ``np.load`` would unpickle) is refused, as in ``.npy`` files.
"""

from __future__ import annotations

import contextlib
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from transforms.io import fs
from transforms.io.formats import base, npy
from transforms.io.formats.base import Chunk, InputError, InvalidRecord, TensorSpec, Unit
from transforms.io.formats.npy import Header, checked, header, read_dtype, values_of

ERRORS = (OSError, ValueError, SyntaxError, EOFError, zipfile.BadZipFile)


@dataclass(frozen=True)
class Member:
    """One array of the archive: its entry, and its header with offsets in the file (a
    stored member) or in the member's own stream (a compressed one)."""

    info: zipfile.ZipInfo
    header: Header

    @property
    def stored(self) -> bool:
        return self.info.compress_type == zipfile.ZIP_STORED


def _members(z: zipfile.ZipFile, f: io.BufferedIOBase) -> dict[str, Member]:
    """The archive's arrays by name (``x`` for the member ``x.npy``)."""
    out = {}
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            continue
        if info.compress_type == zipfile.ZIP_STORED:
            f.seek(info.header_offset)
            local = f.read(30)  # the local header: its name and extra field's lengths
            start = info.header_offset + 30 + int.from_bytes(local[26:28], "little") + \
                int.from_bytes(local[28:30], "little")
            f.seek(start)
            h = header(f, start + info.file_size)
        else:
            with z.open(info) as m:
                h = header(m, info.file_size)
        out[info.filename.removesuffix(".npy")] = Member(info, h)
    return out


@contextlib.contextmanager
def _opened(path: str) -> Iterator[tuple[zipfile.ZipFile, io.BufferedIOBase,
                                         dict[str, Member]]]:
    with fs.open_ranged(path) as f, zipfile.ZipFile(f) as z:
        yield z, f, _members(z, f)


@contextlib.contextmanager
def _stream(z: zipfile.ZipFile, f: io.BufferedIOBase, m: Member) -> Iterator[io.IOBase]:
    """A reader of a member's values at its header's offsets."""
    if m.stored:
        yield f
        return
    with z.open(m.info) as s:
        yield s


def _records(members: dict[str, Member], spec: TensorSpec | None) -> Member | None:
    """The records array: the tensor's, or (no spec) the largest."""
    if spec is not None:
        return members.get(spec.tensor)
    arrays = [m for m in members.values() if m.header.shape]
    return max(arrays, key=lambda m: np.prod(m.header.shape), default=None)


def check(path: str, spec: TensorSpec) -> TensorSpec:
    try:
        with _opened(path) as (_, _, members):
            pass
    except ERRORS:
        return spec  # reported by read() as an unreadable file
    names = sorted(members)
    m = members.get(spec.tensor)
    if m is None:
        raise InputError(f"{path}: input.tensor: no array {spec.tensor!r} " + base.no_such_name(
            spec.tensor, names, "the archive has arrays", "name one of them"))
    n = m.header.rows
    for key, name, kinds, what in (("input.id", spec.id, "iuSU", "strings or integers"),
                                   ("keep", spec.rank, "biuf", "numbers")):
        if name is None:
            continue
        side = members.get(name)
        if side is None:
            raise InputError(f"{path}: {key}: no array {name!r} " + base.no_such_name(
                name, names, "the archive has arrays", "name one of them"))
        if side.header.shape != (n,) or side.header.dtype.kind not in kinds:
            raise InputError(f"{path}: {key}: array {name!r} ({side.header.dtype.str}, shape "
                             f"{list(side.header.shape)}) is not one value per record of "
                             f"{spec.tensor!r} ({n:,}) of {what}")
    for name, other in members.items():
        h = other.header
        if h.shape and h.rows == n and (h.dtype.hasobject or h.fortran):
            raise InputError(
                f"{path}: input.path: array {name!r} has a row per record and holds "
                f"{'Python objects (pickled)' if h.dtype.hasobject else 'values in Fortran order'}"
                ": the clean copy could not drop its rows without "
                f"{'unpickling it' if h.dtype.hasobject else 'reading it whole'}: save the "
                "archive without it, or as numbers in C order")
    return checked(path, m.header, spec, f"array {spec.tensor!r}",
                   f"np.load('{path}')['{spec.tensor}']")


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """Row ranges of about ``target_rows`` records where every array read is stored
    uncompressed; one unit where one is compressed (read in order)."""
    try:
        with _opened(path) as (_, _, members):
            pass
    except ERRORS:
        return [Unit(file_index, path, 0, None)]
    m = _records(members, spec)
    if m is None or not m.header.shape:
        return [Unit(file_index, path, 0, None)]
    n = m.header.rows
    read = [members.get(k) for k in ((spec.tensor, spec.id, spec.rank) if spec else ())]
    if not all(r.stored for r in read if r is not None):
        return [Unit(file_index, path, 0, n)]
    return base.row_units(path, file_index, n, m.header.width, target_rows)


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    try:
        with _opened(unit.path) as (z, f, members), contextlib.ExitStack() as stack:
            t = members[spec.tensor]
            sides = {k: members[k] for k in (spec.id, spec.rank) if k is not None}
            streams = {k: stack.enter_context(_stream(z, f, m))
                       for k, m in [(spec.tensor, t), *sides.items()]}
            dtype = read_dtype(t.header, spec)
            stop = t.header.rows if unit.stop is None else min(unit.stop, t.header.rows)
            batch_rows = base.rows_within(batch_rows, batch_bytes, t.header.width)
            for a in range(unit.start, stop, batch_rows):
                yield _chunk(unit, spec, a, min(a + batch_rows, stop), t, dtype, sides, streams)
    except (*ERRORS, KeyError) as e:
        yield Chunk.of_invalid(unit.file_index, [base.unreadable_file(
            unit.path, f"unreadable .npz archive: {base.error_line(e)}")])


def _chunk(unit: Unit, spec: TensorSpec, a: int, b: int, t: Member, dtype: np.dtype,
           sides: dict[str, Member], streams: dict[str, io.IOBase]) -> Chunk:
    positions = np.arange(a, b, dtype=np.int64)
    try:
        tensors = values_of(streams[spec.tensor], t.header, dtype, a, b)
        got = {k: values_of(streams[k], m.header, m.header.dtype.newbyteorder("="), a, b)
               for k, m in sides.items()}
    except ERRORS as e:  # a compressed member's CRC, a store's failure: these rows
        ids = base.default_ids(unit.path, positions)
        return Chunk(unit.file_index, positions[:0], ids[:0], np.empty((0,)), invalid=[
            InvalidRecord(p, i, f"unreadable rows: {base.error_line(e)}")
            for p, i in zip(positions.tolist(), ids, strict=True)])
    bad: list[int] = []
    ids = base.default_ids(unit.path, positions) if spec.id is None else None
    if ids is None:
        ids, bad = base.as_ids(got[spec.id])
    rank = None if spec.rank is None else got[spec.rank].astype(np.float64)
    digests = None
    if spec.ragged:
        tensors, digests = base.ragged_rows(np.arange(b - a + 1, dtype=np.int64) *
                                            t.header.shape[1], tensors.reshape(-1))
    chunk = Chunk(unit.file_index, positions, ids, tensors, rank, digests=digests)
    if bad:
        mask = np.zeros(b - a, bool)
        mask[bad] = True
        chunk = chunk.reported_invalid(mask, f"{spec.id}: id is not UTF-8")
    return chunk


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """An archive like ``src``: each array with a row per record without the rows at
    ``drop``, every other member as it was, each compressed as it was."""
    try:
        with _opened(src) as (z, f, members):
            records = _records(members, spec)
            if records is None:
                return 0
            n = records.header.rows
            skip = np.unique(np.asarray(drop, dtype=np.int64))
            skip = skip[(skip >= 0) & (skip < n)]
            with fs.local_file_for(dst) as local, zipfile.ZipFile(local, "w",
                                                                 allowZip64=True) as out:
                for info in z.infolist():
                    entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                    entry.compress_type, entry.external_attr = (info.compress_type,
                                                                info.external_attr)
                    m = members.get(info.filename.removesuffix(".npy"))
                    if m is None or not m.header.shape or m.header.rows != n:
                        out.writestr(entry, z.read(info))
                        continue
                    with _stream(z, f, m) as s, out.open(entry, "w", force_zip64=True) as w:
                        npy.copy_rows(s, m.header, skip, w)
    except ERRORS:
        return 0
    return n - len(skip)


FIRST_VALUES = 1_000  # ids ``first_values`` reads


def first_values(path: str, name: str) -> list:
    """The array's first values as strings (ids); [] where there are none to tell."""
    try:
        with _opened(path) as (z, f, members):
            m = members[name]
            if m.header.shape != (m.header.rows,) or m.header.dtype.kind not in "iuSU":
                return []  # not ids: the check says so
            with _stream(z, f, m) as s:
                values = values_of(s, m.header, m.header.dtype.newbyteorder("="), 0,
                                   min(FIRST_VALUES, m.header.rows))
    except (*ERRORS, KeyError):
        return []
    return base.as_ids(values)[0].tolist()


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tensors at ``positions`` of one file (a few records: the report's page)."""
    try:
        with _opened(path) as (z, f, members):
            m = members[spec.tensor]
            with _stream(z, f, m) as s:
                return npy.rows_at(s, m.header, read_dtype(m.header, spec), positions,
                                   m.header.rows)
    except (*ERRORS, KeyError):
        return {}
