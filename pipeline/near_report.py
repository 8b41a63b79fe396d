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
import pyarrow.parquet as pq

from pipeline.steps.borderline import BORDERLINE_SCHEMA, ORDER


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
    pq.write_table(table.sort_by(ORDER), os.path.join(report_dir, "borderline_pairs.parquet"))
    return out
