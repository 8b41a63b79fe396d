"""The job on issue 21's degenerate inputs (tests/shapes.py), small: every one runs,
accounts for every record, and removes exactly what the exact + all-pairs float64
oracles remove (keep first; representative grouping, and components over k-means cells)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import shapes
from tests.embeddings import planted_copies
from tests.jobkit import report, run_job
from tests.oracle import near_oracle
from tests.test_job_near import by_kind, expected
from transforms.near.spec import NearSpec

TOL = 0.01


def _identical_and_crowd():
    x = shapes.identical(2000, 16)
    return np.concatenate([x, shapes.crowd(x[0], 40, TOL, "l2", seed=2)])


def _blank():
    return shapes.with_blanks(shapes.background(600, 16), 0.1, seed=3)[0]


def _nans():
    x = np.concatenate([shapes.background(300, 16), shapes.crowd(
        shapes.background(300, 16)[5], 30, TOL, "l2", seed=4)])
    return shapes.with_nans(x, 0.05, seed=4)[0]


CASES = {
    "identical": (lambda: shapes.identical(3000, 16), "l2"),
    "identical+crowd": (_identical_and_crowd, "l2"),
    "one distinct": (lambda: shapes.one_distinct(3000, 16), "cosine"),
    "single": (lambda: shapes.single(16), "l2"),
    "nothing within": (lambda: shapes.nothing_within(2000, 16, TOL), "l2"),
    "one cell": (lambda: shapes.one_cell(1500, 8, TOL), "l2"),
    "blank, l2": (_blank, "l2"),
    "blank, cosine": (_blank, "cosine"),
    "NaN rows": (_nans, "l2"),
}


@pytest.mark.parametrize("case,cells,grouping", [
    pytest.param(c, cells, g, id=f"{c}-{'k-means cells' if cells else 'one cell'}-{g}")
    for c in CASES for cells, g in ((False, "representative"), (True, "representative"),
                                    (True, "components"))])
def test_degenerate_input_matches_oracle(tmp_path, case, cells, grouping):
    """``cells``: cells of about 100 records (exact mode), so the planning and the
    bisector rule meet these inputs too, not only the single-cell search."""
    make, metric = CASES[case]
    x = make()
    path = tmp_path / "in" / "part-0.parquet"
    path.parent.mkdir()
    shapes.write_parquet(path, x, row_group_rows=500)
    spec = NearSpec(metric, threshold=TOL, grouping=grouping)
    many = {"single_index_rows": 200, "partition_rows": 100, "mode": "exact"} if cells else {}
    assert run_job(tmp_path, "parquet", str(path), input={},
                   near={"metric": metric, "threshold": TOL, "grouping": grouping,
                         **many}) == 0
    parts = [([str(i) for i in range(len(x))], x)]
    want_exact, want_near = expected(parts, spec)
    dups, invalid = report(tmp_path)
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == len(x) and invalid.num_rows == 0
    assert summary["read"] == summary["kept"] + dups.num_rows
    assert by_kind(dups, "exact") == want_exact
    assert by_kind(dups, "near") == want_near


def test_components_in_bounded_mode_join_rows_linked_in_other_cells(tmp_path):
    """Bounded mode caps the cells a row joins, so a row may be linked only in a cell
    that is not its home: its values must still reach the merge. Planted copies and 10%
    blank rows in cells of about 300; every removal is in its keeper's component of the
    all-pairs float64 oracle (bounded mode may miss links, never invent one)."""
    x, _ = planted_copies(shapes.background(6000, dim=64, seed=0), seed=1)
    x, _ = shapes.with_blanks(x, 0.1, seed=0)
    path = tmp_path / "in" / "part-0.parquet"
    path.parent.mkdir()
    shapes.write_parquet(path, x)
    assert run_job(tmp_path, "parquet", str(path), near={
        "metric": "cosine", "threshold": TOL, "grouping": "components", "mode": "bounded",
        "probes": 2, "single_index_rows": 1000, "partition_rows": 300}) == 0
    dups, invalid = report(tmp_path)
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == len(x) == summary["kept"] + dups.num_rows + invalid.num_rows
    exact, _ = expected([([str(i) for i in range(len(x))], x)], NearSpec("cosine", TOL))
    assert by_kind(dups, "exact") == exact
    survivors = [i for i in range(len(x)) if str(i) not in exact]
    oracle = near_oracle(x[survivors], NearSpec("cosine", threshold=TOL,
                                                grouping="components"))
    root = {str(survivors[r]): str(survivors[k]) for r, k in oracle.items()}
    near = by_kind(dups, "near")
    assert len(near) >= 0.9 * len(oracle) > 100
    assert all(root.get(r, r) == root.get(k, k) for r, k in near.items())
