"""Model handlers for ``Embed``, in the style of Beam's (``apache_beam.ml.inference``).

Why our own for sentence-transformers: Beam's ``SentenceTransformerEmbeddings`` is an
``MLTransform`` over dicts of columns, one record per element; ``Embed`` hands a model
a batch of a chunk's values. Beam's PyTorch handler (``PytorchModelHandlerTensor``
with a TorchScript file) is used as it is (``torchscript_handler``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from apache_beam.ml.inference.base import ModelHandler

# Models loaded in this process, by (path, device): the launcher's check that the model
# loads (pipeline.embedding) and the local runner's workers, threads of the same process,
# share one load (all-MiniLM-L6-v2: 1-2 s each). Workers elsewhere load their own.
_LOADED: dict[tuple[str, str], Any] = {}
_LOADING = threading.Lock()


def pick_device(device: str) -> str:
    """auto -> cuda where torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerHandler(ModelHandler):
    """A sentence-transformers model (a local folder or a Hub name) over a batch of texts
    (or images, for CLIP-like models): one float32 vector per value; ``normalize`` makes
    them unit length (cosine distance = 1 - dot product)."""

    def __init__(self, path: str, *, device: str = "auto", normalize: bool = True) -> None:
        super().__init__()
        self.path, self.device, self.normalize = path, device, normalize

    def load_model(self) -> Any:
        from sentence_transformers import SentenceTransformer

        key = (self.path, pick_device(self.device))
        with _LOADING:
            if key not in _LOADED:
                _LOADED[key] = SentenceTransformer(key[0], device=key[1])
            return _LOADED[key]

    def run_inference(self, batch: Sequence[Any], model: Any,
                      inference_args: dict | None = None) -> list[np.ndarray]:
        values = list(batch)
        if values and isinstance(values[0], np.ndarray):  # images: PIL, as the models expect
            from PIL import Image

            values = [Image.fromarray(v[..., 0] if v.shape[-1] == 1 else v) for v in values]
        out = model.encode(values, batch_size=max(1, len(values)), convert_to_numpy=True,
                           normalize_embeddings=self.normalize, show_progress_bar=False)
        return list(np.asarray(out, np.float32))

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
