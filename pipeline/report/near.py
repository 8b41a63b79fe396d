"""Near-duplicate report: the distance histogram and the borderline pairs.

Picking a near-duplicate threshold is guesswork without seeing where the distances
fall. Two things are known, and the histogram keeps them apart:

- **pairs within tolerance**: every verified pair the search found within the
  tolerance, each pair once, counted exactly (on a fixed grid anchored at the
  threshold: ``pipeline.steps.near_grid.pair_histogram``). Each removal has one, so these
  counts and ``removed_near`` speak the same language (a pair, not its two ends).
- **nearest-neighbour distances** of a sample of records (1 in ``every``, by digest):
  the bulk above the threshold, which no pair count covers (the search looks no
  further than the tolerance). Counted per record.

Counts are on a log scale (near copies are few next to the bulk), and the x axis spans
only the decades that hold data. A second panel zooms to half a decade either side of
the threshold, with the pairs just outside it that the borderline sample kept.
Plain functions, no Beam.
"""

from __future__ import annotations

import csv
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.steps.borderline import BORDERLINE_SCHEMA, ORDER
from pipeline.steps.near_grid import (
    PAIR_BINS_PER_DECADE,
    PAIR_DECADES_BELOW,
    grid_anchor,
    pair_histogram,
)
from transforms.io import layout

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BINS_PER_DECADE = 10  # main panel (divides PAIR_BINS_PER_DECADE: grid bins merge evenly)
# matplotlib caches fonts per thread (an FT2Font is not thread-safe); drawn on whichever
# Beam thread ran the report, every job in a long-lived process (a notebook, a scheduler
# calling run_job) kept a few more open font files and their memory. One drawing thread
# per process: started on first use, joined at exit by concurrent.futures, and made anew
# in a forked child (which has the parent's executor but not its thread).
_drawer: list[ThreadPoolExecutor] = []
_drawer_lock = threading.Lock()


def drawing_thread() -> ThreadPoolExecutor:
    """The one thread that draws the report's plots (matplotlib figures are drawn one at a
    time), while the caller goes on."""
    with _drawer_lock:
        if not _drawer:
            _drawer.append(ThreadPoolExecutor(1, thread_name_prefix="tensordedup-plot"))
        return _drawer[0]


def _forget_drawer() -> None:
    global _drawer_lock
    _drawer.clear()
    _drawer_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_drawer)
ZOOM_DECADES = 0.5  # the zoomed panel: threshold x 10^(+-0.5)


def _bin_of(d: np.ndarray, anchor: float, per_decade: int) -> np.ndarray:
    """Index j of the bin (anchor 10^(j/p), anchor 10^((j+1)/p)] holding each d > 0."""
    j = np.ceil(per_decade * np.log10(d / anchor)).astype(np.int64) - 1
    # log10 rounding: move each value into the bin whose (lo, hi] really holds it
    lo = anchor * 10.0 ** (j / per_decade)
    j = np.where(d <= lo, j - 1, j)
    hi = anchor * 10.0 ** ((j + 1) / per_decade)
    return np.where(d > hi, j + 1, j)


def _edges(anchor: float, j0: int, j1: int, per_decade: int) -> np.ndarray:
    """Edges of bins j0..j1 (inclusive); the anchor is exact where it is an edge."""
    j = np.arange(j0, j1 + 2)
    e = anchor * 10.0 ** (j / per_decade)
    e[j == 0] = anchor
    return e


def distance_histogram(nn_distance: np.ndarray, threshold: float, pairs: dict | None = None,
                       outside: np.ndarray | None = None) -> dict:
    """JSON-able histograms around ``threshold`` (allclose: atol).

    ``nn_distance``: the sampled records' nearest-neighbour distances (+inf: no
    neighbour; round-off negatives count as 0); ``pairs``: ``pair_histogram`` of every
    verified pair within tolerance (None: none); ``outside``: distances of the pairs just
    outside the tolerance that the borderline sample kept (for the zoomed panel).
    Both series share the main panel's log bins (``BINS_PER_DECADE`` per decade, the
    threshold an edge, bins (lo, hi]); the range covers the bins that hold data plus one
    bin either side of the threshold, so no decade on the axis is empty at either end.
    """
    if not np.isfinite(threshold) or threshold < 0:
        raise ValueError(f"need a finite threshold >= 0, got {threshold}")
    anchor = grid_anchor(threshold)
    d = np.asarray(nn_distance, dtype=np.float64).ravel()
    finite, none = np.isfinite(d), np.isposinf(d)
    if not (finite | none).all():
        raise ValueError("nn_distance holds NaN or -inf")
    fin = np.where(d[finite] > 0, d[finite], 0.0)  # round-off negatives and -0.0 become 0
    pos = fin[fin > 0]
    pairs = pairs or pair_histogram(np.empty(0), threshold)
    grid = np.asarray(pairs["counts"], np.int64)
    k0 = -PAIR_DECADES_BELOW * PAIR_BINS_PER_DECADE  # grid bin i: k = k0 + i
    merge = PAIR_BINS_PER_DECADE // BINS_PER_DECADE
    full = np.flatnonzero(grid)
    grid_j = (k0 + full) // merge  # main-panel bin of each non-empty grid bin
    nn_j = _bin_of(pos, anchor, BINS_PER_DECADE)
    used = np.concatenate([nn_j, grid_j, [-1, 0]])
    j0, j1 = int(used.min()), int(used.max())
    edges = _edges(anchor, j0, j1, BINS_PER_DECADE)
    nn_counts = np.bincount(nn_j - j0, minlength=j1 - j0 + 1)
    pair_counts = np.bincount(grid_j - j0, weights=grid[full],
                              minlength=j1 - j0 + 1).astype(np.int64)
    # the zoomed panel: the fine grid itself, threshold x 10^(+-ZOOM_DECADES)
    half = int(round(ZOOM_DECADES * PAIR_BINS_PER_DECADE))
    zk = np.arange(-half, half)
    z_edges = _edges(anchor, -half, half - 1, PAIR_BINS_PER_DECADE)
    z_pairs = grid[zk - k0]

    def zoomed(values: np.ndarray) -> list[int]:
        v = values[values > 0]
        k = _bin_of(v, anchor, PAIR_BINS_PER_DECADE)
        k = k[(k >= -half) & (k < half)]
        return np.bincount(k + half, minlength=2 * half).tolist()

    out_d = np.asarray(outside if outside is not None else [], np.float64)
    q = np.quantile(fin, [0.01, 0.5, 0.99]).tolist() if fin.size else None
    n_pairs = int(grid.sum() + pairs["zero"] + pairs["under"] + pairs["over"])
    at_or_below = int(grid[:-k0].sum() + pairs["zero"] + pairs["under"])
    return {
        "metric_threshold": float(threshold), "bins_per_decade": BINS_PER_DECADE,
        "edges": edges.tolist(),
        "pairs": {"n": n_pairs, "at_or_below_threshold": at_or_below,
                  "zero": int(pairs["zero"]), "below_range": int(pairs["under"]),
                  "above_range": int(pairs["over"]), "counts": pair_counts.tolist()},
        "nearest_neighbour": {"n": int(d.size), "zero": int(fin.size - pos.size),
                              "no_neighbour": int(none.sum()),
                              "below_threshold": int((fin <= threshold).sum()),
                              "counts": nn_counts.astype(np.int64).tolist(),
                              "quantiles": q and {"p01": q[0], "p50": q[1], "p99": q[2]}},
        "zoom": {"edges": z_edges.tolist(), "pairs": z_pairs.astype(np.int64).tolist(),
                 "outside_pairs": zoomed(out_d), "outside_pairs_n": int(out_d.size),
                 "nearest_neighbour": zoomed(pos)},
    }


def _plot(path: str, hist: dict, metric: str, note: str, removed: int | None,
          every: int) -> None:
    """Draw ``histogram_figure`` into a PNG at ``path``."""
    fig = histogram_figure(hist, metric, note, removed, every)
    try:
        fig.savefig(path, dpi=100, format="png", metadata={"Software": None})
    finally:
        fig.clear()


def histogram_figure(hist: dict, metric: str, note: str, removed: int | None,
                     every: int) -> Figure:
    """The 1100x600 figure: two panels and one legend below them; Figure + Agg canvas
    directly (no pyplot global state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

    fig = Figure(figsize=(11, 6), dpi=100)
    FigureCanvasAgg(fig)
    main, zoom = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    fig.subplots_adjust(bottom=0.3, top=0.93, left=0.07, right=0.98, wspace=0.22)
    t = hist["metric_threshold"]
    p, nn, z = hist["pairs"], hist["nearest_neighbour"], hist["zoom"]
    who = "every record" if every == 1 else f"1 in {every} records, chosen by digest"
    zero = f"; {p['zero']:,} at distance 0 not drawn" if p["zero"] else ""
    labels = {"pairs": f"verified pairs within tolerance, each pair once: {p['n']:,} "
                       f"(exact counts{zero})",
              "nn": f"nearest-neighbour distance of {nn['n']:,} records ({who}): the bulk",
              "out": f"pairs just outside the tolerance kept for borderline_pairs "
                     f"({z['outside_pairs_n']:,}; a sample, not all)",
              "t": f"threshold = {t:g}"}
    for ax, edges, pcounts, ncounts, extra in (
            (main, hist["edges"], p["counts"], nn["counts"], None),
            (zoom, z["edges"], z["pairs"], z["nearest_neighbour"], z["outside_pairs"])):
        e = np.asarray(edges)
        ax.bar(e[:-1], pcounts, width=np.diff(e), align="edge", color="tab:blue",
               edgecolor="white", linewidth=0.3, label=labels["pairs"])
        if extra is not None:
            ax.bar(e[:-1], extra, width=np.diff(e), align="edge", color="tab:orange",
                   alpha=0.85, edgecolor="white", linewidth=0.3, label=labels["out"])
        ax.stairs(ncounts, e, color="black", linewidth=1.2, label=labels["nn"])
        if t > 0:  # (allclose with atol 0: its rtol has no place on a distance axis)
            ax.axvline(t, color="red", linestyle="--", label=labels["t"])
        ax.set_xscale("log")
        ax.set_xlim(e[0], e[-1])
        count_axis(ax, max([*pcounts, *ncounts, *(extra or [])], default=0))
    lo, hi = hist["edges"][0], hist["edges"][-1]
    zoom_ticks = ([[t * f for f in fs] for fs in ZOOM_TICKS] if t > 0 else
                  _decade_ticks(z["edges"][0], z["edges"][-1]))
    for ax, choices in ((main, _decade_ticks(lo, hi)), (zoom, zoom_ticks)):
        ticks, names = _fitting_ticks(ax, choices, fig.canvas.get_renderer())
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FixedFormatter(names))
        ax.xaxis.set_minor_formatter(NullFormatter())
    main.set_xlabel(f"distance ({metric}), log scale")
    zoom.set_xlabel(f"distance ({metric}), near the threshold")
    what = f"{p['n']:,} pairs within tolerance"
    if removed is not None:
        what += f" -> {removed:,} records removed as near-duplicates"
    main.set_title(what, fontsize=10)
    zoom.set_title("around the threshold", fontsize=10)
    handles, names = zoom.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower left", bbox_to_anchor=(0.06, 0.06), ncol=2,
               fontsize=8, frameon=False)
    fig.text(0.01, 0.015, note, fontsize=8, wrap=True)
    return fig


# the zoomed panel's ticks, x the threshold, densest first (the threshold always one)
ZOOM_TICKS = ((0.4, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8), (0.5, 0.7, 1.0, 1.4, 2.0, 2.8),
              (0.4, 0.6, 1.0, 1.5, 2.5), (0.5, 1.0, 2.0), (1.0,))
TICK_GAP_PX = 8  # blank pixels at least between two tick labels


SMALL_COUNTS = (2, 3, 5)  # labelled where a count axis spans about one decade


def count_axis(ax, top: float) -> None:
    """A histogram's count axis: log scale up to ``top`` (linear from 0 when nothing is
    counted), labelled with counts as numbers ("2", "1,000"): matplotlib's own labels
    read "6 x 10^0" on the small samples a first run shows, and mixed "1e4" with
    "1e+05" further up."""
    from matplotlib.ticker import FuncFormatter

    if top <= 0:  # a log axis needs a positive count
        ax.set_ylim(0, 2.0)
        ax.set_yticks([0, 1, 2])
        ax.set_ylabel("count")
        return
    ax.set_yscale("log")
    ax.set_ylim(0.7, max(2.0, 1.6 * top))
    ax.set_ylabel("count (log scale)")
    few = 1.6 * top < 20  # an axis that ends below 20: 2, 3 and 5 labelled too

    def label(v: float, minor: bool) -> str:
        if v < 1 or (minor and not (few and round(v) in SMALL_COUNTS)):
            return ""
        return f"{v:,.0f}"

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: label(v, False)))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: label(v, True)))


def _decade_ticks(lo: float, hi: float) -> list[list[float]]:
    """Tick sets inside [lo, hi], densest first: 1, 2, 5 x 10^k (8 at most), every
    decade, then every 2nd, 3rd, 5th, ... decade (a range from float round-off at 1e-12
    to 1e3 holds 16 decades)."""
    k = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    sets = [[m * 10.0 ** e for e in k for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]]
    sets = [s for s in sets if len(s) <= 8]
    sets += [[10.0 ** e for e in k if e % step == 0 and lo <= 10.0 ** e <= hi]
             for step in (1, 2, 3, 5, 10, 20, 50, 100)]
    return [s for s in sets if len(s) >= 2] or [[lo, hi]]


def _fitting_ticks(ax, choices: list[list[float]], renderer) -> tuple[list[float], list[str]]:
    """The densest tick set whose labels, as drawn on ``ax`` (log x), leave
    ``TICK_GAP_PX`` between neighbours (10 decades of "1e-05" and "0.0001" ran together);
    the sparsest when none does."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    font = FontProperties(size=rcParams["xtick.labelsize"])
    x0, x1 = np.log10(ax.get_xlim())
    for ticks in choices:
        names = tick_labels(ticks)
        at = ax.bbox.x0 + (np.log10(ticks) - x0) / (x1 - x0) * ax.bbox.width
        half = np.array([renderer.get_text_width_height_descent(n, font, ismath=False)[0]
                         for n in names]) / 2
        if (np.diff(at) - half[:-1] - half[1:] >= TICK_GAP_PX).all():
            break
    return ticks, names


def tick_labels(ticks: list[float]) -> list[str]:
    """One form per axis, 3 significant digits at most: decimals (0.005, 1230) when
    every tick is in [0.001, 10^4), else 5e-05, 2.5e-04, 1e+00."""
    if all(1e-3 <= abs(v) < 1e4 for v in ticks):
        return [f"{float(f'{v:.3g}'):g}" for v in ticks]
    out = []
    for v in ticks:
        mantissa, exp = f"{v:.2e}".split("e")
        out.append(f"{float(mantissa):g}e{int(exp):+03d}")
    return out


def nulls_for_unknown(table: pa.Table) -> pa.Table:
    """-1 file/row (a stored record of an earlier run) -> null in the report."""
    for name in ("record_file", "record_row", "neighbour_file", "neighbour_row"):
        col = table.column(name)
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, pc.if_else(pc.less(col, 0), pa.scalar(None, col.type),
                                                     col))
    return table


def write_near_report(report_dir: str, nn_distance: np.ndarray, threshold: float, metric: str,
                      borderline: pa.Table, note: str, pairs: dict | None = None,
                      removed: int | None = None, every: int = 1,
                      drawing: list[Future] | None = None) -> dict:
    """Write near_distances.{json,csv,png} and borderline_pairs.parquet; return the json
    dict. ``pairs``: ``pair_histogram`` of the verified pairs within tolerance;
    ``removed``: the near removals (for the plot's title); ``every``: 1 in how many
    records got a nearest-neighbour distance. ``drawing``: the plot is left to draw
    while the caller goes on (its future is appended: the caller waits on it), so its
    0.6 s overlap the report page's reading back."""
    table = borderline.select(BORDERLINE_SCHEMA.names).cast(BORDERLINE_SCHEMA).sort_by(ORDER)
    outside = table.filter(pc.invert(table.column("within"))).column("distance").to_numpy()
    out = {**distance_histogram(nn_distance, threshold, pairs, outside), "metric": metric,
           "note": note, "nearest_neighbour_every": int(every),
           "removed": None if removed is None else int(removed)}
    with open(os.path.join(report_dir, layout.NEAR_DISTANCES + ".json"), "w") as f:
        json.dump(out, f, indent=2, allow_nan=False)
    with open(os.path.join(report_dir, layout.NEAR_DISTANCES + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["series", "bin_lo", "bin_hi", "count"])
        w.writerow(["pairs", 0, 0, out["pairs"]["zero"]])
        e = out["edges"]
        w.writerows(("pairs", lo, hi, c) for lo, hi, c in
                    zip(e[:-1], e[1:], out["pairs"]["counts"], strict=True))
        w.writerow(["nearest_neighbour", 0, 0, out["nearest_neighbour"]["zero"]])
        w.writerows(("nearest_neighbour", lo, hi, c) for lo, hi, c in
                    zip(e[:-1], e[1:], out["nearest_neighbour"]["counts"], strict=True))
        z = out["zoom"]["edges"]
        for series in ("pairs", "outside_pairs", "nearest_neighbour"):
            w.writerows((f"zoom_{series}", lo, hi, c) for lo, hi, c in
                        zip(z[:-1], z[1:], out["zoom"][series], strict=True))
    draw_and_write(report_dir, lambda png: _plot(png, out, metric, note, removed, every),
                   table, drawing)
    return out


def draw_and_write(report_dir: str, draw: Callable[[str], None], borderline: pa.Table,
                   drawing: list[Future] | None) -> None:
    """Start ``draw(png path)`` on the drawing thread (waited for here when ``drawing`` is
    None, else appended to it) and write borderline_pairs.parquet meanwhile."""
    plot = drawing_thread().submit(draw, os.path.join(report_dir,
                                                      layout.NEAR_DISTANCES + ".png"))
    if drawing is None:
        plot.result()
    else:
        drawing.append(plot)
    pq.write_table(nulls_for_unknown(borderline), os.path.join(report_dir, layout.BORDERLINE))
