"""Worker processes on this machine: the local runner's for jobs with a near stage
(``runner.processes``), and the portable runner's pool (``pipeline.portable``).

Why processes for the near stage: its cells are many small NumPy and Python steps, and
two worker threads of one interpreter hand its lock back and forth thousands of times a
second (a futex wake-up each, costly on a VM); measured on 1M x 384 at cosine 0.01 on 2
cores, the cells took 18-19.6 s on two threads, 14.4 s on one, 9.8 s on two processes
(docs/pipeline.md#runners). What the workers need and Beam's own command does not give
them: this interpreter and the project's import paths (``worker_env``), one BLAS/OpenMP
thread per call (``THREAD_VARS``: the processes share the cores) and one Parquet row
group read ahead each (``kernel_threads`` does both for threads), their progress shown
by the launcher (``Relay``) and their log lines below warnings kept off the terminal
(``python -m pipeline.processes``: Beam's SDK worker with a quiet handler; this module
imports Beam and the steps only inside functions, so that handler comes first).
Also how a command's process ends once its work is done (``end_process``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import NoReturn

from transforms import periodic

RELAY_S = 0.1  # how often the workers' forwarded progress is read
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Beam's warning that in-memory mode ignores the worker count: the local process runner
# keeps that mode's name while it starts its own worker processes.
_IN_MEMORY_WARNING = "If direct_num_workers is not equal to 1"
QUIET_WORKER = ("apitools not found",  # Beam's GCP modules on import
                "No semi_persistent_directory found")  # Dataflow's worker cache
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


def _libc():
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
    libc = _libc()
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


def finished_outputs_dropped() -> None:
    """Make Beam's SDK worker in this process let go of a bundle's output stream when the
    bundle finishes (idempotent). Beam 2.77 keeps the stream on the stage's cached
    processor until that stage's next bundle, and the stream's C buffer never shrinks:
    it doubles until it holds the largest element it carried. The cells stage that sent
    one crowd's cell of a million rows kept 0.5 GB resident in its worker for the rest of
    the job (one crowd of 1.05M 64-d records, components: 3.0 -> 2.3 GB). Beam sets a new
    stream at each bundle's start and reads it only in ``process`` and ``finish``."""
    from apache_beam.runners.worker.bundle_processor import DataOutputOperation

    finish = DataOutputOperation.finish
    if getattr(finish, "drops_stream", False):
        return

    def finish_and_drop(self) -> None:
        finish(self)
        self.output_stream = None

    finish_and_drop.drops_stream = True
    DataOutputOperation.finish = finish_and_drop


TRIM_S = 1.0  # how often a local process hands its freed heap memory back to the system


@contextlib.contextmanager
def freed_memory_released() -> Iterator[None]:
    """Inside the block, hand this process's freed heap memory back to the system every
    TRIM_S seconds from a thread (glibc only: ``malloc_trim``), as jemalloc's and
    mimalloc's background purging do. glibc returns only the top of its heap by itself;
    the pieces a finished step freed in the middle stay in the process's resident memory,
    and the next step's peak stacks on them: one crowd of 750k 64-d records in
    components grouping peaked at 3.1 GB without it, 2.7 GB with it (docs/pipeline.md)."""
    libc = _libc()
    if libc is None:
        yield
        return
    with periodic.every(TRIM_S, lambda: libc.malloc_trim(0), "tensordedup-trim"):
        yield


class Relay:
    """Replays in this process's progress tally the calls the worker processes append
    to a file (``pipeline.steps.progress.FORWARD_ENV``), so the launcher shows the whole
    job's progress, as for in-process workers."""

    def __init__(self, path: str):
        self.path, self._pos, self._partial = path, 0, b""
        open(path, "wb").close()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensordedup-progress-relay",
                                        daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        from pipeline.steps import progress

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
    from pipeline.steps import progress

    if not progress.enabled:
        return None, {}
    relay = Relay(os.path.join(folder, "progress.jsonl"))
    return relay, {progress.FORWARD_ENV: relay.path}


@contextlib.contextmanager
def _local_workers() -> Iterator[str]:
    """The shell command that starts one local worker process, valid inside the block
    (its progress file lives in a directory removed after it)."""
    tmp = tempfile.mkdtemp(prefix="tensordedup-workers-")
    env = {v: "1" for v in THREAD_VARS}
    env[WORKER_LOG_ENV] = worker_log()
    shared = worker_env()
    for k in ("PYTHONPATH", "MALLOC_ARENA_MAX", "MIMALLOC_PURGE_DELAY"):
        env[k] = shared[k]
    relay, forward = progress_relay(tmp)
    env.update(forward)
    sets = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    try:
        # SIGINT ignored from the start (kept across exec): a Ctrl-C at the terminal
        # reaches the whole process group, and the launcher alone decides what stops
        # (pipeline.stopping); a worker killed by it mid-step printed its traceback
        yield f"trap '' INT; {sets} exec {shlex.quote(sys.executable)} -m pipeline.processes"
    finally:
        if relay is not None:  # after the run: the workers' last calls are in
            relay.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def local_process_runner():
    """Beam's FnApiRunner with its parallel workers (``direct_num_workers``) in processes
    started by ``python -m pipeline.processes`` (Beam's ``multi_processing`` mode starts
    its own command, which sets none of the above)."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner, fn_runner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    class LocalProcesses(FnApiRunner):
        def run_pipeline(self, pipeline, options):
            beam_log = logging.getLogger(fn_runner.__name__)
            quiet = _drop(_IN_MEMORY_WARNING)
            beam_log.addFilter(quiet)
            try:
                # this process holds the data between stages: its freed memory too
                with freed_memory_released(), _local_workers() as command:
                    self._default_environment = (
                        SubprocessSDKEnvironment.from_command_string(command))
                    return super().run_pipeline(pipeline, options)
            finally:
                beam_log.removeFilter(quiet)

    return LocalProcesses()


def _drop(*texts: str):
    return lambda record: not any(t in record.getMessage() for t in texts)


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


def _shown(mode: str):
    """The worker's log filter for ``worker_log``'s mode."""
    def keep(record: logging.LogRecord) -> bool:
        if any(t in record.getMessage() for t in QUIET_WORKER):
            return False
        if mode == "all":
            return True
        beam = record.name == "apache_beam" or record.name.startswith("apache_beam.")
        return mode == "warnings" and not beam
    return keep


def _own_stderr():
    """The process's stderr for its log handler alone: file descriptor 2 goes nowhere
    from here on (Beam's harness prints a failed bundle's traceback there, and gRPC its
    own lines)."""
    sys.stderr.flush()
    stream = os.fdopen(os.dup(2), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    return stream


def main() -> None:
    """A local worker process: Beam's SDK worker, which reports to the runner as Beam's
    ``multi_processing`` workers do; on its own stderr only warnings and errors (Beam
    logs every channel it opens at INFO; ``QUIET_WORKER``: its warnings that say nothing
    about this job), and without --verbose none of Beam's: a step that fails is logged
    by every worker that ran it with its traceback (178 lines for one error), and the
    launcher says it in one line."""
    mode = os.environ.get(WORKER_LOG_ENV, "all")
    handler = logging.StreamHandler(_own_stderr() if mode != "all" else None)
    handler.setLevel(logging.WARNING)
    handler.addFilter(_shown(mode))
    logging.basicConfig(handlers=[handler], force=True)  # imports may have added one
    from apache_beam.runners.worker import sdk_worker_main

    from transforms.formats import ahead

    imports_frozen()
    finished_outputs_dropped()
    with freed_memory_released(), ahead.at_once(1):  # one row group ahead per worker
        sdk_worker_main.main(sys.argv)
    end_process(0)  # the runner waits for this process to end before the job does


if __name__ == "__main__":
    main()
