"""Benchmark near-duplicate search: this kernel vs what users write, on planted data.

Data: N x 128 float32 vectors around 1,000 cluster centres, 5% planted near copies at
0.5-0.95 x the threshold (L2) and 2% decoys at 1.02-1.2 x, in random directions.
Contenders (keep first, representative grouping for ours):
- this kernel, default settings (index auto) and partitioned (flat inside k-means
  partitions, exact by construction);
- the hand-written baseline: faiss.IndexFlatL2 range_search over everything (radius t^2)
  plus union-find, keep the first of each component;
- quantize-round-hash: the core's quantized fingerprint with step t, keep first per digest.
The oracle is this kernel with a flat index over everything (an exact superset search,
verified in float64). Recall = oracle removals found; precision = removals that are
within tolerance of the record they are merged into. Prints a table, writes JSON.

Usage: python scripts/bench_near.py [--rows 200000] [--json bench-near.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np

from transforms.fingerprint import quantized_fingerprint_batch
from transforms.near import NearSpec, exact_distance, near_duplicates

DIM, THRESHOLD = 128, 0.5


def make_data(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_near, n_decoy = int(n * 0.05), int(n * 0.02)
    n_base = n - n_near - n_decoy
    centers = rng.standard_normal((1000, DIM)) * 3
    base = centers[rng.integers(0, 1000, n_base)] + rng.standard_normal((n_base, DIM))

    def moved(rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
        u = rng.standard_normal(rows.shape)
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        return rows + u * (THRESHOLD * rng.uniform(lo, hi, (len(rows), 1)))

    near = moved(base[rng.choice(n_base, n_near)], 0.5, 0.95)
    decoys = moved(base[rng.choice(n_base, n_decoy)], 1.02, 1.2)
    x = np.concatenate([base, near, decoys]).astype(np.float32)
    return x[rng.permutation(n)]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def first_of_groups(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(removed, kept) keeping the first row of each label."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    keeper = first[inverse]
    removed = np.flatnonzero(keeper != np.arange(len(labels)))
    return removed, keeper[removed]


def flat_union_find(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    lims, _, ids = index.range_search(x, THRESHOLD**2)
    parent = list(range(len(x)))

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    rows = np.repeat(np.arange(len(x)), np.diff(lims.astype(np.int64)))
    for a, b in zip(rows.tolist(), ids.tolist(), strict=True):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return first_of_groups(np.array([find(u) for u in range(len(x))]))


def quantize_hash(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    digests = quantized_fingerprint_batch(x, step=THRESHOLD)
    return first_of_groups(np.unique(digests, return_inverse=True)[1])


def score(x, removed, kept, oracle_removed, spec) -> dict:
    _, ok = exact_distance(x[removed], x[kept], spec)
    hit = len(set(removed.tolist()) & oracle_removed)
    return {"removed": len(removed), "recall": hit / max(len(oracle_removed), 1),
            "precision": float(ok.mean()) if len(ok) else 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--json", default="bench-near.json")
    args = ap.parse_args()
    x = make_data(args.rows)
    rank = np.arange(len(x))
    spec = NearSpec("l2", threshold=THRESHOLD)

    (o_removed, _, _), t_oracle = timed(
        lambda: near_duplicates(x, rank, NearSpec("l2", threshold=THRESHOLD, index="flat"),
                                partitions=1))
    oracle = set(o_removed.tolist())
    results = {}
    runs = {
        "this kernel (index auto)": lambda: near_duplicates(x, rank, spec)[:2],
        f"this kernel (partitioned {args.partitions}, flat)": lambda: near_duplicates(
            x, rank, NearSpec("l2", threshold=THRESHOLD, index="flat"),
            partitions=args.partitions)[:2],
        "baseline: IndexFlatL2 range_search + union-find": lambda: flat_union_find(x),
        "quantize-round-hash (step = threshold)": lambda: quantize_hash(x),
    }
    for name, fn in runs.items():
        (removed, kept), secs = timed(fn)
        results[name] = {"seconds": secs, **score(x, removed, kept, oracle, spec)}
    results["oracle (this kernel, flat over everything)"] = {
        "seconds": t_oracle, "removed": len(oracle), "recall": 1.0, "precision": 1.0}
    base = results["baseline: IndexFlatL2 range_search + union-find"]["seconds"]
    print(f"\nnear-duplicates, {args.rows:,} x {DIM} float32, L2 threshold {THRESHOLD}")
    print(f"{'contender':<50}{'seconds':>9}{'vs flat':>9}{'removed':>9}{'recall':>8}"
          f"{'precision':>11}")
    for name, r in results.items():
        print(f"{name:<50}{r['seconds']:>9.2f}{base / r['seconds']:>8.1f}x{r['removed']:>9,}"
              f"{r['recall']:>8.4f}{r['precision']:>11.4f}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the whole run: {rss:.0f} MB")
    Path(args.json).write_text(json.dumps({"rows": args.rows, "results": results,
                                           "peak_rss_mb": rss}, indent=2))


if __name__ == "__main__":
    main()
