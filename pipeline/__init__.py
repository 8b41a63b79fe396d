"""tensordedup's Beam side: the dedup job and its public steps.

- ``pipeline.run_job(config)``: run the job from Python (notebooks, schedulers) and get
  a ``RunSummary`` back (``pipeline/api.py``); ``tensordedup`` / ``python -m
  pipeline.run`` is the same job from the command line (``pipeline/run.py``). Its
  problems: ``ConfigError``, ``InputError`` (before any work), ``LeaseHeld``,
  ``JobFailed``.
- ``pipeline.steps``: the public Beam steps (``ReadTensors``, ``Dedup``, ``WriteClean``...)
  for your own pipelines.
- The job around them (docs/architecture.md): ``config/`` (the YAML schema), ``preflight``
  and ``inputs`` (checks that touch files, network and stores) and the ``job`` they make,
  ``graph`` (the job's graph), ``runners/`` (local, Dask, portable, Dataflow), ``publish``,
  ``report/`` (the report's tables, page and summary), ``capacity/`` (the dry run's plan),
  ``progress`` (what a run shows as it goes), ``stopping`` (Ctrl-C and SIGTERM). The job
  imports the steps, never the reverse.

These names are imported on first use, so importing a step or the config does not load
the job.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.api import JobFailed, run_job
    from pipeline.config import ConfigError
    from pipeline.report.summary import RunSummary
    from transforms.io.formats.base import InputError
    from transforms.io.lease import LeaseHeld

__all__ = ["run_job", "RunSummary", "JobFailed", "ConfigError", "InputError", "LeaseHeld"]
_WHERE = {"run_job": "pipeline.api", "JobFailed": "pipeline.api",
          "RunSummary": "pipeline.report.summary", "ConfigError": "pipeline.config",
          "InputError": "transforms.io.formats.base", "LeaseHeld": "transforms.io.lease"}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
