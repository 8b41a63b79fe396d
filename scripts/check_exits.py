"""Exit codes of finished runs, run after run: does every process that did its work exit 0?

A scheduler reads exit 134 ("terminate called without an active exception", a library
thread aborting at interpreter shutdown) as a failed task and retries it, although the
run was complete. This runs a case many times, each in a fresh process, and counts the
exit codes, hangs (past ``--timeout``) and wall times; not a CI test (minutes of runs).

Cases (each run in its own scratch directory, with ``data/`` and ``configs/`` linked in,
so parallel runs never share an output):

- ``readme``: the README's Python example (``run_job`` with near on the sample data, then
  ``s.removals()`` and ``print(s)``), taken from README.md as written;
- ``cli``: ``python -m pipeline.run --config configs/dedupe-near.yaml``;
- ``embed``: the README's ``embed:`` example (sentence-transformers on CPU, torch threads).

A busy machine: ``--parallel N`` runs N at once, ``--burn K`` keeps K CPU burners
spinning meanwhile. Prints a table and writes JSON (``--json``)::

    flock /work/BENCH.lock nice -n 10 python scripts/check_exits.py --case readme --runs 200
    ... --case cli --runs 200 --parallel 2 --burn 2 --json exits-cli-busy.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_readme import blocks  # noqa: E402  (the README's blocks, as the test reads them)

CASES = ("readme", "cli", "embed")


def readme_block(*needles: str) -> str:
    """The README's python block that contains every needle."""
    found = [b.code for b in blocks("README.md")
             if b.lang in ("python", "py") and all(n in b.code for n in needles)]
    if len(found) != 1:
        raise SystemExit(f"README.md: {len(found)} python blocks contain {needles}, not 1")
    return found[0]


def command(case: str, slot: Path) -> list[str]:
    if case == "cli":
        return [sys.executable, "-m", "pipeline.run", "--config", "configs/dedupe-near.yaml"]
    code = (readme_block("run_job(config", "s.removals()") if case == "readme"
            else readme_block('"embed":', "extract_model"))
    if case == "embed":
        (slot / "out").mkdir(exist_ok=True)
    script = slot / f"{case}.py"
    script.write_text(code + "\n")
    return [sys.executable, str(script)]


def scratch(root: Path, i: int) -> Path:
    slot = root / f"slot{i}"
    slot.mkdir()
    for name in ("data", "configs"):
        (slot / name).symlink_to(ROOT / name)
    return slot


def run_once(cmd: list[str], slot: Path, timeout: float) -> tuple[int | str, float, str]:
    """(exit code or "hang", wall seconds, stderr tail) of one fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=slot, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
        code: int | str = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        _, err = p.communicate()
        code = "hang"
    wall = time.perf_counter() - start
    return (128 - code if isinstance(code, int) and code < 0 else code), wall, err[-800:]


def burners(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def measure(case: str, runs: int, parallel: int, burn: int, timeout: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"check-exits-{case}-"))
    slots = [scratch(root, i) for i in range(parallel)]
    free = list(slots)
    lock = threading.Lock()
    codes: collections.Counter = collections.Counter()
    walls: list[float] = []
    failures: list[str] = []
    done = 0

    def one(_: int) -> None:
        nonlocal done
        with lock:
            slot = free.pop()
        try:
            code, wall, err = run_once(command(case, slot), slot, timeout)
        finally:
            with lock:
                free.append(slot)
        with lock:
            codes[str(code)] += 1
            walls.append(wall)
            done += 1
            if code != 0 and len(failures) < 5:
                failures.append(f"exit {code}: {err.strip()[-400:]}")
            if done % 10 == 0 or code != 0:
                print(f"  {case}: {done}/{runs} runs, exit codes {dict(codes)}",
                      file=sys.stderr, flush=True)

    spinning = burners(burn)
    load = os.getloadavg()[0]
    try:
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(one, range(runs)))
    finally:
        for b in spinning:
            b.kill()
            b.wait()
        shutil.rmtree(root, ignore_errors=True)
    state = "quiet" if parallel == 1 and burn == 0 else (
        f"busy: {parallel} runs at once + {burn} CPU burner(s)")
    return {"case": case, "state": state, "runs": runs, "parallel": parallel, "burners": burn,
            "exit_codes": dict(codes), "clean": codes.get("0", 0), "cores": os.cpu_count(),
            "load_at_start": round(load, 2), "wall_median_s": round(statistics.median(walls), 2),
            "wall_max_s": round(max(walls), 2), "failures": failures}


def table(rows: list[dict]) -> str:
    head = f"{'case':8} {'state':42} {'runs':>5} {'exit 0':>7}  exit codes seen      median s"
    lines = [head, "-" * len(head)]
    for r in rows:
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(r["exit_codes"].items()))
        lines.append(f"{r['case']:8} {r['state']:42} {r['runs']:>5} {r['clean']:>7}  "
                     f"{codes:20} {r['wall_median_s']:>8}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", choices=CASES,
                    help="a case to run (repeatable; default: readme and cli)")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=1, help="runs at once")
    ap.add_argument("--burn", type=int, default=0, help="CPU burner processes meanwhile")
    ap.add_argument("--timeout", type=float, default=300, help="seconds before a run is a hang")
    ap.add_argument("--json", default=str(ROOT / "check-exits.json"))
    args = ap.parse_args()
    rows = [measure(c, args.runs, args.parallel, args.burn, args.timeout)
            for c in args.case or ["readme", "cli"]]
    print(table(rows))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    Path(args.json).write_text(json.dumps({"commit": commit, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(r["clean"] == r["runs"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
