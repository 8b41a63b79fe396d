"""End-to-end: the dedup job on real files of each format, checked against a brute-force oracle."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.jobkit import EXT, read_output, report, run_job, write_input
from tests.oracle import expected_removals

FORMATS = ["parquet", "tfrecord", "hdf5"]
SHAPE = (2, 3)


def planted(seed: int, files: int = 3, rows: int = 150) -> list[tuple[list[str], np.ndarray]]:
    """Files of (ids, tensors) with exact copies across files and -0.0 / NaN-payload copies."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, (files * rows, *SHAPE)).astype(np.float32)  # many natural dups
    x[rng.choice(len(x), 30), 0, 0] = 0.0
    zero = np.flatnonzero(x[:, 0, 0] == 0)
    x[zero[::2], 0, 0] = -0.0
    nan_rows = rng.choice(len(x), 8, replace=False)
    x[nan_rows, 1, 1] = np.float32("nan")
    x[nan_rows[::2], 1, 1] = np.frombuffer(np.uint32(0xFFC01234).tobytes(), np.float32)[0]
    return [([f"f{f}-{i}" for i in range(rows)], x[f * rows:(f + 1) * rows])
            for f in range(files)]


def write_files(fmt, root, parts, **kw):
    for f, (ids, t) in enumerate(parts):
        write_input(fmt, root / f"part-{f}.{EXT[fmt]}", ids, t, np.arange(len(ids)) % 7, **kw)


def records(parts):
    return [(i, t, 0.0) for ids, ts in parts for i, t in zip(ids, ts, strict=True)]


def outputs(fmt, tmp_path, files):
    got = {}
    for f in range(files):
        ids, tensors, labels = read_output(fmt, tmp_path / "out" / "clean" / f"part-{f}.{EXT[fmt]}",
                                           SHAPE)
        got[f] = (ids, tensors, labels)
    return got


@pytest.mark.parametrize("fmt", FORMATS)
def test_job_matches_oracle(tmp_path, fmt, capsys):
    parts = planted(1)
    write_files(fmt, tmp_path / "in", parts)
    shape = {"shape": list(SHAPE), "dtype": "float32"} if fmt == "tfrecord" else {}
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{EXT[fmt]}"), input=shape) == 0
    expected = expected_removals(records(parts))
    assert 100 < len(expected) < 400  # the data really holds duplicates, not all of it

    dups, invalid = report(tmp_path)
    assert dict(zip(dups["record_id"].to_pylist(), dups["duplicate_of"].to_pylist(),
                    strict=True)) == expected
    assert set(dups["kind"].to_pylist()) == {"exact"} and set(dups["distance"].to_pylist()) == {0}
    assert invalid.num_rows == 0
    # -0.0 and NaN-payload copies were merged with their +0.0 / quiet-NaN twins
    neg_zero = [i for ids, t in parts for i, r in zip(ids, t, strict=True)
                if np.signbit(r[0, 0]) and r[0, 0] == 0]
    assert any(i in expected for i in neg_zero)

    kept_total = 0
    for f, (ids, tensors, labels) in outputs(fmt, tmp_path, len(parts)).items():
        src_ids, src = parts[f]
        want = [i for i in src_ids if i not in expected]
        assert ids == want  # survivors, in input order
        idx = [src_ids.index(i) for i in ids]
        np.testing.assert_array_equal(tensors.view(np.uint32), src[idx].view(np.uint32))
        np.testing.assert_array_equal(labels, np.array(idx) % 7)  # carried through in step
        kept_total += len(ids)

    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == sum(len(p[0]) for p in parts)
    assert summary["kept"] == kept_total and summary["removed_exact"] == len(expected)
    assert summary["read"] == (summary["kept"] + summary["removed_exact"]
                               + summary["removed_near"] + summary["invalid"])
    assert summary["config"]["input"]["format"] == fmt and summary["wall_time_s"] > 0
    assert "kept" in capsys.readouterr().out


@pytest.mark.parametrize("keep", ["last", "max", "min"])
def test_keep_policies_match_oracle(tmp_path, keep):
    parts = planted(2)
    label = {i: float(n % 7) for ids, _ in parts for n, i in enumerate(ids)}
    write_files("parquet", tmp_path / "in", parts)
    policy = keep if keep == "last" else f"{{{keep}: label}}"
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   f"keep={policy}") == 0
    recs = [(i, t, label[i]) for i, t, _ in records(parts)]
    dups, _ = report(tmp_path)
    got = dict(zip(dups["record_id"].to_pylist(), dups["duplicate_of"].to_pylist(), strict=True))
    assert got == expected_removals(recs, keep)


def test_runs_are_deterministic(tmp_path):
    parts = planted(3)
    write_files("parquet", tmp_path / "in", parts)
    glob = str(tmp_path / "in" / "*.parquet")
    blobs = []
    for run in range(2):
        assert run_job(tmp_path, "parquet", glob, "output.overwrite=true",
                       "tuning.chunk_rows=40", f"tuning.shards={3 + run * 5}") == 0
        r = tmp_path / "out" / "report"
        summary = json.loads((r / "summary.json").read_text())
        del summary["wall_time_s"], summary["attempt"], summary["config"]["tuning"]  # per run
        blobs.append(((r / "duplicates.parquet").read_bytes(),
                      (r / "invalid.parquet").read_bytes(), summary))
    assert blobs[0] == blobs[1]


def test_dtype_and_shape_decoys_are_not_merged(tmp_path):
    """Same bytes as float32 and int32, and as shape (6,) and (2, 3): four distinct tensors."""
    rng = np.random.default_rng(4)
    f32 = rng.standard_normal((20, 6)).astype(np.float32)
    ids = [f"r{i}" for i in range(20)]
    write_input("hdf5", tmp_path / "in" / "a.h5", ids, f32, np.zeros(20, int))
    write_input("hdf5", tmp_path / "in" / "b.h5", [f"b{i}" for i in ids], f32.view(np.int32),
                np.zeros(20, int))
    write_input("hdf5", tmp_path / "in" / "c.h5", [f"c{i}" for i in ids], f32.reshape(20, 2, 3),
                np.zeros(20, int))
    write_input("hdf5", tmp_path / "in" / "d.h5", [f"d{i}" for i in ids], f32, np.zeros(20, int))
    assert run_job(tmp_path, "hdf5", str(tmp_path / "in" / "*.h5")) == 0
    dups, _ = report(tmp_path)
    assert sorted(dups["record_id"].to_pylist()) == sorted(f"d{i}" for i in ids)
    assert set(dups["duplicate_of"].to_pylist()) == set(ids)


def test_bad_files_are_reported_and_good_records_survive(tmp_path):
    parts = planted(5, files=2, rows=60)
    write_files("tfrecord", tmp_path / "in", parts)
    raw = bytearray((tmp_path / "in" / "part-1.tfrecord").read_bytes())
    at = 0
    for _ in range(30):  # TFRecord framing: u64 length, u32 crc, data, u32 crc
        at += 16 + int.from_bytes(raw[at:at + 8], "little")
    raw[at + 12 + 5] ^= 0xFF  # inside record 30's payload: a data CRC mismatch
    (tmp_path / "in" / "part-1.tfrecord").write_bytes(bytes(raw))
    assert run_job(tmp_path, "tfrecord", str(tmp_path / "in" / "*.tfrecord"),
                   input={"shape": list(SHAPE)}) == 0
    _, invalid = report(tmp_path)
    assert invalid.num_rows == 1 and "CRC" in invalid["reason"][0].as_py()
    assert invalid["record_id"][0].as_py() in ("f1-30", f"{tmp_path}/in/part-1.tfrecord:30")
    assert invalid["source"][0].as_py().endswith("part-1.tfrecord")
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["invalid"] == 1 and summary["read"] == 120
    assert summary["kept"] + summary["removed_exact"] == 119


def test_truncated_parquet_next_to_good_files(tmp_path):
    parts = planted(6, files=2, rows=100)
    write_files("parquet", tmp_path / "in", parts)
    bad = tmp_path / "in" / "part-9.parquet"
    good = (tmp_path / "in" / "part-0.parquet").read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    # one file of three cannot be opened: more than max_invalid_fraction (0.1) of the files
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   "max_invalid_fraction=0.5") == 0
    dups, invalid = report(tmp_path)
    assert invalid.num_rows == 0  # the damaged file is no record: summary.json names it
    assert dict(zip(dups["record_id"].to_pylist(), dups["duplicate_of"].to_pylist(),
                    strict=True)) == expected_removals(records(parts))
    assert not (tmp_path / "out" / "clean" / "part-9.parquet").exists()
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == 200 and summary["invalid"] == 0
    (lost,) = summary["unreadable_files"]
    assert lost["path"] == str(bad) and "unreadable Parquet file" in lost["reason"]


def test_every_record_accounted_for_exactly_once(tmp_path):
    """Null and wrong-shape rows next to good ones: each id is in exactly one output."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [[1.0, 2.0], [1.0, 2.0], None, [3.0], [1.0, None], [0.0, 5.0], [-0.0, 5.0]]
    ids = [f"r{i}" for i in range(len(rows))]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": ids, "emb": pa.array(rows, pa.list_(pa.float32())),
                             "label": list(range(len(rows)))}), tmp_path / "in" / "a.parquet")
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   "max_invalid_fraction=1", input={"shape": [2]}) == 0
    dups, invalid = report(tmp_path)
    clean = pq.read_table(tmp_path / "out" / "clean" / "a.parquet")
    assert clean["id"].to_pylist() == ["r0", "r5"]
    assert dups["record_id"].to_pylist() == ["r1", "r6"]
    assert invalid["record_id"].to_pylist() == ["r2", "r3", "r4"]
    everything = clean["id"].to_pylist() + dups["record_id"].to_pylist() + \
        invalid["record_id"].to_pylist()
    assert sorted(everything) == sorted(ids)
    assert clean.schema == pq.read_schema(tmp_path / "in" / "a.parquet")


def test_exact_off_copies_everything(tmp_path):
    parts = planted(7, files=1, rows=50)
    write_files("parquet", tmp_path / "in", parts)
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"), "exact=false") == 0
    dups, _ = report(tmp_path)
    assert dups.num_rows == 0
    ids, _, _ = read_output("parquet", tmp_path / "out" / "clean" / "part-0.parquet", SHAPE)
    assert ids == parts[0][0]


def test_hdf5_keep_max_with_a_bigger_unrelated_dataset(tmp_path):
    """The tensor dataset is not the file's largest; rows are filtered in step, the rest kept."""
    import h5py

    parts = planted(8, files=1, rows=120)
    ids, x = parts[0]
    score = np.random.default_rng(8).random(120)
    (tmp_path / "in").mkdir()
    with h5py.File(tmp_path / "in" / "a.h5", "w") as h:
        h.create_dataset("emb", data=x, chunks=(32, *SHAPE))
        h.create_dataset("id", data=[i.encode() for i in ids])
        h.create_dataset("score", data=score)
        h.create_dataset("vocab", data=np.arange(5000 * 8).reshape(5000, 8))
    assert run_job(tmp_path, "hdf5", str(tmp_path / "in" / "*.h5"), "keep={max: score}") == 0
    expected = expected_removals([(i, t, s) for i, t, s in zip(ids, x, score, strict=True)],
                                 "max")
    dups, _ = report(tmp_path)
    assert dict(zip(dups["record_id"].to_pylist(), dups["duplicate_of"].to_pylist(),
                    strict=True)) == expected
    with h5py.File(tmp_path / "out" / "clean" / "a.h5") as h:
        kept = [i for i in ids if i not in expected]
        assert [b.decode() for b in h["id"][:]] == kept
        np.testing.assert_array_equal(h["score"][:], score[[ids.index(i) for i in kept]])
        assert h["vocab"].shape == (5000, 8) and h["emb"].chunks == (32, *SHAPE)


def test_gzip_tfrecord_in_gzip_out(tmp_path):
    parts = planted(9, files=2, rows=80)
    write_files("tfrecord", tmp_path / "in", parts, compression="GZIP")
    assert run_job(tmp_path, "tfrecord", str(tmp_path / "in" / "*.tfrecord"),
                   input={"shape": list(SHAPE)}) == 0
    expected = expected_removals(records(parts))
    for f, (ids, _, _) in outputs("tfrecord", tmp_path, 2).items():
        out = tmp_path / "out" / "clean" / f"part-{f}.tfrecord"
        assert out.read_bytes()[:2] == b"\x1f\x8b"  # still GZIP
        assert ids == [i for i in parts[f][0] if i not in expected]


def test_killed_run_leaves_nothing_that_looks_complete(tmp_path):
    """SIGKILL at well-defined points of a run that replaces an older output (its lease
    taken, staging created, a shard staged, inside Publish, the new output swapped in):
    summary.json, when present, always describes the clean shards next to it; otherwise
    nothing is marked done; the dead run's lease does not block the next run. Each kill
    waits for a file to appear, not for a time."""
    import signal
    import subprocess
    import sys
    import threading

    import pyarrow.parquet as pq
    import yaml

    from pipeline.publish import HOLD_ENV

    rng = np.random.default_rng(10)
    for f in range(4):
        x = rng.standard_normal((5000, 16)).astype(np.float32)
        x[:500] = x[500:1000]
        write_input("parquet", tmp_path / "in" / f"p{f}.parquet",
                    [f"{f}-{i}" for i in range(5000)], x, np.zeros(5000, int),
                    row_group_size=1024)
    glob = str(tmp_path / "in" / "*.parquet")
    stale = tmp_path / "stale"
    write_input("parquet", stale / "p0.parquet", ["s"], np.zeros((1, 16), np.float32),
                np.zeros(1, int))
    out = tmp_path / "out"
    cfg = {"input": {"format": "parquet", "path": glob, "tensor": "emb"},
           "output": {"path": str(out / "clean")},
           "report": str(out / "report"), "tuning": {"unit_rows": 1024}}
    (tmp_path / "kill.yaml").write_text(yaml.safe_dump(cfg))
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    summary = out / "report" / "summary.json"
    hold = tmp_path / "hold"
    points = {"lease taken": lambda: (out / ".clean.lease.json").exists(),
              "staging created": lambda: any(out.glob(".clean.staging-*")),
              "a shard staged": lambda: any(out.glob(".clean.staging-*/*.parquet")),
              "inside Publish": lambda: hold.with_name("hold.reached").exists(),
              "output swapped": lambda: (out / "clean" / "p3.parquet").exists(),
              "never (runs to the end)": lambda: False}
    tick = threading.Event()
    for point, reached in points.items():
        # an older, different output is in place before each run
        assert run_job(tmp_path, "parquet", str(stale / "*.parquet"), "output.overwrite=true",
                       input={"id": None}) == 0
        hold.with_name("hold.reached").unlink(missing_ok=True)
        env = {k: v for k, v in __import__("os").environ.items() if k != HOLD_ENV}
        if point == "inside Publish":
            env[HOLD_ENV] = str(hold)  # waits there for a file that never comes
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.run", "--config",
                                 str(tmp_path / "kill.yaml"), "--quiet", "--overwrite"],
                                cwd=root, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while proc.poll() is None and not reached():  # a poll on files, not a timed wait
            tick.wait(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert point != "never (runs to the end)" or proc.returncode == 0
        if summary.exists():
            s = json.loads(summary.read_text())
            clean = sum(pq.ParquetFile(p).metadata.num_rows
                        for p in (out / "clean").glob("*.parquet"))
            assert s["kept"] == clean and s["read"] == s["kept"] + s["removed_exact"], point
            assert s["read"] in (1, 20000), point
    assert json.loads(summary.read_text())["read"] == 20000  # the last run was not killed
