"""Issue 21's data shapes for ``bench_near.py --data NAME``: the job as a whole CLI process
on each, with wall time and the peak resident memory of its whole process tree against
the memory bound max(3 GB, 3 x the input's tensor bytes as stored).

Why a separate module: these cases time one contender (the job) on inputs that are
written to Parquet in blocks (some are several GB), and judge it by memory and by
whether it runs at all, which the embeddings benchmark's contenders do not need.
Each case plants groups of records that belong together (a crowd of copies with its
centre, or a planted pair): the table shows how many records of those groups survive.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from benchkit import ROOT, run_watched

sys.path.insert(0, str(ROOT))
from tests import shapes  # noqa: E402
from tests.embeddings import planted_copies  # noqa: E402
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance  # noqa: E402

GB = 1 << 30
LIMIT = 16 * GB  # the watchdog: the shared machine has 24 GB and no swap


@dataclass
class Data:
    """A case's input as written: what the job is asked, and the planted groups."""

    rows: int
    shape: tuple[int, ...]
    dtype: str
    metric: str
    threshold: float
    groups: list[np.ndarray] = field(default_factory=list)  # rows that belong together

    @property
    def tensor_bytes(self) -> int:
        return shapes.tensor_bytes(self.rows, self.shape, self.dtype)

    @property
    def budget(self) -> int:
        return max(3 * GB, 3 * self.tensor_bytes)


def _shuffled(parts: list[np.ndarray], groups: list[np.ndarray], seed: int = 5
              ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The parts concatenated and shuffled (crowds are not contiguous in real files),
    with each group's rows (indexes into the concatenation) mapped to their new rows."""
    x = np.concatenate(parts)
    perm = np.random.default_rng(seed).permutation(len(x))
    where = np.empty(len(x), np.int64)
    where[perm] = np.arange(len(x))
    return x[perm], [where[g] for g in groups]


def _write(x: np.ndarray, work: Path, metric: str, threshold: float,
           groups: list[np.ndarray]) -> Data:
    shapes.write_parquet(work / "in" / "part-0.parquet", x)
    return Data(len(x), x.shape[1:], x.dtype.name, metric, threshold, groups)


def _with_crowds(n_bg: int, crowds: list[tuple[int, float]], metric: str, threshold: float,
                 work: Path, dim: int = 384) -> Data:
    """Embedding-like background plus crowds (size, tolerance) around background rows."""
    bg = shapes.background(n_bg, dim)
    parts, groups, n = [bg], [], n_bg
    for i, (m, tol) in enumerate(crowds):
        parts.append(shapes.crowd(bg[i], m, tol, metric, seed=100 + i))
        groups.append(np.concatenate([[i], np.arange(n, n + m)]))
        n += m
    x, groups = _shuffled(parts, groups)
    return _write(x, work, metric, threshold, groups)


def identical(scale: float, work: Path) -> Data:
    """300k exact copies of one 64-d vector + 300 near copies of it (l2 0.01)."""
    n = int(300_000 * scale)
    x = shapes.identical(n, 64)
    near = shapes.crowd(x[0], 300, 0.01, "l2")
    x, groups = _shuffled([x, near], [np.arange(n + 300)])
    return _write(x, work, "l2", 0.01, groups)


def one_crowd(scale: float, work: Path) -> Data:
    """300k 64-d records all within a quarter of l2 0.01 of one centre: no exact copy,
    every pair within tolerance (4.5e10 pairs), one record should survive."""
    n = int(300_000 * scale)
    x = shapes.crowd(shapes.background(1, 64)[0] * 10, n, 0.01, "l2", seed=7)
    return _write(x, work, "l2", 0.01, [np.arange(n)])


def crowds(scale: float, work: Path) -> Data:
    """300k 384-d embedding-like + one cloud of 60k within cosine 0.002 of one record +
    ten clouds of 3k within 0.0025 of theirs; cosine 0.01."""
    big = [(int(60_000 * scale), 0.008)] + [(int(3_000 * scale), 0.01)] * 10
    return _with_crowds(int(300_000 * scale), big, "cosine", 0.01, work)


def magnitudes(scale: float, work: Path) -> Data:
    """80k x 64, norms log-uniform in 1e-3..1e3, 5% planted copies; l2 0.01."""
    x, pairs = shapes.magnitudes(int(80_000 * scale), 64, tolerance=0.01)
    return _write(x, work, "l2", 0.01, list(pairs))


def _blank(scale: float, work: Path, metric: str, threshold: float) -> Data:
    x, pairs = planted_copies(shapes.background(int(200_000 * scale / 1.07)))
    x, blank = shapes.with_blanks(x, 0.1)
    within = exact_distance(x[pairs[:, 0]], x[pairs[:, 1]], NearSpec(metric, threshold))[1]
    ok = within & ~np.isin(pairs, blank).any(axis=1)  # planted at 0.001-0.02: half are outside
    return _write(x, work, metric, threshold, list(pairs[ok]))


def blank(scale: float, work: Path) -> Data:
    """200k 384-d embeddings (5% planted copies) with 10% rows zero or near-zero; cosine 0.01."""
    return _blank(scale, work, "cosine", 0.01)


def blank_l2(scale: float, work: Path) -> Data:
    """The same at l2 0.1: the near-zero rows are one crowd with the zeros."""
    return _blank(scale, work, "l2", 0.1)


def _images(n: int, shape: tuple[int, ...], dtype: str, work: Path) -> Data:
    step = max(20, (32 << 20) // shapes.tensor_bytes(1, shape, dtype) // 20 * 20)
    blocks: Iterator[np.ndarray] = (shapes.image_rows(a, min(a + step, n), shape, dtype)
                                    for a in range(0, n, step))
    shapes.write_parquet(work / "in" / "part-0.parquet", blocks)
    return Data(n, shape, dtype, "l2", shapes.image_tolerance(shape, dtype),
                list(shapes.image_pairs(n)))


def wide_128(scale: float, work: Path) -> Data:
    """6k records of 128x128 float32 (400 MB), 5% re-encoded copies; l2 3 levels RMS."""
    return _images(int(6_000 * scale), (128, 128), "float32", work)


def wide_u8(scale: float, work: Path) -> Data:
    """100k images 64x64x3 uint8 (1.2 GB), 5% re-encoded copies; l2 3 levels RMS."""
    return _images(int(100_000 * scale), (64, 64, 3), "uint8", work)


def wide_f32(scale: float, work: Path) -> Data:
    """The same images as float32 in [0, 1] (4.9 GB)."""
    return _images(int(100_000 * scale), (64, 64, 3), "float32", work)


def crowd_1m(scale: float, work: Path) -> Data:
    """800k distinct embedding-like + a crowd of 200k around one of them; cosine 0.01."""
    return _with_crowds(int(800_000 * scale), [(int(200_000 * scale), 0.01)], "cosine", 0.01,
                        work)


def crowds_of_20(scale: float, work: Path) -> Data:
    """800k embedding-like + 10,000 crowds of 20 around 10,000 of them (1M); cosine 0.01."""
    return _with_crowds(int(800_000 * scale), [(20, 0.01)] * int(10_000 * scale), "cosine",
                        0.01, work)


def distinct_1m(scale: float, work: Path) -> Data:
    """1M embedding-like records, no planted copies: the cost of the data itself."""
    x = shapes.background(int(1_000_000 * scale))
    return _write(x, work, "cosine", 0.01, [])


CASES: dict[str, Callable[[float, Path], Data]] = {
    "identical": identical, "one-crowd": one_crowd, "crowds": crowds,
    "magnitudes": magnitudes, "blank": blank, "blank-l2": blank_l2, "wide-128": wide_128,
    "wide-u8": wide_u8, "wide-f32": wide_f32,
    "crowd-1m": crowd_1m, "crowds-of-20": crowds_of_20, "distinct-1m": distinct_1m}
GROUPS = {"wide": ["wide-128", "wide-u8", "wide-f32"]}


def _config(work: Path, d: Data, near: dict) -> Path:
    import yaml

    cfg = {"input": {"format": "parquet", "path": str(work / "in" / "*.parquet"),
                     "tensor": "emb", "id": "id"},
           "output": {"path": str(work / "job" / "clean"), "overwrite": True},
           "report": str(work / "job" / "report"),
           "near": {"metric": d.metric, "threshold": d.threshold, **near}}
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _outcome(work: Path, d: Data) -> dict:
    """What the job reported, and how many records of the planted groups survived."""
    import pyarrow.parquet as pq

    report = work / "job" / "report"
    s = json.loads((report / "summary.json").read_text())
    removed = pq.read_table(report / "duplicates.parquet", columns=["record_id"])
    gone = np.zeros(d.rows, bool)
    gone[np.array(removed.column(0).to_pylist(), dtype=np.int64)] = True
    members = np.concatenate(d.groups) if d.groups else np.empty(0, np.int64)
    near = s.get("near") or {}
    return {"read": s["read"], "removed_exact": s.get("removed_exact", 0),
            "removed_near": s.get("removed_near", 0), "invalid": s.get("invalid", 0),
            "job_wall_time_s": s.get("wall_time_s"), "mode": near.get("mode"),
            "cells": near.get("cells"), "own_recall": (near.get("recall") or {}).get("recall"),
            "groups": len(d.groups), "group_records": int(len(members)),
            "group_survivors": int((~gone[members]).sum())}


def run_case(name: str, scale: float, work: Path, code: Path, timeout_s: float,
             variants: list[dict] | None = None) -> list[dict]:
    """Write the case's input once, then run the job on it as a CLI process under the
    watchdog for each variant (near settings such as grouping and mode; default: none)."""
    (work / "in").mkdir(parents=True, exist_ok=True)
    print(f"{name}: writing the input ...", file=sys.stderr, flush=True)
    d = CASES[name](scale, work)
    return [_run_one(name, scale, work, code, timeout_s, d, v) for v in variants or [{}]]


def _run_one(name: str, scale: float, work: Path, code: Path, timeout_s: float, d: Data,
             near: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    said = "".join(f", {k} {v}" for k, v in near.items())
    print(f"{name}: {d.rows:,} x {list(d.shape)} {d.dtype}, {d.metric} {d.threshold:g}{said}; "
          "running the job ...", file=sys.stderr, flush=True)
    r = run_watched([sys.executable, "-m", "pipeline.run", "--config",
                     str(_config(work, d, near))],
                    cwd=code, log=work / "job.stderr", env=env, limit_bytes=LIMIT,
                    timeout_s=timeout_s)
    out = {"data": name, "scale": scale, "rows": d.rows, "shape": list(d.shape),
           "dtype": d.dtype, "metric": d.metric, "threshold": d.threshold,
           "grouping": near.get("grouping", "representative"), "asked_mode":
           near.get("mode", "auto"), "tensor_bytes": d.tensor_bytes, "budget_bytes": d.budget,
           "code": str(code), **{k: r[k] for k in ("rc", "wall_s", "peak_rss_bytes", "killed")}}
    lines = [ln for ln in r["stderr_tail"].splitlines() if ln.strip()]
    if r["killed"]:
        out["status"] = (f"killed by the watchdog at {r['peak_rss_bytes'] / GB:.1f} GB"
                         if r["killed"] == "memory" else f"killed after {timeout_s:.0f} s")
    elif r["rc"] != 0:
        out["status"] = f"exit {r['rc']}: {lines[-1] if lines else ''}"[:300]
    else:
        out["status"] = "ok"
        out.update(_outcome(work, d))
    out["within_budget"] = r["peak_rss_bytes"] <= d.budget and out["status"] == "ok"
    print(f"  {out['status']}, {r['wall_s']:.1f} s, peak {r['peak_rss_bytes'] / GB:.2f} GB",
          file=sys.stderr, flush=True)
    return out


def _variant(r: dict) -> str:
    """grouping and mode asked (-> the mode auto chose)."""
    mode = r.get("asked_mode", "auto")
    if mode == "auto" and r.get("mode"):
        mode += f"->{r['mode']}"
    return f"{r.get('grouping', 'representative')[:4]} {mode}"


def table(results: list[dict]) -> str:
    head = (f"{'case':<14}{'rows':>10} {'shape':<12}{'dtype':<8}{'metric':<13}{'grouping/mode':<22}"
            f"{'data GB':>8}"
            f"{'budget':>8}{'wall s':>8}{'peak GB':>8}  {'pass':<5}{'exact':>9}{'near':>9}"
            f"{'survivors':>14}  status")
    lines = [head]
    for r in results:
        shape = "x".join(map(str, r["shape"]))
        surv = (f"{r['group_survivors']:,}/{r['groups']:,}" if "groups" in r and r["groups"]
                else "-")
        lines.append(
            f"{r['data']:<14}{r['rows']:>10,} {shape:<12}{r['dtype']:<8}"
            f"{r['metric'] + ' ' + format(r['threshold'], '.3g'):<13}{_variant(r):<22}"
            f"{r['tensor_bytes'] / GB:>8.2f}{r['budget_bytes'] / GB:>8.1f}{r['wall_s']:>8.1f}"
            f"{r['peak_rss_bytes'] / GB:>8.2f}  {'yes' if r['within_budget'] else 'NO':<5}"
            f"{r.get('removed_exact', 0):>9,}{r.get('removed_near', 0):>9,}{surv:>14}  "
            f"{r['status']}")
    lines.append("survivors: records of the planted groups (crowds with their centre, or "
                 "planted pairs) still in the clean output / number of groups; ideal: equal")
    return "\n".join(lines)
