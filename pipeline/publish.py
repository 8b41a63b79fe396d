"""Publish: the job's last step: outputs into place, the store commit, summary.json last.

Why a pipeline step and not the driver: a Dataflow launcher returns once the job is
submitted, so finishing a run has to happen on a worker. The order makes reruns and
restarts safe: the old summary.json goes first (that run is no longer complete), then
the output and report directories are swapped in, then this run's store entries are
committed (replacing an earlier attempt of the same run id), and summary.json, which
marks the run complete, comes last. A run killed at any point and started again with
the same run id ends in the same state as one that never stopped.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import report
from pipeline.store import StoreCommit


@dataclass(frozen=True)
class Publication:
    """Where the run's staged outputs go and what summary.json says besides the counts."""

    output: str
    report: str
    out_stage: str
    report_stage: str
    replace: bool  # an existing output / report is replaced (overwrite or a run-specific path)
    started: float  # time.time() when the driver started the job
    header: dict = field(default_factory=dict)  # run id, config, resolved spec, ...
    near_settings: dict | None = None
    store: StoreCommit | None = None


def publish_run(taken: dict, store_parts: list[dict], pub: Publication) -> dict:
    """The Publish step: ``taken`` is the Report step's figures; ``store_parts`` what the
    store writers wrote for this attempt. Returns the summary it wrote."""
    files = taken["files"]
    totals = report.totals(files)
    out_stage, report_stage = Path(pub.out_stage), Path(pub.report_stage)
    output, report_dir = Path(pub.output), Path(pub.report)
    out_stage.mkdir(parents=True, exist_ok=True)  # an all-invalid input still gets a dir
    (report_dir / "summary.json").unlink(missing_ok=True)  # old run: no longer complete
    report.publish(out_stage, output, pub.replace)
    report.publish(report_stage, report_dir, pub.replace)
    store = pub.header.get("store")
    if pub.store is not None:
        store = {**store, **pub.store.commit(store_parts, {"kept": totals["kept"],
                                                           "report": str(report_dir)})}
    summary = {**pub.header, **totals, "wall_time_s": round(time.time() - pub.started, 3),
               "output": str(output), "report": str(report_dir), "files": files,
               "reference": taken["reference"], "store": store,
               "near": None if taken["near"] is None else {
                   "settings": pub.near_settings, **taken["near"]}}
    report.write_summary(report_dir, summary)
    return summary


def clear_leftovers(final: Path) -> None:
    """Remove staging and swap directories a killed run left next to ``final``."""
    if final.parent.is_dir():
        for stale in final.parent.glob(f".{final.name}.*"):
            if stale.is_dir() and (".staging-" in stale.name or ".old-" in stale.name):
                shutil.rmtree(stale, ignore_errors=True)
