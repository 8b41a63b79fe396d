"""The whole job on Dask (exact + near, a reference set and a fingerprint store) against
the local runner, byte for byte, on real clusters of worker processes; and Beam's side
inputs computed once per job there (``pipeline.runners.dask``)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config.runner import RunnerConfig
from tests.test_runners import DIM, ROWS, comparable, outputs, run_on, write_inputs
from transforms.store import segment as digest_segment

distributed = pytest.importorskip("distributed")

NEAR_ROWS = 1_500  # input rows made near copies of others (l2 ~ 0.006, threshold 0.1)


def near_copies(x: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    return x[rng.integers(0, len(x), n)] + rng.normal(0, 1e-3, (n, x.shape[1])).astype(
        np.float32)


def write_table(path: Path, x: np.ndarray, prefix: str) -> None:
    offsets = pa.array(np.arange(len(x) + 1, dtype=np.int32) * x.shape[1])
    emb = pa.ListArray.from_arrays(offsets, pa.array(x.reshape(-1)))
    pq.write_table(pa.table({"id": [f"{prefix}{i}" for i in range(len(x))], "emb": emb,
                             "label": np.arange(len(x)) % 7}), path)


@pytest.fixture(scope="module")
def near_input(tmp_path_factory) -> Path:
    """tests.test_runners' 20k rows with near copies across files, a reference set (near
    and exact copies of input rows, and others) and a store made by an earlier run."""
    root = tmp_path_factory.mktemp("dask_near")
    (root / "in").mkdir()
    write_inputs(root / "in")
    rng = np.random.default_rng(22)
    files = sorted((root / "in").glob("*.parquet"))
    x = np.concatenate([pq.read_table(f)["emb"].combine_chunks().drop_null().flatten()
                        .to_numpy().reshape(-1, DIM) for f in files])
    write_table(root / "in" / "part9.parquet", near_copies(x, rng, NEAR_ROWS), "n")
    (root / "ref").mkdir()
    write_table(root / "ref" / "ref.parquet", np.concatenate(
        [near_copies(x, rng, 200), x[rng.integers(0, len(x), 100)],
         rng.standard_normal((200, x.shape[1])).astype(np.float32)]), "ref")
    (root / "earlier").mkdir()
    write_table(root / "earlier" / "e.parquet", np.concatenate(
        [near_copies(x, rng, 200), x[rng.integers(0, len(x), 100)]]), "e")
    assert run_on(root / "first", root / "earlier", "runner.workers=1",
                  f"store.path={root / 'store'}", "run_id=earlier", "near.metric=l2",
                  "near.threshold=0.1") is not None
    return root


def _mark(folder: str, what: str, value):
    """Leave a file per call (the calls are counted across worker processes)."""
    Path(folder, f"{what}-{os.getpid()}-{uuid.uuid4().hex}").touch()
    return value


def _pair(x, count: int) -> tuple:
    return x, count


def test_a_side_input_is_computed_once_with_its_value(tmp_path, dask_address):
    """Beam 2.77's DaskRunner alone: ``Count.Globally`` of 64 elements read as a side
    input by 16 tasks was 128 in each, and the step making it ran in every task. Here:
    64 everywhere, that step run once, the shared upstream read once."""
    import apache_beam as beam

    from pipeline.runners import make_pipeline

    marks = str(tmp_path)
    p = make_pipeline(RunnerConfig(name="dask", address=dask_address))
    src = (p | beam.Create(list(range(64)), reshuffle=False)
           | "Read" >> beam.Map(lambda x: _mark(marks, "read", x)))
    count = beam.pvalue.AsSingleton(
        src | beam.combiners.Count.Globally()
        | "Plan" >> beam.Map(lambda n: _mark(marks, "plan", n)))
    seen = (src | "Use" >> beam.Map(_pair, count) | "Counts" >> beam.Map(lambda kv: kv[1])
            | beam.combiners.ToList())
    seen | "Write" >> beam.Map(lambda c: Path(marks, "seen").write_text(repr(sorted(c))))
    p.run().wait_until_finish()
    assert Path(marks, "seen").read_text() == repr([64] * 64)
    calls = [f.name.split("-")[0] for f in tmp_path.iterdir() if "-" in f.name]
    assert (calls.count("plan"), calls.count("read")) == (1, 64)


def near_sets(grouping: str, root: Path, store: Path) -> tuple[str, ...]:
    return ("near.metric=l2", "near.threshold=0.1", f"near.grouping={grouping}",
            "near.single_index_rows=4000", "near.partition_rows=2000",
            f"reference.path={root / 'ref' / '*.parquet'}", "reference.format=parquet",
            "reference.tensor=emb", "reference.id=id", f"store.path={store}")


def assert_same_runs(tmp_path: Path, runs: dict, expected: str, got: str) -> None:
    """Two near runs made by ``run_on`` under ``tmp_path / name`` with their stores at
    ``tmp_path / f"{name}-store"``: the same counts, report files and clean shards, byte
    for byte, and the same store contents."""
    for run in runs.values():
        run["store"].pop("path")
    assert comparable(runs[got]) == comparable(runs[expected])
    want, have = outputs(tmp_path / expected), outputs(tmp_path / got)
    assert have.keys() == want.keys()
    assert [k for k in have if have[k] != want[k]] == []
    stored = store_files(tmp_path / f"{expected}-store")
    assert len(stored) > 2 and store_files(tmp_path / f"{got}-store") == stored


@pytest.fixture(scope="module")
def dask_address():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_near_job_on_dask_matches_the_local_runner(tmp_path, near_input, dask_address,
                                                   grouping):
    """Exact + near with a reference set and a store: the same clean shards, report
    files and counts as the local runner, on a cluster the job starts (representative)
    or one given by address (components), and the same store afterwards."""
    dask = (("runner.workers=2",) if grouping == "representative"
            else (f"runner.address={dask_address}",))
    runs = {}
    for name, sets in (("local", ("runner.workers=1",)), ("dask", ("runner.name=dask", *dask))):
        store = tmp_path / f"{name}-store"
        shutil.copytree(near_input / "store", store)
        runs[name] = run_on(tmp_path / name, near_input / "in", *sets,
                            *near_sets(grouping, near_input, store))
    local = runs["local"]
    assert local["near"]["cells"] > 1
    for kind in ("near", "reference_near", "reference_exact", "store_near", "store_exact"):
        assert local[f"removed_{kind}"] > 0, kind
    assert_same_runs(tmp_path, runs, "local", "dask")
    assert local["read"] == ROWS + NEAR_ROWS


def store_files(store: Path) -> dict[str, bytes]:
    """What the store holds, by run and file name: each segment's digests and ids (its
    header names the attempt) and each value file's bytes."""
    out = {}
    for p in sorted(store.glob("runs/*/*/*")):
        if p.suffix == ".seg":
            words, _run, ids, _runs = digest_segment.read_all(str(p))
            out[p.parent.parent.name, p.name] = (words.tobytes(), ids.to_pylist())
        elif p.suffix == ".parquet":
            out[p.parent.parent.name, p.name] = p.read_bytes()
    return out


def test_the_first_plan_written_is_the_one_every_task_gets(tmp_path):
    """A recomputed step (a lost worker's, a retried bundle's) returns the value the
    first computation wrote, not its own."""
    from transforms.io.agreed import first_written

    path = str(tmp_path / "plan" / "plan.pickle")
    assert first_written(path, {"cells": 25}) == {"cells": 25}
    assert first_written(path, {"cells": 173}) == {"cells": 25}


def test_embed_job_on_dask_matches_the_local_runner(tmp_path, dask_address):
    """decode: image + embed (a TorchScript module of our own) + near over two files in
    chunks of 8 images, exact copies across chunks and files: on Dask the same report,
    clean shards and embeddings (one file per chunk, written for the records exact dedup
    kept) as the local runner. Before, Dask lost the chunks Beam's RunInference handed
    out in finish_bundle and never ran the embeddings' writes."""
    from tests.imagekit import crops, encode
    from tests.jobkit import run_job
    from tests.test_embed import tiny_model

    rng = np.random.default_rng(3)
    imgs = crops(40, h=24, w=24, seed=4)
    (tmp_path / "in").mkdir()
    for f in range(2):
        picks = rng.integers(0, len(imgs), 60)
        vals = [encode(imgs[i]) if k % 5 else encode(
            np.clip(imgs[i].astype(int) + 2, 0, 255).astype(np.uint8))
            for k, i in enumerate(picks.tolist())]
        pq.write_table(pa.table({"id": [f"f{f}-{k}" for k in range(len(vals))],
                                 "emb": pa.array(vals, pa.binary())}),
                       tmp_path / "in" / f"part{f}.parquet")
    model = tiny_model(tmp_path / "pooled.pt")
    sets = ("input.decode=image", "input.resize=[8, 8]", "embed.model=torchscript",
            f"embed.path={model}", "embed.batch_size=5", "near.metric=l2",
            "near.threshold=0.1", "tuning.chunk_rows=8")
    summaries = {}
    for name, runner in (("local", ("runner.workers=2",)),
                         ("dask", ("runner.name=dask", f"runner.address={dask_address}"))):
        (tmp_path / name).mkdir()
        assert run_job(tmp_path / name, "parquet", str(tmp_path / "in" / "*.parquet"),
                       *sets, *runner) == 0
        summaries[name] = json.loads(
            (tmp_path / name / "out" / "report" / "summary.json").read_text())
    assert comparable(summaries["dask"]) == comparable(summaries["local"])
    assert summaries["local"]["removed_exact"] > 40 and summaries["local"]["removed_near"] > 0
    expected, got = outputs(tmp_path / "local"), outputs(tmp_path / "dask")
    assert got.keys() == expected.keys()
    assert [k for k in got if got[k] != expected[k]] == []
    emb = pq.read_table(tmp_path / "dask" / "out" / "report" / "embeddings")
    assert emb.num_rows == 120 - summaries["local"]["removed_exact"]


def test_only_the_reads_outputs_are_let_go(tmp_path, near_input):
    """The job holds every fan-out point on the cluster to the end except what carries
    the records' values: the read step's, known by its DoFn (``CARRIES_VALUES``), not
    by its name."""
    import apache_beam as beam

    from pipeline.api import publication, to_config
    from pipeline.graph import build
    from pipeline.preflight import prepare
    from pipeline.runners.dask import _carries_tensors

    cfg = {"input": {"format": "parquet", "path": str(near_input / "in" / "*.parquet"),
                     "tensor": "emb", "id": "id"},
           "near": {"metric": "cosine", "threshold": 0.01},
           "output": {"path": str(tmp_path / "clean")}, "report": str(tmp_path / "report")}
    job = prepare(to_config(cfg))
    p = beam.Pipeline()
    build(p, job, publication(job))
    found = []

    class Visit(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if _carries_tensors(node):
                found.append(node.full_label)

    p.visit(Visit())
    assert found == ["Read/ReadChunks/Run"]


def test_a_dead_scheduler_address_is_refused_before_any_work(tmp_path, parquet_in, capsys):
    """No scheduler at runner.address: exit 2, one line naming the key, nothing written
    (it was exit 1 after about 30 s, with a CancelledError or ConnectionRefusedError)."""
    import socket

    from tests.jobkit import run_job

    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert run_job(tmp_path, "parquet", parquet_in, "runner.name=dask",
                   f"runner.address=tcp://127.0.0.1:{port}") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: runner.address: no Dask scheduler at tcp://127.0.0.1:{port}"
                           ": the connection was refused; start one")
    assert not (tmp_path / "out").exists()


def test_a_scheduler_address_that_answers_is_taken(dask_address):
    from pipeline.runners.dask import check_address

    assert check_address(dask_address, 10.0) is None


def test_a_scheduler_that_goes_away_mid_run_fails_the_run(tmp_path, parquet_in):
    """The cluster at runner.address loses its scheduler while the job is publishing: the
    command exited 0 and printed the previous run's summary.json as this run's. Now: exit
    1, one line saying the cluster went away, the previous output as it was."""
    import signal
    import subprocess
    import sys

    import dask

    from pipeline.publish import HOLD_ENV
    from tests.jobkit import interruptible, run_job
    from tests.test_preflight import snapshot
    from tests.test_stopping import ROOT, WAIT_S, wait_for

    hold = tmp_path / "hold"
    hold.touch()  # the earlier run, on the local runner, is not held
    env = {HOLD_ENV: str(hold)}
    os.environ.update(env)  # the cluster's workers read it: started by this process
    try:
        assert run_job(tmp_path, "parquet", parquet_in, "runner.workers=1") == 0
        before = snapshot(tmp_path / "out")
        hold.unlink()
        hold.with_name("hold.reached").unlink()
        # the scheduler gone, the cluster's and the command's clients give up reconnecting
        # after 2 s, not 30
        with dask.config.set({"distributed.comm.timeouts.connect": "2s"}), \
                distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                         dashboard_address=":0") as cluster:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.run", "--config", str(tmp_path / "job.yaml"),
                 "--quiet", "--overwrite", "--set", "runner.name=dask", "--set",
                 f"runner.address={cluster.scheduler_address}"], cwd=ROOT,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"},
                start_new_session=True, preexec_fn=interruptible)
            try:
                wait_for(hold.with_name("hold.reached"), proc)  # Publish, on the worker
                cluster.sync(cluster.scheduler.close)
                out, err = proc.communicate(timeout=WAIT_S)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                hold.touch()  # the held task ends (its run's leases are gone: it publishes
                # nothing), so its worker stops at once
    finally:
        for k in env:
            os.environ.pop(k, None)
        hold.touch()
    assert proc.returncode == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: the job failed; nothing was published (the previous "
                           "output, if any, is unchanged): the Dask cluster at "
                           f"{cluster.scheduler_address} went away"), line
    assert snapshot(tmp_path / "out") == before
