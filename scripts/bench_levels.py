"""Cells of bounded size at any n (issue 44): what one and two levels of cells cost and
lose on the growth benchmark's data, in the kernel, and why a centroid index does not
narrow the search there.

Data: scripts/bench_growth.py's 128-d embedding-like unit vectors (2,000 topics), with
near copies of 4% of the rows at cosine 0.0005-0.009 planted over other rows; cosine
0.01, bounded mode (3 probes), the planning sample of 200,000 rows the job would draw.

Per layout (``transforms.near.plan``: ``plan`` then ``assign`` on every row): CPU seconds
to plan and to assign, cells joined per row, pairs compared per record (home rows x
members, summed over cells, over n: what summary.json reports), the largest cell, and the
planted pairs that meet in no cell (neither record joins the other's home: the search
cannot find them, whatever happens next).

And one level whose cells are each cut again inside (``split_cells``: what the decide
step could do with a cell's rows, which it holds anyway).

Then, for 100,000 rows and the two-level centroids: how often a record's nearest fine
centroid (over all of them) lies among the fine cells of its m nearest coarse cells,
and how often a greedy walk over the fine centroids' K-nearest-centroid graph (from the
nearest fine centroid of the nearest coarse cell) reaches it. Near 1 would mean an index
over centroids could replace scoring every centroid (n x cells x d) at constant cost.

    python scripts/bench_levels.py [--rows 2000000] [--json bench-levels.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from bench_growth import THRESHOLD, Shape  # (this script's folder is on sys.path)

from transforms.near import plan as cells
from transforms.near.search import centred

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.embeddings import rotated  # noqa: E402

SAMPLE, PROBES = 200_000, 3  # the job's planning sample, bounded mode's default probes
PARTITION_ROWS, SINGLE = 1_000, 20_000  # near.partition_rows, near.single_index_rows


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(rows, planted pairs (m, 2): source, copy)."""
    rng = np.random.default_rng(seed)
    shape = Shape(seed)
    x = np.concatenate([shape.draw(min(200_000, n - s), rng) for s in range(0, n, 200_000)])
    m = n // 25
    src = rng.choice(n, m, replace=False)
    dst = rng.choice(np.setdiff1d(np.arange(n), src), m, replace=False)
    x[dst] = rotated(x[src], rng.uniform(0.0005, 0.009, m), rng).astype(np.float32)
    return x, np.stack([src, dst], 1)


def layout(x: np.ndarray, pairs: np.ndarray, sample: np.ndarray, levels: int, k: int,
           name: str) -> dict:
    radius = math.sqrt(2 * THRESHOLD)
    t = time.process_time()
    parts = cells.plan(sample, len(x), radius, "bounded", PROBES, k, levels=levels)
    planned = time.process_time() - t
    t = time.process_time()
    a = cells.assign(centred(x, parts.mean, np.float32), parts)
    assigned = time.process_time() - t
    p = len(parts)
    home = np.bincount(a.home, minlength=p).astype(float)
    members = np.bincount(a.cells, minlength=p)
    joined = np.sort(a.rows * p + a.cells)

    def joins(r: np.ndarray, c: np.ndarray) -> np.ndarray:
        q = r * p + c
        return joined[np.minimum(np.searchsorted(joined, q), len(joined) - 1)] == q

    s, d = pairs[:, 0], pairs[:, 1]
    meet = joins(s, a.home[d]) | joins(d, a.home[s])
    return {"layout": name, "rows": len(x), "cells": p,
            "coarse": 0 if parts.coarse is None else len(parts.coarse),
            "plan_cpu_s": round(planned, 1), "assign_cpu_s": round(assigned, 1),
            "joins_per_row": round(len(a.rows) / len(x), 2),
            "pairs_per_record": round(float(home @ members) / len(x)),
            "largest_cell": int(members.max()), "planted": len(pairs),
            "never_meet": int((~meet).sum())}


def split_cells(x: np.ndarray, pairs: np.ndarray, sample: np.ndarray, k: int, name: str
                ) -> dict:
    """One level of cells of sqrt n rows (the default, ``layout``), then each cell cut
    into cells of about PARTITION_ROWS of its own home rows, trained on them (where the
    job's decide step holds a cell's rows anyway, so no other shuffle): a cell's members
    join its cells by the one-level rule, bounded by PROBES. A pair meets where one
    record's home cell holds the other and, inside it, the other joins the first's
    sub-cell."""
    radius = math.sqrt(2 * THRESHOLD)
    t = time.process_time()
    parts = cells.plan(sample, len(x), radius, "bounded", PROBES, k)
    planned = time.process_time() - t
    t = time.process_time()
    a = cells.assign(centred(x, parts.mean, np.float32), parts)
    assigned = time.process_time() - t
    o = np.argsort(a.cells, kind="stable")
    cuts = np.searchsorted(a.cells[o], np.arange(len(parts) + 1))
    sub_home = np.full(len(x), -1, np.int64)  # each row's sub-cell inside its home cell
    placed = []  # (row, home cell of the row it may meet there, sub-cell) per placement
    compared, subcells, joins, t = 0.0, 0, 0, time.process_time()
    for c in range(len(parts)):
        members = a.rows[o[cuts[c]:cuts[c + 1]]]
        home = members[a.home[members] == c]
        kc = max(1, round(len(home) / PARTITION_ROWS))
        if kc == 1 or len(home) < 2 * PROBES:
            sub_home[home] = subcells
            placed.append(np.stack([members, np.full(len(members), subcells)], 1))
            compared += len(home) * len(members)
            subcells += 1
            joins += len(members)
            continue
        sub = cells.plan(x[home], len(members), radius, "bounded", PROBES, kc)
        sa = cells.assign(centred(x[members], sub.mean, np.float32), sub)
        mine = a.home[members] == c
        sub_home[members[mine]] = subcells + sa.home[mine]
        placed.append(np.stack([members[sa.rows], subcells + sa.cells], 1))
        h = np.bincount(sa.home[mine], minlength=len(sub)).astype(float)
        compared += float(h @ np.bincount(sa.cells, minlength=len(sub)))
        subcells += len(sub)
        joins += len(sa.rows)
    split = time.process_time() - t
    both = np.concatenate(placed)
    key = np.sort(both[:, 0] * subcells + both[:, 1])

    def joins_sub(r: np.ndarray, s: np.ndarray) -> np.ndarray:
        q = r * subcells + s
        return key[np.minimum(np.searchsorted(key, q), len(key) - 1)] == q

    src, dst = pairs[:, 0], pairs[:, 1]
    meet = joins_sub(src, sub_home[dst]) | joins_sub(dst, sub_home[src])
    return {"layout": name, "rows": len(x), "cells": subcells, "coarse": len(parts),
            "plan_cpu_s": round(planned, 1), "assign_cpu_s": round(assigned + split, 1),
            "joins_per_row": round(joins / len(x), 2),
            "pairs_per_record": round(compared / len(x)),
            "largest_cell": int(np.bincount(both[:, 1]).max()), "planted": len(pairs),
            "never_meet": int((~meet).sum())}


def coverage(x: np.ndarray, sample: np.ndarray, rows: int, seed: int = 1) -> dict:
    """Where a record's nearest fine centroid lies, seen from the coarse cells and from a
    graph over the fine centroids."""
    k = cells.partition_count(len(x), SINGLE, PARTITION_ROWS, 2)
    held = np.arange(len(sample)) % 5 == 4
    mean, fine, coarse, start = cells.train_levels(sample[~held], k, 0, None,
                                                   merge_within=math.sqrt(2 * THRESHOLD))
    rng = np.random.default_rng(seed)
    z = centred(x[rng.choice(len(x), rows, replace=False)], mean, np.float32).v
    z = z.astype(np.float64)
    fsq = np.einsum("ij,ij->i", fine, fine)
    f = np.concatenate([fsq[None] - 2 * z[i:i + 10_000] @ fine.T
                        for i in range(0, len(z), 10_000)])
    nearest = f.argmin(1)
    owner = np.searchsorted(start, np.arange(len(fine)), side="right") - 1
    by_coarse = np.argsort(np.einsum("ij,ij->i", coarse, coarse)[None] - 2 * z @ coarse.T, 1)
    rank = (by_coarse == owner[nearest][:, None]).argmax(1)
    out = {"cells": len(fine), "coarse": len(coarse), "records": rows,
           "nearest_in_m_nearest_coarse": {m: round(float((rank < m).mean()), 4)
                                           for m in (1, 2, 4, 8, 12)}, "graph": {}}
    h1 = by_coarse[:, 0]
    guess = np.empty(len(z), np.int64)
    for c in range(len(coarse)):
        at = h1 == c
        guess[at] = start[c] + f[at, start[c]:start[c + 1]].argmin(1)
    near_centroids = np.argsort(fsq[:, None] + fsq[None] - 2 * fine @ fine.T, 1)
    for kk in (16, 32, 64, 128):
        graph, cur = near_centroids[:, :kk + 1], guess
        for _ in range(20):
            cand = graph[cur]
            new = cand[np.arange(len(z)), np.take_along_axis(f, cand, 1).argmin(1)]
            if (new == cur).all():
                break
            cur = new
        out["graph"][kk] = round(float((cur == nearest).mean()), 4)
    return out


def table(rows: list[dict], cov: dict) -> str:
    lines = ["| layout | cells (coarse) | plan CPU s | assign CPU s | joins / row | pairs "
             "compared / record | largest cell | planted pairs that never meet |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        coarse = f" ({r['coarse']})" if r["coarse"] else ""
        lines.append(f"| {r['layout']} | {r['cells']:,}{coarse} | {r['plan_cpu_s']} | "
                     f"{r['assign_cpu_s']} | {r['joins_per_row']} | {r['pairs_per_record']:,}"
                     f" | {r['largest_cell']:,} | {r['never_meet']} of {r['planted']:,} "
                     f"({r['never_meet'] / r['planted']:.3%}) |")
    m = cov["nearest_in_m_nearest_coarse"]
    lines += ["", f"{cov['records']:,} records, {cov['cells']:,} fine centroids in "
              f"{cov['coarse']} coarse cells: the nearest fine centroid lies in the record's "
              + ", ".join(f"{k} nearest coarse cell(s) for {v:.1%}" for k, v in m.items())
              + "; a greedy walk over each centroid's K nearest centroids reaches it for "
              + ", ".join(f"{v:.1%} (K={k})" for k, v in cov["graph"].items()) + "."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--coverage-rows", type=int, default=100_000)
    ap.add_argument("--json", default="bench-levels.json")
    args = ap.parse_args()
    n = args.rows
    x, pairs = data(n)
    rng = np.random.default_rng(1)
    sample = x[np.sort(rng.choice(n, min(SAMPLE, n), replace=False))]
    one = cells.partition_count(n, SINGLE, PARTITION_ROWS, 1)
    flat = cells.partition_count(n, SINGLE, PARTITION_ROWS, 2)
    rows = [layout(x, pairs, sample, 1, one, "one level, cells of sqrt n rows (default)"),
            layout(x, pairs, sample, 1, flat, f"one level, cells of {PARTITION_ROWS:,} rows"),
            layout(x, pairs, sample, 2, flat, "two levels (`near.levels: 2`)"),
            split_cells(x, pairs, sample, one, f"one level, each cell cut into cells of "
                        f"{PARTITION_ROWS:,} of its home rows")]
    for r in rows:
        print(json.dumps(r), flush=True)
    cov = coverage(x, sample, args.coverage_rows)
    print(table(rows, cov))
    Path(args.json).write_text(json.dumps({"layouts": rows, "coverage": cov}, indent=1))


if __name__ == "__main__":
    main()
