"""Near-duplicate report for metric jaccard: the histogram drawn in J, the borderline
pairs on both sides of the threshold.

Why its own drawing: a vector threshold is a maximum distance on a log axis that spans
decades; a Jaccard threshold is a minimum similarity in [0, 1], read on a linear axis.
Two series: every verified pair (each candidate whose exact Jaccard was computed,
removed or not: where the near misses lie) and each removed record's J with the record
it duplicates. The files keep the vector report's names (near_distances.json / .csv /
.png, borderline_pairs.parquet) so that tools reading them find them.
"""

from __future__ import annotations

import csv
import json
import os
from concurrent.futures import Future

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report.near import count_axis, draw_and_write
from pipeline.steps.borderline import BORDERLINE_SCHEMA
from transforms.io import layout
from transforms.near.sets import J_BINS

ZOOM = 0.1  # the right panel: threshold +- this


def jaccard_histogram(removed_distance: np.ndarray, verified: list[int], threshold: float,
                      outside: np.ndarray) -> dict:
    """JSON-able counts in bins of 1 / J_BINS over J in [0, 1] (the last bin holds 1):
    ``verified`` (every pair whose Jaccard was computed), ``removed`` (each removal's J),
    ``outside`` (the borderline near misses kept, J < threshold)."""
    def counts(j: np.ndarray) -> list[int]:
        b = np.minimum((np.asarray(j, np.float64) * J_BINS).astype(np.int64), J_BINS - 1)
        return np.bincount(b, minlength=J_BINS).tolist()

    j = 1.0 - np.asarray(removed_distance, np.float64)
    v = np.asarray(verified, np.int64)
    at = int(round(threshold * J_BINS))  # the threshold's bin (below it when not on an edge)
    return {"metric": "jaccard", "axis": "J", "threshold_jaccard": float(threshold),
            "edges": [round(k / J_BINS, 6) for k in range(J_BINS + 1)],
            "verified": {"n": int(v.sum()), "counts": v.tolist(),
                         "below_threshold_bins": int(v[:at].sum())},
            "removed": {"n": int(len(j)), "counts": counts(j), "identical": int((j >= 1).sum())},
            "outside": {"n": int(len(outside)), "counts": counts(1.0 - outside)}}


def _plot(path: str, hist: dict, note: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6), dpi=100)
    FigureCanvasAgg(fig)
    main, zoom = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    fig.subplots_adjust(bottom=0.3, top=0.93, left=0.07, right=0.98, wspace=0.22)
    t = hist["threshold_jaccard"]
    e = np.asarray(hist["edges"])
    v, r, o = hist["verified"], hist["removed"], hist["outside"]
    labels = (f"verified candidate pairs (exact J computed): {v['n']:,}",
              f"removed records, J with the record each duplicates: {r['n']:,} "
              f"({r['identical']:,} at J = 1)",
              f"near misses kept for borderline_pairs: {o['n']:,} (a sample)")
    for ax, lo, hi in ((main, 0.0, 1.0), (zoom, max(0.0, t - ZOOM), min(1.0, t + ZOOM))):
        ax.stairs(v["counts"], e, color="0.45", fill=True, alpha=0.35, label=labels[0])
        ax.bar(e[:-1], r["counts"], width=np.diff(e), align="edge", color="tab:blue",
               edgecolor="white", linewidth=0.3, label=labels[1])
        ax.bar(e[:-1], o["counts"], width=np.diff(e), align="edge", color="tab:orange",
               alpha=0.85, edgecolor="white", linewidth=0.3, label=labels[2])
        ax.axvline(t, color="red", linestyle="--", label=f"threshold: J >= {t:g}")
        count_axis(ax, max([*v["counts"], *r["counts"]], default=0))
        ax.set_xlim(lo, hi)
    main.set_xlabel("Jaccard similarity J of the shingle sets")
    zoom.set_xlabel(f"J, threshold +- {ZOOM:g}")
    main.set_title(f"{r['n']:,} records removed as near-duplicates (J >= {t:g})", fontsize=10)
    zoom.set_title("around the threshold", fontsize=10)
    handles, names = zoom.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower left", bbox_to_anchor=(0.06, 0.06), ncol=2,
               fontsize=8, frameon=False)
    fig.text(0.01, 0.015, note, fontsize=8, wrap=True)
    try:
        fig.savefig(path, dpi=100, format="png", metadata={"Software": None})
    finally:
        fig.clear()


def write_jaccard_report(report_dir: str, removed_distance: np.ndarray, verified: list[int],
                         threshold: float, borderline: pa.Table, note: str,
                         drawing: list[Future] | None = None) -> dict:
    """Write near_distances.{json,csv,png} (in J) and borderline_pairs.parquet (the pairs
    nearest the threshold first, both sides); return the json dict."""
    table = borderline.select(BORDERLINE_SCHEMA.names).cast(BORDERLINE_SCHEMA)
    gap = pc.abs(pc.subtract(pc.subtract(1.0, table.column("distance")), threshold))
    table = table.append_column("gap", gap).sort_by(
        [("gap", "ascending"), ("record_id", "ascending"), ("neighbour_id", "ascending")]
    ).drop_columns(["gap"])
    outside = table.filter(pc.invert(table.column("within"))).column("distance").to_numpy()
    out = {**jaccard_histogram(removed_distance, verified, threshold, outside), "note": note}
    with open(os.path.join(report_dir, layout.NEAR_DISTANCES + ".json"), "w") as f:
        json.dump(out, f, indent=2, allow_nan=False)
    with open(os.path.join(report_dir, layout.NEAR_DISTANCES + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["series", "j_lo", "j_hi", "count"])
        e = out["edges"]
        for series in ("verified", "removed", "outside"):
            w.writerows((series, lo, hi, c) for lo, hi, c in
                        zip(e[:-1], e[1:], out[series]["counts"], strict=True))
    draw_and_write(report_dir, lambda png: _plot(png, out, note), table, drawing)
    return out
