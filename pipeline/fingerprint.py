"""Fingerprint: chunk of rows -> (shard, KeyBatch) per digest shard (+ VecBatch for Near).

The digests come from the core kernel (``transforms.fingerprint.fingerprint_batch``,
one call per chunk). Splitting each chunk by shard keeps the shuffle at
chunks x shards elements instead of one element per record. Tensors stop here,
except when the near stage is on: then the chunk's finite rows also go on as one
VecBatch, with the same digests (hashed once).
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
import numpy as np

from pipeline.elements import KeyBatch, VecBatch
from transforms.exact import digest_words, keep_order
from transforms.fingerprint import fingerprint_batch
from transforms.formats.base import Chunk, arrow_ids
from transforms.near import finite_rows

VECTORS = "vectors"


def shard_keys(chunk: Chunk, shards: int, near_keep: str | None = None
               ) -> Iterator[tuple[int, KeyBatch] | beam.pvalue.TaggedOutput]:
    """``near_keep``: the keep policy when the near stage is on (then a VecBatch of the
    chunk's finite rows goes to the VECTORS output)."""
    words = digest_words(fingerprint_batch(chunk.tensors))
    file_index = np.full(len(words), chunk.file_index, dtype=np.int32)
    batch = KeyBatch(words, file_index, chunk.positions, arrow_ids(chunk.ids), chunk.rank)
    if near_keep is not None:
        x = chunk.tensors.reshape(len(words), -1)
        prio, order = keep_order(file_index, chunk.positions, near_keep, chunk.rank)
        ok = np.flatnonzero(finite_rows(x))
        yield beam.pvalue.TaggedOutput(VECTORS, VecBatch(
            words, prio, order, file_index, chunk.positions, batch.ids, x).take(ok))
    shard = (words[:, 0] % np.uint64(shards)).astype(np.int64)
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shards + 1))
    for s in range(shards):
        if bounds[s + 1] > bounds[s]:
            yield s, batch.take(order[bounds[s]:bounds[s + 1]])


class Fingerprint(beam.PTransform):
    """Chunk -> {"keys": (shard, KeyBatch), VECTORS: VecBatch (only with ``near_keep``)}."""

    def __init__(self, shards: int, near_keep: str | None = None):
        super().__init__()
        self.shards, self.near_keep = shards, near_keep

    def expand(self, chunks):
        out = (chunks | "DigestAndShard" >> beam.FlatMap(shard_keys, self.shards, self.near_keep)
               .with_outputs(VECTORS, main="keys"))
        return {"keys": out.keys, VECTORS: out[VECTORS]}
