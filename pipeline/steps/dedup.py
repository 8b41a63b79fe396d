"""Dedup: the whole removal in one step: Fingerprint -> DedupExact -> DedupNear -> Decide.

Two inputs, one step. Over ``ReadTensors``' outputs it decides, per input file, which
records a clean copy drops (``WriteClean`` writes it): that is the job's use. Over a
PCollection of the user's own records (dicts, or Arrow record batches) it returns the
records kept, the ones removed (with what each duplicates) and the invalid ones.
"""

from __future__ import annotations

import apache_beam as beam

from pipeline.steps.decide import Decide
from pipeline.steps.elements import (
    CHUNKS,
    DECISIONS,
    EMBEDDED,
    FACTS,
    FILES,
    KEYS,
    NEAR_REPORT,
    REMOVED,
    SEEN,
    SURVIVORS,
    VECTORS,
)
from pipeline.steps.exact import DedupExact
from pipeline.steps.fingerprint import Fingerprint, chunk_vectors
from pipeline.steps.near import DedupNear
from pipeline.steps.near_sets import DedupNearSets
from pipeline.steps.records import FromDecisions, ToChunks
from pipeline.steps.store import StoreVectors, StoreView
from transforms.exact import Keep
from transforms.io import fs, layout
from transforms.io.formats.base import TensorSpec
from transforms.near.spec import NearSpec


class Dedup(beam.PTransform):
    """Exact (and, with ``near``, near-duplicate) removal.

    Over ``ReadTensors``' output dict: returns {DECISIONS: FileDecision per input file,
    NEAR_REPORT (with ``near``), SURVIVORS and VECTORS (with ``survivors``)}.
    Over records (``key`` names the tensor field): returns {KEPT: the records kept,
    REMOVED: {"record_id", "duplicate_of", "kind", "distance", "record"} dicts,
    INVALID: {"record_id", "reason", "record"} dicts, NEAR_REPORT (with ``near``)}.

    Args:
      key: records only: the field holding the tensor (anything ``to_numpy`` takes:
        numpy, lists, torch, TensorFlow, JAX); records whose tensor is missing or not
        numeric go to INVALID. With ``near`` jaccard: texts (str) or integer sequences;
        records with nothing to compare (blank) go to INVALID, as the job reports them.
      id: records only: the field holding a record id (default: "batch-<i>:<row>").
      shape: records only: the tensor shape to compare (the job's ``input.shape``);
        records of other shapes go to INVALID. Without it, near search over records of
        several sizes stops the pipeline, naming this setting.
      keep: "first" | "last" | ``Keep``. A PCollection has no order: over records, first
        and last keep one copy, not a particular one; ``Keep.max(field)`` chooses.
      near: near-duplicate search settings; None: exact duplicates only.
      exact: False skips both (the job's ``exact: false``): nothing is removed.
      reference: chunks of a reference set (``ReadTensors(..., reference=True)``): their
        records are never removed; copies of them are.
      store: a fingerprint store's view: earlier runs' records count as references.
      survivors: also return SURVIVORS (and VECTORS) for ``StoreUpdate``.
      spill: a folder every worker can reach for the near stage's vectors (default: a
        new folder under the local temp directory, fine for local runners, removed at
        the latest when this process exits); deleted
        after the search unless ``survivors`` (a store update still reads them) or
        ``keep_spill`` (left to the job's Publish: Dask recomputes a lost worker's
        finished steps, which read them again). ``carry_rows``: the near cells' rows
        travel through the runner's shuffle instead (``DedupNear``; for Dataflow).
      shards, borderline_pairs, chunk_rows: tuning (digest shards, report pairs, records
        per element over records).
      removals: a folder every worker can reach where large removal lists wait for the
        copy and the report (``Removed.spill``); the job's Publish deletes it, in your
        own pipeline delete it once the pipeline has finished. None: they travel through
        the runner.
      embed: ``EmbedKept(Embed(handler), source=ReadTensors(...))``: the near stage
        compares embeddings of the records exact dedup kept, made after it (no exact copy
        reaches the model); ``reference`` chunks must be embedded already. Over
        ``ReadTensors``' output only.
    """

    def __init__(self, *, key: str | None = None, id: str | None = None,
                 keep: Keep | str = "first", near: NearSpec | None = None, exact: bool = True,
                 reference: beam.PCollection | None = None, store: StoreView | None = None,
                 survivors: bool = False, spill: str | None = None, shards: int = 16,
                 borderline_pairs: int = 500, chunk_rows: int = 4096, keep_spill: bool = False,
                 carry_rows: bool = False, embed: beam.PTransform | None = None,
                 removals: str | None = None, shape: tuple[int, ...] | None = None):
        super().__init__()
        self.key, self.id, self.keep, self.near = key, id, Keep.of(keep), near
        self.shape = None if shape is None else tuple(shape)
        self.exact, self.reference, self.store = exact, reference, store
        self.survivors = survivors
        self.spill = spill or layout.library_spill()
        self.shards, self.borderline_pairs, self.chunk_rows = shards, borderline_pairs, chunk_rows
        self.keep_spill, self.embed, self.removals = keep_spill, embed, removals
        self.carry_rows = carry_rows

    def expand(self, pvalue):
        if isinstance(pvalue, dict):
            return self._decide(pvalue)
        if self.key is None:
            raise ValueError("Dedup over records needs key= (the field with the tensor)")
        if self.embed is not None:
            raise ValueError("Dedup(embed=...) reads its input again: apply it to "
                             "ReadTensors' output, not to records")
        spec = TensorSpec(self.key, self.id, shape=self.shape, rank=self.keep.column)
        texts = self.near is not None and self.near.is_sets
        read = pvalue | "ToChunks" >> ToChunks(spec, self.chunk_rows, texts=texts)
        out = self._decide(read)
        kept = ({"batches": read["batches"], DECISIONS: out[DECISIONS]}
                | "FromDecisions" >> FromDecisions())
        if NEAR_REPORT in out:
            kept[NEAR_REPORT] = out[NEAR_REPORT]
        return kept

    def _decide(self, read: dict) -> dict:
        chunks = read[CHUNKS]
        if self.reference is not None:
            chunks = (chunks, self.reference) | "WithReference" >> beam.Flatten()
        streams = {FILES: read[FILES], FACTS: read[FACTS]}
        out = {}
        if not self.exact:
            chunks | "DiscardChunks" >> beam.Filter(lambda _: False)
            out[DECISIONS] = streams | "Decide" >> Decide(self.removals)
            return out
        values = layout.spill_values(self.spill)
        sets = self.near is not None and self.near.is_sets
        if sets and self.embed is not None:
            raise ValueError("near metric jaccard compares shingle sets: no embed with it "
                             "(docs/text.md)")
        keys = chunks | "Fingerprint" >> Fingerprint(
            keep=self.keep, shards=self.shards,
            spill=values if self.near and self.embed is None else None,
            sets=self.near.shingles if sets else None)
        if sets:  # records with no set (blank, or not of the unit's kind): invalid
            streams[FACTS] = (read[FACTS], keys[FACTS]) | "WithSetFacts" >> beam.Flatten()
        exact = keys[KEYS] | "DedupExact" >> DedupExact(
            keep=self.keep, store=self.store, survivors=self.survivors)
        streams.update({"exact": self._spilled(exact[REMOVED], "Exact"), SEEN: exact[SEEN]})
        if self.survivors:
            out[SURVIVORS] = exact[SURVIVORS]
        if self.embed is not None:
            embedded = streams["exact"] | "EmbedKept" >> self.embed
            streams[EMBEDDED] = embedded | "CountEmbedded" >> beam.Map(
                lambda c: (c.file_index, len(c.positions)))
            if self.reference is not None:
                embedded = (embedded, self.reference) | "WithEmbeddedReference" >> beam.Flatten()
            if self.near is not None:
                vectors = embedded | "EmbeddedVectors" >> beam.Map(
                    chunk_vectors, self.keep.rule, values)
        elif self.near is not None:
            vectors = keys[VECTORS]
        if self.near is not None:
            if self.survivors:
                out[VECTORS] = vectors
            if self.store is not None:
                stored = vectors.pipeline | "ReadStore" >> StoreVectors(
                    self.store, keep=self.keep, spill=values if sets else None)
                vectors = (vectors, stored) | "WithStored" >> beam.Flatten()
            near = vectors | "DedupNear" >> (DedupNearSets(
                self.near, borderline_pairs=self.borderline_pairs) if sets else DedupNear(
                self.near, spill=layout.spill_cells(self.spill),
                borderline_pairs=self.borderline_pairs, keep_spill=self.keep_spill,
                carry_rows=self.carry_rows))
            streams["near"] = self._spilled(near[REMOVED], "Near")
            out[NEAR_REPORT] = near[NEAR_REPORT]
            if not (self.survivors or self.keep_spill):  # no reader after the search
                out[NEAR_REPORT] = out[NEAR_REPORT] | "DropSpill" >> beam.Map(
                    lambda report, spill: (fs.delete_tree(spill), report)[1], self.spill)
        out[DECISIONS] = streams | "Decide" >> Decide(self.removals)
        return out

    def _spilled(self, removed: beam.PCollection, name: str) -> beam.PCollection:
        """(file_index, Removed), large ones as stand-ins for their file (written in the
        step that made them: only the file's name leaves it)."""
        if self.removals is None:
            return removed
        return removed | f"Spill{name}Removals" >> beam.Map(
            lambda fr, folder: (fr[0], fr[1].spill(folder)), self.removals)
