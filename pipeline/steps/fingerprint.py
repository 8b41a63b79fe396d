"""Fingerprint: chunk of rows -> (shard, KeyBatch) per digest shard (+ VecBatch for Near).

The digests come from the core kernel (``transforms.fingerprint.fingerprint_batch``,
one call per chunk). Splitting each chunk by shard keeps the shuffle at
chunks x shards elements instead of one element per record. Reference-set chunks
go the same way, marked as protected rows. Tensors stop here,
except when the near stage is on: then the chunk's finite rows also go on as one
VecBatch, with the same digests (hashed once).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import apache_beam as beam
import numpy as np

from pipeline.steps.elements import (
    FACTS,
    KEYS,
    REFERENCE_FILES,
    VECTORS,
    KeyBatch,
    ReadFacts,
    SetBatch,
    VecBatch,
)
from pipeline.steps.tagged import SplitOutputs
from transforms.exact import NEW, REFERENCE, Keep, digest_words, keep_order
from transforms.fingerprint import fingerprint_batch
from transforms.io.formats.base import Chunk, arrow_ids
from transforms.near.sets import Shingles, blank_reason, blank_rows, record_sets, unit_refusal
from transforms.near.space import finite_rows
from transforms.near.spec import FROM_DATA, unit_for
from transforms.store.segment import range_part


def shard_of(words: np.ndarray, shards: int) -> np.ndarray:
    """Range shards of the digest's top bits: a shard holds one contiguous slice of the
    sorted digest space, so a fingerprint store lookup reads only that slice."""
    return range_part(words[:, 0], shards).astype(np.int64)


def _vectors(batch: KeyBatch, tensors: np.ndarray, keep: str, folder: str) -> VecBatch:
    """The batch's finite rows with their values (spilled to ``folder``) and keep order."""
    x = tensors.reshape(len(batch), -1)
    prio, order = keep_order(batch.file_index, batch.position, keep, batch.rank, batch.tier)
    vec = VecBatch(batch.words, prio, order, batch.file_index, batch.position, batch.ids, x)
    finite = finite_rows(x)
    if not finite.all():  # a copy of the chunk's values: only when rows must go
        vec = vec.take(np.flatnonzero(finite))
    return vec.spill(folder)


def _sets(batch: KeyBatch, values: np.ndarray, keep: str, shingles: Shingles) -> SetBatch:
    """The batch's shingle sets (its records all have some: ``set_rows``)."""
    prio, order = keep_order(batch.file_index, batch.position, keep, batch.rank, batch.tier)
    return SetBatch(batch.words, prio, order, batch.file_index, batch.position, batch.ids,
                    record_sets(values, shingles), unit=shingles.unit)


def set_rows(chunk: Chunk, shingles: Shingles, infer: bool
             ) -> tuple[Shingles, np.ndarray, str]:
    """The chunk's unit (``infer``: from its records, ``unit_for``), its rows with
    no set of it (bool) and why: all of them when they are of the other kind (texts for
    unit token...), else the blank ones, invalid as the job's read reports them (a set
    of nothing is no record to compare; they were kept, their repeats removed as exact)."""
    first = next((v for v in chunk.tensors if v is not None), None)
    sh = replace(shingles, unit=unit_for(isinstance(first, str))) if infer else shingles
    refused = unit_refusal(chunk.tensors, sh)
    if not refused:
        try:
            return sh, blank_rows(chunk.tensors, sh), blank_reason(sh.unit)
        except TypeError as e:  # floats for unit token
            refused = str(e)
    return sh, np.ones(len(chunk.positions), bool), refused


def chunk_vectors(chunk: Chunk, keep: str, folder: str) -> VecBatch:
    """A chunk's finite rows as a VecBatch, values spilled to ``folder``: what the near
    stage reads (Fingerprint's VECTORS output, or embedded chunks after exact dedup)."""
    return _vectors(_keys(chunk, keep), chunk.tensors, keep, folder)


def _keys(chunk: Chunk, keep: str) -> KeyBatch:
    """A chunk's digests and order keys; reference files' rows are protected."""
    digests = chunk.digests  # given for decoded values (full-resolution pixels, raw bytes)
    words = digest_words(fingerprint_batch(chunk.tensors) if digests is None else digests)
    n = len(words)
    file_index = np.full(n, chunk.file_index, dtype=np.int32)  # < 2**23 (keep_order)
    is_ref = chunk.file_index >= REFERENCE_FILES
    tier = np.full(n, REFERENCE if is_ref else NEW, np.int8)
    rank = chunk.rank
    if rank is None and keep in ("max", "min"):  # reference files need no keep-by column
        rank = np.full(n, np.nan)
    return KeyBatch(words, file_index, chunk.positions, arrow_ids(chunk.ids), rank, tier)


def shard_keys(chunk: Chunk, shards: int, keep: str, near: str | None = None,
               sets: Shingles | None = None, infer: bool = False
               ) -> Iterator[tuple[int, KeyBatch] | beam.pvalue.TaggedOutput]:
    """``near``: a folder; a VecBatch of the chunk's finite rows, its values spilled
    there, also goes to the VECTORS output; ``sets``: the chunk's shingle sets go there
    instead (a SetBatch, its sets spilled there too). Reference files' rows are protected."""
    if sets is not None:
        sets, bad, reason = set_rows(chunk, sets, infer)
        if bad.any():  # invalid: to FACTS, as the read's invalid records
            known = {r.position for r in chunk.invalid}  # (the read reported those)
            chunk = chunk.reported_invalid(bad, reason)
            yield beam.pvalue.TaggedOutput(FACTS, (chunk.file_index, ReadFacts(
                0, [r for r in chunk.invalid if r.position not in known])))
            if not len(chunk.positions):
                return
    batch = _keys(chunk, keep)
    if sets is not None:  # (spilled to ``near``, the folder, as values are)
        yield beam.pvalue.TaggedOutput(VECTORS, _sets(batch, chunk.tensors, keep, sets)
                                       .spill(near))
    elif near:
        yield beam.pvalue.TaggedOutput(VECTORS, _vectors(batch, chunk.tensors, keep, near))
    shard = shard_of(batch.words, shards)
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(shards + 1))
    for s in range(shards):
        if bounds[s + 1] > bounds[s]:
            yield s, batch.take(order[bounds[s]:bounds[s + 1]])


class Fingerprint(beam.PTransform):
    """Chunk -> {KEYS: (shard, KeyBatch), VECTORS: VecBatch (only with ``spill``), FACTS
    (with ``sets``)}.

    Args:
      keep: the keep policy (it orders the near stage's rows).
      shards: digest-range shards of the exact stage's group-by.
      spill: a folder (any filesystem) for the near stage's values; the VecBatches
        carry references to files there. None: no VECTORS output.
      sets: jaccard: VECTORS carries each chunk's shingle sets (SetBatch, spilled to
        ``spill``) instead; records with no set (blank, or of the other kind than an
        explicit unit) go to FACTS as (file_index, ReadFacts) of invalid records.
    """

    def __init__(self, *, keep: Keep | str = "first", shards: int = 16, spill: str | None = None,
                 sets: Shingles | None = None):
        super().__init__()
        self.shards, self.keep, self.spill, self.sets = shards, Keep.of(keep).rule, spill, sets
        self.infer = sets is FROM_DATA  # NearSpec("jaccard", t): word for texts, token else

    def expand(self, chunks):
        return chunks | "DigestAndShard" >> SplitOutputs(
            shard_keys, self.shards, self.keep, self.spill, self.sets, self.infer, main=KEYS,
            tags=(VECTORS, FACTS))
