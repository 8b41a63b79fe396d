"""``run_job``: the dedup job from Python (notebooks, schedulers), the CLI's code path.

    from pipeline import run_job
    s = run_job("configs/dedupe.yaml")                      # or a dict, or a DedupeConfig
    s.kept, s.removed["exact"], s.removals().num_rows

Same steps as ``python -m pipeline.run`` / ``tensordedup`` (which call the functions
here): the checks before any work (``preflight.prepare``), the Beam job whose last step
publishes the outputs and writes summary.json (``execute``), and the leases around it.
Problems raise instead of exiting: ``ConfigError`` and ``InputError`` (one line, before
any work; the CLI's exit 2), ``LeaseHeld`` (another run holds the output or store; exit
2), ``JobFailed`` (the job failed while running and published nothing, or, failing part
way through publishing, says what it published; exit 1; the original error is its
``__cause__``), ``KeyboardInterrupt`` (nothing published).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TextIO


def _gcp_notice(record: logging.LogRecord) -> bool:
    return "apitools not found" not in record.getMessage()


# Beam warns on import that optional GCP client libraries are missing: noise for users
# (a filter for these imports only: the root logger is as it was afterwards)
logging.getLogger().addFilter(_gcp_notice)
try:
    from pipeline import progress, stopping
    from pipeline.config import ConfigError, DedupeConfig, load_config, parse_config
    from pipeline.config.sections import VECTOR_ONLY
    from pipeline.job import Job
    from pipeline.preflight import prepare
    from pipeline.publish import (
        Publication,
        PublishIncomplete,
        clear_leftovers,
        own_stages,
        take_leases,
        what_a_stop_left,
    )
    from pipeline.report.summary import RunSummary
    from pipeline.runners.common import RunIncomplete, no_traceback
    from transforms.digests import SCHEME
    from transforms.io.formats.base import InvalidRecordError
    from transforms.io.fs import close_tree, delete_tree
    from transforms.io.lease import LeaseHeld, detach_all, keep_alive, release_all
finally:
    logging.getLogger().removeFilter(_gcp_notice)

__all__ = ["run_job", "JobFailed", "to_config", "run_prepared", "execute", "publication",
           "failure_line", "beam_quiet", "is_verbose", "VERBOSE_ENV"]

VERBOSE_ENV = "TENSORDEDUP_VERBOSE"
# what a failed run left: its failure comes before (or is) the Publish step
UNPUBLISHED = "nothing was published (the previous output, if any, is unchanged)"
# errno values of a write that ran out of room: ENOSPC, EDQUOT, EFBIG (a file size limit)
_NO_MEMORY = re.compile(r"MemoryError|Unable to allocate|Cannot allocate memory|"
                        r"std::bad_alloc|out of memory", re.I)
_NO_ROOM = re.compile(r"\[Errno (28|122|27)\]|No space left|Disk quota exceeded|File too large",
                      re.I)


class JobFailed(RuntimeError):
    """The job failed while running. Nothing was published (earlier outputs are as they
    were), unless the message says otherwise: a failure in the Publish step after it had
    replaced the output names what was published and that a rerun of the same run id
    completes it. The message is one line; ``__cause__`` is the original error."""


# ------------------------------------------------------------------------- the job


def beam_pipeline(job: Job):
    from pipeline.runners import make_pipeline

    return make_pipeline(job.cfg.runner)


def _settings(near, job: Job) -> dict:
    """summary.json's near settings: the config's keys, for jaccard only those that apply
    and the shingles as resolved (the unit the input took, the size it defaults to)."""
    out = near.model_dump(mode="json")
    if near.metric == "jaccard" and job.near is not None:
        out = {k: v for k, v in out.items() if k not in VECTOR_ONLY}
        sh = job.near.shingles
        out["shingles"] = {"unit": sh.unit, "size": sh.n, "normalize": sh.normalize,
                           "permutations": sh.permutations, "bands": sh.bands}
    return out


def publication(job: Job) -> Publication:
    """What the Publish step needs: final and staging paths, and summary.json's header."""
    cfg = job.cfg
    store = None
    if job.store is not None and cfg.store.update:
        store = job.store.begin()
    resolved = {"shape": None if job.resolved.shape is None else list(job.resolved.shape),
                "dtype": job.resolved.dtype, "inputs": len(job.files)}
    if job.spec.columns:  # a feature table's columns, its globs expanded
        resolved["columns"] = list(job.spec.columns)
    return Publication(
        job.output, job.report, job.staging(job.output), job.staging(job.report), job.replace,
        time.time(),
        header={"run_id": job.run_id, "attempt": job.attempt, "fingerprint_scheme": SCHEME,
                "working_dir": os.getcwd(),  # resolves relative input paths in record ids
                "config": cfg.model_dump(mode="json"), "resolved": resolved,
                "store": None if job.store is None else job.store.describe()},
        near_settings=None if cfg.near is None else _settings(cfg.near, job),
        store=store, spill=job.spill if job.near else None, removals=job.removals)


def execute(job: Job) -> RunSummary:
    """Run the graph; its last step publishes outputs, commits the store and writes
    summary.json. First the run takes its one-writer leases (output, report, store it
    updates), so a rival run is refused (``LeaseHeld``) before anything is deleted or
    written; under them the store's view is taken again and what dead runs left is
    cleared. The leases are renewed while the job runs and released when it ends, however
    it ends; a runner that does not block (Dataflow) hands them to its Publish step, which
    releases them, and the summary says the job was submitted. Until the submission
    returns they are bound to this process like any run's: a launcher killed before it
    (SIGKILL, a scheduler's timeout) leaves no lease that blocks the next run; detached
    (24 h, no process stands for them) only once the service has the job."""
    from pipeline.graph import build
    from pipeline.runners import own_tempdir
    from pipeline.runners.common import launcher_waits
    from pipeline.runners.local import kernel_threads

    detached = not launcher_waits(job.cfg.runner)
    updates = job.store is not None and job.cfg.store.update
    try:  # bound to this process until the job is submitted (detached then: Dataflow)
        leases = take_leases(job.output, job.report, job.store.path if updates else None,
                             job.run_id, False)
    except OSError as e:  # no create-if-absent on this filesystem: nothing written yet
        raise LeaseHeld(str(e)) from None
    handed_over = False
    # the leases go back and the staging goes when the job ends, however it ends (a
    # stopped command that cannot wait for its main thread: pipeline.stopping)
    with stopping.pending(lambda: None if handed_over else release_all(leases)), \
            keep_alive(leases):
        if updates:
            job = dataclasses.replace(job, store=job.store.refreshed())
            job.store.clear_attempts()
        for final, lease in zip((job.output, job.report), leases, strict=False):
            clear_leftovers(final, lease)
        pub = dataclasses.replace(publication(job), leases=tuple(leases),
                                  release_leases=detached)
        p = beam_pipeline(job)
        temp = p.local_tempdir
        try:
            with stopping.pending(lambda: shutil.rmtree(temp, ignore_errors=True)):
                build(p, job, pub)
                if detached:  # Beam's stager leaves a folder in the temp directory
                    with own_tempdir():
                        result = p.run()  # returns once the service accepted the job
                    detach_all(leases)  # the job's Publish releases them
                    handed_over = True
                    return RunSummary(job.run_id, job.output, job.report, submitted=True,
                                      job_id=getattr(result, "job_id", lambda: None)())
                with stopping.pending(lambda: _end_stages(pub)), \
                        kernel_threads(job.cfg.runner, p.options):
                    # its state as returned: the portable runner's ``state`` asks the job
                    # service, stopped by now
                    state = p.run().wait_until_finish()
        finally:
            # Beam's local runner leaves its gRPC server and channels in reference
            # cycles: collected now, their threads end with the job, not at a later
            # collection (or at interpreter exit) in a process that goes on
            del p
            gc.collect()
        return _published(job, pub.report, state)


def _published(job: Job, report: str, state: str | None) -> RunSummary:
    """This run's summary, once the runner says the job is done: the runner's result
    state DONE and summary.json written by this attempt (a runner that returned early, a
    Dask cluster that went away, had the previous run's summary.json read as this one's).
    Otherwise ``RunIncomplete``: the Publish step did not finish, so nothing was."""
    from apache_beam.runners.runner import PipelineState

    if state is not None and state != PipelineState.DONE:
        raise RunIncomplete(f"the runner ended the job in state {state}, not DONE")
    try:
        summary = RunSummary.load(report)
    except FileNotFoundError:
        summary = None
    if summary is None or (summary.summary or {}).get("attempt") != job.attempt:
        raise RunIncomplete("the runner returned before the job had published its outputs "
                            f"(summary.json in {report} is not this run's)")
    return summary


def _end_stages(pub: Publication) -> None:
    """When the job ends, however: its staging goes; a stopped job's line first learns
    what its Publish had published, if it had begun replacing the output."""
    stopped = stopping.stopping() is not None
    if stopped:
        what = what_a_stop_left(pub)
        if what is not None:
            stopping.published(what)
    for path in own_stages(pub):  # a stopped job's threads may still be writing there
        (close_tree if stopped else delete_tree)(path)


def _innermost(e: BaseException) -> BaseException:
    """The original error: Beam wraps worker errors in its own exceptions and text."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _first_line(e: BaseException) -> str:
    """The error's own line; a worker error re-raised by Beam carries the remote traceback
    as text, so take its last "XxxError: message" line, without Beam's step suffix."""
    lines = str(e).strip().splitlines()
    if lines and lines[0].startswith("Traceback "):  # its raised lines: "a.b.Name: message"
        raised = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*: ", ln)] or lines[-1:]
    else:
        raised = [ln for ln in lines if re.match(r"[A-Za-z_.]*(Error|Exception): ", ln)]
    line = raised[-1] if raised else lines[0] if lines else type(e).__name__
    return re.sub(r" \[while running '[^']*'\]$", "", line)


def failure_line(e: BaseException) -> str:
    """One line for a job that failed while running: the original error, and the fix
    where it is a known one (a full disk or a file size limit). Nothing was published,
    unless the Publish step failed after it had begun replacing the output: then the line
    says what it published (``PublishIncomplete``)."""
    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    cause = next((c for c in chain if isinstance(c, PublishIncomplete)), chain[-1])
    lost = (None if isinstance(cause, PublishIncomplete)
            else stopping.lost_worker("\n".join(str(c) for c in chain)))
    if isinstance(cause, PublishIncomplete):
        what = f"PublishIncomplete: {cause}"
    elif lost is not None:  # the job's own error is then the end of a stream: "Empty: Empty"
        what = lost
    else:
        what = re.sub(r"^[a-z_.]+\.(\w+: )", r"\1", _first_line(cause))  # a.b.X: -> X:
    ours = re.match(r"(InvalidRecordError|TooManyInvalidError|RepeatedIdsError|RunIncomplete|"
                    r"PublishIncomplete): ", what)
    if ours:  # the job's own errors are phrased for the user already
        what = what[ours.end():]
    elif not isinstance(cause, InvalidRecordError | RunIncomplete) and lost is None and (
            not re.match(r"[A-Z]\w*: ", what)):
        what = f"{type(cause).__name__}: {what}"
    partly = ours is not None and ours.group(1) == "PublishIncomplete"
    if _NO_ROOM.search(what):
        what += (" (the disk of output.path / report / store.path is full, or a file size "
                 "limit was hit: free space first)" if partly else
                 " (the disk of output.path / report is full, or a file size limit was hit: "
                 "free space or write the outputs elsewhere, then run again)")
    if lost is None and _NO_MEMORY.search(what):  # (a lost worker's line says it)
        what += (" (out of memory: run with fewer runner.workers, or smaller "
                 "tuning.chunk_bytes, or on a machine with more memory)")
    if partly:  # "publishing stopped part way: <what was published> ...: <why>"
        return f"the job failed while publishing; {what}"
    return f"the job failed; {UNPUBLISHED}: {what}"


class _NoTracebacks:
    """sys.stderr without the tracebacks Beam's SDK harness prints there itself (not
    through logging) for a failed bundle; every other write goes through."""

    def __init__(self, stream: TextIO) -> None:
        self._stream, self._dropping = stream, False

    def write(self, text: str) -> int:
        if text.startswith("Traceback (most recent call last):"):
            self._dropping = True  # print() writes the end of line separately
            return len(text)
        if self._dropping and text == "\n":
            return len(text)
        self._dropping = False
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def _no_logged_tracebacks() -> Iterator[None]:
    """No log record carrying a traceback reaches the terminal while the job runs: the
    job's failure is its one line. Such records come from Beam's job messages (the
    portable runner logs the job service's traceback on the root logger), Dask's
    scheduler and asyncio (a cancelled failed job), whose handlers were made before
    ``sys.stderr`` was wrapped."""
    handlers = {h for name in ("", "distributed") for h in logging.getLogger(name).handlers}
    handlers.add(logging.lastResort)
    for h in handlers:
        h.addFilter(no_traceback)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(no_traceback)


@contextmanager
def beam_quiet(verbose: bool, quiet: bool = False) -> Iterator[None]:
    """While the job runs: Beam logs a worker error with its traceback (and its harness
    prints it) before raising; the CLI prints one line instead. ``verbose`` (or
    TENSORDEDUP_VERBOSE=1) keeps Beam's output. ``quiet``: no log record below ERROR and
    no Python warning from any library either."""
    with warnings.catch_warnings():
        disabled = logging.root.manager.disable
        if quiet:
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
        try:
            if verbose:
                yield
                return
            # Beam's, and Dask's client (a scheduler gone: "Failed to reconnect to
            # scheduler after 30.00 seconds", an ERROR record before the job's own line)
            logs = [logging.getLogger(name) for name in ("apache_beam", "distributed.client")]
            levels, stderr = [log.level for log in logs], sys.stderr
            for log in logs:
                log.setLevel(logging.CRITICAL)
            sys.stderr = _NoTracebacks(stderr)
            try:
                with _no_logged_tracebacks():
                    yield
            finally:
                for log, level in zip(logs, levels, strict=True):
                    log.setLevel(level)
                sys.stderr = stderr
        finally:
            logging.disable(disabled)


def is_verbose(verbose: bool | None = None) -> bool:
    """``verbose``, or when None the TENSORDEDUP_VERBOSE environment variable."""
    if verbose is not None:
        return verbose
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def to_config(config: str | os.PathLike | Mapping[str, Any] | DedupeConfig, *,
              overrides: Sequence[str] = (), overwrite: bool = False, run_id: str | None = None,
              beam_args: Sequence[str] = ()) -> DedupeConfig:
    """A checked config from a YAML path, a mapping shaped like the YAML, or a
    ``DedupeConfig``, with ``key.path=value`` overrides, ``overwrite`` (output.overwrite),
    ``run_id`` and Beam flags (``["--direct_num_workers=2"]``: runner options) applied.
    Raises ``ConfigError`` (one line naming the key)."""
    sets = [*overrides, *(["output.overwrite=true"] if overwrite else [])]
    if isinstance(config, DedupeConfig):
        if not sets and not beam_args and not run_id:
            return config
        config = config.model_dump(mode="json")
    if isinstance(config, Mapping):  # run_id as given (a string): not read as YAML
        return parse_config(config, sets, beam_args, run_id)
    if isinstance(config, str | os.PathLike):
        return load_config(config, sets, beam_args, run_id)
    raise ConfigError(f"config: give a YAML file path, a dict or a DedupeConfig, not "
                      f"{type(config).__name__}")


def run_prepared(job: Job, *, quiet: bool = False, verbose: bool = False) -> RunSummary:
    """Run a checked job (``preflight.prepare``): progress on stderr unless ``quiet``
    (bars on a terminal, lines otherwise; never bars with ``verbose``). On Dataflow the
    launch is checked first (``runners.check_launch``: ``InputError``, nothing done)."""
    from pipeline.runners import check_launch

    with beam_quiet(verbose, quiet):  # Dataflow: the GCP libraries, the buckets answering
        check_launch(job.cfg.runner, job.cfg.tuning.remote_timeout_s)
    was = progress.enabled
    progress.enable(not quiet, bars=False if verbose else None)
    try:
        progress.note(f"deduplicating {len(job.files)} {job.cfg.input.format} file(s) "
                      f"({job.cfg.runner.name} runner)")  # the start line (not when quiet)
        if job.store is not None and (line := job.store.replacing_line()):
            progress.note(line)
        for line in job.notes:
            progress.note(line)
        with beam_quiet(verbose, quiet):
            return execute(job)
    except LeaseHeld:  # another run holds the output or store: nothing was touched
        raise
    except Exception as e:  # a worker error (Beam's log: verbose)
        if isinstance(_innermost(e), KeyboardInterrupt):  # Ctrl-C inside a step: Beam
            raise KeyboardInterrupt from e  # wraps it when the step runs in this thread
        raise JobFailed(failure_line(e)) from e
    finally:
        progress.close()
        progress.enable(was)


def run_job(config: str | os.PathLike | Mapping[str, Any] | DedupeConfig, *,
            overrides: Sequence[str] = (), overwrite: bool = False, run_id: str | None = None,
            beam_args: Sequence[str] = (), quiet: bool = False, verbose: bool | None = None
            ) -> RunSummary:
    """Run the dedup job as ``tensordedup --config ...`` does and return its summary.

    Args:
      config: a YAML file's path, a dict shaped like the YAML, or a
        ``pipeline.config.DedupeConfig``. Relative paths in it are relative to the
        current directory.
      overrides: ``key.path=value`` strings, as ``--set`` (values read as YAML).
      overwrite: replace an existing output and report (``--overwrite``).
      run_id: this run's id (``--run-id``; default: today's UTC date), taken as given:
        "0123" stays 0123, as it does with ``--set run_id=0123`` and in a YAML file.
      beam_args: Beam pipeline flags for the runner (``["--direct_num_workers=2"]``), as
        after ``--`` on the command line.
      quiet: no progress and no start line on stderr, library warnings and log records
        below ERROR silenced (``--quiet``).
      verbose: keep Beam's log output (worker tracebacks); None: TENSORDEDUP_VERBOSE.

    Raises ``ConfigError`` / ``InputError`` (bad config or input, before any work),
    ``LeaseHeld`` (another run holds the output, report or store), ``JobFailed`` (the job
    failed while running; nothing published). On a runner that does not wait
    (Dataflow) it returns once the job is submitted: ``submitted`` is True.
    """
    verbose = is_verbose(verbose)
    cfg = to_config(config, overrides=overrides, overwrite=overwrite, run_id=run_id,
                    beam_args=beam_args)
    with stopping.handled(exits=False):  # Ctrl-C stops the job's processes too
        with beam_quiet(verbose, quiet):  # e.g. gcsio's warnings about credentials
            job = prepare(cfg)
        return run_prepared(job, quiet=quiet, verbose=verbose)
