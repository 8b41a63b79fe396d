"""The input and reference files: which they are, what format their bytes show, and
what they hold (schema, first record, id column), before any work.

Why apart from the other checks: these are the checks that open files (remote ones in
parallel, bounded by ``pipeline.remote``); the capacity plan reads the same facts.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import DedupeConfig, InputConfig
from pipeline.job import References
from pipeline.remote import bounded, each_bounded
from transforms import fs
from transforms.formats import get_format
from transforms.formats.base import Decode, InputError, TensorSpec, error_line
from transforms.formats.tfrecord_frames import record_start

HEAD_BYTES = 4096  # read from each input file: magic numbers, a TFRecord header
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # at 0, or 512, 1024, 2048 after a user block
PARQUET_MAGIC = b"PAR1"
_FORMAT_NAMES = {"parquet": "Parquet", "tfrecord": "TFRecord", "hdf5": "HDF5"}


class Sniffed(NamedTuple):
    """The format a file's first bytes show, and the evidence in words."""

    format: str
    evidence: str
    compression: str | None = None  # TFRecord: none | gzip | zlib


def sniff(head: bytes) -> Sniffed | None:
    """Which supported format ``head`` (a file's first bytes) is, or None (empty, damaged,
    or something else: left to the reader, which reports it as invalid)."""
    compression = record_start(head)
    if compression is not None:
        how = "" if compression == "none" else f" after {compression} decompression"
        return Sniffed("tfrecord", f"its first 12 bytes{how} are a TFRecord length and its "
                       "CRC", compression)
    for offset in (0, 512, 1024, 2048):
        if head[offset:offset + len(HDF5_SIGNATURE)] == HDF5_SIGNATURE:
            return Sniffed("hdf5", f"it has the HDF5 signature at byte {offset}")
    if head[:4] == PARQUET_MAGIC:
        return Sniffed("parquet", "it starts with PAR1")
    return None


def _head(path: str) -> bytes:
    with fs.open_read(path) as f:
        return f.read(HEAD_BYTES)


def _check_sniffed(files: list[str], found: list[Sniffed | None], source: InputConfig,
                   key: str) -> None:
    """Refuse files whose bytes show another format than ``input.format`` (read as that
    format, every record would be "invalid" and the clean output empty), or another
    TFRecord compression than a fixed ``input.compression``."""
    section = key.partition(".")[0]
    wrong = [(f, s) for f, s in zip(files, found, strict=True)
             if s is not None and s.format != source.format]
    if wrong:
        path, s = wrong[0]
        many = f" ({len(wrong)} of {len(files)} files)" if len(files) > 1 else ""
        raise InputError(f"{section}.format: {path} looks like a {_FORMAT_NAMES[s.format]} "
                         f"file ({s.evidence}), not {source.format}{many}: set "
                         f"{section}.format: {s.format}")
    fixed = source.compression
    for path, s in zip(files, found, strict=True):
        if s is not None and s.compression not in (None, fixed) and fixed != "auto":
            raise InputError(f"{section}.compression: {path} is {s.compression}-compressed "
                             f"TFRecord, not {fixed}: set {section}.compression: auto")


def _check_text_ids(path: str, column: str) -> None:
    """A Parquet id column of binary type must hold UTF-8 text: ids are strings in the
    reports and the shuffle, and the reader's cast would fail on the first bad value in
    the middle of the job. Reads the id column only, and only when its type is binary."""
    with fs.open_read(path) as f:
        try:
            pf = pq.ParquetFile(f)
        except (OSError, pa.ArrowException):
            return  # unreadable: reported as invalid by the reader
        if pf.schema_arrow.get_field_index(column) < 0:
            return
        kind = pf.schema_arrow.field(column).type
        if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_fixed_size_binary(kind)):
            return
        row = 0
        for batch in pf.iter_batches(columns=[column]):
            for value in batch.column(0).to_pylist():
                try:
                    _ = value is None or value.decode("utf-8")
                except UnicodeDecodeError:
                    raise InputError(
                        f"{path}: input.id: column {column!r} is {kind} and row {row} is not "
                        f"UTF-8 text ({value[:16]!r}): ids must be text; store them as "
                        "strings (e.g. hex), or leave input.id out (ids default to "
                        "<file>:<row>)") from None
                row += 1


def inspect_files(files: list[str], source: InputConfig, spec: TensorSpec, key: str,
                  timeout: float) -> list[TensorSpec]:
    """Each file's first bytes against ``source.format``, then the format's own check
    (schema / first record); remote files in parallel, each bounded by ``timeout``."""
    fmt = get_format(source.format, spec)

    def one(path: str) -> tuple[Sniffed | None, TensorSpec | None]:
        found = sniff(_head(path))
        if found is not None and found.format != source.format:
            return found, None  # reported for all files at once below
        if source.format == "parquet" and spec.id is not None:
            _check_text_ids(path, spec.id)
        return found, fmt.check(path, spec)

    seen = each_bounded(files, one, key, "reading its first bytes and schema", timeout)
    _check_sniffed(files, [s for s, _ in seen], source, key)
    return [r for _, r in seen]


def first_known(resolved: list[TensorSpec]) -> int:
    """Index of the first file whose check found a record's dtype (0 if none did): an
    empty TFRecord file, or one with nothing readable near its start, tells nothing, and
    its records (none, or bad ones) are left to the reader, so it must not stand for the
    input's dtype and shape (a store or reference set would be refused as not matching)."""
    return next((i for i, r in enumerate(resolved) if r.dtype is not None), 0)


def common_dir(files: list[str]) -> str:
    """The inputs' deepest common directory (output names are relative to it)."""
    if fs.is_local(files[0]):
        return os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    return "/".join(os.path.commonprefix([f.split("/")[:-1] for f in files]))


GLOBS = {"parquet": "*.parquet", "tfrecord": "*.tfrecord*", "hdf5": "*.h5"}  # for hints


def list_files(pattern: str, key: str, timeout: float, fmt: str = "parquet") -> list[str]:
    try:
        files = bounded(pattern, fs.glob, key, "listing the files", timeout)
    except OSError as e:  # a local directory that cannot be listed
        raise InputError(f"{key}: cannot list {pattern!r}: {error_line(e)}") from None
    if not files:
        if fs.is_local(pattern) and os.path.isdir(pattern):
            base, glob = pattern.rstrip("/"), GLOBS.get(fmt, "*")
            raise InputError(f"{key}: {pattern!r} is a directory: name its files with a glob, "
                             f"e.g. '{base}/{glob}' (or '{base}/**/{glob}' to include "
                             "subdirectories)")
        where = f" (relative to {os.getcwd()})" if fs.is_local(pattern) else ""
        raise InputError(f"{key}: no files match {pattern!r}{where}: fix the path or glob")
    return files



def tensor_spec(source: InputConfig, rank: str | None, chunk_bytes: int) -> TensorSpec:
    shape = None if source.shape is None else tuple(source.shape)
    decode = None
    if source.decode != "none":
        decode = Decode(source.decode, None if source.resize is None else tuple(source.resize),
                        source.channels, source.max_pixels, chunk_bytes, source.exact_on)
    return TensorSpec(source.tensor, source.id, shape, source.dtype, rank, source.compression,
                      decode)



def references(cfg: DedupeConfig, resolved: TensorSpec) -> References | None:
    """Reference files, checked like input files; their records must be comparable with
    the input's (same dtype and size), or no reference record could ever match."""
    if not cfg.reference:
        return None
    formats = {r.format for r in cfg.reference}
    if len(formats) > 1:
        raise InputError("reference: all reference sets must have one format (got "
                         f"{', '.join(sorted(formats))}): convert them or run them separately")
    src = cfg.reference[0]
    if any(r.model_dump(exclude={"path"}) != src.model_dump(exclude={"path"})
           for r in cfg.reference[1:]):
        raise InputError("reference: reference sets must share tensor/id/shape/dtype keys "
                         "(only path may differ): run sets with other keys separately")
    for key in ("decode", "resize", "channels", "exact_on"):
        if getattr(src, key) != getattr(cfg.input, key):
            raise InputError(f"reference.{key}: {getattr(src, key)!r}, the input's "
                             f"{getattr(cfg.input, key)!r}: records decoded otherwise never "
                             f"match; give reference sets the input's {key}")
    timeout = cfg.tuning.remote_timeout_s
    files = sorted({f for r in cfg.reference
                    for f in list_files(r.path, "reference.path", timeout, r.format)})
    spec = tensor_spec(src, None, cfg.tuning.decoded_chunk_bytes)
    for path, got in zip(files, inspect_files(files, src, spec, "reference.path", timeout),
                         strict=True):
        if got.dtype is None:  # nothing to compare: an empty file (first_known)
            continue
        if got.dtype != resolved.dtype or _size(got.shape) != _size(resolved.shape):
            raise InputError(f"reference.path: {path} holds {got.dtype} tensors of shape "
                             f"{list(got.shape or [])}, the input {resolved.dtype} of shape "
                             f"{list(resolved.shape or [])}: no record could match; use a "
                             "reference set of the input's dtype and size")
    return References(src.format, files, spec)


def _size(shape: tuple[int, ...] | None) -> int | None:
    return None if shape is None else math.prod(shape)

