"""The local runner: Beam's FnApiRunner in this process, its parallel workers as threads
or, for jobs with a near stage (``runner.processes``), as processes of their own.

Why processes for the near stage: its cells are many small NumPy and Python steps, and
two worker threads of one interpreter hand its lock back and forth thousands of times a
second (a futex wake-up each, costly on a VM); measured on 1M x 384 at cosine 0.01 on 2
cores, the cells took 18-19.6 s on two threads, 14.4 s on one, 9.8 s on two processes
(docs/pipeline.md#runners). What the workers need and Beam's own command does not give
them: this interpreter and the project's import paths (``worker_env``), one BLAS/OpenMP
thread per call (``ONE_THREAD``: the processes share the cores) and one Parquet row
group read ahead each (``kernel_threads`` does both for threads), their progress shown
by the launcher (``Relay``) and their log lines below warnings kept off the terminal
(``python -m pipeline.processes``: Beam's SDK worker with a quiet handler; this module
imports Beam and the steps only inside functions, so that handler comes first).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from pipeline import stopping
from pipeline.config.runner import RunnerConfig
from pipeline.runners.common import (
    ONE_THREAD,
    WORKER_LOG_ENV,
    available_cores,
    avoid_flush_race,
    end_process,
    glibc,
    imports_frozen,
    progress_relay,
    waits_end_with_their_worker,
    worker_env,
    worker_log,
)
from transforms.io import periodic

# Beam's warning that in-memory mode ignores the worker count: the local process runner
# keeps that mode's name while it starts its own worker processes.
_IN_MEMORY_WARNING = "If direct_num_workers is not equal to 1"
QUIET_WORKER = ("apitools not found",  # Beam's GCP modules on import
                "No semi_persistent_directory found")  # Dataflow's worker cache


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
    libc = glibc()
    if libc is None:
        yield
        return
    with periodic.every(TRIM_S, lambda: libc.malloc_trim(0), "tensordedup-trim"):
        yield


@contextlib.contextmanager
def _local_workers() -> Iterator[str]:
    """The shell command that starts one local worker process, valid inside the block
    (its progress file lives in a directory removed after it)."""
    tmp = tempfile.mkdtemp(prefix="tensordedup-workers-")
    env = dict(ONE_THREAD)
    env[WORKER_LOG_ENV] = worker_log()
    env[stopping.LAUNCHER_ENV] = str(os.getpid())  # the worker's parent: the exec below keeps it
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

    waits_end_with_their_worker()

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

    from transforms.io.formats import ahead

    imports_frozen()
    finished_outputs_dropped()
    with freed_memory_released(), ahead.at_once(1):  # one row group ahead per worker
        sdk_worker_main.main(sys.argv)
    end_process(0)  # the runner waits for this process to end before the job does


# The local runner's parallel mode unless ``runner.processes``: threads in this process.
# Measured on the 1 M x 128 Parquet job (docs/pipeline.md#runners): 2 processes took
# 14.1 s and 14.4 CPU-s against 10.9 s and 10.3 CPU-s for 2 threads (worker start-up,
# every element pickled between processes). A near job's cells are the other way round
# (``pipeline.runners.local``).
LOCAL_MODE = "multi_threading"


def local_options(cfg: RunnerConfig) -> dict[str, Any]:
    """Beam options for ``runner.workers`` on the local runner: none for one worker (the
    in-process runner, no data plane); otherwise parallel workers, with the flush race
    avoided, or one worker and a warning where the workaround does not apply. Worker
    processes (``runner.processes``) log to the runner from warnings up."""
    workers = cfg.workers or available_cores()
    if workers == 1:
        return {}
    problem = avoid_flush_race()
    if problem is not None:
        print(f"warning: runner.workers: running 1 worker, not {workers}: {problem}; "
              "Beam's parallel local runner loses elements without the workaround "
              "(docs/beam-flush-race.md)", file=sys.stderr)
        return {}
    if cfg.processes:  # started by local_process_runner, in Beam's default mode
        return {"direct_num_workers": workers, "default_sdk_harness_log_level": "WARNING"}
    return {"direct_num_workers": workers, "direct_running_mode": LOCAL_MODE}


def in_processes(cfg: RunnerConfig, options) -> bool:
    """Whether the local runner's parallel workers are processes: ``runner.processes``,
    more than one worker, and no running mode set by hand in ``runner.options``."""
    from apache_beam.options.pipeline_options import DirectOptions

    return (cfg.name == "local" and bool(cfg.processes)
            and (options.view_as(DirectOptions).direct_num_workers or 1) > 1
            and "direct_running_mode" not in cfg.options)


@contextlib.contextmanager
def kernel_threads(cfg: RunnerConfig, options) -> Iterator[None]:
    """While the local runner runs bundles in parallel threads (``options``: the
    pipeline's, so ``runner.options`` set by hand count too): one BLAS/OpenMP thread per
    kernel call (``transforms.cores``; the 1M x 384 near job: 128 s of user CPU, 80 s
    with one each) and one Parquet row group read ahead per worker (two each raised that
    job's peak from 2.9 to 3.5 GB for no gain). One worker keeps the libraries' own
    threads and reads two ahead."""
    from apache_beam.options.pipeline_options import DirectOptions

    if cfg.name != "local" or (options.view_as(DirectOptions).direct_num_workers or 1) <= 1:
        yield
        return
    from transforms import cores
    from transforms.io.formats import ahead

    with cores.threads(1), ahead.at_once(1):
        yield
