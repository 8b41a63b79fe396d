"""A Dask worker process killed (SIGKILL) while one of its tasks reads, searches cells or
writes a clean shard: the job still completes with the undisturbed run's outputs.

Each test starts a cluster of two worker processes and installs, in each, a hold at
one step (``client.run``): the first task of the cluster to reach it writes its
process id to a file and waits; the test kills that process as soon as the file is
there (waited on, never timed). Dask's nanny starts a fresh worker (without the hold),
the scheduler runs the lost tasks again, and what the dead worker held (persisted side
inputs included) is recomputed from the graph.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.jobkit import run_job
from tests.test_dask import near_input, near_sets  # noqa: F401 - a module fixture
from tests.test_runners import comparable, outputs, run_on
from transforms.io import conditional
from transforms.store.store import FingerprintStore

distributed = pytest.importorskip("distributed")

HOLD_S = 300  # how long a held task waits to be killed: far beyond the test's own wait
WAIT_S = 240  # how long the test waits for a task to reach the hold


def _held(folder: str) -> bool:
    """True in the first task (of the whole cluster) to get here."""
    return conditional.create_exclusive(os.path.join(folder, "claim"), b"")


def _wait_to_be_killed(folder: str) -> None:
    tmp = os.path.join(folder, "pid.tmp")
    Path(tmp).write_text(str(os.getpid()))
    os.replace(tmp, os.path.join(folder, "pid"))
    threading.Event().wait(HOLD_S)
    raise RuntimeError("the test did not kill this worker")


def install_hold(stage: str, folder: str) -> None:
    """Run in every worker process (``client.run``): hold the first task of ``stage``:
    read (after a unit's first chunk), search (a cell, before its search) or write (a
    clean shard written, then cut to half its size and a partial temporary file left
    beside it, as by a write cut short)."""
    if stage == "read":
        from pipeline.steps.read import ReadChunks

        read = ReadChunks.process

        def process(self, unit):
            for i, out in enumerate(read(self, unit)):
                yield out
                if i == 0 and _held(folder):
                    _wait_to_be_killed(folder)

        ReadChunks.process = process
    elif stage == "search":
        from pipeline.steps import near_cells

        decide = near_cells.decide_one

        def decide_one(*args, **kwargs):
            if _held(folder):
                _wait_to_be_killed(folder)
            return decide(*args, **kwargs)

        near_cells.decide_one = decide_one
    else:
        from pipeline.steps.write import WriteFile
        from transforms.io import fs
        from transforms.io.layout import output_shard

        write = WriteFile.process

        def process(self, decision, **side_inputs):
            out = list(write(self, decision, **side_inputs))
            if _held(folder):  # as if killed mid-write: a torn shard and a writer's temp
                dst = fs.join(self.staging, output_shard(decision.path, self.root))
                os.truncate(dst, os.path.getsize(dst) // 2)
                Path(fs.temp_path(dst, "tmp")).write_bytes(Path(dst).read_bytes())
                _wait_to_be_killed(folder)
            yield from out

        WriteFile.process = process


def kill_when_held(folder: Path, killed: list[int], stop: threading.Event) -> None:
    """Wait for the held task's process id, then SIGKILL that process."""
    pid_file = folder / "pid"
    deadline = time.monotonic() + WAIT_S
    while not pid_file.exists() and not stop.is_set() and time.monotonic() < deadline:
        stop.wait(0.02)
    if pid_file.exists():
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def run_near(tmp_path: Path, root: Path, *sets: str) -> dict:
    store = tmp_path / "store"
    shutil.copytree(root / "store", store)
    return run_on(tmp_path / "run", root / "in", *sets,
                  *near_sets("representative", root, store))


@pytest.fixture(scope="module")
def undisturbed(near_input, tmp_path_factory) -> tuple[dict, dict]:  # noqa: F811
    where = tmp_path_factory.mktemp("undisturbed")
    summary = run_near(where, near_input, "runner.workers=1")
    summary["store"].pop("path")
    return comparable(summary), outputs(where / "run")


def run_killing(tmp_path: Path, root: Path, stage: str, run, must_kill: bool = True):
    """``run(address)`` on a new cluster of two workers whose first task at ``stage``
    is killed; returns what ``run`` returned, once it is sure a worker was killed
    (``must_kill``; else also when none was: the job may have ended first)."""
    folder = tmp_path / "hold"
    folder.mkdir()
    killed: list[int] = []
    stop = threading.Event()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        workers = set(client.run(os.getpid).values())
        client.run(install_hold, stage, str(folder))
        killer = threading.Thread(target=kill_when_held, args=(folder, killed, stop))
        killer.start()
        try:
            out = run(cluster.scheduler_address)
        finally:
            stop.set()
            killer.join()
    assert not killed or killed[0] in workers
    assert killed or not must_kill, "no task reached the hold"
    return out


# Dask's own cancellation when a result it must recompute has an upstream the scheduler
# has forgotten (a read's output, which the job does not hold: pipeline.runners.dask).
# The issue allows it as the other outcome: the job fails in one line and publishes
# nothing. Seen once without any kill, before this test's hold was reached.
LOST = "cancelled for reason: lost dependencies"


@pytest.mark.parametrize("stage", ["read", "search", "write"])
def test_a_worker_killed_mid_task_changes_nothing(tmp_path, near_input, undisturbed,  # noqa: F811
                                                  stage, capsys):
    """Completes with the undisturbed run's outputs, or, where Dask lost a result it
    cannot recompute (``LOST``), fails with that one line: nothing published, the store
    untouched. Any other failure or difference fails the test."""
    store = tmp_path / "store"
    shutil.copytree(near_input / "store", store)
    (tmp_path / "run").mkdir()
    rc = run_killing(tmp_path, near_input, stage, lambda address: run_job(
        tmp_path / "run", "parquet", str(near_input / "in" / "*.parquet"),
        "tuning.unit_rows=4096", "tuning.chunk_rows=2048", "runner.name=dask",
        f"runner.address={address}", *near_sets("representative", near_input, store)),
        must_kill=False)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    if rc != 0:
        assert rc == 1 and len(err) == 1 and LOST in err[0], err
        assert not (tmp_path / "run" / "out").exists()  # nothing published or left
        assert [r.run_id for r in FingerprintStore(str(store)).runs()] == ["earlier"]
        return
    assert (tmp_path / "hold" / "pid").exists(), "no task reached the hold"
    summary = json.loads((tmp_path / "run" / "out" / "report" / "summary.json").read_text())
    summary["store"].pop("path")
    expected_summary, expected = undisturbed
    assert comparable(summary) == expected_summary
    got = outputs(tmp_path / "run")
    assert got.keys() == expected.keys()
    assert [k for k in got if got[k] != expected[k]] == []


def test_a_task_whose_worker_dies_too_often_fails_the_job_in_one_line(
        tmp_path, near_input, capsys, monkeypatch):  # noqa: F811
    """With no retry allowed (``allowed-failures: 0``), one kill mid-search fails the
    job: one line, exit 1, nothing published. The line names the killed worker, or
    Dask's cancellation when the killed worker held a result that others needed
    (``LOST``; 1 run in 4 here). A run that Dask cancelled so before any task reached
    the hold is tried again on a fresh cluster, up to twice: it says nothing about the
    kill (seen twice in about 20 runs of this file)."""
    import dask

    for attempt in range(3):
        where = tmp_path / f"attempt{attempt}"
        store = where / "store"
        shutil.copytree(near_input / "store", store)
        (where / "run").mkdir()
        job = functools.partial(
            run_job, where / "run", "parquet", str(near_input / "in" / "*.parquet"),
            "runner.name=dask", *near_sets("representative", near_input, store))
        with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
            rc = run_killing(where, near_input, "search",
                             lambda address, job=job: job(f"runner.address={address}"),
                             must_kill=False)
        err = [line for line in capsys.readouterr().err.splitlines()
               if line.startswith("error")]
        if (where / "hold" / "pid").exists() or not (len(err) == 1 and LOST in err[0]):
            break
    assert (where / "hold" / "pid").exists(), "no task reached the hold"
    assert rc == 1 and len(err) == 1 and ("KilledWorker" in err[0] or LOST in err[0]), err
    assert not (where / "run" / "out").exists()  # nothing published or left
