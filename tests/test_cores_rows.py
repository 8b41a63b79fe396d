"""transforms.cores (thread limits of BLAS/OpenMP) and fs.read_rows_into (the near
cells' rows read from the chunks' value files)."""

from __future__ import annotations

import faiss
import ml_dtypes
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from pipeline.config import RunnerConfig
from pipeline.runner import kernel_threads, pipeline_options
from transforms import cores, fs


def _blas_threads() -> set[int]:
    return {i["num_threads"] for i in threadpool_info()}


def test_threads_limit_and_restore():
    before, omp = _blas_threads(), faiss.omp_get_max_threads()
    with cores.threads(1):
        assert _blas_threads() == {1} and faiss.omp_get_max_threads() == 1
        with cores.threads(None):  # a lone step takes the cores back, then gives them up
            assert faiss.omp_get_max_threads() == (__import__("os").cpu_count() or 1)
        assert _blas_threads() == {1} and faiss.omp_get_max_threads() == 1
    assert _blas_threads() == before and faiss.omp_get_max_threads() == omp


def test_parallel_local_workers_get_one_thread_each_and_one_worker_keeps_all():
    two, one = RunnerConfig(name="local", workers=2), RunnerConfig(name="local", workers=1)
    with kernel_threads(two, pipeline_options(two)):
        assert _blas_threads() == {1}
    cores_now = faiss.omp_get_max_threads()
    with kernel_threads(one, pipeline_options(one)):
        assert faiss.omp_get_max_threads() == cores_now


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, ml_dtypes.bfloat16])
def test_read_rows_into_places_each_named_row(tmp_path, dtype):
    rng = np.random.default_rng(0)
    values = (rng.random((1000, 37)) * 200).astype(dtype)
    path = str(tmp_path / "chunk.values")
    values.tofile(path)
    rows = rng.choice(1000, 300, replace=False)
    at = rng.permutation(300)
    out = np.zeros((300, 37), dtype)
    fs.read_rows_into(path, rows, out, at)
    assert np.array_equal(out[at].view(np.uint8), values[rows].view(np.uint8))
    with pytest.raises(OSError, match="past the end"):
        fs.read_rows_into(path, np.array([1000]), out, np.array([0]))


@pytest.mark.parametrize("few", [True, False])
def test_a_spilled_batch_gives_the_values_of_the_rows_asked(tmp_path, few):
    """The planning sample reads a few rows of each chunk's value file (positioned
    reads), or the whole file when it wants many: the same values either way."""
    import pyarrow as pa

    from pipeline.steps.elements import VecBatch

    rng = np.random.default_rng(1)
    n = 2000
    x = rng.standard_normal((n, 24)).astype(np.float32)
    batch = VecBatch(np.zeros((n, 2), np.uint64), np.zeros(n), np.arange(n),
                     np.zeros(n, np.int32), np.arange(n), pa.array([str(i) for i in range(n)]),
                     x)
    rows = np.sort(rng.choice(n, 50 if few else 1500, replace=False))[::-1]
    spilled = batch.spill(str(tmp_path))
    assert spilled.x.shape == (n, 0)
    assert np.array_equal(spilled.values_of(rows), x[rows])
    assert np.array_equal(batch.values_of(rows), x[rows])
