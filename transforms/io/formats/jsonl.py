"""JSON lines input: one JSON object per line (``.jsonl``, ``.ndjson``), as is, gzip, bz2
or zstd compressed; one unit per file.

Why a format of its own: most text corpora and the outputs of text pipelines (C4, The
Pile, RedPajama, Dolma, datatrove, text-dedup) are JSON lines, and a copy as Parquet
first doubles a corpus on disk and loses the line layout users keep.

A record is a non-blank line; its position is its ordinal among the file's non-blank
lines (a blank line is no record, and the clean copy keeps it). Lines are parsed by
pyarrow's JSON reader a block at a time, reading only the fields the job names (tensor,
id, keep) with the types the file's first lines hold, so one JSON value per field
becomes one Arrow column and the Parquet readers' table code turns them into chunks or
values (``parquet.table_chunks``, ``encoded_parquet.table_values``). A block that fails
to parse is halved until each bad line stands alone: a bad line (not JSON, another type
in a field, two objects on a line) is one invalid record with its reason, and its
neighbours are read. A stream that cannot be decompressed past some point ends there:
one invalid record stands for the rest. The clean copy is the kept lines, byte for
byte, compressed as the input was. Files have no index of their lines, so a file is
not split: shard large files (datasets usually are).
"""

from __future__ import annotations

import bz2
import functools
import gzip
import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from itertools import chain
from typing import BinaryIO, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from transforms.io import fs
from transforms.io.formats.base import (
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    default_id,
    error_line,
    no_fixed_size,
    read_columns,
    rows_by_reading,
    unreadable_file,
)
from transforms.io.formats.parquet import check_schema, pieces_reader

# A compressed file's first bytes, and the codec that reads it.
MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\x28\xb5\x2f\xfd", "zstd"))
BLOCK_BYTES = 4 << 20  # decompressed bytes read at once
CHECK_LINES = 1000  # check() takes the fields' types from this many first lines at most
CHECK_BYTES = 1 << 20  # or from the first lines holding this many bytes
HEAD_BLOCK_BYTES = 256 << 10  # ... read in blocks of this many bytes
GZIP_LEVEL = 6  # the clean copy's (gzip's own default)


def codec_of(head: bytes) -> str | None:
    """The compression a file's first bytes show (None: plain text)."""
    return next((codec for magic, codec in MAGIC if head.startswith(magic)), None)


def head_text(head: bytes, path: str | None = None) -> bytes | None:
    """A file's first bytes decompressed as far as they go (None: not decompressible). A
    zstd or bz2 block is decoded whole, so its head alone may not be: then, given
    ``path``, the file's first decompressed bytes."""
    codec = codec_of(head)
    try:
        if codec == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1 << 16)
        if codec == "bz2" and path is None:
            return bz2.BZ2Decompressor().decompress(head, 1 << 16)
        if codec in ("zstd", "bz2") and path is not None:
            with opened(path) as (stream, _):
                return stream.read(1 << 16)
        if codec == "zstd":
            return pa.CompressedInputStream(pa.BufferReader(head), "zstd").read(1 << 16)
    except (zlib.error, OSError, EOFError, pa.ArrowException):
        return None
    return head


def shows_jsonl(head: bytes, path: str | None = None) -> bool:
    """Whether ``head`` (a file's first bytes) begins a JSON lines file: its first
    non-blank character, after decompression, opens an object (or it holds no line)."""
    text = head_text(head, path)
    return text is not None and text.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] in (b"{", b"")


@contextmanager
def opened(path: str, ranged: bool = False) -> Iterator[tuple[BinaryIO, str | None]]:
    """(the file's decompressed bytes as a stream, its codec). ``ranged``: on an object
    store each read fetches what it asks for (``fs.open_ranged``), not Beam's 16 MB
    read-ahead: for the first lines of many files."""
    with (fs.open_ranged if ranged else fs.open_read)(path) as raw:
        codec = codec_of(raw.read(4))
        raw.seek(0)
        if codec == "gzip":  # concatenated members too (bgzip, appended shards)
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
        elif codec == "bz2":
            stream = bz2.BZ2File(raw, mode="rb")
        elif codec == "zstd":
            stream = pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")
        else:
            stream = raw
        with stream:
            yield stream, codec


def lines(path: str, head: bool = False) -> Iterator[tuple[bytes, bool] | str]:
    """Every line of the file in order (blank ones too), without its ``\\n``, and whether
    it had one (only the last may not); then a reason, once, where the file cannot be
    read on. Raises OSError when it cannot be opened at all. ``head``: the caller reads
    the first lines only (read in small ranged blocks)."""
    with opened(path, ranged=head) as (stream, _):
        yield from _split(stream, HEAD_BLOCK_BYTES if head else BLOCK_BYTES)


def _split(stream: BinaryIO, block_bytes: int = BLOCK_BYTES
           ) -> Iterator[tuple[bytes, bool] | str]:
    """``lines`` of an opened, decompressed stream."""
    rest = b""
    try:
        read = getattr(stream, "read1", stream.read)  # what is there: a cut stream
        while block := read(block_bytes):  # yields its lines up to the cut
            got = (rest + block).split(b"\n")
            rest = got.pop()
            for line in got:
                yield line, True
    except (OSError, EOFError, pa.ArrowException, ValueError) as e:
        yield f"the file cannot be read from here on ({error_line(e)})"
        return
    if rest:
        yield rest, False


def _blank(line: bytes) -> bool:
    return not line.strip()


def records(path: str, head: bool = False) -> Iterator[tuple[int, bytes | str]]:
    """(position, line) for each non-blank line in order; (position, reason) once where
    the file cannot be read on (the rest of it stands as one invalid record), or (-1,
    reason) for a file that cannot be opened or read at all (no record). ``head``: as
    for ``lines``."""
    position = 0
    seen = False
    try:
        for item in lines(path, head):
            if isinstance(item, str):
                yield (position if seen else -1), item
                return
            seen = True
            if not _blank(item[0]):
                yield position, item[0]
                position += 1
    except OSError as e:
        yield -1, f"cannot open file: {error_line(e)}"


# ----------------------------------------------------------------------------- parsing


def flat(fields: pa.Schema | pa.StructType, prefix: str = "") -> pa.Schema:
    """The fields of JSON objects nested in objects as dotted names (``meta.text``), as
    ``Table.flatten`` names them: what ``input.tensor`` and the other keys may name."""
    out = []
    for f in fields:
        if pa.types.is_struct(f.type) and f.type.num_fields:
            out += list(flat(f.type, f"{prefix}{f.name}."))
        else:
            out.append(pa.field(prefix + f.name, f.type))
    return pa.schema(out)


def _path(fields: pa.Schema | pa.StructType, name: str) -> list[str]:
    """The keys that lead to dotted ``name`` through nested objects (a key may hold a
    dot itself: ``{"meta.text": ...}`` is one key), or [] if none does."""
    if fields.get_field_index(name) >= 0:
        return [name]
    for f in fields:
        if pa.types.is_struct(f.type) and name.startswith(f.name + "."):
            rest = _path(f.type, name[len(f.name) + 1:])
            if rest:
                return [f.name, *rest]
    return []


def _schema(fields: pa.Schema, spec: TensorSpec) -> pa.Schema:
    """What to parse: the fields the job reads (dotted names inside their objects), with
    the types the first lines hold (``_typed``; a field null in every first line as text,
    or numbers for ``keep``)."""
    nested, fields = fields, _typed(flat(fields), spec)
    tree: dict = {}
    for name in read_columns(spec):
        t = fields.field(name).type if fields.get_field_index(name) >= 0 else pa.null()
        if pa.types.is_null(t):
            t = pa.float64() if name == spec.rank or name in spec.columns else pa.string()
        *outer, leaf = _path(nested, name) or [name]
        node = tree
        for part in outer:
            node = node.setdefault(part, {})
        node[leaf] = t

    def typed(node: dict) -> list[pa.Field]:
        return [pa.field(k, pa.struct(typed(v)) if isinstance(v, dict) else v)
                for k, v in node.items()]

    return pa.schema(typed(tree))


def _leaf_as(t: pa.DataType, leaf: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_leaf_as(t.value_type, leaf))
    return leaf if pa.types.is_integer(t) or pa.types.is_floating(t) else t


def _parse(lines: list[bytes], schema: pa.Schema | None, nested: bool = False) -> pa.Table:
    """The lines as one table (one row each), or raise pa.ArrowInvalid. Objects inside
    objects as dotted columns, or, ``nested``, as structs (what tells a key holding a dot
    from a key inside an object)."""
    data = b"\n".join(lines)
    table = pj.read_json(
        pa.BufferReader(data), read_options=pj.ReadOptions(block_size=len(data) + 1),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=(
            "infer" if schema is None else "ignore")))
    if table.num_rows != len(lines):
        raise pa.ArrowInvalid(f"{table.num_rows} JSON values on {len(lines)} line(s)")
    while not nested and any(pa.types.is_struct(t) for t in table.schema.types):
        table = table.flatten()
    return table


def _kind(value: object) -> str:
    return ("null" if value is None else "true/false" if isinstance(value, bool) else
            "a number" if isinstance(value, int | float) else "a string" if isinstance(
                value, str) else "a list" if isinstance(value, list) else "an object")


def _why(line: bytes, error: Exception, schema: pa.Schema) -> str:
    """Why one line is not a record of ``schema``'s fields, in words."""
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"not a JSON line ({error_line(e)})"
    if not isinstance(value, dict):
        return f"the line is {_kind(value)}, not a JSON object"
    for f in schema:
        got = value.get(f.name)
        if got is not None and (pa.types.is_string(f.type) and not isinstance(got, str) or
                                pa.types.is_list(f.type) and not isinstance(got, list)):
            return f"field {f.name!r} is {_kind(got)}, not {_words(f.type)} as in the first lines"
    return f"field values unlike the first lines' ({_words_all(schema)}): {error}"


def _words(t: pa.DataType) -> str:
    if pa.types.is_string(t):
        return "a string"
    if pa.types.is_list(t):
        return f"a list of {_words(t.value_type).removeprefix('a ')}s"
    return "an integer" if pa.types.is_integer(t) else "a number"


def _words_all(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {_words(f.type)}" for f in schema)


def _parsed(lines: list[bytes], first: int, schema: pa.Schema, dialect: Dialect | None = None
            ) -> Iterator[tuple[int, pa.Table | str]]:
    """(first position, table) for runs of lines that parse, (position, reason) for each
    line that does not, in order: a failed block is halved until its bad lines stand
    alone, so a bad line costs a few parses, not a block."""
    if not lines:
        return
    d = dialect or JSON
    try:
        yield first, d.parse(lines, schema)
        return
    except pa.ArrowInvalid as e:
        if len(lines) == 1:
            yield first, d.why(lines[0], e, schema)
            return
    half = len(lines) // 2
    yield from _parsed(lines[:half], first, schema, d)
    yield from _parsed(lines[half:], first + half, schema, d)


def _runs(items: Iterator[tuple[int, pa.Table | str]]) -> Iterator[tuple[int, pa.Table | str]]:
    """Consecutive tables joined into one, reasons passed through."""
    held: list[pa.Table] = []
    start = 0
    for first, got in items:
        if isinstance(got, pa.Table):
            if not held:
                start = first
            held.append(got)
            continue
        if held:
            yield start, pa.concat_tables(held)
            held = []
        yield first, got
    if held:
        yield start, pa.concat_tables(held)


Sample = tuple[pa.Schema, list[bytes]] | None


def sample(path: str) -> Sample:
    """(the fields' types in the file's first lines, objects inside objects as structs
    (``flat`` names their fields), those lines) or None when the file
    holds no line (or none that parses) near its start: ``read`` reports it. The checks
    before any work ask it of each file three or four times (types, first value, ids,
    sequences): a file's answer is kept while its size and time stay (on an object
    store a metadata request each time, not a read of its first megabyte)."""
    return kept_sample(path, _sample)


def kept_sample(path: str, make: Callable[[str], Sample]) -> Sample:
    """``make(path)``, kept while the file's size and time stay."""
    try:
        if fs.is_local(path):
            st = os.stat(path)
            return _kept_sample(path, st.st_size, st.st_mtime_ns, make)
        m = fs.beam_filesystems().get_filesystem(path).metadata(path)
        return _kept_sample(path, m.size_in_bytes, m.last_updated_in_seconds, make)
    except OSError:  # (Beam's BeamIOError is one): read reports it
        return make(path)


@functools.lru_cache(maxsize=16)
def _kept_sample(path: str, size: int, mtime: float, make: Callable[[str], Sample]) -> Sample:
    return make(path)


def _sample(path: str) -> tuple[pa.Schema, list[bytes]] | None:
    lines: list[bytes] = []
    size = 0
    for _, line in records(path, head=True):
        if isinstance(line, str):
            break
        lines.append(line)
        size += len(line)
        if len(lines) >= CHECK_LINES or size >= CHECK_BYTES:
            break
    if not lines:
        return None
    try:
        return _parse(lines, None, nested=True).schema, lines
    except pa.ArrowInvalid:  # a bad or odd line among them: the type most lines hold
        held = held_types(lines, lambda one: _parse(one, None, nested=True).schema)
        return (pa.schema(list(held.items())), lines) if held else None


def held_types(lines: list[bytes], schema_of: Callable[[list[bytes]], pa.Schema]
               ) -> dict[str, pa.DataType]:
    """{field: the type most of ``lines`` hold}, each line parsed alone (``schema_of``;
    a line that does not parse counts for none, a null for no type): the first lines'
    types where a bad or odd line among them fails the parse of all."""
    held: dict[str, Counter[pa.DataType]] = {}
    for line in lines:
        try:
            for f in schema_of([line]):
                held.setdefault(f.name, Counter())[f.type] += not pa.types.is_null(f.type)
        except pa.ArrowInvalid:
            continue
    return {name: types.most_common(1)[0][0] for name, types in held.items()}


class Bad(str):
    """A line a dialect's ``records`` knows is no record before parsing it, and why."""


class Dialect(NamedTuple):
    """What tells one line-per-record format from another (JSON lines, CSV): the first
    lines' fields (``sample``), the fields to parse (``schema``), the records' lines
    (``records``: lines, a ``Bad`` reason for a line that is no record, or a reason
    that ends the file), a block's table (``parse``) and a bad line's reason (``why``)."""

    sample: Callable[[str], Sample]
    schema: Callable[[pa.Schema, TensorSpec], pa.Schema]
    records: Callable[[str], Iterator[tuple[int, bytes | str]]]
    parse: Callable[[list[bytes], pa.Schema], pa.Table]
    why: Callable[[bytes, Exception, pa.Schema], str]


def pieces(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int | None,
           dialect: Dialect | None = None) -> Iterator[tuple[int, pa.Table] | InvalidRecord]:
    """The unit's records as (first position, table of consecutive records) and an
    InvalidRecord for each bad line (or the unreadable rest, or the whole file), in
    order; blocks of at most ``rows`` lines and ``max_bytes`` of them."""
    d = dialect or JSON
    found = d.sample(unit.path)
    schema = d.schema(found[0] if found else pa.schema([]), spec)
    block: list[bytes] = []
    size = first = 0

    def parsed() -> Iterator[tuple[int, pa.Table] | InvalidRecord]:
        for at, got in _runs(_parsed(block, first, schema, d)):
            yield (at, got) if isinstance(got, pa.Table) else InvalidRecord(
                at, default_id(unit.path, at), got)

    for position, line in d.records(unit.path):
        if isinstance(line, Bad):
            yield from parsed()
            block.clear()
            size = 0
            yield InvalidRecord(position, default_id(unit.path, position), str(line))
            continue
        if isinstance(line, str):
            yield from parsed()
            block.clear()
            yield (unreadable_file(unit.path, line) if position < 0 else
                   InvalidRecord(position, default_id(unit.path, position), line))
            return
        if not block:
            first = position
        block.append(line)
        size += len(line)
        if len(block) >= rows or (max_bytes and size >= max_bytes):
            yield from parsed()
            block.clear()
            size = 0
    yield from parsed()


JSON = Dialect(sample, _schema, records, _parse, _why)


# ---------------------------------------------------------------------------- the format


def check(path: str, spec: TensorSpec) -> TensorSpec:
    """The spec with the dtype and shape the file's first lines hold (a list field of
    one length: that length; of several: refused unless jaccard reads them as
    sequences), or InputError naming the field and the fix."""
    found = sample(path)
    if found is None:  # no line: it tells nothing the config does not (``first_known``)
        return spec if spec.shape is not None or spec.ragged else replace(spec, dtype=None)
    fields, lines = found
    fields = _typed(flat(fields), spec)
    with in_fields():
        resolved = check_schema(path, fields, spec)
    if resolved.shape is not None or spec.ragged:
        return resolved
    return replace(resolved, shape=_one_size(path, spec, lines, fields))


@contextmanager
def in_fields() -> Iterator[None]:
    """The Parquet checks' errors in a JSON line's words: a field, not a column."""
    try:
        yield
    except InputError as e:
        raise InputError(re.sub(r"\bcolumn(s?)\b", r"field\1", str(e)).replace(
            "the file has fields", "its lines have fields")) from None


def _typed(fields: pa.Schema, spec: TensorSpec) -> pa.Schema:
    """``fields`` with the tensor's numbers as ``input.dtype`` (JSON numbers have no
    width: a float list reads as float32 when the config says so), and a feature column
    with no value in the first lines as numbers."""
    fields = pa.schema([f.with_type(pa.float64()) if pa.types.is_null(f.type) and f.name in
                        spec.columns else f for f in fields])
    at = fields.get_field_index(spec.tensor)
    if at < 0 or spec.dtype is None:
        return fields
    try:
        leaf = pa.from_numpy_dtype(np.dtype(spec.dtype))
    except (TypeError, pa.ArrowNotImplementedError):  # bfloat16: read as JSON gave it
        return fields
    return fields.set(at, pa.field(spec.tensor, _leaf_as(fields.field(at).type, leaf)))


def _one_size(path: str, spec: TensorSpec, lines: list[bytes], fields: pa.Schema
              ) -> tuple[int, ...] | None:
    """The one length of a flat list field in the first lines (its shape), else refused,
    quoting the lengths (as for a TFRecord list feature)."""
    t = fields.field(spec.tensor).type
    if not pa.types.is_list(t) or pa.types.is_list(t.value_type):
        return None
    schema = _schema(fields, spec)
    sizes: Counter[int] = Counter()
    for _, got in _parsed(lines, 0, schema):
        if isinstance(got, pa.Table):
            col = got.column(spec.tensor).combine_chunks()
            sizes.update(n for n in col.value_lengths().to_pylist() if n is not None)
    if len(sizes) <= 1:
        return (next(iter(sizes)),) if sizes else None
    raise no_fixed_size(path, f"field {spec.tensor!r} is a list", "lines holding it",
                        sizes, pa.types.is_integer(t.value_type))


def _first_column(path: str, name: str) -> pa.Array | None:
    """The field's values in the file's first lines (None: no such field, or a line
    among them that does not parse: the job reports it)."""
    found = sample(path)
    if found is None or flat(found[0]).get_field_index(name) < 0:
        return None
    try:
        return _parse(found[1], _schema(found[0], TensorSpec(name))).column(
            name).combine_chunks()
    except pa.ArrowInvalid:
        return None


def first_values(path: str, name: str) -> list:
    """The field's values in the file's first lines as strings (ids); [] where there are
    none to tell."""
    col = _first_column(path, name)
    try:
        return [] if col is None else col.cast(pa.string()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # not ids: the check says so
        return []


def int_sequences(path: str, tensor: str) -> bool:
    """Whether the field holds integer lists of several lengths in the first lines (token
    ids: exact dedup reads them as sequences)."""
    col = _first_column(path, tensor)
    return col is not None and pa.types.is_list(col.type) and pa.types.is_integer(
        col.type.value_type) and len(set(col.value_lengths().to_pylist()) - {None}) > 1


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """One unit per file: lines have no index, so a file cannot be split."""
    return [Unit(file_index, path, 0, None)]


read = pieces_reader(pieces)


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """Copy the lines of the records not in ``drop`` (and blank lines) byte for byte,
    compressed as ``src`` is; what cannot be read is not copied, and a file that cannot
    be read at all gives no copy."""
    dropped = set(np.asarray(drop, np.int64).tolist())
    with ExitStack() as stack:
        try:  # opened once: its codec is the copy's
            stream, codec = stack.enter_context(opened(src))
            items = _split(stream)
            head = next(items, None)
        except OSError:
            return 0
        if isinstance(head, str):
            return 0
        written = position = size = 0
        with fs.local_file_for(dst) as local, _compressed(local, codec) as out:
            held: list[bytes] = []  # written a block at a time: a call per line cost 2-5 us
            for item in chain([] if head is None else [head], items):
                if isinstance(item, str):
                    break
                line, ended = item
                if not _blank(line):
                    position += 1
                    if position - 1 in dropped:
                        continue
                    written += 1
                held.append(line + b"\n" if ended else line)
                size += len(line)
                if size >= BLOCK_BYTES:
                    out.write(b"".join(held))
                    held, size = [], 0
            out.write(b"".join(held))
    return written


@contextmanager
def _compressed(path: str, codec: str | None) -> Iterator[BinaryIO]:
    if codec == "gzip":  # no name or time in the header: the same bytes on every run
        with open(path, "wb") as raw, gzip.GzipFile(
                filename="", mode="wb", compresslevel=GZIP_LEVEL, fileobj=raw, mtime=0) as out:
            yield out
    elif codec == "bz2":
        with bz2.open(path, "wb") as out:
            yield out
    elif codec == "zstd":
        with pa.CompressedOutputStream(path, "zstd") as out:
            yield out
    else:
        with open(path, "wb", buffering=1 << 20) as out:
            yield out


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    return rows_by_reading(read, path, spec, positions)
