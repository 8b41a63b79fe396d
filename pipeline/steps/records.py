"""A user's records (dicts or Arrow record batches) <-> the chunks the dedup steps use.

Why batches get small numbers: the keep order packs (file index, position) into one
int64 (``transforms.exact.keep_order``), so each batch of records gets a dense index,
as a file would, from the sorted random ids of all batches (a small side input).
Records travel once more, to meet their batch's decision; tensors never do.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline.steps.elements import (
    CHUNKS,
    DECISIONS,
    FACTS,
    FILES,
    INVALID,
    KEPT,
    REMOVED,
    FileDecision,
    ReadFacts,
    digest_hex,
    group_roots,
    where_key,
)
from pipeline.steps.tagged import SplitOutputs
from transforms.canonical import to_numpy
from transforms.io.formats.base import Chunk, Decode, InvalidRecord, TensorSpec, error_line
from transforms.io.formats.encoded import decode_value
from transforms.io.formats.parquet import table_chunks

Records = list[Mapping[str, Any]] | pa.RecordBatch


@dataclass
class Batch:
    """Some of the user's records, as they came: dicts, or one Arrow record batch."""

    uid: int
    records: Records

    def __len__(self) -> int:
        return self.records.num_rows if isinstance(self.records, pa.RecordBatch) \
            else len(self.records)


def batches_of(elements: list) -> Iterator[Batch]:
    """BatchElements' lists -> Batches: dicts stay together, record batches stand alone."""
    dicts = [e for e in elements if not isinstance(e, pa.RecordBatch)]
    if dicts:
        yield Batch(secrets.randbits(63), dicts)
    for e in elements:
        if isinstance(e, pa.RecordBatch) and e.num_rows:
            yield Batch(secrets.randbits(63), e)


def _path(index: int) -> str:
    return f"batch-{index}"


TEXT = TensorSpec("text", decode=Decode("text"))  # a str value as ReadTensors decodes texts


def dict_chunks(index: int, records: list[Mapping[str, Any]], spec: TensorSpec,
                texts: bool = False) -> list[Chunk]:
    """Chunks (one per tensor shape and dtype) of a list of dicts, and the records that
    hold no usable tensor (as invalid, with the reason). ``texts`` (jaccard): str values
    are texts, one chunk of them, with the digests of their UTF-8 bytes, as read."""
    groups: dict[tuple, list[tuple[int, str, np.ndarray]]] = {}
    invalid, ranks = [], np.full(len(records), np.nan)
    digests: dict[int, bytes] = {}
    for i, r in enumerate(records):
        rid = str(r[spec.id]) if spec.id is not None and spec.id in r else f"{_path(index)}:{i}"
        try:
            if texts and isinstance(r[spec.tensor], str):
                x, digests[i] = decode_value(r[spec.tensor], TEXT)
                if spec.rank is not None:
                    ranks[i] = float(r[spec.rank])
                groups.setdefault(("text",), []).append((i, rid, x))
                continue
            if r[spec.tensor] is None:  # as the job says of a null value, not "dtype object"
                raise ValueError(f"field {spec.tensor!r}: null")
            x, dtype = to_numpy(r[spec.tensor])
            if spec.shape is not None and tuple(x.shape) != tuple(spec.shape):
                raise ValueError(f"shape {list(x.shape)} != {list(spec.shape)}")
            if spec.dtype is not None and dtype != spec.dtype:
                raise ValueError(f"dtype {dtype} != {spec.dtype}")
            if spec.rank is not None:
                ranks[i] = float(r[spec.rank])
        except (KeyError, TypeError, ValueError) as e:
            invalid.append(InvalidRecord(i, rid, error_line(e)))
            continue
        groups.setdefault((x.shape, dtype), []).append((i, rid, x))
    chunks = []
    for key, rows in groups.items():
        pos = np.array([i for i, _, _ in rows], dtype=np.int64)
        values, sums = np.empty(len(rows), object), None
        if key == ("text",):
            values[:] = [x for _, _, x in rows]
            sums = np.frombuffer(b"".join(digests[i] for i in pos.tolist()), "V16")
        else:
            values = np.stack([x for _, _, x in rows])
        chunks.append(Chunk(index, pos, pa.array([rid for _, rid, _ in rows], pa.string()),
                            values, None if spec.rank is None else ranks[pos], [], sums))
    if invalid or not chunks:
        chunks.append(Chunk.of_invalid(index, invalid))
    return chunks


def to_chunks(numbered: tuple[int, Batch], spec: TensorSpec, texts: bool = False
              ) -> Iterator[Chunk | beam.pvalue.TaggedOutput]:
    index, batch = numbered
    recs = batch.records
    if isinstance(recs, pa.RecordBatch) and texts and _is_text(recs, spec.tensor):
        recs = recs.to_pylist()  # a text column: its values as str (``dict_chunks``)
    chunks = (table_chunks(index, _path(index), pa.Table.from_batches([recs]), 0, spec)
              if isinstance(recs, pa.RecordBatch) else dict_chunks(index, recs, spec, texts))
    for chunk in chunks:
        yield beam.pvalue.TaggedOutput(FACTS, (index, ReadFacts(chunk.n_read, chunk.invalid)))
        if len(chunk.positions):
            yield chunk


def _is_text(recs: pa.RecordBatch, column: str) -> bool:
    kind = recs.schema.field(column).type if column in recs.schema.names else pa.null()
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        pa.types.is_string_view(kind)


def _rows(recs: Records, positions: list[int]) -> dict[int, Any]:
    """The records at ``positions`` (a record batch's rows as dicts, in one take)."""
    if isinstance(recs, pa.RecordBatch):
        return dict(zip(positions, recs.take(pa.array(positions, pa.int64())).to_pylist(),
                        strict=True))
    return {i: recs[i] for i in positions}


@dataclass
class Removals:
    """Every removal of the run, a few ints each (where it is, where its survivor is, the
    survivor's digest): what ``split_batch`` needs to name each removal's group."""

    at: np.ndarray  # (n,) where_key of the removed record
    survivor_at: np.ndarray  # (n,) where_key of the record it names (-1: earlier run)
    digest: np.ndarray  # (n, 2) uint64 the named record's digest


def removals_of(decision: FileDecision) -> Iterator[Removals]:
    for r in decision.removed:
        yield Removals(where_key(np.full(len(r), decision.file_index), r.position),
                       where_key(r.survivor_file(), r.survivor_position()), r.survivor_digest())


def all_removals(parts: Iterable[Removals]) -> Removals:
    parts = list(parts)
    if not parts:
        return Removals(np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, 2), np.uint64))
    return Removals(*(np.concatenate([getattr(p, f) for p in parts])
                      for f in ("at", "survivor_at", "digest")))


def resolved(r: Removals) -> Removals:
    """Sorted by ``at``, with ``digest`` replaced by each removal's group root."""
    order = np.argsort(r.at, kind="stable")
    roots = group_roots(r.at, r.survivor_at, r.digest)
    return Removals(r.at[order], r.survivor_at[order], roots[order])


def split_batch(joined: tuple[int, dict[str, Iterable]], removals: Removals | None = None
                ) -> Iterator[Any | beam.pvalue.TaggedOutput]:
    """One batch and its decision -> kept records (main), REMOVED and INVALID dicts.

    A removal's ``group`` is the fingerprint (32 hex digits) of the record its whole group
    keeps: the same for exact and near members (an exact copy of a near-removed record
    belongs to the near survivor's group). ``removals`` (every removal of the run, sorted,
    groups resolved: ``resolved``) is how that is followed across batches."""
    _, parts = joined
    (batch,), (decision,) = list(parts["batch"]), list(parts[DECISIONS])
    decision: FileDecision
    recs = batch.records
    rows = _rows(recs, [p for r in decision.removed for p in r.position.tolist()]
                 + [bad.position for bad in decision.invalid])
    for r in decision.removed:
        digest = r.survivor_digest()
        if removals is not None and len(removals.at):  # sorted by at, digests resolved
            slot = np.searchsorted(removals.at, where_key(np.full(len(r), decision.file_index),
                                                          r.position))
            digest = removals.digest[np.minimum(slot, len(removals.at) - 1)]
        groups = digest_hex(digest).to_pylist()
        for j, pos in enumerate(r.position.tolist()):
            yield beam.pvalue.TaggedOutput(REMOVED, {
                "record_id": r.record_id[j].as_py(), "duplicate_of": r.duplicate_of[j].as_py(),
                "kind": r.kind, "distance": float(r.distance[j]), "group": groups[j],
                "record": rows[pos]})
    for bad in decision.invalid:
        yield beam.pvalue.TaggedOutput(INVALID, {"record_id": bad.record_id, "reason": bad.reason,
                                                 "record": rows[bad.position]})
    keep = np.ones(len(batch), dtype=bool)
    keep[decision.drop()] = False
    if isinstance(recs, pa.RecordBatch):
        if keep.any():
            yield recs.filter(pa.array(keep))
    else:
        yield from (recs[i] for i in np.flatnonzero(keep).tolist())


class ToChunks(beam.PTransform):
    """Records -> {CHUNKS, FACTS, FILES} as ``ReadTensors`` gives them, plus "batches":
    (index, Batch) for ``FromDecisions``."""

    def __init__(self, spec: TensorSpec, chunk_rows: int, texts: bool = False):
        super().__init__()
        self.spec, self.chunk_rows, self.texts = spec, chunk_rows, texts

    def expand(self, records):
        batches = (records
                   | "Batch" >> beam.BatchElements(min_batch_size=1,
                                                   max_batch_size=self.chunk_rows)
                   | "AsBatches" >> beam.FlatMap(batches_of))
        index = beam.pvalue.AsSingleton(
            batches
            | "BatchIds" >> beam.Map(lambda b: b.uid)
            | "AllIds" >> beam.combiners.ToList()
            | "Number" >> beam.Map(lambda ids: {u: i for i, u in enumerate(sorted(ids))}))
        numbered = batches | "Numbered" >> beam.Map(lambda b, ix: (ix[b.uid], b), index)
        out = numbered | "ToChunks" >> SplitOutputs(to_chunks, self.spec, self.texts, main=CHUNKS,
                                                    tags=(FACTS,), types={CHUNKS: Chunk})
        files = numbered | "Names" >> beam.Map(lambda kv: (kv[0], _path(kv[0])))
        return {CHUNKS: out[CHUNKS], FACTS: out[FACTS], FILES: files, "batches": numbered}


class FromDecisions(beam.PTransform):
    """{"batches": (index, Batch), DECISIONS: FileDecision} -> {KEPT: records, REMOVED:
    dicts, INVALID: dicts} (each removal and invalid record carries the record itself)."""

    def expand(self, streams: dict):
        decisions = streams[DECISIONS] | "ByBatch" >> beam.Map(lambda d: (d.file_index, d))
        removals = beam.pvalue.AsSingleton(
            streams[DECISIONS]
            | "Removals" >> beam.FlatMap(removals_of)
            | "AllRemovals" >> beam.CombineGlobally(all_removals)
            | "Groups" >> beam.Map(resolved))
        out = ({"batch": streams["batches"], DECISIONS: decisions}
               | "JoinDecisions" >> beam.CoGroupByKey()
               | "Split" >> SplitOutputs(split_batch, removals, main=KEPT,
                                         tags=(REMOVED, INVALID)))
        return {KEPT: out[KEPT], REMOVED: out[REMOVED], INVALID: out[INVALID]}
