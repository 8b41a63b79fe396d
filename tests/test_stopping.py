"""Ctrl-C and SIGTERM (issue 41): on every runner the job starts itself, the command ends
within 5 s of the first signal with one line (exit 130, or 143 for SIGTERM), publishes
nothing, and leaves no process, staging directory, lease or temporary file; a second
signal ends it within 1 s; a Dask cluster given by ``runner.address`` has the job's work
cancelled and keeps running.

Real signals, sent when the job is at a known point (a file it touches there: Publish
held by ``TENSORDEDUP_TEST_HOLD_PUBLISH``, a remote filesystem that never answers), never
after a sleep. SIGINT goes to the command's whole process group, as a terminal's Ctrl-C
does; SIGTERM to the command alone, as Kubernetes and most schedulers send it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline import stopping
from pipeline.publish import DEAF_ENV, HOLD_AT_ENV, HOLD_ENV
from tests import slowfs
from tests.jobkit import assert_clean, interruptible, tagged_processes, write_input
from tests.test_preflight import snapshot

ROOT = Path(__file__).resolve().parents[1]
FIRST_S, SECOND_S = 5.0, 1.0  # the targets: from the first signal, from the second
WAIT_S = 120  # upper bound on a job reaching its held point (Dask and portable start-up)
LINES = {signal.SIGINT: "interrupted: nothing was published (earlier outputs are "
                        "unchanged); run the same command again to redo the job",
         signal.SIGTERM: "stopped by SIGTERM: nothing was published (earlier outputs are "
                         "unchanged); run the same command again to redo the job"}
RUNNERS = {"threads": ["runner.processes=false"], "processes": ["runner.processes=true"],
           "portable": ["runner.name=portable"], "dask": ["runner.name=dask"]}


@pytest.fixture(scope="module")
def near_input(tmp_path_factory) -> Path:
    """12,000 rows of 32 floats in 3 files, exact and near copies: a near job with
    several stages (the local runner's default for it: worker processes)."""
    root = tmp_path_factory.mktemp("stopping_in")
    rng = np.random.default_rng(41)
    for f in range(3):
        x = rng.standard_normal((4000, 32)).astype(np.float32)
        x[100:200] = x[:100]
        x[300:400] = x[:100] + 1e-3
        write_input("parquet", root / f"p{f}.parquet", [f"{f}-{i}" for i in range(4000)], x,
                    np.zeros(4000, int), row_group_size=1000)
    return root


def config(tmp_path: Path, inputs: str, **extra) -> Path:
    """The job's YAML, with an older output in place that a stopped run must leave as it
    is (a run that publishes would replace it: ``overwrite``)."""
    out = tmp_path / "out"
    for name, text in (("clean/old.parquet", "an older run's shard"),
                       ("report/summary.json", '{"read": 1}')):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    cfg = {"input": {"format": "parquet", "path": inputs, "tensor": "emb", "id": "id"},
           "near": {"metric": "l2", "threshold": 0.01},
           "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report"), **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(cfg: Path, *sets: str, env: dict | None = None, args: tuple = (),
          code: str | None = None) -> subprocess.Popen:
    """The command in a session of its own (its process group is what a terminal's
    Ctrl-C reaches), quiet: its stderr is its errors only."""
    cli = ["--config", str(cfg), "--quiet", *args, *[a for s in sets for a in ("--set", s)]]
    argv = ([sys.executable, "-m", "pipeline.run", *cli] if code is None
            else [sys.executable, "-c", code, *cli])
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})}, preexec_fn=interruptible)


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until the job touches ``path`` (it has reached its held point)."""
    deadline = time.monotonic() + WAIT_S
    tick = threading.Event()
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"{path} never appeared"
        tick.wait(0.02)


def send(proc: subprocess.Popen, signum: int) -> None:
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # the terminal's Ctrl-C: the whole foreground group
    else:
        os.kill(proc.pid, signum)


def ended(proc: subprocess.Popen, since: float, limit: float) -> tuple[int, list[str], float]:
    """Exit code, stderr lines and seconds from ``since`` once the command ended (waited
    for up to WAIT_S so a slow end is measured, not cut short)."""
    _, err = proc.communicate(timeout=WAIT_S)
    took = time.monotonic() - since
    return proc.returncode, err.strip().splitlines(), took


def assert_nothing_left(tmp_path: Path, before: dict, tag: str, tmp: Path) -> None:
    """The older output as it was, nothing beside it (staging, swap, lease files), no
    process of the run, no temporary file."""
    out = tmp_path / "out"
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["clean", "report"]
    deadline = time.monotonic() + WAIT_S  # a killed process may take a moment to go
    while tagged_processes(tag):
        assert time.monotonic() < deadline, tagged_processes(tag)
        threading.Event().wait(0.05)
    assert_clean(tag, tmp)


@pytest.mark.parametrize(("runner", "signum"), [
    *[(r, signal.SIGINT) for r in RUNNERS],
    ("processes", signal.SIGTERM), ("portable", signal.SIGTERM)])
def test_a_signal_while_the_job_runs_stops_it_at_once(tmp_path, near_input, isolated,
                                                      runner, signum):
    """Inside the job's last step (Publish, held): the local runner's worker threads and
    worker processes, the portable runner's job service and worker pool, the Dask
    cluster the job starts. Before the fix the processes runner never ended (its main
    thread joined a thread that waited on a worker process that waited on its runner)."""
    cfg = config(tmp_path, str(near_input / "*.parquet"))
    before = snapshot(tmp_path / "out")
    hold = tmp_path / "hold"
    proc = start(cfg, *RUNNERS[runner], env={HOLD_ENV: str(hold)})
    wait_for(hold.with_name("hold.reached"), proc)
    t0 = time.monotonic()
    send(proc, signum)
    code, err, took = ended(proc, t0, FIRST_S)
    assert (code, err) == ({signal.SIGINT: 130, signal.SIGTERM: 143}[signum], [LINES[signum]])
    assert took < FIRST_S, took
    assert_nothing_left(tmp_path, before, *isolated)


def started_workers(tag: str, command: bytes = b"pipeline.processes") -> list[int]:
    """The SDK worker processes of the run tagged ``tag``: the local runner's by
    default, the portable runner's pool's with ``command=b"SdkHarness"``."""
    found = []
    for pid in tagged_processes(tag):
        try:
            if command in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:  # gone meanwhile
            pass
    return found


@pytest.mark.parametrize(("runner", "when"), [("processes", "workers starting"),
                                              ("processes", "held"), ("portable", "held"),
                                              ("dask", "held")])
def test_processes_the_job_started_end_when_it_is_killed_outright(tmp_path, near_input,
                                                                  isolated, runner, when):
    """SIGKILL (the OOM killer, ``kill -9``) runs none of the command's code: the worker
    processes, services and cluster it started must notice by themselves, within the
    first signal's 5 s, whether they were starting or working (Publish held). Before,
    local worker processes started just before the kill kept retrying their launcher's
    gRPC address for 2 minutes."""
    tag, _ = isolated
    cfg = config(tmp_path, str(near_input / "*.parquet"))
    hold = tmp_path / "hold"
    proc = start(cfg, *RUNNERS[runner], env={HOLD_ENV: str(hold)})
    if when == "held":
        wait_for(hold.with_name("hold.reached"), proc)
    deadline = time.monotonic() + WAIT_S
    while not (started_workers(tag) if when == "workers starting"
               else set(tagged_processes(tag)) - {proc.pid}):
        assert proc.poll() is None and time.monotonic() < deadline, "no process started"
        threading.Event().wait(0.01)
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    while left := tagged_processes(tag):
        assert time.monotonic() - t0 < FIRST_S, left
        threading.Event().wait(0.05)


@pytest.mark.parametrize(("runner", "command"), [("processes", b"pipeline.processes"),
                                                 ("portable", b"SdkHarness")])
def test_worker_processes_killed_while_one_runs_publish_fail_the_job(tmp_path, near_input,
                                                                    isolated, runner,
                                                                    command):
    """Every SDK worker process SIGKILLed (the OOM killer) while one of them runs Publish
    (held), local runner or the portable runner's pool: Beam waited on the dead worker's
    answer with no timeout, and the job was still running 120 s later (Sweep K). Now
    the requests to a worker whose control stream ended fail: one line naming the lost
    worker, exit 1, nothing published, nothing left."""
    tag, _ = isolated
    cfg = config(tmp_path, str(near_input / "*.parquet"))
    before = snapshot(tmp_path / "out")
    hold = tmp_path / "hold"
    proc = start(cfg, *RUNNERS[runner], env={HOLD_ENV: str(hold)})
    wait_for(hold.with_name("hold.reached"), proc)
    workers = started_workers(tag, command)
    assert len(workers) == 2, workers
    t0 = time.monotonic()
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    code, err, took = ended(proc, t0, FIRST_S)
    assert code == 1 and len(err) == 1, err
    assert "a worker process of the job ended under it (" in err[0], err
    assert "out of memory, or killed from outside): run again" in err[0], err
    assert took < FIRST_S, took
    assert_nothing_left(tmp_path, before, *isolated)


def test_a_worker_process_that_died_under_the_job_is_named_by_the_failure_line(monkeypatch):
    """Beam's threads that waited on a local worker process killed under the job (the OOM
    killer, ``kill -9``) raise as they go: their tracebacks (2-3, with --quiet too) came
    before a failure line that ended "...: Empty: Empty" (Sweep K). Inside the job's
    handling they are kept back (--verbose prints them), the return code is kept, and
    the failure line names it; any other thread's error still reaches the hook."""
    import grpc

    from pipeline.api import failure_line

    def raising(e: BaseException) -> None:
        t = threading.Thread(target=lambda: (_ for _ in ()).throw(e), name="run_worker")
        t.start()
        t.join()

    printed = []  # what reaches the hook the job found (Python's prints a traceback)
    monkeypatch.setattr(threading, "excepthook", lambda args: printed.append(args.exc_value))
    with stopping.handled(exits=False):
        raising(RuntimeError("Worker subprocess exited with return code -9"))
        raising(grpc.RpcError())
        assert printed == []
        raising(ValueError("a bug in a thread of ours"))
        assert [str(e) for e in printed] == ["a bug in a thread of ours"]
        line = failure_line(RuntimeError("Empty"))
    assert line == (
        "the job failed; nothing was published (the previous output, if any, is unchanged): "
        "a worker process of the job ended under it (signal 9, SIGKILL: out of memory, or "
        "killed from outside): run again (with fewer runner.workers, or more memory, if it "
        "was memory)")
    with stopping.handled(exits=False):  # the next job starts with none
        assert failure_line(RuntimeError("Empty")).endswith("RuntimeError: Empty")


@pytest.mark.parametrize("point", ["output moved", "complete"])
def test_a_stop_after_the_output_was_replaced_says_what_was_published(
        tmp_path, near_input, isolated, point):
    """Ctrl-C inside Publish after the swap had begun (its worker process killed there):
    the line says what is in place, as a failure there does, and a rerun finishes the
    run. Before, it said "nothing was published" over a replaced output, and over a
    finished run."""
    import json

    cfg = config(tmp_path, str(near_input / "*.parquet"), run_id="r7")
    hold = tmp_path / "hold"
    proc = start(cfg, env={HOLD_ENV: str(hold), HOLD_AT_ENV: point})
    wait_for(hold.with_name("hold.reached"), proc)
    send(proc, signal.SIGINT)
    code, err, _ = ended(proc, time.monotonic(), FIRST_S)
    out, rep = tmp_path / "out" / "clean", tmp_path / "out" / "report"
    assert sorted(p.name for p in out.iterdir()) == ["p0.parquet", "p1.parquet", "p2.parquet"]
    if point == "output moved":
        assert (code, err) == (130, [
            f"interrupted: publishing stopped part way: output.path {out} holds this run's "
            f"output, but the report ({rep}) was not published; run it again with the same "
            "run id (r7) to finish"])
        assert not (rep / "summary.json").exists()
        assert start(cfg).wait(timeout=WAIT_S) == 0
    else:
        assert (code, err) == (130, [
            f"interrupted: the run had published before it was stopped: output.path {out} "
            f"and the report ({rep}) hold this run's results"])
    summary = json.loads((rep / "summary.json").read_text())
    assert (summary["run_id"], summary["read"]) == ("r7", 12000)
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []
    assert_clean(*isolated)


# The command's process, held inside its imports where Beam's begin (a finder that
# announces the import and waits; a signal ends the wait)
HELD_IMPORT = """
import os, sys, threading
from pathlib import Path

class Hold:
    def find_spec(self, name, path=None, target=None):
        if name == "apache_beam":
            Path(os.environ["HOLD_IMPORT_AT"]).touch()
            threading.Event().wait(WAIT_S)
        return None

sys.meta_path.insert(0, Hold())
"""


@pytest.mark.parametrize(("entry", "signum"), [("console", signal.SIGINT),
                                               ("module", signal.SIGTERM)])
def test_a_signal_while_the_command_imports(tmp_path, entry, signum):
    """Ctrl-C in the first seconds, while Beam imports: a 30-50 line KeyboardInterrupt
    traceback (SIGTERM: killed by the signal, no line). Now the stop's one line and its
    exit code, from the console script and from python -m pipeline.run alike."""
    reached = tmp_path / "importing"
    run = ("sys.argv[0] = 'tensordedup'; from pipeline.run import console; console()"
           if entry == "console" else
           "import runpy; runpy.run_module('pipeline.run', run_name='__main__', "
           "alter_sys=True)")
    proc = start(tmp_path / "job.yaml", env={"HOLD_IMPORT_AT": str(reached)},
                 code=HELD_IMPORT.replace("WAIT_S", str(WAIT_S)) + run)
    wait_for(reached, proc)
    t0 = time.monotonic()
    send(proc, signum)
    code, err, took = ended(proc, t0, FIRST_S)
    assert (code, err) == ({signal.SIGINT: 130, signal.SIGTERM: 143}[signum], [LINES[signum]])
    assert took < FIRST_S, took


@pytest.mark.parametrize("dry_run", [False, True])
def test_ctrl_c_during_the_checks(tmp_path, near_input, isolated, dry_run):
    """The checks wait on a remote filesystem that never answers (its own timeout is 300
    s): Ctrl-C ends them, with --dry-run too."""
    cfg = config(tmp_path, "hangfs://bucket/in/*.parquet",
                 tuning={"remote_timeout_s": 300})
    before = snapshot(tmp_path / "out")
    hanging = tmp_path / "hanging"
    proc = start(cfg, env={slowfs.HANGING_ENV: str(hanging)},
                 args=("--dry-run",) if dry_run else (),
                 code="import sys; from pipeline.run import console; import tests.slowfs; "
                      "sys.argv[0] = 'tensordedup'; console()")
    wait_for(hanging, proc)
    t0 = time.monotonic()
    send(proc, signal.SIGINT)
    code, err, took = ended(proc, t0, FIRST_S)
    assert (code, err) == (130, [LINES[signal.SIGINT]])
    assert took < FIRST_S, took
    assert_nothing_left(tmp_path, before, *isolated)


def test_a_stopped_run_leaves_no_folder_it_made(tmp_path, near_input, isolated):
    """Output and report in folders that did not exist: a run stopped before it
    published leaves none of them behind (its leases and staging were there)."""
    cfg = config(tmp_path, str(near_input / "*.parquet"))
    hold = tmp_path / "hold"
    proc = start(cfg, f"output.path={tmp_path / 'new' / 'a' / 'clean'}",
                 f"report={tmp_path / 'new' / 'b' / 'report'}", env={HOLD_ENV: str(hold)})
    wait_for(hold.with_name("hold.reached"), proc)
    assert (tmp_path / "new" / "a").exists()
    send(proc, signal.SIGINT)
    code, err, _ = ended(proc, time.monotonic(), FIRST_S)
    assert (code, err) == (130, [LINES[signal.SIGINT]])
    assert not (tmp_path / "new").exists()
    assert_clean(*isolated)


@pytest.mark.parametrize("signals", [1, 2])
def test_a_main_thread_that_swallows_ctrl_c_does_not_keep_the_command(tmp_path, near_input,
                                                                      isolated, signals):
    """Publish held in the main thread (one in-process worker) by code that catches
    KeyboardInterrupt, as a library may: the command still ends, GRACE_S after the first
    signal or at once after a second, having removed its staging and released its
    leases."""
    from pipeline.stopping import GRACE_S

    cfg = config(tmp_path, str(near_input / "*.parquet"))
    before = snapshot(tmp_path / "out")
    hold = tmp_path / "hold"
    proc = start(cfg, "runner.workers=1", env={HOLD_ENV: str(hold), DEAF_ENV: "1"})
    wait_for(hold.with_name("hold.reached"), proc)
    t0 = time.monotonic()
    send(proc, signal.SIGINT)
    if signals == 2:  # once the first was seen (two at once are one to the kernel)
        wait_for(hold.with_name("hold.swallowed"), proc)
        t0 = time.monotonic()
        send(proc, signal.SIGINT)
    code, err, took = ended(proc, t0, FIRST_S)
    assert (code, err) == (130, [LINES[signal.SIGINT]])
    assert took < (GRACE_S + 1.0 if signals == 1 else SECOND_S), took
    assert_nothing_left(tmp_path, before, *isolated)


def test_ctrl_c_cancels_the_work_on_a_cluster_given_by_address(tmp_path, near_input,
                                                               isolated):
    """A cluster of the user's: its workers are not the command's to kill, and keep
    running; the job's tasks are cancelled there, and the one that was publishing, let
    go afterwards, publishes nothing (the stopped run's leases are gone)."""
    import distributed

    tag, tmp = isolated
    cfg = config(tmp_path, str(near_input / "*.parquet"))
    before = snapshot(tmp_path / "out")
    hold = tmp_path / "hold"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        workers = set(client.scheduler_info()["workers"])
        env = {HOLD_ENV: str(hold)}
        os.environ.update(env)  # the workers read it: they were started by this process
        try:
            client.run(lambda: os.environ.update(env))  # (a bound method would be a copy's)
            proc = start(cfg, "runner.name=dask", f"runner.address={cluster.scheduler_address}",
                         env=env)
            wait_for(hold.with_name("hold.reached"), proc)
            t0 = time.monotonic()
            send(proc, signal.SIGINT)
            code, err, took = ended(proc, t0, FIRST_S)
            assert (code, err) == (130, [LINES[signal.SIGINT]])
            assert took < FIRST_S, took
            hold.touch()  # the held task may go on: it must find its leases gone
            deadline = time.monotonic() + WAIT_S
            while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
                assert time.monotonic() < deadline, "the job's tasks stayed on the cluster"
                threading.Event().wait(0.05)
            assert set(client.scheduler_info()["workers"]) == workers  # none was killed
        finally:
            for k in env:
                os.environ.pop(k, None)
    out = tmp_path / "out"
    assert snapshot(out) == before
    assert sorted(p.name for p in out.iterdir()) == ["clean", "report"]


def test_a_stopped_jobs_spill_stays_gone_while_its_threads_still_write(tmp_path):
    """The local runner's worker threads cannot be killed: one that spills a chunk after
    the stop deleted the spill folder made it again (a sweep found the folder beside the
    output after 2 of 9 stops). Deleted for good, the folder refuses their writes, in
    every way the job's writers make files; other folders are written as before."""
    from transforms.io import fs

    spill = tmp_path / ".clean.staging-1-2.near"
    fs.write_scratch(str(spill / "values" / "0.values"), b"chunk 0")
    wrote, go, errors = threading.Event(), threading.Event(), []

    def worker() -> None:  # a bundle still running when the stop's cleanup ran
        wrote.set()
        go.wait(WAIT_S)
        for write in (lambda: fs.write_scratch(str(spill / "values" / "1.values"), b"1"),
                      lambda: fs.makedirs(str(spill / "cells")),
                      lambda: fs.local_file_for(str(spill / "cells" / "c.arrow")).__enter__()):
            try:
                write()
            except OSError as e:
                errors.append(str(e))

    t = threading.Thread(target=worker)
    t.start()
    wrote.wait(WAIT_S)
    fs.close_tree(str(spill))
    go.set()
    t.join(WAIT_S)
    assert not spill.exists()
    assert len(errors) == 3 and all("the job that writes here was stopped" in e
                                    for e in errors), errors
    fs.write_scratch(str(tmp_path / ".clean.staging-1-3.near" / "values" / "0.values"), b"0")
    assert (tmp_path / ".clean.staging-1-3.near" / "values" / "0.values").read_bytes() == b"0"
