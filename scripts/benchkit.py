"""What the benchmark and fuzz scripts share: one contender per fresh process, and its
peak RSS; the fuzzers' loop over seeds.

VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent across exec.
"""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
# a Python expression, for the contender's own source: its peak RSS in MB
PEAK_RSS_MB = ('int([ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]'
               '.split()[1]) / 1024')


def run_python(source: str) -> tuple[dict, float]:
    """Run ``source`` with ``python -c`` from the repo root: (its last stdout line, read as
    JSON; the process's wall seconds). Raises with the stderr tail if it fails. The
    JSON's ``rss_mb`` (the process's own VmHWM, when it reports one) becomes the peak of
    its whole process tree where that was higher: a job's worker processes count too
    (sampled every 0.1 s)."""
    import psutil

    start = time.perf_counter()
    with subprocess.Popen([sys.executable, "-c", source], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as p:
        proc, peak = psutil.Process(p.pid), 0
        reader = ThreadPoolExecutor(1).submit(p.communicate)  # pipes drained meanwhile
        while not reader.done():
            try:
                peak = max(peak, tree_rss(proc))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.1)
        stdout, stderr = reader.result()
    wall = time.perf_counter() - start
    if p.returncode != 0:
        raise RuntimeError(f"contender failed:\n{stderr[-3000:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    if "rss_mb" in out:
        out["rss_mb"] = max(out["rss_mb"], peak / 2 ** 20)
    return out, wall


def tree_rss(proc) -> int:
    """Resident bytes of a psutil process and all its descendants (0 for those gone)."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def kill_tree(proc) -> None:
    """Kill a process we started and its descendants, by pid, children first."""
    import psutil

    try:
        family = proc.children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for p in [*reversed(family), proc]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_watched(cmd: list[str], *, cwd: str | Path, log: str | Path, env: dict | None = None,
                limit_bytes: int = 16 << 30, timeout_s: float = 900, poll_s: float = 0.1
                ) -> dict:
    """Run ``cmd`` as a whole process as a user would, polling the resident memory of its
    whole process tree; kill the tree above ``limit_bytes`` (the shared machine must never
    meet the OOM killer) or after ``timeout_s``; stderr goes to the file ``log``. Returns
    rc, wall_s, peak_rss_bytes, killed (None | "memory" | "timeout") and stderr's tail."""
    import psutil

    start = time.perf_counter()
    with open(log, "w+b") as err:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        proc, peak, killed = psutil.Process(p.pid), 0, None
        while p.poll() is None:
            try:
                peak = max(peak, tree_rss(proc))
            except psutil.NoSuchProcess:
                break
            if peak > limit_bytes or time.perf_counter() - start > timeout_s:
                killed = "memory" if peak > limit_bytes else "timeout"
                kill_tree(proc)
                break
            time.sleep(poll_s)
        rc = p.wait()
        wall = time.perf_counter() - start
        err.seek(0)
        tail = err.read()[-4000:].decode(errors="replace")
    return {"rc": rc, "wall_s": wall, "peak_rss_bytes": peak, "killed": killed,
            "stderr_tail": tail}


def timed(cmd: list[str], log: Path) -> dict:
    """``run_watched`` from the repo root, plus the CPU seconds of the process tree."""
    import os
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_watched(cmd, cwd=str(ROOT), log=log, limit_bytes=16 << 30, timeout_s=3600,
                    env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r


def stem_row(record_id: str | None) -> str | None:
    """``…/in/part-1.npy:17`` -> ``part-1:17``: one record named alike in any format."""
    if record_id is None:
        return None
    path, _, row = record_id.rpartition(":")
    return f"{Path(path).stem}:{row}"


def timed_job(inp: dict, out: Path, near: dict | None) -> dict:
    """The CLI job on ``inp`` (the input section) as a whole process (``timed``), its
    outputs under ``out``; with its removals as (file stem:row, of, kind) when it ran."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"input": inp, "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report"), **({"near": near} if near else {})}
    (out / "job.json").write_text(json.dumps(cfg))
    r = timed([sys.executable, "-m", "pipeline.run", "--config", str(out / "job.json")],
              out / "stderr.log")
    if r["rc"] == 0:
        dups = pq.read_table(out / "report" / "duplicates.parquet").to_pylist()
        r["removed"] = len(dups)
        r["removals"] = sorted((stem_row(d["record_id"]), stem_row(d["duplicate_of"]),
                                d["kind"]) for d in dups)
    return r


COUNTS = ("read", "kept", "removed", "invalid", "files")


def same_as_local(out: Path, other: Path, s, t) -> list:
    """Where the run in ``other`` (another runner) differs from the local one in ``out``:
    report files and clean shards byte for byte, the summary's counts and near figures."""
    problems = []
    for name in ("report/duplicates.parquet", "report/invalid.parquet"):
        if (out / name).read_bytes() != (other / name).read_bytes():
            a, b = pq.read_table(out / name), pq.read_table(other / name)
            problems.append([f"{name} differs", "rows equal" if a.equals(b) else
                             f"{a.num_rows} vs {b.num_rows} rows"])
    mine = sorted(p.name for p in (out / "clean").iterdir())
    theirs = sorted(p.name for p in (other / "clean").iterdir())
    if mine != theirs:
        problems.append(["clean shards", mine, theirs])
    problems += [[f"clean/{f} differs"] for f in set(mine) & set(theirs)
                 if (out / "clean" / f).read_bytes() != (other / "clean" / f).read_bytes()]
    for key in COUNTS:
        if s.summary.get(key) != t.summary.get(key):
            problems.append([f"summary {key}", s.summary.get(key), t.summary.get(key)])
    near_a, near_b = (dict(x.summary.get("near") or {}) for x in (s, t))
    for k in sorted(set(near_a) | set(near_b)):
        if "second" not in k and near_a.get(k) != near_b.get(k):
            problems.append([f"summary near.{k}", near_a.get(k), near_b.get(k)])
    return problems


def other_runner(stack: contextlib.ExitStack, name: str | None) -> dict | None:
    """The ``runner`` config of a fuzzer's second runner (``--runner``): a local Dask
    cluster of 2 processes (closed with ``stack``) or the portable runner's 2 workers."""
    if name == "dask":
        import distributed

        cluster = stack.enter_context(distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None))
        return {"name": "dask", "address": cluster.scheduler_address}
    return {"name": "portable", "workers": 2} if name == "portable" else None


def fuzz_seeds(name: str, seeds: str, minutes: float,
               case: Callable[[int, collections.Counter], tuple[dict, list]]) -> None:
    """Run ``case(seed, stats)`` -> (what the case was, problems) for the seeds
    ``first:last`` until ``minutes`` pass: one JSON line per failing seed (a crash is a
    finding too), then a tally line with the cases' ``stats``."""
    first, last = (int(v) for v in seeds.split(":"))
    deadline, bad, ran, stats = time.time() + 60 * minutes, 0, 0, collections.Counter()
    for seed in range(first, last):
        if time.time() > deadline:
            break
        ran += 1
        try:
            what, problems = case(seed, stats)
        except Exception as e:  # noqa: BLE001 - a crash is a finding
            what, problems = {"seed": seed}, [f"{type(e).__name__}: {e}"[:1500],
                                              traceback.format_exc()[-1500:]]
        if problems:
            bad += 1
            print(json.dumps({**what, "problems": problems[:12]}, default=str), flush=True)
    print(f"{name}: {ran} seeds from {first}, {bad} failing; {dict(sorted(stats.items()))}",
          flush=True)
