"""Embed: chunks of raw values -> chunks of embeddings, by the user's model, on workers.

Why a step: text, and pictures that differ by a crop or a flip, have no useful distance
as stored; an embedding model gives them one. The user's model comes as a Beam
``ModelHandler`` (what ``RunInference`` takes): the model is loaded once per worker
process and shared by its threads (Beam's ``Shared``, as ``RunInference`` does; on a GPU
when the handler asks for one), each element is a whole chunk (chunks stay the unit of
work), and the chunk's values reach the model in batches of ``batch_size``. A DoFn of
our own calls it rather than ``RunInference`` itself: a chunk is a batch already, and
``RunInference``'s batching step hands batches out in ``finish_bundle``, which Beam
2.77's DaskRunner drops (chunks lost without an error).

Exact dedup stays on the raw values: an embedded chunk keeps the digests of what was
read (decoded pixels, text bytes), so ``Dedup`` removes exact copies by them, and the
near stage compares the embeddings. Composed by hand (``ReadTensors | Embed | Dedup``),
each distinct raw value of a chunk is embedded once, and copies in other chunks are
embedded again before exact dedup removes them. ``Dedup(embed=EmbedKept(...))`` (the
job's way) runs exact dedup first and embeds only the records it kept: a second read of
the input feeds the model, so no copy reaches it and nothing read is held meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler
from apache_beam.utils import shared

from pipeline import progress
from pipeline.models import SentenceTransformerHandler, text_tokenizer, tokens
from pipeline.steps.elements import CHUNKS
from pipeline.steps.removed import Removed
from transforms.exact import digest_words
from transforms.fingerprint import fingerprint_batch
from transforms.io import fs
from transforms.io.formats.base import Chunk, arrow_ids
from transforms.near.sets import Shingles, blank_rows


def _vector(prediction: Any) -> np.ndarray:
    """One embedding from what a handler returns: a PredictionResult (Beam's handlers),
    a torch or TensorFlow tensor, or an array."""
    value = getattr(prediction, "inference", prediction)
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def embed_chunk(chunk: Chunk, handler: ModelHandler, model: Any, batch_size: int,
                prepare: Callable[[list], Sequence] | None = None) -> Chunk:
    """The chunk with ``tensors`` replaced by float32 (n, d) embeddings; each distinct
    value (by digest) goes to the model once, in order of first appearance."""
    digests = chunk.digests if chunk.digests is not None else fingerprint_batch(chunk.tensors)
    n = len(chunk.positions)
    if n == 0:
        return Chunk(chunk.file_index, chunk.positions, chunk.ids, np.empty((0, 0), np.float32),
                     chunk.rank, chunk.invalid, digests)
    _, first, inverse = np.unique(digest_words(digests), axis=0, return_index=True,
                                  return_inverse=True)
    order = np.argsort(first)
    slot = np.empty(len(first), np.int64)
    slot[order] = np.arange(len(first))
    rows = first[order]
    vectors: list[np.ndarray] = []
    for a in range(0, len(rows), batch_size):
        part = [chunk.tensors[i] for i in rows[a:a + batch_size].tolist()]
        got = [_vector(p) for p in handler.run_inference(prepare(part) if prepare else part,
                                                         model)]
        if len(got) != len(part):
            raise ValueError(f"the model returned {len(got)} embeddings for {len(part)} values")
        vectors += got
    emb = np.stack(vectors)[slot[inverse.reshape(-1)]]
    return Chunk(chunk.file_index, chunk.positions, chunk.ids, emb, chunk.rank, chunk.invalid,
                 digests)


class ChunkModel(ModelHandler):
    """A ModelHandler over whole chunks, around the user's handler (Beam's PyTorch,
    TensorFlow or scikit-learn handlers, ``SentenceTransformerHandler``, your own): each
    chunk is one batch (also under ``RunInference``), and this one batches its values."""

    def __init__(self, handler: ModelHandler, batch_size: int,
                 prepare: Callable[[list], Sequence] | None = None) -> None:
        super().__init__()
        self.handler, self.batch_size, self.prepare = handler, batch_size, prepare

    def load_model(self) -> Any:
        return self.handler.load_model()

    def run_inference(self, batch: Sequence[Chunk], model: Any,
                      inference_args: dict | None = None) -> Iterable[Chunk]:
        return [embed_chunk(c, self.handler, model, self.batch_size, self.prepare)
                for c in batch]

    def batch_elements_kwargs(self) -> dict:
        return {"min_batch_size": 1, "max_batch_size": 1}  # a chunk is a batch already

    def get_num_bytes(self, batch: Sequence[Chunk]) -> int:
        return sum(getattr(c.tensors, "nbytes", 0) for c in batch)  # no pickling to measure

    def get_metrics_namespace(self) -> str:
        return "tensordedup_embed"

    def share_model_across_processes(self) -> bool:
        return self.handler.share_model_across_processes()

    def get_resource_hints(self) -> dict:
        return self.handler.get_resource_hints()


class _Loaded:
    """The loaded model, in a holder Beam's ``Shared`` can keep a weak reference to."""

    def __init__(self, model: Any) -> None:
        self.model = model


class EmbedChunks(beam.DoFn):
    """Chunk -> the chunk embedded by ``ChunkModel``: the model loaded once per process."""

    def __init__(self, model: ChunkModel) -> None:
        self.model, self.shared = model, shared.Shared()
        self.records = Metrics.counter("tensordedup", "records_embedded")

    def setup(self) -> None:
        self.loaded = self.shared.acquire(lambda: _Loaded(self.model.load_model()))

    def process(self, chunk: Chunk) -> Iterator[Chunk]:
        progress.tick("embed", 0, 0, "chunks", units=0)  # starts the stage's clock
        out = self.model.run_inference([chunk], self.loaded.model)
        self.records.inc(len(chunk.positions))
        progress.tick("embed", 0, len(chunk.positions), "chunks")  # records/s of the model
        yield from out


def embeddings_table(chunk: Chunk) -> pa.Table:
    """record_id, file, row and embedding (fixed-size list of float32) of a chunk."""
    emb = np.ascontiguousarray(chunk.tensors, np.float32)
    n, d = emb.shape if emb.ndim == 2 else (len(emb), 0)
    return pa.table({
        "record_id": arrow_ids(chunk.ids),
        "file": pa.array(np.full(n, chunk.file_index, np.int32)),
        "row": pa.array(chunk.positions.astype(np.int64)),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d)})


def write_embeddings(chunk: Chunk, folder: str) -> Chunk:
    """The chunk, once its embeddings are written: one Parquet file per chunk, named by
    its file index and first row (reruns write the same names and bytes). In the chunks'
    path, not a branch of its own: Beam 2.77's DaskRunner runs only what the last step
    depends on."""
    if len(chunk.positions):
        name = f"part-{chunk.file_index:07d}-{int(chunk.positions[0]):012d}.parquet"
        with fs.local_dir_for(folder) as local:
            pq.write_table(embeddings_table(chunk), os.path.join(local, name))
    return chunk


class Embed(beam.PTransform):
    """Chunks (or ``ReadTensors``' dict) -> the same with each chunk's tensors replaced by
    the model's embeddings (float32, one row per record); digests stay those of the raw
    values, so exact dedup downstream compares what was read.

    Args:
      handler: a Beam ``ModelHandler`` whose ``run_inference(values, model)`` returns one
        embedding per value: values are a list of a chunk's records (``str`` for
        ``decode: text``, uint8 (h, w, c) arrays for images, arrays otherwise), after
        ``prepare``.
      batch_size: values per model call.
      prepare: optional function from a list of values to what the handler takes (e.g.
        ``torch.as_tensor`` of each for Beam's PyTorch handler).
      write_to: a folder (any filesystem) for the embeddings as Parquet (record_id, file,
        row, embedding), one file per chunk; None: not written.
    """

    def __init__(self, handler: ModelHandler, *, batch_size: int = 64,
                 prepare: Callable[[list], Sequence] | None = None,
                 write_to: str | None = None) -> None:
        super().__init__()
        self.model = ChunkModel(handler, batch_size, prepare)
        self.write_to = write_to

    def expand(self, pvalue):
        chunks = pvalue[CHUNKS] if isinstance(pvalue, dict) else pvalue
        run, hints = beam.ParDo(EmbedChunks(self.model)), self.model.get_resource_hints()
        embedded = chunks | "RunModel" >> (run.with_resource_hints(**hints) if hints else run)
        if self.write_to is not None:
            embedded = embedded | "WriteEmbeddings" >> beam.Map(write_embeddings, self.write_to)
        return {**pvalue, CHUNKS: embedded} if isinstance(pvalue, dict) else embedded


def without_rows(chunk: Chunk, gone: dict[int, np.ndarray]) -> Iterator[Chunk]:
    """The chunk without the rows at positions ``gone[file_index]`` (sorted), and without
    its invalid records (the first read reported them); nothing when no row is left."""
    drop = gone.get(chunk.file_index)
    if drop is None or not len(drop):
        yield chunk if not chunk.invalid else chunk.take(np.arange(len(chunk.positions)))
        return
    at = np.minimum(np.searchsorted(drop, chunk.positions), len(drop) - 1)
    left = np.flatnonzero(drop[at] != chunk.positions)
    if len(left):
        yield chunk.take(left)


def _positions(file_removed: tuple[int, Removed]) -> tuple[int, np.ndarray]:
    return file_removed[0], file_removed[1].position


def _sorted(file_parts: tuple[int, Iterable[np.ndarray]]) -> tuple[int, np.ndarray]:
    return file_parts[0], np.sort(np.concatenate(list(file_parts[1])))


BLANK = Shingles("word", normalize=False)  # no word between (Unicode) whitespace: blank


class LongTexts:
    """``embed.long`` where records are read (``ReadTensors(long_texts=...)``): blank
    texts are reported invalid (nothing to embed); the texts longer than the model takes
    are counted (``ReadFacts.long``, summary.json's
    ``embed.long_records``) and, with ``refuse``, reported invalid, so exact dedup, the
    model and the clean copy never see them and ``on_invalid`` and
    ``max_invalid_fraction`` apply. A read-time check: tokens, not the model's forward
    pass (a 100,000-character text: about 50 ms)."""

    def __init__(self, handler: SentenceTransformerHandler, max_seq_length: int) -> None:
        self.handler, self.max_seq_length = handler, max_seq_length

    def __call__(self, chunk: Chunk) -> tuple[Chunk, int]:
        """The chunk (with ``refuse``, less its long texts, now invalid) and how many of its
        texts are longer than the model takes."""
        values = chunk.tensors
        if not len(values) or not isinstance(values[0], str):
            return chunk, 0
        chunk = chunk.reported_invalid(  # a model embeds "" too: all blanks would be "near"
            blank_rows(values, BLANK), "a blank text (empty or whitespace only): nothing to "
            "embed")
        values = chunk.tensors
        if not len(values):
            return chunk, 0
        text = text_tokenizer(self.handler.load_model())
        if text is None:
            return chunk, 0
        counts = np.fromiter((len(e.ids) for e in tokens(text[0], list(values))), np.int64,
                             len(values))
        long = counts > text[1]
        if self.handler.long == "refuse":
            chunk = chunk.reported_invalid(
                long, f"text longer than the model's max_seq_length {self.max_seq_length} "
                "(embed.long: refuse; chunks embeds it in windows of that length, truncate "
                "cuts it there)")
        return chunk, int(long.sum())


class LongRecords(beam.PTransform):
    """(file_index, ReadFacts) of the input -> summary.json's ``embed`` section, one dict:
    ``long`` (the setting), ``max_seq_length`` and ``long_records`` (how many records read
    were longer)."""

    def __init__(self, check: LongTexts) -> None:
        super().__init__()
        self.section = {"long": check.handler.long, "max_seq_length": check.max_seq_length}

    def expand(self, facts):
        return (facts
                | "Long" >> beam.Map(lambda file_facts: file_facts[1].long)
                | "Sum" >> beam.CombineGlobally(sum)
                | "Section" >> beam.Map(lambda n, section: {**section, "long_records": n},
                                        self.section))


class EmbedKept(beam.PTransform):
    """(file_index, Removed) of exact dedup -> embedded chunks of the records it kept.

    ``Dedup(embed=EmbedKept(...))`` applies it: ``source`` reads the input again (the
    same ``ReadTensors`` as the first read; nothing is held between the two reads), the
    rows exact dedup removed are dropped, and ``model`` embeds the rest, so each distinct
    raw value reaches the model once across the whole input. The removed positions are a
    side input: 8 bytes per removed record on each worker.

    Args:
      model: the ``Embed`` step (handler, batch size, where embeddings are written).
      source: a ``ReadTensors`` of the same files and settings as the first read.
    """

    def __init__(self, model: Embed, *, source: beam.PTransform):
        super().__init__()
        self.model, self.source = model, source

    def expand(self, removed):
        gone = beam.pvalue.AsDict(removed
                                  | "RemovedPositions" >> beam.Map(_positions)
                                  | "ByFile" >> beam.GroupByKey()
                                  | "Sorted" >> beam.Map(_sorted))
        again = removed.pipeline | "ReadAgain" >> self.source
        return (again[CHUNKS]
                | "SkipExactCopies" >> beam.FlatMap(without_rows, gone)
                | "Embed" >> self.model)
