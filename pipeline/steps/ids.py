"""RepeatedIds: chunks -> the records that share an id (a count and a few examples).

Why: the report names records by id, and the filters (``filters.manifest``, the tf.data,
PyTorch and Hugging Face ones) find them by it: where two records share an id, removing
one drops the other downstream too. Ids from a column (``input.id``) are the user's and
may repeat, e.g. a row number that restarts in every shard. Each chunk's ids are hashed
(XXH3-128: no two distinct ids of a billion meet by chance) and range-sharded, so the
check is one shuffle of 28 bytes a record, and no worker holds more than its shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import xxhash

from transforms.io.formats.base import Chunk, arrow_ids

EXAMPLES = 3  # pairs of records quoted


@dataclass(frozen=True)
class IdBatch:
    """Some records' id hashes and where the records are."""

    hashes: np.ndarray  # (n, 2) uint64: XXH3-128 of the UTF-8 id
    file_index: np.ndarray  # (n,) int32
    position: np.ndarray  # (n,) int64


@dataclass(frozen=True)
class Repeats:
    """Records whose id another record holds too: how many, and the first few pairs as
    ((file_index, position) of the earlier record, of the later one)."""

    count: int
    examples: tuple[tuple[tuple[int, int], tuple[int, int]], ...]


def repeated_line(count: str, first: str, second: str, column: str | None) -> str:
    """The one line for records that share an id (the job's check and the preflight's)."""
    return (f"{count} records hold an id an earlier record holds (first: {first} and "
            f"{second} share their input.id {column!r}); the report and the filters find "
            "records by id, so each record needs its own: name a unique column as input.id, "
            "or remove input.id (ids default to <file>:<row>)")


def id_hashes(ids) -> np.ndarray:
    """(n, 2) uint64 XXH3-128 of each id's UTF-8 bytes."""
    raw = b"".join(xxhash.xxh3_128_digest(i.encode("utf-8", "surrogatepass"))
                   for i in arrow_ids(ids).to_pylist())
    return np.frombuffer(raw, np.uint64).reshape(-1, 2)


def _shard(chunk: Chunk, shards: int) -> Iterator[tuple[int, IdBatch]]:
    """The chunk's records by the shard of their id's hash."""
    if not len(chunk.positions):
        return
    h = id_hashes(chunk.ids)
    shard = (h[:, 0] % np.uint64(shards)).astype(np.int64)
    fi = np.full(len(h), chunk.file_index, np.int32)
    for s in np.unique(shard).tolist():
        rows = np.flatnonzero(shard == s)
        yield s, IdBatch(h[rows], fi[rows], chunk.positions[rows])


def _repeats(item: tuple[int, list[IdBatch]]) -> Repeats:
    """One shard's records that hold an id an earlier record holds (in file, row order).
    One sort of the hashes' first word finds the candidates (a shard of distinct ids has
    none); only those are ordered by the whole hash and their place."""
    _, batches = item
    h = np.concatenate([b.hashes for b in batches])
    fi = np.concatenate([b.file_index for b in batches])
    pos = np.concatenate([b.position for b in batches])
    o = np.argsort(h[:, 0])
    twin = np.flatnonzero(h[o[1:], 0] == h[o[:-1], 0])
    if not len(twin):
        return Repeats(0, ())
    rows = np.unique(np.r_[o[twin], o[twin + 1]])
    h, fi, pos = h[rows], fi[rows], pos[rows]
    order = np.lexsort((pos, fi, h[:, 1], h[:, 0]))
    h, fi, pos = h[order], fi[order], pos[order]
    new = np.r_[True, ~(h[1:] == h[:-1]).all(axis=1)]
    same = np.flatnonzero(~new)
    if not len(same):
        return Repeats(0, ())
    starts = np.flatnonzero(new)
    first = starts[np.searchsorted(starts, same, side="right") - 1]
    earliest = np.lexsort((pos[same], fi[same]))[:EXAMPLES]  # by the later record's place
    same, first = same[earliest], first[earliest]
    return Repeats(int((~new).sum()), tuple(
        ((int(fi[a]), int(pos[a])), (int(fi[b]), int(pos[b])))
        for a, b in zip(first[:EXAMPLES].tolist(), same[:EXAMPLES].tolist(), strict=True)))


def _merge(parts: list[Repeats]) -> Repeats:
    examples = sorted(e for p in parts for e in p.examples)[:EXAMPLES]
    return Repeats(sum(p.count for p in parts), tuple(examples))


class RepeatedIds(beam.PTransform):
    """Chunks -> one ``Repeats``: the records whose id an earlier record holds."""

    def __init__(self, *, shards: int = 16):
        super().__init__()
        self.shards = shards

    def expand(self, chunks):
        return (chunks
                | "ShardIds" >> beam.FlatMap(_shard, self.shards)
                | "GroupIds" >> beam.GroupByKey()
                | "Repeats" >> beam.Map(_repeats)
                | "All" >> beam.combiners.ToList()
                | "Merge" >> beam.Map(_merge))
