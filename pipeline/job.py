"""The Job: a checked config, resolved into what the graph, the runner and Publish need.

Why apart from the checks: everything after ``preflight.prepare`` (the graph, the
runner, Publish, the capacity plan) reads a Job and never a raw config, so it is the
one type they share; where its files go is ``transforms.io.layout``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import DedupeConfig
from pipeline.embedding import Embedding
from pipeline.steps.store import StoreView
from transforms.exact import Keep
from transforms.io import layout
from transforms.io.formats.base import Chunking, TensorSpec
from transforms.near.spec import NearSpec


@dataclass(frozen=True)
class References:
    """Reference-set files (protected records), read like the input."""

    format: str
    files: list[str]
    spec: TensorSpec
    show: TensorSpec | None = None  # what the report's page shows of them (reference.show)


@dataclass(frozen=True)
class Job:
    """A checked config, resolved into what the graph needs."""

    cfg: DedupeConfig
    files: list[str]  # sorted: the "first" order
    root: str  # common directory of the inputs: output names are relative to it
    spec: TensorSpec  # from the config: what every record is read and checked against
    resolved: TensorSpec  # shape and dtype as the first file has them (for the summary)
    keep: Keep  # which record of a group survives (the config's keep)
    chunking: Chunking  # how the input is cut into elements (the config's tuning)
    output: str  # a directory, or a URL (gs://...) on another filesystem; no trailing slash
    report: str
    run_id: str  # the user's run id ({run_id} in paths, store entries)
    attempt: str  # unique per attempt: staging directory names
    replace: bool  # an existing output/report is replaced: overwrite, or run-specific paths
    near: NearSpec | None = None  # the near stage's settings, when it is on
    references: References | None = None
    store: StoreView | None = None  # earlier runs' records, as of this run's start
    embed: Embedding | None = None  # the user's model, before the near stage
    notes: tuple[str, ...] = ()  # lines the checks found worth saying (printed unless quiet)
    show: TensorSpec | None = None  # what the report's page shows of a record (input.show)

    def staging(self, final: str) -> str:
        return layout.staging(final, self.attempt)

    @property
    def spill(self) -> str:
        """Where the near stage keeps its cells' vectors until they are searched (beside
        the output: cleared with the staging directories, and by the next run if killed)."""
        return layout.spill(self.output, self.attempt)

    @property
    def removals(self) -> str:
        """Where large removal lists wait for the copy and the report (``layout.removals``)."""
        return layout.removals(self.output, self.attempt)
