"""The job's own scratch values in files, without pickle: a JSON header and raw buffers.

Why not pickle: spill files live on the job's scratch storage, which may be shared
(a ``gs://`` temp location). Unpickling a file runs whatever code its bytes name, so
anyone who can write there could run code in every worker that reads it back. Here a
file holds only data: JSON for numbers, strings, lists, tuples and dicts; numpy arrays
of plain dtypes as raw bytes (``np.frombuffer``: an object dtype is refused); Arrow
arrays of flat types (ids) as their buffers, validated when read, other arrays and
tables as Arrow IPC streams; and the dataclasses the job registers (``register``: the
near stage's cells and plan), rebuilt field by field: nothing else can be named. A file of another
layout, an unknown class or dtype is refused with ``SpillFormatError``.

Layout: ``MAGIC``, the header's length (8 bytes, little-endian), the header (UTF-8
JSON), then the buffers, each at a multiple of 64 bytes. Encoding the same value twice
gives the same bytes (``agreed`` compares them on object stores).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from transforms.canonical import dtype_named
from transforms.io import fs

MAGIC = b"TDSPILL1"
ALIGN = 64
SMALL = 64 << 10  # buffers below this are gathered into one write
_LENGTH = struct.Struct("<Q")


class SpillFormatError(ValueError):
    """A scratch file that is not what this job writes (never unpickled, never run)."""


_KINDS: dict[str, type] = {}


def register(*classes: type) -> None:
    """Dataclasses a spill file may name (the near stage's cells and plan register
    theirs where they are defined); a name no class registered is refused on read."""
    for k in classes:
        if not dataclasses.is_dataclass(k):
            raise TypeError(f"spill: {k.__name__} is not a dataclass")
        _KINDS[k.__name__] = k


# Arrow types written as their buffers (validity, offsets, data): record ids and runs.
_FLAT = {str(t): t for t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
                             pa.null(), pa.bool_(), pa.int32(), pa.int64(), pa.uint64(),
                             pa.float64())}


@functools.lru_cache(maxsize=256)
def _dtype_name(dtype: np.dtype) -> str:
    """A plain dtype by a name ``np.dtype`` reads back: its code with the byte order, or
    for ml_dtypes' types (bfloat16) the name they are registered by."""
    if dtype.hasobject or dtype.fields is not None:
        raise TypeError(f"spill: an array of dtype {dtype} (objects or fields)")
    for name in (dtype.str, dtype.name):
        if np.dtype(name) == dtype:
            return name
    raise TypeError(f"spill: dtype {dtype} has no name numpy reads back")


class _Writer:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []

    def buffer(self, data: memoryview | bytes) -> int:
        self.buffers.append(memoryview(data).cast("B"))
        return len(self.buffers) - 1

    def encode(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (np.ndarray, np.generic)):  # before float: np.float64 is one
            a = np.asarray(v)
            return {"$": "nd", "dtype": _dtype_name(a.dtype), "shape": list(a.shape),
                    "scalar": isinstance(v, np.generic),
                    "b": self.buffer(np.ascontiguousarray(a).reshape(-1).view(np.uint8))}
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return {"$": "float", "v": v.hex()}  # exact, and NaN/inf too
        if isinstance(v, pa.ChunkedArray):
            v = v.combine_chunks()
        if isinstance(v, pa.Array) and str(v.type) in _FLAT:  # ids: their buffers as they are
            if v.offset:  # a slice: only its own values
                v = pa.concat_arrays([v])
            return {"$": "flat", "type": str(v.type), "n": len(v), "nulls": v.null_count,
                    "b": [None if x is None else self.buffer(x) for x in v.buffers()]}
        if isinstance(v, pa.Array):
            return {"$": "arrow", "b": self._ipc(pa.table({"v": v}))}
        if isinstance(v, pa.Table):
            return {"$": "table", "b": self._ipc(v)}
        if isinstance(v, tuple):
            return {"$": "tuple", "v": [self.encode(x) for x in v]}
        if isinstance(v, list):
            return [self.encode(x) for x in v]
        if isinstance(v, dict):
            return {"$": "dict", "v": [[self.encode(k), self.encode(x)] for k, x in v.items()]}
        if dataclasses.is_dataclass(v) and _KINDS.get(type(v).__name__) is type(v):
            return {"$": "dc", "kind": type(v).__name__,
                    "v": {f.name: self.encode(getattr(v, f.name))
                          for f in dataclasses.fields(v)}}
        raise TypeError(f"spill: cannot write a {type(v).__name__}")

    def _ipc(self, table: pa.Table) -> int:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return self.buffer(sink.getvalue())


def encode(value: Any) -> Iterator[memoryview | bytes]:
    """``value`` as the parts of a spill file, written one after another: large buffers
    as they are (no copy of them is made), small ones gathered into fewer parts."""
    w = _Writer()
    tree = w.encode(value)
    at, spans = 0, []
    for b in w.buffers:
        spans.append([at, b.nbytes])
        at += -(-b.nbytes // ALIGN) * ALIGN
    header = json.dumps({"tree": tree, "buffers": spans}, separators=(",", ":"),
                        sort_keys=True).encode()
    start = -(-(len(MAGIC) + _LENGTH.size + len(header)) // ALIGN) * ALIGN
    header += b" " * (start - len(MAGIC) - _LENGTH.size - len(header))
    held = bytearray(MAGIC + _LENGTH.pack(len(header)) + header)
    for b in w.buffers:
        pad = bytes(-b.nbytes % ALIGN)
        if b.nbytes < SMALL:
            held += b
            held += pad
            continue
        yield bytes(held)
        held.clear()
        yield b
        held += pad
    yield bytes(held)


def encode_bytes(value: Any) -> bytes:
    return b"".join(encode(value))


def write(path: str, value: Any) -> None:
    """``value`` in a scratch file of this job (``fs.write_scratch``: any filesystem)."""
    fs.write_scratch(path, encode(value))


def load(path: str) -> Any:
    """A spill file's value, its arrays writable views of one buffer read from it."""
    if fs.is_local(path):
        data = bytearray(os.path.getsize(path))
        with open(path, "rb") as f:
            if f.readinto(data) != len(data):
                raise SpillFormatError(f"spill: {path} changed while it was read")
    else:
        data = bytearray(fs.read_bytes(path))
    return decode(data)


class _Reader:
    def __init__(self, data: memoryview, spans: list, base: int) -> None:
        self.data, self.spans, self.base = data, spans, base
        self.kinds = _KINDS

    def buffer(self, i: Any) -> memoryview:
        if not isinstance(i, int) or not 0 <= i < len(self.spans):
            raise SpillFormatError(f"spill: no buffer {i!r}")
        at, n = self.spans[i]
        if at < 0 or n < 0 or self.base + at + n > len(self.data):
            raise SpillFormatError("spill: a buffer lies past the end of the file")
        return self.data[self.base + at:self.base + at + n]

    def decode(self, t: Any) -> Any:
        if t is None or isinstance(t, (bool, int, str)):
            return t
        if isinstance(t, list):
            return [self.decode(x) for x in t]
        if not isinstance(t, dict):
            raise SpillFormatError(f"spill: unexpected {type(t).__name__} in the header")
        tag = t.get("$")
        if tag == "float":
            return float.fromhex(t["v"])
        if tag == "nd":
            dtype = dtype_named(t["dtype"])
            if dtype.hasobject or dtype.fields is not None:
                raise SpillFormatError(f"spill: dtype {dtype} would hold Python objects")
            a = np.frombuffer(self.buffer(t["b"]), dtype).reshape(t["shape"])
            return a[()] if t["scalar"] else a
        if tag == "flat":
            kind = _FLAT.get(t["type"])
            if kind is None:
                raise SpillFormatError(f"spill: an Arrow array of type {t['type']!r}")
            bufs = [None if i is None else pa.py_buffer(self.buffer(i)) for i in t["b"]]
            out = pa.Array.from_buffers(kind, t["n"], bufs, t["nulls"])
            out.validate(full=True)  # offsets within the data: checked, not trusted
            return out
        if tag == "arrow":
            return self._ipc(t["b"]).column("v").combine_chunks()
        if tag == "table":
            return self._ipc(t["b"])
        if tag == "tuple":
            return tuple(self.decode(x) for x in t["v"])
        if tag == "dict":
            return {self.decode(k): self.decode(x) for k, x in t["v"]}
        if tag == "dc":
            kind = self.kinds.get(t["kind"])
            if kind is None:
                raise SpillFormatError(f"spill: {t['kind']!r} is not a kind this job writes")
            out = object.__new__(kind)  # as written: __post_init__'s work is in the fields
            names = {f.name for f in dataclasses.fields(kind)}
            if set(t["v"]) != names:
                raise SpillFormatError(f"spill: {t['kind']} with fields {sorted(t['v'])}")
            for name, x in t["v"].items():
                object.__setattr__(out, name, self.decode(x))
            return out
        raise SpillFormatError(f"spill: unknown entry {tag!r}")

    def _ipc(self, i: Any) -> pa.Table:
        with pa.ipc.open_stream(pa.py_buffer(self.buffer(i))) as r:
            return r.read_all()


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The value of a spill file's bytes; SpillFormatError when they are not one. Arrays
    are views of ``data`` (writable when it is a bytearray)."""
    view = memoryview(data).cast("B")
    head = len(MAGIC) + _LENGTH.size
    if bytes(view[:len(MAGIC)]) != MAGIC or len(view) < head:
        raise SpillFormatError("spill: not a spill file of this job (no TDSPILL1 header): "
                               "refusing to read it")
    (n,) = _LENGTH.unpack_from(view, len(MAGIC))
    if head + n > len(view):
        raise SpillFormatError("spill: the header lies past the end of the file")
    try:
        header = json.loads(bytes(view[head:head + n]))
        tree, spans = header["tree"], header["buffers"]
    except (ValueError, KeyError, TypeError) as e:
        raise SpillFormatError(f"spill: a damaged header ({e})") from None
    try:
        return _Reader(view, spans, head + n).decode(tree)
    except (KeyError, TypeError, ValueError, pa.ArrowException) as e:
        if isinstance(e, SpillFormatError):
            raise
        raise SpillFormatError(f"spill: a damaged entry ({type(e).__name__}: {e})") from None
