"""Scale-out (issue 44, target 2): the job on a Dask cluster of ``--workers`` worker
processes that it starts itself, against the local runner on the same data: the same
removals, and each process's peak RSS against 2 GB + 1.5x its share of the tensor bytes.

Data: ``bench_growth``'s (128-d embedding-like records, 4% exact and 4% planted near
copies, cosine 0.01). Each process of the job's tree is polled every 0.2 s (psutil) and
its own peak kept, so the Dask workers, the nanny processes and the driver each get a
figure.

    python scripts/bench_scaleout.py --rows 4000000 --workers 4 --work /tmp/grow

Writes bench-scaleout.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_growth import DIM, make, write_config  # noqa: E402
from benchkit import ROOT  # noqa: E402


def run(data: Path, out: Path, sets: list[str]) -> dict:
    """The CLI with ``sets``; per process of its tree: name, peak RSS."""
    cmd = [sys.executable, "-m", "pipeline.run", "--config", str(write_config(data, out)),
           "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    peaks: dict[int, tuple[str, int]] = {}
    start = time.perf_counter()
    with open(out / "stderr.log", "wb") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        root = psutil.Process(p.pid)
        while p.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for q in procs:
                try:
                    rss = q.memory_info().rss
                    name = " ".join(q.cmdline()[1:4])[:80]
                except psutil.Error:
                    continue
                if rss > peaks.get(q.pid, ("", 0))[1]:
                    peaks[q.pid] = (name, rss)
            time.sleep(0.2)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"job failed ({sets}): {(out / 'stderr.log').read_text()[-2000:]}")
    return {"wall_s": wall, "processes": sorted(({"pid": k, "cmd": v[0], "peak_rss": v[1]}
                                                for k, v in peaks.items()),
                                               key=lambda r: -r["peak_rss"])}


def removals(out: Path) -> set:
    t = pq.read_table(out / "report" / "duplicates.parquet",
                      columns=["record_id", "duplicate_of", "kind"])
    return set(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--json", default="bench-scaleout.json")
    a = ap.parse_args()
    data = a.work / f"data-{a.rows}"
    if not (data / "planted.npy").exists():
        _, planted = make(a.rows, data)
        np.save(data / "planted.npy", planted)
    local = run(data, a.work / "scaleout-local", [])
    dask = run(data, a.work / "scaleout-dask",
               ["runner.name=dask", f"runner.workers={a.workers}"])
    same = removals(a.work / "scaleout-local") == removals(a.work / "scaleout-dask")
    bound = 2e9 + 1.5 * a.rows * DIM * 4 / a.workers
    result = {"rows": a.rows, "workers": a.workers, "same_removals": same,
              "bound_per_process": bound, "local": local, "dask": dask}
    Path(a.json).write_text(json.dumps(result, indent=2))
    print("| runner | wall s | largest process peaks (GB) |\n| --- | ---: | --- |")
    for name, r in (("local", local), (f"dask, {a.workers} worker processes", dask)):
        peaks = ", ".join(f"{p['peak_rss'] / 1e9:.2f}" for p in r["processes"][:a.workers + 2])
        print(f"| {name} | {r['wall_s']:.0f} | {peaks} |")
    print(f"same removals: {same}; bound per process {bound / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
