"""Input formats: one module per format, each implementing ``base.Format``."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from transforms.io.formats.base import TensorSpec

if TYPE_CHECKING:
    from transforms.io.formats.encoded import Encoded

FORMATS = ("parquet", "tfrecord", "hdf5", "jsonl", "arrow", "csv", "npy", "npz",
           "megatron")


def get_format(name: str, spec: TensorSpec | None = None) -> ModuleType | Encoded:
    """The module implementing ``base.Format`` for ``name`` (imported on first use), or,
    when ``spec.decode`` is set, its ``encoded.Encoded`` wrapper (values decoded)."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; use one of {', '.join(FORMATS)}")
    if spec is not None and spec.decode is not None:
        from transforms.io.formats.encoded import Encoded

        return Encoded(name)
    return importlib.import_module(f"transforms.io.formats.{name}")
