"""``python -m pipeline.run --config configs/dedupe.yaml``: the dedup job's command line.

Exit codes: 0 done; 2 bad config or input, found before any work (one line, no
traceback); 1 the job failed while running (e.g. an invalid record with
``on_invalid: fail``, too many invalid records, a full disk), with one line saying why;
130 interrupted (Ctrl-C); nothing is published then. Beam's own log lines (worker
tracebacks) are hidden unless ``--verbose`` or ``TENSORDEDUP_VERBOSE=1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Beam warns about optional GCP client libraries when imported: noise for users.
logging.getLogger().addFilter(lambda r: "apitools not found" not in r.getMessage())

from pipeline.config import ConfigError, describe_keys, load_config  # noqa: E402
from pipeline.preflight import Job, prepare  # noqa: E402
from pipeline.publish import (  # noqa: E402
    Publication,
    clear_leftovers,
    own_stages,
    take_leases,
)
from pipeline.steps import progress  # noqa: E402
from transforms.fingerprint import SCHEME  # noqa: E402
from transforms.formats.base import InputError, InvalidRecordError  # noqa: E402
from transforms.fs import delete_tree, join, read_bytes  # noqa: E402
from transforms.lease import LeaseHeld, keep_alive, release_all  # noqa: E402
from transforms.near_recall import recall_line  # noqa: E402

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
VERBOSE_ENV = "TENSORDEDUP_VERBOSE"
# errno values of a write that ran out of room: ENOSPC, EDQUOT, EFBIG (a file size limit)
_NO_ROOM = re.compile(r"\[Errno (28|122|27)\]|No space left|Disk quota exceeded|File too large",
                      re.I)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.run",
        description="Remove exact and near-duplicate tensors from TFRecord / Parquet / HDF5 files: "
                    "writes clean shards in the same format and a report of what was "
                    "removed and why.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (YAML; any of them can be given with --set key.path=value):\n"
               + "\n".join(describe_keys())
               + "\n\nPaths are relative to the current directory. Exit codes: 0 done, "
                 "1 the job failed, 2 bad config or input.")
    ap.add_argument("--config", required=True, help="YAML job config (see keys below)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set keep=last (repeatable)")
    ap.add_argument("--overwrite", action="store_true",
                    help="same as --set output.overwrite=true")
    ap.add_argument("--run-id", metavar="ID",
                    help="same as --set run_id=ID (default: today's UTC date)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--verbose", action="store_true",
                    help=f"show Beam's log lines (worker tracebacks) above the one-line error "
                         f"(also: {VERBOSE_ENV}=1)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the config and build the job offline (on Dataflow: the job "
                         "a real run would submit), print what it would run and exit; "
                         "nothing is submitted, written or published")
    return ap.parse_args(argv)


def beam_pipeline(job: Job):
    from pipeline.runner import make_pipeline

    return make_pipeline(job.cfg.runner)


def publication(job: Job) -> Publication:
    """What the Publish step needs: final and staging paths, and summary.json's header."""
    cfg = job.cfg
    store = None
    if job.store is not None and cfg.store.update:
        store = job.store.begin()
    resolved = {"shape": None if job.resolved.shape is None else list(job.resolved.shape),
                "dtype": job.resolved.dtype, "inputs": len(job.files)}
    return Publication(
        job.output, job.report, job.staging(job.output), job.staging(job.report), job.replace,
        time.time(),
        header={"run_id": job.run_id, "attempt": job.attempt, "fingerprint_scheme": SCHEME,
                "working_dir": os.getcwd(),  # resolves relative input paths in record ids
                "config": cfg.model_dump(mode="json"), "resolved": resolved,
                "store": None if job.store is None else job.store.describe()},
        near_settings=None if cfg.near is None else cfg.near.model_dump(mode="json"),
        store=store, spill=job.spill if job.near else None)


def execute(job: Job) -> dict | None:
    """Run the graph; its last step publishes outputs, commits the store and writes
    summary.json. First the run takes its one-writer leases (output, report, store it
    updates), so a rival run is refused with one line (exit 2) before anything is deleted
    or written; under them the store's view is taken again and what dead runs left is
    cleared. The leases are renewed while the job runs and released when it ends, however
    it ends; a runner that does not block (Dataflow) hands them to its Publish step, which
    releases them. Returns the summary, or None for a runner that does not block."""
    from pipeline.graph import build
    from pipeline.runner import blocks

    detached = not blocks(job.cfg.runner)
    updates = job.store is not None and job.cfg.store.update
    try:
        leases = take_leases(job.output, job.report, job.store.path if updates else None,
                             job.run_id, detached)
    except OSError as e:  # no create-if-absent on this filesystem: nothing written yet
        raise LeaseHeld(str(e)) from None
    handed_over = False
    try:
        with keep_alive(leases):
            if updates:
                job = dataclasses.replace(job, store=job.store.refreshed())
                job.store.clear_attempts()
            for final, lease in zip((job.output, job.report), leases, strict=False):
                clear_leftovers(final, lease)
            pub = dataclasses.replace(publication(job), leases=tuple(leases),
                                      release_leases=detached)
            p = beam_pipeline(job)
            build(p, job, pub)
            if detached:
                result = p.run()
                handed_over = True
                job_id = getattr(result, "job_id", lambda: None)()
                print(f"submitted{f' job {job_id}' if job_id else ''}: the job publishes its "
                      f"outputs and writes {pub.report}/summary.json when it succeeds (it "
                      "holds the output's lease until then)", file=sys.stderr)
                return None
            try:
                p.run().wait_until_finish()
            finally:
                for stage in own_stages(pub):
                    delete_tree(stage)
            return json.loads(read_bytes(join(pub.report, "summary.json")))
    finally:
        if not handed_over:
            release_all(leases)


def _innermost(e: BaseException) -> BaseException:
    """The original error: Beam wraps worker errors in its own exceptions and text."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _first_line(e: BaseException) -> str:
    """The error's own line; a worker error re-raised by Beam carries the remote traceback
    as text, so take its last "XxxError: message" line, without Beam's step suffix."""
    lines = str(e).strip().splitlines()
    raised = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", ln)]
    line = raised[-1] if raised else lines[0] if lines else type(e).__name__
    return re.sub(r" \[while running '[^']*'\]$", "", line)


def _failure_line(e: BaseException) -> str:
    """One line for a job that failed while running: the original error, and the fix
    where it is a known one (a full disk or a file size limit)."""
    cause = _innermost(e)
    what = re.sub(r"^[a-z_.]+\.(\w+: )", r"\1", _first_line(cause))  # a.b.XError: -> XError:
    ours = re.match(r"(InvalidRecordError|TooManyInvalidError): ", what)
    if ours:  # the job's own errors are phrased for the user already
        what = what[ours.end():]
    elif not isinstance(cause, InvalidRecordError) and not re.match(
            r"\w+(Error|Exception): ", what):
        what = f"{type(cause).__name__}: {what}"
    if _NO_ROOM.search(what):
        what += (" (the disk of output.path / report is full, or a file size limit was hit: "
                 "free space or write the outputs elsewhere, then run again)")
    return f"error: the job failed, the run is not complete (no summary.json): {what}"


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
def _beam_quiet(verbose: bool) -> Iterator[None]:
    """While the job runs: Beam logs a worker error with its traceback (and its harness
    prints it) before raising; the CLI prints one line instead. --verbose (or
    TENSORDEDUP_VERBOSE=1) keeps Beam's output."""
    if verbose:
        yield
        return
    beam_log = logging.getLogger("apache_beam")
    level, stderr = beam_log.level, sys.stderr
    beam_log.setLevel(logging.CRITICAL)
    sys.stderr = _NoTracebacks(stderr)
    try:
        yield
    finally:
        beam_log.setLevel(level)
        sys.stderr = stderr


def human_summary(s: dict) -> str:
    removed = {k.removeprefix("removed_"): v for k, v in s.items()
               if k.startswith("removed_") and v}
    how = ", ".join(f"{k} {v:,}" for k, v in removed.items()) or "none"
    lines = [f"run {s['run_id']}: read {s['read']:,} records: kept {s['kept']:,}, removed "
             f"{sum(removed.values()):,} ({how}), invalid {s['invalid']:,} in "
             f"{s['wall_time_s']:.1f} s",
             f"clean shards: {s['output']}/ "
             f"({sum(f['output'] is not None for f in s['files'])} files)",
             f"report: {s['report']}/ (duplicates.parquet, invalid.parquet, summary.json"
             + (", near_distances.png/.json/.csv, borderline_pairs.parquet" if s.get("near")
                else "") + (", reference_invalid.parquet" if s.get("reference") else "") + ")"]
    if s.get("near"):
        n = s["near"]
        how = f", at most {n['probes']} per record" if n["mode"] == "bounded" else ""
        lines.append(f"near: {n['mode']} search in {n['cells']:,} cell(s){how}; "
                     f"{recall_line(n['recall'])}")
    if s.get("reference"):
        r = s["reference"]
        lines.append(f"reference: {r['read']:,} records in {r['files']} file(s) ({r['invalid']:,}"
                     " unreadable); removed as leaks: "
                     f"{s['removed_reference_exact'] + s['removed_reference_near']:,}")
    if s.get("store"):
        st = s["store"]
        line = f"store: {st['path']}: checked against {st['earlier_runs']} earlier run(s); "
        if not st.get("committed"):
            line += "not updated (store.update: false)"
        else:
            line += f"{st['appended']:,} records appended"
            if st.get("compaction_merges"):
                line += f"; {st['compaction_merges']} compaction merge(s)"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line; Ctrl-C anywhere is one line and exit 130 (staging directories are
    removed by ``execute``; Publish has not run, so the old outputs are untouched)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted: nothing was published (earlier outputs are unchanged); run the "
              "same command again to redo the job", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    overrides = args.set + (["output.overwrite=true"] if args.overwrite else []) + (
        [f"run_id={args.run_id}"] if args.run_id else [])
    verbose = args.verbose or os.environ.get(VERBOSE_ENV, "") not in ("", "0")
    try:
        with _beam_quiet(verbose):  # e.g. gcsio's warnings about credentials
            job = prepare(load_config(args.config, overrides))
    except (ConfigError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:  # the job built offline: nothing submitted, written or published
        from pipeline.graph import build
        from pipeline.runner import dry_run

        return dry_run(job, lambda p: build(p, job, publication(job)))
    progress.reset(show=not args.quiet)
    print(f"deduplicating {len(job.files)} {job.cfg.input.format} file(s) "
          f"({job.cfg.runner.name} runner)", file=sys.stderr)
    try:
        with _beam_quiet(verbose):
            summary = execute(job)
    except LeaseHeld as e:  # another run holds the output or store: nothing was touched
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a worker error: one line (Beam's log: --verbose)
        print(_failure_line(e), file=sys.stderr)
        return EXIT_FAILED
    if summary is not None:
        print(human_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
