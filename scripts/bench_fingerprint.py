"""Benchmark fingerprint_batch against the memory-speed reference and hand-rolled keys.

Cases (issue 2): (a) 2 M rows x 4 int32, (b) 200 k rows x 256 float32,
(c) 64 tensors of 16 MB. Peers, in the same run: xxh3_128 over one contiguous
buffer of the same bytes (the memory-speed reference), and per-row
``pickle.dumps(t)``, ``tuple(t.tolist())``, ``hashlib.sha256(t.tobytes()).hexdigest()``.
Slow peers are timed on a prefix of the rows (their rate does not depend on N).

    python scripts/bench_fingerprint.py [--quick] [--json bench-fingerprint.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import platform
import time
from collections.abc import Callable

import numpy as np
import xxhash

from transforms.digests import SCHEME
from transforms.fingerprint import fingerprint_batch

PEER_SECONDS = 1.5  # time budget for each slow per-row peer


def _best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _per_row(key: Callable[[np.ndarray], object], rows: np.ndarray) -> tuple[float, int]:
    """Rows/s of a per-row key function, measured on as many rows as fit the time budget."""
    done, t0 = 0, time.perf_counter()
    while done < len(rows) and time.perf_counter() - t0 < PEER_SECONDS:
        for row in rows[done : done + 256]:
            key(row)
        done = min(len(rows), done + 256)
    return done / (time.perf_counter() - t0), done


def bench_case(label: str, batch: np.ndarray, repeats: int) -> list[dict]:
    n, nbytes = batch.shape[0], batch.nbytes
    results = []

    def add(method: str, seconds: float, rows: int, note: str = "") -> None:
        rate = rows / seconds
        results.append({"case": label, "method": method, "rows": rows,
                        "rows_per_s": rate, "gb_per_s": rate * nbytes / n / 1e9,
                        "seconds": seconds, "note": note})

    add("fingerprint_batch", _best_of(lambda: fingerprint_batch(batch), repeats), n)
    buf = np.ascontiguousarray(batch).reshape(-1).view(np.uint8)
    add("xxh3_128 one buffer (reference)",
        _best_of(lambda: xxhash.xxh3_128_digest(buf), repeats), n, "memory-speed reference")
    for method, key in [
        ("sha256(tobytes).hexdigest per row", lambda r: hashlib.sha256(r.tobytes()).hexdigest()),
        ("pickle.dumps per row", pickle.dumps),
        ("tuple(tolist()) per row", lambda r: tuple(r.tolist())),
    ]:
        rate, rows = _per_row(key, batch)
        add(method, rows / rate, rows, "" if rows == n else f"timed on {rows} rows")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs, finishes in < 30 s")
    ap.add_argument("--json", default="bench-fingerprint.json", help="where to write results")
    args = ap.parse_args()
    scale, repeats = (8, 2) if args.quick else (1, 3)
    rng = np.random.default_rng(0)
    cases = {
        "(a) 2M x 4 int32": rng.integers(-1000, 1000, (2_000_000 // scale, 4), dtype=np.int32),
        "(b) 200k x 256 float32": rng.standard_normal((200_000 // scale, 256), np.float32),
        "(c) 64 x 16 MB float32": rng.standard_normal((64 // scale, 4 << 20), np.float32),
    }
    rows: list[dict] = []
    for label, batch in cases.items():
        rows += bench_case(label, batch, repeats)
        del batch
    cases.clear()

    print(f"{'case':24} {'method':36} {'rows/s':>12} {'GB/s':>7}  note")
    for r in rows:
        print(f"{r['case']:24} {r['method']:36} {r['rows_per_s']:12,.0f} "
              f"{r['gb_per_s']:7.2f}  {r['note']}")
    summary = {}
    for label in dict.fromkeys(r["case"] for r in rows):
        by = {r["method"]: r for r in rows if r["case"] == label}
        ours = by["fingerprint_batch"]
        summary[label] = {
            "pct_of_reference_gbps": 100 * ours["gb_per_s"]
            / by["xxh3_128 one buffer (reference)"]["gb_per_s"],
            "x_sha256_rows_per_s": ours["rows_per_s"]
            / by["sha256(tobytes).hexdigest per row"]["rows_per_s"],
        }
    print()
    for label, s in summary.items():
        print(f"{label:24} fingerprint_batch = {s['pct_of_reference_gbps']:.0f}% of reference "
              f"GB/s, {s['x_sha256_rows_per_s']:.1f}x sha256-per-row rows/s")
    with open(args.json, "w") as f:
        json.dump({"scheme": SCHEME, "quick": args.quick, "machine": platform.platform(),
                   "processor": platform.processor(), "results": rows, "summary": summary},
                  f, indent=2)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
