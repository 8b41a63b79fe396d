"""TFRecord input: tf.train.Example records holding one tensor each; one unit per file.

The tensor feature is either a flat float_list/int64_list (shape from ``input.shape``)
or a bytes_list with one ``tf.io.serialize_tensor`` value (dtype and shape in the proto).

Why an own framing reader: TensorFlow's readers stop at the first bad record, and the
dedup job must report bad records and keep going. This reader checks both CRCs, skips
a record whose data CRC fails, resynchronises at the next whole valid record after a
corrupt length header, and inflates GZIP/ZLIB as a stream so big files never sit in
memory. Numeric examples are parsed a batch at a time with ``tf.io.parse_example``;
only a batch that fails is parsed record by record (protobuf, ``example_proto``), to
find and name the bad records. TensorFlow is imported on first use (it takes seconds):
checking a file, encoded values (``encoded_tfrecord``) and writing clean shards need
none. Files on other Beam
filesystems (gs://, ...) are streamed through Beam's reader (the framing reader needs
no more than a readable, seekable file); output to them is written locally and uploaded.
"""

from __future__ import annotations

import functools
import math
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, BinaryIO

import google_crc32c
import ml_dtypes
import numpy as np

from transforms import fs
from transforms.canonical import DTYPE_CODES
from transforms.formats.base import (
    Chunk,
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    default_id,
    record_nbytes,
    rows_within,
)
from transforms.formats.example_proto import example_class

_HEADER = struct.Struct("<QI")  # record length, masked CRC of the length bytes
_CRC = struct.Struct("<I")
_BLOCK = 1 << 20  # bytes read (and at most inflated) at a time
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "zlib": zlib.MAX_WBITS}
TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}
_LIST_DTYPES = {"float_list": "float32", "int64_list": "int64"}  # flat tensor features
_ID_KINDS = ("bytes_list", "int64_list")
_CHECK_ITEMS = 1000  # check() looks for a readable record among this many first items
_RANK_KINDS = ("float_list", "int64_list")


def _tf() -> Any:
    """TensorFlow, for parsing numeric features a batch at a time and serialized tensors
    (framing, CRCs, one Example at a time and writing need none: example_proto)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(f"{e}: reading TFRecord features needs TensorFlow: pip install "
                          "-c constraints.txt 'tensordedup[tf]'") from e
    return tf


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _valid_header(head: bytes) -> bool:
    return len(head) >= 12 and _masked_crc(head[:8]) == _CRC.unpack_from(head, 8)[0]


# ---------------------------------------------------------------------------- framing


def record_start(head: bytes) -> str | None:
    """none | gzip | zlib: the first compression under which ``head`` (a file's first
    bytes) starts with a valid record header, or None. TFRecord has no magic number, but
    its first 12 bytes are a length and the length's masked CRC32C, which random bytes
    match once in 4 billion: as good as a magic number for telling formats apart."""
    for compression in ("none", "gzip", "zlib"):
        try:
            first = head if compression == "none" else zlib.decompressobj(
                _WBITS[compression]).decompress(head, 12)
        except zlib.error:
            continue
        if _valid_header(first):
            return compression
    return None


def detect_compression(f: BinaryIO) -> str:
    """none | gzip | zlib: the first one whose first 12 bytes are a valid record header."""
    head = f.read(1 << 16)
    f.seek(0)
    found = record_start(head)
    if found is not None:
        return found
    # No valid first record (empty stream, or damage right at the start): go by the magic.
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) < 2 or head[0] & 0x0F != 8 or int.from_bytes(head[:2], "big") % 31:
        return "none"  # not a zlib header
    try:
        zlib.decompressobj(zlib.MAX_WBITS).decompress(head, 1 << 16)
        return "zlib"
    except zlib.error:
        return "none"


class _Source:
    """The (decompressed) bytes of an open file, a block at a time.

    A read or decompression error ends the stream and is kept in ``error``; the
    bytes before it stay readable, so the records before the damage survive.
    """

    def __init__(self, f: BinaryIO, compression: str) -> None:
        self._f = f
        self._name = compression
        self._wbits = _WBITS.get(compression)
        self._dec = zlib.decompressobj(self._wbits) if self._wbits else None
        self.buf = b""  # holds the bytes from the read point ``pos`` on
        self.pos = 0
        self._done = False
        self.offset = 0  # of the read point, in the decompressed stream
        self.error: str | None = None

    def available(self) -> int:
        return len(self.buf) - self.pos

    def fill(self, n: int) -> bool:
        """Make n bytes available at the read point; False if the stream ends first."""
        if len(self.buf) - self.pos >= n:
            return True
        parts = [self.buf[self.pos:]]
        have = len(parts[0])
        while have < n and not self._done:
            block = self._next_block()
            parts.append(block)
            have += len(block)
        self.buf, self.pos = b"".join(parts), 0
        return have >= n

    def skip(self, n: int) -> None:
        self.pos += n
        self.offset += n

    def _next_block(self) -> bytes:
        try:
            if self._dec is None:
                block = self._f.read(_BLOCK)
                self._done = not block
                return block
            return self._inflate()
        except OSError as e:
            self._stop(f"read error: {e}")
        return b""

    def _inflate(self) -> bytes:
        assert self._dec is not None and self._wbits is not None
        if self._dec.unconsumed_tail:
            return self._decompress(self._dec.unconsumed_tail)
        if self._dec.eof:  # a further member (concatenated gzip) or the end
            rest = self._dec.unused_data or self._f.read(_BLOCK)
            if not rest:
                self._done = True
                return b""
            self._dec = zlib.decompressobj(self._wbits)
            return self._decompress(rest)
        raw = self._f.read(_BLOCK)
        if not raw:
            self._stop(f"{self._name} stream ends early (truncated file)")
            return self._dec.flush()
        return self._decompress(raw)

    def _decompress(self, raw: bytes) -> bytes:
        """Inflate up to a block; on an error, replay the input in small pieces from the
        saved state to keep what comes before the damage, then end the stream."""
        assert self._dec is not None
        saved = self._dec.copy()
        try:
            return self._dec.decompress(raw, _BLOCK)
        except zlib.error as e:
            self._stop(f"corrupt {self._name} stream: {e}")
        parts = []
        try:
            for i in range(0, len(raw), 256):
                parts.append(saved.decompress(raw[i:i + 256]))
        except zlib.error:
            pass
        return b"".join(parts)

    def _stop(self, error: str) -> None:
        self._done = True
        self.error = error.replace("\n", " ")


def _frames(f: BinaryIO, compression: str) -> Iterator[bytes | str]:
    """Every item of the file in order (an item's ordinal is its position): a record's
    data (bytes), or why a stretch of the file is unusable (str). No tuple per record:
    with TensorFlow loaded, the garbage collector makes every allocation count."""
    src = _Source(f, detect_compression(f) if compression == "auto" else compression)
    while True:
        offset = src.offset
        if not src.fill(12):
            if src.error or src.available():
                yield _end_reason(src, offset)
            return
        length, length_crc = _HEADER.unpack_from(src.buf, src.pos)
        if _masked_crc(src.buf[src.pos:src.pos + 8]) != length_crc:
            _resync(src)
            yield f"corrupt bytes at offset {offset}..{src.offset}"
            continue
        if not src.fill(length + 16):
            yield _end_reason(src, offset)
            return
        start = src.pos + 12
        data = src.buf[start:start + length]
        ok = _masked_crc(data) == _CRC.unpack_from(src.buf, start + length)[0]
        src.skip(length + 16)
        yield data if ok else f"CRC mismatch at offset {offset}"


def _end_reason(src: _Source, offset: int) -> str:
    if src.error:
        return f"{src.error}: the rest from offset {offset} is unreadable"
    return f"truncated record at offset {offset}"


def _resync(src: _Source) -> None:
    """Skip to the next offset where a whole valid record starts, or to the end."""
    src.skip(1)
    while src.fill(12):
        starts = _header_starts(src.buf, src.pos, len(src.buf) - 11)
        if not len(starts):  # none in the buffer; a header may start in its last 11 bytes
            src.skip(len(src.buf) - 11 - src.pos)
            continue
        src.skip(int(starts[0]) - src.pos)
        if _whole_record(src):
            return
        src.skip(1)
    src.skip(src.available())


def _whole_record(src: _Source) -> bool:
    """Whether a record with valid length and data CRCs starts at the read point."""
    length, length_crc = _HEADER.unpack_from(src.buf, src.pos)
    if _masked_crc(src.buf[src.pos:src.pos + 8]) != length_crc or not src.fill(length + 16):
        return False
    start = src.pos + 12
    data_crc = _CRC.unpack_from(src.buf, start + length)[0]
    return _masked_crc(src.buf[start:start + length]) == data_crc


@functools.cache
def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


def _header_starts(buf: bytes, start: int, stop: int) -> np.ndarray:
    """The offsets in [start, stop) where buf holds a valid record header: a length below
    2**31 (any protobuf's) and its masked CRC. Vectorized, so that a large corrupt stretch
    (say a gzip file read with compression: none) is skipped at memory speed."""
    a = np.frombuffer(buf, dtype=np.uint8)[start:stop + 11]
    m = stop - start
    high = a[4:4 + m] | a[5:5 + m] | a[6:6 + m] | a[7:7 + m]
    # 12 zero bytes are no header (the masked CRC of a zero length is not 0): zero-filled
    # stretches, a common kind of damage, are skipped without computing CRCs.
    rest = a[0:m] | a[1:1 + m] | a[2:2 + m] | a[3:3 + m] | a[8:8 + m] | a[9:9 + m]
    rest |= a[10:10 + m] | a[11:11 + m]
    at = np.flatnonzero((high == 0) & (a[3:3 + m] < 0x80) & (rest != 0))
    table, crc = _crc32c_table(), np.full(len(at), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(8):
        crc = table[(crc ^ a[at + k]) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)
    stored = a[at + 8].astype(np.uint32)
    for k in range(1, 4):
        stored |= a[at + 8 + k].astype(np.uint32) << (8 * k)
    return at[masked == stored] + start


# ---------------------------------------------------------------------------- examples


class _Bad(Exception):
    """A record that cannot be used; the message is the one-line reason."""


@dataclass
class _Layout:
    """What a file's records hold: the kinds of the features (from the first record
    that has them) and, for serialized tensors, the dtype and shape every record must
    have (from the spec, else from the first decodable tensor)."""

    kind: str | None = None  # of the tensor feature: float_list | int64_list | bytes_list
    id_kind: str | None = None
    rank_kind: str | None = None
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    problem: str | None = None  # why no record can be used (the spec disagrees with the file)

    def learn(self, examples: Iterator[dict[str, Any]], spec: TensorSpec) -> None:
        for feats in examples:
            if self.kind is None and spec.tensor in feats:
                self.kind = feats[spec.tensor].WhichOneof("kind")
                if self.kind in _LIST_DTYPES:
                    self.problem = _list_problem(spec, self.kind)
            if spec.id is not None and self.id_kind is None and spec.id in feats:
                self.id_kind = _kind_in(feats[spec.id], _ID_KINDS)
            if spec.rank is not None and self.rank_kind is None and spec.rank in feats:
                self.rank_kind = _kind_in(feats[spec.rank], _RANK_KINDS)
            if self.ready(spec):
                return

    def ready(self, spec: TensorSpec) -> bool:
        return (self.kind is not None and (spec.id is None or self.id_kind is not None)
                and (spec.rank is None or self.rank_kind is not None))


def _kind_in(feature: Any, kinds: tuple[str, ...]) -> str | None:
    kind = feature.WhichOneof("kind")
    return kind if kind in kinds else None


def _list_problem(spec: TensorSpec, kind: str) -> str | None:
    """Why a flat number list cannot be read with this spec (None if it can)."""
    dtype = _LIST_DTYPES[kind]
    if spec.dtype is not None and spec.dtype != dtype:
        return (f"input.dtype: feature {spec.tensor!r} is a {kind} ({dtype}), not "
                f"{spec.dtype}: set input.dtype: {dtype}")
    if spec.shape is None:
        return (f"input.shape: feature {spec.tensor!r} is a flat {kind}: set input.shape "
                "to the per-record shape")
    return None


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@functools.cache
def _tf_dtypes() -> dict[int, np.dtype]:
    """TF DataType enum -> numpy dtype, for the dtypes a fingerprint takes."""
    tf = _tf()
    return {tf.as_dtype(name).as_datatype_enum: _np_dtype(name)
            for name in DTYPE_CODES if name != "complex32"}


def _examples(datas: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The feature maps of the records that parse as tf.train.Example."""
    from google.protobuf.message import DecodeError

    Example = example_class()
    for data in datas:
        try:
            yield Example.FromString(data).features.feature
        except DecodeError:
            continue


def _value(feats: dict[str, Any], name: str, kinds: tuple[str, ...]) -> tuple[str, Any]:
    """(kind, value) of a one-value feature of one of ``kinds``."""
    if name not in feats:
        raise _Bad(f"no feature {name!r}")
    kind = feats[name].WhichOneof("kind")
    if kind not in kinds:
        raise _Bad(f"feature {name!r} is {kind or 'empty'}, not {' or '.join(kinds)}")
    values = getattr(feats[name], kind).value
    if len(values) != 1:
        raise _Bad(f"feature {name!r} has {len(values)} values, not 1")
    return kind, values[0]


def _id(feats: dict[str, Any], name: str) -> str:
    kind, value = _value(feats, name, _ID_KINDS)
    if kind == "int64_list":
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(f"feature {name!r}: id is not UTF-8") from None


def _tensor(feats: dict[str, Any], spec: TensorSpec, layout: _Layout) -> Any:
    """The flat tensor as an array of ``spec.shape``, or the serialized TensorProto."""
    if layout.problem:
        raise _Bad(layout.problem)
    name = spec.tensor
    if name not in feats:
        raise _Bad(f"no feature {name!r}")
    kind = feats[name].WhichOneof("kind")
    if kind != layout.kind:
        raise _Bad(f"feature {name!r} is {kind or 'empty'}, not {layout.kind} like the first "
                   "record")
    if kind == "bytes_list":
        return _value(feats, name, (kind,))[1]
    values = getattr(feats[name], kind).value
    assert spec.shape is not None  # else layout.problem
    if len(values) != math.prod(spec.shape):
        raise _Bad(f"feature {name!r} has {len(values)} values, not {math.prod(spec.shape)} "
                   f"(input.shape {list(spec.shape)})")
    return np.asarray(values, dtype=_LIST_DTYPES[kind]).reshape(spec.shape)


def _parse_one(data: bytes, spec: TensorSpec, layout: _Layout) -> tuple[Any, ...]:
    """(id, tensor, rank, reason) of one record; the reason says why it cannot be used."""
    from google.protobuf.message import DecodeError

    try:
        feats = example_class().FromString(data).features.feature
    except DecodeError as e:
        return None, None, None, f"not a tf.train.Example: {e}"
    record_id = None
    try:
        if spec.id is not None:
            record_id = _id(feats, spec.id)
        tensor = _tensor(feats, spec, layout)
        rank = None
        if spec.rank is not None:
            kinds = (layout.rank_kind,) if layout.rank_kind else _RANK_KINDS
            rank = _value(feats, spec.rank, kinds)[1]
    except _Bad as e:
        return record_id, None, None, str(e)
    return record_id, tensor, rank, None


def _parse_batch(datas: list[bytes], spec: TensorSpec, layout: _Layout) -> tuple | None:
    """(ids or None, tensors, ranks) of a batch in which every record is well-formed,
    parsed in one ``tf.io.parse_example``; None if any record is not."""
    if not datas or not layout.ready(spec) or layout.problem:
        return None
    tf = _tf()
    kind_dtype = {"float_list": tf.float32, "int64_list": tf.int64, "bytes_list": tf.string}
    shape = [] if layout.kind == "bytes_list" else list(spec.shape or ())
    features = {spec.tensor: tf.io.FixedLenFeature(shape, kind_dtype[layout.kind])}
    if spec.id is not None:
        features[spec.id] = tf.io.FixedLenFeature([], kind_dtype[layout.id_kind])
    if spec.rank is not None:
        features[spec.rank] = tf.io.FixedLenFeature([], kind_dtype[layout.rank_kind])
    try:
        out = {k: v.numpy() for k, v in tf.io.parse_example(datas, features).items()}
    except tf.errors.OpError:
        return None
    ids = None
    if spec.id is not None:
        if layout.id_kind == "int64_list":
            ids = [str(i) for i in out[spec.id].tolist()]
        else:
            try:
                ids = [b.decode("utf-8") for b in out[spec.id]]
            except UnicodeDecodeError:
                return None
    return ids, out[spec.tensor], None if spec.rank is None else out[spec.rank]


def _tensor_header(serialized: bytes) -> tuple[Any, np.dtype, tuple[int, ...]]:
    """(TensorProto, numpy dtype, shape) of a tf.io.serialize_tensor value."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.framework.tensor_pb2 import TensorProto
    from tensorflow.core.framework.types_pb2 import DataType

    try:
        proto = TensorProto.FromString(serialized)
    except DecodeError as e:
        raise _Bad(f"not a serialized tensor (tf.io.serialize_tensor): {e}") from None
    dtype = _tf_dtypes().get(proto.dtype)
    if dtype is None:
        name = DataType.Name(proto.dtype) if proto.dtype in DataType.values() else proto.dtype
        raise _Bad(f"unsupported tensor dtype {name}")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if proto.tensor_shape.unknown_rank or min(shape, default=0) < 0:
        raise _Bad("tensor of unknown shape")
    return proto, dtype, shape


def _tensor_bytes(serialized: bytes, layout: _Layout) -> bytes:
    """The raw (C order, native byte order) data of a serialized tensor of the layout's
    dtype and shape; the first decodable tensor fixes what the spec leaves open."""
    proto, dtype, shape = _tensor_header(serialized)
    if layout.dtype is None:
        layout.dtype = dtype
    if layout.shape is None:
        layout.shape = shape
    if dtype != layout.dtype:
        raise _Bad(f"tensor dtype {dtype.name}, not {layout.dtype.name}")
    if shape != layout.shape:
        raise _Bad(f"tensor shape {list(shape)}, not {list(layout.shape)}")
    nbytes = math.prod(shape) * dtype.itemsize
    content = proto.tensor_content
    if not content and nbytes:  # protos not made by serialize_tensor may use typed fields
        try:
            content = np.asarray(_tf().make_ndarray(proto), dtype=dtype).tobytes()
        except (TypeError, ValueError) as e:
            raise _Bad(f"unreadable tensor: {e}") from None
    if len(content) != nbytes:
        raise _Bad(f"tensor has {len(content)} bytes of data, not {nbytes}")
    return content


def _decode_tensors(values: Any, reasons: list[str | None], spec: TensorSpec,
                    layout: _Layout) -> np.ndarray:
    """The tensors of the serialized values whose record is still ok; marks the others."""
    contents = []
    for i, value in enumerate(values):
        if reasons[i] is None:
            try:
                contents.append(_tensor_bytes(value, layout))
            except _Bad as e:
                reasons[i] = f"feature {spec.tensor!r}: {e}"
    if layout.dtype is None or layout.shape is None:
        return np.empty((0,))
    data = np.frombuffer(bytearray().join(contents), dtype=layout.dtype)
    return data.reshape((len(contents), *layout.shape))


def _parse(datas: list[bytes], spec: TensorSpec,
           layout: _Layout) -> tuple[list, np.ndarray, np.ndarray | None, list[str | None]]:
    """(ids or None per record, tensors and ranks of the usable records, reason per record
    or None if usable)."""
    n = len(datas)
    if not layout.ready(spec):
        layout.learn(_examples(datas), spec)
    reasons: list[str | None] = [None] * n
    fast = _parse_batch(datas, spec, layout)
    if fast is not None:
        ids, values, ranks = fast
        ids = ids or [None] * n
    else:
        ids, values, ranks = [None] * n, [None] * n, [None] * n
        for i, data in enumerate(datas):
            ids[i], values[i], ranks[i], reasons[i] = _parse_one(data, spec, layout)
    if layout.kind == "bytes_list":
        tensors = _decode_tensors(values, reasons, spec, layout)
    elif fast is not None:
        tensors = values
    elif layout.kind in _LIST_DTYPES and spec.shape is not None:
        rows = [v for v, why in zip(values, reasons, strict=True) if why is None]
        tensors = np.array(rows, dtype=_LIST_DTYPES[layout.kind])
        tensors = tensors.reshape((len(rows), *spec.shape))
    else:
        tensors = np.empty((0,))
    rank = None
    if spec.rank is not None:
        rank_dtype = np.int64 if layout.rank_kind == "int64_list" else np.float64
        if fast is None:
            ranks = [0 if why else r for r, why in zip(ranks, reasons, strict=True)]
        ok = np.array([why is None for why in reasons], dtype=bool)
        rank = np.asarray(ranks, dtype=rank_dtype)[ok]
    return ids, tensors, rank, reasons


def _chunk(file_index: int, path: str, first: int, items: list[bytes | str],
           spec: TensorSpec, layout: _Layout) -> Chunk:
    """One chunk of the items at positions first, first + 1, ...: every problem becomes an
    InvalidRecord."""
    invalid = [InvalidRecord(first + i, default_id(path, first + i), item)
               for i, item in enumerate(items) if isinstance(item, str)]
    positions = first + np.array([i for i, item in enumerate(items) if isinstance(item, bytes)],
                                 dtype=np.int64)
    ids, tensors, rank, reasons = _parse(
        [item for item in items if isinstance(item, bytes)], spec, layout)
    ids = np.array([default_id(path, p) if i is None else i
                    for p, i in zip(positions.tolist(), ids, strict=True)], dtype=object)
    ok = np.array([why is None for why in reasons], dtype=bool)
    invalid += [InvalidRecord(int(positions[i]), ids[i], reasons[i] or "")
                for i in np.flatnonzero(~ok)]
    invalid.sort(key=lambda r: r.position)
    return Chunk(file_index, positions[ok], ids[ok], tensors, rank, invalid)


# ---------------------------------------------------------------------------- the format


def check(path: str, spec: TensorSpec) -> TensorSpec:
    """Raise InputError if the first readable record does not fit the spec; else the spec
    with the dtype (and, for serialized tensors, shape) the first record has."""
    try:
        f = fs.open_read(path)
    except OSError:
        return spec  # reported as invalid by read()
    with f:
        items = islice(_frames(f, spec.compression), _CHECK_ITEMS)
        feats = next(_examples(item for item in items if isinstance(item, bytes)), None)
    if feats is None:
        return spec  # empty, or nothing readable near the start: read() reports bad records
    have = ", ".join(sorted(feats)) or "none"
    for key, name in (("input.tensor", spec.tensor), ("input.id", spec.id), ("keep", spec.rank)):
        if name is not None and name not in feats:
            raise InputError(f"{path}: {key}: the first record has no feature {name!r} (its "
                             f"features: {have}): name one of them")
    if spec.id is not None and _kind_in(feats[spec.id], _ID_KINDS) is None:
        raise InputError(f"{path}: input.id: feature {spec.id!r} is "
                         f"{feats[spec.id].WhichOneof('kind') or 'empty'}, not bytes_list or "
                         "int64_list: name a string or integer feature")
    if spec.rank is not None and _kind_in(feats[spec.rank], _RANK_KINDS) is None:
        raise InputError(f"{path}: keep: feature {spec.rank!r} is "
                         f"{feats[spec.rank].WhichOneof('kind') or 'empty'}, not float_list or "
                         "int64_list: keep by a numeric feature")
    kind = feats[spec.tensor].WhichOneof("kind")
    if kind in _LIST_DTYPES:
        _check_list(path, spec, kind, len(getattr(feats[spec.tensor], kind).value))
        return replace(spec, dtype=_LIST_DTYPES[kind])
    if kind == "bytes_list":
        dtype, shape = _check_serialized(path, spec, feats[spec.tensor].bytes_list.value)
        return replace(spec, dtype=dtype, shape=shape)
    raise InputError(f"{path}: input.tensor: feature {spec.tensor!r} is empty in the first "
                     "record: name a feature that holds the tensor")


def _check_list(path: str, spec: TensorSpec, kind: str, n: int) -> None:
    problem = _list_problem(spec, kind)
    if problem:
        raise InputError(f"{path}: {problem} (the first record has {n} values)")
    assert spec.shape is not None
    if math.prod(spec.shape) != n:
        raise InputError(f"{path}: input.shape: feature {spec.tensor!r} has {n} values in the "
                         f"first record, not {math.prod(spec.shape)} = {list(spec.shape)}: "
                         "fix input.shape")


def _check_serialized(path: str, spec: TensorSpec, values: Any) -> tuple[str, tuple[int, ...]]:
    name = spec.tensor
    if len(values) != 1:
        raise InputError(f"{path}: input.tensor: feature {name!r} is a bytes_list of "
                         f"{len(values)} values, not one tf.io.serialize_tensor value: name a "
                         "feature holding a serialized tensor (or a float_list/int64_list)")
    try:
        _, dtype, shape = _tensor_header(values[0])
    except _Bad as e:
        from transforms.images import sniff

        kind = sniff(values[0])
        if kind is not None:  # encoded images (image/encoded): decode them on the workers
            raise InputError(f"{path}: input.decode: feature {name!r} holds {kind} image "
                             "bytes, not a serialized tensor: set input.decode: image (or "
                             "bytes to compare the files as stored)") from None
        raise InputError(f"{path}: input.tensor: feature {name!r}: {e}") from None
    if spec.dtype is not None and spec.dtype != dtype.name:
        raise InputError(f"{path}: input.dtype: feature {name!r} holds {dtype.name} tensors, "
                         f"not {spec.dtype}: set input.dtype: {dtype.name} or leave it out")
    if spec.shape is not None and tuple(spec.shape) != shape:
        raise InputError(f"{path}: input.shape: feature {name!r} holds tensors of shape "
                         f"{list(shape)}, not {list(spec.shape)}: fix input.shape or leave it out")
    return dtype.name, tuple(shape)


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """One unit per file: records have no index, so a file cannot be split."""
    return [Unit(file_index, path, 0, None)]


def _batch(items: Iterator[bytes | str], rows: int, max_bytes: int | None) -> list[bytes | str]:
    """The next items, up to ``rows`` of them or until they hold ``max_bytes`` (the
    serialized size bounds a batch whose record shape the spec does not fix)."""
    batch: list[bytes | str] = []
    size = 0
    for item in items:
        batch.append(item)
        size += len(item)
        if len(batch) >= rows or (max_bytes and size >= max_bytes):
            break
    return batch


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    try:
        f = fs.open_read(unit.path)
    except OSError as e:
        yield Chunk.of_invalid(unit.file_index,
                               [InvalidRecord(0, unit.path, f"cannot open file: {e}")])
        return
    layout = _Layout(dtype=None if spec.dtype is None else _np_dtype(spec.dtype),
                     shape=None if spec.shape is None else tuple(spec.shape))
    with f:
        items = islice(_frames(f, spec.compression), unit.start, unit.stop)
        first = unit.start
        rows = rows_within(batch_rows, batch_bytes, record_nbytes(spec))
        while batch := _batch(items, rows, batch_bytes):
            yield _chunk(unit.file_index, unit.path, first, batch, spec, layout)
            first += len(batch)


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """Copy the intact records not in ``drop``, byte for byte, with src's compression."""
    try:
        f = fs.open_read(src)
    except OSError:
        return 0
    with f:
        compression = detect_compression(f)
        dropped = set(np.asarray(drop).tolist())
        written = 0
        with fs.local_file_for(dst) as local, open(local, "wb", buffering=1 << 20) as out:
            wbits = _WBITS.get(compression)
            z = None if wbits is None else zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION,
                                                            zlib.DEFLATED, wbits)
            for position, item in enumerate(_frames(f, compression)):
                if isinstance(item, bytes) and position not in dropped:
                    framed = _frame(item)
                    out.write(framed if z is None else z.compress(framed))
                    written += 1
            if z is not None:
                out.write(z.flush())
    return written


def _frame(data: bytes) -> bytes:
    """One record as TFRecord stores it: length, its masked CRC32C, data, data's CRC."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, struct.pack("<I", _masked_crc(length)), data,
                     struct.pack("<I", _masked_crc(data))))


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tensors at ``positions`` of one file, for showing a few records (the report's
    page). TFRecord has no index: the file is read up to the last position wanted, with
    the job's own reader, so positions mean what they meant to the job. Invalid
    positions are left out."""
    want = set(int(p) for p in positions)
    if not want:
        return {}
    out: dict[int, np.ndarray] = {}
    for chunk in read(Unit(0, path, 0, max(want) + 1), spec, 4096):
        for i, p in enumerate(chunk.positions.tolist()):
            if p in want:
                out[p] = chunk.tensors[i]
    return out
