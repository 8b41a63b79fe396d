"""``runner.name: portable``: the job through Beam's PortableRunner and the Job API, with
its SDK workers in processes of their own, the path Dataflow Runner v2 takes (pipeline
proto, coders, pickled DoFns, side inputs materialised by the runner).

Why its own module: the runner's services live in subprocesses that must be started,
waited for and always stopped. Without ``runner.address`` the job starts a job service
(Beam's ``LocalJobServicer``, the one ``local_job_service_main`` serves) and a worker pool
(Beam's ``worker_pool_main`` servicer: an ``EXTERNAL`` environment whose workers are
``python`` processes) and stops both, and every worker, when it ends however it ends.
With ``runner.address`` the job goes to that job service, and the workers come from a
pool started here unless ``runner.options`` names an environment. The services run as
``python -m pipeline.portable jobs|pool`` so that this module can fix two things in
them: Beam's data-plane flush race (docs/beam-flush-race.md) and the job service's one
worker (its ``FnApiRunner`` never reads ``direct_num_workers``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from pipeline import stopping
from pipeline.runners.common import (
    ONE_THREAD,
    Relay,
    avoid_flush_race,
    progress_relay,
    waits_end_with_their_worker,
    worker_env,
)

START_TIMEOUT_S = 60.0  # a service's first answer: it imports Beam (seconds when loaded)
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL
POLL_S = 0.05  # how often a starting service is looked at


class ServiceError(RuntimeError):
    """A job service or worker pool did not start, or an address has none."""


def _answers(address: str, timeout: float) -> str | None:
    """Why no Beam job service answers at ``address`` within ``timeout``, or None."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        beam_job_api_pb2_grpc.JobServiceStub(channel).DescribePipelineOptions(
            beam_job_api_pb2.DescribePipelineOptionsRequest(), timeout=timeout)
    except grpc.FutureTimeoutError:
        return f"nothing answered within {timeout:g} s"
    except grpc.RpcError as e:
        return f"it is not a Beam job service ({e.code().name}: {e.details()})"
    finally:
        channel.close()
    return None


def check_address(address: str, timeout: float) -> str | None:
    """The one-line problem with ``runner.address``, or None when a job service answers."""
    why = _answers(address, timeout)
    return None if why is None else (
        f"runner.address: no Beam job service at {address}: {why}; start one (e.g. python "
        "-m pipeline.portable jobs) and give its HOST:PORT, or leave runner.address out "
        "(the job then starts its own)")


class _Service:
    """One service in a subprocess of its own session (Ctrl-C reaches the launcher only,
    which stops it in order): started, waited for until it answers, stopped with its
    children (the pool's workers) by its process group."""

    def __init__(self, kind: str, tmp: str, env: dict[str, str], workers: int, show: bool):
        self.kind, self.address = kind, ""
        self.name = {"jobs": "job service", "pool": "worker pool"}[kind]
        self._port_file = os.path.join(tmp, f"{kind}.port")
        self._log = os.path.join(tmp, f"{kind}.log")
        out = None if show else open(self._log, "wb")  # noqa: SIM115 (closed below)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.portable", kind, "--port-file",
                 self._port_file, "--workers", str(workers), "--parent", str(os.getpid())]
                + (["--staging-dir", os.path.join(tmp, "staging")] if kind == "jobs" else []),
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True)
        finally:
            if out is not None:
                out.close()

    def wait_ready(self, deadline: float) -> str:
        while not os.path.exists(self._port_file):
            try:
                code = self.proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise ServiceError(f"the {self.name} did not start within "
                                       f"{START_TIMEOUT_S:g} s") from None
                continue
            raise ServiceError(f"the {self.name} exited ({code}) before it served: "
                               f"{self._last_line()}")
        with open(self._port_file) as f:
            self.address = f"localhost:{f.read().strip()}"
        return self.address

    def _last_line(self) -> str:
        with contextlib.suppress(OSError), open(self._log, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
            return lines[-1] if lines else "no output"
        return "its output is on stderr"

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL to whatever is left after STOP_TIMEOUT_S."""
        group = self.proc.pid  # start_new_session: the group's id is the leader's pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        with contextlib.suppress(ProcessLookupError):  # none left in the group
            while time.monotonic() < deadline:  # the pool's workers end on its SIGTERM
                os.killpg(group, 0)
                threading.Event().wait(POLL_S)
            os.killpg(group, signal.SIGKILL)
        self.proc.wait()


class Services:
    """The job service and worker pool a run needs: started by ``start`` (only what the
    config does not name), always stopped by ``stop`` with their files."""

    def __init__(self, address: str | None, environment_given: bool, workers: int):
        self.job_endpoint, self.pool = address, None
        self._need_jobs, self._need_pool = address is None, not environment_given
        self._workers, self._services = workers, []
        self.tmp = tempfile.mkdtemp(prefix="tensordedup-portable-")
        self._relay: Relay | None = None

    def start(self) -> Services:
        if not (self._need_jobs or self._need_pool):
            return self
        import logging

        show = logging.getLogger("apache_beam").isEnabledFor(logging.WARNING)  # not --quiet-ed
        env = worker_env()
        if self._workers > 1:  # workers that share the cores, as the local runner's
            env.update(ONE_THREAD)
        if self._need_pool:  # the workers' progress, shown here
            self._relay, forward = progress_relay(self.tmp)
            env.update(forward)
        try:  # both start at once: each imports Beam for a few seconds
            kinds = ["pool"] * self._need_pool + ["jobs"] * self._need_jobs
            self._services = [_Service(k, self.tmp, env, self._workers, show) for k in kinds]
            deadline = time.monotonic() + START_TIMEOUT_S
            for s in self._services:
                address = s.wait_ready(deadline)
                if s.kind == "jobs":
                    self.job_endpoint = address
                else:
                    self.pool = address
            if self._need_jobs and (why := _answers(self.job_endpoint, START_TIMEOUT_S)):
                raise ServiceError(f"the job service at {self.job_endpoint}: {why}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for s in reversed(self._services):  # the job service first: it drives the workers
            s.stop()
        self._services = []
        if self._relay is not None:  # after the workers: their last calls are in
            self._relay.stop()
            self._relay = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def portable_runner(cfg: Any, workers: int):
    """Beam's PortableRunner, which starts the services the run needs when the job is
    run (not when it is built: a dry run starts nothing) and stops them when it ends."""
    from apache_beam.options.pipeline_options import PortableOptions
    from apache_beam.runners.portability.portable_runner import PortableRunner

    class ManagedPortableRunner(PortableRunner):
        def run_pipeline(self, pipeline, options):
            portable = options.view_as(PortableOptions)
            services = Services(cfg.address, portable.environment_type is not None, workers)
            services.start()
            try:
                portable.job_endpoint = services.job_endpoint
                if services.pool is not None:
                    portable.environment_type = "EXTERNAL"
                    portable.environment_config = services.pool
                with _temp_files_in(services.tmp):
                    return _Result(super().run_pipeline(pipeline, options), services)
            except BaseException:
                services.stop()
                raise

    return ManagedPortableRunner()


@contextlib.contextmanager
def _temp_files_in(directory: str):
    """Beam's stager makes a temp directory (and a requirements cache beside it) for the
    job's dependencies on every submission and never removes them: made in the services'
    directory, they go with it."""
    was = tempfile.tempdir
    tempfile.tempdir = directory
    try:
        yield
    finally:
        tempfile.tempdir = was


class _Result:
    """Beam's result; waiting for the job ends with the services stopped, a launcher that
    stops waiting (Ctrl-C) cancels the job first, and a job service that goes away is one
    line (Beam's message reader thread dies with it: its traceback is not printed)."""

    READER = "wait_until_finish_read"  # Beam's thread reading the job's messages

    def __init__(self, result, services: Services):
        self._result, self._services = result, services

    def wait_until_finish(self, duration: int | None = None):
        import grpc

        done, lost = False, None
        excepthook = threading.excepthook

        def quiet_reader(args) -> None:
            if not (args.thread is not None and args.thread.name == self.READER
                    and isinstance(args.exc_value, grpc.RpcError)):
                excepthook(args)

        threading.excepthook = quiet_reader
        try:
            state = self._result.wait_until_finish(duration)
            done = duration is None or state in ("DONE", "FAILED", "CANCELLED")
            return state
        except grpc.RpcError as e:  # raised outside this block: the gRPC text is no cause
            done, lost = True, (f"the job service at {self._services.job_endpoint} stopped "
                                f"answering ({e.code().name}: {e.details()})")
        except Exception:  # the job failed: Beam's error
            done = True
            raise
        except BaseException:  # Ctrl-C: the job must not run on without its launcher
            done = True
            with contextlib.suppress(Exception):
                self._result.cancel()
            raise
        finally:
            for t in threading.enumerate() if lost else ():  # it dies with the service
                if t.name == self.READER:
                    t.join(STOP_TIMEOUT_S)
            threading.excepthook = excepthook
            if done:
                self._services.stop()
        raise ServiceError(lost)

    def __getattr__(self, name: str):
        return getattr(self._result, name)


# ------------------------------------------------------------- the services' processes


def _serve_jobs(port: int, staging_dir: str | None, workers: int) -> tuple[int, Any]:
    """Beam's local job service, with ``workers`` SDK workers per job and the flush race
    avoided in its data plane. Returns its port and a stop function (which removes the
    staging directory when Beam made it)."""
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    avoid_flush_race()  # a Beam it does not apply to: the launcher warned already
    waits_end_with_their_worker()

    class Job(local_job_service.BeamJob):
        def _invoke_runner(self):  # as Beam's, with the worker count
            self.set_state(beam_job_api_pb2.JobState.RUNNING)
            runner = fn_runner.FnApiRunner(provision_info=self._provision_info)
            runner._num_workers = workers  # read by run_pipeline only, not run_via_runner_api
            return runner.run_via_runner_api(self._pipeline_proto, self.pipeline_options())

    servicer = local_job_service.LocalJobServicer(staging_dir, beam_job_type=Job)
    return servicer.start_grpc_server(port), servicer.stop


def _serve_pool(port: int) -> tuple[int, Any]:
    """Beam's worker pool: each worker a ``python`` process (size-based data flushing)."""
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    address, server = BeamFnExternalWorkerPoolServicer.start(
        use_process=True, port=port, data_buffer_time_limit_ms=0)
    return int(address.rsplit(":", 1)[1]), lambda: server.stop(0)


def main(argv: list[str] | None = None) -> None:
    """``python -m pipeline.portable jobs|pool [--port N]``: serve until SIGTERM, SIGINT
    or the launcher (``--parent``) is gone. A launcher waits for ``--port-file`` (written
    whole once the server serves); by hand the address is printed (for runner.address)."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.portable")
    ap.add_argument("kind", choices=("jobs", "pool"), help="a job service or a worker pool")
    ap.add_argument("--port", type=int, default=0, help="port to serve on (0: any free one)")
    ap.add_argument("--workers", type=int, default=1, help="jobs: SDK workers per job")
    ap.add_argument("--staging-dir", help="jobs: staged artifacts (default: a temp dir)")
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.kind == "jobs":
        port, shutdown = _serve_jobs(args.port, args.staging_dir, args.workers)
    else:  # by hand too: workers run this interpreter, with its import paths
        os.environ.update(worker_env())
        port, shutdown = _serve_pool(args.port)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    else:
        print(f"{args.kind}: serving on localhost:{port} (Ctrl-C stops)", flush=True)
    if args.parent is not None:
        stopping.on_parent_gone(args.parent, stop.set)
    stop.wait()
    shutdown()
    if args.kind == "jobs":
        os._exit(0)  # a job still running holds non-daemon threads: do not wait for them
    # the pool returns: its exit handler stops the workers it started
