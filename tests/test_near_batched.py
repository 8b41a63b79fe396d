"""The near kernel on a torch device (issue 45): many cells per launch, k-means, the
assignment and the recall brute force through torch, run here on CPU tensors (CI has no
GPU; the same code runs on one): the same decisions as the numpy path and the float64
oracle."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from tests import shapes
from tests.embeddings import embeddings, planted_copies, rotated
from tests.oracle import near_oracle
from transforms.near import batched, plan
from transforms.near.find import find_near
from transforms.near.search import Vectors
from transforms.near.space import search_radius, search_space
from transforms.near.spec import NearSpec

torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


def _embeddings_with_a_crowd() -> np.ndarray:
    """Clustered 48-d embeddings, 5% planted near copies, and a crowd of 1,500 mutual
    copies (a cell whose pairs grow as its size squared)."""
    x, _ = planted_copies(embeddings(16_000, 48, seed=5))
    crowd = shapes.crowd(x[7].astype(np.float64), 1500, 0.008, "cosine", seed=2)
    return np.concatenate([x, crowd]).astype(np.float32)


CASES = {
    "cosine bounded": (NearSpec("cosine", threshold=0.01, mode="bounded"), 1.0),
    "cosine exact": (NearSpec("cosine", threshold=0.01, mode="exact"), 1.0),
    "components": (NearSpec("cosine", threshold=0.01, grouping="components"), 1.0),
    "l2 over six orders of magnitude": (NearSpec("l2", threshold=0.01, mode="exact"), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_device_path_decides_what_the_numpy_path_decides(case):
    """The whole kernel with its products in torch (k-means, assignment, the cells many
    per launch, the recall brute force) against the numpy path: the same removals, kept
    records and distances, and the same recall judgement."""
    spec, scale = CASES[case]
    spec = replace(spec, single_index_rows=4000, recall_sample=1500)
    x = (_embeddings_with_a_crowd() * scale if scale is not None
         else shapes.magnitudes(18_000, 32)[0])
    rank = np.arange(len(x))[::-1].copy()  # keep order other than row order
    a = find_near(x, rank, spec)
    b = find_near(x, rank, spec, torch_device=CPU)
    assert len(a.partitions) > 4 and len(a.removed) > 900
    np.testing.assert_array_equal(a.removed, b.removed)
    np.testing.assert_array_equal(a.kept, b.kept)
    np.testing.assert_array_equal(a.distance, b.distance)
    assert (a.recall.with_partners, a.recall.recalled) == (b.recall.with_partners,
                                                          b.recall.recalled)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_the_device_path_in_exact_mode_is_the_float64_oracle(metric):
    x, _ = planted_copies(embeddings(6000, 24, seed=9))
    spec = NearSpec(metric, threshold=0.01 if metric == "cosine" else 0.14, mode="exact",
                    single_index_rows=1000, recall_sample=0)
    r = find_near(x, np.arange(len(x)), spec, torch_device=CPU)
    assert len(r.partitions) > 4 and len(r.removed) > 100
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == near_oracle(x, spec)


def _cells(x: np.ndarray, spec: NearSpec, cells: int):
    """x's rows split into k-means cells (their home cell only), and the centres."""
    z = search_space(x, spec)
    mean, c = plan.train(z.astype(np.float32), cells)
    home = plan.nearest_centroid((z - mean).astype(np.float32), c)
    return [np.flatnonzero(home == p) for p in range(len(c))], mean + c


def test_cell_candidates_hold_every_pair_and_leave_crowds_to_the_blocks():
    """Every pair within the radius of each cell is among its candidates (float64 over
    the cell's search-space points: its rounding is far inside the search's slack);
    several cells share a launch; a crowd's cell and a cell that needs float64 products
    are left to the cell-by-cell search."""
    spec = NearSpec("cosine", threshold=0.01)
    x = _embeddings_with_a_crowd()
    cells, centers = _cells(x, spec, 12)
    radius = search_radius(spec, x.shape[1], 0.0)
    got = batched.cell_candidates(x, cells, centers, spec, radius, CPU)
    crowd_cell = next(p for p, c in enumerate(cells) if len(x) - 1 in c)
    assert got[crowd_cell] is None
    checked = 0
    for p, rows in enumerate(cells):
        if p == crowd_cell:
            continue
        z = search_space(x[rows], spec)
        sq = np.einsum("ij,ij->i", z, z)
        d = np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * z @ z.T, 0))  # float64
        want = set(zip(*np.nonzero((d <= radius) & ~np.eye(len(rows), dtype=bool)),
                       strict=True))
        a, b = got[p]
        assert want <= set(zip(a.tolist(), b.tolist(), strict=True))
        assert len(a) <= batched.PAIRS_PER_ROW * len(rows)
        checked += len(want)
    assert checked > 400
    sizes = np.array([len(c) for c in cells])
    assert len(batched._group(sorted(range(len(cells)), key=lambda p: sizes[p]), sizes,
                              batched.LAUNCH_SCORES)) > 1
    far = shapes.magnitudes(3000, 32, lo=40, hi=60)[0]  # l2 1e-5 at norms of 50
    tight = NearSpec("l2", threshold=1e-5)
    assert batched.cell_candidates(far, [np.arange(3000)], far.mean(axis=0, keepdims=True)
                                   .astype(np.float64), tight, 1e-5, CPU) == [None]


def test_a_full_gpu_shrinks_its_launches_then_leaves_cells_to_the_cpu(monkeypatch, capsys):
    """No GPU here, so its out-of-memory error is raised where a launch runs, above a size
    (the one fault a CPU cannot produce): launches shrink and the answers stay; when even
    the smallest launch fails, the cells go on block by block, said in one line."""
    spec = replace(NearSpec("cosine", threshold=0.01), single_index_rows=4000,
                   recall_sample=0)
    x = _embeddings_with_a_crowd()
    want = find_near(x, np.arange(len(x)), spec)
    launch, sizes = batched._launch, []

    def small_only(xx, cells, *a):
        scores = len(cells) * batched._padded(max(len(c) for c in cells)) ** 2
        sizes.append(scores)
        if scores > batched.LAUNCH_SCORES // 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return launch(xx, cells, *a)

    monkeypatch.setattr(batched, "_launch", small_only)
    got = find_near(x, np.arange(len(x)), spec, torch_device=CPU)
    np.testing.assert_array_equal(want.removed, got.removed)
    assert max(sizes) > batched.LAUNCH_SCORES // 4 and capsys.readouterr().err == ""

    def full(*a):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    monkeypatch.setattr(batched, "_launch", full)
    got = find_near(x, np.arange(len(x)), spec, torch_device=CPU)
    np.testing.assert_array_equal(want.removed, got.removed)
    np.testing.assert_array_equal(want.distance, got.distance)
    err = [e for e in capsys.readouterr().err.splitlines() if e]
    assert err and all("GPU ran out of memory" in e and "the same answers" in e for e in err)


def test_kmeans_and_assignment_on_a_torch_device_match_numpy():
    """k-means with its products in torch gives the numpy centroids (the sums are the
    host's: the same bits unless a near-tie of the float32 scores goes the other way),
    and the assignment the same cells for every row but such near-ties."""
    x = embeddings(20_000, 32, clusters=300, seed=4)
    z = (x - x.mean(axis=0)).astype(np.float32)
    c_np = plan.kmeans(z, 40, 0)
    c_t = plan.kmeans(z, 40, 0, zt=torch.from_numpy(z))
    np.testing.assert_array_equal(c_np, c_t)
    parts = plan.Partitions(np.zeros(32), c_np.astype(np.float64), 0.1, probes=4,
                            mode="bounded")
    v = Vectors(z, np.sqrt(np.einsum("ij,ij->i", z, z, dtype=np.float64)))
    a, b = plan.assign(v, parts), plan.assign(v, parts, dev=CPU)
    assert (a.home == b.home).mean() > 0.999
    pa = set(zip(a.rows.tolist(), a.cells.tolist(), strict=True))
    pb = set(zip(b.rows.tolist(), b.cells.tolist(), strict=True))
    assert len(pa ^ pb) <= 0.001 * len(pa) and len(pa) > 1.5 * len(z)


def test_records_torch_cannot_hold_go_up_as_float64():
    """bfloat16 records (ml_dtypes: torch.from_numpy refuses them) give the candidates
    their float32 values give."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x, _ = planted_copies(embeddings(3000, 16, seed=6))
    b16 = x.astype(ml_dtypes.bfloat16)
    spec = NearSpec("cosine", threshold=0.01)
    center = search_space(x[:100], spec).mean(axis=0, keepdims=True)
    radius = search_radius(spec, 16, 0.0)
    (a, b), = batched.cell_candidates(b16, [np.arange(len(x))], center, spec, radius, CPU)
    (c, d), = batched.cell_candidates(b16.astype(np.float32), [np.arange(len(x))], center,
                                      spec, radius, CPU)
    assert len(a) > 100 and np.array_equal(a, c) and np.array_equal(b, d)


def test_the_callers_rows_are_read_not_written():
    """float64 rows on a CPU device are shared with torch, not copied: the search space
    and the centring must not write into them; read-only rows raise no warning."""
    x, _ = planted_copies(embeddings(5000, 16, seed=7))
    x = x.astype(np.float64) * 3
    before = x.copy()
    x.flags.writeable = False
    spec = NearSpec("cosine", threshold=0.01, single_index_rows=1000, recall_sample=300)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = find_near(x, np.arange(len(x)), spec, torch_device=CPU)
    assert len(r.removed) > 50 and np.array_equal(x, before)


@pytest.mark.parametrize("grouping", ["components", "representative"])
def test_a_batched_cell_past_the_census_budget(grouping):
    """One cell of 150 groups of 40 mutual copies: under the crowd limit per row, so its
    candidates come from the batched product, but past the census's exact budget, so the
    pairs are sampled and (components) the skipped pairs searched at twice the radius,
    with vectors made only then: the numpy path's removals, groups and estimate."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((150, 32))
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    x = np.concatenate([rotated(np.repeat(b[None], 40, 0), rng.uniform(0, 0.0024, 40), rng)
                        for b in base]).astype(np.float32)[rng.permutation(6000)]
    spec = NearSpec("cosine", threshold=0.01, grouping=grouping, recall_sample=0)
    a = find_near(x, np.arange(len(x)), spec)
    b = find_near(x, np.arange(len(x)), spec, torch_device=CPU)
    assert len(a.partitions) == 1 and a.estimated and len(a.removed) == 5850
    np.testing.assert_array_equal(a.removed, b.removed)
    np.testing.assert_array_equal(a.kept, b.kept)
    assert a.pairs == b.pairs and b.estimated


def test_no_records_and_one_record():
    """An empty array (``reshape(0, -1)`` refuses it) and one record, on both paths."""
    spec = NearSpec("cosine", threshold=0.01)
    for x in (np.zeros((0, 8), np.float32), np.ones((1, 8), np.float32)):
        for dev in (None, CPU):
            r = find_near(x, np.arange(len(x)), spec, torch_device=dev)
            assert len(r.removed) == 0 and len(r.capped) == len(x)
