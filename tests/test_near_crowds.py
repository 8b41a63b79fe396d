"""The near stage on data shaped like scraped datasets: crowds of copies, blank records,
magnitudes over six orders, all-identical input, NaN rows. Against float64 oracles that
list no pairs (``kept_set_oracle``: a crowd of thousands has millions), at sizes above
where the per-cell budgets switch (pairs counted on a sample past 65k per cell)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from tests import shapes
from tests.jobkit import report, run_job
from tests.oracle import expected_removals, kept_set_oracle, near_oracle
from transforms.near import greedy
from transforms.near.find import find_near
from transforms.near.greedy import CENSUS_EXACT_PAIRS
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance


def crowds(metric: str, seed: int = 0) -> tuple[np.ndarray, NearSpec]:
    """4,000 embedding-like rows (64-d) + one crowd of 3,000 + five of 300 (every pair of
    a crowd within tolerance: 4.5M pairs in the big one), shuffled."""
    t = 0.01
    bg = shapes.background(4000, dim=64, seed=seed)
    if metric == "l2":
        t = 0.05
    parts = [bg, shapes.crowd(bg[1], 3000, t, metric, seed=1)]
    parts += [shapes.crowd(bg[10 + i], 300, t, metric, seed=2 + i) for i in range(5)]
    x = np.concatenate(parts)
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order], NearSpec(metric, threshold=t)


def crowd_labels(metric: str, seed: int = 0) -> np.ndarray:
    """``crowds``' rows' crowd: 0 for the big one, 1-5 the small ones, each with the
    background row it is centred on; -1 for the rest of the background."""
    label = np.full(4000 + 3000 + 5 * 300, -1)
    label[[1, *range(10, 15)]] = range(6)
    label[4000:7000] = 0
    for i in range(5):
        label[7000 + 300 * i: 7300 + 300 * i] = i + 1
    return label[np.random.default_rng(seed).permutation(len(label))]


def kernel_matches(x: np.ndarray, spec: NearSpec, **kw):
    r = find_near(x, np.arange(len(x)), spec, **kw)
    got = dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True))
    assert got == kept_set_oracle(x, spec)
    d, ok = exact_distance(x[r.removed], x[r.kept], spec)
    assert ok.all() and np.allclose(r.distance, d)
    return r


def test_a_cell_settles_sparse_rows_in_larger_blocks_and_a_crowd_in_small_ones(monkeypatch):
    """Rows are settled a block at a time; a block's own candidates are verified in
    float64 (a crowd's: every pair), and each block gathers the earlier rows it meets.
    So blocks grow only where few of a cell's own pairs were candidates: a crowd keeps
    BLOCK rows a block, embedding-like rows grow to BLOCK_MAX, and the decisions are
    the oracle's either way, and with every block BLOCK rows."""
    x, spec = crowds("cosine")
    one = replace(spec, single_index_rows=len(x) * 2, recall_sample=0)  # one cell
    sizes: list[int] = []
    grow = greedy._next_block
    monkeypatch.setattr(greedy, "_next_block", lambda *a: sizes.append(grow(*a)) or sizes[-1])
    label = crowd_labels("cosine")
    for rows, size in ((label == -1, greedy.BLOCK_MAX), (label == 0, greedy.BLOCK)):
        sizes.clear()  # the background alone, then the big crowd alone
        kernel_matches(x[rows], one)
        assert len(sizes) > 1 and set(sizes) == {size}
    monkeypatch.setattr(greedy, "BLOCK_MAX", greedy.BLOCK)
    kernel_matches(x, one)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_crowds_decide_like_the_oracle_and_count_pairs_on_a_sample(metric):
    x, spec = crowds(metric)
    small = replace(spec, single_index_rows=1000, partition_rows=300)
    r = kernel_matches(x, replace(small, mode="exact"))
    label = crowd_labels(metric)
    kept = np.ones(len(x), bool)
    kept[r.removed] = False
    for c in range(6):  # each crowd, with the row it is centred on, collapses to one
        assert kept[label == c].sum() == 1, c
    assert (label[r.removed] == label[r.kept]).all()  # into a record of its own crowd
    assert r.estimated and r.pairs > 3000 * 2999 / 2 * 0.9  # pairs: sampled, scaled
    assert r.recall.recall == 1.0 and r.recall.truncated > 0  # judged on nearest partners
    b = kernel_matches(x, replace(small, mode="bounded", probes=2))  # the crowd in one cell
    assert b.partitions.mode == "bounded"


def test_a_crowd_split_over_cells_is_settled_after_the_search():
    """Cells of a crowd smaller than the tolerance are merged in the plan; forced apart
    (one cell per record group), records whose fate hangs on another cell are settled
    together after the search, with the same answer."""
    x, spec = crowds("cosine", seed=3)
    for parts in (1, 12, 40):
        kernel_matches(x, replace(spec, mode="exact"), partitions=parts)


def test_magnitudes_over_six_orders():
    x, _ = shapes.magnitudes(6000, dim=32, tolerance=0.01)
    spec = NearSpec("l2", threshold=0.01, single_index_rows=500, partition_rows=200)
    r = kernel_matches(x, replace(spec, mode="exact"))
    assert len(r.partitions) > 3 and len(r.removed) > 500


def test_components_in_a_crowd_match_the_pair_oracle():
    """Components grouping needs each cell's components only: a crowd is one component
    whatever the pairs the census skipped (nets compared where pairs were sampled)."""
    bg = shapes.background(1500, dim=16, seed=4)
    x = np.concatenate([bg, shapes.crowd(bg[0], 1200, 0.02, "cosine", seed=5),
                        shapes.crowd(bg[1], 600, 0.02, "cosine", seed=6)])
    x = x[np.random.default_rng(7).permutation(len(x))]
    spec = NearSpec("cosine", threshold=0.02, grouping="components", mode="exact",
                    single_index_rows=500, partition_rows=200)
    r = find_near(x, np.arange(len(x)), spec)
    assert 1200 * 1199 / 2 > CENSUS_EXACT_PAIRS and r.estimated
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == near_oracle(x, spec)


@pytest.mark.parametrize("seed", [0, 1])
def test_components_join_rows_linked_only_through_removed_members(seed):
    """The pairs of a row left out of the census sample with earlier removed rows were
    never visited: rows linked to a crowd only that way are still in its component."""
    x = shapes.satellites(seed)
    spec = NearSpec("l2", threshold=0.05, grouping="components", mode="exact",
                    single_index_rows=500, partition_rows=200)
    r = find_near(x, np.arange(len(x)), spec)
    assert r.estimated
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == near_oracle(x, spec)


def test_components_with_many_kept_rows_in_one_cell():
    """One cell of 6,000 mostly distinct rows (6,000 kept net points) and a crowd of 1,200:
    the skipped pairs are looked for near the net points, against the pair oracle."""
    rng = np.random.default_rng(11)
    bg = rng.standard_normal((6000, 24)).astype(np.float32) * 0.02
    x = np.concatenate([bg, shapes.crowd(bg[0], 1200, 0.05, "l2", seed=12)])
    x = x[rng.permutation(len(x))]
    spec = NearSpec("l2", threshold=0.05, grouping="components", mode="exact",
                    single_index_rows=20_000)
    r = find_near(x, np.arange(len(x)), spec)
    assert r.estimated and len(r.partitions) == 1
    assert dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)) == near_oracle(x, spec)


def test_degenerate_inputs():
    spec = NearSpec("l2", threshold=0.01)
    for x in (shapes.identical(500), shapes.one_distinct(500), shapes.single(),
              shapes.nothing_within(3000, tolerance=0.01),
              shapes.one_cell(3000, tolerance=0.01)):
        kernel_matches(x, spec, partitions=8)
    x, _ = shapes.with_nans(shapes.one_cell(2000, tolerance=0.01))
    r = find_near(x, np.arange(len(x)), spec, partitions=8)
    assert np.isfinite(x[r.removed]).all() and np.isfinite(x[r.kept]).all()


def test_job_on_crowds_blanks_and_copies(tmp_path):
    """Through the CLI: 20,000 exact copies of one record (the exact stage takes them),
    its near copies, a crowd of 2,500, blank rows (zeros and near-zeros: a crowd under
    l2), NaN rows; removals equal exact + the kept-set oracle; summary says the pairs
    were sampled; memory never held a pair list."""
    rng = np.random.default_rng(8)
    bg = shapes.background(3000, dim=32, seed=8) * 3
    one = bg[:1]
    near = one + rng.normal(0, 0.002, (40, 32)).astype(np.float32)
    x = np.concatenate([bg, np.repeat(one, 20_000, 0), near,
                        shapes.crowd(bg[5], 2500, 0.05, "l2", seed=9)])
    x, _ = shapes.with_blanks(x, share=0.05, noise=1e-4, seed=10)
    x = x[rng.permutation(len(x))]
    x[rng.choice(len(x), 20, replace=False), 3] = np.nan
    ids = [str(i) for i in range(len(x))]
    (tmp_path / "in").mkdir()
    shapes.write_parquet(tmp_path / "in" / "part-0.parquet", x)
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   near={"metric": "l2", "threshold": 0.05, "mode": "exact",
                         "single_index_rows": 2000, "partition_rows": 500}) == 0
    dups, invalid = report(tmp_path)
    exact = expected_removals([(i, t, 0.0) for i, t in zip(ids, x, strict=True)])
    survivors = [i for i in range(len(x)) if ids[i] not in exact and np.isfinite(x[i]).all()]
    want = {ids[survivors[r]]: ids[survivors[k]] for r, k in
            kept_set_oracle(x[survivors], NearSpec("l2", threshold=0.05)).items()}
    rows = dups.to_pylist()
    assert {r["record_id"]: r["duplicate_of"] for r in rows if r["kind"] == "exact"} == exact
    assert {r["record_id"]: r["duplicate_of"] for r in rows if r["kind"] == "near"} == want
    s = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert s["read"] == s["kept"] + s["removed_exact"] + s["removed_near"] + s["invalid"]
    assert s["near"]["pairs_estimated"] and s["near"]["recall"]["recall"] == 1.0
    assert invalid.num_rows == 0
    # every record gets a nearest-neighbour distance here (fewer than 20,000 searched); a
    # crowd's cell measures 256 of them and repeats those for the rest
    nn = json.loads((tmp_path / "out" / "report" / "near_distances.json").read_text())
    assert s["near"]["histogram_every"] == 1 and s["near"]["cells_with_sampled_nearest"] >= 1
    assert nn["nearest_neighbour"]["n"] == s["near"]["records_searched"]
    assert "crowded cell" in nn["note"]
