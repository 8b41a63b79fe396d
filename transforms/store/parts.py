"""The part files one attempt of a run writes to a fingerprint store (exact digest segments,
vector Parquet parts), and the digest checks and part stats that the store's reads and
compaction use too; the commits and the store's layout are ``transforms.store.store``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.io import fs
from transforms.store import segment as digest_segment
from transforms.store.segment import KEY

VECTOR_GROUP_BYTES = 16 << 20  # vectors parts: bounds the memory of one row group
DTYPE_KEY = b"tensordedup.dtype"
SETS = "sets"  # DTYPE_KEY of a values part holding shingle sets (``write_sets``)


@dataclass(frozen=True)
class Attempt:
    """One try at writing a run's records. Only strings, so Beam ships it to the workers
    that write the parts in parallel; writing a part again (a retried bundle) overwrites
    the same file."""

    root: str
    run_id: str
    name: str

    @property
    def path(self) -> str:
        return fs.join(self.root, "runs", self.run_id, self.name)

    def write_exact(self, part: int, words: np.ndarray, ids: pa.Array) -> dict:
        """Write one exact part (a digest segment); returns its stats for ``commit``."""
        words, ids = _checked(words, ids)
        name = f"exact-{part:05d}.seg"
        fs.write_bytes_atomic(fs.join(self.path, name), digest_segment.encode(
            words, np.zeros(len(words), np.uint32), ids, [(self.run_id, self.name)]))
        return {"kind": "exact", "part": part, "file": name, **digest_bounds(words)}

    def write_vectors(self, part: int, words: np.ndarray, ids: pa.Array,
                      x: np.ndarray) -> dict:
        """Write one part of values ((n, d) in the input dtype, kept bit for bit)."""
        words, ids = _checked(words, ids)
        if x.ndim != 2 or len(x) != len(words):
            raise ValueError(f"x must be ({len(words)}, d), got {x.shape}")
        x = np.ascontiguousarray(x, x.dtype.newbyteorder("="))
        row_bytes = x.shape[1] * x.dtype.itemsize
        try:
            values, width = pa.array(x.reshape(-1), pa.from_numpy_dtype(x.dtype)), x.shape[1]
        except pa.ArrowNotImplementedError:  # bfloat16, complex: Arrow lacks them, keep bytes
            values, width = pa.array(x.reshape(-1).view(np.uint8)), row_bytes
        table = _key_table(words, ids).append_column(
            "x", pa.FixedSizeListArray.from_arrays(values, width))
        table = table.replace_schema_metadata({DTYPE_KEY: x.dtype.name.encode()})
        name = f"vectors-{part:05d}.parquet"
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, row_group_size=max(1, VECTOR_GROUP_BYTES // max(row_bytes, 1)),
                       compression="zstd", use_dictionary=False)
        fs.write_bytes_atomic(fs.join(self.path, name), memoryview(buf.getvalue()))
        return {"kind": "vectors", "part": part, "file": name, "rows": len(x),
                "dim": x.shape[1]}


    def write_sets(self, part: int, words: np.ndarray, ids: pa.Array, offsets: np.ndarray,
                   hashes: np.ndarray) -> dict:
        """Write one part of shingle sets (near metric jaccard; CSR: record i holds
        ``hashes[offsets[i]:offsets[i + 1]]``) as a values part whose column ``sets`` is
        a list of uint64 per record."""
        words, ids = _checked(words, ids)
        if len(offsets) != len(words) + 1:
            raise ValueError(f"{len(words)} digests but {len(offsets) - 1} sets")
        table = _key_table(words, ids).append_column("sets", pa.LargeListArray.from_arrays(
            pa.array(offsets, pa.int64()), pa.array(hashes, pa.uint64())))
        table = table.replace_schema_metadata({DTYPE_KEY: SETS.encode()})
        name = f"vectors-{part:05d}.parquet"
        buf = pa.BufferOutputStream()
        rows = max(1, VECTOR_GROUP_BYTES * len(words) // max(8 * len(hashes), 1))
        pq.write_table(table, buf, row_group_size=rows, compression="zstd",
                       use_dictionary=False)
        fs.write_bytes_atomic(fs.join(self.path, name), memoryview(buf.getvalue()))
        return {"kind": "vectors", "part": part, "file": name, "rows": len(words), "dim": 0}


def digest_bounds(words: np.ndarray) -> dict:
    """Rows and smallest/largest digest (32 hex digits; None when empty) of a part."""
    if not len(words):
        return {"rows": 0, "min": None, "max": None}
    hi = words[:, 0]
    lo, top = hi.min(), hi.max()
    return {"rows": len(words),
            "min": _hex((lo, words[hi == lo, 1].min())),
            "max": _hex((top, words[hi == top, 1].max()))}


def _checked(words: np.ndarray, ids: pa.Array) -> tuple[np.ndarray, pa.Array]:
    words = stored_words(words)
    if len(ids) != len(words):
        raise ValueError(f"{len(words)} digests but {len(ids)} record ids")
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    return words, ids.cast(pa.string())


def stored_words(words: np.ndarray) -> np.ndarray:
    """``words`` checked to be digests as the store keeps them: (n, 2) uint64 (hi, lo)."""
    words = np.asarray(words)
    if words.dtype != np.uint64 or words.ndim != 2 or words.shape[1] != 2:
        raise ValueError(f"digests must be (n, 2) uint64 (hi, lo), got {words.shape} "
                         f"{words.dtype}: see transforms.exact.digest_words")
    return words


def digest_key(hex32: str) -> np.ndarray:
    """A digest's 32 hex digits as the store's (hi, lo) key."""
    return np.array((int(hex32[:16], 16), int(hex32[16:], 16)), KEY)


def _hex(word) -> str:
    return f"{int(word[0]):016x}{int(word[1]):016x}"


def _key_table(words: np.ndarray, ids: pa.Array) -> pa.Table:
    return pa.table({"hi": np.ascontiguousarray(words[:, 0]),
                     "lo": np.ascontiguousarray(words[:, 1]), "record_id": ids})


def batch_words(batch: pa.Table | pa.RecordBatch) -> np.ndarray:
    """The (n, 2) uint64 digests of a stored batch's hi and lo columns."""
    return np.column_stack([batch["hi"].to_numpy(), batch["lo"].to_numpy()])
