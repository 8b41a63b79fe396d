"""The contract every input format implements: check, plan, read chunks, write a filtered copy.

Why: the dedup job (``pipeline/``) is format-agnostic. A format module is a set of
plain functions (no Beam) so the job, the tests and future front ends share them.

Positions: every record of a file has a position, its 0-based ordinal in that file
as the format's reader meets it. ``read`` and ``write`` must agree on positions, so
that ``write(src, dst, drop)`` drops exactly the records the job decided to drop.
An unreadable region that cannot be split into records (e.g. TFRecord bytes whose
length header is corrupt) is one "record" with its own position: it is counted as
read and reported invalid, and ``write`` never copies it. A file that cannot be opened
at all (a damaged footer or superblock) holds no records anyone can count: it is one
``InvalidRecord`` with ``whole_file`` set, reported as that file with its reason, and
counted as no record.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class InputError(ValueError):
    """An input problem found before any work, as one line naming the file/key and the fix."""


class InvalidRecordError(ValueError):
    """A record that cannot be used while ``on_invalid: fail`` is set."""


DECODE_KINDS = ("image", "bytes", "text")


@dataclass(frozen=True)
class Decode:
    """How a field of encoded values (image files, bytes, text) becomes tensors on workers.

    Why a setting of its own: the value as stored is not the tensor to compare. ``image``
    decodes JPEG/PNG/GIF/BMP/WebP to uint8 (h, w, c) pixels (``transforms.images``);
    ``bytes`` takes the stored bytes as a uint8 vector; ``text`` takes UTF-8 text (exact
    dedup on its bytes; distances only after an embedding).
    """

    kind: str = "image"  # image | bytes | text
    resize: tuple[int, int] | None = None  # image: (height, width) the near stage compares
    channels: int | None = None  # image: 1 (grey) | 3 (RGB); None: as stored (RGB if resize)
    max_pixels: int = 50_000_000  # image: larger images are invalid (decompression bombs)
    chunk_bytes: int = 64 << 20  # decoded (and encoded) bytes per chunk at most
    exact_on: str = "pixels"  # image: what exact dedup compares, pixels | bytes (as stored)

    def __post_init__(self) -> None:
        if self.kind not in DECODE_KINDS:
            raise ValueError(f"decode must be one of {', '.join(DECODE_KINDS)}, got "
                             f"{self.kind!r}")
        if self.kind != "image" and (self.resize is not None or self.channels is not None):
            raise ValueError("resize and channels apply to decode 'image' only")
        if self.exact_on not in ("pixels", "bytes") or (
                self.exact_on != "pixels" and self.kind != "image"):
            raise ValueError(f"exact_on must be 'pixels' or 'bytes' (decode 'image' only), "
                             f"got {self.exact_on!r}")
        if self.channels not in (None, 1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels!r}")
        if self.resize is not None and (len(self.resize) != 2 or min(self.resize) < 1):
            raise ValueError(f"resize must be (height, width) >= 1, got {self.resize!r}")


@dataclass(frozen=True)
class TensorSpec:
    """What to read from each record (from the config's ``input`` section and ``keep``)."""

    tensor: str  # Parquet column / tf.train.Example feature / HDF5 dataset
    id: str | None = None  # column/feature/dataset with record ids; None = "<path>:<position>"
    shape: tuple[int, ...] | None = None  # per-record shape; None = taken from the file
    dtype: str | None = None  # numpy dtype name (incl. "bfloat16"); None = from the file
    rank: str | None = None  # scalar column/feature/dataset for keep {max|min: column}
    compression: str = "auto"  # TFRecord only: auto | none | gzip | zlib
    decode: Decode | None = None  # encoded values (images, bytes, text); None: numbers
    ragged: bool = False  # 1-d integer sequences of any length (near.metric jaccard, token
    # shingles): a chunk's tensors are an object array of them, digests given (``ragged_rows``)
    columns: tuple[str, ...] = ()  # numeric columns that make each record's vector, one value
    # each (a feature table); ``tensor`` then only names them in messages (``columns.named``)


def read_columns(spec: TensorSpec) -> list[str]:
    """The columns (fields) a table format reads: the tensor's, the id's and keep's."""
    return list(dict.fromkeys(c for c in (*(spec.columns or (spec.tensor,)), spec.id, spec.rank)
                              if c is not None))


# What a text column, feature or dataset needs under jaccard (``TensorSpec.ragged``).
JACCARD_TEXT_FIX = "set input.decode: text (jaccard compares the texts' words)"


def ragged_rows(offsets: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(object array of the 1-d sequences values[offsets[i]:offsets[i + 1]], their V16
    exact digests): each digest the one ``fingerprint_batch`` gives the sequence as a
    tensor of its own length (hashed in one call per length)."""
    from transforms.fingerprint import fingerprint_batch

    n = len(offsets) - 1
    tensors = np.empty(n, object)
    for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)):
        tensors[i] = values[a:b]
    digests = np.empty(n, "V16")
    lengths = np.diff(offsets)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        digests[rows] = fingerprint_batch(values[offsets[rows][:, None] + np.arange(length)])
    return tensors, digests


def ragged_tensors(seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ragged_rows`` of an object array of 1-d sequences (as a reader parsed them)."""
    lengths = np.fromiter((len(t) for t in seqs), np.int64, len(seqs))
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    flat = np.concatenate(list(seqs)) if offsets[-1] else np.zeros(0, np.int64)
    return ragged_rows(offsets, flat)


@dataclass(frozen=True)
class Unit:
    """A range of records of one file, read as one Beam element (then yielded in chunks)."""

    file_index: int  # index of the file in the sorted input list (the "first" order)
    path: str
    start: int = 0  # first position (inclusive)
    stop: int | None = None  # last position (exclusive); None = to the end of the file


@dataclass(frozen=True)
class InvalidRecord:
    position: int
    record_id: str
    reason: str  # one line: what is wrong (e.g. "CRC mismatch", "shape (3,) != (4,)")
    whole_file: bool = False  # the file could not be opened: no record, the file's reason


def unreadable_file(path: str, reason: str) -> InvalidRecord:
    """A file that cannot be opened at all (position 0, the path as its id)."""
    return InvalidRecord(0, path, reason, whole_file=True)


def records_of(invalid: list[InvalidRecord]) -> list[InvalidRecord]:
    """The invalid records that are records (not an unreadable file standing for none)."""
    return [r for r in invalid if not r.whole_file]


@dataclass
class Chunk:
    """Records read from one unit. Valid rows are ordered by position."""

    file_index: int
    positions: np.ndarray  # int64 (n,) positions of the valid rows
    ids: np.ndarray | pa.Array  # (n,) record ids of the valid rows: object str or Arrow string
    tensors: np.ndarray  # (n, *shape) the tensors of the valid rows
    rank: np.ndarray | None = None  # (n,) keep-by values, when TensorSpec.rank is set
    invalid: list[InvalidRecord] = field(default_factory=list)
    # (n,) V16 exact digests when not those of ``tensors``: decoded images are compared at
    # full resolution while ``tensors`` holds them resized; ragged values (object arrays)
    digests: np.ndarray | None = None

    @property
    def n_read(self) -> int:
        """Records read: valid and invalid ones, not an unreadable file's stand-in."""
        return len(self.positions) + len(records_of(self.invalid))

    def reported_invalid(self, bad: np.ndarray, reason: str) -> Chunk:
        """This chunk with the rows where ``bad`` (bool, per valid row) is set moved to
        ``invalid`` with ``reason`` (e.g. NaN/inf rows when the near stage asks so)."""
        if not bad.any():
            return self
        ids = arrow_ids(self.ids)
        out = np.flatnonzero(bad)
        moved = [InvalidRecord(p, i, reason) for p, i in zip(
            self.positions[out].tolist(), ids.take(pa.array(out)).to_pylist(), strict=True)]
        left = self.take(np.flatnonzero(~bad))
        left.invalid = sorted(self.invalid + moved, key=lambda r: r.position)
        return left

    def take(self, rows: np.ndarray) -> Chunk:
        """The valid rows at ``rows`` (int indexes, in order), without invalid records."""
        return Chunk(self.file_index, self.positions[rows],
                     arrow_ids(self.ids).take(pa.array(rows, pa.int64())), self.tensors[rows],
                     None if self.rank is None else self.rank[rows], [],
                     None if self.digests is None else self.digests[rows])

    @staticmethod
    def of_invalid(file_index: int, invalid: list[InvalidRecord]) -> Chunk:
        """A chunk with no usable rows, only invalid records (an unreadable file or range)."""
        return Chunk(file_index, np.empty(0, np.int64), np.empty(0, object), np.empty((0,)),
                     None, invalid)


@dataclass
class Values:
    """Encoded values of some records of one unit, before decoding (``Decode``)."""

    file_index: int
    positions: np.ndarray  # int64 (n,) positions of the readable rows
    ids: np.ndarray | pa.Array  # (n,) record ids
    values: list[bytes | str]  # (n,) the encoded value of each row
    rank: np.ndarray | None = None
    invalid: list[InvalidRecord] = field(default_factory=list)


def sizes_spread(sizes: Counter[int]) -> str:
    """Records' sizes in words: ``hold 3 to 7 values (3 sizes; the most common, 5, 80% of
    them)``, for refusals of records of no fixed size."""
    common, times = sizes.most_common(1)[0]
    return (f"hold {min(sizes):,} to {max(sizes):,} values ({len(sizes):,} sizes; the most "
            f"common, {common:,}, {times / sum(sizes.values()):.0%} of them)")


def no_fixed_size(path: str, what: str, holding: str, sizes: Counter[int], ints: bool
                  ) -> InputError:
    """The refusal of a list of several sizes without ``input.shape`` (``what``: "feature
    'x' is an int64_list"; ``holding``: "records holding it"), quoting the sizes seen."""
    jaccard = (", or set near.metric: jaccard (with near.threshold, e.g. 0.8) for the "
               "similarity of token sequences, or remove near (exact dedup alone reads "
               "sequences of any length)" if ints else "")
    return InputError(f"{path}: input.shape: {what} of no fixed size: the first "
                      f"{sum(sizes.values()):,} {holding} {sizes_spread(sizes)}: set "
                      f"input.shape: [{sizes.most_common(1)[0][0]}] to read the records of "
                      f"that size (the others are then reported invalid){jaccard}")


def utf8_text(data: bytes, cut_ok: bool = False) -> str | None:
    """``data`` as text if it is UTF-8 with no control character but whitespace, else
    None; ``cut_ok``: the first bytes of a file, where a character may be cut off."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not cut_ok or e.start < len(data) - 3:
            return None
        text = data[:e.start].decode("utf-8")
    return text if all(c.isprintable() or c.isspace() for c in text) else None


# A unit of records of no fixed size (texts, encoded images, token ids): at most about
# this many bytes of values (uncompressed), or one large file of them was one unit, read,
# shingled and hashed by one worker while the others waited.
UNIT_BYTES = 128 << 20


def record_nbytes(spec: TensorSpec) -> int | None:
    """Bytes of one record's tensor values when the spec fixes shape and dtype, else None."""
    if spec.shape is None or spec.dtype is None:
        return None
    itemsize = 2 if spec.dtype == "bfloat16" else 4 if spec.dtype == "complex32" else (
        np.dtype(spec.dtype).itemsize)
    return math.prod(spec.shape) * itemsize


# A unit holds at least this many bytes of records: ``plan(path, i, 1)`` asks a file's
# smallest units (the capacity plan's count of chunks), which are not one record each.
MIN_UNIT_BYTES = 1 << 20


def row_units(path: str, file_index: int, n: int, width: int, target_rows: int) -> list[Unit]:
    """Ranges of about ``target_rows`` of a file's ``n`` records of ``width`` bytes (on
    average), each at least ``MIN_UNIT_BYTES``: units of a format that reads any range."""
    step = max(1, target_rows, -(-MIN_UNIT_BYTES // max(1, width)))
    starts = list(range(0, n, step)) or [0]
    return [Unit(file_index, path, a, b) for a, b in zip(starts, [*starts[1:], n], strict=True)]


def kept_rows(skip: np.ndarray, a: int, b: int) -> np.ndarray:
    """Which records ``a:b`` are not at the sorted positions ``skip`` (a clean copy's
    step of rows: its keep mask)."""
    keep = np.ones(b - a, dtype=bool)
    lo, hi = np.searchsorted(skip, [a, b])
    keep[skip[lo:hi] - a] = False
    return keep


def rows_within(rows: int, max_bytes: int | None, row_bytes: float | None) -> int:
    """Records per chunk: at most ``rows`` and at most ``max_bytes`` of tensor values, at
    least one. Why bytes too: 64 Ki rows of 16 Ki-value float32 images are 4 GB."""
    if not max_bytes or not row_bytes:
        return rows
    return max(1, min(rows, int(max_bytes // row_bytes)))


def byte_slices(lengths: np.ndarray, rows: int, max_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) slices of consecutive values, each at most ``rows`` values and, unless
    one value alone is larger, at most ``max_bytes`` in all of ``lengths`` (bytes for
    encoded images; any unit, e.g. the shingles of texts, for other callers)."""
    out, a, n = [], 0, len(lengths)
    ends = np.cumsum(lengths, dtype=np.int64)
    while a < n:
        base = ends[a - 1] if a else 0
        b = int(np.searchsorted(ends, base + max_bytes, side="right"))
        b = min(max(b, a + 1), a + rows, n)
        out.append((a, b))
        a = b
    return out


def error_line(e: BaseException) -> str:
    """An exception as one line for an invalid-record reason: "Type: message"."""
    return f"{type(e).__name__}: {e}".replace("\n", " ")


NAMES_SHOWN = 12  # names a refusal lists at most (a wide table has thousands)


def listed_names(names: list[str]) -> str:
    """``names`` for one line: the first NAMES_SHOWN, then how many there are in all."""
    if not names:
        return "(none)"
    more = f", ... ({len(names):,} in all)" if len(names) > NAMES_SHOWN else ""
    return ", ".join(names[:NAMES_SHOWN]) + more


def nearest_name(name: str, names: list[str]) -> str | None:
    """The name in ``names`` a typo of ``name`` most likely meant: one differing only in
    case first (``Embedding`` for ``embedding``), then one whose last ``/`` part does
    (``feat/emb`` for ``emb``), else the closest by ``difflib``."""
    for same in (lambda n: n.casefold() == name.casefold(),  # in a group (HDF5): its name
                 lambda n: n.rsplit("/", 1)[-1].casefold() == name.rsplit("/", 1)[-1].casefold()):
        found = [n for n in names if same(n)]
        if found:
            return found[0]
    folded = {n.casefold(): n for n in names}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1, cutoff=0.6)
    return folded[close[0]] if close else None


def no_such_name(name: str, names: list[str], what: str, fix: str) -> str:
    """The end of a refusal of a missing column, feature or dataset: what there is
    (``what`` introduces the names, e.g. "the file has datasets"; capped), then ``did
    you mean X?`` where one is close, else ``fix``."""
    near = nearest_name(name, names)
    return (f"({what} {listed_names(names)}): "
            f"{f'did you mean {near!r}?' if near is not None else fix}")


def as_ids(values: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Id values (an HDF5 dataset's, an .npz array's) -> object array of str (bytes
    decoded as UTF-8), and the rows whose bytes are not UTF-8: invalid records (as in
    TFRecord), named with their bytes escaped so the report still shows which they were."""
    if values.dtype.kind in "iu":
        return values.astype(str).astype(object), []
    out, bad = [], []
    for p, v in enumerate(values.tolist()):
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(p)
                v = v.decode("utf-8", "backslashreplace")
        out.append(str(v))
    return np.array(out, dtype=object), bad


def default_id(path: str, position: int) -> str:
    return f"{path}:{position}"


def default_ids(path: str, positions: np.ndarray) -> np.ndarray:
    """Default record ids "<path>:<position>" as an object array."""
    return np.array([f"{path}:{p}" for p in positions.tolist()], dtype=object)


def default_ids_arrow(path: str, positions: np.ndarray) -> pa.Array:
    """Default record ids "<path>:<position>" as an Arrow string array (no Python loop)."""
    return pc.binary_join_element_wise(path, pa.array(positions).cast(pa.string()), ":")


def arrow_ids(ids: np.ndarray | pa.Array) -> pa.Array:
    """Record ids as an Arrow string array: compact and fast to shuffle."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if isinstance(ids, pa.Array):
        return ids.cast(pa.string())
    return pa.array(ids, type=pa.string())


class Format(Protocol):
    """Module-level functions of ``transforms.io.formats.<name>``."""

    def check(self, path: str, spec: TensorSpec) -> TensorSpec:
        """Return ``spec`` with shape and dtype resolved from the file (so every later
        file is checked against the first one's), or raise InputError (one line) if
        the file lacks the tensor/id/rank field, or the tensor's shape/dtype disagree
        with the spec. Cheap: schema/first record.
        A file that cannot be opened at all (truncated, corrupt) does not raise: the
        job reports it as invalid and goes on with the other files."""

    def plan(self, path: str, file_index: int, target_rows: int,
             spec: TensorSpec | None = None) -> list[Unit]:
        """Split a file into units of about ``target_rows`` records (one unit if the
        format cannot split a file). Units cover every position exactly once."""

    def read(self, unit: Unit, spec: TensorSpec, batch_rows: int,
             batch_bytes: int | None = None) -> Iterator[Chunk]:
        """Yield chunks of at most ``batch_rows`` records and, when ``batch_bytes`` is
        given, at most that many bytes of tensor values (at least one record), covering
        the unit, in order. Bad records go to ``Chunk.invalid``; never raise for bad data."""

    def write(self, src: str, dst: str, drop: np.ndarray, spec: TensorSpec | None = None
              ) -> int:
        """Copy ``src`` to ``dst`` without the records at the sorted int64 positions
        ``drop`` (and without unreadable records); same schema, dtypes, compression and
        record order. Return the number of records written. A ``src`` that cannot be
        opened at all gives no ``dst`` file and returns 0."""

    def read_rows(self, path: str, spec: TensorSpec, positions: list[int]
                  ) -> dict[int, np.ndarray]:
        """{position: tensor} for the given positions of one file (a few records, e.g. for
        the report's page); invalid or unreadable positions are left out."""


@dataclass(frozen=True)
class Chunking:
    """How input is cut into Beam elements: ``unit_rows`` records per read task (spread
    over workers), ``chunk_rows`` records per chunk (one element: a Beam element costs
    ~30 us, a row must cost far less), and at most ``chunk_bytes`` of tensor values per
    chunk: a row count alone makes 4 GB chunks of 16 Ki-value float32 images. Units
    shrink with the chunks (``unit_rows_for``), so wide records still spread over
    workers."""

    unit_rows: int = 262_144
    chunk_rows: int = 65_536
    chunk_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.unit_rows < 1 or self.chunk_rows < 1 or self.chunk_bytes < 1:
            raise ValueError("unit_rows, chunk_rows and chunk_bytes must be at least 1, got "
                             f"{self}")

    def unit_rows_for(self, record_bytes: int | None) -> int:
        """Records per read unit for records of ``record_bytes`` (None: unknown): as many
        chunks per unit as ``unit_rows / chunk_rows`` allows (4 by default), each chunk
        cut to ``chunk_bytes``."""
        chunk = rows_within(self.chunk_rows, self.chunk_bytes, record_bytes)
        return min(self.unit_rows, chunk * max(1, -(-self.unit_rows // self.chunk_rows)))


def rows_by_reading(read: Callable[..., Iterator[Chunk]], path: str, spec: TensorSpec,
                    positions: list[int]) -> dict[int, np.ndarray]:
    """``read_rows`` of a format without an index (JSON lines, Arrow streams): the file
    read with its own ``read`` up to the last position wanted (positions mean what they
    meant to the job)."""
    want = {int(p) for p in positions}
    out: dict[int, np.ndarray] = {}
    if not want:
        return out
    for chunk in read(Unit(0, path, 0, None), spec, 4096):
        out.update((p, chunk.tensors[i]) for i, p in enumerate(chunk.positions.tolist())
                   if p in want)
        if len(out) == len(want) or (len(chunk.positions) and chunk.positions[-1] >= max(want)):
            break
    return out
