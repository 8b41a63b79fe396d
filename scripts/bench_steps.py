"""Benchmark: `Dedup` over a user's records (dicts) in a plain Beam pipeline, against the
usual Beam idiom (key each record by `tensor.tobytes()`, group, keep one), same run.

Data: clustered unit embeddings (tests/embeddings.py) with 3% exact copies and 2% near
copies (cosine 0.001-0.01). Every contender runs in a fresh Beam FnApiRunner pipeline
in this process; the time is the whole pipeline (build + run). Writes a table and
bench-steps.json.

    python scripts/bench_steps.py [--n 200000] [--dim 128]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import apache_beam as beam
import numpy as np
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.steps import Dedup, NearSpec  # noqa: E402
from tests.embeddings import embeddings, rotated  # noqa: E402


def data(n: int, dim: int) -> list[dict]:
    rng = np.random.default_rng(0)
    base = embeddings(n, dim, clusters=max(n // 100, 2))
    exact = base[rng.choice(n, n * 3 // 100, replace=False)]
    src = rng.choice(n, n * 2 // 100, replace=False)
    near = rotated(base[src], rng.uniform(0.001, 0.01, len(src)), rng).astype(np.float32)
    x = np.concatenate([base, exact, near])
    x = x[rng.permutation(len(x))]
    return [{"id": f"r{i}", "emb": v} for i, v in enumerate(x)]


def _write(n: int, path: str) -> None:
    with open(path, "w") as f:
        f.write(str(n))


def run(records: list[dict], contender: str) -> tuple[float, dict]:
    path = tempfile.mktemp(suffix=".count")
    t0 = time.perf_counter()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        rec = p | beam.Create(records, reshuffle=False)
        if contender == "bytes-key idiom (exact)":
            kept = (rec | beam.Map(lambda r: (r["emb"].tobytes(), r))
                    | beam.GroupByKey() | beam.Map(lambda kv: next(iter(kv[1]))))
        else:
            near = NearSpec("cosine", 0.01) if "near" in contender else None
            kept = (rec | Dedup(key="emb", id="id", near=near))["kept"]
        kept | beam.combiners.Count.Globally() | beam.Map(_write, path)
    secs = time.perf_counter() - t0
    with open(path) as f:
        return secs, {"kept": int(f.read())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--json", default="bench-steps.json")
    args = ap.parse_args()
    records = data(args.n, args.dim)
    rows = []
    base = None
    for name in ("bytes-key idiom (exact)", "Dedup (exact)", "Dedup (exact + near cos 0.01)"):
        secs, counts = run(records, name)
        base = base or secs
        rows.append({"contender": name, "records": len(records), "seconds": round(secs, 2),
                     "ratio": round(secs / base, 2), "kept": counts.get("kept"),
                     "records_per_s": round(len(records) / secs)})
        print(f"{name:32s} {secs:8.2f} s  {secs / base:5.2f}x  kept {counts.get('kept'):,}",
              flush=True)
    with open(args.json, "w") as f:
        json.dump({"n": len(records), "dim": args.dim, "machine": "2 cores, FnApiRunner",
                   "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
