"""transforms.cores (thread limits of BLAS/OpenMP) and fs.read_rows_into (the near
cells' rows read from the chunks' value files)."""

from __future__ import annotations

import faiss
import ml_dtypes
import numpy as np
import pytest
from threadpoolctl import threadpool_info

from pipeline.config.runner import RunnerConfig
from pipeline.runners import pipeline_options
from pipeline.runners.local import kernel_threads
from transforms import cores
from transforms.io import fs
from transforms.near.space import search_space
from transforms.near.spec import NearSpec


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
    """... and one Parquet row group read ahead each, where one worker reads two."""
    from transforms.io.formats import ahead

    two, one = RunnerConfig(name="local", workers=2), RunnerConfig(name="local", workers=1)
    with kernel_threads(two, pipeline_options(two)):
        assert _blas_threads() == {1} and ahead.depth() == 1
    assert ahead.depth() == ahead.DEPTH == 2
    cores_now = faiss.omp_get_max_threads()
    with kernel_threads(one, pipeline_options(one)):
        assert faiss.omp_get_max_threads() == cores_now and ahead.depth() == 2


@pytest.mark.parametrize("count", [fs.MAPPED_ROWS // 2, 5 * fs.MAPPED_ROWS])
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, ml_dtypes.bfloat16])
def test_read_rows_into_places_each_named_row(tmp_path, dtype, count):
    """Few rows (positioned reads) and many (a memory map): each lands where named,
    a row named twice included; a row past the end, or an ``out`` that is not one block
    of memory, is an error, not zeros."""
    rng = np.random.default_rng(0)
    values = (rng.random((1000, 37)) * 200).astype(dtype)
    path = str(tmp_path / "chunk.values")
    values.tofile(path)
    rows = rng.choice(1000, count, replace=False)
    rows[-1] = rows[0]
    at = rng.permutation(count)
    out = np.zeros((count, 37), dtype)
    fs.read_rows_into(path, rows, out, at)
    assert np.array_equal(out[at].view(np.uint8), values[rows].view(np.uint8))
    with pytest.raises(OSError, match="row 1000 is past the end"):
        fs.read_rows_into(path, np.r_[rows[1:], 1000], out, at)
    with pytest.raises(ValueError, match="C-contiguous"):  # not written into a copy
        fs.read_rows_into(path, rows, np.zeros((37, count), dtype).T, at)


def test_the_planning_sample_names_spilled_rows_and_reads_the_same_values(tmp_path,
                                                                          monkeypatch):
    """Parts of the planning sample that wait in local spill files travel as (file, rows)
    (a few MB, not the values: 134 MB per worker at 1M x 384) and are read back at the
    plan: the rows with the smallest digests (one per digest), in digest order, as a
    sample that carried the values, and as computed directly. The recall sample, picked
    in the same pass, is the rows ``in_sample`` picks at the final count, one per digest
    in keep order, whichever worker saw them."""
    import pyarrow as pa

    from pipeline.steps import near_sample
    from pipeline.steps.elements import VecBatch
    from pipeline.steps.near import SampleForPlan
    from pipeline.steps.near_cells import collapse
    from transforms.near.recall import in_sample

    rng = np.random.default_rng(3)
    spec = NearSpec("cosine", threshold=0.01, recall_sample=300)
    fn = SampleForPlan(spec, str(tmp_path / "plan"), str(tmp_path / "recall"))
    cap = 1000
    monkeypatch.setattr(near_sample, "sample_cap", lambda dim: cap)
    accs: dict[bool, list] = {True: [], False: []}
    seen_lo, seen_x, seen = [], [], []
    for part in range(6):  # two workers' accumulators, three chunks each, > cap rows
        n = 700
        words = rng.integers(0, 1 << 62, (n, 2), dtype=np.uint64)
        words[:50, 1] = words[50:100, 1]  # copies: one row stands for their digest
        x = rng.standard_normal((n, 16)).astype(np.float32)
        x[:50] = x[50:100]
        seen_lo.append(words[:, 1])
        seen_x.append(x)
        b = VecBatch(words, np.zeros(n), np.arange(n) + n * part, np.zeros(n, np.int32),
                     np.arange(n), pa.array([str(i) for i in range(n)]), x)
        seen.append(b)
        for spilled in (True, False):
            if part % 3 == 0:
                accs[spilled].append(fn.create_accumulator())
            fn.add_input(accs[spilled][-1], b.spill(str(tmp_path)) if spilled else b)
    got, recall = {}, {}
    for spilled in (True, False):
        merged = fn.merge_accumulators([fn.compact(a) for a in accs[spilled]])
        assert all((r is None) != spilled for r in merged.ref)
        got[spilled] = merged.rows(spec)
        recall[spilled] = merged.recall.sample(  # the pool holds every row drawn
            16, str(tmp_path / "recall"),
            lambda rows: (in_sample(rows.words, 6 * 700, 300), None))[0].loaded()
    # the recall sample: every row in_sample at the final count, one per digest (the
    # first in keep order), whichever worker and chunk it came in
    every = VecBatch.concat(seen)
    pick = np.flatnonzero(in_sample(every.words, len(every), 300))
    rows = every.take(pick)
    rows = rows.take(np.lexsort((rows.order, rows.prio)))
    rows = rows.take(collapse(rows))
    assert 200 < len(rows) < 400
    for spilled in (True, False):
        assert np.array_equal(recall[spilled].words, rows.words)
        assert np.array_equal(recall[spilled].order, rows.order)
        assert np.array_equal(recall[spilled].x, rows.x)
    lo, first = np.unique(np.concatenate(seen_lo), return_index=True)
    want = search_space(np.concatenate(seen_x)[first[:cap]], spec).astype(np.float32)
    assert got[True].shape == (cap, 16) and np.array_equal(got[True], got[False])
    assert np.array_equal(got[True], want)
