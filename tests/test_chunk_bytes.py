"""Chunks are cut by bytes as well as rows (tuning.chunk_bytes): wide tensors written by
pyarrow, h5py and TensorFlow come back in chunks within the byte budget, every record
once and in order, and the job's removals stay those of the brute-force oracles."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import ConfigError, parse_config
from tests import shapes
from tests.jobkit import EXT, read_output, report, run_job, write_input
from tests.test_job_near import by_kind, expected
from transforms.io.formats import get_format
from transforms.io.formats.base import Chunking, TensorSpec, record_nbytes
from transforms.near.spec import NearSpec

SHAPE = (16, 16, 3)


def read_all(fmt: str, path, spec: TensorSpec, chunking: Chunking):
    f = get_format(fmt)
    spec = f.check(str(path), spec)
    units = f.plan(str(path), 0, chunking.unit_rows_for(record_nbytes(spec)), spec)
    chunks = [c for u in units for c in f.read(u, spec, chunking.chunk_rows,
                                               chunking.chunk_bytes)]
    return units, chunks


@pytest.mark.parametrize("fmt,dtype", [("parquet", "uint8"), ("parquet", "float32"),
                                       ("hdf5", "uint8"), ("tfrecord", "float32")])
def test_wide_records_come_in_chunks_within_the_budget(tmp_path, fmt, dtype):
    x, _ = shapes.images(300, SHAPE, dtype, seed=4)
    path = tmp_path / f"x.{EXT[fmt]}"
    write_input(fmt, path, [f"r{i}" for i in range(len(x))], x, np.zeros(len(x), np.int64),
                row_group_size=300)  # Parquet: one row group of every record
    budget = 10 * x[0].nbytes + 7  # 10 records
    inp = TensorSpec("emb", id="id", shape=SHAPE if fmt == "tfrecord" else None)
    units, chunks = read_all(fmt, path, inp, Chunking(4 << 16, 1 << 16, budget))
    assert all(c.tensors.nbytes <= budget for c in chunks)
    assert max(len(c.positions) for c in chunks) == 10
    assert np.array_equal(np.concatenate([c.positions for c in chunks]), np.arange(300))
    assert np.array_equal(np.concatenate([c.tensors for c in chunks]), x)
    if fmt == "hdf5":  # units: 4 chunks' worth of rows (40), rounded to h5 chunks of 16
        assert [u.start for u in units] == list(range(0, 300, 32))


def test_parquet_variable_size_lists_are_cut_by_their_stored_size(tmp_path):
    x, _ = shapes.images(200, SHAPE, "float32", seed=5)
    path = tmp_path / "x.parquet"
    shapes.write_parquet(path, x, row_group_rows=200, list_type="list")
    budget = 20 * x[0].nbytes
    _, chunks = read_all("parquet", path, TensorSpec("emb", id="id"), Chunking(chunk_bytes=budget))
    assert all(c.tensors.nbytes <= budget for c in chunks) and len(chunks) >= 10
    assert np.array_equal(np.concatenate([c.tensors for c in chunks]), x)


def test_chunking_rows_and_units():
    c = Chunking()
    assert c.chunk_bytes == 64 << 20 and c.unit_rows_for(None) == c.unit_rows
    assert c.unit_rows_for(512) == c.unit_rows  # 128 float32 values: rows decide
    assert c.unit_rows_for(16_384 * 4) == 4 * 1024  # 128x128 float32: 1,024 per chunk
    assert c.unit_rows_for(1 << 30) == 4  # one record per chunk at least
    with pytest.raises(ValueError, match="chunk_bytes"):
        Chunking(chunk_bytes=0)


def test_chunk_bytes_config_key(tmp_path):
    cfg = {"input": {"format": "parquet", "path": "x", "tensor": "e"},
           "output": {"path": "o"}, "report": "r"}
    assert parse_config(cfg).tuning.chunk_bytes == 64 << 20
    with pytest.raises(ConfigError, match="tuning.chunk_bytes"):
        parse_config(cfg, ["tuning.chunk_bytes=0"])


@pytest.mark.parametrize("fmt", ["parquet", "hdf5", "tfrecord"])
def test_job_with_small_chunks_matches_oracle(tmp_path, fmt):
    x, _ = shapes.images(160, SHAPE, "float32", seed=6)
    rng = np.random.default_rng(6)
    x = np.concatenate([x, x[rng.choice(160, 20)]])[rng.permutation(180)]  # + exact copies
    parts = [([f"f{f}-{i}" for i in range(len(c))], x[c])
             for f, c in enumerate(np.array_split(np.arange(len(x)), 2))]
    for f, (ids, t) in enumerate(parts):
        write_input(fmt, tmp_path / "in" / f"part-{f}.{EXT[fmt]}", ids, t, np.arange(len(ids)))
    spec = NearSpec("l2", threshold=shapes.image_tolerance(SHAPE, "float32"))
    inp = {"shape": list(SHAPE), "dtype": "float32"} if fmt == "tfrecord" else {}
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{EXT[fmt]}"),
                   f"tuning.chunk_bytes={3 * x[0].nbytes}", input=inp,
                   near={"metric": "l2", "threshold": spec.threshold}) == 0
    want_exact, want_near = expected(parts, spec)
    dups, invalid = report(tmp_path)
    assert len(want_exact) == 20 and len(want_near) >= 8 and invalid.num_rows == 0
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    gone = set(want_exact) | set(want_near)
    for f, (ids, t) in enumerate(parts):
        got_ids, got, _ = read_output(fmt, tmp_path / "out" / "clean" / f"part-{f}.{EXT[fmt]}",
                                      SHAPE)
        keep = [k for k, i in enumerate(ids) if i not in gone]
        assert got_ids == [ids[k] for k in keep] and np.array_equal(got, t[keep])
