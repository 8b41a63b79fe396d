"""How fast a stopped job ends, on every runner the job starts itself (issue 41): the CLI
on a near job, a signal sent when a given progress line appears (or inside Publish),
the seconds from the signal to the command's end, its exit code and stderr lines, and
whether any process of the run or temporary file is left. A table plus JSON.

    python scripts/check_stops.py [--rounds 3] [--json stops.json]

SIGINT goes to the command's process group (a terminal's Ctrl-C), SIGTERM to the command
alone (Kubernetes, most schedulers). Not a test: tests/test_stopping.py asserts the
targets (5 s from the first signal, 1 s from a second) at one point per runner.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = {"threads": ["runner.processes=false"], "processes": ["runner.processes=true"],
           "portable": ["runner.name=portable"], "dask": ["runner.name=dask"]}
# where the signal is sent: the first stderr line that starts with this (None: Publish)
POINTS = {"reading": "[read]", "near search": "[near assign]", "publish": None}


def write_input(folder: Path, rows: int = 400_000, dim: int = 64) -> None:
    rng = np.random.default_rng(0)
    for f in range(4):
        x = rng.standard_normal((rows // 4, dim)).astype(np.float32)
        x[: rows // 40] = x[rows // 40: rows // 20] + 1e-4
        pq.write_table(pa.table({
            "id": [f"{f}-{i}" for i in range(len(x))],
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim)}),
            folder / f"in{f}.parquet", row_group_size=16384)


def tagged(tag: str) -> int:
    n = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                n += tag.encode() in (entry / "environ").read_bytes()
            except OSError:
                pass
    return n


def one(work: Path, runner: str, point: str, signum: int) -> dict:
    tmp = Path(tempfile.mkdtemp(dir=work))
    tag = uuid.uuid4().hex
    hold = tmp / "hold"
    cfg = work / "job.yaml"
    env = {**os.environ, "TMPDIR": str(tmp), "TENSORDEDUP_STOP_TAG": tag}
    if POINTS[point] is None:
        env["TENSORDEDUP_TEST_HOLD_PUBLISH"] = str(hold)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--overwrite",
         *[a for s in RUNNERS[runner] for a in ("--set", s)]],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    lines: list[str] = []
    if POINTS[point] is None:
        tick = threading.Event()
        while not hold.with_name("hold.reached").exists() and proc.poll() is None:
            tick.wait(0.02)
    else:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith(POINTS[point]):
                break
    if proc.poll() is not None:
        return {"runner": runner, "point": point, "signal": signal.Signals(signum).name,
                "missed": "the job ended before the point"}
    t0 = time.monotonic()
    (os.killpg if signum == signal.SIGINT else os.kill)(proc.pid, signum)
    rest = proc.stderr.read()
    proc.wait()
    took = time.monotonic() - t0
    said = [ln for ln in rest.splitlines() if ln and not ln.startswith(("[", "near: "))]
    deadline = time.monotonic() + 10
    while tagged(tag) and time.monotonic() < deadline:
        threading.Event().wait(0.05)
    left = [p.name for p in tmp.iterdir() if not p.name.startswith("hold")]
    return {"runner": runner, "point": point, "signal": signal.Signals(signum).name,
            "seconds": round(took, 3), "exit": proc.returncode, "lines_after": len(said),
            "processes_left": tagged(tag), "temp_left": left}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="stops.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "in").mkdir()
        write_input(work / "in")
        (work / "job.yaml").write_text(yaml.safe_dump({
            "input": {"format": "parquet", "path": str(work / "in" / "*.parquet"),
                      "tensor": "emb", "id": "id"},
            "near": {"metric": "cosine", "threshold": 0.01},
            "output": {"path": str(work / "out" / "clean")},
            "report": str(work / "out" / "report")}))
        rows = []
        for runner in RUNNERS:
            for point in POINTS:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    for _ in range(args.rounds):
                        r = one(work, runner, point, signum)
                        rows.append(r)
                        print(json.dumps(r), flush=True)
    print(f"\n| runner | point | signal | seconds to exit (max of {args.rounds}) | exit | "
          "extra stderr lines | processes left | temp files left |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: | --- |")
    key = lambda r: (r["runner"], r["point"], r["signal"])  # noqa: E731
    for k in dict.fromkeys(map(key, rows)):
        group = [r for r in rows if key(r) == k and "seconds" in r]
        if not group:
            print(f"| {' | '.join(k)} | (the job ended before the point) | | | | |")
            continue
        print(f"| {' | '.join(k)} | {max(r['seconds'] for r in group):.2f} | "
              f"{sorted({r['exit'] for r in group})} | "
              f"{max(r['lines_after'] for r in group) - 1} | "
              f"{max(r['processes_left'] for r in group)} | "
              f"{sorted({f for r in group for f in r['temp_left']})} |")
    Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
