"""Model handlers for ``Embed``, in the style of Beam's (``apache_beam.ml.inference``).

Why our own for sentence-transformers: Beam's ``SentenceTransformerEmbeddings`` is an
``MLTransform`` over dicts of columns, one record per element; ``Embed`` hands a model
a batch of a chunk's values. Beam's PyTorch handler (``PytorchModelHandlerTensor``
with a TorchScript file) is used as it is (``torchscript_handler``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from apache_beam.ml.inference.base import ModelHandler

# Models loaded in this process, by (path, device): the launcher's check that the model
# loads (pipeline.embedding) and the local runner's workers, threads of the same process,
# share one load (all-MiniLM-L6-v2: 1-2 s each). Workers elsewhere load their own.
_LOADED: dict[tuple[str, str], Any] = {}
_LOADING = threading.Lock()
_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # text_tokenizer's


def pick_device(device: str) -> str:
    """auto -> cuda where torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


LONG = ("chunks", "truncate", "refuse")  # embed.long: what a text longer than the model takes


def text_tokenizer(model: Any) -> tuple[Any, int] | None:
    """A copy of a sentence-transformers model's (Rust) tokenizer without truncation or
    padding, and how many tokens of text the model takes in one sequence (its
    ``max_seq_length`` less the special tokens it adds); None for a model without both.
    A copy: the model's own is reconfigured on every ``encode`` call, and one changed
    while another thread uses it fails ("Already borrowed"); this one is never changed
    after it is made, so the threads of a process share it."""
    with _LOADING:
        if model not in _TOKENIZERS:
            backend = getattr(getattr(model, "tokenizer", None), "backend_tokenizer", None)
            most = getattr(model, "max_seq_length", None)
            if backend is None or not most:
                _TOKENIZERS[model] = None
            else:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_str(backend.to_str())
                tok.no_truncation()
                tok.no_padding()
                special = tok.post_processor.num_special_tokens_to_add(False) if (
                    tok.post_processor is not None) else 0
                _TOKENIZERS[model] = (tok, int(most) - special)
        return _TOKENIZERS[model]


def tokens(tok: Any, texts: list[str]) -> list[Any]:
    """The tokenizer's encodings of ``texts`` (ids, offsets, word ids), special tokens aside."""
    return tok.encode_batch(texts, add_special_tokens=False) if texts else []


def windows(text: str, offsets: np.ndarray, words: np.ndarray, width: int
            ) -> tuple[list[str], np.ndarray]:
    """A long text's windows of at most ``width`` tokens, and their token counts: cut
    where a word starts (the tokenizer's word ids), so that each window, a slice of the
    text, tokenizes alone to the tokens it had in the whole; a word longer than a window
    is cut inside. Per window, not per token: numpy finds the cuts."""
    n = len(offsets)
    starts = np.flatnonzero(np.diff(words, prepend=words[0] - 1) != 0)
    cuts = [0]
    while n - cuts[-1] > width:
        at = cuts[-1]
        best = starts[np.searchsorted(starts, at + width, "right") - 1]
        cuts.append(int(best) if best > at else at + width)
    ends = cuts[1:] + [n]
    pieces = [text[offsets[a, 0]:offsets[b - 1, 1]] for a, b in zip(cuts, ends, strict=True)]
    return pieces, np.diff(np.asarray(cuts + [n]))


class SentenceTransformerHandler(ModelHandler):
    """A sentence-transformers model (a local folder or a Hub name) over a batch of texts
    (or images, for CLIP-like models): one float32 vector per value; ``normalize`` makes
    them unit length (cosine distance = 1 - dot product).

    ``long``: a text longer than the model's ``max_seq_length`` is, with ``chunks``,
    embedded in windows of that length and pooled (their mean weighted by tokens, made
    unit length again with ``normalize``); with ``truncate``, cut at it (what the model
    does alone: two texts that share their first window get one embedding); with
    ``refuse``, an error (the job reports such records invalid before they get here)."""

    def __init__(self, path: str, *, device: str = "auto", normalize: bool = True,
                 long: str = "chunks") -> None:
        super().__init__()
        if long not in LONG:
            raise ValueError(f"long must be one of {', '.join(LONG)}, got {long!r}")
        self.path, self.device, self.normalize, self.long = path, device, normalize, long

    def load_model(self) -> Any:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        key = (self.path, pick_device(self.device))
        with _LOADING:
            if key not in _LOADED:
                # the job shows its own progress (none with --quiet): transformers' bar
                # ("Loading weights") went to stderr in every worker, --quiet or not
                transformers_logging.disable_progress_bar()
                _LOADED[key] = SentenceTransformer(key[0], device=key[1])
            return _LOADED[key]

    def run_inference(self, batch: Sequence[Any], model: Any,
                      inference_args: dict | None = None) -> list[np.ndarray]:
        values = list(batch)
        size = max(1, len(values))
        if values and isinstance(values[0], np.ndarray):  # images: PIL, as the models expect
            from PIL import Image

            values = [Image.fromarray(v[..., 0] if v.shape[-1] == 1 else v) for v in values]
        text = text_tokenizer(model) if values and isinstance(values[0], str) else None
        if self.long == "truncate" or text is None:
            return list(self._encode(model, values, size))
        enc = tokens(text[0], values)
        counts = np.fromiter((len(e.ids) for e in enc), np.int64, len(values))
        long = np.flatnonzero(counts > text[1])
        if not len(long):
            return list(self._encode(model, values, size))
        if self.long == "refuse":
            raise ValueError(f"a text of {counts[long[0]]:,} tokens is longer than the "
                             f"{text[1]} the model takes (embed.long: refuse)")
        pieces, rows, owner, weight = list(values), [], [], []
        for i in long.tolist():  # a long text's windows stand in for it: the first in its
            cut, sizes = windows(values[i], np.asarray(enc[i].offsets),  # place
                                 np.asarray(enc[i].word_ids), text[1])
            rows += [i, *range(len(pieces), len(pieces) + len(cut) - 1)]
            pieces[i] = cut[0]
            pieces += cut[1:]
            owner += [i] * len(cut)
            weight.append(sizes)
        got = self._encode(model, pieces, size)
        pooled = np.zeros((len(values), got.shape[1]), np.float64)
        np.add.at(pooled, np.asarray(owner), got[rows] * np.concatenate(weight)[:, None])
        pooled = pooled[long] / counts[long, None]  # the mean weighted by tokens
        if self.normalize:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        out = got[:len(values)].copy()  # a text within the limit: the model's own vector
        out[long] = pooled
        return list(out)

    def _encode(self, model: Any, values: list, size: int) -> np.ndarray:
        out = model.encode(values, batch_size=size, convert_to_numpy=True,
                           normalize_embeddings=self.normalize, show_progress_bar=False)
        return np.asarray(out, np.float32)

    def get_metrics_namespace(self) -> str:
        return "tensordedup_sentence_transformers"


def torchscript_handler(path: str, *, device: str = "auto") -> ModelHandler:
    """Beam's PyTorch handler on a TorchScript file (``torch.jit.save``; never a pickled
    module): it stacks a batch of tensors and calls the module on it."""
    from apache_beam.ml.inference.pytorch_inference import PytorchModelHandlerTensor

    return PytorchModelHandlerTensor(torch_script_model_path=path,
                                     device="GPU" if pick_device(device) == "cuda" else "CPU")


def as_tensors(values: list) -> list:
    """``Embed(prepare=...)`` for Beam's PyTorch handler: each value as a torch tensor."""
    import torch

    return [torch.as_tensor(np.asarray(v)) for v in values]
