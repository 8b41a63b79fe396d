"""How the vector near job's cost grows with n (issue 44): the same data shape at each size,
whole CLI processes one after another, default near settings but the threshold.

Data: 128-d unit vectors shaped like embeddings (tests/embeddings.py: a shared direction,
2,000 topics of Zipf-like sizes, anisotropic noise), 4% exact copies and 4% planted near
copies (cosine distance uniform in 0.0005-0.009 from a row of the same or the previous
file), written as 8 Parquet files (FixedSizeList<float32>), ids ``r<row>``.

Per size: wall seconds, CPU seconds of the process tree (the job's rusage of reaped
children), peak RSS of the tree (polled every 0.1 s) against max(3 GB, 3x the tensor
bytes), the plan (mode, levels, cells), summary.json's pairs compared per record, the printed
recall and its interval, planted recall (share of planted near pairs with either side
removed) and precision (every near removal's cosine distance to the record it names,
recomputed in float64 from the data). Growth: each size's wall and CPU over the
smallest's, and the exponent log(ratio) / log(n ratio).

    python scripts/bench_growth.py --rows 1000000 --rows 8000000 [--code DIR] [--set near.levels=1]

``--code DIR`` runs the job from another checkout (landed main, for before/after);
``--set`` passes ``--set`` overrides to the job. Writes bench-growth.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchkit import ROOT, run_watched  # noqa: E402

from tests.embeddings import rotated  # noqa: E402

DIM = 128
FILES = 8
THRESHOLD = 0.01
CLUSTERS = 2000


class Shape:
    """The embedding-like generator of tests/embeddings.py, drawn a block at a time."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.mean = rng.standard_normal(DIM)
        self.mean /= np.linalg.norm(self.mean)
        self.topics = rng.standard_normal((CLUSTERS, DIM))
        self.topics /= np.linalg.norm(self.topics, axis=1, keepdims=True)
        self.basis, _ = np.linalg.qr(rng.standard_normal((DIM, DIM)))
        self.scale = (np.arange(DIM) + 1.0) ** -0.5
        weight = np.minimum(rng.zipf(1.3, CLUSTERS), 200).astype(float)
        self.p = weight / weight.sum()
        self.spread = rng.uniform(0.6, 1.4, CLUSTERS)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        t = rng.choice(CLUSTERS, n, p=self.p)
        noise = (rng.standard_normal((n, DIM)) * self.scale) @ self.basis.T
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        v = (np.sqrt(0.29) * self.mean + np.sqrt(0.36) * self.topics[t]
             + (np.sqrt(0.35) * self.spread[t])[:, None] * noise)
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def make(n: int, folder: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The files, x.npy (all rows, row i = id r<i>) and the planted near pairs (m, 2)."""
    folder.mkdir(parents=True, exist_ok=True)
    shape, per = Shape(seed), math.ceil(n / FILES)
    x = np.lib.format.open_memmap(folder / "x.npy", "w+", np.float32, (n, DIM))
    pairs, prev = [], None
    for f in range(FILES):
        a, b = f * per, min(n, (f + 1) * per)
        rng = np.random.default_rng((seed, f))
        m = b - a
        n_exact, n_near = int(m * 0.04), int(m * 0.04)
        base = m - n_exact - n_near
        block = np.empty((m, DIM), np.float32)
        for s in range(0, base, 200_000):
            block[s:min(base, s + 200_000)] = shape.draw(min(base, s + 200_000) - s, rng)
        pool = np.arange(base) + a if prev is None else np.r_[np.arange(base) + a, prev]
        src = rng.choice(pool, n_exact + n_near)
        srcv = np.where((src >= a)[:, None], block[np.clip(src - a, 0, m - 1)],
                        x[np.clip(src, 0, n - 1)] if prev is not None else 0)
        block[base:base + n_exact] = srcv[:n_exact]
        block[base + n_exact:] = rotated(srcv[n_exact:], rng.uniform(0.0005, 0.009, n_near),
                                         rng).astype(np.float32)
        perm = rng.permutation(m)
        where = np.empty(m, np.int64)
        where[perm] = np.arange(m)
        block = block[perm]
        x[a:b] = block
        src_near = src[n_exact:]
        src_near = np.where(src_near >= a, a + where[np.clip(src_near - a, 0, m - 1)], src_near)
        pairs.append(np.stack([src_near, a + where[base + n_exact + np.arange(n_near)]], 1))
        ids = pa.array([f"r{i}" for i in range(a, b)])
        emb = pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), DIM)
        pq.write_table(pa.table({"id": ids, "emb": emb}), folder / f"part-{f}.parquet",
                       row_group_size=65_536)
        prev = np.arange(a, b)[::7]  # later files copy some of this one's rows
    x.flush()
    return np.load(folder / "x.npy", mmap_mode="r"), np.concatenate(pairs)


def write_config(data: Path, out: Path) -> Path:
    """The job's config over ``data``'s files, outputs under ``out``: its path."""
    cfg = {"input": {"format": "parquet", "path": str(data / "*.parquet"), "tensor": "emb",
                     "id": "id"},
           "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report"),
           "near": {"metric": "cosine", "threshold": THRESHOLD}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(cfg))
    return out / "job.json"


def run_job(data: Path, out: Path, code: str, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "pipeline.run", "--config", str(write_config(data, out))]
    for s in sets:
        cmd += ["--set", s]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_watched(cmd, cwd=code, log=out / "stderr.log", limit_bytes=20 << 30,
                    timeout_s=3 * 3600, env={**os.environ, "PYTHONPATH": code})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r


def score(x: np.ndarray, planted: np.ndarray, out: Path) -> dict:
    dup = pq.read_table(out / "report" / "duplicates.parquet",
                        columns=["record_id", "kind", "duplicate_of"])
    rid = np.array([int(s[1:]) for s in dup.column("record_id").to_pylist()])
    kind = np.array(dup.column("kind").to_pylist())
    removed = np.zeros(len(x), bool)
    removed[rid] = True
    near = kind == "near"
    of = np.array([int(s[1:]) for s in dup.column("duplicate_of").filter(
        pa.array(near)).to_pylist()], np.int64)
    far = 0
    for s in range(0, len(of), 500_000):
        a = np.asarray(x[np.sort(rid[near][s:s + 500_000])], np.float64)
        o = np.argsort(rid[near][s:s + 500_000])
        b = np.asarray(x[of[s:s + 500_000][o]], np.float64)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        far += int((1 - cos > THRESHOLD * (1 + 1e-9)).sum())
    resolved = removed[planted[:, 0]] | removed[planted[:, 1]]
    summary = json.loads((out / "report" / "summary.json").read_text())
    ns = summary.get("near", {})
    rec = ns.get("recall") or {}
    return {"removed_exact": summary.get("removed_exact"), "removed_near": int(near.sum()),
            "precision": 1 - far / max(int(near.sum()), 1),
            "planted_recall": float(resolved.mean()), "planted_pairs": len(planted),
            "mode": ns.get("mode"), "levels": ns.get("levels", 1),
            "cells": ns.get("partitions"), "coarse_cells": ns.get("coarse_cells"),
            "compared_per_record": ns.get("pairs_compared", 0)
            / max(ns.get("records_searched", 1), 1),
            "recall": rec.get("recall"), "recall_low": rec.get("low"),
            "recall_high": rec.get("high"), "recall_with_partners": rec.get("with_partners"),
            "summary_wall_s": summary.get("wall_time_s")}


def table(rows: list[dict]) -> str:
    base = rows[0]
    out = ["| records | wall s | CPU s | peak RSS (tree) | bound | plan | pairs compared "
           "/ record | recall printed | planted recall | precision | wall growth | CPU growth |",
           "| ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | --- | --- |"]
    for r in rows:
        k = r["rows"] / base["rows"]
        g = ""
        if r is not base:
            ew = math.log(r["wall_s"] / base["wall_s"]) / math.log(k)
            ec = math.log(r["cpu_s"] / base["cpu_s"]) / math.log(k)
            g = (f"{r['wall_s'] / base['wall_s']:.2f}x (n^{ew:.2f})",
                 f"{r['cpu_s'] / base['cpu_s']:.2f}x (n^{ec:.2f})")
        rec = ("" if r.get("recall") is None else
               f"{r['recall']:.4f} ({r['recall_low']:.4f}-{r['recall_high']:.4f}; "
               f"{r['recall_with_partners']})")
        out.append(
            f"| {r['rows']:,} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | "
            f"{r['peak_rss_bytes'] / 2**30:.2f} GB | {r['bound_gb']:.1f} GB | {r['mode']}, "
            f"{r['levels']} level(s), {r['cells']:,} cells | "
            f"{r['compared_per_record']:.0f} | {rec} | {r['planted_recall']:.4f} | "
            f"{r['precision']:.4f} | {g[0] if g else ''} | {g[1] if g else ''} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, action="append", help="default: 1M, 2M, 4M, 8M")
    ap.add_argument("--code", default=str(ROOT), help="the checkout the job runs from")
    ap.add_argument("--set", action="append", default=[], help="a job --set override")
    ap.add_argument("--work", default=None, help="keep data and outputs here (default: temp)")
    ap.add_argument("--json", default="bench-growth.json")
    a = ap.parse_args()
    sizes = sorted(a.rows or [1_000_000, 2_000_000, 4_000_000, 8_000_000])
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        work = Path(a.work or tmp)
        for n in sizes:
            data = work / f"data-{n}"
            if (data / "planted.npy").exists():
                x, planted = np.load(data / "x.npy", mmap_mode="r"), np.load(data / "planted.npy")
            else:
                print(f"writing {n:,} records ...", file=sys.stderr, flush=True)
                x, planted = make(n, data)
                np.save(data / "planted.npy", planted)
            print(f"job on {n:,} records ...", file=sys.stderr, flush=True)
            r = run_job(data, work / f"out-{n}", a.code, a.set)
            if r["rc"] != 0:
                sys.exit(f"job failed on {n:,} records: {r['stderr_tail']}")
            row = {"rows": n, "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
                   "peak_rss_bytes": r["peak_rss_bytes"],
                   "bound_gb": max(3.0, 3 * n * DIM * 4 / 2**30),
                   **score(x, planted, work / f"out-{n}")}
            results.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            Path(a.json).write_text(json.dumps({"code": a.code, "set": a.set,
                                                "results": results}, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
