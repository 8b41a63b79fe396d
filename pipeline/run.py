"""``tensordedup --config configs/dedupe.yaml`` (or ``python -m pipeline.run ...``): the
dedup job's command line; ``pipeline.api`` runs the job (``run_job`` from Python).

Exit codes: 0 done; 2 bad config or input, found before any work (one line, no
traceback); 1 the job failed while running (e.g. an invalid record with
``on_invalid: fail``, too many invalid records, a full disk), with one line saying why;
130 interrupted (Ctrl-C), 143 stopped by SIGTERM; nothing is published then. Beam's
own log lines (worker tracebacks) are hidden unless ``--verbose`` or
``TENSORDEDUP_VERBOSE=1``. Beam pipeline flags after ``--`` go to the runner
(``tensordedup --config c.yaml -- --direct_num_workers=2``).
"""

from __future__ import annotations

import argparse
import difflib
import gc
import multiprocessing
import os
import signal
import sys

from pipeline import stopping  # the standard library only: before the heavy imports

CONSOLE_SCRIPT = "tensordedup"
_spawned = getattr(multiprocessing.current_process(), "_inheriting", False)
if _spawned:
    # A process that multiprocessing spawns (a worker of the Dask cluster the job starts)
    # imports the command's module first: a Ctrl-C at the terminal reaches it too, and
    # the launcher alone decides what stops (pipeline.stopping kills it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prog() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return CONSOLE_SCRIPT if name.startswith(CONSOLE_SCRIPT) else "python -m pipeline.run"


# The command's imports (Beam, Arrow...) make about 170k objects that live as long as the
# process: collecting while they load is wasted work (three full collections, 0.1-0.2 s).
# console() then freezes them (pipeline.runners.local.imports_frozen). They take seconds:
# a Ctrl-C or SIGTERM then (the command's process only, not a library's import) ends it
# with the stop's one line, not a traceback through Beam's __init__.
_collecting = gc.isenabled()
gc.disable()
try:
    with stopping.while_importing(not _spawned and (
            __name__ == "__main__" or _prog() == CONSOLE_SCRIPT)):
        from pipeline.api import (
            VERBOSE_ENV,
            JobFailed,
            beam_quiet,
            is_verbose,
            publication,
            run_prepared,
            to_config,
        )
        from pipeline.config import ConfigError, describe_keys
        from pipeline.preflight import prepare
        from pipeline.publish import held_lines
        from pipeline.runners.common import end_process, fewer_malloc_arenas, imports_frozen
        from transforms.io.formats.base import InputError
        from transforms.io.lease import LeaseHeld
finally:
    if _collecting:
        gc.enable()

EXIT_FAILED, EXIT_USAGE = 1, 2


def split_beam_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The CLI's own arguments, and Beam's pipeline flags after the first ``--``."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The CLI's arguments; ``beam_args`` holds the flags after ``--``."""
    ours, beam_args = split_beam_args(list(sys.argv[1:] if argv is None else argv))
    prog = _prog()
    ap = _Parser(
        prog=prog,
        usage=f"{prog} --config CONFIG [options] [-- BEAM_FLAG ...]",
        description="Remove exact and near-duplicate tensors from TFRecord / Parquet / HDF5 files: "
                    "writes clean shards in the same format and a report of what was "
                    "removed and why.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --overwrit is not --overwrite: a destructive flag is spelt out
        epilog="config keys (YAML; any of them can be given with --set key.path=value):\n"
               + "\n".join(describe_keys())
               + "\n\nBeam pipeline flags after -- go to the runner, as runner.options "
                 "(typed runner keys on Dataflow: --project, --region, ...), over the "
                 "config's: e.g. " + prog + " --config c.yaml -- --direct_num_workers=2"
               + "\n\nPaths are relative to the current directory. Exit codes: 0 done, "
                 "1 the job failed, 2 bad config or input (before any work), 130 "
                 "interrupted (Ctrl-C), 143 stopped by SIGTERM.")
    ap.add_argument("--config", help="YAML job config (see keys below); also the first "
                    "argument alone: " + prog + " c.yaml")
    ap.add_argument("config_file", nargs="?", metavar="CONFIG", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set keep=last (repeatable)")
    ap.add_argument("--overwrite", action="store_true",
                    help="same as --set output.overwrite=true")
    ap.add_argument("--run-id", metavar="ID",
                    help="this run's id, taken as typed (0123 stays 0123; default: today's UTC "
                    "date)")
    ap.add_argument("--quiet", action="store_true",
                    help="print nothing on stderr but errors: no start line, progress or "
                         "notes; library warnings and log records below ERROR are dropped "
                         "(the summary still goes to stdout)")
    ap.add_argument("--verbose", action="store_true",
                    help=f"show Beam's log lines (worker tracebacks) above the one-line error "
                         f"(also: {VERBOSE_ENV}=1); progress as "
                         "plain lines")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the config and build the job offline (on Dataflow: the job "
                         "a real run would submit), print what it would run and its "
                         "capacity plan (time, shuffle, spill, memory, worker-hours; "
                         "docs/scale.md) and exit; nothing is submitted, written or "
                         "published")
    ap.add_argument("--plan-records", type=_count, metavar="N",
                    help="--dry-run: plan for N records of the input's kind (e.g. the input "
                         "is a local sample of the full data set); 1e9 and 1_000_000 are "
                         "numbers too")
    args = ap.parse_args(ours)
    if args.config_file is not None and args.config not in (None, args.config_file):
        ap.error(f"two configs given ({args.config_file!r} and --config {args.config!r}): "
                 "give one")
    args.config = args.config or args.config_file
    if args.config is None:
        ap.error(f"no config given: {prog} --config c.yaml (the job's YAML file)")
    args.beam_args = beam_args
    return args


class _Parser(argparse.ArgumentParser):
    """A mistyped flag or a missing config is one line with the fix, exit 2 (argparse
    prints its usage line above the error and names no fix)."""

    def error(self, message: str):
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:
            message = "; ".join(self._unknown(a) for a in unknown.split())
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")

    def _unknown(self, arg: str) -> str:
        if not arg.startswith("-"):
            return f"unexpected argument {arg!r}: the config is given once"
        flag = arg.split("=", 1)[0]
        ours = [o for a in self._actions for o in a.option_strings]
        near = difflib.get_close_matches(flag, ours, n=1, cutoff=0.75)
        if near:
            return f"unknown flag {flag!r}: did you mean {near[0]}?"
        return (f"unknown flag {flag!r}: Beam pipeline flags go after -- "
                f"({self.prog} --config c.yaml -- {arg})")


def _count(text: str) -> int:
    """A whole number as people write large ones: 1000000, 1_000_000, 1e9, 2.5e6."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of records") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of records")
    return int(value)


def main(argv: list[str] | None = None) -> int:
    """The command line (also the ``tensordedup`` console script; ``argv`` None: the
    process's arguments). Ctrl-C (SIGINT) or SIGTERM anywhere: one line and exit 130 or
    143 within seconds, the job's processes stopped, staging directories removed and
    nothing published (``pipeline.stopping``)."""
    with stopping.handled(exits=True):
        try:
            return _main(argv)
        except KeyboardInterrupt:
            return stopping.stopped()


def _main(argv: list[str] | None) -> int:
    fewer_malloc_arenas()
    args = parse_args(argv)
    if args.plan_records is not None and (args.plan_records < 1 or not args.dry_run):
        print("error: --plan-records: give a number of records >= 1, with --dry-run",
              file=sys.stderr)
        return EXIT_USAGE
    verbose = is_verbose(args.verbose or None)
    stopping.verbose(verbose)
    try:
        cfg = to_config(args.config, overrides=args.set, overwrite=args.overwrite,
                        run_id=args.run_id, beam_args=args.beam_args)
        with beam_quiet(verbose, args.quiet):  # e.g. gcsio's warnings about credentials
            job = prepare(cfg)
    except (ConfigError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        if args.dry_run and isinstance(e, InputError) and str(e).startswith("input.path"):
            from pipeline.capacity.plan import lacking

            say("\n".join(lacking(cfg, str(e).split(": ", 1)[-1])))
        return EXIT_USAGE
    if args.dry_run:  # the job built offline: nothing submitted, written or published
        return _dry_run(job, args.plan_records)
    try:
        result = run_prepared(job, quiet=args.quiet, verbose=verbose)
    except (LeaseHeld, InputError) as e:  # another run holds the output or store, or a
        # Dataflow launch that cannot start (its libraries, its buckets): nothing touched
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except JobFailed as e:  # one line (Beam's log: --verbose)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    say(str(result))
    return 0


def say(text: str) -> None:
    """``text`` on stdout, the command's result. A reader that has gone (``| head -1``)
    changes nothing: the run is done, its exit code stays; what is left to print goes to
    /dev/null (also the flush at exit, which would fail the same way)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def _dry_run(job, records: int | None) -> int:
    """The graph built offline (``runner.dry_run``), then the capacity plan."""
    from pipeline.capacity.plan import RATES_ENV, Rates, plan_lines
    from pipeline.graph import build
    from pipeline.runners import dry_run

    try:
        rates = Rates.load()
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {RATES_ENV}: the rates file cannot be read ({e}): write one with "
              "scripts/bench_rates.py --json PATH, or unset it", file=sys.stderr)
        return EXIT_USAGE
    code = dry_run(job, lambda p: build(p, job, publication(job)))
    if code == 0:
        say("\n".join(plan_lines(job, records, rates)))
        updates = job.store is not None and job.cfg.store.update
        for line in held_lines(job.output, job.report, job.store.path if updates else None):
            say(line)
    return code


def console() -> None:
    """The command's process (``tensordedup``, ``python -m pipeline.run``): ``main`` with
    the imports frozen, then the process ended without the interpreter's teardown
    (``pipeline.runners.local``: together about 0.5-1 s of a 1 M row job's 5-6 s)."""
    imports_frozen()
    end_process(main())


if __name__ == "__main__":
    console()
