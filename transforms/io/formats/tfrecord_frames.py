"""TFRecord framing: records cut from a (GZIP/ZLIB) stream with both CRCs checked, bad
stretches reported and skipped; no Example parsing, so it needs neither TensorFlow nor
protobuf (``tfrecord``, ``encoded_tfrecord`` and ``filters.tf`` use it)."""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

_HEADER = struct.Struct("<QI")  # record length, masked CRC of the length bytes
_CRC = struct.Struct("<I")
_BLOCK = 1 << 20  # bytes read (and at most inflated) at a time
ZLIB_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "zlib": zlib.MAX_WBITS}
TF_COMPRESSION = {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _valid_header(head: bytes) -> bool:
    return len(head) >= 12 and _masked_crc(head[:8]) == _CRC.unpack_from(head, 8)[0]


def record_start(head: bytes) -> str | None:
    """none | gzip | zlib: the first compression under which ``head`` (a file's first
    bytes) starts with a valid record header, or None. TFRecord has no magic number, but
    its first 12 bytes are a length and the length's masked CRC32C, which random bytes
    match once in 4 billion: as good as a magic number for telling formats apart."""
    for compression in ("none", "gzip", "zlib"):
        try:
            first = head if compression == "none" else zlib.decompressobj(
                ZLIB_WBITS[compression]).decompress(head, 12)
        except zlib.error:
            continue
        if _valid_header(first):
            return compression
    return None


def shows_tfrecord(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) can begin a TFRecord file: it is empty, it
    is an empty gzip/zlib stream, or a record header starts in it (at 0, or further in
    when the first record is damaged: a damaged TFRecord is the reader's to report, a
    file of another kind is not a TFRecord at all)."""
    if not head:
        return True
    for compression in ("none", "gzip", "zlib"):
        try:
            dec = None if compression == "none" else zlib.decompressobj(ZLIB_WBITS[compression])
            data = head if dec is None else dec.decompress(head, len(head) * 4)
        except zlib.error:
            continue
        if dec is not None and not data and dec.eof:  # an empty compressed TFRecord
            return True
        if len(data) >= 12 and len(_header_starts(data, 0, len(data) - 11)):
            return True
    return False


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
        self._wbits = ZLIB_WBITS.get(compression)
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


def read_frames(f: BinaryIO, compression: str) -> Iterator[bytes | str]:
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


def frame_record(data: bytes) -> bytes:
    """One record as TFRecord stores it: length, its masked CRC32C, data, data's CRC."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, struct.pack("<I", _masked_crc(length)), data,
                     struct.pack("<I", _masked_crc(data))))
