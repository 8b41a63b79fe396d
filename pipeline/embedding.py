"""The config's ``embed:`` section -> the Embed step's model handler, checked up front.

Why here (the job layer): loading the model on the driver before any work turns a wrong
path, a missing package or a file that is no TorchScript into one line and exit 2,
rather than a worker error after the input was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config.sections import EmbedConfig
from transforms.io.formats.base import InputError, error_line

if TYPE_CHECKING:
    from pipeline.steps.embed import LongTexts


@dataclass(frozen=True)
class Embedding:
    """What the graph's Embed step needs."""

    cfg: EmbedConfig
    handler: Any  # an apache_beam ModelHandler (picklable)
    prepare: Any = None  # values -> what the handler takes, or None

    def meta(self) -> dict:
        """What a fingerprint store records: another model, other vectors."""
        c = self.cfg
        out = {"model": c.model, "path": c.path, "normalize": c.normalize}
        if c.model == "sentence-transformers" and c.long != "truncate":  # truncate: as
            out["long"] = c.long  # stores made before the setting, which hold no key
        return out

    def describe(self) -> str:
        c = self.cfg
        return (f"embed: {c.model} {c.path} (batch {c.batch_size}, device {c.device}, "
                f"{'unit-length' if c.normalize else 'raw'} vectors)")

    def long_texts(self) -> LongTexts | None:
        """The read-time check of ``embed.long`` (``LongTexts``), or None for a model
        without a (Rust) text tokenizer and a ``max_seq_length`` (TorchScript)."""
        if self.cfg.model != "sentence-transformers":
            return None
        from pipeline.models import text_tokenizer
        from pipeline.steps.embed import LongTexts

        model = self.handler.load_model()  # loaded once already by the checks
        if text_tokenizer(model) is None:
            return None
        return LongTexts(self.handler, int(model.max_seq_length))


def embedding(cfg: EmbedConfig | None, load: bool = True) -> Embedding | None:
    """The handler for ``embed:``; with ``load`` the model is loaded once here so that a
    model that cannot load stops the run before any work (a sentence-transformers model
    stays loaded for the local runner's workers in this process: models.py)."""
    if cfg is None:
        return None
    from pipeline.models import SentenceTransformerHandler, as_tensors, torchscript_handler

    if cfg.model == "sentence-transformers":
        out = Embedding(cfg, SentenceTransformerHandler(cfg.path, device=cfg.device,
                                                        normalize=cfg.normalize, long=cfg.long))
    else:
        out = Embedding(cfg, torchscript_handler(cfg.path, device=cfg.device), as_tensors)
    if load:
        try:
            out.handler.load_model()
        except Exception as e:  # noqa: BLE001 - any failure to load is the same one line
            raise InputError(f"embed.path: the {cfg.model} model {cfg.path!r} cannot be loaded "
                             f"({error_line(e)[:300]}): give a model folder or file that "
                             "loads offline, or install its package") from None
    return out
