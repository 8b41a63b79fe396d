"""Public Beam steps (PTransforms only) for tensor deduplication.

Each step takes at most one essential argument, then keyword-only settings as small
typed objects (``TensorSpec``, ``NearSpec``, ``Keep``, ``Chunking``). Steps import only
their element types (``elements``) and the array kernels (``transforms``), never the
job (``pipeline.config``, ``preflight``, ``run``...). Progress lines are off unless
``progress.enable()`` is called (the CLI does).

    records | Dedup(key="emb", keep="first", near=NearSpec("cosine", 0.02))
    p | ReadTensors("data/*.parquet", format="parquet", spec=TensorSpec("emb")) | Dedup()
"""

from pipeline.steps.dedup import Dedup
from pipeline.steps.elements import (
    CHUNKS,
    DECISIONS,
    FACTS,
    FILES,
    INVALID,
    KEPT,
    KEYS,
    KINDS,
    NEAR_REPORT,
    REFERENCE_FILES,
    REMOVED,
    SEEN,
    SURVIVORS,
    VECTORS,
    FileDecision,
    FileResult,
    KeyBatch,
    ReadFacts,
    VecBatch,
)
from pipeline.steps.exact import DedupExact
from pipeline.steps.fingerprint import Fingerprint
from pipeline.steps.near import DedupNear, NearReport
from pipeline.steps.read import ReadTensors
from pipeline.steps.removed import Removed
from pipeline.steps.store import StoreUpdate, StoreVectors
from pipeline.steps.write import WriteClean
from transforms.exact import Keep
from transforms.io.formats.base import Chunk, Chunking, InvalidRecord, TensorSpec
from transforms.near.spec import NearSpec

__all__ = [
    "ReadTensors", "Embed", "EmbedKept", "Fingerprint", "DedupExact", "DedupNear", "Dedup",
    "WriteClean",
    "StoreVectors", "StoreUpdate",
    "TensorSpec", "NearSpec", "Keep", "Chunking",
    "Chunk", "KeyBatch", "VecBatch", "Removed", "ReadFacts", "FileDecision", "FileResult",
    "InvalidRecord", "NearReport", "KINDS", "REFERENCE_FILES",
    "CHUNKS", "FACTS", "FILES", "KEYS", "VECTORS", "REMOVED", "SEEN", "SURVIVORS",
    "NEAR_REPORT", "DECISIONS", "KEPT", "INVALID",
]


def __getattr__(name: str):
    """``Embed`` and ``EmbedKept`` on first use: their module imports Beam's inference
    package, which imports torch (about 1.5 s, and its threads), into every job that never
    embeds."""
    if name in ("Embed", "EmbedKept"):
        from pipeline.steps import embed

        return getattr(embed, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
