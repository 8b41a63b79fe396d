"""Megatron indexed datasets (``.bin`` + ``.idx``): token shards as Megatron-LM, NeMo and
GPT-NeoX train from them; each document's tokens are a record.

Why a format of its own: tokenized pretraining data is kept in this layout
(``preprocess_data.py`` writes it), and exact or near-duplicate documents in it are
what dedup removes; detokenizing to text and back is a second copy and a second
tokenizer run. The ``.idx`` holds the token dtype, the length and byte offset of each
sequence, and where each document's sequences end; the ``.bin`` holds the tokens. A
document is its sequences' tokens, in order (GPT data: one sequence per document).

``input.path`` names the ``.idx`` files (or a dataset's prefix, as Megatron's
``--data-path``: ``pipeline.inputs.list_files``); each reads the ``.bin`` beside it. Units are
document ranges; a chunk's index entries and tokens are each one positioned read (a
ranged request on an object store). Ids are ``<idx path>:<document>``. The clean copy
is a ``.idx`` and ``.bin`` pair of the kept documents, every sequence (and a multimodal
index's sequence modes) as it was, which Megatron's ``IndexedDataset`` reads. A ``.bin``
shorter than the index says (an interrupted copy) keeps its whole documents; the
documents it cuts are invalid records. Sequences after the last document's end (a
builder not finalized after ``end_document``) are read as one more document.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from transforms.io import fs
from transforms.io.formats import base
from transforms.io.formats.base import Chunk, InputError, InvalidRecord, TensorSpec, Unit

MAGIC = b"MMIDIDX\x00\x00"
_HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document ends
# Megatron's DType codes (megatron/core/datasets/indexed_dataset.py)
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float32, 8: np.uint16}
_WRITE_STEP_BYTES = 32 << 20  # tokens copied per step of ``write`` (by the average document)


def data_path(idx: str) -> str:
    """The ``.bin`` beside an ``.idx`` (Megatron names a dataset by their common prefix)."""
    return idx[:-4] + ".bin" if idx.endswith(".idx") else idx + ".bin"


class FairseqIndex(ValueError):
    """An index of fairseq's layout (Megatron's without the document index): its own
    magic, so a file of another format, refused before any work."""


@dataclass(frozen=True)
class Index:
    """What an ``.idx`` header says, and the sizes of both files."""

    dtype: np.dtype
    sequences: int
    ends: int  # entries of the document index (Megatron's builder starts it with 0)
    modes: bool  # a multimodal index: one int8 mode per sequence after the document index
    trailing: bool  # sequences follow the last document's end: one more document
    bin_size: int

    @property
    def documents(self) -> int:
        return max(self.ends - 1, 0) + self.trailing

    def lengths_at(self, s: int) -> int:
        return _HEAD.size + 4 * s

    def pointers_at(self, s: int) -> int:
        return _HEAD.size + 4 * self.sequences + 8 * s

    def ends_at(self, d: int) -> int:
        return _HEAD.size + 12 * self.sequences + 8 * d

    def modes_at(self, s: int) -> int:
        return _HEAD.size + 12 * self.sequences + 8 * self.ends + s


def index(path: str) -> Index:
    """The header of the ``.idx`` at ``path``; ValueError or OSError if it is none, or if
    its size or its ``.bin`` disagree with it."""
    with fs.open_ranged(path) as f:
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size or head[:9] != MAGIC:
            raise ValueError("not a Megatron index (it does not start with MMIDIDX)")
        _, version, code, sequences, ends = _HEAD.unpack(head)
        if version != 1 or code not in DTYPES:
            raise ValueError(f"index version {version}, dtype code {code}: not one Megatron "
                             "writes (version 1, codes 1-8)")
        f.seek(0, io.SEEK_END)
        size = f.tell()
        plain = _HEAD.size + 12 * sequences + 8 * ends
        if size == _HEAD.size - 8 + 12 * sequences:  # no document count, no document index
            raise FairseqIndex("it is a fairseq MMapIndexedDataset index (sequences, no "
                               "documents), which this job does not read")
        if size not in (plain, plain + sequences):
            raise ValueError(f"the index is {size:,} bytes; its header's {sequences:,} "
                             f"sequences and {ends:,} document ends take {plain:,} (a cut or "
                             "damaged .idx)")
        last = 0
        if ends:
            f.seek(plain - 8)
            last = int.from_bytes(f.read(8), "little")
    bin_path = data_path(path)
    if not fs.exists(bin_path):
        raise OSError(f"its tokens file {bin_path} is missing (a Megatron dataset is a .idx "
                      "and a .bin of one name)")
    with fs.open_ranged(bin_path) as f:
        f.seek(0, io.SEEK_END)
        bin_size = f.tell()
    return Index(np.dtype(DTYPES[code]), sequences, ends, size != plain, last < sequences,
                 bin_size)


def _index_of(path: str) -> Index | Exception:
    try:
        return index(path)
    except (OSError, ValueError) as e:
        return e


def check(path: str, spec: TensorSpec) -> TensorSpec:
    if spec.rank is not None:
        raise InputError(f"{path}: keep: a Megatron dataset holds tokens, no column "
                         f"{spec.rank!r}: keep first or last")
    h = _index_of(path)
    if isinstance(h, FairseqIndex):
        raise InputError(f"{path}: input.path: {h}: convert it with Megatron's "
                         "IndexedDatasetBuilder (one document per sequence)")
    if isinstance(h, Exception):
        return spec  # reported by read() as an unreadable file
    if not spec.ragged:
        raise InputError(f"{path}: near.metric: a Megatron dataset's documents are token "
                         "sequences of any length: compare them with near.metric: jaccard, "
                         "or leave out near for exact dedup")
    if h.dtype.kind not in "iu":
        raise InputError(f"{path}: input.path: its tokens are {h.dtype.name}, not token "
                         "ids: jaccard compares integers")
    if spec.dtype is not None and spec.dtype != h.dtype.name:
        raise InputError(f"{path}: input.dtype: its tokens are {h.dtype.name}, not "
                         f"{spec.dtype}: set input.dtype: {h.dtype.name} or leave it out")
    return replace(spec, shape=None, dtype=h.dtype.name)


def plan(path: str, file_index: int, target_rows: int,
         spec: TensorSpec | None = None) -> list[Unit]:
    """Document ranges of about ``target_rows`` documents and at least a MiB of tokens
    (by the average document), counted from the header."""
    h = _index_of(path)
    if isinstance(h, Exception):
        return [Unit(file_index, path, 0, None)]
    return base.row_units(path, file_index, h.documents,
                          round(h.bin_size / max(1, h.documents)), target_rows)


def _array(f: io.IOBase, at: int, dtype: type, count: int) -> np.ndarray:
    """``count`` values at byte ``at`` of ``f``: one positioned read."""
    out = np.empty(count, dtype)
    if count:
        f.seek(at)
        got = f.readinto(memoryview(out.view(np.uint8)))
        if got != out.nbytes:
            raise OSError(f"read {got:,} of {out.nbytes:,} bytes at byte {at:,}")
    return out


@dataclass
class _Documents:
    """Documents ``a:b`` of one dataset: their sequence bounds, lengths, pointers."""

    bounds: np.ndarray  # b - a + 1 sequence indices: document i is bounds[i]:bounds[i + 1]
    lengths: np.ndarray  # tokens of each sequence bounds[0]:bounds[-1]
    pointers: np.ndarray  # byte offset of each in the .bin
    modes: np.ndarray | None


def _documents(f: io.IOBase, h: Index, a: int, b: int) -> _Documents:
    indexed = max(h.ends - 1, 0)  # documents the index ends itself; then the trailing one
    bounds = _array(f, h.ends_at(a), np.int64, min(b, indexed) + 1 - a) if h.ends else \
        np.zeros(1, np.int64)
    if b > indexed:
        bounds = np.r_[bounds, h.sequences].astype(np.int64)
    s0, s1 = int(bounds[0]), int(bounds[-1])
    if not 0 <= s0 <= s1 <= h.sequences or (np.diff(bounds) < 0).any():
        raise ValueError(f"its document index is not increasing within 0..{h.sequences:,} "
                         f"sequences (documents {a:,} to {b - 1:,})")
    lengths = _array(f, h.lengths_at(s0), np.int32, s1 - s0).astype(np.int64)
    pointers = _array(f, h.pointers_at(s0), np.int64, s1 - s0)
    modes = _array(f, h.modes_at(s0), np.int8, s1 - s0) if h.modes else None
    return _Documents(bounds, lengths, pointers, modes)


def _tokens(f: io.IOBase, h: Index, docs: _Documents) -> tuple[np.ndarray, np.ndarray, int]:
    """(the tokens of ``docs``, each document's offset into them, how many documents the
    ``.bin`` holds whole): one read where the sequences are contiguous (as written)."""
    size = h.dtype.itemsize
    seq_ends = docs.pointers + docs.lengths * size
    whole_seqs = int(np.searchsorted(np.maximum.accumulate(seq_ends) > h.bin_size, True))
    starts = docs.bounds - docs.bounds[0]
    whole = int(np.searchsorted(starts[1:], whole_seqs, side="right"))
    seqs = int(starts[whole])
    lengths, pointers = docs.lengths[:seqs], docs.pointers[:seqs]
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    if seqs and (pointers == pointers[0] + offsets[:-1] * size).all():
        flat = _array(f, int(pointers[0]), h.dtype, int(offsets[-1]))
    else:
        flat = np.concatenate([_array(f, int(p), h.dtype, int(n)) for p, n in
                               zip(pointers.tolist(), lengths.tolist(), strict=True)]
                              ) if seqs else np.zeros(0, h.dtype)
    return flat, offsets[starts[:whole + 1]], whole


def read(unit: Unit, spec: TensorSpec, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[Chunk]:
    h = _index_of(unit.path)
    if isinstance(h, Exception):
        yield Chunk.of_invalid(unit.file_index, [base.unreadable_file(
            unit.path, f"unreadable Megatron dataset: {base.error_line(h)}")])
        return
    stop = h.documents if unit.stop is None else min(unit.stop, h.documents)
    rows = base.rows_within(batch_rows, batch_bytes, h.bin_size / max(1, h.documents))
    with fs.open_ranged(unit.path) as idx, fs.open_ranged(data_path(unit.path)) as tokens:
        for a in range(unit.start, stop, rows):
            yield _chunk(unit, h, idx, tokens, a, min(a + rows, stop))


def _chunk(unit: Unit, h: Index, idx: io.IOBase, tokens: io.IOBase, a: int, b: int) -> Chunk:
    positions = np.arange(a, b, dtype=np.int64)
    ids = base.default_ids(unit.path, positions)
    try:
        flat, offsets, whole = _tokens(tokens, h, _documents(idx, h, a, b))
    except (OSError, ValueError) as e:  # a damaged index, a store's failure: these rows
        return Chunk(unit.file_index, positions[:0], ids[:0], np.empty((0,)), invalid=[
            InvalidRecord(p, i, f"unreadable documents: {base.error_line(e)}")
            for p, i in zip(positions.tolist(), ids, strict=True)])
    tensors, digests = base.ragged_rows(offsets, flat)
    cut = [InvalidRecord(p, i, f"the .bin ends at byte {h.bin_size:,}, inside or before "
                         "this document's tokens (an interrupted write or copy?)")
           for p, i in zip(positions[whole:].tolist(), ids[whole:], strict=True)]
    return Chunk(unit.file_index, positions[:whole], ids[:whole], tensors, digests=digests,
                 invalid=cut)


def write(src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None) -> int:
    """A ``.idx`` at ``dst`` and its ``.bin`` of ``src``'s whole documents but those at
    ``drop``: each kept sequence's tokens, length and mode as they were; returns the
    documents written."""
    h = _index_of(src)
    if isinstance(h, Exception):
        return 0
    skip = np.unique(np.asarray(drop, dtype=np.int64))
    lengths: list[np.ndarray] = []
    modes: list[np.ndarray] = []
    ends = [np.zeros(1, np.int64)]
    kept = sequences = 0
    with fs.open_ranged(src) as idx, fs.open_ranged(data_path(src)) as tokens, \
            fs.local_file_for(data_path(dst)) as local, open(local, "wb") as out:
        step = base.rows_within(1 << 16, _WRITE_STEP_BYTES, h.bin_size / max(1, h.documents))
        for a in range(0, h.documents, step):
            b = min(a + step, h.documents)
            docs = _documents(idx, h, a, b)
            flat, offsets, whole = _tokens(tokens, h, docs)
            rows = np.flatnonzero(base.kept_rows(skip, a, a + whole))
            if not len(rows):
                continue
            first, last = docs.bounds[rows] - docs.bounds[0], docs.bounds[rows + 1] - docs.bounds[0]
            seq = np.concatenate([np.arange(s, e) for s, e in zip(first, last, strict=True)])
            lengths.append(docs.lengths[seq].astype(np.int32))
            if docs.modes is not None:
                modes.append(docs.modes[seq])
            ends.append(sequences + np.cumsum(last - first))
            sequences += len(seq)
            kept += len(rows)
            for s, e in zip(offsets[rows].tolist(), offsets[rows + 1].tolist(), strict=True):
                out.write(memoryview(flat[s:e].view(np.uint8)))
    _write_index(dst, h, lengths, modes, np.concatenate(ends))
    return kept


def _write_index(dst: str, h: Index, lengths: list[np.ndarray], modes: list[np.ndarray],
                 ends: np.ndarray) -> None:
    """The ``.idx`` Megatron's ``_IndexWriter`` writes for these sequences (contiguous)."""
    n = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    pointers = np.r_[0, np.cumsum(n.astype(np.int64))[:-1] * h.dtype.itemsize].astype(
        np.int64) if len(n) else np.zeros(0, np.int64)
    code = next(c for c, t in DTYPES.items() if np.dtype(t) == h.dtype)
    with fs.local_file_for(dst) as local, open(local, "wb") as out:
        out.write(_HEAD.pack(MAGIC, 1, code, len(n), len(ends)))
        for part in (n, pointers, ends.astype(np.int64)):
            out.write(part.tobytes())
        if h.modes:
            out.write((np.concatenate(modes) if modes else np.zeros(0, np.int8)).tobytes())


def read_rows(path: str, spec: TensorSpec, positions: list[int]) -> dict[int, np.ndarray]:
    """The tokens of the documents at ``positions`` (a few records: the report's page)."""
    h = _index_of(path)
    out: dict[int, np.ndarray] = {}
    if isinstance(h, Exception):
        return out
    with fs.open_ranged(path) as idx, fs.open_ranged(data_path(path)) as tokens:
        for p in sorted({int(p) for p in positions}):
            if 0 <= p < h.documents:
                try:
                    flat, offsets, whole = _tokens(tokens, h, _documents(idx, h, p, p + 1))
                except (OSError, ValueError):
                    continue
                if whole:
                    out[p] = flat[offsets[0]:offsets[1]]
    return out
