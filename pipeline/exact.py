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
import pyarrow as pa

from pipeline.elements import KeyBatch, Removed, VecBatch
from pipeline.store import StoreView
from pipeline.tagged import SplitOutputs
from transforms.exact import NEW, REFERENCE, STORE, find_exact_duplicates

SEEN = "seen"
SURVIVORS = "survivors"
TIER_PREFIX = {NEW: "", STORE: "store_", REFERENCE: "reference_"}


def removed_by_file(batch: KeyBatch | VecBatch, removed: np.ndarray, kept: np.ndarray,
                    kind: str, distance: np.ndarray, kept_tier: np.ndarray | None = None
                    ) -> Iterator[tuple[int, Removed]]:
    """Split removals (sorted by input order) into one ``Removed`` per input file and kind;
    ``kept_tier`` (tier of each removal's survivor) names the kind: ``kind``,
    ``store_<kind>`` or ``reference_<kind>``."""
    if kept_tier is None:
        kept_tier = np.zeros(len(removed), np.int8)
    for tier in np.unique(kept_tier).tolist():
        mine = np.flatnonzero(kept_tier == tier)
        files = batch.file_index[removed[mine]]
        cuts = np.flatnonzero(np.diff(files)) + 1
        for part in np.split(mine, cuts):
            if len(part):
                r, k = pa.array(removed[part]), pa.array(kept[part])
                yield int(batch.file_index[removed[part[0]]]), Removed(
                    batch.position[removed[part]], batch.ids.take(r), batch.ids.take(k),
                    TIER_PREFIX[tier] + kind, distance[part],
                    None if batch.run is None else batch.run.take(k))


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


class Exact(beam.PTransform):
    """(shard, KeyBatch) -> {"removed": (file_index, Removed), SEEN: (file_index, rows),
    SURVIVORS: (shard, KeyBatch of this run's rows exact dedup kept)}.

    SEEN counts the rows of each input file that reached the grouping, so Decide can
    prove that no record skipped the duplicate check. SURVIVORS feed the store update."""

    def __init__(self, keep: str, store: StoreView | None = None, survivors: bool = False):
        super().__init__()
        self.keep, self.store, self.survivors = keep, store, survivors

    def expand(self, keyed):
        return (keyed
                | "GroupByDigestShard" >> beam.GroupByKey()
                | "FindExactDuplicates" >> SplitOutputs(exact_in_shard, self.keep, self.store,
                                                        self.survivors, main="removed",
                                                        tags=(SEEN, SURVIVORS)))
