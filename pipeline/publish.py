"""Publish: the job's last step: outputs into place, the store commit, summary.json last.

Why a pipeline step and not the driver: a Dataflow launcher returns once the job is
submitted, so finishing a run has to happen on a worker. The order makes reruns and
restarts safe: summary.json is written first, into the staged report under another name
(``layout.PENDING_SUMMARY``), so every byte of the run is on disk before anything is
replaced (a full disk fails the run with nothing published); then the old summary.json
goes (that run is no longer complete), the output directory is swapped in, this run's
store entries are committed (one small marker, replacing an earlier attempt of the same
run id), the report directory is swapped in, and summary.json, which marks the run
complete, is renamed into place last. The store's compaction follows (upkeep: a failure
there leaves the run complete). A run killed at any point and started again with the
same run id ends in the same state as one that never stopped; a failure after the
output swap began says what was published (``PublishIncomplete``).

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
from transforms.io.lease import Lease, acquire_all, holder, release_all

HOLD_ENV = "TENSORDEDUP_TEST_HOLD_PUBLISH"  # tests: see _hold_for_tests
DEAF_ENV = "TENSORDEDUP_TEST_HOLD_DEAF"  # tests: the hold ignores KeyboardInterrupt
HOLD_AT_ENV = "TENSORDEDUP_TEST_HOLD_AT"  # tests: where Publish holds (_hold_for_tests)


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


def wanted_leases(output: str, report_dir: str, store: str | None) -> list[tuple[str, str]]:
    """The run's one-writer leases, (lease path, what it guards): its output and report
    directories, and the store it commits to (if any)."""
    wanted = [(layout.dir_lease(output), output), (layout.dir_lease(report_dir), report_dir)]
    if store is not None:
        wanted.append((layout.store_lease(store), f"fingerprint store {store}"))
    return wanted


def take_leases(output: str, report_dir: str, store: str | None, run_id: str,
                detached: bool) -> list[Lease]:
    """``wanted_leases``, all or none (``LeaseHeld`` names the holder)."""
    return acquire_all(wanted_leases(output, report_dir, store), run_id, detached)


def held_lines(output: str, report_dir: str, store: str | None) -> list[str]:
    """What a dry run says of the leases a run would take: those a live run holds now."""
    return [f"a run now would be refused: {line}" for path, target in
            wanted_leases(output, report_dir, store) if (line := holder(path, target))]


class PublishIncomplete(RuntimeError):
    """Publish failed after it had replaced something (the output swapped in, the store
    committed, the report moved in): the message says what was published and what was
    not, and that a rerun of the same run id completes it (``failure_line``)."""


def publish_run(taken: dict, store_parts: list[dict], pub: Publication,
                embed: dict | None = None) -> dict:
    """The Publish step: ``taken`` is the Report step's figures; ``store_parts`` what the
    store writers wrote for this attempt; ``embed`` summary.json's embed section (the long
    texts: ``LongRecords``). Returns the summary it wrote. Safe to call again for the
    same attempt, after a partial or a complete first call.

    Order: every byte first (summary.json as ``layout.PENDING_SUMMARY`` in the staged report),
    then the old summary.json goes, the output is swapped in, the store attempt committed
    (one small marker), the report swapped in and summary.json renamed into place, which
    marks the run complete; the store's compaction comes after (upkeep: its failure
    leaves a complete run and a store whose next commit compacts). A failure after the
    output swap began raises ``PublishIncomplete`` naming what was published."""
    _hold_for_tests("start")
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
    store = pub.header.get("store")
    if pub.store is not None:
        store = {**store, **pub.store.described(store_parts)}
    summary = {**pub.header, **totals, "wall_time_s": round(time.time() - pub.started, 3),
               "output": pub.output, "report": pub.report, "files": files,
               "reference": taken["reference"], "store": store, "embed": embed,
               "report_parts": taken.get("report_parts", []),
               "near": None if taken["near"] is None else {
                   "settings": pub.near_settings, **taken["near"]}}
    if not fs.exists(layout.journal(pub.report_stage)):  # the report is still all staged
        report.write_summary(pub.report_stage, summary, layout.PENDING_SUMMARY)
    fs.delete(fs.join(pub.report, layout.SUMMARY))  # old run: no longer complete
    steps: list[str] = []
    try:
        for stage, final in moves[:1]:
            steps.append("output")
            fs.clear_temps_under(stage)  # every writer has finished: a temp is a killed one's
            _move_in(stage, final)
            steps.append("output moved")
            _hold_for_tests("output moved")
        if pub.store is not None:
            pub.store.commit(store_parts, {"kept": totals["kept"], "report": pub.report})
            steps.append("store")
        fs.clear_temps_under(pub.report_stage)
        _move_in(pub.report_stage, pub.report)
        steps.append("report")
        _mark_complete(pub.report, summary)
    except Exception as e:
        if "output moved" not in steps and not fs.exists(layout.journal(pub.out_stage)):
            raise  # the swap had not begun: nothing was published
        if pub.store is not None and "store" not in steps and _committed(pub.store):
            steps.append("store")  # the commit failed after its marker was written
        raise PublishIncomplete(_incomplete(pub, steps, _why(e))) from e
    _hold_for_tests("complete")
    if pub.store is not None:
        summary = _compact(pub, summary)
    _finish(pub)
    return summary


def _committed(store: StoreCommit) -> bool:
    try:
        return store.is_committed()
    except Exception:  # the store cannot be read either: say what is known
        return False


def _mark_complete(report_dir: str, summary: dict) -> None:
    """summary.json into place: the pending one renamed (no data written), or written
    where a retried Publish finds none pending."""
    pending = fs.join(report_dir, layout.PENDING_SUMMARY)
    final = fs.join(report_dir, layout.SUMMARY)
    if not fs.exists(pending):
        report.write_summary(report_dir, summary)
    elif fs.is_local(report_dir):
        os.replace(pending, final)
    else:  # one small object copied (complete when it appears), then the pending deleted
        fs.beam_filesystems().rename([pending], [final])


def _compact(pub: Publication, summary: dict) -> dict:
    """The store's compaction, after the run is complete; summary.json then gets the
    merges it made. A failure (a full disk: merges write data) leaves the run complete
    and the store as committed (a crashed merge changes no answer): it is noted in
    summary.json where that can still be written, and the next commit compacts."""
    try:
        merged = pub.store.compact()
        if not merged:
            return summary
        store = {**summary["store"], "compaction_merges": merged}
    except Exception as e:
        store = {**summary["store"], "compaction_error": f"{type(e).__name__}: {e}"}
    summary = {**summary, "store": store}
    try:
        report.write_summary(pub.report, summary)
    except OSError:
        pass  # the summary.json in place says the run is complete, with 0 merges
    return summary


def what_a_stop_left(pub: Publication) -> str | None:
    """What a job stopped (Ctrl-C, SIGTERM: its Publish killed wherever it was) had
    published, read from what is in place: None where the output swap had not begun
    (nothing was published), else the words for it (the stop's line must not say
    "nothing was published" over a replaced output)."""
    try:
        if _published(pub) is not None:
            return (f"the run had published before it was stopped: output.path {pub.output} "
                    f"and the report ({pub.report}) hold this run's results")
        if not fs.exists(layout.journal(pub.out_stage)):
            return None
        steps = ["output"] + ([] if fs.exists_under(pub.out_stage) else ["output moved"])
        if pub.store is not None and "output moved" in steps and _committed(pub.store):
            steps.append("store")
        if fs.exists(layout.journal(pub.report_stage)) and not fs.exists_under(
                pub.report_stage):
            steps.append("report")
    except Exception:  # what is in place cannot be read: say that the swap had begun
        steps = ["output"]
    return _incomplete(pub, steps, None)


def _incomplete(pub: Publication, steps: list[str], why: str | None) -> str:
    """PublishIncomplete's message: what this attempt published before it stopped (for
    ``why``), what it did not, and the fix (a rerun of the run id, which replaces all
    of it)."""
    out, rep = f"output.path {pub.output}", f"the report ({pub.report})"
    store = pub.store is not None
    if "output moved" not in steps:
        done = f"{out} was being replaced (it may hold part of this run's files)"
        left = f"{rep}{' and the store were' if store else ' was'} not published"
    elif "store" not in steps and store:
        done = f"{out} holds this run's output"
        left = f"the store was not updated and {rep} was not published"
    elif "report" not in steps:
        done = f"{out} holds this run's output" + (
            f" and the store holds run {pub.header.get('run_id')}'s records" if store else "")
        left = f"{rep} was not published"
    else:
        done = f"{out} and {rep} hold this run's results" + (
            " and the store holds its records" if store else "")
        left = "summary.json was not written (the run is not marked complete)"
    again = "" if pub.replace else " with --overwrite"
    return (f"publishing stopped part way: {done}, but {left}; run it again with the same "
            f"run id ({pub.header.get('run_id')}){again} to finish" + (f": {why}" if why else ""))


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


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


def _hold_for_tests(point: str) -> None:
    """Tests only: with ``$TENSORDEDUP_TEST_HOLD_PUBLISH`` set to a path, Publish announces
    itself (``<path>.reached``) at ``point`` (``$TENSORDEDUP_TEST_HOLD_AT``: "start", the
    default, "output moved" or "complete") and waits until that path exists, so a test can start a
    rival run or kill this one at a known point without timing guesses. With
    ``$TENSORDEDUP_TEST_HOLD_DEAF`` set it also swallows KeyboardInterrupt, as a library
    that catches it would (a stopped command must end anyway: ``pipeline.stopping``),
    and says so (``<path>.swallowed``)."""
    hold = os.environ.get(HOLD_ENV)
    if not hold or os.environ.get(HOLD_AT_ENV, "start") != point:
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
