"""Publish: the job's last step: outputs into place, the store commit, summary.json last.

Why a pipeline step and not the driver: a Dataflow launcher returns once the job is
submitted, so finishing a run has to happen on a worker. The order makes reruns and
restarts safe: the old summary.json goes first (that run is no longer complete), then
the output and report directories are swapped in, then this run's store entries are
committed (replacing an earlier attempt of the same run id), and summary.json, which
marks the run complete, comes last. A run killed at any point and started again with
the same run id ends in the same state as one that never stopped.

Publish itself may run more than once for one attempt (Dataflow retries a failed work
item, also after it published half): each directory's swap is journaled in a small
``<staging>.publishing`` file written before its first destructive step, so a second
call finishes the first one's work instead of redoing it (an object store's old files
are listed in the journal and deleted before any new one is moved in), and a call that
finds this attempt's summary.json returns it. Publish runs only while the run holds its
leases (``transforms.io.lease``): it checks them first, and on runners that do not block
(Dataflow) it releases them when done.

On object stores (gs://, s3://) the same order holds, but swapping a directory in is
many object copies and deletes, not one rename: while it runs, and after a kill in the
middle, the output and report prefixes can hold a mix of old and new files. summary.json
stays the mark of a complete run there too: it is deleted before the swap and written
(in one step) after it, so a reader that finds it reads a whole run.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.report import tables as report
from pipeline.steps.store import StoreCommit
from transforms.io import fs, layout
from transforms.io.lease import Lease, acquire_all, release_all

HOLD_ENV = "TENSORDEDUP_TEST_HOLD_PUBLISH"  # tests: see _hold_for_tests
DEAF_ENV = "TENSORDEDUP_TEST_HOLD_DEAF"  # tests: the hold ignores KeyboardInterrupt


@dataclass(frozen=True)
class Publication:
    """Where the run's staged outputs go and what summary.json says besides the counts."""

    output: str
    report: str
    out_stage: str
    report_stage: str
    replace: bool  # an existing output / report is replaced (overwrite or a run-specific path)
    started: float  # time.time() when the driver started the job
    header: dict = field(default_factory=dict)  # run id, attempt, config, resolved spec, ...
    near_settings: dict | None = None
    store: StoreCommit | None = None
    spill: str | None = None  # the near stage's working files, deleted first
    removals: str | None = None  # large removal lists (the report has read them)
    leases: tuple[Lease, ...] = ()  # held by this run; checked before anything is replaced
    release_leases: bool = False  # the driver does not wait (Dataflow): Publish releases


def take_leases(output: str, report_dir: str, store: str | None, run_id: str,
                detached: bool) -> list[Lease]:
    """The run's one-writer leases: its output and report directories, and the store it
    commits to (if any); all or none (``LeaseHeld`` names the holder)."""
    wanted = [(layout.dir_lease(output), output), (layout.dir_lease(report_dir), report_dir)]
    if store is not None:
        wanted.append((layout.store_lease(store), f"fingerprint store {store}"))
    return acquire_all(wanted, run_id, detached)


def publish_run(taken: dict, store_parts: list[dict], pub: Publication,
                embed: dict | None = None) -> dict:
    """The Publish step: ``taken`` is the Report step's figures; ``store_parts`` what the
    store writers wrote for this attempt; ``embed`` summary.json's embed section (the long
    texts: ``LongRecords``). Returns the summary it wrote. Safe to call again for the
    same attempt, after a partial or a complete first call."""
    _hold_for_tests()
    done = _published(pub)
    if done is not None:  # a retried Publish of an attempt that finished
        _finish(pub)
        return done
    for lease in pub.leases:
        lease.check()
    for scratch in (pub.spill, pub.removals):  # every reader of them has finished
        if scratch is not None:
            fs.delete_tree(scratch)
    files = taken["files"]
    totals = report.totals(files)
    moves = [(pub.out_stage, pub.output), (pub.report_stage, pub.report)]
    for stage, final in moves:  # before anything is deleted: refuse, leave the old run whole
        if not fs.exists(layout.journal(stage)) and not pub.replace and fs.exists_under(final):
            raise FileExistsError(_appeared(final))
    fs.delete(fs.join(pub.report, layout.SUMMARY))  # old run: no longer complete
    for stage, final in moves:
        fs.clear_temps_under(stage)  # every writer has finished: a temp is a killed one's
        _move_in(stage, final)
    store = pub.header.get("store")
    if pub.store is not None:
        store = {**store, **pub.store.commit(store_parts, {"kept": totals["kept"],
                                                           "report": pub.report})}
    summary = {**pub.header, **totals, "wall_time_s": round(time.time() - pub.started, 3),
               "output": pub.output, "report": pub.report, "files": files,
               "reference": taken["reference"], "store": store, "embed": embed,
               "report_parts": taken.get("report_parts", []),
               "near": None if taken["near"] is None else {
                   "settings": pub.near_settings, **taken["near"]}}
    report.write_summary(pub.report, summary)
    _finish(pub)
    return summary


def _published(pub: Publication) -> dict | None:
    """This attempt's summary.json, if an earlier call of Publish wrote it."""
    path = fs.join(pub.report, layout.SUMMARY)
    if not fs.exists(path):
        return None
    summary = json.loads(fs.read_bytes(path))
    attempt = pub.header.get("attempt")
    return summary if attempt is not None and summary.get("attempt") == attempt else None


def _finish(pub: Publication) -> None:
    """After summary.json: drop the journals; a detached run gives its leases back."""
    for stage in (pub.out_stage, pub.report_stage):
        fs.delete(layout.journal(stage))
    if pub.release_leases:
        release_all(pub.leases)


def _move_in(stage: str, final: str) -> None:
    """Replace ``final`` with the staged files, resumable: the journal, written before the
    first destructive step, says a swap has begun (and on object stores which old objects
    it deletes), so a repeated call completes it and never deletes a moved-in file."""
    journal = layout.journal(stage)
    if fs.is_local(final):
        if not fs.exists(journal):
            os.makedirs(stage, exist_ok=True)  # an all-invalid input still gets a directory
            fs.write_bytes_atomic(journal, b"{}")
        old = layout.old(final, stage)
        if os.path.isdir(stage):
            if os.path.exists(final):
                shutil.rmtree(old, ignore_errors=True)
                os.rename(final, old)
            os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
            os.rename(stage, final)
        shutil.rmtree(old, ignore_errors=True)
        return
    state = json.loads(fs.read_bytes(journal)) if fs.exists(journal) else None
    if state is None:
        state = {"delete": fs.match(final.rstrip("/") + "/**")}
        fs.write_bytes_atomic(journal, json.dumps(state).encode())
    if state.get("delete"):
        fs.delete_files(state["delete"])
        fs.write_bytes_atomic(journal, json.dumps({"delete": []}).encode())
    fs.rename_tree(stage, final)  # what is still staged: all of it, or a retry's rest
    fs.delete_tree(stage)


def clear_leftovers(final: str | Path, lease: Lease | None = None) -> None:
    """Remove what killed runs left next to ``final``: staging and swap directories and
    publish journals (on object stores: every object under a ``.<name>.staging-*`` or
    ``.<name>.old-*`` prefix). Call it only while holding ``final``'s lease (then no
    live run owns any of them); given the lease, it is checked first."""
    if lease is not None:
        lease.check()
    final = str(final)
    if fs.is_local(final):
        for stale in glob.glob(glob.escape(fs.sibling(final, "")) + "*"):
            if any(f".{kind}-" in os.path.basename(stale) for kind in (layout.STAGING, layout.OLD)):
                fs.delete_tree(stale)
        return
    parent = final.rstrip("/").rpartition("/")[0]
    stale = set()
    for kind in (layout.STAGING, layout.OLD):
        for f in fs.match(fs.sibling(final, f"{kind}-**")):
            rest = f[len(parent) + 1:]
            stale.add(f"{parent}/{rest.split('/', 1)[0]}")
    for prefix in sorted(stale):
        fs.delete_tree(prefix)


def own_stages(pub: Publication) -> Sequence[str]:
    """What this attempt may leave beside its outputs (staging, spill, journals): the
    driver deletes them when the job ends, however it ends."""
    stages = [pub.out_stage, pub.report_stage]
    return stages + [layout.journal(s) for s in stages] + [
        s for s in (pub.spill, pub.removals) if s]


def _hold_for_tests() -> None:
    """Tests only: with ``$TENSORDEDUP_TEST_HOLD_PUBLISH`` set to a path, Publish announces
    itself (``<path>.reached``) and waits until that path exists, so a test can start a
    rival run or kill this one at a known point without timing guesses. With
    ``$TENSORDEDUP_TEST_HOLD_DEAF`` set it also swallows KeyboardInterrupt, as a library
    that catches it would (a stopped command must end anyway: ``pipeline.stopping``),
    and says so (``<path>.swallowed``)."""
    hold = os.environ.get(HOLD_ENV)
    if not hold:
        return
    wake = threading.Event()
    deadline = time.monotonic() + 600
    Path(hold + ".reached").touch()  # the last line before the loop that catches
    while True:
        try:  # the whole step, test included: the signal may land between any two lines
            if os.path.exists(hold) or time.monotonic() >= deadline:
                return
            wake.wait(0.02)
        except KeyboardInterrupt:  # deaf: as a library that swallows Ctrl-C would be
            if not os.environ.get(DEAF_ENV):
                raise
            Path(hold + ".swallowed").touch()


def _appeared(final: str) -> str:
    return (f"{final} appeared while the job ran: remove it or set output.overwrite: true, "
            "and run again")
