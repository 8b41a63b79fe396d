"""Exact: (shard, KeyBatch) -> (file_index, Removed) for every exact duplicate.

One GroupByKey on the digest shard brings all rows with the same digest together
(this run's, a reference set's, and, with a fingerprint store, the stored records
with those digests); the grouping and the keep policy are the plain kernel
``transforms.exact.find_exact_duplicates``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np

from pipeline.steps.elements import REMOVED, SEEN, SURVIVORS, KeyBatch
from pipeline.steps.removed import Removed, removed_by_file
from pipeline.steps.store import StoreView
from pipeline.steps.tagged import SplitOutputs
from transforms.exact import NEW, Keep, find_exact_duplicates


def exact_in_shard(shard_batches: tuple[int, Iterable[KeyBatch]], keep: str,
                   store: StoreView | None = None, survivors: bool = False
                   ) -> Iterator[tuple[int, Removed] | beam.pvalue.TaggedOutput]:
    """One digest shard: this run's rows (and reference rows) plus, with a store, the
    stored records with the same digests; protected rows are never removed."""
    batch = KeyBatch.concat(list(shard_batches[1]))
    if store is not None:
        batch = KeyBatch.concat([batch, store.matching(batch, keep)])
    tier = np.zeros(len(batch), np.int8) if batch.tier is None else batch.tier
    removed, kept = find_exact_duplicates(batch.words, batch.file_index, batch.position,
                                          keep, batch.rank, tier)
    yield from removed_by_file(batch, removed, kept, "exact", np.zeros(len(removed)),
                               tier[kept])
    new = tier == NEW
    files, counts = np.unique(batch.file_index[new], return_counts=True)
    for f, c in zip(files.tolist(), counts.tolist(), strict=True):
        yield beam.pvalue.TaggedOutput(SEEN, (f, c))
    if survivors:
        left = new.copy()
        left[removed] = False
        yield beam.pvalue.TaggedOutput(SURVIVORS, (shard_batches[0], batch.take(
            np.flatnonzero(left))))


class DedupExact(beam.PTransform):
    """(shard, KeyBatch) -> {REMOVED: (file_index, Removed), SEEN: (file_index, rows),
    SURVIVORS: (shard, KeyBatch of this run's rows exact dedup kept)}.

    SEEN counts the rows of each input file that reached the grouping, so Decide can
    prove that no record skipped the duplicate check. SURVIVORS feed a store update.

    Args:
      keep: the keep policy.
      store: earlier runs' digests (a fingerprint store's view), looked up per shard.
      survivors: emit SURVIVORS.
    """

    def __init__(self, *, keep: Keep | str = "first", store: StoreView | None = None,
                 survivors: bool = False):
        super().__init__()
        self.keep, self.store, self.survivors = Keep.of(keep).rule, store, survivors

    def expand(self, keyed):
        return (keyed
                | "GroupByDigestShard" >> beam.GroupByKey()
                | "FindExactDuplicates" >> SplitOutputs(exact_in_shard, self.keep, self.store,
                                                        self.survivors, main=REMOVED,
                                                        tags=(SEEN, SURVIVORS)))
