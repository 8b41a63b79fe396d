"""What every runner module shares: the processes it starts (their environment, their
progress relayed to the launcher, their log lines), the cores it may use, Beam's
data-plane flush race and how it is avoided, what a runner does with finished steps,
and how a command's process ends.

Why one module: the local runner's worker processes, the portable runner's pool and a
Dask cluster the job starts each needed these, and the runner modules import only this
one (and the steps and the config's types), never each other
(``tests/test_architecture.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import sys
import threading
from typing import NoReturn

from pipeline import stopping
from pipeline.config.runner import RunnerConfig

RELAY_S = 0.1  # how often the workers' forwarded progress is read


ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
# the environment of worker processes that share the cores: each one's BLAS spinning a
# thread per core against the others' cost the 1M x 384 near job 128 s of CPU against 80 s

WORKER_LOG_ENV = "TENSORDEDUP_WORKER_LOG"  # worker_log()'s answer, for the workers
def worker_env() -> dict[str, str]:
    """The environment of worker processes: this interpreter first on PATH (Beam's pool
    starts each worker as ``python -c ...``) and this process's import paths outside the
    installation on PYTHONPATH, so workers import the same project modules (a checkout
    on PYTHONPATH wins over an installed copy there as it does here)."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = []
    for p in sys.path:
        p = os.path.realpath(p or os.getcwd())
        if os.path.isdir(p) and not any(p == d or p.startswith(d + os.sep) for d in installed):
            paths.append(p)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("MALLOC_ARENA_MAX", str(MALLOC_ARENAS))
    env.setdefault("MIMALLOC_PURGE_DELAY", MIMALLOC_PURGE)
    return env


MALLOC_ARENAS = 2  # glibc's default is 8 per core: each thread's freed memory stays in its
# own arena. Measured on the CLI (2 cores): 1M copies of one 64-d record peaked at 3.18 GB
# with the default and 2.53 GB with 2 (the bound is 3 GB); 1M x 384 near: 2.58-2.68 GB
# and 51-56 s against 2.41-2.46 GB and 50-56 s. (A 1 MB mmap threshold went lower, 1.9
# GB, but took 68-80 s: every large array faulted in afresh.)


MIMALLOC_PURGE = "0"  # ms before Arrow's allocator (mimalloc) hands freed pages back; its
# default delay runs out only when the freeing thread allocates again, and a worker
# thread goes idle after its step: the report's selection of 1M removals left 260 MB
# resident behind it. Measured with 0 (2 cores): 1M x 384 near 47.5-47.9 s and 1.95-2.05
# GB against 49.4-49.8 s and 2.78-2.87 GB; one crowd of 1.05M 64-d records 2.81 against
# 3.05 GB. (Arrow on glibc's malloc went lower, 1.93-2.14 GB, but took 50-52 s.)


def glibc():
    """glibc through ctypes, or None (another platform or C library)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def fewer_malloc_arenas() -> None:
    """This process's glibc malloc to MALLOC_ARENAS arenas, as its workers get them,
    unless MALLOC_ARENA_MAX says otherwise (nothing on another C library)."""
    libc = glibc()
    if libc is not None and "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(-8, MALLOC_ARENAS)  # M_ARENA_MAX


def imports_frozen() -> None:
    """Moves every object this process has made so far out of the collector's sight
    (``gc.freeze``). Call it once the command's imports are done: Beam, Arrow and the
    rest make about 170k objects that live as long as the process, and each full
    collection of the job (one at its end included) walked them all, 0.1-0.3 s a run."""
    gc.freeze()


def end_process(code: int) -> NoReturn:
    """Ends a command's process with ``code``, its work done: the exit handlers run (logs
    flushed, temporary folders removed), the interpreter's teardown does not. That
    teardown frees the whole heap object by object and runs the C++ libraries'
    destructors: 0.4-0.5 s after a 1 M row job, and where Beam's gRPC threads once
    aborted the process (exit 134). A non-daemon thread still running gets the normal
    exit, which waits for it."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say
            pass
    os._exit(code)


class RunIncomplete(RuntimeError):
    """The runner returned, but the job did not finish: a cluster that went away, a
    result state other than DONE, a summary.json that is not this attempt's. Its message
    is phrased for the user (the one line after "the job failed; ...")."""


class Relay:
    """Replays in this process's progress tally the calls the worker processes append
    to a file (``pipeline.progress.FORWARD_ENV``), so the launcher shows the whole
    job's progress, as for in-process workers."""

    def __init__(self, path: str):
        self.path, self._pos, self._partial = path, 0, b""
        open(path, "wb").close()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensordedup-progress-relay",
                                        daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        from pipeline import progress

        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read()
        self._pos += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(Exception):  # progress is not worth an error
                progress.replay(line.decode())

    def _run(self) -> None:
        while not self._stop.wait(RELAY_S):
            self._drain()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()


def progress_relay(folder: str) -> tuple[Relay | None, dict[str, str]]:
    """For worker processes a run starts: the relay of their progress (its file in
    ``folder``) and the environment they forward it with; (None, {}) when this process
    shows no progress. Stop the relay after the workers: their last calls are in then."""
    from pipeline import progress

    if not progress.enabled:
        return None, {}
    relay = Relay(os.path.join(folder, "progress.jsonl"))
    return relay, {progress.FORWARD_ENV: relay.path}


def worker_log() -> str:
    """What the launcher shows (``api.beam_quiet``), for its worker processes to show the
    same: ``all`` (--verbose: Beam's log lines, worker tracebacks), ``warnings`` (the
    default: warnings and errors but Beam's own, whose failure the launcher reports in
    one line), ``none`` (--quiet)."""
    if logging.getLogger("apache_beam").isEnabledFor(logging.ERROR):
        return "all"
    return "none" if logging.root.manager.disable >= logging.WARNING else "warnings"


def no_traceback(record: logging.LogRecord) -> bool:
    """A log filter: no record that carries a traceback (a step's failure, logged where
    it happened; the launcher says it in one line)."""
    return record.exc_info is None and "Traceback" not in record.getMessage()


def launcher_waits(cfg: RunnerConfig) -> bool:
    """Whether the launcher waits for the job. Not on Dataflow: a Flex Template launcher
    must return once the job is submitted (waiting blocks the template), and the job
    finishes and publishes on its own workers."""
    return cfg.name != "dataflow"


# The Beam release whose data plane was read and whose workaround is tested
# (docs/beam-flush-race.md, tests/test_runners.py); its graph checks too
# (graph_checks_memoized).
FLUSH_RACE_BEAM = "2.77."


def graph_checks_memoized() -> None:
    """Make Beam 2.77 answer two questions it asks over and over while a job's graph is
    built and encoded once per object instead (process-wide, idempotent; other Beam
    releases are left alone). ``PipelineOptions.view_as`` parses the flags anew with a
    fresh argparse parser on every call: about 1,000 calls per near job (every ``apply``,
    every type check). ``userstate.get_dofn_specs`` inspects every method of a DoFn: 6
    calls per ParDo. Together a quarter of a small near job's CPU in the launching
    process (the 4,500-record sample: 4.0 -> 3.0 s, its graph's build 0.7 -> 0.25 s).
    Both answers depend only on their object: a view shares its options' values
    (``_all_options``), and a DoFn's state and timer specs are the defaults of its
    methods' parameters."""
    import weakref

    import apache_beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import userstate

    if (not apache_beam.__version__.startswith(FLUSH_RACE_BEAM)
            or getattr(PipelineOptions.view_as, "memoized", False)):
        return
    view_as, specs_of = PipelineOptions.view_as, userstate.get_dofn_specs
    views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def memo_view_as(self, cls):
        mine = views.setdefault(self, {})
        if cls not in mine:
            mine[cls] = view_as(self, cls)
        return mine[cls]

    def memo_get_dofn_specs(dofn):
        try:
            return specs[dofn]
        except (KeyError, TypeError):  # TypeError: a DoFn with no weak reference or hash
            found = specs_of(dofn)
        with contextlib.suppress(TypeError):
            specs[dofn] = found
        return found

    memo_view_as.memoized = True
    PipelineOptions.view_as = memo_view_as
    userstate.get_dofn_specs = memo_get_dofn_specs


def recomputes_finished_steps(cfg: RunnerConfig) -> bool:
    """Whether a lost worker's finished steps run again (from their inputs, files the
    job wrote included): on Dask what the worker held is recomputed from the graph; the
    other runners keep finished stages' outputs (shuffle files, the runner's memory)."""
    return cfg.name == "dask"


def shuffle_carries_rows(runner: str) -> bool:
    """Whether the near cells' rows travel through the runner's shuffle: on Dataflow,
    whose shuffle is a service and whose spill is on an object store, where a cell would
    read its slice of every chunk's spill file by a request each (docs/scale.md). The
    local runner and Dask hold a shuffle in memory, so they move references instead.
    ``runner``: ``runner.name``."""
    return runner == "dataflow"


def copies_at_once(cfg: RunnerConfig) -> int:
    """Files each worker's clean-copy step writes at once: two on the local runner's one
    worker (the copies' encoding releases the GIL, so the second uses the other core),
    one where parallel workers or threads share the cores already. Never more than one
    on Dask: Beam 2.77's DaskRunner collects a task's outputs before it calls
    ``finish_bundle``, which emits the last copies of a bundle."""
    return 2 if cfg.name == "local" and (cfg.workers or available_cores()) == 1 else 1


def available_cores() -> int:
    """Cores this process may run on: a container's or taskset's limit, not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def flush_race_problem() -> str | None:
    """Why the flush-race workaround cannot be applied to the installed Beam, or None.

    Beam 2.77's local runner with more than one worker moves data over a gRPC data plane
    whose output streams flush on a 1-second timer thread as well as by size, and that
    thread clears the buffer without a lock against the writing thread: elements written
    between its read and its clear are lost. The workaround (time limit 0: size-based
    flushing only, Dataflow's default) is checked against exactly this code."""
    import apache_beam
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.runners.worker import data_plane

    if not apache_beam.__version__.startswith(FLUSH_RACE_BEAM):
        return (f"apache-beam {apache_beam.__version__} is not {FLUSH_RACE_BEAM}x, whose "
                "data-plane flush race the workaround was made and tested for")
    if not isinstance(getattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS", None), int):
        return ("apache_beam.runners.portability.fn_api_runner.worker_handlers has no "
                "DATA_BUFFER_TIME_LIMIT_MS")
    if not issubclass(getattr(data_plane, "TimeBasedBufferingClosableOutputStream", type),
                      getattr(data_plane, "SizeBasedBufferingClosableOutputStream", ())):
        return "apache_beam.runners.worker.data_plane's buffering streams have changed"
    return None


def waits_end_with_their_worker() -> None:
    """Beam's runner waits on a worker's answer with no timeout, so a worker process
    killed outright (the OOM killer, ``kill -9``) while it ran a step that no other
    worker's failure ends (Publish) left the job waiting for ever, on the local runner's
    processes and the portable runner's pool alike (Sweep K). Once a worker's control
    stream has ended (its process gone, or the runner done with it), the requests in
    flight on it and any sent to it later fail (``stopping.WORKER_GONE``). Process-wide, once,
    before a runner is built."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    conn = worker_handlers.ControlConnection
    if getattr(conn, "_fails_when_ended", False):
        return
    read = conn._read

    def _read(self) -> None:
        try:
            read(self)
        finally:
            gone, push = RuntimeError(stopping.WORKER_GONE), self.push

            def push_failed(request):
                future = push(request)
                if future is not None:  # not the runner's own end-of-stream marker
                    future.abort(gone)
                return future

            self.push = push_failed
            self.abort(gone)

    conn._read, conn._fails_when_ended = _read, True


def avoid_flush_race() -> str | None:
    """Turn off the data plane's time-based flush (process-wide, before a runner is
    built); returns why it could not be done, or None once it is done."""
    problem = flush_race_problem()
    if problem is None:
        from apache_beam.runners.portability.fn_api_runner import worker_handlers

        worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
    return problem
