"""Exact: (shard, KeyBatch) -> (file_index, Removed) for every exact duplicate.

One GroupByKey on the digest shard brings all rows with the same digest together;
the grouping and the keep policy are the plain kernel
``transforms.exact.find_exact_duplicates``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline.elements import KeyBatch, Removed
from transforms.exact import find_exact_duplicates

SEEN = "seen"


def removed_by_file(batch: KeyBatch, removed: np.ndarray, kept: np.ndarray, kind: str,
                    distance: np.ndarray) -> Iterator[tuple[int, Removed]]:
    """Split removals (sorted by input order) into one ``Removed`` per input file."""
    files = batch.file_index[removed]
    cuts = np.flatnonzero(np.diff(files)) + 1
    for part in np.split(np.arange(len(removed)), cuts):
        if len(part):
            r, k = removed[part], kept[part]
            yield int(files[part[0]]), Removed(batch.position[r], batch.ids.take(pa.array(r)),
                                               batch.ids.take(pa.array(k)), kind, distance[part])


def exact_in_shard(shard_batches: tuple[int, Iterable[KeyBatch]], keep: str
                   ) -> Iterator[tuple[int, Removed] | beam.pvalue.TaggedOutput]:
    batch = KeyBatch.concat(list(shard_batches[1]))
    removed, kept = find_exact_duplicates(batch.words, batch.file_index, batch.position,
                                          keep, batch.rank)
    yield from removed_by_file(batch, removed, kept, "exact", np.zeros(len(removed)))
    files, counts = np.unique(batch.file_index, return_counts=True)
    for f, c in zip(files.tolist(), counts.tolist(), strict=True):
        yield beam.pvalue.TaggedOutput(SEEN, (f, c))


class Exact(beam.PTransform):
    """(shard, KeyBatch) -> {"removed": (file_index, Removed), SEEN: (file_index, rows)}.

    SEEN counts the rows of each file that reached the grouping, so Decide can prove
    that no record skipped the duplicate check."""

    def __init__(self, keep: str):
        super().__init__()
        self.keep = keep

    def expand(self, keyed):
        out = (keyed
               | "GroupByDigestShard" >> beam.GroupByKey()
               | "FindExactDuplicates" >> beam.FlatMap(exact_in_shard, self.keep)
               .with_outputs(SEEN, main="removed"))
        return {"removed": out.removed, SEEN: out[SEEN]}
