"""TFRecord input: tf.train.Example records holding one tensor each; one unit per file.

The tensor feature is either a flat float_list/int64_list (shape from ``input.shape``,
else the one size the file's first records hold) or a bytes_list with one
``tf.io.serialize_tensor`` value (dtype and shape in the proto).

Why an own framing reader (``tfrecord_frames``): TensorFlow's readers stop at the first
bad record, and the dedup job must report bad records and keep going. This reader checks
both CRCs, skips a record whose data CRC fails, resynchronises at the next whole valid
record after a corrupt length header, and inflates GZIP/ZLIB as a stream so big files
never sit in memory. Numeric examples are parsed (``tfrecord_parse``) a batch at a time
with ``tf.io.parse_example``; only a batch that fails is parsed record by record
(protobuf, ``example_proto``), to find and name the bad records. TensorFlow is imported
on first use (it takes seconds): checking a file, encoded values (``encoded_tfrecord``)
and writing clean shards need none. Files on other Beam filesystems (gs://, ...) are
streamed through Beam's reader (the framing reader needs no more than a readable,
seekable file); output to them is written locally and uploaded.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from dataclasses import replace
from itertools import islice
from typing import Any

import numpy as np

from transforms.canonical import dtype_named
from transforms.io import fs
from transforms.io.formats.base import (
    JACCARD_TEXT_FIX,
    Chunk,
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    default_id,
    no_fixed_size,
    ragged_tensors,
    record_nbytes,
    rows_within,
    unreadable_file,
    utf8_text,
)
from transforms.io.formats.tfrecord_frames import (
    ZLIB_WBITS,
    detect_compression,
    frame_record,
    read_frames,
)
from transforms.io.formats.tfrecord_parse import (
    CHECK_RECORDS,
    LIST_DTYPES,
    BadExample,
    FeatureLayout,
    checked_features,
    list_problem,
    list_sizes,
    parse_examples,
    parse_records,
    tensor_header,
)

CHECK_ITEMS = 1000  # check() looks for a readable record among this many first items
CHECK_BYTES = 1 << 20  # and reads CHECK_RECORDS of them, or this many bytes of them


def _chunk(file_index: int, path: str, first: int, items: list[bytes | str],
           spec: TensorSpec, layout: FeatureLayout) -> Chunk:
    """One chunk of the items at positions first, first + 1, ...: every problem becomes an
    InvalidRecord."""
    invalid = [InvalidRecord(first + i, default_id(path, first + i), item)
               for i, item in enumerate(items) if isinstance(item, str)]
    positions = first + np.array([i for i, item in enumerate(items) if isinstance(item, bytes)],
                                 dtype=np.int64)
    ids, tensors, rank, reasons = parse_records(
        [item for item in items if isinstance(item, bytes)], spec, layout)
    ids = np.array([default_id(path, p) if i is None else i
                    for p, i in zip(positions.tolist(), ids, strict=True)], dtype=object)
    ok = np.array([why is None for why in reasons], dtype=bool)
    invalid += [InvalidRecord(int(positions[i]), ids[i], reasons[i] or "")
                for i in np.flatnonzero(~ok)]
    invalid.sort(key=lambda r: r.position)
    digests = None
    if spec.ragged:  # integer sequences of any length: digests of each as its own tensor
        tensors, digests = ragged_tensors(tensors)
    return Chunk(file_index, positions[ok], ids[ok], tensors, rank, invalid, digests)


# ---------------------------------------------------------------------------- the format


def first_examples(path: str, spec: TensorSpec) -> list[dict[str, Any]]:
    """The feature maps of a file's first CHECK_RECORDS readable records (among its first
    CHECK_ITEMS items); [] when it cannot be opened, is empty or has none near its start
    (read() reports those)."""
    try:
        f = fs.open_read(path)
    except OSError:
        return []
    with f:
        items = islice(read_frames(f, spec.compression), CHECK_ITEMS)
        return list(islice(parse_examples(_within(items, CHECK_BYTES)), CHECK_RECORDS))


def _within(items: Iterator[bytes | str], max_bytes: int) -> Iterator[bytes]:
    """The records among ``items`` until they hold ``max_bytes`` (at least one)."""
    size = 0
    for item in items:
        if isinstance(item, bytes):
            yield item
            size += len(item)
            if size >= max_bytes:
                return


def check(path: str, spec: TensorSpec) -> TensorSpec:
    """Raise InputError if no record can be read with the spec (what the first records
    hold: ``checked_features``); else the spec with the dtype (and, for serialized
    tensors, shape) the records have."""
    examples = first_examples(path, spec)
    if not examples:
        return spec  # empty, or nothing readable near the start: read() reports bad records
    kind, feats = checked_features(path, spec, examples)
    if kind in LIST_DTYPES:
        _check_list(path, spec, kind, len(getattr(feats[spec.tensor], kind).value))
        found = replace(spec, dtype=LIST_DTYPES[kind],
                        shape=spec.shape or _one_size(path, spec, kind, examples))
    else:
        dtype, shape = _check_serialized(path, spec, feats[spec.tensor].bytes_list.value)
        found = replace(spec, dtype=dtype, shape=shape)
    if spec.tensor not in examples[0] and (spec.dtype is None or spec.shape is None) \
            and not spec.ragged:
        # The config does not say what the feature holds: the file's first record alone
        # might be the odd one, or the feature might be optional
        held = sum(spec.tensor in e for e in examples)
        raise InputError(
            f"{path}: input.tensor: the first record has no feature {spec.tensor!r} ({held} "
            f"of the first {len(examples)} records have it, as {kind} of "
            f"{found.dtype}{_shape_words(found.shape)}): is it optional? To read the records "
            f"that have it (the others are then invalid), set input.dtype: {found.dtype} and "
            f"input.shape: {list(found.shape or [])}")
    return found


def _shape_words(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else f" of shape {list(shape)}"


def _check_list(path: str, spec: TensorSpec, kind: str, n: int) -> None:
    problem = list_problem(spec, kind)
    if problem:
        raise InputError(f"{path}: {problem} (the first record holding it has {n} values)")
    if spec.shape is not None and math.prod(spec.shape) != n:
        raise InputError(f"{path}: input.shape: feature {spec.tensor!r} has {n} values in the "
                         f"first record holding it, not {math.prod(spec.shape)} = "
                         f"{list(spec.shape)}: fix input.shape")


def _one_size(path: str, spec: TensorSpec, kind: str,
              examples: list[dict[str, Any]]) -> tuple[int, ...] | None:
    """The per-record shape of a flat list feature without ``input.shape``: the one size
    the file's first records hold (None for sequences of any length, jaccard's); several
    sizes are refused, quoted, as for a Parquet list column (``pipeline.inputs``)."""
    if spec.ragged:
        return None
    sizes = list_sizes(examples, spec.tensor, kind)
    if len(sizes) == 1:
        return (next(iter(sizes)),)
    raise no_fixed_size(path, f"feature {spec.tensor!r} is {_a(kind)}",
                        "records holding it", sizes, kind == "int64_list")


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _check_serialized(path: str, spec: TensorSpec, values: Any) -> tuple[str, tuple[int, ...]]:
    name = spec.tensor
    if len(values) != 1:
        raise InputError(f"{path}: input.tensor: feature {name!r} is a bytes_list of "
                         f"{len(values)} values, not one tf.io.serialize_tensor value: name a "
                         "feature holding a serialized tensor (or a float_list/int64_list)")
    try:
        _, dtype, shape = tensor_header(values[0])
    except BadExample as e:
        from transforms.images import sniff

        kind = sniff(values[0])
        if kind is not None:  # encoded images (image/encoded): decode them on the workers
            raise InputError(f"{path}: input.decode: feature {name!r} holds {kind} image "
                             "bytes, not a serialized tensor: set input.decode: image (or "
                             "bytes to compare the files as stored)") from None
        if utf8_text(values[0]) is not None:  # a text, not a tensor's bytes
            fix = (JACCARD_TEXT_FIX if spec.ragged
                   else "to read its texts set input.decode: text")
            raise InputError(f"{path}: input.tensor: feature {name!r} holds UTF-8 text, not "
                             f"a serialized tensor: {fix}") from None
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
                               [unreadable_file(unit.path, f"cannot open file: {e}")])
        return
    layout = FeatureLayout(dtype=None if spec.dtype is None else dtype_named(spec.dtype),
                     shape=None if spec.shape is None else tuple(spec.shape))
    with f:
        items = islice(read_frames(f, spec.compression), unit.start, unit.stop)
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
            wbits = ZLIB_WBITS.get(compression)
            z = None if wbits is None else zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION,
                                                            zlib.DEFLATED, wbits)
            for position, item in enumerate(read_frames(f, compression)):
                if isinstance(item, bytes) and position not in dropped:
                    framed = frame_record(item)
                    out.write(framed if z is None else z.compress(framed))
                    written += 1
            if z is not None:
                out.write(z.flush())
    return written


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
