"""Quantized fingerprint: equal cells match, boundaries split, and its cells follow the spec."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from transforms.fingerprint import (
    fingerprint,
    quantize,
    quantized_fingerprint,
    quantized_fingerprint_batch,
)

finite = st.floats(-1e6, 1e6, allow_nan=False, width=64)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 20), st.integers(0, 8)), elements=finite),
       st.sampled_from([1e-3, 0.1, 0.25, 3.0]))
def test_cells_follow_the_formula_and_batch_equals_single(a, step):
    cells = quantize(a, "float64", step, normalize=False)
    expected = [[math.floor(v / step + 0.5) for v in row] for row in a.tolist()]
    assert cells.reshape(a.shape).tolist() == expected
    batch = quantized_fingerprint_batch(a, step)
    assert [bytes(d) for d in batch] == [quantized_fingerprint(r, step) for r in a]


def test_same_cell_matches_across_dtypes_and_frameworks():
    a = np.array([0.10, 0.20, -0.30], dtype=np.float64)
    d = quantized_fingerprint(a, 0.01)
    assert quantized_fingerprint(a + 0.004, 0.01) == d
    assert quantized_fingerprint(a.astype(np.float32), 0.01) == d
    assert quantized_fingerprint(a.astype(np.float16), 0.01) == d
    assert quantized_fingerprint(torch.tensor(a), 0.01) == d
    assert fingerprint(a) != fingerprint(a + 0.004)  # the exact digest does differ


def test_pairs_straddling_a_cell_boundary_do_not_match():
    """The documented miss: 1e-9 apart, but on both sides of the 0.005 boundary."""
    a = np.array([0.005 - 1e-9])
    b = np.array([0.005 + 1e-9])
    assert quantized_fingerprint(a, 0.01) != quantized_fingerprint(b, 0.01)


def test_normalize_makes_scale_irrelevant():
    a = np.array([3.0, 4.0, 0.0])
    assert quantized_fingerprint(a, 0.01, normalize=True) == quantized_fingerprint(
        10 * a, 0.01, normalize=True)
    assert quantized_fingerprint(a, 0.01) != quantized_fingerprint(10 * a, 0.01)
    zeros = np.zeros((1, 3))
    assert quantize(zeros, "float64", 0.1, normalize=True).tolist() == [[0, 0, 0]]


def test_step_and_shape_are_part_of_the_digest():
    a = np.arange(6.0)
    assert quantized_fingerprint(a, 0.5) != quantized_fingerprint(a, 0.25)
    assert quantized_fingerprint(a, 0.5) != quantized_fingerprint(a.reshape(2, 3), 0.5)
    assert quantized_fingerprint(a, 0.5) != quantized_fingerprint(a, 0.5, normalize=True)


def test_non_finite_values_get_reserved_cells():
    special = np.array([np.nan, np.inf, -np.inf, 1e300])
    cells = quantize(special[None], "float64", 1e-3, normalize=False)[0]
    assert len(set(cells.tolist())) == 4
    assert quantized_fingerprint(special, 1e-3) == quantized_fingerprint(special.copy(), 1e-3)
    assert quantized_fingerprint(np.array([np.nan]), 1.0) != quantized_fingerprint(
        np.array([0.0]), 1.0)


@pytest.mark.parametrize("step", [0, -1, float("nan"), float("inf")])
def test_bad_step_is_rejected(step):
    with pytest.raises(ValueError, match="step"):
        quantized_fingerprint(np.zeros(2), step)
