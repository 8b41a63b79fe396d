"""The job on Dask: Beam 2.77's DaskRunner on a cluster of the config's choosing, with
every side input computed once per job.

Why: Beam 2.77's DaskRunner hands a side input to a task as the Dask bag that makes it,
and the task computes that bag again (``DaskBagWindowedIterator``: ``list(bag)`` inside
the task), so the side input's whole upstream runs once per reading task, from the
read on. Measured (tests/test_dask.py): ``Count.Globally`` of 64 elements read as a
side input was 128 in every task (its main output: 64), and the near stage's cell plan
was computed in several tasks from row counts of 49,975 and 344,635, so workers cut
the data into 25 and 173 cells. Here each collection read as a side input is
persisted on the cluster as soon as the graph reaches it and held until the job ends:
it is computed once and the tasks that read it fetch the stored result. So that its
upstream is not computed twice (once for it, once for the job's graph), the points
where that upstream also feeds other steps are persisted too, and held until the job
ends as well, except the reads' outputs (the records' values: not held to the end). A
lost worker's share is recomputed by Dask from the same graph. With those points let go
once the job's graph was submitted, Dask could forget a result's upstream and then
cancel the job ("lost dependencies") when a worker died (tests/test_dask_loss.py failed
so in about 1 run of 4). Holding them costs the cluster their bytes until the end:
digests, removals and references to spilled values. A worker lost while it holds a
read's output can still end the job that way: in one line, nothing published.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from pipeline.config.runner import RunnerConfig

# Partitions per Create on Dask: one per element (read unit, input file) up to this many,
# more elements share them evenly; bounded because a GroupByKey keeps its input's
# partitions and Dask's shuffle grows faster than linearly with them.
DASK_PARTITIONS = 256
# The level of distributed's loggers in the workers of a cluster the job starts. They are
# spawned processes that import the command's module, and Beam with it, whose first log
# line gives Python's root logger a handler: every INFO line of a worker's start and stop
# then reached the user's terminal. Read from the environment when a worker imports
# distributed (dask's config); a value the user set is left alone.
WORKER_LOG_LEVEL = "warning"
_WORKER_LOG_ENV = "DASK_LOGGING__DISTRIBUTED"


def dask_setup(worker) -> None:
    """Run by each worker of the cluster the job starts (Dask's worker preload): a
    Ctrl-C at the terminal is the launcher's to act on, and without --verbose a failed
    task's traceback is not logged here (the launcher says it in one line)."""
    import signal

    from pipeline.runners.common import WORKER_LOG_ENV, no_traceback

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get(WORKER_LOG_ENV, "all") != "all":
        for name in ("distributed.worker", "distributed.core"):
            logging.getLogger(name).addFilter(no_traceback)


def dask_options() -> dict[str, Any]:
    """DaskRunner options. ``dask_npartitions``: Beam's Dask translation makes a Create
    into partitions of 128 elements and runs Reshuffle as nothing, so the read units
    (a few dozen) would all land in one partition and be read one after another; a
    partition per element (up to DASK_PARTITIONS) restores what the Reshuffle is there
    for. Later steps keep their input's partitions (a GroupByKey too)."""
    return {"dask_npartitions": DASK_PARTITIONS}


def shared_producers(pipeline) -> tuple[set, set]:
    """The leaf steps to compute once: those whose output is read as a side input (held
    until the job ends: tasks fetch it while they run), and the steps upstream of those
    whose output is also read by another step (the side input's graph and the job's
    graph start from one copy; held until the job ends, the reads' outputs excepted, so
    Dask does not forget the upstream of a result it may have to recompute)."""
    from apache_beam.pipeline import PipelineVisitor

    readers: dict[Any, int] = {}
    feeds: dict[Any, set] = {}  # step -> the steps whose output it reads
    side: set = set()

    class Count(PipelineVisitor):
        def visit_transform(self, node) -> None:
            sides = {si.pvalue.producer for si in node.side_inputs}
            mains = [pv.producer for pv in node.inputs if pv.producer is not None]  # not PBegin
            for p in mains:
                readers[p] = readers.get(p, 0) + 1
            feeds[node] = {*mains, *sides}
            side.update(sides)

    pipeline.visit(Count())
    upstream, todo = set(), list(side)
    while todo:
        for p in feeds.get(todo.pop(), ()):
            if p not in upstream:
                upstream.add(p)
                todo.append(p)
    return side, {p for p in upstream - side if readers.get(p, 0) > 1}


def _carries_tensors(producer) -> bool:
    """A read step: its output is the records' values (a Chunk per element), which the
    cluster must not hold until the job ends. Its DoFn says so (``CARRIES_VALUES``),
    wrapped or not by ``SplitOutputs``, whatever the step is named."""
    fn = getattr(producer.transform, "fn", None)
    return any(getattr(f, "CARRIES_VALUES", False) for f in (fn, getattr(fn, "fn", None)))


def replicate_when_done(client, bags: list) -> None:
    """Copy each side input to every worker once it is computed (in a thread of its own,
    ending with the client): a task reading it fetches the stored keys, and Dask cannot
    recompute a persisted result whose upstream it has already forgotten, so one copy
    on a worker that dies would fail the job (``lost dependencies``)."""
    from distributed import futures_of, wait

    try:
        for bag in bags:
            futures = futures_of(bag)
            wait(futures)
            client.replicate(futures)
    except Exception:  # noqa: BLE001 - the job ended (client closed) or failed: its error is the job's
        return


def _busy(dask_worker) -> int:
    """Tasks a worker runs or is about to run (given, not yet started)."""
    state = dask_worker.state
    return len(state.executing) + len(state.long_running) + len(state.ready)


QUIET_POLLS = 3  # consecutive answers of "nothing runs", 0.05 s apart
STOP_WAIT_S = 2.0  # a stopped job (Ctrl-C) waits this long for a cluster's tasks to stop


def stop_running_tasks(client, futures, limit_s: float = 60.0) -> None:
    """A failed job's tasks that still run on the workers (the others of a task that
    failed) would write into the run's staging and spill after the driver deleted them:
    cancel the job's tasks, then wait until the workers run none (at most ``limit_s``:
    a shared cluster may be busy with other work). One answer of "none" is not enough:
    a task the scheduler sent just before the cancel may reach its worker after the
    question (the two travel on different connections), so the workers must say so
    ``QUIET_POLLS`` times in a row. Best effort: the cluster may be gone."""
    try:
        client.cancel(futures, force=True)
        deadline = time.monotonic() + limit_s
        quiet = 0
        while quiet < QUIET_POLLS and time.monotonic() < deadline:
            # a worker that does not answer (the one killed, restarting) is skipped, not
            # a reason to stop asking the others
            busy = any(client.run(_busy, on_error="ignore").values())
            quiet = 0 if busy else quiet + 1
            time.sleep(0.05)  # no event says a cancelled task stopped: ask the workers
    except Exception:  # the cluster or its workers are gone: nothing runs there
        pass


def check_address(address: str, timeout: float) -> str | None:
    """The one-line problem with ``runner.address``, or None when a Dask scheduler
    answers there (``identity``) within ``timeout``. Checked before any work: a dead
    address had failed the started job after 30 s with a CancelledError. Only tcp://
    addresses: the others need the cluster's security settings, which the runner has."""
    if not address.startswith("tcp://"):
        return None
    why = _scheduler_answers(address, timeout)
    return None if why is None else (
        f"runner.address: no Dask scheduler at {address}: {why}; start one (dask scheduler) "
        "and give the address it prints, or leave runner.address out (the job then starts "
        "a local cluster)")


def _scheduler_answers(address: str, timeout: float) -> str | None:
    """Why no Dask scheduler answers at ``address`` within ``timeout``, or None. In a
    thread of its own: the caller may be running an event loop (a notebook)."""
    import asyncio
    import socket

    from distributed.comm import connect
    from distributed.comm.addressing import parse_address, parse_host_port

    async def identity() -> dict:
        comm = await connect(address, timeout=timeout)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await asyncio.wait_for(comm.read(), timeout)
        finally:
            await comm.close()

    found: list = []

    def probe() -> None:
        try:
            # refused at once, not retried by distributed for the whole timeout
            socket.create_connection(parse_host_port(parse_address(address)[1]),
                                     timeout=timeout).close()
            reply = asyncio.run(identity())
            found.append(None if isinstance(reply, dict) and reply.get("type") == "Scheduler"
                         else "what answered is not a Dask scheduler")
        except ConnectionRefusedError:
            found.append("the connection was refused")
        except TimeoutError:
            found.append(f"nothing answered within {timeout:g} s")
        except Exception as e:  # noqa: BLE001 (another server's bytes: anything)
            found.append(str(e) if isinstance(e, OSError) else
                         f"what answered is not a Dask scheduler ({type(e).__name__})")

    t = threading.Thread(target=probe, name="dask-address", daemon=True)
    t.start()
    t.join(timeout * 2 + 1)
    return found[0] if found else f"nothing answered within {timeout:g} s"


def dask_runner(cfg: RunnerConfig):
    """Beam's DaskRunner on the cluster at ``runner.address``, or on a local cluster of
    ``runner.workers`` processes (one thread each: the kernels hold the GIL) that lives
    as long as the job: Beam's runner would start a default one and never stop it."""
    from apache_beam.runners.dask.dask_runner import (
        DaskOptions,
        DaskRunner,
        DaskRunnerResult,
    )
    from apache_beam.runners.runner import PipelineState

    from pipeline.runners.common import RunIncomplete, available_cores

    class ClosingResult(DaskRunnerResult):
        """Stops the client, and the local cluster if this job started it, once done;
        holds the persisted side inputs and their shared upstream until then."""

        cluster: Any = None
        persisted: list | None = None
        address = ""

        def wait_until_finish(self, duration: int | None = None) -> str:
            try:
                state = super().wait_until_finish(duration)
                # a scheduler that went away ends Beam's wait as if the job were done:
                # its tasks are cancelled, not finished
                unfinished = sum(f.status != "finished" for f in self.futures)
            except BaseException as e:  # the held collections too: Dask would recompute them
                from distributed import futures_of

                if not (isinstance(e, KeyboardInterrupt) and self.cluster is not None):
                    # (a stopped job's own cluster goes with its workers, already killed;
                    # the tasks on a cluster given by address are cancelled and let go)
                    stop_running_tasks(self.client, [*self.futures, *(
                        f for bag in self.persisted or () for f in futures_of(bag))],
                        STOP_WAIT_S if isinstance(e, KeyboardInterrupt) else 60.0)
                raise
            finally:
                self.persisted = None
                self.client.close()
                if self.cluster is not None:
                    self.cluster.close()
            if unfinished:
                self._state = PipelineState.FAILED
                raise RunIncomplete(
                    f"the Dask cluster at {self.address} went away before the job finished "
                    f"({unfinished} of its {len(self.futures)} last tasks did not run to the "
                    "end)")
            return state

    class ClusterDaskRunner(DaskRunner):
        def to_dask_bag_visitor(self, bag_kwargs=None):
            """Beam's visitor, persisting each shared collection before its first reader
            is translated (``shared_producers``)."""
            from distributed import get_client

            base = type(DaskRunner.to_dask_bag_visitor(bag_kwargs))
            side, fanout, persisted, held = self.side, self.fanout, self.persisted, self.held

            class Visitor(base):
                def visit_transform(self, node) -> None:
                    for pv in [*node.inputs, *(si.pvalue for si in node.side_inputs)]:
                        producer = getattr(pv, "producer", None)
                        if producer in side | fanout and producer in self.bags:
                            self.bags[producer] = get_client().persist(self.bags[producer])
                            if producer in side:
                                persisted.append(self.bags[producer])
                            elif not _carries_tensors(producer):
                                held.append(self.bags[producer])
                            side.discard(producer)
                            fanout.discard(producer)
                    super().visit_transform(node)

            return Visitor()

        def run_pipeline(self, pipeline, options):
            dask = options.view_as(DaskOptions)
            cluster = None
            if cfg.address is not None:
                dask.address = cfg.address
            elif dask.address is None and dask.scheduler_file is None:
                cluster = OwnCluster(cfg.workers or available_cores())
                dask.address = cluster.scheduler_address
            from apache_beam.runners.dask.overrides import dask_overrides

            pipeline.replace_all(dask_overrides())  # Beam does it again: a no-op then
            (self.side, self.fanout), self.persisted = shared_producers(pipeline), []
            self.held = []
            try:
                result = super().run_pipeline(pipeline, options)
            except BaseException:
                if cluster is not None:
                    cluster.close()
                raise
            closing = ClosingResult(result.client, result.futures)
            closing.cluster, closing.persisted = cluster, self.persisted + self.held
            closing.address = dask.address or dask.scheduler_file or "?"
            threading.Thread(target=replicate_when_done, args=(result.client, self.persisted),
                             daemon=True, name="dask-side-inputs").start()
            return closing

    return ClusterDaskRunner()


class OwnCluster:
    """A local cluster the job starts and stops (no ``runner.address``). Its workers log
    warnings only (``WORKER_LOG_LEVEL``) and forward their progress to this process,
    which shows it (``processes.Relay``) as the local runner does; their scratch space
    is removed with the cluster. A cluster given by address keeps its own logs and shows
    its progress in its own dashboard."""

    def __init__(self, workers: int):
        import dask
        from distributed import LocalCluster

        from pipeline.runners.common import WORKER_LOG_ENV, progress_relay, worker_log

        # no INFO per worker, and without --verbose no warning: a lost worker's "Key lost
        # during replication" came 37 times before the failure's one line (Sweep K)
        logging.getLogger("distributed").setLevel(
            logging.WARNING if worker_log() == "all" else logging.ERROR)
        self.tmp = tempfile.mkdtemp(prefix="tensordedup-dask-")
        self.relay = None
        env = {} if _WORKER_LOG_ENV in os.environ else {_WORKER_LOG_ENV: WORKER_LOG_LEVEL}
        env[WORKER_LOG_ENV] = worker_log()
        try:
            self.relay, forward = progress_relay(self.tmp)
            env.update(forward)
            # the workers are started, and read the environment, in here; the scheduler's
            # scratch space and theirs go in this cluster's own directory
            with _environ(env), dask.config.set({
                    "temporary-directory": self.tmp,
                    # dask_setup, in each worker (the workers get this process's config)
                    "distributed.worker.preload": [__name__]}):
                failed = None
                try:
                    self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1,
                                                processes=True, dashboard_address=":0",
                                                local_directory=self.tmp)
                except Exception as e:  # the usual cause is below; Dask logged its own
                    failed = (f"the local Dask cluster's workers did not start ({e}); from "
                              "a script, call the job under `if __name__ == \"__main__\":` "
                              "(each worker imports the script again)")
                if failed:  # raised outside the handler: this line is the job's error
                    raise RuntimeError(failed)
        except BaseException:
            self._let_go()
            raise
        self.scheduler_address = self.cluster.scheduler_address

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            self._let_go()

    def _let_go(self) -> None:
        if self.relay is not None:  # after the workers: their last calls are in
            self.relay.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment inside the block, gone after it."""
    os.environ.update(values)
    try:
        yield
    finally:
        for k in values:
            os.environ.pop(k, None)
