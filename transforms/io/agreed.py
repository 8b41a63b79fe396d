"""One value per job for a step that a runner may compute more than once.

Why: a step whose output every task must agree on (the near stage's cell plan) can run
again on some runners: a Dask worker lost after making it has it recomputed, and a
retried bundle reruns it on any runner. When the computation is not bit-for-bit
repeatable (k-means over threads), tasks before and after would disagree. The first
computation to finish writes its value to a job-scoped path with a create-if-absent
write (``transforms.io.conditional``: link(2) locally, a generation precondition on gs://,
the filesystems the job's leases already require); every later one returns that value
instead of its own. The value is written as data (``transforms.io.spill``), never pickled: the
path may be on shared storage, where a pickle would run whoever wrote it.
"""

from __future__ import annotations

from typing import TypeVar

from transforms.io import conditional, spill

T = TypeVar("T")


def first_written(path: str, value: T) -> T:
    """``value`` if this call is the first to write ``path``; else what the first wrote."""
    if conditional.create_exclusive(path, spill.encode_bytes(value)):
        return value
    return spill.load(path)
