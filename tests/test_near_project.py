"""The projected prefilter of the recall brute force (``transforms.near.project``): no
pair within the radius is ever ruled out, at the radius's edge, along the projected
directions (where the projection keeps the whole distance) and in both precisions; and
the brute force finds exactly what it found without it, on embedding-shaped data with a
crowd and on norms far from one."""

from __future__ import annotations

import numpy as np
import pytest

from tests.embeddings import embeddings, planted_copies
from transforms.near import find as near
from transforms.near import project as near_project
from transforms.near import search as near_search
from transforms.near.spec import NearSpec


def _passes(q: near_search.Vectors, y: near_search.Vectors, radius: float) -> np.ndarray:
    """The projected sign test of each (q_i, y_i) pair, as earlier_candidates runs it."""
    pr = near_project.projection(y.v)
    qp, yp = near_project.project(q, pr), near_project.project(y, pr)
    qa, ya, _ = near_search.augmented(qp, yp, near_project.projected_radius(pr, radius, q, y))
    return np.einsum("ij,ij->i", qa, ya) >= 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_no_pair_within_the_radius_is_ruled_out(dtype, scale):
    """Pairs at 1 - 1e-7 of the radius (in float64, before the search's rounding),
    their difference along the top principal direction (the projection keeps all of it),
    along a mix of the projected ones, and at random; norms from 1e-3 to 1e3."""
    rng = np.random.default_rng(7)
    x = embeddings(4000, dim=256, seed=2).astype(np.float64) * scale
    radius = 0.05 * scale
    y = near_search.Vectors(x.astype(dtype), np.linalg.norm(x, axis=1))
    basis = near_project.projection(y.v).basis.astype(np.float64)
    way = [np.tile(basis[:, 0], (len(x), 1)),
           rng.standard_normal((len(x), near_project.DIM)) @ basis.T,
           rng.standard_normal(x.shape)]
    for d in way:
        d = d / np.linalg.norm(d, axis=1, keepdims=True) * radius * (1 - 1e-7)
        xq = x + d
        assert (np.linalg.norm(xq - x, axis=1) <= radius).all()
        q = near_search.Vectors(xq.astype(dtype), np.linalg.norm(xq, axis=1))
        assert _passes(q, y, radius).all()
    far = x + rng.standard_normal(x.shape) / np.sqrt(x.shape[1]) * 10 * radius
    q = near_search.Vectors(far.astype(dtype), np.linalg.norm(far, axis=1))
    assert _passes(q, y, radius).mean() < 0.01  # and it does rule out far pairs


def test_wide_rows_get_their_directions_from_a_bounded_sample():
    """Images of 64x64x3 values: the basis comes from the sample's Gram matrix (a
    12,288-square covariance took minutes and 9 GB in a job), fast and orthonormal, and
    pairs at the radius's edge still pass while far ones do not."""
    import time

    rng = np.random.default_rng(11)
    d = 64 * 64 * 3
    x = (rng.standard_normal((1500, 40)) @ rng.standard_normal((40, d))
         + 0.1 * rng.standard_normal((1500, d)))  # images: few directions and noise
    radius = 0.5
    y = near_search.Vectors(x.astype(np.float32), np.linalg.norm(x, axis=1))
    start = time.perf_counter()
    pr = near_project.projection(y.v)
    assert time.perf_counter() - start < 5
    assert near_project.sample_step(len(x), d) > 1  # a sample, not every row
    b = pr.basis.astype(np.float64)
    assert b.shape == (d, near_project.DIM)
    assert np.abs(b.T @ b - np.eye(near_project.DIM)).max() < 1e-5
    for way in (np.tile(b[:, 0], (len(x), 1)), rng.standard_normal(x.shape)):
        step = way / np.linalg.norm(way, axis=1, keepdims=True) * radius * (1 - 1e-7)
        q = near_search.Vectors((x + step).astype(np.float32), np.linalg.norm(x + step, axis=1))
        assert _passes(q, y, radius).all()
    far = x + 20 * radius * b[:, 1]  # 20 radii along a projected direction
    q = near_search.Vectors(far.astype(np.float32), np.linalg.norm(far, axis=1))
    assert not _passes(q, y, radius).any()


@pytest.mark.parametrize("case", ["embeddings", "crowd", "large norms"])
def test_the_brute_force_finds_the_same_with_the_projection(case):
    """true_partners with the prefilter (1,500 sampled rows of 27,500 x 384; its blocks
    paired by the first projected coordinate) equals it without, pair for pair (in a
    crowd, where rows are cut to their nearest per block, a superset) and count for
    count, and every pair it returns is within tolerance by the float64 oracle."""
    rng = np.random.default_rng(3)
    x, _ = planted_copies(embeddings(25_000, seed=5), copies=0.1, decoys=0.1)
    spec = NearSpec("cosine", threshold=0.01)
    if case == "crowd":  # 3,000 rows within a quarter of the tolerance of one record
        x[:3000] = near_search_rows(x[0], 3000, 0.0025, rng)
    if case == "large norms":
        x = x * np.float32(3e3)  # l2 on raw values: pairs within 3e3 x 0.14 of norms 3e3
        spec = NearSpec("l2", threshold=420.0)
    n = len(x)
    radius = near.search_radius(spec, x.shape[1], near.value_scale(x, spec))
    center = near.search_space(x[:2000], spec).mean(axis=0)
    sample = np.sort(rng.choice(n, 1500, replace=False))
    if case == "crowd":
        sample = np.union1d(sample, np.arange(0, 3000, 10))
    rank, zero = np.arange(n), np.zeros(n)
    basis = near_project.projection(near.search_vectors(x, spec, radius, center).v)
    out = {}
    for label, with_basis in (("projected", basis), ("full", None)):
        out[label] = near.true_partners(x[sample], (zero[sample], rank[sample]), x,
                                        (zero, rank), spec, radius, center, 32, with_basis)
    a, b = out["projected"], out["full"]
    assert np.array_equal(a[3], b[3])  # candidates per sampled row
    if case == "crowd":  # rows cut to the 32 nearest per block of data rows: the projected
        # search pairs its blocks by a coordinate (smaller blocks), so it verifies more
        assert _pairs(b) <= _pairs(a)
    else:
        assert _pairs(a) == _pairs(b)
    assert len(a[0]) > 30 and (a[3] > 32).any() == (case == "crowd")
    _, ab, _ = near.verify_rows(x[sample], a[0], x, a[1], spec)
    assert ab.all()
    if case != "crowd":  # no row was cut to its 32 nearest: all earlier partners, by float64
        got = _pairs(a)
        sure, maybe = _oracle(x, sample, spec)
        assert sure <= got <= maybe and len(sure) > 30


def _oracle(x: np.ndarray, sample: np.ndarray, spec: NearSpec) -> tuple[set, set]:
    """(sample row, earlier data row) pairs within tolerance by a float64 product, with a
    relative margin of 1e-6 either way for its own rounding: (surely within, maybe)."""
    v = x.astype(np.float64)
    if spec.metric == "cosine":
        v /= np.linalg.norm(v, axis=1, keepdims=True)
    q = v[sample]
    if spec.metric == "cosine":
        d = 1 - q @ v.T
    else:
        d = np.sqrt(np.maximum((q * q).sum(1)[:, None] + (v * v).sum(1)[None] - 2 * q @ v.T, 0))
    earlier = np.arange(len(x))[None, :] < sample[:, None]
    t = spec.threshold
    return (_pairs(np.nonzero(earlier & (d <= t * (1 - 1e-6)))),
            _pairs(np.nonzero(earlier & (d <= t * (1 + 1e-6)))))


def _pairs(found) -> set:
    return set(zip(found[0].tolist(), found[1].tolist(), strict=True))


def near_search_rows(center: np.ndarray, m: int, cos: float, rng) -> np.ndarray:
    from tests.embeddings import rotated

    return rotated(np.tile(center, (m, 1)), rng.uniform(0, cos, m), rng).astype(np.float32)


@pytest.mark.parametrize("mode", ["exact", "bounded"])
def test_cells_decide_the_same_with_the_projection(mode, monkeypatch):
    """find_near over 30,000 x 384 embeddings with near copies and a crowd of 2,000, in 24
    cells: the cells' searches through the projection (the plan's basis) remove the same
    records in favour of the same ones, at the same distances, as without it."""
    from transforms.near import plan as near_plan

    rng = np.random.default_rng(9)
    x, _ = planted_copies(embeddings(27_000, seed=8), copies=0.08, decoys=0.03)
    x[:2000] = near_search_rows(x[5], 2000, 0.0025, rng)
    spec = NearSpec("cosine", threshold=0.01, mode=mode, recall_sample=0)
    runs = {}
    for label in ("projected", "full"):
        if label == "full":
            monkeypatch.setattr(near_plan, "projection", lambda *a, **k: None)
        r = near.find_near(x, np.arange(len(x)), spec, partitions=24)
        assert (r.partitions.projection is not None) == (label == "projected")
        runs[label] = r
    a, b = runs["projected"], runs["full"]
    assert a.partitions.mode == mode and len(a.removed) > 2000
    assert np.array_equal(a.removed, b.removed) and np.array_equal(a.kept, b.kept)
    assert np.array_equal(a.distance, b.distance) and a.pairs == b.pairs
