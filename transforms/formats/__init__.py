"""Input formats: one module per format, each implementing ``base.Format``."""

from __future__ import annotations

import importlib
from types import ModuleType

FORMATS = ("parquet", "tfrecord", "hdf5")


def get_format(name: str) -> ModuleType:
    """The module implementing ``base.Format`` for ``name`` (imported on first use)."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}; use one of {', '.join(FORMATS)}")
    return importlib.import_module(f"transforms.formats.{name}")
