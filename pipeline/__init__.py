"""tensordedup's Beam side: the dedup job and its public steps.

- ``pipeline.run_job(config)``: run the job from Python (notebooks, schedulers) and get
  a ``RunSummary`` back (``pipeline/api.py``); ``tensordedup`` / ``python -m
  pipeline.run`` is the same job from the command line (``pipeline/run.py``).
- ``pipeline.steps``: the public Beam steps (``ReadTensors``, ``Dedup``, ``WriteClean``...)
  for your own pipelines.
- The job layer around them: ``config`` (the YAML schema), ``preflight`` (checks before
  any work) and the ``job`` it makes, ``graph`` (the job's graph), ``runner`` (local /
  Dask / Dataflow), ``publish`` and ``report``; ``layout`` names every file a run makes,
  ``capacity`` is the dry run's capacity plan. It imports the steps, never the reverse.

``run_job``, ``RunSummary`` and ``JobFailed`` are imported on first use, so importing a
step or the config does not load the job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.api import JobFailed, RunSummary, run_job

__all__ = ["run_job", "RunSummary", "JobFailed"]


def __getattr__(name: str):
    if name in __all__:
        from pipeline import api

        return getattr(api, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
