"""transforms.near.find against an all-pairs float64 oracle."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal, localcontext
from pathlib import Path

import numpy as np
import pytest

from tests.embeddings import embeddings, with_near_copies
from tests.oracle import near_oracle as oracle
from tests.oracle import near_pairs
from transforms.fingerprint import quantized_fingerprint_batch
from transforms.near import find as near
from transforms.near import plan as near_plan
from transforms.near import recall, search
from transforms.near.find import find_near, near_duplicates
from transforms.near.nearest import nearest_distances
from transforms.near.space import approximate_index
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance


def planted(seed: int, metric: str, n_base: int = 300, d: int = 16):
    """Clustered base vectors, near copies inside the tolerance, decoys just outside it,
    and chains a ~ b ~ c with a and c out of tolerance."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((6, d)) * (0.3 if metric == "cosine" else 4)
    base = centers[rng.integers(0, 6, n_base)] + rng.standard_normal((n_base, d))
    t = 0.05
    rows = [base]

    def at_distance(v, dist):
        u = rng.standard_normal(d)
        u /= np.linalg.norm(u)
        if metric == "cosine":  # rotate by the angle whose 1 - cos is dist
            w = u - (u @ v) / (v @ v) * v
            w *= np.linalg.norm(v) / np.linalg.norm(w)
            ang = np.arccos(1 - dist)
            return np.cos(ang) * v + np.sin(ang) * w
        if metric == "allclose":  # every element moved by +-dist
            return v + dist * np.sign(rng.standard_normal(d))
        return v + dist * u

    pick = rng.choice(n_base, 60, replace=False)
    rows.append(np.array([at_distance(base[i], t * 0.6) for i in pick[:30]]))  # near copies
    rows.append(np.array([at_distance(base[i], t * 1.05) for i in pick[30:45]]))  # decoys
    chain = []
    for i in pick[45:]:
        b = at_distance(base[i], t * 0.9)
        chain += [b, at_distance(b, t * 0.9)]
    rows.append(np.array(chain))
    x = np.concatenate(rows).astype(np.float32)
    x = x[rng.permutation(len(x))]
    if metric == "allclose":
        return x, NearSpec("allclose", atol=t, rtol=0.0)
    return x, NearSpec(metric, threshold=t)


def removals(x, spec, **kw):
    removed, kept, dist = near_duplicates(x, np.arange(len(x)), spec, **kw)
    return removed, kept, dist


def check(x, spec, result):
    """The result against the all-pairs float64 oracle: equal in exact mode (or when no row
    was capped); in bounded mode precision 1, and a decision is only ever wrong through a
    capped row: a record kept beside a kept earlier neighbour, or removed in favour of a
    farther one, missed that neighbour because it was capped (it joined too few cells to
    meet the later record's home cell)."""
    expected = oracle(x, spec)
    got = dict(zip(result.removed.tolist(), result.kept.tolist(), strict=True))
    d, ok = exact_distance(x[result.removed], x[result.kept], spec)
    np.testing.assert_allclose(result.distance, d)
    if spec.grouping == "representative":
        assert ok.all()  # no chaining: each removal is within tolerance of its record
        assert not set(result.kept.tolist()) & set(result.removed.tolist())
    if result.partitions.mode == "exact" or not result.capped.any():
        assert got == expected
        return
    removed = dict(zip(result.removed.tolist(), result.distance.tolist(), strict=True))
    for r, refs in near_pairs(x, spec).items():  # refs: earlier rows r is within, as (d, e)
        if spec.grouping == "components":
            missed = [] if r in removed else [e for _, e in refs]
        else:
            limit = removed.get(r, np.inf)
            missed = [e for d, e in refs if e not in removed and d < limit]
        assert all(result.capped[e] for e in missed), (r, missed)


@pytest.mark.parametrize("metric", ["l2", "cosine", "allclose"])
@pytest.mark.parametrize("grouping", ["representative", "components"])
@pytest.mark.parametrize("partitions,mode", [(1, "exact"), (7, "exact"), (7, "bounded")])
def test_flat_index_equals_the_oracle(metric, grouping, partitions, mode):
    x, spec = planted(1, metric)
    spec = replace(spec, grouping=grouping, index="flat", mode=mode, probes=2)
    result = find_near(x, np.arange(len(x)), spec, partitions=partitions)
    assert result.partitions.mode == (mode if partitions > 1 else "exact")
    check(x, spec, result)
    assert 20 < len(result.removed) < 120


def test_chain_behaviour_per_grouping():
    a = np.zeros(8, np.float32)
    b = a.copy()
    b[0] = 0.9
    c = b.copy()
    c[0] = 1.8  # a~b, b~c, a far from c (threshold 1.0)
    x = np.stack([a, b, c])
    rep = removals(x, NearSpec("l2", threshold=1.0))
    assert rep[0].tolist() == [1] and rep[1].tolist() == [0]  # c survives: b was removed
    comp = removals(x, NearSpec("l2", threshold=1.0, grouping="components"))
    assert comp[0].tolist() == [1, 2] and comp[1].tolist() == [0, 0]
    assert comp[2][1] == pytest.approx(1.8)  # reported distance may exceed the threshold


def test_pairs_straddling_a_quantization_boundary_are_found():
    """The quantized digest splits this pair (different cells); the near stage merges it."""
    x = np.array([[0.0049, 1.0], [0.0051, 1.0]], np.float32)
    q = quantized_fingerprint_batch(x, step=0.01)
    assert q[0] != q[1]
    removed, kept, _ = removals(x, NearSpec("l2", threshold=0.001))
    assert removed.tolist() == [1] and kept.tolist() == [0]


def test_partition_border_pair_is_found():
    """Two clusters far apart and one pair split across their border."""
    rng = np.random.default_rng(3)
    left = rng.standard_normal((200, 4)) * 0.3 + [-5, 0, 0, 0]
    right = rng.standard_normal((200, 4)) * 0.3 + [5, 0, 0, 0]
    pair = np.array([[-0.01, 0, 0, 0], [0.01, 0, 0, 0]])
    x = np.concatenate([left, right, pair]).astype(np.float32)
    spec = NearSpec("l2", threshold=0.05, index="flat")
    removed, kept, _ = removals(x, spec, partitions=2)
    assert dict(zip(removed.tolist(), kept.tolist(), strict=True)) == oracle(x, spec)
    assert 401 in removed.tolist()


def test_nan_and_inf_rows_never_take_part():
    x = np.array([[1.0, 1.0], [np.nan, 1.0], [1.0, 1.0], [np.inf, 0.0], [1.0, 1.0000001]],
                 np.float32)
    removed, kept, _ = removals(x, NearSpec("l2", threshold=0.01))
    assert removed.tolist() == [2, 4] and kept.tolist() == [0, 0]


@pytest.mark.parametrize("x,rank,spec,error,match", [
    (np.array([[1 + 1j, 2], [1 - 1j, 2]], np.complex64), np.arange(2), NearSpec("l2", 0.1),
     TypeError, "complex64; near-duplicate search needs real values"),  # were merged at 0
    (np.zeros((6, 3), np.float32), np.arange(3), NearSpec("l2", 0.1), ValueError,
     "rank holds 3 values for 6 records: one per record"),  # was an IndexError
    (np.array([["a", "b"]]), np.arange(1), NearSpec("l2", 0.1), TypeError,
     "find_near compares numbers: unsupported dtype <U1"),  # was ufunc 'isfinite'
    (np.ones((3, 4), np.int64), np.arange(3), NearSpec("jaccard", 0.8), ValueError,
     "use transforms.near.sets.find_near_sets"),  # removed nothing, silently
])
def test_find_near_refuses_what_the_job_refuses(x, rank, spec, error, match):
    with pytest.raises(error, match=match):
        find_near(x, rank, spec)


def test_find_near_takes_torch_bfloat16_as_the_job_reads_it():
    """bfloat16 (torch has no numpy form of it) compares as its float32 values do."""
    torch = pytest.importorskip("torch")
    x, spec = planted(2, "l2", n_base=60)
    t = torch.from_numpy(x).to(torch.bfloat16)
    got = find_near(t, np.arange(len(x)), spec)
    check(t.float().numpy(), spec, got)
    assert len(got.removed) > 0


def test_keep_order_decides_who_survives():
    x = np.array([[0.0, 0.0], [0.0, 0.001]], np.float32)
    removed, kept, _ = near_duplicates(x, np.array([1, 0]), NearSpec("l2", threshold=0.01))
    assert removed.tolist() == [0] and kept.tolist() == [1]


def test_nearest_distances_match_brute_force():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    x[150:160] = x[:10] + 0.01
    spec = NearSpec("l2", threshold=0.2)
    radius = near.search_radius(spec, 8, 0.0)
    rows = np.arange(0, 300, 3)
    z = near.search_vectors(x, spec, radius, x.mean(axis=0).astype(np.float64))
    nb, dist, within = nearest_distances(x, z, rows, spec, radius)
    d = np.linalg.norm(x[:, None].astype(np.float64) - x[None], axis=2)
    np.fill_diagonal(d, np.inf)
    np.testing.assert_allclose(dist, d[rows].min(axis=1), rtol=1e-6)
    assert (within == (dist <= 0.2)).all() and within.sum() >= 4


@pytest.mark.parametrize("metric", ["cosine", "l2", "correlation"])
def test_nearest_distances_pick_the_float64_nearest_among_near_ties(metric):
    """Crowds of copies 3e-4 apart (768 values): the float32 products cannot order a
    row's neighbours, and which one they picked changed with BLAS's threads (the
    report's borderline_pairs.parquet differed between runners). The nearest is the
    float64 nearest, ties to the first row, whatever the threads."""
    from transforms.cores import threads

    rng = np.random.default_rng(11)
    base = rng.standard_normal((40, 768))
    x = np.concatenate([b + 3e-4 * rng.standard_normal((12, 768)) for b in base])
    x = x[rng.permutation(len(x))].astype(np.float32)
    spec = NearSpec(metric, threshold=1.0 if metric == "l2" else 0.05,
                    **({"channels": 3} if metric == "correlation" else {}))
    radius = near.search_radius(spec, 768, 0.0)
    z = near.search_vectors(x, spec, radius, x.mean(axis=0).astype(np.float64))
    rows = np.arange(len(x))
    d = np.stack([exact_distance(np.repeat(x[i:i + 1], len(x), 0), x, spec)[0] for i in rows])
    np.fill_diagonal(d, np.inf)
    for n in (1, 2):
        with threads(n):
            nb, dist, within = nearest_distances(x, z, rows, spec, radius)
        assert (nb == d.argmin(axis=1)).all()
        np.testing.assert_array_equal(dist, d.min(axis=1))
        assert within.all()


def test_cosine_search_radius_covers_the_rounding_of_one_minus_cos():
    """Two float32 rows 2.5e-8 apart as unit vectors whose 1 - cos rounds to 0 in float64:
    within any cosine tolerance as the job verifies it, so exact mode must find them even
    at a tolerance far below that rounding (the radius was sqrt(2 t), 1.4e-10 here)."""
    pair = np.array([[1.827181339263916, 0.8628000020980835],
                     [1.8271812200546265, 0.8628000020980835]], np.float32)
    others = np.random.default_rng(8).standard_normal((400, 2)).astype(np.float32)
    x = np.concatenate([pair, others])
    spec = NearSpec("cosine", threshold=1e-20, mode="exact", recall_sample=0,
                    single_index_rows=50, partition_rows=20)
    assert exact_distance(pair[1:], pair[:1], spec)[1].all()
    r = find_near(x, np.arange(len(x)), spec)
    assert 1 in r.removed.tolist()
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == oracle(x, spec)


def test_small_cells_print_no_faiss_warning(capfd):
    """Cells of 16 rows (``partition_rows`` set small): the k-means sample then holds
    fewer than the 39 rows a centroid FAISS asks for, on purpose; FAISS's own warning
    must not reach the user's terminal (it did: 'WARNING clustering 80 points to 5
    centroids')."""
    x = np.random.default_rng(3).standard_normal((80, 8)).astype(np.float32)
    spec = NearSpec("l2", threshold=0.5, mode="exact", recall_sample=0,
                    single_index_rows=10, partition_rows=16)
    r = find_near(x, np.arange(len(x)), spec)
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == oracle(x, spec)
    assert "WARNING" not in capfd.readouterr().err


def test_nearest_distances_pass_over_zero_vectors_for_cosine():
    """A zero vector has no direction: nobody's nearest, and none of its own. Spread-out
    rows (random 64-d: nearest neighbours past cos 0.5) had picked it, the origin of
    the unit sphere, and shown as "no neighbour" (distance inf)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    zero = [0, 5, 9]
    x[zero] = 0
    spec = NearSpec("cosine", threshold=0.1)
    radius = near.search_radius(spec, 64, 0.0)
    rows = np.arange(300)
    z = near.search_vectors(x, spec, radius, x.mean(axis=0).astype(np.float64))
    nb, dist, within = nearest_distances(x, z, rows, spec, radius)
    x64 = x.astype(np.float64)
    unit = x64 / np.maximum(np.linalg.norm(x64, axis=1, keepdims=True), 1e-300)
    d = 1 - unit @ unit.T
    np.fill_diagonal(d, np.inf)
    d[:, zero] = np.inf
    live = np.setdiff1d(rows, zero)
    assert (nb[zero] == -1).all() and np.isinf(dist[zero]).all()
    assert not np.isin(nb, zero).any()
    np.testing.assert_allclose(dist[live], d[live].min(axis=1), rtol=1e-6)


def test_decide_leaves_open_what_another_cell_decides():
    """y lives in another cell (not home) and comes first; v is within tolerance of y, w of
    v, u of nothing. Not knowing y's fate, the cell cannot keep or remove v, nor w (v may
    be kept): both open, depending on y; u is kept. Told y is kept: v is removed (dup y),
    w is kept (v is gone)."""
    x = np.array([[0.0, 0.0], [0.08, 0.0], [0.16, 0.0], [5.0, 5.0]], np.float32)
    spec = NearSpec("l2", threshold=0.1)
    radius = near.search_radius(spec, 2, 0.0)
    home = np.array([False, True, True, True])
    d = near.decide_cell(x, home, spec, radius, None)
    assert d.state.tolist() == [3, 3, 3, 1]  # OPEN, OPEN, OPEN, KEPT
    assert d.open_refs.tolist() == [True, False, False, False]
    d = near.decide_cell(x, home, spec, radius, None, kept=~home)
    assert d.state.tolist() == [1, 2, 1, 1] and d.dup[1] == 0
    assert d.dist[1] == pytest.approx(0.08, rel=1e-6)


@pytest.mark.parametrize("index", ["ivf", "hnsw"])
def test_approximate_indexes_keep_precision_one(index):
    x, spec = planted(2, "l2", n_base=2000, d=32)
    spec = NearSpec("l2", threshold=spec.threshold, index=index, nlist=16, nprobe=4)
    removed, kept, _ = removals(x, spec)
    _, ok = exact_distance(x[removed], x[kept], spec)
    assert ok.all() and not set(kept.tolist()) & set(removed.tolist())
    expected = oracle(x, NearSpec("l2", threshold=spec.threshold))
    recall = len(set(removed.tolist()) & set(expected)) / len(expected)
    assert recall >= 0.9, recall


@pytest.mark.parametrize("cells", [1, 8])
def test_a_row_beyond_float32_spoils_no_other_search(cells):
    """A float64 row holding 1e39 (inf in float32): the plan leaves it out of its sample
    (its mean went inf) and it joins cell 0 alone (no cell took it): the others' near
    copies are all found, two such rows near each other too."""
    x, spec = planted(6, "l2", n_base=240)
    x = x.astype(np.float64)
    huge = np.repeat(x[:1], 2, axis=0)
    huge[:, 0] = 1e39
    huge[1, 1] += spec.threshold / 2  # a near copy of the other huge row
    x = np.concatenate([x[:100], huge[:1], x[100:], huge[1:]])
    spec = replace(spec, mode="exact", single_index_rows=50, partition_rows=40)
    r = find_near(x, np.arange(len(x)), spec, partitions=cells)
    assert len(r.partitions) >= cells
    want = oracle(x, spec)
    assert want[len(x) - 1] == 100 and len(want) > 20
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == want


def test_an_ivf_cell_smaller_than_its_lists_is_searched():
    """``index: ivf`` with ``nlist`` set for the whole data: a k-means cell of a few rows
    (an outlier's) gets at most one list per row (FAISS refuses to train more lists than
    points: the job failed), and its pairs are still found."""
    x = np.array([[0, 0], [0, 0.01], [5, 5]], np.float32)
    index = approximate_index(search.Vectors(x, np.linalg.norm(x, axis=1)),
                              NearSpec("l2", threshold=0.1, index="ivf", nlist=16))
    assert index.nlist == 3
    index.add(x)
    _, idx = index.search(x[:1] + 0.001, 2)
    assert sorted(idx[0].tolist()) == [0, 1]


# --- tight tolerances: float32 rounding must never lose a pair ---------------------------

def moved(rng, base, dist, how="ball"):
    """Copies of ``base`` rows moved by L2 ``dist`` (ball) or by <= ``dist`` per element."""
    if how == "box":
        return base + rng.uniform(-1, 1, base.shape) * dist[:, None]
    u = rng.standard_normal(base.shape)
    return base + u / np.linalg.norm(u, axis=1, keepdims=True) * dist[:, None]


def tight_case(name):
    """The cases measured on the old kernel (FAISS's float32 |x|^2 + |y|^2 - 2xy above
    ~4,000 rows), each with copies inside the tolerance and decoys just outside."""
    rng = np.random.default_rng(11)
    n, k = 8000, 300
    if name in ("l2_1e-4", "l2_1e-4_x100"):
        base = rng.standard_normal((n, 32)) * (100 if name.endswith("x100") else 1)
        t = 1e-4 * (100 if name.endswith("x100") else 1)
        spec = NearSpec("l2", threshold=t)
        near_, far = moved(rng, base[:k], t * rng.uniform(0.3, 0.97, k)), moved(
            rng, base[k:2 * k], t * rng.uniform(1.03, 1.5, k))
    elif name == "l2_1e-5_norm100":
        base = rng.standard_normal((n, 32))
        base *= 100 / np.linalg.norm(base, axis=1, keepdims=True)
        spec = NearSpec("l2", threshold=1e-5)
        near_, far = moved(rng, base[:k], 1e-5 * rng.uniform(0.3, 0.97, k)), moved(
            rng, base[k:2 * k], 1e-5 * rng.uniform(1.03, 1.5, k))
    elif name == "allclose_1e-3_values_20":
        base = rng.uniform(-20, 20, (n, 24))
        spec = NearSpec("allclose", atol=1e-3)
        near_ = moved(rng, base[:k], np.full(k, 0.97e-3), "box")
        far = base[k:2 * k].copy()
        far[:, 0] += 1.2e-3
    elif name == "allclose_1e-7_values_1e3":  # float32 ulp at 1e3 is 6e-5: only rtol helps
        base = 1e3 + rng.uniform(-1, 1, (n, 24))
        spec = NearSpec("allclose", atol=1e-7, rtol=1e-6)
        near_ = base[:k] * (1 + rng.uniform(-0.9e-6, 0.9e-6, (k, 24)))
        far = base[k:2 * k] * (1 + 1.5e-6)
    elif name == "correlation_1e-6_offsets":  # rows far from 0 relative to their spread
        base = rng.standard_normal((n, 48)) * rng.uniform(0.5, 3, (n, 1))
        base += rng.uniform(-2e3, 2e3, (n, 1))
        spec = NearSpec("correlation", threshold=1e-6, channels=3)
        near_ = turned(base[:k], rng.uniform(0.2e-6, 0.9e-6, k), rng)
        far = turned(base[k:2 * k], rng.uniform(1.3e-6, 2e-6, k), rng)
    else:  # cosine 1e-6 on 64-d vectors
        base = rng.standard_normal((n, 64))
        spec = NearSpec("cosine", threshold=1e-6)
        from tests.embeddings import rotated
        near_ = rotated(base[:k], rng.uniform(0.2e-6, 0.9e-6, k), rng)
        far = rotated(base[k:2 * k], rng.uniform(1.3e-6, 2e-6, k), rng)
    x = np.concatenate([base, near_, far, base[2 * k:2 * k + 20]]).astype(np.float32)
    return x[rng.permutation(len(x))], spec


def turned(v: np.ndarray, distance: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows of ``v`` whose correlation distance (3 interleaved channels, each centred)
    from the row is ``distance``, then scaled by 0.5-2 and shifted by -50..50: each
    channel's centred values turned in a random direction that keeps every channel's
    mean 0."""
    def centred(a):
        c = a.reshape(len(a), -1, 3)
        return (c - c.mean(axis=1, keepdims=True)).reshape(len(a), -1)

    c = centred(v.astype(np.float64))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    w = centred(rng.standard_normal(v.shape))
    w -= (w * c).sum(axis=1, keepdims=True) * c
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    angle = np.arccos(1 - distance)[:, None]
    out = np.cos(angle) * c + np.sin(angle) * w
    return out * rng.uniform(0.5, 2, (len(v), 1)) + rng.uniform(-50, 50, (len(v), 1))


TIGHT = ["l2_1e-4", "l2_1e-4_x100", "l2_1e-5_norm100", "allclose_1e-3_values_20",
         "allclose_1e-7_values_1e3", "cosine_1e-6", "correlation_1e-6_offsets"]


@pytest.mark.parametrize("name", TIGHT)
@pytest.mark.parametrize("grouping,partitions,mode", [
    ("representative", 1, "exact"), ("components", 6, "exact"),
    ("representative", 6, "bounded"), ("components", 6, "bounded")])
def test_tight_tolerances_lose_no_pair(name, grouping, partitions, mode):
    x, spec = tight_case(name)
    spec = replace(spec, grouping=grouping, mode=mode, index="flat")
    result = find_near(x, np.arange(len(x)), spec, partitions=partitions)
    check(x, spec, result)
    expected = oracle(x, spec)
    assert len(expected) >= 250, len(expected)  # the planted copies (and exact copies)
    if mode == "bounded":  # near copies sit deep inside a cell: none is capped here
        assert dict(zip(result.removed.tolist(), result.kept.tolist(), strict=True)) == expected
    assert result.recall.recall == 1.0


def image_patches() -> np.ndarray:
    """16x16 grey patches (values 0-1) of a real photograph shipped with matplotlib (Grace
    Hopper, 600x512) at a stride of 8 pixels, plus the same patches after real JPEG
    re-encodings of the photograph at quality 90 (about 90% within L2 0.05 of the
    original) and 85 (mostly just outside): copies that differ only by re-encoding."""
    import io

    import matplotlib.cbook as cbook
    from PIL import Image

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as im:
        grey = im.convert("L")
    out = []
    for quality in (None, 90, 85):
        img = grey
        if quality is not None:
            buf = io.BytesIO()
            grey.save(buf, "JPEG", quality=quality)
            img = Image.open(io.BytesIO(buf.getvalue()))
        g = np.asarray(img, dtype=np.float32) / 255.0
        out.append(np.lib.stride_tricks.sliding_window_view(g, (16, 16))[::8, ::8]
                   .reshape(-1, 256))
    x = np.concatenate(out)
    return x[np.random.default_rng(0).permutation(len(x))]


@pytest.mark.parametrize("grouping,partitions", [("components", 1), ("representative", 1),
                                                 ("components", 5)])
def test_real_image_patches_match_the_oracle(grouping, partitions):
    x = image_patches()
    assert len(x) > 12_000
    spec = NearSpec("l2", threshold=0.05, grouping=grouping, index="flat", mode="exact")
    result = find_near(x, np.arange(len(x)), spec, partitions=partitions)
    check(x, spec, result)
    assert len(result.removed) > 3000


# --- cells: the exact join rule and the bounded cap ------------------------------------

def test_assign_puts_every_neighbour_of_a_home_row_in_its_cell():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2000, 6)) + rng.integers(0, 5, (2000, 1)) * 3).astype(np.float32)
    spec = NearSpec("l2", threshold=0.8)
    parts = near_plan.plan(x, len(x), 0.8, "exact", 3, 12)
    a = near_plan.assign(near.search_vectors(x, spec, 0.8, parts.mean, np.float32), parts)
    members = {p: set(a.rows[a.cells == p].tolist()) for p in np.unique(a.cells).tolist()}
    d = np.linalg.norm(x[:, None].astype(np.float64) - x[None], axis=2)
    for i, j in zip(*np.nonzero(d <= 0.8), strict=True):
        assert j in members[a.home[i]]
    assert not a.capped.any() and (np.bincount(a.rows, minlength=len(x)) == a.wanted).all()


def test_two_levels_put_every_neighbour_of_a_home_row_in_its_cell():
    """Coarse cells cut into fine ones (``levels=2``): the join rule, applied at each
    level, still brings every neighbour within the radius into a row's home cell, with
    the home the nearest fine centroid of the nearest coarse one."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3000, 6)) + rng.integers(0, 5, (3000, 1)) * 3).astype(np.float32)
    spec = NearSpec("l2", threshold=0.8)
    parts = near_plan.plan(x, len(x), 0.8, "exact", 3, 60, levels=2)
    assert parts.levels == 2 and len(parts.coarse) >= 6 and len(parts) >= 40
    z = near.search_vectors(x, spec, 0.8, parts.mean, np.float32)
    a = near_plan.assign(z, parts)
    coarse = np.linalg.norm(z.v[:, None] - parts.coarse[None], axis=2).argmin(axis=1)
    fine = np.linalg.norm(z.v[:, None] - parts.centroids[None], axis=2)
    own = np.arange(len(parts)) >= parts.start[coarse][:, None]
    own &= np.arange(len(parts)) < parts.start[coarse + 1][:, None]
    assert (a.home == np.where(own, fine, np.inf).argmin(axis=1)).all()
    members = {p: set(a.rows[a.cells == p].tolist()) for p in np.unique(a.cells).tolist()}
    d = np.linalg.norm(x[:, None].astype(np.float64) - x[None], axis=2)
    for i, j in zip(*np.nonzero(d <= 0.8), strict=True):
        assert j in members[a.home[i]]
    joins = np.bincount(a.rows, minlength=len(x))
    assert not a.capped.any() and (joins == a.wanted).all() and joins.mean() > 1.5
    b = near_plan.assign(z, parts, probes=2)  # bounded: the nearest coarse cells' fine ones
    capped = np.bincount(b.rows, minlength=len(x))
    assert capped.max() == 2 and b.capped.any()
    assert b.cells[b.cells == b.home[b.rows]].size == len(x)  # the home cell, always
    nearer = fine[np.arange(len(x)), b.home] <= fine[np.arange(len(x)), a.home] + 1e-6
    assert nearer.all()  # the nearest centroid of its candidates, the home coarse's among them


@pytest.mark.parametrize("mode", ["bounded", "exact"])
def test_the_assign_width_bounds_the_centroids_a_record_is_scored_against(mode):
    """The capacity plan prices assigning a record by ``assign_width``: over two levels
    every coarse centroid and the fine centroids of each coarse cell the record
    considers (bounded: its COARSE_PROBES x probes candidates, not its ``probes`` fine
    joins, which underpriced it), counted here from the coarse joins themselves."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((4000, 16)) + rng.integers(0, 5, (4000, 1)) * 3).astype(np.float32)
    spec = NearSpec("l2", threshold=1.5)
    parts = near_plan.plan(x, len(x), 1.5, mode, 2, 60, levels=2)
    assert parts.mode == mode and len(parts.coarse) > near_plan.COARSE_PROBES * 2
    z = near.search_vectors(x, spec, 1.5, parts.mean, np.float32)
    cap = None if parts.probes is None else near_plan.COARSE_PROBES * parts.probes
    _, rows, coarse, _, _ = near_plan._joins(z, parts.coarse, parts.level_gaps[0],
                                             parts.radius, cap)
    fine = np.diff(parts.start)[coarse]
    scored = len(parts.coarse) + fine.sum() / len(x)
    joins = len(near_plan.assign(z, parts).rows) / len(x)
    width = near_plan.assign_width(len(parts), len(parts.coarse), joins, parts.probes)
    assert scored <= width <= 2 * scored
    assert near_plan.assign_width(len(parts), None, joins, parts.probes) == len(parts)


@pytest.mark.parametrize("rows_below", [2 ** 17, 2 ** 30, 2 ** 40])
def test_the_bounded_cap_ranks_as_a_sort_by_row_then_margin(rows_below):
    """Bounded mode keeps each row's cells of least margin: the one-key sort that ranks
    them orders as np.lexsort((margin, row)) does (stable, a row's home (-1) first, 0
    and inf margins, exact ties in place), for rows that fit its key and rows that do
    not (np.lexsort itself)."""
    rng = np.random.default_rng(3)
    rows = np.sort(rng.integers(0, rows_below, 300_000))
    margin = rng.integers(0, 1 << 20, len(rows)) * 2.0 ** -18  # distinct: 2^-20 apart
    margin[rng.random(len(rows)) < 0.1] = -1.0
    margin[rng.random(len(rows)) < 0.05] = 0.0
    margin[rng.random(len(rows)) < 0.01] = np.inf
    margin[rng.random(len(rows)) < 0.01] = 1e300
    for r in (rows, rng.permutation(rows)):
        want = np.lexsort((margin, r))
        assert np.array_equal(near_plan._by_row_and_margin(r, margin), want)


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_two_level_search_equals_the_oracle(grouping):
    """Exact mode over two levels of cells, where a record joins several (clustered
    embeddings, planted copies, a crowd): the all-pairs oracle's removals."""
    x = with_near_copies(embeddings(6000, dim=32, clusters=60, seed=2), copies=0.1, seed=3)
    x = np.concatenate([x, np.repeat(x[:1], 300, axis=0) + np.random.default_rng(4)
                        .standard_normal((300, 32)).astype(np.float32) * 1e-3])
    spec = NearSpec("cosine", threshold=0.02, mode="exact", recall_sample=0, levels=2,
                    single_index_rows=500, partition_rows=150, grouping=grouping)
    r = find_near(x, np.arange(len(x)), spec)
    assert r.partitions.levels == 2 and len(r.partitions) >= 30
    assert r.partitions.prediction.joins_exact > 1.2
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == oracle(x, spec)


def test_bisector_rule_is_far_tighter_than_the_triangle_rule_in_high_dimensions():
    x = embeddings(20_000, clusters=200)
    spec = NearSpec("cosine", threshold=0.01)
    r = near.search_radius(spec, x.shape[1], 0.0)
    parts = near_plan.plan(near.search_space(x, spec), len(x), r, "exact", 3, 20)
    z = near.search_vectors(x, spec, r, parts.mean, np.float32)
    a = near_plan.assign(z, parts)
    dist = np.linalg.norm(z.v[:, None, :] - parts.centroids[None].astype(np.float32), axis=2)
    own = dist[np.arange(len(x)), a.home][:, None]
    triangle = (dist <= own + 2 * r).sum(axis=1)
    assert a.wanted.mean() * 2 < triangle.mean()


def test_bounded_mode_caps_the_cells_a_row_meets():
    x = embeddings(20_000, clusters=200)
    spec = NearSpec("cosine", threshold=0.02)
    r = near.search_radius(spec, x.shape[1], 0.0)
    parts = near_plan.plan(near.search_space(x, spec), len(x), r, "bounded", 2, 20)
    assert parts.mode == "bounded" and parts.probes == 2
    a = near_plan.assign(near.search_vectors(x, spec, r, parts.mean, np.float32), parts)
    joins = np.bincount(a.rows, minlength=len(x))
    assert joins.max() == 2 and (joins >= 1).all()
    assert (a.capped == (a.wanted > 2)).all() and a.capped.any()
    home_joined = np.zeros(len(x), bool)
    home_joined[a.rows[a.cells == a.home[a.rows]]] = True
    assert home_joined.all()  # a row always meets its own cell


def test_auto_takes_exact_on_separated_clusters_and_bounded_on_embeddings():
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((50, 32)) * 20
    blobs = (centres[rng.integers(0, 50, 30_000)] + rng.standard_normal((30_000, 32)))
    spec = NearSpec("l2", threshold=0.5)
    p = near_plan.plan(blobs, len(blobs), 0.5, "auto", 3, 10)
    assert p.mode == "exact" and p.prediction.joins_exact <= 3
    x = embeddings(30_000)
    spec = NearSpec("cosine", threshold=0.01)
    r = near.search_radius(spec, x.shape[1], 0.0)
    p = near_plan.plan(near.search_space(x, spec), len(x), r, "auto", 3, 30)
    assert p.mode == "bounded" and p.prediction.joins_exact > 3
    assert "auto chose bounded" in p.reason
    assert p.prediction.work_bounded < p.prediction.work_exact < p.prediction.work_all_pairs


def test_auto_on_clustered_embeddings_is_bounded_with_measured_recall():
    """High-dimensional clustered data: auto picks the bounded mode; its removals have
    precision 1, and the brute-force recall estimate agrees with the true recall
    (exact mode over the same rows) within its interval."""
    x = with_near_copies(embeddings(30_000), copies=0.05, decoys=0.02)
    spec = NearSpec("cosine", threshold=0.01, partition_rows=1000, single_index_rows=5000)
    result = find_near(x, np.arange(len(x)), spec)
    assert result.partitions.mode == "bounded"
    _, ok = exact_distance(x[result.removed], x[result.kept], spec)
    assert ok.all()
    rec = result.recall
    assert rec.with_partners > 25 and rec.recall >= 0.97  # records with an earlier partner
    # every row judged by brute force: the sample's interval holds the true share
    full = near.measure_recall(x, np.arange(len(x)), spec, result.removed, result.kept,
                               result.distance, sample=len(x))
    assert full.sampled == len(x) and full.with_partners > 500
    assert rec.low - 0.01 <= full.recall <= rec.high + 0.01, (rec, full)


def test_bounded_mode_misses_only_capped_records():
    """What stratified recall rests on: in bounded mode over one level of flat cells, a
    record that joined every cell exact mode would have given it (not capped) meets all
    its partners, so its decision is right against the records kept; every miss is a
    capped record. Every row judged by brute force; probes 1 and 2 so that misses
    exist."""
    missed = 0
    for seed, (t, probes, dim) in enumerate([(0.02, 1, 64), (0.01, 2, 128)]):
        x = with_near_copies(embeddings(30_000, dim, clusters=300, seed=seed))
        rank = np.random.default_rng(seed).permutation(len(x))
        spec = NearSpec("cosine", t, mode="bounded", probes=probes, recall_sample=0)
        r = find_near(x, rank, spec, partitions=173)
        full = near.measure_recall(x, rank, spec, r.removed, r.kept, r.distance,
                                   sample=len(x), capped=r.capped)
        c, o = full.strata["capped"], full.strata["others"]
        assert (c["sampled"], c["records"], o["sampled"]) == (
            r.capped.sum(), r.capped.sum(), len(x) - r.capped.sum())
        missed += c["with_partners"] - c["recalled"]
        assert o["with_partners"] > 300 and o["recalled"] == o["with_partners"], o
    assert missed > 10  # the cap loses pairs, and only there


def test_stratified_recall_holds_the_true_share_in_a_narrower_interval():
    """Bounded mode with 11% of the records capped: the sample draws 70% of its records
    among them, weights each stratum by its size, and its interval holds the share of
    right decisions over every record, with a lower end far above the uniform sample's
    for the same brute-force work."""
    x = with_near_copies(embeddings(60_000, 128, clusters=300, seed=2))
    rank = np.random.default_rng(2).permutation(len(x))
    spec = NearSpec("cosine", 0.01, mode="bounded", probes=3, recall_sample=2000)
    r = find_near(x, rank, spec, partitions=245)
    assert 0.05 < r.capped.mean() < 0.3
    strat = r.recall
    full = near.measure_recall(x, rank, spec, r.removed, r.kept, r.distance, sample=len(x))
    uniform = near.measure_recall(x, rank, spec, r.removed, r.kept, r.distance)
    assert (strat.drawn, full.drawn, uniform.drawn) == ("stratified", "uniform", "uniform")
    assert abs(strat.sampled - 2000) < 200 and abs(uniform.sampled - 2000) < 200
    assert abs(strat.strata["capped"]["sampled"] - recall.CAPPED_SHARE * 2000) < 150
    assert strat.strata["capped"]["records"] == r.capped.sum()
    assert strat.low <= full.recall <= strat.high, (strat, full)
    assert strat.low > uniform.low + 0.03, (strat.low, uniform.low)


def test_stratified_judgement_weights_each_stratum_by_its_size():
    """Capped records 1 (wrong: kept beside a kept earlier partner) and 2 (removed, right),
    others 3 (removed, right) and 4 (no partner); 10 of 30 records capped. Positives
    10/2 x 2 + 20/2 x 1 = 20, misses 10/2 x 1 = 5: recall 0.75; with 40 removals known
    (the floor of the positives), 1 - 5/40."""
    def keys(*k):
        return np.array([[0, i] for i in k], np.uint64).reshape(-1, 2)

    truth = recall.Truth(keys(1, 2, 3), keys(11, 12, 13), np.array([0.1, 0.1, 0.1]),
                         np.zeros(3), np.array([11, 12, 13]), {(0, 1): 1, (0, 2): 1, (0, 3): 1})
    removed = {(0, 2): ((0, 12), 0.1), (0, 3): ((0, 13), 0.1)}
    sampled = {(0, i) for i in (1, 2, 3, 4)}
    r = recall.judge(truth, sampled, removed, strata=recall.Strata({(0, 1), (0, 2)}, 30, 10))
    assert r.drawn == "stratified" and r.recall == pytest.approx(0.75)
    assert r.low < 0.75 < r.high and r.recall_removed == pytest.approx(0.75)
    assert (r.strata["capped"]["sampled"], r.strata["others"]["records"]) == (2, 20)
    floored = recall.judge(truth, sampled, removed,
                           strata=recall.Strata({(0, 1), (0, 2)}, 30, 10, floor=40))
    assert floored.recall == pytest.approx(1 - 5 / 40) and floored.low > r.low
    line = recall.recall_line(floored.as_dict())
    assert "2 of the sample drawn among the 10 capped records" in line
    # every decision right: in exact mode said as a check that agrees (sweep: an interval
    # of 0.9876-1.0 there read as possible misses), elsewhere as the sample's interval
    right = recall.judge(truth, sampled, {**removed, (0, 1): ((0, 11), 0.1)}).as_dict()
    assert right["recall"] == 1.0 and right["low"] < 1.0
    exact, bounded = (recall.recall_line(right, m) for m in ("exact", "bounded"))
    assert exact.startswith("recall 1.0000 (exact mode: every pair within the threshold is "
                            "compared; a brute-force check of the decisions against the "
                            "records kept agrees on all 3 of 4 sampled records")
    assert "95% interval" not in exact.split("recall_removed")[0]
    assert bounded.startswith(f"recall 1.0000 (95% interval {right['low']:.4f}-1.0000; 3 of 4")


def test_stratified_judgement_of_records_that_stand_for_no_searched_record():
    """A run whose every record was an exact copy of a reference or stored one searched
    those only (0 of its own records), while its sample held records with partners (found
    by fuzz_job.py seed 8125, a ZeroDivisionError that failed the job): no recall, and
    the interval says nothing, not a division by zero."""
    def keys(*k):
        return np.array([[0, i] for i in k], np.uint64).reshape(-1, 2)

    truth = recall.Truth(keys(1, 2), keys(11, 12), np.array([0.01, 0.01]), np.zeros(2),
                         np.array([11, 12]), {(0, 1): 1, (0, 2): 1})
    r = recall.judge(truth, {(0, 1), (0, 2), (0, 3)}, {},
                     strata=recall.Strata(set(), 0, 0))
    assert r.recall is None and (r.low, r.high) == (0.0, 1.0) and r.with_partners == 2
    assert recall.recall_line(r.as_dict()).startswith("recall not measured")


# --- the search itself ------------------------------------------------------------------

def test_pairs_within_is_a_superset_at_large_offsets():
    """Values around 1e4, pairs 1e-3 apart: the float32 rounding of |x|^2 is ~1e3 times the
    squared radius. Centring and the per-row bound keep every pair."""
    rng = np.random.default_rng(4)
    base = 1e4 + rng.standard_normal((5000, 16))
    x = np.concatenate([base, base[:200] + 1e-3 / 4]).astype(np.float64)
    spec = NearSpec("l2", threshold=1.1e-3)
    for center in (None, x.mean(axis=0)):
        v = near.search_vectors(x, spec, 1.1e-3, center)
        q, d, _ = search.pairs_within(v, v, 1.1e-3)
        got = {(int(a), int(b)) for a, b in zip(q.tolist(), d.tolist(), strict=True)}
        assert all((i, 5000 + i) in got for i in range(200))
        assert all((i, i) in got for i in range(len(x)))


def test_precision_switches_to_float64_only_when_rounding_would_swamp_the_radius():
    assert search.precision_for(1.0, 384, 0.14) == np.float32
    assert search.precision_for(1.0, 384, 1e-4) == np.float64
    assert search.precision_for(100.0, 32, 1e-5) == np.float64


def test_torch_backend_finds_the_same_pairs():
    """The GPU path's code (torch matmul + nonzero) run on the CPU: same candidates."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3000, 48))
    x[1000:1100] = x[:100] + 1e-3
    for dtype in (np.float32, np.float64):
        v = search.centred(x, x.mean(axis=0), dtype)
        qa, ya, _ = search.augmented(v, v, 1e-2)  # the copies are 6.9e-3 away
        want = own = np.arange(0, 3000, 3)
        i, j, _, top, _ = search._signs(qa, ya, 700, want, own)
        ti, tj, _, ttop, _ = search._signs_torch(qa, ya, 700, want, own, dev=torch.device("cpu"))
        assert sorted(zip(i, j, strict=True)) == sorted(zip(ti, tj, strict=True))
        assert len(i) >= 3000 + 200
        assert (top == ttop).mean() > 0.99  # exact ties may break differently


def test_a_full_gpu_falls_back_to_the_cpu_with_one_line(monkeypatch, capsys):
    """No GPU here, so its out-of-memory error is raised where the GPU's products run
    (the one fault a CPU cannot produce): the search goes on on the CPU with the same
    pairs and nearest rows, says so once, and does not ask the GPU again."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3000, 48))
    x[1000:1100] = x[:100] + 1e-3
    v = search.centred(x, x.mean(axis=0), np.float32)
    own = np.full(3000, search.NO_NEAREST)
    own[::3] = np.arange(0, 3000, 3)
    want = search.pairs_within(v, v, 1e-2, own=own)
    asked = []

    def full(*args, **kwargs):
        asked.append(1)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(search, "use_cuda", lambda device: device == "cuda")
    monkeypatch.setattr(search, "_signs_torch", full)
    monkeypatch.setattr(search, "_OUT_OF_MEMORY", set())
    for _ in range(2):
        got = search.pairs_within(v, v, 1e-2, device="cuda", own=own)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert len(asked) == 1 and len(want[0]) >= 3000 + 200
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPU ran out of memory" in err[0] and "the same answers" in err[0]


def test_nearest_neighbours_come_with_the_pairs():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5000, 12))
    v = search.centred(x, None, np.float32)
    rows = np.arange(0, 5000, 7)
    own = np.full(5000, search.NO_NEAREST)
    own[rows] = rows
    own[3] = -1  # wanted, and not in the data: itself counts
    *_, best = search.pairs_within(v, v, 0.5, own=own)
    d = np.linalg.norm(x[:, None] - x[None], axis=2)
    np.testing.assert_array_equal(best[3], 3)
    d[rows, rows] = np.inf
    np.testing.assert_array_equal(best[rows], np.argmin(d[rows], axis=1))
    assert (best[np.setdiff1d(np.arange(5000), np.r_[rows, 3])] == -1).all()


# --- recall -------------------------------------------------------------------------------

def test_wilson_interval():
    lo, hi = recall.wilson(95, 100)
    assert lo == pytest.approx(0.8882, abs=1e-4) and hi == pytest.approx(0.9785, abs=1e-4)
    assert recall.wilson(50, 50)[1] == 1.0 and recall.wilson(50, 50)[0] < 1.0


def test_sample_is_order_free_and_about_the_size_asked():
    rng = np.random.default_rng(10)
    keys = rng.integers(0, 2**63, (100_000, 2)).astype(np.uint64)
    pick = recall.in_sample(keys, len(keys), 2000)
    assert 1800 < pick.sum() < 2200
    p = rng.permutation(len(keys))
    assert (recall.in_sample(keys[p], len(keys), 2000) == pick[p]).all()
    assert (recall.in_sample(keys, len(keys), 2000, seed=1) != pick).any()


def test_recall_judges_each_sampled_decision():
    """Record 1 (earlier partners 10 at 0.1 and 11 at 0.2, both kept) was removed in favour
    of 11: wrong, 10 is nearer. Record 2 (partner 12, removed) was kept: right. Record 3
    (partner 13, kept) was kept: wrong. Record 4 has no earlier partner: not judged."""
    def keys(*k):
        return np.array([[0, i] for i in k], np.uint64).reshape(-1, 2)

    truth = recall.Truth(keys(1, 1, 2, 3), keys(10, 11, 12, 13), np.array([0.1, 0.2, 0.1, 0.3]),
                         np.zeros(4), np.array([10, 11, 12, 13]),
                         {(0, 1): 2, (0, 2): 1, (0, 3): 1})
    removed = {(0, 1): ((0, 11), 0.2), (0, 12): ((0, 99), 0.0)}
    r = recall.judge(truth, {(0, i) for i in (1, 2, 3, 4)}, removed)
    assert (r.sampled, r.with_partners, r.recalled, r.pairs) == (4, 3, 1, 4)
    assert r.recall == pytest.approx(1 / 3) and r.low < 1 / 3 < r.high
    removed[(0, 1)] = ((0, 10), 0.1)
    three = {(0, 1), (0, 2), (0, 3)}
    assert recall.judge(truth, three, removed).recalled == 2  # 1 now right
    comp = recall.judge(truth, three, removed, components=True)
    assert comp.recalled == 1  # components: removed is right; 2 and 3 were kept
    # only the PARTNERS nearest partners are kept per record (here also the latest in
    # keep order), and counted as cut
    many = recall.Truth(keys(*[5] * 40), keys(*range(100, 140)), np.arange(40.0),
                        np.zeros(40), np.arange(40)[::-1].copy(), {(0, 5): 40}).cut()
    assert len(many.dist) == recall.PARTNERS and many.dist.max() == recall.PARTNERS - 1
    assert recall.judge(many, {(0, 5)}, {}).truncated == 1
    # kept, every listed partner removed, more partners unlisted: unsure (a kept one may
    # be among them): right in the point estimate, a miss at the interval's lower end
    gone = {(0, p): ((0, 1), 0.0) for p in range(100, 100 + recall.PARTNERS)}
    r = recall.judge(many, {(0, 5)}, gone)
    assert (r.recalled, r.unsure, r.recall) == (1, 1, 1.0)
    assert r.low == recall.wilson(0, 1)[0] and r.high == 1.0
    listed_all = recall.Truth(many.sample, many.partner, many.dist, many.prio, many.order,
                              {(0, 5): recall.PARTNERS})  # no partner left unlisted
    r = recall.judge(listed_all, {(0, 5)}, gone)
    assert (r.recalled, r.unsure) == (1, 0) and r.low == recall.wilson(1, 1)[0]
    # the PARTNERS latest in keep order are listed too (a kept partner bounded mode can
    # miss was kept late): here the farthest are the latest, so all 40 stay, and a kept
    # far one makes the decision wrong
    late = recall.Truth(keys(*[5] * 40), keys(*range(100, 140)), np.arange(40.0),
                        np.zeros(40), np.arange(40), {(0, 5): 100}).cut()
    assert len(late.dist) == 40
    gone = {(0, p): ((0, 1), 0.0) for p in range(100, 139)}  # 139 (the latest) kept
    r = recall.judge(late, {(0, 5)}, gone)
    assert (r.recalled, r.unsure, r.truncated) == (0, 0, 1)


# --- real embeddings ----------------------------------------------------------------------

def sentence_embeddings() -> np.ndarray:
    """1,000 sentences from Python's help texts and docstrings plus 400 edited variants,
    embedded with all-MiniLM-L6-v2 (tests/data/README.md; stored as float16)."""
    with np.load(Path(__file__).parent / "data" / "minilm_sentences.npz") as z:
        return z["vectors"].astype(np.float32)


@pytest.mark.parametrize("threshold", [0.02, 0.05])
def test_real_sentence_embeddings_against_brute_force(threshold):
    x = sentence_embeddings()
    small_cells = {"single_index_rows": 100, "partition_rows": 60}
    spec = NearSpec("cosine", threshold=threshold, **small_cells)
    exact = find_near(x, np.arange(len(x)), replace(spec, mode="exact"))
    assert exact.partitions.mode == "exact" and len(exact.partitions) > 10
    check(x, replace(spec, mode="exact"), exact)
    assert exact.pairs > 150 and not exact.estimated
    assert exact.recall.recall == 1.0 and exact.recall.with_partners > 100
    bounded = find_near(x, np.arange(len(x)), replace(spec, mode="bounded", probes=2))
    check(x, replace(spec, mode="bounded"), bounded)
    same = set(zip(bounded.removed.tolist(), bounded.kept.tolist(), strict=True)) == set(
        zip(exact.removed.tolist(), exact.kept.tolist(), strict=True))
    assert bounded.recall.with_partners > 100  # 1,400 rows: the sample is every row
    assert bounded.recall.recall >= 0.98 and (bounded.recall.recall == 1.0) == same


@pytest.mark.parametrize("crowd", [False, True])
def test_earlier_candidates_equal_the_products_oracle(crowd):
    """The recall brute force's candidates: per query, the earlier rows (prio, then
    order; ties in prio) whose product passes the sign test, how many, and the k with
    the largest products. Few hits take the sparse path, a crowd the dense one: both
    must equal the rule applied to the whole product matrix."""
    rng = np.random.default_rng(11)
    x = embeddings(3000, dim=32, seed=3)
    if crowd:  # 2,000 rows all within tolerance of one record
        x[:2000] = x[0] + 1e-3 * rng.standard_normal((2000, 32))
    else:  # 100 pairs and a crowd of 30 (more candidates than k: the cut applies)
        x[1000:1100] = x[:100] + 0.02 * rng.standard_normal((100, 32))
        x[2000:2030] = x[500] + 1e-3 * rng.standard_normal((30, 32))
    spec, r, k = NearSpec("l2", threshold=0.2), 0.2, 8
    qrows = np.unique(np.r_[rng.choice(len(x), 300, replace=False), 2000:2030])
    y, q = near.search_vectors(x, spec, r), near.search_vectors(x[qrows], spec, r)
    y_rank = (rng.integers(0, 3, len(x)), rng.permutation(len(x)))
    q_rank = (y_rank[0][qrows], y_rank[1][qrows])
    qi, yj, count = search.earlier_candidates(q, y, r, q_rank, y_rank, k)
    qa, ya, _ = search.augmented(q, y, r)
    m = qa @ ya.T
    earlier = (y_rank[0][None] < q_rank[0][:, None]) | (
        (y_rank[0][None] == q_rank[0][:, None]) & (y_rank[1][None] < q_rank[1][:, None]))
    ok = (m >= 0) & earlier
    assert (count == ok.sum(axis=1)).all()
    assert count.max() > (100 if crowd else k) and (count > 0).sum() > 5
    got: dict[int, set] = {}
    for a, b in zip(qi.tolist(), yj.tolist(), strict=True):
        got.setdefault(a, set()).add(b)
    for i in range(len(qrows)):  # the k largest products (ties: any of them)
        mine = sorted(got.get(i, set()))
        top = np.sort(m[i, ok[i]])[::-1][:k]
        assert len(mine) == len(top) and ok[i, mine].all()
        assert np.array_equal(np.sort(m[i, mine])[::-1], top)


@pytest.mark.parametrize("cols", [100, 3000, 20_000])
def test_top_columns_of_a_crowd_block_are_the_largest_non_negative_entries(cols):
    """The recall brute force's crowd blocks keep each row's 32 largest non-negative
    products; the subset bound must never drop one. Rows: all positive, mostly
    negative or -inf (early in keep order), ties at the subset's floor, a row whose
    large entries avoid the subset's columns."""
    rng = np.random.default_rng(cols)
    m = rng.standard_normal((40, cols)).astype(np.float32) + 3
    m[1] -= 6  # mostly negative
    m[2, 5:] = -np.inf
    m[3] = np.round(m[3])  # many ties
    m[4, ::search.SUBSET] = 0.5  # the subset sees only small values ...
    m[4, 1::search.SUBSET] = 10 + np.arange(len(m[4, 1::search.SUBSET]))  # ... the top is off it
    m[5] = 1.0  # all tied
    i, j = search._top_columns(m.copy(), 32)
    keep = m[i, j] >= 0
    i, j = i[keep], j[keep]
    for r in range(len(m)):
        got = np.sort(m[r, j[i == r]])[::-1]
        pos = np.sort(m[r][m[r] >= 0])[::-1][:32]
        assert len(set(j[i == r])) == len(got)
        assert np.array_equal(got, pos)


def _decimal_l2(a, b) -> Decimal:
    with localcontext() as c:
        c.prec = 60
        return sum(((Decimal(float(p)) - Decimal(float(q))) ** 2 for p, q in zip(a, b,
                                                                             strict=True)),
                   Decimal(0)).sqrt()


def _decimal_cos_distance(a, b) -> Decimal:
    with localcontext() as c:
        c.prec = 60
        da, db = [Decimal(float(v)) for v in a], [Decimal(float(v)) for v in b]
        dot = sum((p * q for p, q in zip(da, db, strict=True)), Decimal(0))
        na = sum((p * p for p in da), Decimal(0)).sqrt()
        nb = sum((q * q for q in db), Decimal(0)).sqrt()
        return 1 - dot / (na * nb)


def test_distances_near_the_ends_of_float64_are_measured_not_rounded_to_0_or_nan():
    """The verification squared float64 differences: below about 1e-154 they rounded to
    0, so rows 2e-200 apart were removed at l2 1e-250 as at distance 0.0 (a removal
    beyond the threshold), and 1 - cos of rows of 1e200 was NaN (never within: their
    near copies were kept, in exact mode). Against distances in 60-digit decimals."""
    rng = np.random.default_rng(11)
    base = rng.normal(size=(6, 4))
    rows = np.concatenate([base * s for s in (1e-300, 1e-200, 1e-160, 1.0, 1e160, 1e200)])
    rows = np.concatenate([rows, rows * (1 + 1e-9 * rng.normal(size=rows.shape)),
                           np.zeros((1, 4))])
    i, j = np.triu_indices(len(rows), 1)
    d, _ = exact_distance(rows[i], rows[j], NearSpec("l2", threshold=1.0))
    truth = np.array([float(_decimal_l2(rows[p], rows[q])) for p, q in zip(i, j, strict=True)])
    assert np.all(np.abs(d - truth) <= 1e-14 * truth), np.max(np.abs(d - truth) / truth)
    live = np.any(rows[i] != 0, axis=1) & np.any(rows[j] != 0, axis=1)
    d, _ = exact_distance(rows[i[live]], rows[j[live]], NearSpec("cosine", threshold=0.5))
    truth = np.array([float(_decimal_cos_distance(rows[p], rows[q]))
                      for p, q in zip(i[live], j[live], strict=True)])
    assert np.all(np.abs(d - truth) <= 1e-14), np.max(np.abs(d - truth))

    tiny = np.array([[1e-300, 0, 0, 0], [2e-300, 0, 0, 0], [1e-200] * 4, [0.0] * 4])
    spec = NearSpec("l2", threshold=1e-250, mode="exact")
    r = find_near(tiny, np.arange(4), spec)
    # 1e-300 apart: within; 1e-200 apart from the zero row and 2e-200 from the rest: not
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == {1: 0, 3: 0}
    copies = np.concatenate([base * 1e200, base * 2e200, base * 1e-200])  # same directions
    r = find_near(copies, np.arange(len(copies)), NearSpec("cosine", threshold=0.01,
                                                           mode="exact"))
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == {
        k + 6 * c: k for c in (1, 2) for k in range(6)}



def int_rows(dtype, random_bases: int = 5) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """64-bit integer rows at the ends of their range and beyond 2^53 (far apart from
    each other), each base followed by copies moved by a few units: (rows, [(copy, its
    base)])."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    bases = [[info.max - 5] * 3, [info.min + 5] * 3, [(1 << 53) + 1] * 3,
             *rng.integers(info.max // 4, info.max // 2, (random_bases, 3), dtype=dtype).tolist()]
    rows, pairs = [], []
    for b in bases:
        home = len(rows)
        rows.append(b)
        for step in ([1, 0, 0], [-1, 1, 0], [2, 0, 0], [1, 1, 1], [0, 0, -3]):
            # toward the middle of the range: every moved value still fits the dtype
            pairs.append((len(rows), home))
            rows.append([v - s if v > 0 else v + abs(s) for v, s in zip(b, step, strict=True)])
    return np.array(rows, dtype), pairs


def int_truth(rows: np.ndarray, pairs: list[tuple[int, int]], spec: NearSpec) -> dict:
    """{copy: (its base, within, distance)} in Python's exact integers, for l2 1.5 or
    allclose with atol 1 (rtol 0)."""
    truth = {}
    for c, b in pairs:
        diff = [int(p) - int(q) for p, q in zip(rows[c].tolist(), rows[b].tolist(), strict=True)]
        squares = sum(v * v for v in diff)
        truth[c] = (b, squares * 4 <= 9 if spec.metric == "l2" else max(map(abs, diff)) <= 1,
                    squares ** 0.5 if spec.metric == "l2" else max(map(abs, diff)))
    return truth


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
@pytest.mark.parametrize("spec", [NearSpec("l2", threshold=1.5),
                                  NearSpec("allclose", atol=1.0, rtol=0.0)])
def test_64_bit_integers_beyond_2_53_are_measured_exactly(dtype, spec):
    """int64 / uint64 values above 2^53 were subtracted as float64, which drops their low
    bits: rows 2^53 + 1 and 2^53 + 2 measured 0.0 apart, so at l2 1.5 a copy moved by
    2 in one value or 1 in three was removed (a removal beyond the threshold), and near
    the int64 ends every copy was. Against Python's exact integers: each copy is removed
    exactly when its true distance to its base is within (no other pair is near)."""
    rows, pairs = int_rows(dtype)
    exact = int_truth(rows, pairs, spec)
    d, within = exact_distance(rows[[c for c, _ in pairs]], rows[[b for _, b in pairs]], spec)
    assert within.tolist() == [exact[c][1] for c, _ in pairs]
    assert d.tolist() == pytest.approx([exact[c][2] for c, _ in pairs], rel=1e-15)
    assert 0 < sum(w for _, w, _ in exact.values()) < len(pairs)  # both sides of the line
    r = find_near(rows, np.arange(len(rows)), spec)
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == {
        c: b for c, (b, w, _) in exact.items() if w}
