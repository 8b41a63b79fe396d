"""Benchmark incremental dedup: what a run costs as the fingerprint store's history grows.

Part 1, lookups (no Beam): a store holding H earlier records, written as 16 runs of
H/16 records in 16 digest-range parts (as the job writes them) and compacted after each
commit (as the job's Publish step does), is asked about N new digests (10% of them
stored), one shard at a time as the job's Exact step asks. Peers in the same run:
reading every stored digest and testing membership with numpy (a sort-merge join) and
a Python set of the stored digests (the usual script). Reported: wall time, segments
opened, bytes the store read, peak memory growth, and the compaction time spent while
building the history.

Part 2, the job: day after day, N new records per day (10% exact copies of earlier
days, 5% near copies), ``python -m pipeline.run`` with a store (exact only, and with
the near stage), one fresh process per run; the same day's job without a store is the
floor. Reported: wall time and peak RSS per day, so growth with history is visible.

Usage: python scripts/bench_incremental.py [--quick] [--only lookups|days]
                                           [--json bench-incremental.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import PEAK_RSS_MB, ROOT, run_python

SHARDS, DIM, RUNS = 16, 32, 16


def shard_of(words: np.ndarray) -> np.ndarray:
    from pipeline.steps.fingerprint import shard_of as job_shard_of  # the job's range shards

    return job_shard_of(words, SHARDS)


def random_words(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**64, (n, 2), dtype=np.uint64)


def build_store(path: str, history: int, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """RUNS runs of history/RUNS records, each committed then compacted like the job."""
    from transforms.store.store import FingerprintStore

    store, kept, compact_s = FingerprintStore(path), [], []
    per_run = history // RUNS
    for r in range(RUNS):
        words = random_words(rng, per_run)
        attempt = store.begin(f"day{r:03d}")
        ids = pa.array(np.char.add(f"day{r}-", np.arange(per_run).astype(str)))
        shard = shard_of(words)
        parts = [attempt.write_exact(s, words[shard == s], ids.filter(pa.array(shard == s)))
                 for s in range(SHARDS)]
        store.commit(attempt, parts, {"dtype": "float32"})
        start = time.perf_counter()
        store.compact()
        compact_s.append(time.perf_counter() - start)
        kept.append(words)
    return np.concatenate(kept), {"compact_total_s": sum(compact_s),
                                  "compact_max_s": max(compact_s),
                                  "units": len({s.unit for s in store.plan().segments})}


def lookup_store(path: str, queries: np.ndarray) -> dict:
    from transforms.store.store import FingerprintStore

    store, found = FingerprintStore(path), 0
    stats = {"segments_opened": 0, "bytes_read": 0}
    tracemalloc.start()
    start = time.perf_counter()
    plan = store.plan()  # once, as the job fixes it when it starts
    shard = shard_of(queries)
    for s in range(SHARDS):
        hit, _, _ = store.lookup(queries[shard == s], plan=plan)
        found += int(hit.sum())
        for k in stats:
            stats[k] += store.last_lookup_stats[k]
    wall = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"wall_s": wall, "found": found, "peak_mb": peak / 2**20,
            "segments": len(plan.segments), **stats}


def stored_digests(path: str) -> list[np.ndarray]:
    """Every stored digest, segment by segment, as (n, 2) uint64."""
    from transforms.store.segment import read_all
    from transforms.store.store import FingerprintStore

    out = []
    for seg in FingerprintStore(path).plan().segments:
        keys = read_all(seg.path)[0]
        out.append(np.column_stack([keys["hi"], keys["lo"]]))
    return out


def scan_numpy(path: str, queries: np.ndarray) -> dict:
    """Peer: read every stored digest, then a sorted membership test."""
    tracemalloc.start()
    start = time.perf_counter()
    stored = np.concatenate(stored_digests(path))
    key = np.ascontiguousarray(stored).view([("hi", "<u8"), ("lo", "<u8")]).ravel()
    q = np.ascontiguousarray(queries).view([("hi", "<u8"), ("lo", "<u8")]).ravel()
    found = int(np.isin(q, key).sum())
    wall = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"wall_s": wall, "found": found, "peak_mb": peak / 2**20}


def python_set(path: str, queries: np.ndarray) -> dict:
    """Peer: the usual script: every stored digest in a Python set of bytes."""
    tracemalloc.start()
    start = time.perf_counter()
    seen = set()
    for w in stored_digests(path):
        raw = w.tobytes()
        seen.update(raw[i:i + 16] for i in range(0, len(raw), 16))
    raw = np.ascontiguousarray(queries).tobytes()
    found = sum(raw[i:i + 16] in seen for i in range(0, len(raw), 16))
    wall = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"wall_s": wall, "found": found, "peak_mb": peak / 2**20}


def bench_lookups(histories: list[int], news: list[int], peers_up_to: int) -> list[dict]:
    rows = []
    for h in histories:
        rng = np.random.default_rng(h)
        tmp = tempfile.mkdtemp(prefix="bench-store-")
        try:
            start = time.perf_counter()
            stored, built = build_store(tmp, h, rng)
            built["build_s"] = time.perf_counter() - start
            for new in news:
                queries = random_words(rng, new)
                hits = rng.choice(len(stored), new // 10, replace=False)
                queries[: len(hits)] = stored[hits]
                res = {"history": len(stored), "new": new, "build": built,
                       "store": lookup_store(tmp, queries)}
                if len(stored) <= peers_up_to:
                    res["numpy_scan"] = scan_numpy(tmp, queries)
                if len(stored) <= min(peers_up_to, 4_000_000):
                    res["python_set"] = python_set(tmp, queries)
                assert all(r["found"] == len(hits) for k, r in res.items()
                           if isinstance(r, dict) and "found" in r), res
                rows.append(res)
        finally:
            shutil.rmtree(tmp)
    return rows


DAY_JOB = """
import json, sys, time
sys.argv = ["x"]
from pipeline.run import main
rc = main({argv!r})
assert rc == 0, rc
s = json.load(open({summary!r}))
print(json.dumps({{"rc": rc, "wall_s": s["wall_time_s"], "kept": s["kept"],
                  "removed": {{k: v for k, v in s.items() if k.startswith("removed_") and v}},
                  "peak_rss_mb": {peak}}}))
"""


def make_day(path: Path, day: int, n: int, earlier: list[np.ndarray]) -> np.ndarray:
    rng = np.random.default_rng(1000 + day)
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    if earlier:
        pool = np.concatenate(earlier)
        k = n // 10
        x[:k] = pool[rng.integers(0, len(pool), k)]
        m = n // 20
        x[k:k + m] = pool[rng.integers(0, len(pool), m)] + 0.01 * rng.standard_normal(
            (m, DIM), dtype=np.float32)
    x = x[rng.permutation(n)]
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM)
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"d{day}-{i}" for i in range(n)], "emb": emb}),
                   path / "part-0.parquet", row_group_size=65536)
    return x


def bench_days(days: int, n: int, near: bool) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="bench-days-"))
    rows, earlier = [], []
    try:
        for d in range(days):
            earlier.append(make_day(work / f"in{d}", d, n, earlier))
            row = {"day": d + 1, "history_before": d * n}
            for label, store in (("with_store", True), ("no_store", False)):
                out = work / label
                cfg = {"input": {"format": "parquet", "path": str(work / f"in{d}" / "*.parquet"),
                                 "tensor": "emb", "id": "id"},
                       "output": {"path": str(out / "{run_id}" / "clean")},
                       "report": str(out / "{run_id}" / "report")}
                if store:
                    cfg["store"] = {"path": str(work / "store")}
                if near:
                    cfg["near"] = {"metric": "l2", "threshold": 0.05}
                cfg_path = work / f"{label}.json"
                cfg_path.write_text(json.dumps(cfg))  # JSON is YAML
                argv = ["--config", str(cfg_path), "--quiet", "--run-id", f"day{d}"]
                src = DAY_JOB.format(argv=argv, peak=PEAK_RSS_MB,
                                     summary=str(out / f"day{d}" / "report" / "summary.json"))
                res, wall = run_python(src)
                row[label] = {**res, "process_s": wall}
            rows.append(row)
    finally:
        shutil.rmtree(work)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench-incremental.json")
    ap.add_argument("--only", choices=["lookups", "days"])
    args = ap.parse_args()
    histories = [100_000, 400_000] if args.quick else [
        1_000_000, 4_000_000, 16_000_000, 64_000_000]
    news = [1_000, 10_000] if args.quick else [10_000, 100_000]
    out = {"shards": SHARDS, "runs_per_history": RUNS}
    if args.only in (None, "lookups"):
        out["lookups"] = bench_lookups(histories, news, 16_000_000)
        print(f"\nlookups of N new digests (10% stored), per shard as the job asks; history "
              f"in {RUNS} runs x {SHARDS} parts, compacted as it was built")
        print(f"{'history':>11} {'new':>8} | {'store s':>8} {'segments':>9} {'MB read':>8} "
              f"{'peak MB':>8} | {'numpy scan s':>12} {'ratio':>6} | {'py set s':>9} "
              f"{'ratio':>6} | {'compaction s':>12}")
        for r in out["lookups"]:
            st, sc, ps = r["store"], r.get("numpy_scan"), r.get("python_set")
            print(f"{r['history']:>11,} {r['new']:>8,} | {st['wall_s']:>8.3f} "
                  f"{st['segments_opened']:>4}/{st['segments']:<4} "
                  f"{st['bytes_read'] / 2**20:>8.1f} {st['peak_mb']:>8.1f} | "
                  + (f"{sc['wall_s']:>12.3f} {sc['wall_s'] / st['wall_s']:>5.1f}x | " if sc
                     else f"{'-':>12} {'-':>6} | ")
                  + (f"{ps['wall_s']:>9.2f} {ps['wall_s'] / st['wall_s']:>5.1f}x" if ps
                     else f"{'-':>9} {'-':>6}")
                  + f" | {r['build']['compact_total_s']:>12.1f}")
    if args.only in (None, "days"):
        days, n = (3, 20_000) if args.quick else (4, 100_000)
        for near in (False, True):
            key = "days_near" if near else "days_exact"
            out[key] = bench_days(days, n, near)
            print(f"\njob, {n:,} new records per day x {DIM} float32"
                  f"{', near l2 0.05' if near else ', exact only'}")
            print(f"{'day':>4} {'history':>10} | {'store s':>8} {'RSS MB':>7} {'removed':>30} | "
                  f"{'no store s':>10} {'RSS MB':>7} | {'ratio':>6}")
            for r in out[key]:
                w, f = r["with_store"], r["no_store"]
                print(f"{r['day']:>4} {r['history_before']:>10,} | {w['process_s']:>8.1f} "
                      f"{w['peak_rss_mb']:>7.0f} {json.dumps(w['removed']):>30} | "
                      f"{f['process_s']:>10.1f} {f['peak_rss_mb']:>7.0f} | "
                      f"{w['process_s'] / f['process_s']:>5.2f}x")
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.json} (run from {ROOT})")


if __name__ == "__main__":
    main()
