"""runner.name: portable: the job through Beam's PortableRunner, a real job service and a
real worker pool whose SDK workers are processes of their own (the Dataflow Runner v2
path: pipeline proto, coders, pickled DoFns, side inputs materialised by the runner).
Outputs are compared with the local runner's byte for byte; every run must leave no
process and no temporary file behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.publish import HOLD_ENV
from tests.jobkit import assert_clean, interruptible, run_job, tagged_processes
from tests.test_runners import ROWS, comparable, outputs, removed, run_on, write_inputs

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "data" / "sample" / "parquet" / "*.parquet")
WAIT_S = 60  # upper bound on waiting for a process to appear or go; not reached normally


@pytest.fixture(scope="module")
def job_input(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("portable_in")
    write_inputs(root)
    return root


def test_exact_job_matches_the_local_runner_byte_for_byte(tmp_path, job_input, isolated):
    """50k rows, 3 files of several read units, duplicates within and across files,
    invalid records: two SDK worker processes give the local runner's bytes."""
    local = run_on(tmp_path / "local", job_input, "runner.workers=1")
    portable = run_on(tmp_path / "portable", job_input, "runner.name=portable",
                      "runner.workers=2")
    assert portable["read"] == portable["kept"] + removed(portable) + portable["invalid"] == ROWS
    assert comparable(portable) == comparable(local)
    assert outputs(tmp_path / "portable") == outputs(tmp_path / "local")
    assert_clean(*isolated)


def stage_ends(stderr: str) -> dict[str, str]:
    """What progress showed: each stage's last line, and each note (near: ...)."""
    out = {}
    for line in stderr.splitlines():
        if line.startswith("["):
            out[line.split("]")[0] + "]"] = line
        elif line.startswith("near: "):
            out[line] = line
    return out


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_near_job_matches_the_local_runner_byte_for_byte(tmp_path, isolated, capsys, grouping):
    """The near stage in several k-means cells: the plan is a side input that every
    worker process reads from the runner, cells are searched on either worker. The
    workers' progress reaches the launcher: the same stage totals and notes."""
    import yaml

    from pipeline.run import main

    near = {"metric": "l2", "threshold": 0.1, "grouping": grouping,
            "single_index_rows": 1000, "partition_rows": 500}
    runs, shown = {}, {}
    for name in ("local", "portable"):
        out = tmp_path / name / "out"
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({
            "input": {"format": "parquet", "path": SAMPLE, "tensor": "embedding", "id": "id"},
            "near": near, "output": {"path": str(out / "clean")}, "report": str(out / "report"),
            "runner": {"name": name, "workers": 2}}))
        assert main(["--config", str(cfg)]) == 0
        runs[name] = json.loads((out / "report" / "summary.json").read_text())
        shown[name] = stage_ends(capsys.readouterr().err)
    local, portable = runs["local"], runs["portable"]
    assert local["near"]["cells"] > 1 and local["removed_near"] > 0
    assert comparable(portable) == comparable(local)
    assert outputs(tmp_path / "portable") == outputs(tmp_path / "local")
    assert {"[read]", "[near search]", "[write]"} <= set(shown["local"])
    assert shown["portable"] == shown["local"]
    assert_clean(*isolated)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_job_service() -> tuple[subprocess.Popen, str]:
    """``python -m pipeline.portable jobs`` as a user starts one, and its address."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.portable", "jobs"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()  # "jobs: serving on localhost:PORT (Ctrl-C stops)"
    assert line.startswith("jobs: serving on localhost:"), line
    return proc, line.split()[3]


@pytest.fixture
def job_service(isolated):
    proc, address = start_job_service()
    try:
        yield address, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT_S) == 0
    assert_clean(*isolated)


def test_job_service_at_an_address_runs_the_job(tmp_path, isolated, job_service, capsys):
    """runner.address: the job goes to that service; its workers come from a worker pool
    the job starts and stops; twice on one service."""
    address, service = job_service
    local = tmp_path / "local"
    local.mkdir()
    assert run_job(local, "parquet", SAMPLE, "runner.workers=1",
                   input={"tensor": "embedding"}) == 0
    for i in range(2):
        (tmp_path / f"at{i}").mkdir()
        assert run_job(tmp_path / f"at{i}", "parquet", SAMPLE, "runner.name=portable",
                       f"runner.address={address}", input={"tensor": "embedding"}) == 0
        assert outputs(tmp_path / f"at{i}") == outputs(local)
        assert tagged_processes(isolated[0]) == [service]  # the pool and workers are gone
    assert capsys.readouterr().err == ""


def test_an_address_without_a_job_service_is_one_line_and_exit_2(tmp_path, capsys):
    """Checked before any work (tuning.remote_timeout_s for an answer): nothing listens
    there, or what listens is not a job service."""
    with socket.socket() as busy:  # listens, but speaks no gRPC
        busy.bind(("localhost", 0))
        busy.listen()
        for address in (f"localhost:{free_port()}", f"localhost:{busy.getsockname()[1]}"):
            start = time.monotonic()
            assert run_job(tmp_path, "parquet", SAMPLE, "runner.name=portable",
                           f"runner.address={address}", "tuning.remote_timeout_s=1",
                           input={"tensor": "embedding"}) == 2
            assert time.monotonic() - start < 20
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith(
                f"error: runner.address: no Beam job service at {address}: "), err
            assert not (tmp_path / "out").exists()


def test_a_failing_job_is_one_line_and_exit_1(tmp_path, isolated, capsys):
    """A worker error (an invalid record with on_invalid: fail) reaches the launcher from
    the job service as the local runner's one line; nothing is published, nothing is
    left running."""
    data = tmp_path / "in"
    shutil.copytree(ROOT / "data" / "sample" / "parquet", data)
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(data / "part-00001.parquet")
    emb = t.column("embedding").combine_chunks()
    broken = pa.FixedSizeListArray.from_arrays(emb.values, emb.type.list_size,
                                               mask=pa.array([i == 7 for i in range(len(t))]))
    pq.write_table(t.set_column(t.schema.get_field_index("embedding"), "embedding", broken),
                   data / "part-00001.parquet")
    lines = {}
    for name in ("local", "portable"):
        assert run_job(tmp_path, "parquet", str(data / "*.parquet"), f"runner.name={name}",
                       "on_invalid=fail", input={"tensor": "embedding"}) == 1
        lines[name] = capsys.readouterr().err.strip().splitlines()
    assert len(lines["portable"]) == 1, lines
    assert lines["portable"] == lines["local"]  # the worker's error, as the local runner says it
    assert "invalid record" in lines["portable"][0] and "part-00001.parquet" in lines["portable"][0]
    assert not (tmp_path / "out" / "report").exists()
    assert_clean(*isolated)


def run_cli(tmp_path: Path, *sets: str) -> subprocess.Popen:
    """The CLI on the portable runner, its Publish step held (in a worker) until
    ``tmp_path / "hold"`` exists: the job cannot finish before the test stops it."""
    import yaml

    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({
        "input": {"format": "parquet", "path": str(tmp_path / "in" / "*.parquet"),
                  "tensor": "emb", "id": "id"},
        "output": {"path": str(tmp_path / "out" / "clean")},
        "report": str(tmp_path / "out" / "report"), "runner": {"name": "portable"}}))
    return subprocess.Popen([sys.executable, "-m", "pipeline.run", "--config", str(cfg),
                             "--quiet", *[a for s in sets for a in ("--set", s)]],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, HOLD_ENV: str(tmp_path / "hold")},
                            preexec_fn=interruptible)


def wait_until_held(tmp_path: Path, proc: subprocess.Popen) -> None:
    """Until an SDK worker has reached the held Publish step (the job is running and
    cannot finish: a job that finished before the signal, under load, exited 0)."""
    deadline = time.monotonic() + WAIT_S
    while not (tmp_path / "hold.reached").exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        try:
            proc.wait(0.05)
        except subprocess.TimeoutExpired:
            pass


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_a_stopped_launcher_leaves_nothing_running(tmp_path, isolated, how):
    """Ctrl-C while the job runs: exit 130, services and workers stopped, temporary
    files removed. A killed launcher (no chance to clean up): its services notice and
    stop with their workers."""
    tag, tmp = isolated
    (tmp_path / "in").mkdir()
    write_inputs(tmp_path / "in")  # 50k rows: seconds of work once the workers run
    proc = run_cli(tmp_path, "tuning.unit_rows=8192", "tuning.chunk_rows=4096")
    wait_until_held(tmp_path, proc)
    proc.send_signal(signal.SIGINT if how == "interrupt" else signal.SIGKILL)
    code = proc.wait(WAIT_S)
    if how == "interrupt":
        assert code == 130, proc.stderr.read()
        assert "interrupted: nothing was published" in proc.stderr.read()
        assert_clean(tag, tmp)
    else:
        deadline = time.monotonic() + WAIT_S  # they look for their launcher every second
        while tagged_processes(tag):
            assert time.monotonic() < deadline, tagged_processes(tag)
            threading.Event().wait(0.1)
    assert not (tmp_path / "out" / "report").exists()


def test_a_job_service_that_goes_away_fails_the_run_in_one_line(tmp_path, isolated):
    """runner.address's service killed while the job runs: exit 1, one line, the worker
    pool the job started is stopped with its workers."""
    tag, tmp = isolated
    (tmp_path / "in").mkdir()
    write_inputs(tmp_path / "in")
    service, address = start_job_service()
    proc = run_cli(tmp_path, "tuning.unit_rows=8192", "tuning.chunk_rows=4096",
                   f"runner.address={address}")
    wait_until_held(tmp_path, proc)
    service.kill()
    service.wait()
    assert proc.wait(WAIT_S) == 1
    err = proc.stderr.read().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the job failed"), err
    assert f"the job service at {address} stopped answering" in err[0]
    deadline = time.monotonic() + WAIT_S  # the workers notice their runner is gone
    while tagged_processes(tag):
        assert time.monotonic() < deadline, tagged_processes(tag)
        threading.Event().wait(0.1)
    assert not (tmp_path / "out" / "report").exists()
