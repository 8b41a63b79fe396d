"""The portable runner (a job service and SDK worker processes, the Dataflow Runner v2
path) against the local runner, on the same inputs, as whole processes.

Inputs: the sample job (configs/dedupe.yaml: 4,500 Parquet rows x 64 float32, exact) and
the same files with the near stage (configs/dedupe-near.yaml), and with ``--rows N`` a
generated Parquet file of N x 128 float32 (10% duplicates, exact). Contenders: local with
one in-process worker, local with 2 workers, portable with 1 and 2 SDK worker processes.
Each run is ``python -m pipeline.run`` in its own process (wall time includes start-up,
the services' start and stop); "job itself" is summary.json's wall time; peak RSS is the
launcher's whole process tree (services and workers included). Runs alternate; the
median is reported. Prints a table, writes JSON.

Usage: python scripts/bench_portable.py [--repeat 3] [--rows 1000000] [--json bench-portable.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench_pipeline import make_parquet
from benchkit import ROOT, run_watched

CONTENDERS = {"local, 1 worker": ["runner.workers=1"], "local, 2 workers": ["runner.workers=2"],
              "portable, 1 worker": ["runner.name=portable", "runner.workers=1"],
              "portable, 2 workers": ["runner.name=portable", "runner.workers=2"]}


def run(config: str, sets: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "pipeline.run", "--config", config, "--quiet",
           *[a for s in [*sets, f"output.path={out}/clean", f"report={out}/report",
                         "output.overwrite=true"] for a in ("--set", s)]]
    out.parent.mkdir(parents=True, exist_ok=True)
    r = run_watched(cmd, cwd=ROOT, log=out.parent / "stderr.log")
    if r["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r['stderr_tail']}")
    summary = json.loads((out / "report" / "summary.json").read_text())
    return {"wall_s": r["wall_s"], "inner_s": summary["wall_time_s"],
            "rss_mb": r["peak_rss_bytes"] / 2**20, "kept": summary["kept"],
            "dups": (out / "report" / "duplicates.parquet").read_bytes()}


def bench(name: str, config: str, sets: list[str], repeat: int, work: Path) -> dict:
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    for i in range(repeat):
        for c, extra in CONTENDERS.items():
            runs[c].append(run(config, [*sets, *extra], work / name / f"{c}-{i}".replace(" ", "")))
    first = runs["local, 1 worker"][0]["dups"]
    assert all(r["dups"] == first for rs in runs.values() for r in rs), "outputs differ"
    return {c: {"wall_s": statistics.median(r["wall_s"] for r in rs),
                "inner_s": statistics.median(r["inner_s"] for r in rs),
                "rss_mb": max(r["rss_mb"] for r in rs), "kept": rs[0]["kept"],
                "runs_wall_s": [round(r["wall_s"], 2) for r in rs]} for c, rs in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=0, help="also a generated N-row Parquet job")
    ap.add_argument("--json", default="bench-portable.json")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-portable-") as tmp:
        work = Path(tmp)
        inputs = {"sample, exact": ("configs/dedupe.yaml", []),
                  "sample, near (l2 0.1)": ("configs/dedupe-near.yaml", [])}
        if args.rows:
            make_parquet(work / "vectors.parquet", args.rows)
            cfg = work / "big.yaml"
            cfg.write_text(json.dumps({"input": {"format": "parquet", "tensor": "emb", "id": "id",
                                                 "path": str(work / "vectors.parquet")},
                                       "output": {"path": "x"}, "report": "y"}))
            inputs[f"{args.rows:,} x 128, exact"] = (str(cfg), [])
        for i, (name, (config, sets)) in enumerate(inputs.items()):
            results[name] = bench(f"in{i}", config, sets, args.repeat, work)
    print(f"{'input':<24}{'contender':<22}{'wall s':>8}{'job itself s':>14}{'peak RSS MB':>13}"
          f"{'vs local 1':>12}")
    for name, res in results.items():
        ref = res["local, 1 worker"]["wall_s"]
        for j, (c, r) in enumerate(res.items()):
            print(f"{'' if j else name:<24}{c:<22}{r['wall_s']:>8.2f}{r['inner_s']:>14.2f}"
                  f"{r['rss_mb']:>13.0f}{r['wall_s'] / ref:>11.2f}x")
    Path(args.json).write_text(json.dumps({"repeat": args.repeat, "results": results}, indent=2))


if __name__ == "__main__":
    main()
