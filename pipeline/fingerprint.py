"""Fingerprint: chunk of rows -> (shard, KeyBatch) per digest shard. Tensors stop here.

The digests come from the core kernel (``transforms.fingerprint.fingerprint_batch``,
one call per chunk). Splitting each chunk by shard keeps the shuffle at
chunks x shards elements instead of one element per record.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from pipeline.elements import KeyBatch
from transforms.exact import digest_words
from transforms.fingerprint import fingerprint_batch
from transforms.formats.base import Chunk, arrow_ids


def shard_keys(chunk: Chunk, shards: int) -> Iterator[tuple[int, KeyBatch]]:
    words = digest_words(fingerprint_batch(chunk.tensors))
    file_index = np.full(len(words), chunk.file_index, dtype=np.int32)
    batch = KeyBatch(words, file_index, chunk.positions, arrow_ids(chunk.ids), chunk.rank)
    shard = (words[:, 0] % np.uint64(shards)).astype(np.int64)
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shards + 1))
    for s in range(shards):
        if bounds[s + 1] > bounds[s]:
            yield s, batch.take(order[bounds[s]:bounds[s + 1]])


class Fingerprint(beam.PTransform):
    """Chunk -> (shard, KeyBatch)."""

    def __init__(self, shards: int):
        super().__init__()
        self.shards = shards

    def expand(self, chunks):
        return chunks | "DigestAndShard" >> beam.FlatMap(shard_keys, self.shards)
