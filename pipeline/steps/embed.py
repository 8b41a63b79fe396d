"""Embed: chunks of raw values -> chunks of embeddings, by the user's model, on workers.

Why a step: text, and pictures that differ by a crop or a flip, have no useful distance
as stored; an embedding model gives them one. Built on Beam's ``RunInference``: the
model is loaded once per worker process and shared by its threads (on a GPU when the
handler asks for one), each element is a whole chunk (chunks stay the unit of work), and
the chunk's values reach the model in batches of ``batch_size``.

Exact dedup stays on the raw values: an embedded chunk keeps the digests of what was
read (decoded pixels, text bytes), so ``Dedup`` removes exact copies by them, and the
near stage compares the embeddings. Inside a chunk each distinct raw value is embedded
once; copies in other chunks are embedded again and then removed as exact copies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.ml.inference.base import ModelHandler, RunInference

from pipeline.steps.elements import CHUNKS
from transforms import fs
from transforms.exact import digest_words
from transforms.fingerprint import fingerprint_batch
from transforms.formats.base import Chunk, arrow_ids


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
    TensorFlow or scikit-learn handlers, ``SentenceTransformerHandler``, your own):
    RunInference batches chunks one at a time and this one batches their values."""

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


def embeddings_table(chunk: Chunk) -> pa.Table:
    """record_id, file, row and embedding (fixed-size list of float32) of a chunk."""
    emb = np.ascontiguousarray(chunk.tensors, np.float32)
    n, d = emb.shape if emb.ndim == 2 else (len(emb), 0)
    return pa.table({
        "record_id": arrow_ids(chunk.ids),
        "file": pa.array(np.full(n, chunk.file_index, np.int32)),
        "row": pa.array(chunk.positions.astype(np.int64)),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d)})


def write_embeddings(chunk: Chunk, folder: str) -> Iterator[str]:
    """One Parquet file per chunk, named by its file index and first row (reruns write
    the same names and bytes)."""
    if not len(chunk.positions):
        return
    name = f"part-{chunk.file_index:07d}-{int(chunk.positions[0]):012d}.parquet"
    with fs.local_dir_for(folder) as local:
        pq.write_table(embeddings_table(chunk), os.path.join(local, name))
    yield name


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
        embedded = chunks | "RunInference" >> RunInference(self.model)
        if self.write_to is not None:
            _ = embedded | "WriteEmbeddings" >> beam.FlatMap(write_embeddings, self.write_to)
        return {**pvalue, CHUNKS: embedded} if isinstance(pvalue, dict) else embedded
