"""The input and reference files: which they are, what format their bytes show, and
what they hold (schema, first record, id column), before any work.

Why apart from the other checks: these are the checks that open files (remote ones in
parallel, bounded by ``transforms.io.remote``); the capacity plan reads the same facts.
"""

from __future__ import annotations

import fnmatch
import importlib
import math
import os
import posixpath
from collections import Counter
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import DedupeConfig
from pipeline.config.sections import InputConfig
from pipeline.job import References
from pipeline.steps.ids import repeated_line
from transforms.images import sniff as image_kind
from transforms.io import fs
from transforms.io.formats import get_format
from transforms.io.formats.arrow import kind_of
from transforms.io.formats.base import (
    InputError,
    TensorSpec,
    arrow_ids,
    error_line,
    listed_names,
    sizes_spread,
    utf8_text,
)
from transforms.io.formats.columns import is_pattern
from transforms.io.formats.jsonl import codec_of, head_text, shows_jsonl
from transforms.io.formats.parquet import row_shapes
from transforms.io.formats.tfrecord_frames import record_start, shows_tfrecord
from transforms.io.remote import bounded, each_bounded

HEAD_BYTES = 4096  # read from each input file: magic numbers, a TFRecord header
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # at 0, or 512, 1024, 2048 after a user block
HDF5_BLOCKS = 1 << 20  # user blocks (powers of 2) this large at most are looked past
PARQUET_MAGIC = b"PAR1"
PARQUET_ENCRYPTED = b"PARE"  # a Parquet file with an encrypted footer
NPY_MAGIC = b"\x93NUMPY"
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
_FORMAT_NAMES = {"parquet": "Parquet", "tfrecord": "TFRecord", "hdf5": "HDF5",
                 "jsonl": "JSON lines", "arrow": "Arrow IPC", "csv": "CSV",
                 "npy": "NumPy .npy", "npz": "NumPy .npz", "megatron": "Megatron .idx"}
# What a file that is none of the formats is, for the one line that refuses it.
_OTHER_KINDS = ((b"\xff\xff\xff\xff", "binary data"),
                (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"),
                (b"GIF8", "a GIF image"), (b"PK\x03\x04", "a ZIP archive"),
                (b"\x1f\x8b", "a gzip file that holds no TFRecord"),
                (b"\x28\xb5\x2f\xfd", "a zstd-compressed file"), (b"%PDF", "a PDF document"))


class Sniffed(NamedTuple):
    """The format a file's first bytes show, and the evidence in words."""

    format: str
    evidence: str
    compression: str | None = None  # TFRecord: none | gzip | zlib


def sniff(head: bytes) -> Sniffed | None:
    """Which supported format ``head`` (a file's first bytes) is, or None (empty, damaged
    at its start, or something else: ``_shows_format`` tells which)."""
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
    if head[:6] == NPY_MAGIC:
        return Sniffed("npy", "it starts with \\x93NUMPY, as np.save writes")
    if head[:4] == b"PK\x03\x04" and _zip_first(head).endswith(b".npy"):
        return Sniffed("npz", "it is a ZIP archive of .npy files, as np.savez writes")
    if head[:9] == MEGATRON_MAGIC:
        return Sniffed("megatron", "it starts with MMIDIDX, as a Megatron dataset's .idx does")
    if head[:4] == PARQUET_ENCRYPTED:
        return Sniffed("parquet", "it starts with PARE, an encrypted Parquet footer's magic")
    arrow = kind_of(head)
    if arrow is not None:
        return Sniffed("arrow", "it starts with ARROW1" if arrow == "file" else
                       "it starts as an Arrow IPC stream (Hugging Face save_to_disk) does")
    if head and head_text(head) and shows_jsonl(head):  # (a bz2 head alone shows no text)
        codec = codec_of(head)
        return Sniffed("jsonl", f"its first line{f' after {codec} decompression' if codec else ''}"
                       " is a JSON object")
    return None


def _hdf5_further(path: str) -> bool:
    """Whether the HDF5 signature lies past HEAD_BYTES, after a user block of 4 KiB to
    HDF5_BLOCKS (powers of 2): an h5py file made with a large ``userblock_size``."""
    with fs.open_ranged(path) as f:
        at = HEAD_BYTES
        while at <= HDF5_BLOCKS:
            f.seek(at)
            got = f.read(len(HDF5_SIGNATURE))
            if got == HDF5_SIGNATURE:
                return True
            if len(got) < len(HDF5_SIGNATURE):  # past the end
                return False
            at *= 2
    return False


def _pickled(head: bytes) -> str | None:
    """What pickles the values, in words, if ``head`` begins a pickle or a ``torch.save``
    file (a ZIP whose first entry is ``<name>/data.pkl``)."""
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle (pickle.dump, joblib.dump)"
    if head[:4] == b"PK\x03\x04" and _zip_first(head).endswith(b"/data.pkl"):
        return "a PyTorch torch.save file (a ZIP archive holding a pickle)"
    return None


def _zip_first(head: bytes) -> bytes:
    """The name of a ZIP archive's first entry, from its first local header."""
    return head[30:30 + int.from_bytes(head[26:28], "little")] if len(head) >= 30 else b""


def _what_it_is(head: bytes) -> str:
    """What a file's first bytes look like, in words, when they are no supported format."""
    if not head:
        return "it is empty (0 bytes)"
    pickled = _pickled(head)
    if pickled is not None:
        return f"it is {pickled}"
    kind = next((what for magic, what in _OTHER_KINDS if head.startswith(magic)), None)
    if kind is not None:
        return f"it is {kind}"
    text = utf8_text(head, cut_ok=True)
    if text is not None:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"it is text: {first!r} ..."
    return f"its first bytes are {head[:8].hex(' ')}"


_NEEDS = {"parquet": "a Parquet file starts with PAR1",
          "hdf5": "an HDF5 file has its signature at byte 0, 512, 1024, 2048 or later "
                  "powers of 2",
          "tfrecord": "a TFRecord file starts with a record's length and its CRC (also "
                      "after gzip or zlib decompression), or is empty",
          "jsonl": "a JSON lines file's first line is a JSON object, {...} (also after gzip, "
                   "bz2 or zstd compression), or it is empty",
          "arrow": "an Arrow IPC file starts with ARROW1, a stream with ff ff ff ff",
          "csv": "a CSV file is text named .csv or .tsv (also .gz, .bz2 or .zst), its "
                 "first line the header",
          "npy": "a .npy file starts with \\x93NUMPY",
          "npz": "an .npz file is a ZIP archive of .npy files",
          "megatron": "a Megatron dataset is named by its .idx files (each beside its .bin), "
                      "which start with MMIDIDX"}


def _shows_format(path: str, head: bytes, fmt: str) -> bool:
    """Whether ``head`` can begin a file of ``fmt`` (sniff found no other format): a
    damaged file of the right format is the reader's, which reports it with its reason."""
    if fmt == "tfrecord":
        return shows_tfrecord(head)
    if fmt == "hdf5" and len(head) == HEAD_BYTES:
        return _hdf5_further(path)
    if fmt == "csv":  # UTF-8 text (a cell may hold any character but NUL) by its name
        return _table_kind(path) == "CSV" and (text := head_text(head, path)) is not None \
            and b"\0" not in text and _utf8(text)
    return fmt == "jsonl" and shows_jsonl(head, path)


def _utf8(head: bytes) -> bool:
    """Whether a file's first bytes are UTF-8 (the last character may be cut off)."""
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3
    return True


def _head(path: str, key: str) -> bytes:
    try:
        with fs.open_ranged(path) as f:  # on gs:// a plain read would fetch 16 MB per file
            return f.read(HEAD_BYTES)
    except PermissionError as e:  # a traceback from the checks, before any work
        raise InputError(f"{key}: {path} cannot be read ({e.strerror or e}): give this "
                         "user read access, or leave the file out of the glob") from None


def _check_sniffed(files: list[str], found: list[Sniffed | None], source: InputConfig,
                   key: str, unknown: list[tuple[str, bytes]]) -> None:
    """Refuse files whose bytes show another format than ``input.format`` (read as that
    format, every record would be "invalid" and the clean output empty), files whose
    bytes show no supported format (``unknown``: a README, a CSV or an image in the
    glob; an empty Parquet or HDF5 file), or another TFRecord compression than a fixed
    ``input.compression``."""
    section = key.partition(".")[0]
    wrong = [(f, s) for f, s in zip(files, found, strict=True)
             if s is not None and s.format != source.format]
    saved = [f for f, _ in wrong if posixpath.basename(f) in _SAVED_META]
    if saved and len(saved) == len(wrong):  # beside a dataset's .arrow files
        raise InputError(f"{key}: {saved[0]} is a Hugging Face datasets metadata file "
                         f"(save_to_disk writes {', '.join(_SAVED_META[:2])} beside the data), "
                         f"not data: narrow {key} to the .arrow files, e.g. "
                         f"'{posixpath.join(posixpath.dirname(saved[0]), '*.arrow')}'")
    if wrong:
        path, s = wrong[0]
        many = f" ({len(wrong)} of {len(files)} files)" if len(files) > 1 else ""
        name = _FORMAT_NAMES[s.format]
        raise InputError(f"{section}.format: {path} looks like {'an' if name[0] in 'AH' else 'a'}"
                         f" {name} "
                         f"file ({s.evidence}), not {source.format}{many}: set "
                         f"{section}.format: {s.format}")
    if unknown:
        raise InputError(_not_the_format(files, unknown, source.format, key, source.path))
    fixed = source.compression
    for path, s in zip(files, found, strict=True):
        if s is not None and s.compression not in (None, fixed) and fixed != "auto":
            raise InputError(f"{section}.compression: {path} is {s.compression}-compressed "
                             f"TFRecord, not {fixed}: set {section}.compression: auto")


def _not_the_format(files: list[str], unknown: list[tuple[str, bytes]], fmt: str,
                    key: str, pattern: str) -> str:
    """The one line for files that are not of ``fmt`` at all: each would be read as one
    unreadable file, or an empty one as no file (the first file speaks for the input)."""
    name = _FORMAT_NAMES[fmt]
    glob = GLOBS.get(fmt, "*")
    markers = [path for path, _ in unknown if _is_marker(path)]
    if len(markers) == len(unknown):  # what Spark/Hadoop write beside the part files
        what = (f"{markers[0]} is a Spark/Hadoop job marker or checksum file" if
                len(markers) == 1 else f"{len(markers)} of {len(files)} files are Spark/"
                f"Hadoop job markers or checksum files, e.g. {markers[0]}")
        return (f"{key}: {what}, not data: narrow {key} to the {name} files, e.g. "
                f"'{posixpath.join(posixpath.dirname(markers[0]), glob)}'")
    path, head = next((u for u in unknown if not _is_marker(u[0])), unknown[0])
    what = (f"{path} is not a {name} file" if len(unknown) == 1 else
            f"{len(unknown)} of {len(files)} files are not {name} files, e.g. {path}")
    it = "it" if len(unknown) == 1 else "them"
    table = _table_kind(path)
    if not head:
        fix = (f"remove {it} or write {it} again ({name} writers never write 0 bytes, even "
               "for no records: an interrupted write or copy?)")
    elif table and len(unknown) == len(files):  # the user's data, in another format
        fix = f"{table} files are read with {key.partition('.')[0]}.format: csv"
    elif len(unknown) == len(files) and all(image_kind(h) for _, h in unknown):
        fix = _image_index(pattern, key.partition(".")[0])
    elif (text := head_text(head)) is not None and text.lstrip()[:1] == b"[" and len(
            unknown) == len(files) and "://" not in path:  # JSON as one array of objects
        base = posixpath.basename(path)
        fix = (f"{'it holds' if len(unknown) == 1 else 'they hold'} one JSON array, not JSON "
               f"lines: write each as one object per line first, e.g. python -c \"import json; "
               f"open('{_stem(base)}.jsonl', 'w').writelines(json.dumps(r) + '\\n' for r in "
               f"json.load(open('{base}')))\", and set {key} to the .jsonl files and "
               f"{key.partition('.')[0]}.format: jsonl")
    elif all(_pickled(h) for _, h in unknown):
        fix = ("this job never unpickles input (a pickle runs code as it loads): save the "
               "tensors as arrays, e.g. np.save('x.npy', t.numpy()) and input.format: npy, "
               "or as a Parquet column")
    elif fnmatch.fnmatch(posixpath.basename(path), glob):
        fix = f"remove {it}, or replace {it} with the {name} files meant"
    else:
        fix = (f"remove {it}, or narrow {key} to the {name} files (e.g. "
               f"'{posixpath.join(posixpath.dirname(path), glob)}')")
    return f"{key}: {what} ({_what_it_is(head)}; {_NEEDS[fmt]}): {fix}"


def _image_index(pattern: str, section: str) -> str:
    """The way in for a folder of image files: a Parquet index of their paths, read as a
    Hugging Face ``Image()`` column (a row with only a path is read from that path)."""
    where = (f"write a Parquet index of their paths, e.g. python -c \"import glob, os, "
             f"pyarrow as pa, pyarrow.parquet as pq; p = sorted(f for f in glob.glob("
             f"'{pattern}', recursive=True) if os.path.isfile(f)); pq.write_table("
             "pa.table({'id': p, 'image': pa.array([{'bytes': None, 'path': f} for f in p], "
             "pa.struct([('bytes', pa.binary()), ('path', pa.string())]))}), "
             "'images.parquet', row_group_size=2048)\"" if "://" not in pattern else
             "write a Parquet index of their paths (columns id and image, "
             "struct<bytes: binary, path: string> with the bytes null; row groups of "
             "2,048 rows)")
    return (f"image files are read through an index: {where}, and set {section}.format: "
            f"parquet, {section}.path: images.parquet, {section}.tensor: image, "
            f"{section}.id: id, {section}.decode: image (the clean copy is the index of the "
            "images kept)")


_MARKERS = ("_SUCCESS", "_committed_*", "_started_*", "*.crc")
_SAVED_META = ("dataset_info.json", "state.json", "dataset_dict.json")
# Tables that tell their format by their name (text holds no magic number)
_TABLE_NAMES = (("CSV", ("*.csv", "*.tsv")),)


def _table_kind(path: str) -> str | None:
    """A table format told by the file's name (``_TABLE_NAMES``; compressed: .gz, .bz2,
    .zst too)."""
    base = posixpath.basename(path).lower().removesuffix(".gz").removesuffix(
        ".bz2").removesuffix(".zst")
    for kind, globs in _TABLE_NAMES:
        if any(fnmatch.fnmatch(base, g) for g in globs):
            return kind
    return None


def _stem(name: str) -> str:
    for ext in (".gz", ".bz2", ".jsonl", ".ndjson", ".json", ".csv", ".arrow", ".feather"):
        name = name.removesuffix(ext)
    return name


def _is_marker(path: str) -> bool:
    """Whether a file is one a Spark/Hadoop job writes beside its part files: ``_SUCCESS``,
    Databricks' ``_committed_<id>`` / ``_started_<id>``, checksums (``.part-0.crc``)."""
    name = posixpath.basename(path)
    return any(fnmatch.fnmatchcase(name, m) for m in _MARKERS)


def _check_text_ids(path: str, column: str) -> None:
    """A Parquet id column of binary type must hold UTF-8 text: ids are strings in the
    reports and the shuffle, and the reader's cast would fail on the first bad value in
    the middle of the job. Reads the id column only, and only when its type is binary."""
    with fs.open_read(path) as f:
        try:
            pf = pq.ParquetFile(f, page_checksum_verification=True)
        except (OSError, pa.ArrowException):
            return  # unreadable: reported as invalid by the reader
        if pf.schema_arrow.get_field_index(column) < 0:
            return
        kind = pf.schema_arrow.field(column).type
        if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_fixed_size_binary(kind)):
            return
        row = 0
        try:
            for batch in pf.iter_batches(columns=[column]):
                for value in batch.column(0).to_pylist():
                    try:
                        _ = value is None or value.decode("utf-8")
                    except UnicodeDecodeError:
                        raise InputError(
                            f"{path}: input.id: column {column!r} is {kind} and row {row} is "
                            f"not UTF-8 text ({value[:16]!r}): ids must be text; store them as "
                            "strings (e.g. hex), or leave input.id out (ids default to "
                            "<file>:<row>)") from None
                    row += 1
        except (OSError, pa.ArrowException):
            return  # a damaged row group: the reader reports its records as invalid


FIRST_IDS = 1_000  # ids read from the start of each of the first FIRST_ID_FILES files
FIRST_ID_FILES = 8


def check_first_ids(files: list[str], column: str, fmt: str = "parquet") -> None:
    """Ids that repeat among the first records of the first local Parquet, JSON lines,
    Arrow, CSV or .npz files (a row number restarting in every shard, the usual case)
    stop the run before any work; the job checks every record's id too
    (``steps.ids.RepeatedIds``), after the work. Files on an object store are left to the
    job: the checks before any work read their heads and footers only."""
    def first_ids(path: str) -> list:
        if fmt in ("jsonl", "arrow", "csv", "npz"):
            first_values = importlib.import_module(f"transforms.io.formats.{fmt}").first_values
            return first_values(path, column)[:FIRST_IDS]
        with pa.OSFile(path) as f:
            try:
                batch = next(pq.ParquetFile(f).iter_batches(batch_size=FIRST_IDS,
                                                            columns=[column]), None)
            except (OSError, pa.ArrowException, KeyError):  # the reader reports it
                return []
        return [] if batch is None else arrow_ids(batch.column(0)).to_pylist()

    seen: dict[str, str] = {}
    repeats = []
    for path in [f for f in files if fs.is_local(f)][:FIRST_ID_FILES]:
        for row, i in enumerate(first_ids(path)):
            here = f"{path} {'record' if fmt == 'jsonl' else 'row'} {row}"
            if i in seen:
                repeats.append((seen[i], here))
            elif i is not None:  # (a null id: the record is invalid)
                seen[i] = here
    if repeats:
        raise InputError(repeated_line(f"{len(repeats):,} of the first", *repeats[0], column))


def inspect_files(files: list[str], source: InputConfig, spec: TensorSpec, key: str,
                  timeout: float) -> list[TensorSpec]:
    """Each file's first bytes against ``source.format``, then the format's own check
    (schema / first record); remote files in parallel, each bounded by ``timeout``."""
    fmt = get_format(source.format, spec)

    def one(path: str) -> tuple[Sniffed | None, TensorSpec | bytes]:
        head = _head(path, key)
        found = sniff(head)
        if found is not None and found.format != source.format:
            return found, head  # reported for all files at once below
        if found is None and not _shows_format(path, head, source.format):
            return None, head  # likewise
        if source.format == "parquet" and spec.id is not None:
            _check_text_ids(path, spec.id)
        return found, fmt.check(path, spec)

    seen = each_bounded(files, one, key, "reading its first bytes and schema", timeout)
    unknown = [(f, r) for f, (s, r) in zip(files, seen, strict=True)
               if s is None and isinstance(r, bytes)]
    _check_sniffed(files, [s for s, _ in seen], source, key, unknown)
    return [r for _, r in seen]


def expanded_columns(files: list[str], checked: list[TensorSpec], spec: TensorSpec
                     ) -> TensorSpec:
    """``spec`` with a feature table's column globs (``input.tensor: [f*]``) as the files'
    checks expanded them; files whose globs match other columns are refused, naming
    both: their vectors would not be comparable."""
    if not any(is_pattern(c) for c in spec.columns):
        return spec
    found = [(f, c) for f, c in zip(files, checked, strict=True)
             if not any(is_pattern(n) for n in c.columns)]
    if not found:
        return spec
    (first, a), other = found[0], next(((f, c) for f, c in found[1:]
                                        if c.columns != found[0][1].columns), None)
    if other is not None:
        b = other[1].columns
        only_a, only_b = [c for c in a.columns if c not in b], [c for c in b if c not in a.columns]
        raise InputError(
            f"input.tensor: {list(spec.columns)} names other columns in {other[0]} than in "
            f"{first} (only in the first: {listed_names(only_a) or 'none'}; only in the "
            f"other: {listed_names(only_b) or 'none'}; or another order): name the columns "
            "one by one, or point input.path at files of one layout")
    return replace(spec, columns=a.columns, tensor=a.tensor, shape=a.shape)


def columns_note(source: InputConfig, spec: TensorSpec) -> tuple[str, ...]:
    """Which columns the globs of ``input.tensor`` named, printed at the start (and
    summary.json's ``resolved.columns``): what a run compared must not be a guess."""
    if not any(is_pattern(c) for c in source.columns):
        return ()
    return (f"input.tensor: {list(source.columns)} names {len(spec.columns)} columns: "
            f"{listed_names(list(spec.columns))}",)


SIZES_BYTES = 64 << 20  # values read from the first row group to quote its record sizes


def _first_shapes(path: str, source: InputConfig, timeout: float
                  ) -> tuple[int, np.ndarray] | None:
    """(records read, the (n, levels) shapes of the valid ones) of the first row group of
    a Parquet list column of no fixed size, or of an Arrow file's first batches (their
    first SIZES_BYTES of values), or None (fixed size, damaged: the reader reports the
    file)."""
    def shapes(path: str) -> tuple[int, np.ndarray] | None:
        if source.format == "arrow":
            from transforms.io.formats import arrow

            found = arrow.schema(path)
            return None if found is None or found.get_field_index(source.tensor) < 0 else (
                sized(found, arrow.first_batches(path, [source.tensor], SIZES_BYTES)))
        # through Arrow's own file where local, never a Python one (fs.read_parquet: why)
        with pa.OSFile(path) if fs.is_local(path) else fs.open_read(path) as f:
            try:
                pf = pq.ParquetFile(f)
                if pf.metadata.num_row_groups == 0:
                    return None
                return sized(pf.schema_arrow, pf.iter_batches(
                    batch_size=8192, row_groups=[0], columns=[source.tensor],
                    use_threads=False))
            except (OSError, pa.ArrowException):
                return None

    def sized(schema: pa.Schema, batches) -> tuple[int, np.ndarray] | None:
        rows, read, seen, depth = 0, 0, [], 0
        kind = schema.field(source.tensor).type
        while pa.types.is_list(kind) or pa.types.is_large_list(kind):
            kind, depth = kind.value_type, depth + 1
        if not depth:
            return None
        for batch in batches:
            ok, got = row_shapes(batch.column(0), depth)
            seen.append(got[ok])
            rows, read = rows + batch.num_rows, read + batch.nbytes
            if read >= SIZES_BYTES:
                break
        return rows, np.concatenate(seen) if seen else np.empty((0, depth), np.int64)

    return bounded(path, shapes, "input.path", "reading its first row group's record sizes",
                   timeout)


def _most_common(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(the distinct rows, the most common one, its share) of a 2-d array."""
    distinct, times = np.unique(values, axis=0, return_counts=True)
    return distinct, distinct[np.argmax(times)], times.max() / len(values)


def check_one_size(path: str, source: InputConfig, timeout: float) -> None:
    """Near on a Parquet list column of no fixed size (``list<...>``, not
    ``fixed_size_list``) without ``input.shape``: distances compare records of one size,
    so records of several sizes would stop the near stage after the work before it.
    Refused now when the first row group holds records of several sizes, quoting them;
    one size there is taken as the input's."""
    got = _first_shapes(path, source, timeout)
    if got is None:
        return
    sizes, times = np.unique(got[1].prod(axis=1), return_counts=True)
    rows, counts = got[0], Counter(dict(zip(sizes.tolist(), times.tolist(), strict=True)))
    if len(counts) < 2:
        return
    raise InputError(
        f"near: input.tensor: column {source.tensor!r} holds lists of no fixed size, and the "
        f"first {rows:,} records of {path} {sizes_spread(counts)}; "
        "distances compare records of one size: set input.shape to compare the records of "
        "that size (the others are then reported invalid), or add an embed section to "
        "compare embeddings of the records, or set near.metric: jaccard (with "
        "near.threshold, e.g. 0.8) for the similarity of token sequences, or remove near "
        "(exact dedup needs none)")


def check_one_shape(files: list[str], resolved: list[TensorSpec]) -> None:
    """Near over input files whose records hold different shapes (a 16-d and a 32-d
    export of one table): distances compare records of one shape, so the near stage
    would stop after the work before it. Refused now, naming a file of each shape."""
    first: dict[tuple[int, ...], str] = {}
    for path, spec in zip(files, resolved, strict=True):
        if spec.dtype is not None and spec.shape is not None:
            first.setdefault(tuple(spec.shape), path)
    if len(first) < 2:
        return
    (a, path_a), (b, path_b) = list(first.items())[:2]
    more = f" and {len(first) - 2} more" if len(first) > 2 else ""
    raise InputError(
        f"near: the input files hold records of {len(first)} shapes ({path_a}: {list(a)}, "
        f"{path_b}: {list(b)}{more}); distances compare records of one shape: point "
        "input.path at the files of one shape (a run for each), or remove near (exact "
        "dedup needs none)")


def check_shape_seen(path: str, source: InputConfig, timeout: float) -> None:
    """``input.shape`` over a Parquet list column of no fixed size: records of another
    shape are invalid, so a shape that no record of the first row group has (the lists'
    levels swapped, a typo) would make every record invalid after all the work. Refused
    now, quoting the shape the records have."""
    got = _first_shapes(path, source, timeout)
    want = np.asarray(source.shape, np.int64)
    if got is None or not len(got[1]) or got[1].shape[1] != len(want):
        return
    rows, shapes = got
    if (shapes == want).all(axis=1).any():
        return
    _, common, share = _most_common(shapes)
    raise InputError(
        f"input.shape: no record of the first {rows:,} of {path} has shape "
        f"{source.shape} (column {source.tensor!r}; the most common shape there is "
        f"{common.tolist()}, {share:.0%} of them): set input.shape: {common.tolist()} or "
        "leave it out")


def first_known(resolved: list[TensorSpec]) -> int:
    """Index of the first file whose check found a record's dtype (0 if none did): an
    empty TFRecord file, or one with nothing readable near its start, tells nothing, and
    its records (none, or bad ones) are left to the reader, so it must not stand for the
    input's dtype and shape (a store or reference set would be refused as not matching)."""
    return next((i for i, r in enumerate(resolved) if r.dtype is not None), 0)


def mixed_dtypes(files: list[str], resolved: list[TensorSpec]) -> tuple[str, ...]:
    """A note where the input files hold tensors of several dtypes (float32 in one,
    float64 in another): dtype is part of a record's identity, so a float64 copy of a
    float32 record is never its exact copy. Not refused: files may hold different data."""
    first: dict[str, str] = {}
    for path, spec in zip(files, resolved, strict=True):
        if spec.dtype is not None and spec.decode is None:
            first.setdefault(spec.dtype, path)
    if len(first) < 2:
        return ()
    where = ", ".join(f"{dtype} in {path}" for dtype, path in list(first.items())[:4])
    return (f"note: the input files hold tensors of {len(first)} dtypes ({where}"
            f"{', ...' if len(first) > 4 else ''}): dtype is part of a record's identity, so "
            "records in files of different dtypes are never exact copies of each other; "
            "cast the files to one dtype to compare them",)


def common_dir(files: list[str]) -> str:
    """The inputs' deepest common directory (output names are relative to it)."""
    if fs.is_local(files[0]):
        return os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    return "/".join(os.path.commonprefix([f.split("/")[:-1] for f in files]))


GLOBS = {"parquet": "*.parquet", "tfrecord": "*.tfrecord*", "hdf5": "*.h5",  # for hints
         "jsonl": "*.jsonl*", "arrow": "*.arrow", "csv": "*.csv*", "npy": "*.npy",
         "npz": "*.npz", "megatron": "*.idx"}


def list_files(pattern: str, key: str, timeout: float, fmt: str = "parquet") -> list[str]:
    """The files ``pattern`` names, sorted. Refused: nothing matches; a directory named
    directly; a glob that matches directories whose files it does not read (a Spark
    ``out.parquet/`` folder under ``*.parquet``: they would be left out without a word);
    a broken symbolic link, named or matched."""
    try:
        found = bounded(pattern, fs.glob_matches, key, "listing the files", timeout)
        if fmt == "megatron" and not found.files and not found.directories \
                and not pattern.endswith((".idx", "/")):  # Megatron names a dataset by prefix
            found = bounded(pattern + ".idx", fs.glob_matches, key, "listing the files",
                            timeout)
    except OSError as e:  # a local directory that cannot be listed
        raise InputError(f"{key}: cannot list {pattern!r}: {error_line(e)}") from None
    files, glob = found.files, GLOBS.get(fmt, "*")
    if found.broken_links:
        link = found.broken_links[0]
        what = (f"{link} is a broken symbolic link" if len(found.broken_links) == 1 else
                f"{len(found.broken_links)} of the paths it matches are broken symbolic "
                f"links, e.g. {link}")
        to = os.readlink(link)
        loop = os.path.lexists(os.path.join(os.path.dirname(link), to))
        raise InputError(f"{key}: {what} (to {to!r}, which "
                         + ("leads back to a link already followed: a loop" if loop else
                            "does not exist") + "): fix or remove the link")
    if found.special:
        more = len(found.special) - 1
        raise InputError(f"{key}: {found.special[0]} is not a file (a FIFO, socket or "
                         f"device){f', nor are {more:,} more' if more else ''}: leave it out "
                         "of the glob")
    if not files and [d.rstrip("/") for d in found.directories] == [pattern.rstrip("/")]:
        base = pattern.rstrip("/")
        raise InputError(f"{key}: {pattern!r} is a directory: name its files with a glob, "
                         f"e.g. '{base}/{glob}' (or '{base}/**/{glob}' to include "
                         "subdirectories)")
    if found.directories:
        first = found.directories[0].rstrip("/")
        many = len(found.directories)
        what = (f"directory {first}/" if many == 1 else
                f"{many} directories, e.g. {first}/,")
        base = posixpath.dirname(pattern.rstrip("/")) or "."
        raise InputError(f"{key}: {pattern!r} matches {what} whose files it does not read "
                         f"(a folder of part files, as Spark writes?): name them with a "
                         f"glob, e.g. '{base}/**/{glob}', or narrow {key} to leave "
                         f"{'it' if many == 1 else 'them'} out")
    if not files:
        where = f" (relative to {os.getcwd()})" if fs.is_local(pattern) else ""
        raise InputError(f"{key}: no files match {pattern!r}{where}: fix the path or glob")
    if fmt == "megatron":  # a .bin beside a matched .idx is that dataset's tokens
        named = {f for f in files if f.endswith(".idx")}
        files = [f for f in files if not (f.endswith(".bin") and f[:-4] + ".idx" in named)]
    return files


CHAR_SET_BYTES = 8  # a char n-gram set holds one 8-byte hash per character of its text


def holds_sequences(path: str, source: InputConfig, timeout: float) -> bool:
    """Whether an HDF5 or TFRecord input holds integer sequences of no fixed length
    (token ids): a 1-d variable-length integer dataset, or an int64_list feature of
    several sizes in the file's first records; a Megatron dataset, always. A Parquet
    list column of them is read by size anyway (``parquet.read``)."""
    def hdf5(path: str) -> bool:
        from transforms.io.formats.hdf5_files import H5_ERRORS, int_sequences, opened_h5

        with opened_h5(path) as f:
            try:
                return not isinstance(f, Exception) and int_sequences(f[source.tensor]) \
                    is not None
            except (*H5_ERRORS, AttributeError):  # no such dataset, or a group: check() says
                return False

    def tfrecord(path: str) -> bool:
        from transforms.io.formats.tfrecord import first_examples
        from transforms.io.formats.tfrecord_parse import list_sizes

        examples = first_examples(path, TensorSpec(source.tensor,
                                                   compression=source.compression))
        return len(list_sizes(examples, source.tensor, "int64_list")) > 1

    def jsonl(path: str) -> bool:
        from transforms.io.formats.jsonl import int_sequences

        return int_sequences(path, source.tensor)

    if source.format == "megatron":  # documents of tokens, always
        return True
    fn = {"hdf5": hdf5, "tfrecord": tfrecord, "jsonl": jsonl}.get(source.format)
    return fn is not None and not source.columns and bounded(
        path, fn, "input.path", "reading its first records", timeout)


def as_sequences(cfg: DedupeConfig, spec: TensorSpec, sequences: bool = False) -> TensorSpec:
    """What the jaccard stage reads. Over numbers, integer sequences of any length
    (``TensorSpec.ragged``), one chunk per read batch, not one per length; also without
    near where ``sequences`` (``holds_sequences``): exact dedup of token ids. With char
    shingles, chunks of 1/CHAR_SET_BYTES of ``tuning.decoded_chunk_bytes`` of text, so
    that a chunk's sets stay within it: a 64 MB chunk's were 512 MB, and its run's peak
    above max(3 GB, 3x the text) on files of one row group."""
    if cfg.near is None and cfg.embed is None and spec.decode is None and sequences \
            and spec.shape is None:
        return replace(spec, ragged=True)
    if cfg.near is None or cfg.near.metric != "jaccard":
        return spec
    if spec.decode is None:
        return replace(spec, ragged=True)
    if cfg.near.shingles is not None and cfg.near.shingles.unit == "char":
        return replace(spec, decode=replace(
            spec.decode, chunk_bytes=max(1, spec.decode.chunk_bytes // CHAR_SET_BYTES)))
    return spec


def _held(spec: TensorSpec) -> str:
    """What a file's records are, in words: ``int32 tensors of shape [8]``, or
    ``sequences of int32`` (token ids of any length)."""
    if spec.ragged:
        return f"sequences of {spec.dtype}"
    return f"{spec.dtype} tensors of shape {list(spec.shape or [])}"


def references(cfg: DedupeConfig, resolved: TensorSpec) -> References | None:
    """Reference files, checked like input files; their records must be comparable with
    the input's (same dtype and size), or no reference record could ever match (what the
    config alone tells, the config's validators check)."""
    if not cfg.reference:
        return None
    src = cfg.reference[0]  # the sets share every key but path (DedupeConfig checks)
    timeout = cfg.tuning.remote_timeout_s
    files = sorted({f for r in cfg.reference
                    for f in list_files(r.path, "reference.path", timeout, r.format)})
    spec = as_sequences(cfg, src.to_spec(None, cfg.tuning.decoded_chunk_bytes),
                        resolved.ragged)
    shapes = set()
    checked = inspect_files(files, src, spec, "reference.path", timeout)
    spec = expanded_columns(files, checked, spec)
    if spec.columns and resolved.columns and spec.columns != resolved.columns and not any(
            is_pattern(c) for c in spec.columns):  # (a vector column's size is checked below)
        raise InputError(f"reference.path: input.tensor: {list(src.columns)} names other "
                         f"columns in the reference files ({listed_names(list(spec.columns))})"
                         f" than in the input ({listed_names(list(resolved.columns))}): their "
                         "values would not compare: name the columns one by one")
    for path, got in zip(files, checked, strict=True):
        if got.dtype is None:  # nothing to compare: an empty file (first_known)
            continue
        shapes.add(got.shape)
        if got.dtype != resolved.dtype or None not in (got.shape, resolved.shape) and \
                _size(got.shape) != _size(resolved.shape):
            raise InputError(f"reference.path: {path} holds {_held(got)}, the input "
                             f"{_held(resolved)}: no record could "
                             "match; use a reference set of the input's dtype and size")
    if None in shapes and resolved.shape is not None and shapes <= {None, resolved.shape}:
        # lists of no fixed size beside a fixed-size input: read as the input's shape (as
        # reference.shape would), its records of other sizes reported invalid
        spec = replace(spec, shape=resolved.shape)
    show = None if src.show is None else show_spec(files[0], src.format, src.show,
                                                   "reference.show", timeout)
    return References(src.format, files, spec, show)


def show_spec(path: str, fmt: str, name: str, key: str, timeout: float) -> TensorSpec:
    """How the report's page reads ``name`` (``input.show``) from files like ``path``:
    numbers as a tensor, texts as texts, encoded images as pictures (their first value
    in ``path`` tells; bytes that are neither are shown as bytes). The column must exist
    (one line naming ``key`` and the columns there are)."""
    from transforms.images import sniff
    from transforms.io.formats.base import Decode
    from transforms.io.formats.encoded import Encoded

    def kind() -> TensorSpec:
        plain = TensorSpec(name)
        try:
            get_format(fmt).check(path, plain)
            return plain
        except InputError as e:
            numbers = e
        try:
            found = Encoded(fmt).values.check(path, replace(plain, decode=Decode("bytes")))
        except InputError:  # neither: the numbers' line names the column's problem
            if "input.shape" in str(numbers):  # a TFRecord list of numbers of several sizes
                raise InputError(f"{path}: {key}: {name!r} holds lists of numbers of several "
                                 "sizes: show a text or image feature, or one of numbers of "
                                 "one size") from None
            raise InputError(str(numbers).replace("input.tensor", key)
                             .replace("input.decode", key)) from None
        value = None if found is None else found[0]
        if value is None or isinstance(value, str):
            return replace(plain, decode=Decode("text"))
        if sniff(bytes(value[:12])) is not None:
            return replace(plain, decode=Decode("image"))
        try:
            bytes(value).decode("utf-8")
            return replace(plain, decode=Decode("text"))
        except UnicodeDecodeError:
            return replace(plain, decode=Decode("bytes"))

    return bounded(path, lambda _: kind(), key, "reading its first values", timeout)


def _size(shape: tuple[int, ...] | None) -> int | None:
    return None if shape is None else math.prod(shape)

