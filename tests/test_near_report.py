"""pipeline.report.near: histogram (pairs, nearest neighbours, zoom) against brute-force
counts, report files read back, borderline selection vs brute force."""

from __future__ import annotations

import csv
import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.report.near import distance_histogram, write_near_report
from pipeline.steps.borderline import BORDERLINE_SCHEMA, borderline_sample, merge_borderline
from pipeline.steps.near_grid import pair_grid_edges, pair_histogram

T = 0.05


def spread(seed: int, n: int = 2000) -> np.ndarray:
    """Bulk at 10-100x the threshold, some near copies ~T/1000, exact zeros and no-neighbours."""
    rng = np.random.default_rng(seed)
    d = T * 10 ** rng.uniform(1, 2, n)
    d[:50] = T * 10 ** rng.uniform(-3.5, 0, 50)
    d[50:60] = 0.0
    d[60:65] = np.inf
    d[65:67] = -1e-12  # round-off below zero counts as zero
    return rng.permutation(d)


def pair_distances(seed: int, n: int = 300) -> np.ndarray:
    """Verified pairs within tolerance: spread over 3 decades below T, some exactly at T
    (within: counted at or below), some at 0."""
    rng = np.random.default_rng(seed)
    d = T * 10 ** rng.uniform(-3, 0, n)
    d[:4] = T
    d[4:7] = 0.0
    return d


def in_bins(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Brute-force counts in bins (lo, hi], one comparison per value and bin."""
    v = values[values > 0]
    return np.array([int(((v > lo) & (v <= hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:],
                                                                          strict=True)])


def check_shape(h: dict, n_nn: int) -> None:
    edges = np.array(h["edges"])
    assert np.all(np.diff(edges) > 0) and edges[0] > 0 and np.isfinite(edges).all()
    assert T in h["edges"] and edges[0] < T < edges[-1]  # the threshold is an edge, inside
    assert h["metric_threshold"] == T and h["nearest_neighbour"]["n"] == n_nn
    nn, p = h["nearest_neighbour"], h["pairs"]
    assert len(nn["counts"]) == len(p["counts"]) == len(edges) - 1
    assert sum(nn["counts"]) == n_nn - nn["zero"] - nn["no_neighbour"]
    assert sum(p["counts"]) == p["n"] - p["zero"] - p["below_range"] - p["above_range"]
    ratio = np.log10(edges[1:] / edges[:-1])
    assert np.allclose(ratio, 1 / h["bins_per_decade"])
    json.dumps(h, allow_nan=False)  # JSON-able, no inf/nan


def no_empty_end_decades(h: dict) -> None:
    """The axis starts and ends where data is (or at the bins either side of T)."""
    edges = np.array(h["edges"])
    total = np.array(h["pairs"]["counts"]) + np.array(h["nearest_neighbour"]["counts"])
    per = h["bins_per_decade"]
    t_bins = {int(np.flatnonzero(edges == T)[0]) - 1, int(np.flatnonzero(edges == T)[0])}
    assert total[0] > 0 or 0 in t_bins
    assert total[-1] > 0 or len(total) - 1 in t_bins
    assert all(total[i:i + per].sum() > 0 or t_bins & set(range(i, i + per))
               for i in (0, len(total) - per) if i >= 0)


def test_histogram_counts_pairs_and_nearest_neighbours():
    d, pd = spread(0), pair_distances(0)
    h = distance_histogram(d, T, pair_histogram(pd, T))
    check_shape(h, len(d))
    no_empty_end_decades(h)
    nn, p = h["nearest_neighbour"], h["pairs"]
    assert nn["zero"] == 12 and nn["no_neighbour"] == 5
    fin = np.where(d[np.isfinite(d)] > 0, d[np.isfinite(d)], 0.0)
    assert nn["below_threshold"] == int((fin <= T).sum()) >= 62
    assert nn["counts"] == in_bins(fin, np.array(h["edges"])).tolist()
    q = nn["quantiles"]
    assert [q["p01"], q["p50"], q["p99"]] == np.quantile(fin, [0.01, 0.5, 0.99]).tolist()
    # pairs: each counted once, exactly, in the same bins; at T counts at or below it
    assert p["n"] == len(pd) and p["zero"] == 3 and p["at_or_below_threshold"] == len(pd)
    assert p["counts"] == in_bins(pd, np.array(h["edges"])).tolist()
    assert h["edges"][0] <= pd[pd > 0].min() and h["edges"][-1] >= fin.max()


def test_zoom_panel_counts_around_the_threshold():
    pd = pair_distances(1)
    outside = np.array([T * 1.01, T * 1.2, T * 2.5, T * 9])  # the last is off the panel
    nn = np.r_[pd[pd > 0], T * 1.5]
    h = distance_histogram(nn, T, pair_histogram(pd, T), outside)
    z = h["zoom"]
    e = np.array(z["edges"])
    assert e[0] == pytest.approx(T / 10 ** 0.5) and e[-1] == pytest.approx(T * 10 ** 0.5)
    assert T in z["edges"]
    assert z["pairs"] == in_bins(pd, e).tolist()
    assert z["outside_pairs"] == in_bins(outside, e).tolist() and sum(z["outside_pairs"]) == 3
    assert z["outside_pairs_n"] == 4
    assert z["nearest_neighbour"] == in_bins(nn, e).tolist()


def test_histogram_range_has_no_empty_decades():
    """Data in one narrow band: the axis spans that band and the threshold, not the
    three decades below T that the old floor (T / 1000) added."""
    d = T * np.array([3.0, 3.5, 4.0, 5.0])
    h = distance_histogram(d, T)
    check_shape(h, 4)
    no_empty_end_decades(h)
    assert h["edges"][0] >= T / 10 ** 0.15 and h["edges"][-1] <= 5 * T * 10 ** 0.15


def test_pair_grid_is_exact_at_the_edges():
    """A pair at the threshold (and at any grid edge) lands in the bin below the edge."""
    edges = pair_grid_edges(T)
    assert T in edges.tolist()
    at = edges[[10, 300, 480, 500]]
    g = pair_histogram(np.r_[at, 0.0, edges[0] / 2, edges[-1] * 2], T)
    got = np.flatnonzero(g["counts"]).tolist()
    assert got == [9, 299, 479, 499]
    assert (g["zero"], g["under"], g["over"]) == (1, 1, 1)


@pytest.mark.parametrize("d", [np.array([]), np.array([np.inf, np.inf]), np.zeros(4)],
                         ids=["empty", "all_inf", "all_zero"])
def test_histogram_degenerate(d):
    h = distance_histogram(d, T)
    check_shape(h, len(d))
    assert sum(h["nearest_neighbour"]["counts"]) == 0 and h["pairs"]["n"] == 0
    q = h["nearest_neighbour"]["quantiles"]
    assert q is None if not np.isfinite(d).any() else q["p99"] == 0.0


def test_histogram_with_zero_tolerance():
    """allclose with atol 0 (rtol > 0): the marker is 0; the grid anchors at 1.0."""
    h = distance_histogram(np.array([1e-3, 2e-3]), 0.0, pair_histogram(np.array([1e-3]), 0.0))
    assert h["pairs"]["n"] == 1 and sum(h["nearest_neighbour"]["counts"]) == 2


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.array([-np.inf])])
def test_histogram_rejects_nan(bad):
    with pytest.raises(ValueError):
        distance_histogram(bad, T)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def random_pairs(seed: int, n: int) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    """Few distinct distances and ids, so ties on distance and on record_id are common; a
    pair may be listed more than once (two partitions found it), always with the same
    distance and verdict, as in the job."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 12, n), rng.integers(0, 12, n)
    dist_of, within_of = rng.integers(0, 8, (12, 12)) / 10, rng.random((12, 12)) < 0.5
    return (pa.array([f"r{i}" for i in a]), pa.array([f"e{i}" for i in b]), dist_of[a, b],
            within_of[a, b])


def test_write_near_report_files_agree(tmp_path):
    d, pd = spread(1), pair_distances(1)
    later, earlier, dist, within = random_pairs(1, 200)
    n, row = len(dist), np.array([int(i[1:]) for i in later.to_pylist()])
    where = (row % 3, row), (np.full(n, -1), np.full(n, -1))  # the same record, the same place
    pairs = borderline_sample(later, earlier, dist, within, 5, *where)
    note = "distances above the search radius are upper bounds"
    shuffled = pairs.take(np.arange(pairs.num_rows)[::-1])
    out = write_near_report(str(tmp_path), d, T, "l2", shuffled, note,
                            pair_histogram(pd, T), removed=250, every=1)
    assert out == json.loads((tmp_path / "near_distances.json").read_text())
    assert out["metric"] == "l2" and out["note"] == note and out["removed"] == 250
    outside = pairs.filter(pc.invert(pairs.column("within"))).column("distance").to_numpy()
    assert {k: v for k, v in out.items() if k in ("edges", "pairs", "nearest_neighbour",
                                                  "zoom")} == {
        k: v for k, v in distance_histogram(d, T, pair_histogram(pd, T), outside).items()
        if k in ("edges", "pairs", "nearest_neighbour", "zoom")}
    with open(tmp_path / "near_distances.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["series", "bin_lo", "bin_hi", "count"]
    series = {}
    for s, lo, hi, c in rows[1:]:
        series.setdefault(s, []).append((float(lo), float(hi), int(c)))
    assert series["pairs"][0] == (0.0, 0.0, out["pairs"]["zero"])
    assert [c for _, _, c in series["pairs"][1:]] == out["pairs"]["counts"]
    assert [lo for lo, _, _ in series["pairs"][1:]] == out["edges"][:-1]
    assert [c for _, _, c in series["nearest_neighbour"][1:]] == \
        out["nearest_neighbour"]["counts"]
    for name in ("pairs", "outside_pairs", "nearest_neighbour"):
        assert [c for _, _, c in series[f"zoom_{name}"]] == out["zoom"][name]
    png = (tmp_path / "near_distances.png").read_bytes()
    w, h = png_size(png)
    assert abs(w - 1100) <= 20 and abs(h - 600) <= 20
    import matplotlib.image

    rgb = matplotlib.image.imread(tmp_path / "near_distances.png")[..., :3]
    red = (rgb[..., 0] > 0.8) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    assert red.any(axis=0).sum() >= 2  # the dashed threshold line, in both panels
    back = pq.read_table(tmp_path / "borderline_pairs.parquet")
    assert pairs.num_rows == 10  # written sorted by distance even though given reversed
    assert back.schema.equals(BORDERLINE_SCHEMA)
    assert back.drop_columns(["neighbour_file", "neighbour_row"]).equals(
        pairs.drop_columns(["neighbour_file", "neighbour_row"]))
    assert back.column("neighbour_file").null_count == 10  # -1 (an earlier run) -> null
    assert back.column("neighbour_row").null_count == 10


def test_write_near_report_empty(tmp_path):
    out = write_near_report(str(tmp_path), np.array([]), T, "cosine",
                            BORDERLINE_SCHEMA.empty_table(), "")
    assert out["nearest_neighbour"]["n"] == 0 and out["nearest_neighbour"]["quantiles"] is None
    assert out["pairs"]["n"] == 0
    assert png_size((tmp_path / "near_distances.png").read_bytes())[0] > 0
    assert pq.read_table(tmp_path / "borderline_pairs.parquet").num_rows == 0


def test_a_zero_threshold_draws_without_warnings(tmp_path):
    """allclose with atol 0 (a relative tolerance only) has threshold 0, which a log axis
    cannot place: the figure is drawn without its line and with no numpy warning (the
    job printed two: log10 of 0, then inf - inf)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = write_near_report(str(tmp_path), spread(2, 500), 0.0, "allclose",
                                BORDERLINE_SCHEMA.empty_table(), "",
                                pair_histogram(pair_distances(2), 0.0))
    assert out["metric_threshold"] == 0.0
    assert png_size((tmp_path / "near_distances.png").read_bytes())[0] > 0


def brute(later, earlier, dist, within, per_side) -> list[tuple]:
    pairs: dict[tuple, tuple] = {}  # a pair listed twice counts once: min distance, any within
    for r in zip(later.to_pylist(), earlier.to_pylist(), dist.tolist(), within.tolist(),
                 strict=True):
        old = pairs.get(r[:2], (r[0], r[1], np.inf, False))
        pairs[r[:2]] = (r[0], r[1], min(old[2], r[2]), old[3] or r[3])
    rows = list(pairs.values())
    inside = sorted((r for r in rows if r[3]), key=lambda r: (-r[2], r[0], r[1]))[:per_side]
    outside = sorted((r for r in rows if not r[3]), key=lambda r: (r[2], r[0], r[1]))[:per_side]
    return sorted(inside + outside, key=lambda r: (r[2], r[0], r[1]))


def as_rows(t: pa.Table) -> list[tuple]:
    return [(r["record_id"], r["neighbour_id"], r["distance"], r["within"])
            for r in t.to_pylist()]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("per_side", [0, 1, 7, 500])
def test_borderline_sample_vs_brute_force(seed, per_side):
    cols = random_pairs(seed, 300)
    got = borderline_sample(*cols, per_side=per_side)
    assert got.schema.equals(BORDERLINE_SCHEMA)
    assert as_rows(got) == brute(*cols, per_side)


@pytest.mark.parametrize("seed", range(6))
def test_merge_of_splits_equals_whole(seed):
    later, earlier, dist, within = random_pairs(seed + 100, 400)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, 400), 5, replace=False)).tolist()
    parts = [borderline_sample(later[a:b], earlier[a:b], dist[a:b], within[a:b], 6)
             for a, b in zip([0, *cuts], [*cuts, 400], strict=True)]
    whole = borderline_sample(later, earlier, dist, within, 6)
    assert merge_borderline(parts, 6).equals(whole)
    assert merge_borderline(parts[::-1], 6).equals(whole)  # order of shards does not matter
    assert merge_borderline([whole], 6).equals(whole)


def test_merge_empty():
    assert merge_borderline([], 3).equals(BORDERLINE_SCHEMA.empty_table())
    e = borderline_sample(pa.array([], pa.string()), pa.array([], pa.string()),
                          np.array([]), np.array([], bool), 3)
    assert e.num_rows == 0 and merge_borderline([e, e], 3).num_rows == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cell_borderline_preselection_equals_the_whole_table(seed):
    """A cell turns only the pairs that can make either side (ties kept) into a table;
    the sample must equal the one made from every pair, repeats and ties included."""
    from pipeline.steps.elements import VecBatch
    from pipeline.steps.near_cells import _borderline

    rng = np.random.default_rng(seed)
    n, m = 300, 5_000
    batch = VecBatch(np.zeros((n, 2), np.uint64), np.zeros(n), np.arange(n),
                     rng.integers(-1, 3, n).astype(np.int32), rng.integers(0, 50, n),
                     pa.array([f"r{i}" for i in range(n)]), np.zeros((n, 0), np.float32))
    later, earlier = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = later != earlier
    later, earlier = later[keep], earlier[keep]
    dist = np.round(rng.random(len(later)), 2)  # many ties
    within = dist <= 0.5
    later, earlier = np.r_[later, earlier[:200]], np.r_[earlier, later[:200]]  # repeats
    dist, within = np.r_[dist, dist[:200]], np.r_[within, within[:200]]
    a, b = np.maximum(later, earlier), np.minimum(later, earlier)
    f = batch.file_index
    whole = borderline_sample(batch.ids.take(pa.array(a)), batch.ids.take(pa.array(b)),
                              dist, within, 9, (f[a], np.where(f[a] < 0, -1, batch.position[a])),
                              (f[b], np.where(f[b] < 0, -1, batch.position[b])))
    got = _borderline(batch, later, earlier, dist, within, 9)
    assert got.num_rows == 18 and got.equals(whole)
