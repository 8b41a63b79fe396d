"""Near-duplicate report: nearest-neighbour distance histogram and borderline pairs.

Picking a near-duplicate threshold is guesswork without seeing where the distances
fall, so the report shows every record's nearest-neighbour distance on a log axis
(near copies sit ~1000x below the bulk) with the threshold marked, and keeps the
pairs just inside and just outside it for eyeballing. Plain functions, no Beam.
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BORDERLINE_SCHEMA = pa.schema([("record_id", pa.string()), ("neighbour_id", pa.string()),
                               ("distance", pa.float64()), ("within", pa.bool_())])
# Ties on distance are broken by ids so that every run and every split picks the same rows.
_ORDER = [("distance", "ascending"), ("record_id", "ascending"), ("neighbour_id", "ascending")]


def distance_histogram(nn_distance: np.ndarray, threshold: float, bins: int = 60) -> dict:
    """JSON-able log-binned histogram of nearest-neighbour distances around ``threshold``.

    Log bins keep near copies (~threshold/1000) and the bulk (10-100x threshold) both
    visible; exact zeros (log bins can't hold 0) and +inf (no neighbour) are counted
    apart. Negative values (round-off in L2 expansions) count as zeros.
    """
    if not threshold > 0 or not np.isfinite(threshold) or bins < 1:
        raise ValueError(f"need a finite threshold > 0 and bins >= 1, got {threshold}, {bins}")
    d = np.asarray(nn_distance, dtype=np.float64).ravel()
    finite, none = np.isfinite(d), np.isposinf(d)
    if not (finite | none).all():
        raise ValueError("nn_distance holds NaN or -inf")
    fin = np.where(d[finite] > 0, d[finite], 0.0)  # round-off negatives and -0.0 become 0
    pos = fin[fin > 0]
    lo = min(threshold / 1000, float(pos.min())) if pos.size else threshold / 1000
    hi = max(float(fin.max()), 2 * threshold) if fin.size else 2 * threshold
    edges = np.geomspace(lo, hi, bins + 1)
    edges[0], edges[-1] = lo, hi  # exact ends, so min and max land inside
    counts, _ = np.histogram(pos, edges)
    q = np.quantile(fin, [0.01, 0.5, 0.99]).tolist() if fin.size else None
    return {"metric_threshold": float(threshold), "edges": edges.tolist(),
            "counts": counts.tolist(), "zero": int(fin.size - pos.size),
            "no_neighbour": int(none.sum()), "n": int(d.size),
            "below_threshold": int((fin <= threshold).sum()),
            "quantiles": q and {"p01": q[0], "p50": q[1], "p99": q[2]}}


def _plot(path: str, hist: dict, metric: str, note: str) -> None:
    """900x500 PNG; Figure + Agg canvas directly, so no pyplot global state or backend switch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    try:
        ax = fig.add_subplot()
        edges = np.asarray(hist["edges"])
        ax.bar(edges[:-1], hist["counts"], width=np.diff(edges), align="edge",
               color="tab:blue", edgecolor="white", linewidth=0.3)
        ax.set_xscale("log")
        t = hist["metric_threshold"]
        ax.axvline(t, color="red", linestyle="--", label=f"threshold = {t:g}")
        ax.set_xlabel(f"nearest-neighbour distance ({metric})")
        ax.set_ylabel("records")
        ax.set_title(f"n = {hist['n']}, {hist['below_threshold']} at or below threshold "
                     f"({hist['zero']} exact zeros, {hist['no_neighbour']} without neighbour)")
        ax.legend(loc="best")
        fig.subplots_adjust(bottom=0.2)
        fig.text(0.01, 0.02, note, fontsize=8, wrap=True)
        fig.savefig(path, dpi=100, format="png")
    finally:
        fig.clear()


def write_near_report(report_dir: str, nn_distance: np.ndarray, threshold: float, metric: str,
                      borderline: pa.Table, note: str) -> dict:
    """Write near_distances.{json,csv,png} and borderline_pairs.parquet; return the json dict."""
    out = {**distance_histogram(nn_distance, threshold), "metric": metric, "note": note}
    with open(os.path.join(report_dir, "near_distances.json"), "w") as f:
        json.dump(out, f, indent=2, allow_nan=False)
    with open(os.path.join(report_dir, "near_distances.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bin_lo", "bin_hi", "count"])
        w.writerow([0, 0, out["zero"]])
        e = out["edges"]
        w.writerows(zip(e[:-1], e[1:], out["counts"], strict=True))
    _plot(os.path.join(report_dir, "near_distances.png"), out, metric, note)
    table = borderline.select(BORDERLINE_SCHEMA.names).cast(BORDERLINE_SCHEMA)
    pq.write_table(table.sort_by(_ORDER), os.path.join(report_dir, "borderline_pairs.parquet"))
    return out


def _top(table: pa.Table, k: int, keys: list[tuple[str, str]]) -> pa.Table:
    """First ``k`` rows by ``keys`` in O(n log k); the keys are a total order, so no ties."""
    if table.num_rows == 0:  # select_k_unstable fails on an empty table
        return table
    return table.take(pc.select_k_unstable(table, min(k, table.num_rows), keys))


def _select(table: pa.Table, per_side: int) -> pa.Table:
    """Largest-distance ``within`` pairs and smallest-distance others, ``per_side`` each."""
    k = max(per_side, 0)
    if table.num_rows:  # a pair met twice (two partitions, or search and kNN) counts once
        table = table.group_by(["record_id", "neighbour_id"], use_threads=False).aggregate(
            [("distance", "min"), ("within", "max")]).rename_columns(BORDERLINE_SCHEMA.names)
    inside = _top(table.filter(pc.field("within")), k, [("distance", "descending")] + _ORDER[1:])
    outside = _top(table.filter(~pc.field("within")), k, _ORDER)
    return pa.concat_tables([inside, outside]).sort_by(_ORDER)


def borderline_sample(later_ids: pa.Array, earlier_ids: pa.Array, distance: np.ndarray,
                      within: np.ndarray, per_side: int) -> pa.Table:
    """Pairs nearest the threshold on each side, where a wrong threshold shows first."""
    distance = np.asarray(distance, dtype=np.float64)
    if np.isnan(distance).any():
        raise ValueError("distance holds NaN")
    table = pa.table([pa.array(later_ids).cast(pa.string()),
                      pa.array(earlier_ids).cast(pa.string()),
                      pa.array(distance), pa.array(np.asarray(within, dtype=bool))],
                     schema=BORDERLINE_SCHEMA)
    return _select(table, per_side)


def merge_borderline(tables: list[pa.Table], per_side: int) -> pa.Table:
    """Combine per-shard samples; equals ``borderline_sample`` of all pairs at once."""
    if not tables:
        return BORDERLINE_SCHEMA.empty_table()
    return _select(pa.concat_tables([t.select(BORDERLINE_SCHEMA.names).cast(BORDERLINE_SCHEMA)
                                     for t in tables]), per_side)
