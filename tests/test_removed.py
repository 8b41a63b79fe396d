"""Large removal lists wait in files (``Removed.spill``): a stand-in crosses the runner as
the file's name and reads the same columns back; a job whose files lose tens of
thousands of records to exact and near copies writes them there, gets the oracle's
answer, and leaves no such file behind."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.steps.removed import SPILL_ROWS, Removed
from tests.jobkit import write_input
from tests.oracle import expected_removals
from tests.test_leases import finish, spawn, wait_for
from transforms.io import layout

COLUMNS = ("position", "record_id", "duplicate_of", "distance", "duplicate_of_run",
           "duplicate_of_file", "duplicate_of_position", "group")


def removal_lines(n: int, full: bool, seed: int = 0) -> Removed:
    rng = np.random.default_rng(seed)
    position = np.sort(rng.choice(10 * n, n, replace=False)).astype(np.int64)
    ids = pa.array([f"r{p}" for p in position.tolist()])
    of = pa.array([f"k{i}" for i in rng.integers(0, n, n).tolist()])
    if not full:
        return Removed(position, ids, of, "exact", np.zeros(n))
    runs = pa.array([None if i % 3 else f"run-{i}" for i in range(n)], pa.string())
    return Removed(position, ids, of, "store_near", rng.random(n), runs,
                   rng.integers(-1, 5, n).astype(np.int32), rng.integers(-1, 10**6, n),
                   rng.integers(0, 2**63, (n, 2)).astype(np.uint64))


def assert_same(a: Removed, b: Removed) -> None:
    assert a.kind == b.kind and len(a) == len(b)
    for name in COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        elif isinstance(x, pa.Array):
            assert x.equals(y), name
        else:
            assert x.dtype == y.dtype and np.array_equal(x, y), name


@pytest.mark.parametrize("full", [True, False])
def test_a_large_removal_list_crosses_as_its_files_name(tmp_path, full):
    r = removal_lines(SPILL_ROWS + 5, full)
    stand_in = r.spill(str(tmp_path))
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    sent = pickle.dumps(stand_in)
    assert len(sent) < 1024 < len(pickle.dumps(r)) // 100
    got = pickle.loads(sent)
    assert len(got) == len(r) and "position" not in vars(got)  # counted without reading
    assert_same(got, r)
    assert len(pickle.dumps(got)) < 1024  # read, it still travels as the name
    assert got.spill(str(tmp_path)) is got and len(list(tmp_path.iterdir())) == 1
    # merged with lines that travelled inline: as if none had been spilled
    other = removal_lines(100, full, seed=1)
    assert_same(Removed.concat_sorted([pickle.loads(sent), other]),
                Removed.concat_sorted([r, other]))


def test_a_short_list_or_no_folder_stays_inline(tmp_path):
    short = removal_lines(SPILL_ROWS - 1, True)
    assert short.spill(str(tmp_path)) is short
    long = removal_lines(SPILL_ROWS, False)
    assert long.spill(None) is long
    assert list(tmp_path.iterdir()) == []


def test_a_job_with_many_removals_writes_them_once_and_clears_them(tmp_path):
    """Two files: one where most records are exact copies of a few, one holding a crowd
    of near copies of one record (all within a quarter of the tolerance of it, so the
    first is kept and every other names it). Held in Publish, the run has its removal
    lists in files beside the staging directory; done, duplicates.parquet is the
    oracle's and nothing of the run is left."""
    rng = np.random.default_rng(3)
    n, dim = 2 * SPILL_ROWS, 16
    few = rng.standard_normal((50, dim)).astype(np.float32)
    copies = few[rng.integers(0, 50, n)]
    centre = rng.standard_normal(dim).astype(np.float32) * 5
    step = rng.standard_normal((n, dim))
    step *= 0.25 * rng.random((n, 1)) / np.linalg.norm(step, axis=1, keepdims=True)
    crowd = (centre + step).astype(np.float32)
    inputs = tmp_path / "in"
    ids_a, ids_b = [f"a{i}" for i in range(n)], [f"b{i}" for i in range(n)]
    write_input("parquet", inputs / "a.parquet", ids_a, copies, np.zeros(n, int),
                row_group_size=4096)
    write_input("parquet", inputs / "b.parquet", ids_b, crowd, np.zeros(n, int),
                row_group_size=4096)
    out = tmp_path / "out"
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"input: {{format: parquet, path: '{inputs}/*.parquet', tensor: emb, id: id}}\n"
        f"output: {{path: '{out}/clean'}}\nreport: '{out}/report'\n"
        "near: {metric: l2, threshold: 1.0, mode: exact}\n")
    hold = tmp_path / "hold"
    run = spawn(cfg, hold=hold)
    wait_for(Path(f"{hold}.reached"), run)
    spilled = [p for p in out.iterdir() if p.name.endswith(layout.REMOVALS)]
    assert len(spilled) == 1 and len(list(spilled[0].glob("*.arrows"))) >= 2
    hold.touch()
    rc, err = finish(run)
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["clean", "report"]

    dup = pq.read_table(out / "report" / "duplicates.parquet").to_pylist()
    exact = expected_removals([(i, x, 0.0) for i, x in zip(ids_a, copies, strict=True)])
    got_exact = {d["record_id"]: d["duplicate_of"] for d in dup if d["kind"] == "exact"}
    assert got_exact == exact and len(exact) > SPILL_ROWS
    got_near = {d["record_id"]: d["duplicate_of"] for d in dup if d["kind"] == "near"}
    assert got_near == {i: "b0" for i in ids_b[1:]}
    kept = pq.read_table(out / "clean" / "b.parquet").column("id").to_pylist()
    assert kept == ["b0"]
