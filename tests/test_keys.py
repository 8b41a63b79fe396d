"""TensorKey / TensorDict: value semantics across frameworks, exact tolerance lookups."""

import numpy as np
import pytest
import tensorflow as tf
import torch

from transforms.keys import TensorDict, TensorKey


def test_key_value_semantics_across_frameworks():
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    keys = {TensorKey(a), TensorKey(torch.tensor([1.0, 2.0, 3.0])),
            TensorKey(tf.constant([1.0, 2.0, 3.0])), TensorKey(TensorKey(a))}
    assert len(keys) == 1
    assert TensorKey(a) != TensorKey(a.astype(np.float64))
    assert TensorKey(a) != TensorKey(a.reshape(3, 1))
    assert TensorKey(np.array([-0.0])) == TensorKey(np.array([0.0]))
    assert TensorKey(np.array([np.nan])) == TensorKey(np.array([np.nan]))
    assert (TensorKey(a) == a) is False  # no elementwise surprise
    r = repr(TensorKey(a.reshape(1, 3)))
    assert "float32" in r and "(1, 3)" in r


def test_mutating_the_original_cannot_corrupt_the_dict():
    a = np.array([1.0, 2.0])
    t = torch.tensor([5.0, 6.0])
    d = TensorDict([(a, "a"), (t, "t")])
    a[0] = 100.0
    t[0] = 100.0
    assert d[np.array([1.0, 2.0])] == "a"
    assert d[torch.tensor([5.0, 6.0])] == "t"
    assert np.array([100.0, 2.0]) not in d
    key = next(iter(d))
    with pytest.raises(ValueError):
        key.array[0] = 1.0


def test_mutable_mapping_behaviour():
    d = TensorDict()
    d[np.arange(3)] = 1
    d[torch.arange(3)] = 2  # same dtype (int64), shape, values: same key
    d[tf.range(3)] = 3  # tf.range gives int32: another key
    assert len(d) == 2 and d[np.arange(3)] == 2
    del d[np.arange(3)]
    assert len(d) == 1 and np.arange(3) not in d
    with pytest.raises(KeyError):
        d[np.arange(3)]
    d.update([(np.zeros(2), "z")])
    assert dict(zip([k.shape for k in d], d.values(), strict=True)) == {(3,): 3, (2,): "z"}


def _oracle_near(stored, q, atol, rtol):
    return [i for i, k in enumerate(stored)
            if k.shape == q.shape and np.all(np.abs(k - q) <= atol + rtol * np.abs(q))]


@pytest.mark.parametrize("seed", range(5))
def test_near_and_nearest_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((40, 6))
    stored = [base[i % 40] + rng.normal(0, 1e-4, 6) * (i // 40) for i in range(120)]
    stored += [rng.standard_normal((2, 3)) for _ in range(5)]  # other shape: never a candidate
    d = TensorDict()
    for i, k in enumerate(stored):
        d[k.astype(np.float32) if i % 3 == 0 else k] = i
    values = {int(v): v for v in d.values()}
    atol, rtol = 3e-4, 1e-3
    for q in rng.standard_normal((10, 6)).tolist() + [s.tolist() for s in stored[:20]]:
        q = np.array(q)
        got = sorted(m.value for m in d.near(q, atol=atol, rtol=rtol))
        kept = [i for i in _oracle_near([np.asarray(s, np.float32).astype(np.float64)
                                         if i % 3 == 0 else s for i, s in enumerate(stored)],
                                        q, atol, rtol) if i in values]
        assert got == sorted(kept)
        dists = {i: np.linalg.norm((stored[i].astype(np.float32).astype(np.float64)
                                    if i % 3 == 0 else stored[i]) - q)
                 for i in values if stored[i].shape == q.shape}
        best = d.nearest(q)
        assert best.distance == pytest.approx(min(dists.values()), abs=1e-12)
        if kept:
            assert d.get_near(q, atol=atol, rtol=rtol) == min(kept, key=lambda i: dists[i])
        else:
            assert d.get_near(q, "missing", atol=atol, rtol=rtol) == "missing"


def test_64_bit_integer_keys_beyond_2_53_are_compared_exactly():
    """As float64, 2^62 + 1 and 2^62 + 2 are 0.0 apart: the dict would match a key one unit
    off at atol 0.5 and call it the nearest at distance 0. Checked against Python's integers,
    across int64, uint64 and int32 keys of one shape."""
    rng = np.random.default_rng(0)
    big = [int(v) for v in rng.integers(2**60, 2**62, 30)]
    keys = ([np.array([v, -v, v + 7], np.int64) for v in big]
            + [np.array([v, v + 1, 2**64 - 1 - v], np.uint64) for v in big[:10]]
            + [np.array([3, -4, 5], np.int32)])
    d = TensorDict((k, i) for i, k in enumerate(keys))
    exact = [[int(x) for x in k] for k in keys]
    for j, base in enumerate(exact[:40:3]):
        q = [x + (1 if n == 1 else 0) for n, x in enumerate(base)]  # one unit off
        query = np.array(q, keys[j * 3].dtype)
        for atol in (0.5, 1.0):  # one unit off: none within 0.5, its own key within 1
            want = sorted(i for i, k in enumerate(exact)
                          if all(abs(a - b) <= atol for a, b in zip(k, q, strict=True)))
            got = d.near(query, atol=atol, rtol=0)
            assert sorted(m.value for m in got) == want
            assert all(m.distance == 1.0 for m in got)
        best = d.nearest(query)
        assert (best.value, best.distance) == (j * 3, 1.0)


def test_decoy_just_outside_tolerance_is_not_returned():
    d = TensorDict([(np.array([1.0, 1.0]), "key")])
    assert d.get_near(np.array([1.0 + 0.9e-3, 1.0]), atol=1e-3, rtol=0) == "key"
    assert d.get_near(np.array([1.0 + 1.1e-3, 1.0]), atol=1e-3, rtol=0) is None


def test_nearest_errors():
    d = TensorDict([(np.zeros(3), 0)])
    with pytest.raises(KeyError):
        d.nearest(np.zeros(4))
    with pytest.raises(ValueError):
        d.nearest(np.array([np.nan, 0.0, 0.0]))
    assert d.nearest(np.zeros(3)).distance == 0.0


def test_activation_cache_example():
    """The README example: a layer caches outputs per input tensor, by value."""
    layer = torch.nn.Linear(4, 2)
    calls = []
    cache = TensorDict()

    def cached_forward(x: torch.Tensor) -> torch.Tensor:
        if x in cache:
            return cache[x]
        calls.append(1)
        cache[x] = y = layer(x).detach()
        return y

    x = torch.randn(3, 4)
    y1 = cached_forward(x)
    y2 = cached_forward(x.clone())  # another tensor object, same values
    y3 = cached_forward(torch.from_numpy(x.numpy().copy()))
    assert len(calls) == 1 and torch.equal(y1, y2) and torch.equal(y1, y3)
    cached_forward(x + 1)
    assert len(calls) == 2
