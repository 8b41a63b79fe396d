"""transforms.near against an all-pairs float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracle import near_oracle as oracle
from transforms import near
from transforms.fingerprint import quantized_fingerprint_batch
from transforms.near import NearSpec, exact_distance, near_duplicates


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


@pytest.mark.parametrize("metric", ["l2", "cosine", "allclose"])
@pytest.mark.parametrize("grouping", ["representative", "components"])
@pytest.mark.parametrize("partitions", [1, 7])
def test_flat_index_equals_the_oracle(metric, grouping, partitions):
    x, spec = planted(1, metric)
    spec = NearSpec(**{**spec.__dict__, "grouping": grouping, "index": "flat"})
    removed, kept, dist = removals(x, spec, partitions=partitions)
    expected = oracle(x, spec)
    assert dict(zip(removed.tolist(), kept.tolist(), strict=True)) == expected
    assert 20 < len(expected) < 120
    d, ok = exact_distance(x[removed], x[kept], spec)
    np.testing.assert_allclose(dist, d)
    if grouping == "representative":
        assert ok.all()  # no chaining: each removal is within tolerance of its record
        assert not set(kept.tolist()) & set(removed.tolist())


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


def test_keep_order_decides_who_survives():
    x = np.array([[0.0, 0.0], [0.0, 0.001]], np.float32)
    removed, kept, _ = near_duplicates(x, np.array([1, 0]), NearSpec("l2", threshold=0.01))
    assert removed.tolist() == [0] and kept.tolist() == [1]


def test_merge_pairs_is_order_free_and_counts_repeats_once():
    """Pairs arrive from partitions in any order, some twice, some from exact copies
    (same key, different mention): the edges are the same."""
    rng = np.random.default_rng(5)
    m = 200
    key_a, key_b = rng.integers(0, 40, m), rng.integers(0, 40, m)
    dist = rng.random(m)
    near_ab, near_ba = rng.random(m) < 0.8, rng.random(m) < 0.8

    def mentions(ka, kb, order_a, order_b):
        keys = np.concatenate([ka, kb])
        return (np.stack([keys // 7, keys], axis=1).astype(np.uint64),
                np.zeros(2 * len(ka)), np.concatenate([order_a, order_b]))

    # order of a mention: the key's own order, or a worse one for a copy of it
    copy_a, copy_b = rng.random(m) < 0.3, rng.random(m) < 0.3
    e1 = near.merge_pairs(*mentions(key_a, key_b, key_a + 1000 * copy_a, key_b + 1000 * copy_b),
                          dist, near_ab, near_ba)
    p = rng.permutation(m)
    twice = np.concatenate([p, p[:50]])
    e2 = near.merge_pairs(*mentions(key_a[twice], key_b[twice], key_a[twice], key_b[twice]),
                          dist[twice], near_ab[twice], near_ba[twice])
    keys1 = np.concatenate([key_a, key_b])[e1.node]
    keys2 = np.concatenate([key_a[twice], key_b[twice]])[e2.node]
    assert sorted(keys1.tolist()) == sorted(keys2.tolist())
    edges = [sorted(zip(keys[e.later].tolist(), keys[e.earlier].tolist(), e.dist.tolist(),
                        strict=True)) for keys, e in ((keys1, e1), (keys2, e2))]
    assert edges[0] == edges[1] and len(edges[0]) > 50
    # orientation follows keep order (the smaller key is earlier); within is the right flag
    for later, earlier, d in edges[0]:
        assert later > earlier
        k = np.flatnonzero(((key_a == later) & (key_b == earlier) & near_ab)
                           | ((key_b == later) & (key_a == earlier) & near_ba))
        assert d in dist[k].tolist()


def test_search_partition_nearest_neighbours_match_brute_force():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    x[150:160] = x[:10] + 0.01
    spec = NearSpec("l2", threshold=0.2)
    home = np.zeros(300, bool)
    home[::2] = True
    nn_rows = np.flatnonzero(home)[::3]
    f = near.search_partition(x, near.search_space(x, spec), home, spec,
                              near.search_radius_sq(spec, 8, float(np.abs(x).max())), nn_rows)
    d = np.linalg.norm(x[:, None].astype(np.float64) - x[None], axis=2)
    np.fill_diagonal(d, np.inf)
    np.testing.assert_allclose(f.nn, d[f.nn_row].min(axis=1), rtol=1e-6)
    want = {(min(i, j), max(i, j)) for i, j in zip(*np.nonzero(d <= 0.2), strict=True)
            if home[i] or home[j]}
    assert set(zip(np.minimum(f.a, f.b).tolist(), np.maximum(f.a, f.b).tolist(),
                   strict=True)) == want
    assert all(home[f.a])
    assert (~f.near_within | (f.near_dist <= 0.2)).all()


def test_assign_puts_every_neighbour_of_a_home_row_in_its_partition():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2000, 6)) + rng.integers(0, 5, (2000, 1)) * 3).astype(np.float32)
    r2 = 0.8 ** 2
    home, rows, parts = near.assign(x, near.train_centroids(x[:1000], 12), r2)
    members = {p: set(rows[parts == p].tolist()) for p in np.unique(parts).tolist()}
    d = np.linalg.norm(x[:, None] - x[None], axis=2)
    for i, j in zip(*np.nonzero(d <= 0.8), strict=True):
        assert j in members[home[i]]


def test_merge_pairs_with_no_pair_within_tolerance():
    key = np.array([[0, 1], [0, 2]], dtype=np.uint64)
    e = near.merge_pairs(key, np.zeros(2), np.arange(2), np.array([0.5]), np.array([False]),
                    np.array([False]))
    assert len(e.later) == 0 and len(e.node) == 2
    assert len(near.group_representative(e)[0]) == 0
