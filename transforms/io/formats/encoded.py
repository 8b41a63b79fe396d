"""Formats whose tensor field holds encoded values (images, bytes, text), decoded on workers.

Why a wrapper and not a branch inside each format: a format finds and frames records;
what a record's value means (a JPEG, a sentence) is the same question for all of them.
Each format has a value reader (``encoded_<format>``: ``check``, ``read_values``,
``values_at``) that yields the stored values; this module decodes them
(``transforms.images``) into Chunks cut by decoded bytes, so memory stays bounded
whatever the images' sizes. Clean shards are written by the format itself, so the
encoded bytes and every other field are copied byte for byte.

Exact dedup compares what a value is, not how it was stored: an image's digest is that
of its full-resolution decoded pixels (``Chunk.digests``), while ``Chunk.tensors``
holds the pixels the near stage compares (resized when ``resize`` is set). With
``exact_on: bytes`` the digest is that of the stored bytes, so a JPEG need not be
decoded at full resolution: it is decoded at a reduced scale for the resize. Without
``resize`` (and without ``input.shape``) images keep their own sizes: ``tensors`` is
then an object array of arrays, one per record, and only exact dedup applies.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from transforms.fingerprint import fingerprint_uint8
from transforms.images import BadImage, decode_image, sniff
from transforms.io.formats.base import (
    Chunk,
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    Values,
    arrow_ids,
)

_POOL: ThreadPoolExecutor | None = None  # Pillow releases the GIL while it decodes
DECODED_CACHE_BYTES = 64 << 20  # decoded values kept per unit for repeats of their bytes


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        import os

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        _POOL = ThreadPoolExecutor(max(1, cores), thread_name_prefix="decode")
    return _POOL


def dense(spec: TensorSpec) -> bool:
    """Whether every decoded value has one shape: images resized, or of ``input.shape``."""
    dec = spec.decode
    return dec is not None and dec.kind == "image" and (
        dec.resize is not None or spec.shape is not None)


def decoded_shape(spec: TensorSpec) -> tuple[int, ...] | None:
    """The shape every decoded value has, or None when it varies by record."""
    dec = spec.decode
    if dec is None or not dense(spec):
        return None
    if dec.resize is not None:
        return (*dec.resize, dec.channels or 3)
    return tuple(spec.shape or ())


def decode_value(value: bytes | str, spec: TensorSpec, full: bool = False
                 ) -> tuple[Any, bytes]:
    """(tensor, 16-byte exact digest) of one stored value; raises BadImage with the reason.
    ``full``: the full-resolution image, not the resized one (for showing it)."""
    dec = spec.decode
    assert dec is not None
    if dec.kind == "text":
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError as e:
                utf16 = value[:2] in (b"\xff\xfe", b"\xfe\xff")  # its byte-order mark
                raise BadImage(f"not UTF-8 text ({e.reason} at byte {e.start}"
                               + ("; it starts with a UTF-16 byte-order mark: write the "
                                  "texts as UTF-8" if utf16 else "") + ")") from None
        nul = value.count("\0")
        if nul * 4 >= len(value) > 0:  # UTF-16 of ASCII decodes as UTF-8, a NUL per letter
            raise BadImage(f"not UTF-8 text ({nul:,} of its {len(value):,} characters are "
                           "NUL, as in UTF-16 text without a byte-order mark: write the "
                           "texts as UTF-8)")
        utf8 = value.encode("utf-8")
        return value, fingerprint_uint8(utf8, (len(utf8),))
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if dec.kind == "bytes":
        return np.frombuffer(data, np.uint8), fingerprint_uint8(data, (len(data),))
    by_bytes = dec.exact_on == "bytes"
    pixels, small = decode_image(data, channels=dec.channels,
                                 resize=None if full else dec.resize,
                                 max_pixels=dec.max_pixels, draft=by_bytes and not full)
    digest = (fingerprint_uint8(data, (len(data),)) if by_bytes
              else fingerprint_uint8(pixels, pixels.shape))
    if by_bytes and _flat(small):  # maybe one colour: then its pixels' digest (below)
        whole, _ = decode_image(data, channels=dec.channels or (3 if dec.resize else None),
                                max_pixels=dec.max_pixels)
        if _flat(whole):
            digest = fingerprint_uint8(whole, whole.shape)
    if dense(spec) and not full:
        want = decoded_shape(spec)
        if small.shape != want:
            raise BadImage(f"image of shape {list(small.shape)}, not input.shape "
                           f"{list(want or ())}: set input.resize to compare images of "
                           "other sizes")
        return small, digest
    return pixels, digest


def _flat(im: np.ndarray) -> bool:
    """One colour (every channel constant): a blank or placeholder picture. With
    ``exact_on: bytes`` its exact digest is its pixels', as without: near search never
    finds a flat picture near anything (no pattern), so its copies in other containers
    (the most re-posted pictures of scraped sets) were all kept."""
    flat = im.reshape(-1, im.shape[-1] if im.ndim == 3 else 1)
    return bool((flat == flat[:1]).all())


def _decode(value: bytes | str, spec: TensorSpec) -> tuple[Any, bytes] | str:
    try:
        return decode_value(value, spec)
    except BadImage as e:
        return str(e)


def _stack(tensors: list[Any], spec: TensorSpec) -> np.ndarray:
    if dense(spec):
        return np.stack(tensors) if tensors else np.empty((0, *(decoded_shape(spec) or ())),
                                                            np.uint8)
    out = np.empty(len(tensors), dtype=object)
    for k, t in enumerate(tensors):
        out[k] = t
    return out


class Decoded:
    """Values of one unit decoded ahead on the pool's threads, and by their bytes: a
    scraped dataset holds the same file many times (one image re-posted 50,000 times), and
    identical bytes decode to identical pixels, so each is decoded once. Results are kept
    while they total at most DECODED_CACHE_BYTES; past that, new values are decoded every
    time. Decoding runs ahead of the caller (at most ``AHEAD`` values per thread), so the
    threads are not idle while the caller frames, parses and stacks records: a window
    decoded, then waited for, left them idle half the time on drafted JPEGs."""

    AHEAD = 4

    def __init__(self) -> None:
        self.results: dict[bytes | str, tuple[Any, bytes] | str] = {}
        self.size = 0

    def stream(self, values: list[bytes | str], spec: TensorSpec
               ) -> Iterator[tuple[Any, bytes] | str]:
        """The result of each of ``values``, in order."""
        pool = _pool()
        pending: deque[tuple[bytes | str, Any]] = deque()
        running: dict[bytes | str, Future] = {}

        def take() -> tuple[Any, bytes] | str:
            key, got = pending.popleft()
            if isinstance(got, Future):
                got = got.result()
                if running.pop(key, None) is not None and self.size < DECODED_CACHE_BYTES:
                    self.results[key] = got
                    self.size += _nbytes(got) + 16
            return got

        for value in values:
            key = value if isinstance(value, str) else xxhash.xxh3_128_digest(value)
            got = self.results.get(key)
            if got is None:
                got = running.get(key)
                if got is None:
                    got = running[key] = pool.submit(_decode, value, spec)
            pending.append((key, got))
            while len(pending) > self.AHEAD * pool._max_workers:
                yield take()
        while pending:
            yield take()


def _nbytes(got: tuple[Any, bytes] | str) -> int:
    """Bytes held by a decoded value (or by the reason it was invalid)."""
    if isinstance(got, str):
        return len(got)
    return got[0].nbytes if isinstance(got[0], np.ndarray) else len(got[0])


def decode_values(vals: Values, spec: TensorSpec, rows: int, seen: Decoded
                  ) -> Iterator[Chunk]:
    """Chunks of the decoded values: cut at ``rows`` records or ``Decode.chunk_bytes``
    decoded bytes; values that cannot be decoded become invalid records with the reason.
    ``seen``: values decoded earlier in the unit (their repeats are not decoded again)."""
    dec = spec.decode
    assert dec is not None
    ids = arrow_ids(vals.ids)
    invalid = list(vals.invalid)
    keep: list[int] = []
    tensors: list[Any] = []
    digests: list[bytes] = []
    size = 0

    def chunk() -> Chunk:
        idx = pa.array(keep, pa.int64())
        out = Chunk(vals.file_index, vals.positions[keep], ids.take(idx), _stack(tensors, spec),
                    None if vals.rank is None else vals.rank[keep],
                    sorted(invalid, key=lambda r: r.position),
                    np.frombuffer(b"".join(digests), dtype="V16"))
        keep.clear(), tensors.clear(), digests.clear(), invalid.clear()
        return out

    for i, got in enumerate(seen.stream(vals.values, spec)):
        if isinstance(got, str):
            invalid.append(InvalidRecord(int(vals.positions[i]), ids[i].as_py(),
                                         f"{spec.tensor!r}: {got}"))
            continue
        keep.append(i)
        tensors.append(got[0])
        digests.append(got[1])
        size += _nbytes(got)
        if size >= dec.chunk_bytes or len(keep) >= rows:
            yield chunk()
            size = 0
    if keep or invalid:
        yield chunk()


FIRST_VALUES = 20  # values check_first tries when the first does not decode


def check_first(path: str, spec: TensorSpec, value: bytes | str, where: str,
                more: Callable[[int], list[bytes | str]] | None = None) -> None:
    """Refuse (one line, exit 2) a ``decode`` that does not fit the stored values: the
    first, and when it does not decode, most of the first FIRST_VALUES (``more(n)``: the
    first n values). Why not the first alone: one odd value (1 in 50 not UTF-8) is an
    invalid record, at the start as anywhere else, not a wrong setting."""
    dec = spec.decode
    assert dec is not None
    try:
        decode_value(value, spec)
        return
    except BadImage as e:
        error = e
    try:
        tried = more(FIRST_VALUES) if more is not None else [value]
    except Exception:  # noqa: BLE001 (a damaged file: the first value speaks, read() reports)
        tried = [value]
    bad = 0
    for v in tried:
        try:
            decode_value(v, spec)
        except BadImage:
            # a damaged image (a truncated download: the bytes start as an image does) is
            # an invalid record when read; only values of another kind tell the setting
            bad += not (dec.kind == "image" and isinstance(v, bytes | bytearray | memoryview)
                        and sniff(bytes(v[:12])) is not None)
    if tried and bad * 2 < len(tried):
        return  # the first record is the odd one: invalid when read
    also = f"; so are {bad - 1} of the next {len(tried) - 1}" if len(tried) > 1 else ""
    if dec.kind == "image":
        raise InputError(f"{path}: input.decode: {where} in the first record is no image "
                         f"({error}{also}): use input.decode: bytes (the stored bytes) or text")
    raise InputError(f"{path}: input.decode: {where} in the first record is {error}{also}: "
                     "use input.decode: bytes")


class Encoded:
    """``base.Format`` for a format whose tensor field holds encoded values."""

    def __init__(self, name: str) -> None:
        self.fmt: ModuleType = importlib.import_module(f"transforms.io.formats.{name}")
        self.values: ModuleType = importlib.import_module(f"transforms.io.formats.encoded_{name}")

    # the copy reads stored bytes, not decoded tensors: it cannot take the report's rows
    write_showing = None

    def __getattr__(self, attr: str) -> Any:  # plan, write, write_notes: the format's own
        return getattr(self.fmt, attr)

    def check(self, path: str, spec: TensorSpec) -> TensorSpec:
        found = self.values.check(path, spec)
        if found is not None:
            check_first(path, spec, *found, lambda n: list(
                self.values.values_at(path, spec, list(range(n))).values()))
        return replace(spec, dtype="uint8" if spec.decode.kind != "text" else None,
                       shape=decoded_shape(spec))

    def read(self, unit: Unit, spec: TensorSpec, batch_rows: int,
             batch_bytes: int | None = None) -> Iterator[Chunk]:
        cap = min(spec.decode.chunk_bytes, batch_bytes or spec.decode.chunk_bytes)
        seen = Decoded()
        for vals in self.values.read_values(unit, spec, batch_rows, cap):
            yield from decode_values(vals, spec, batch_rows, seen)

    def read_rows(self, path: str, spec: TensorSpec, positions: list[int]) -> dict[int, Any]:
        """Decoded values at ``positions``, images at full resolution (for the report)."""
        out = {}
        for p, value in self.values.values_at(path, spec, positions).items():
            try:
                out[p] = decode_value(value, spec, full=True)[0]
            except BadImage:
                continue
        return out
