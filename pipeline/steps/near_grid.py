"""The fixed grid pair distances are counted on, anchored at the threshold.

Why a grid: the cells send counts (a few hundred integers) to the report, not one
float per pair, however many pairs there are.
"""

from __future__ import annotations

import numpy as np

# Verified pair distances are counted on a fixed grid anchored at the threshold, so the
# merge sends counts (a few hundred ints), not one float per pair, to the report:
# PAIR_BINS_PER_DECADE bins per decade from PAIR_DECADES_BELOW decades below the
# threshold to PAIR_DECADES_ABOVE above it (allclose distances may exceed atol when
# rtol > 0); bins are (lo, hi], so a pair at the threshold counts at or below it.
PAIR_BINS_PER_DECADE = 40
PAIR_DECADES_BELOW = 12
PAIR_DECADES_ABOVE = 2


def grid_anchor(marker: float) -> float:
    """The grid's anchor: the threshold (allclose: atol), or 1.0 when that is 0."""
    return float(marker) if marker > 0 and np.isfinite(marker) else 1.0


def pair_grid_edges(marker: float) -> np.ndarray:
    """The fixed grid's edges (float64, increasing; the threshold is one of them)."""
    k = np.arange(-PAIR_DECADES_BELOW * PAIR_BINS_PER_DECADE,
                  PAIR_DECADES_ABOVE * PAIR_BINS_PER_DECADE + 1)
    edges = grid_anchor(marker) * 10.0 ** (k / PAIR_BINS_PER_DECADE)
    edges[k == 0] = grid_anchor(marker)
    return edges


def pair_histogram(dist: np.ndarray, marker: float) -> dict:
    """Counts of pair distances on the fixed grid: {"zero", "under" (above 0, below the
    grid), "counts" (per bin), "over" (above the grid)}."""
    d = np.asarray(dist, np.float64)
    edges = pair_grid_edges(marker)
    pos = d[d > 0]
    idx = np.searchsorted(edges, pos, side="left") - 1  # bin i holds (edges[i], edges[i+1]]
    counts = np.bincount(idx[(idx >= 0) & (idx < len(edges) - 1)], minlength=len(edges) - 1)
    return {"zero": int((d <= 0).sum()), "under": int((idx < 0).sum()),
            "counts": counts.astype(np.int64), "over": int((idx >= len(edges) - 1).sum())}


def weighted_sum(parts: list[tuple[dict, float]], marker: float) -> dict:
    """Histograms on the grid of ``marker`` added up, each counted ``weight`` times (a
    sampled part stands for more pairs), rounded back to whole counts."""
    out = {k: np.asarray(v, np.float64) for k, v in pair_histogram(np.empty(0), marker).items()}
    for hist, weight in parts:
        for k in out:
            out[k] = out[k] + np.asarray(hist[k], np.float64) * weight
    return {k: (np.rint(v).astype(np.int64) if k == "counts" else int(round(float(v))))
            for k, v in out.items()}
