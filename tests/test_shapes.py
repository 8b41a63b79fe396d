"""The shape generators hold what their docstrings promise (checked with the float64
brute-force oracle), and write_parquet's files read back with pyarrow and the job's reader."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests import shapes
from tests.oracle import near_pairs
from transforms.io.formats import parquet
from transforms.io.formats.base import TensorSpec
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance


@pytest.mark.parametrize("metric,tol", [("l2", 0.01), ("cosine", 0.01), ("cosine", 0.002)])
def test_crowd_is_all_pairs_within(metric, tol):
    centre = shapes.background(10, 64)[3] * 5
    m = 300
    x = shapes.crowd(centre, m, tol, metric, seed=1)
    assert x.shape == (m, 64) and x.dtype == np.float32
    spec = NearSpec(metric, threshold=tol)
    _, ok = exact_distance(x, np.repeat(centre[None], m, 0), NearSpec(metric, threshold=tol / 4))
    assert ok.all()
    assert sum(len(v) for v in near_pairs(x, spec).values()) == m * (m - 1) // 2


def test_magnitudes_span_and_planted_pairs():
    x, pairs = shapes.magnitudes(4000, 16, tolerance=0.01, seed=2)
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    assert norms.min() < 2e-3 and norms.max() > 500 and len(pairs) == 200
    d, ok = exact_distance(x[pairs[:, 1]], x[pairs[:, 0]], NearSpec("l2", threshold=0.01))
    assert ok.all() and (d >= 0.0024).all()


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_images_copies_within_and_distinct_far(dtype):
    shape = (16, 16, 3)
    x, pairs = shapes.images(200, shape, dtype, seed=3)
    assert x.shape == (200, *shape) and x.dtype == np.dtype(dtype) and len(pairs) == 10
    spec = NearSpec("l2", threshold=shapes.image_tolerance(shape, dtype))
    found = {(e, r) for r, v in near_pairs(x, spec).items() for _, e in v}
    assert found == {tuple(p) for p in pairs.tolist()}
    # any row range is generated on its own, identically
    assert np.array_equal(shapes.image_rows(37, 121, shape, dtype, seed=3), x[37:121])


def test_degenerate_sets():
    spec = NearSpec("l2", threshold=0.01)
    assert len(np.unique(shapes.identical(50, 8), axis=0)) == 1
    assert len(np.unique(shapes.one_distinct(50, 8), axis=0)) == 2
    assert shapes.single(8).shape == (1, 8)
    assert near_pairs(shapes.nothing_within(500, 8, 0.01), spec) == {}
    assert near_pairs(shapes.nothing_within(500, 64, 0.3, "cosine"),
                      NearSpec("cosine", threshold=0.3)) == {}
    cell = shapes.one_cell(300, 8, 0.01)
    pairs = sum(len(v) for v in near_pairs(cell, spec).values())
    assert 0 < pairs < 300 * 299 // 2
    x, blank = shapes.with_blanks(shapes.background(200, 16), 0.1)
    assert len(blank) == 20 and (x[blank[::2]] == 0).all()
    assert (np.abs(x[blank[1::2]]) < 1e-4).all() and (x[blank[1::2]] != 0).any()
    y, bad = shapes.with_nans(x, 0.05)
    assert set(np.flatnonzero(~np.isfinite(y).all(axis=1))) == set(bad.tolist())


@pytest.mark.parametrize("list_type", ["fixed", "list"])
def test_write_parquet_reads_back(tmp_path, list_type):
    x, _ = shapes.images(70, (8, 8, 3), "uint8")
    path = tmp_path / "x.parquet"
    n = shapes.write_parquet(path, (x[a:a + 25] for a in range(0, 70, 25)), row_group_rows=10,
                             list_type=list_type)
    assert n == 70 and pq.ParquetFile(path).metadata.num_row_groups == 8
    assert pq.read_table(path).column("id").to_pylist() == [str(i) for i in range(70)]
    spec = parquet.check(str(path), TensorSpec("emb", id="id"))
    chunks = [c for u in parquet.plan(str(path), 0, 1 << 20, spec)
              for c in parquet.read(u, spec, 1 << 20)]
    assert np.array_equal(np.concatenate([c.tensors for c in chunks]), x)
