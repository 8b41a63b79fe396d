"""Publish: the job's last step: outputs into place, the store commit, summary.json last.

Why a pipeline step and not the driver: a Dataflow launcher returns once the job is
submitted, so finishing a run has to happen on a worker. The order makes reruns and
restarts safe: the old summary.json goes first (that run is no longer complete), then
the output and report directories are swapped in, then this run's store entries are
committed (replacing an earlier attempt of the same run id), and summary.json, which
marks the run complete, comes last. A run killed at any point and started again with
the same run id ends in the same state as one that never stopped.

On object stores (gs://, s3://) the same order holds, but swapping a directory in is
many object copies and deletes, not one rename (see ``report.publish``): while it runs,
and after a kill in the middle, the output and report prefixes can hold a mix of old and
new files. summary.json stays the mark of a complete run there too: it is deleted before
the swap and written (in one step) after it, so a reader that finds it reads a whole run.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import report
from pipeline.store import StoreCommit
from transforms import fs


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
    spill: str | None = None  # the near stage's working files, deleted first


def publish_run(taken: dict, store_parts: list[dict], pub: Publication) -> dict:
    """The Publish step: ``taken`` is the Report step's figures; ``store_parts`` what the
    store writers wrote for this attempt. Returns the summary it wrote."""
    if pub.spill is not None:  # every reader of the spilled vectors has finished
        fs.delete_tree(pub.spill)
    files = taken["files"]
    totals = report.totals(files)
    # an all-invalid input still gets a directory (object stores: no objects, no prefix)
    fs.makedirs(pub.out_stage)
    fs.delete(fs.join(pub.report, "summary.json"))  # old run: no longer complete
    report.publish(pub.out_stage, pub.output, pub.replace)
    report.publish(pub.report_stage, pub.report, pub.replace)
    store = pub.header.get("store")
    if pub.store is not None:
        store = {**store, **pub.store.commit(store_parts, {"kept": totals["kept"],
                                                           "report": pub.report})}
    summary = {**pub.header, **totals, "wall_time_s": round(time.time() - pub.started, 3),
               "output": pub.output, "report": pub.report, "files": files,
               "reference": taken["reference"], "store": store,
               "near": None if taken["near"] is None else {
                   "settings": pub.near_settings, **taken["near"]}}
    report.write_summary(pub.report, summary)
    return summary


def clear_leftovers(final: str | Path) -> None:
    """Remove staging and swap directories a killed run left next to ``final`` (on object
    stores: every object under a ``.<name>.staging-*`` or ``.<name>.old-*`` prefix)."""
    final = str(final)
    if fs.is_local(final):
        folder = Path(final)
        if folder.parent.is_dir():
            for stale in folder.parent.glob(f".{folder.name}.*"):
                if stale.is_dir() and (".staging-" in stale.name or ".old-" in stale.name):
                    shutil.rmtree(stale, ignore_errors=True)
        return
    parent, _, name = final.rstrip("/").rpartition("/")
    for kind in ("staging", "old"):
        stale = {f[:f.index("/", len(parent) + 1)]
                 for f in fs.match(f"{parent}/.{name}.{kind}-*/**")}
        for prefix in sorted(stale):
            fs.delete_tree(prefix)
