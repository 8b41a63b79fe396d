"""pipeline.near_report: histogram, report files read back, borderline selection vs brute force."""

from __future__ import annotations

import csv
import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.near_report import distance_histogram, write_near_report
from pipeline.steps.borderline import BORDERLINE_SCHEMA, borderline_sample, merge_borderline

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


def check_shape(h: dict, n: int, bins: int) -> None:
    edges, counts = np.array(h["edges"]), np.array(h["counts"])
    assert len(edges) == bins + 1 and len(counts) == bins
    assert np.all(np.diff(edges) > 0) and edges[0] > 0 and np.isfinite(edges).all()
    assert edges[0] <= T / 1000 and edges[-1] >= 2 * T  # threshold well inside the range
    assert h["metric_threshold"] == T and h["n"] == n
    assert counts.sum() == n - h["zero"] - h["no_neighbour"]
    json.dumps(h, allow_nan=False)  # JSON-able, no inf/nan


def test_histogram_counts_zeros_and_inf():
    d = spread(0)
    h = distance_histogram(d, T)
    check_shape(h, len(d), 60)
    assert h["zero"] == 12 and h["no_neighbour"] == 5
    fin = np.where(d[np.isfinite(d)] > 0, d[np.isfinite(d)], 0.0)
    assert h["below_threshold"] == int((fin <= T).sum()) >= 62
    assert h["edges"][0] == d[d > 0].min() and h["edges"][-1] == d[np.isfinite(d)].max()
    expect, _ = np.histogram(fin[fin > 0], bins=np.array(h["edges"]))
    assert h["counts"] == expect.tolist()
    q = h["quantiles"]
    assert [q["p01"], q["p50"], q["p99"]] == np.quantile(fin, [0.01, 0.5, 0.99]).tolist()
    assert 0 <= q["p01"] < T < q["p50"] <= q["p99"]


def test_histogram_floor_and_ceiling_from_threshold():
    h = distance_histogram(np.array([T * 2e-3, T * 0.5, T]), T, bins=7)
    check_shape(h, 3, 7)
    assert h["edges"][0] == pytest.approx(T / 1000) and h["edges"][-1] == pytest.approx(2 * T)
    assert h["below_threshold"] == 3  # <= threshold is inclusive


@pytest.mark.parametrize("d", [np.array([]), np.array([np.inf, np.inf]), np.zeros(4)],
                         ids=["empty", "all_inf", "all_zero"])
def test_histogram_degenerate(d):
    h = distance_histogram(d, T)
    check_shape(h, len(d), 60)
    assert sum(h["counts"]) == 0
    assert h["quantiles"] is None if not np.isfinite(d).any() else h["quantiles"]["p99"] == 0.0


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
    d = spread(1)
    pairs = borderline_sample(*random_pairs(1, 200), per_side=5)
    note = "distances above the search radius are upper bounds"
    shuffled = pairs.take(np.arange(pairs.num_rows)[::-1])
    out = write_near_report(str(tmp_path), d, T, "l2", shuffled, note)
    assert out == json.loads((tmp_path / "near_distances.json").read_text())
    assert out["metric"] == "l2" and out["note"] == note
    assert {k: v for k, v in out.items() if k not in ("metric", "note")} == \
        distance_histogram(d, T)
    with open(tmp_path / "near_distances.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["bin_lo", "bin_hi", "count"]
    assert [float(x) for x in rows[1]] == [0.0, 0.0, out["zero"]]
    body = np.array(rows[2:], dtype=np.float64)
    assert body[:, 0].tolist() == out["edges"][:-1] and body[:, 1].tolist() == out["edges"][1:]
    assert body[:, 2].astype(int).tolist() == out["counts"]
    png = (tmp_path / "near_distances.png").read_bytes()
    w, h = png_size(png)
    assert abs(w - 900) <= 20 and abs(h - 500) <= 20
    import matplotlib.image

    rgb = matplotlib.image.imread(tmp_path / "near_distances.png")[..., :3]
    red = (rgb[..., 0] > 0.8) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    assert red.any(axis=0).sum() >= 1  # the dashed threshold line was drawn
    back = pq.read_table(tmp_path / "borderline_pairs.parquet")
    assert pairs.num_rows == 10  # written sorted by distance even though given reversed
    assert back.schema.equals(BORDERLINE_SCHEMA) and back.equals(pairs)


def test_write_near_report_empty(tmp_path):
    out = write_near_report(str(tmp_path), np.array([]), T, "cosine",
                            BORDERLINE_SCHEMA.empty_table(), "")
    assert out["n"] == 0 and out["quantiles"] is None
    assert png_size((tmp_path / "near_distances.png").read_bytes())[0] > 0
    assert pq.read_table(tmp_path / "borderline_pairs.parquet").num_rows == 0


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
