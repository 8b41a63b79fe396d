"""Differential fuzz of the near stage against the brute-force oracle (tests/oracle.py).

Each seed makes a small random case shaped like trouble: 1 to 130 values per record,
float16/32/64 or small integers, magnitudes over six orders, exact and near copies,
blank (all-zero) records, a crowd around one record, NaN rows; l2, cosine, correlation
(over 1 or 3 interleaved channels; with copies scaled and shifted, flat records and large
offsets) or allclose at tolerances from 0 up; both groupings; cells forced small so that
records straddle them. Then it checks one front end:

- ``kernel``: ``find_near`` in exact mode equals ``near_oracle`` (removed -> kept);
- ``job``: ``run_job`` on two Parquet files (random row groups): exact copies name the
  first copy and the clean shards hold the rest; in exact mode the removed set is the
  oracle's plus the exact copies and near removals name the oracle's kept record; in
  auto and bounded mode (which may miss pairs) each near removal names a kept record
  within tolerance (components: in its oracle component);
- ``online``: ``OnlineDedup`` fed random batch sizes equals ``stream_oracle``.

Prints one JSON line per failing seed (its case and the first differences) and a count.
Found so far: cosine pairs whose 1 - cos rounds to 0 missed at tiny tolerances (the
search radius), zero vectors chosen as nearest neighbours in the report's histogram.

Usage: python scripts/fuzz_near.py --what kernel [--seeds 0:1000] [--minutes 10]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from benchkit import ROOT, fuzz_seeds

sys.path.insert(0, str(ROOT))
from tests.oracle import canonical_key, near_oracle, stream_oracle  # noqa: E402
from transforms.near.find import find_near
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance  # noqa: E402


def random_case(rng: np.random.Generator) -> tuple[np.ndarray, NearSpec]:
    d = int(rng.choice([1, 2, 3, 8, 33, 64, 130]))
    metric = str(rng.choice(["l2", "cosine", "correlation", "allclose"]))
    channels = 3 if metric == "correlation" and d % 3 == 0 and rng.random() < 0.5 else 1
    n0 = int(rng.integers(5, 400))
    kind = str(rng.choice(["float", "int", "magnitudes"]))
    if kind == "int":
        x = rng.integers(0, 4, (n0, d)).astype(rng.choice([np.float32, np.uint8, np.int16]))
    else:
        x = rng.standard_normal((n0, d))
        if kind == "magnitudes":
            x *= 10 ** rng.uniform(-3, 3, (n0, 1))
        x = x.astype(rng.choice([np.float32, np.float64, np.float16]))
    xf = x.astype(np.float64)
    if metric == "l2":
        scale = float(np.median(np.linalg.norm(xf, axis=1)) + 1e-9)
        tol = dict(threshold=float(rng.choice([1e-6, 1.0, scale * 0.05, scale * 0.3])))
    elif metric in ("cosine", "correlation"):
        tol = dict(threshold=float(rng.choice([1e-6, 1e-3, 0.01, 0.1, 0.5])))  # > 0
    else:
        tol = dict(atol=float(rng.choice([0.0, 1e-3, 0.1, 1.0])),
                   rtol=float(rng.choice([0.0, 1e-3, 0.05])))
    parts = [x]
    for _ in range(int(rng.integers(0, 4))):  # exact and near copies of a few records
        src = xf[rng.integers(0, n0, int(rng.integers(1, 60)))]
        noise = (rng.standard_normal(src.shape) * float(rng.choice([0, 1e-4, 1e-2, 0.1]))
                 * (np.abs(src).mean() + 1e-6))
        if metric == "correlation" and x.dtype.kind == "f":  # contrast and brightness
            src = src * rng.uniform(0.5, 2, (len(src), 1)) + rng.normal(0, 3, (len(src), 1))
        parts.append((src + noise if x.dtype.kind == "f" else src).astype(x.dtype))
    if rng.random() < 0.3:  # blank records (correlation: flat ones of several values)
        flat = rng.integers(0, 4, (1, 1)) if metric == "correlation" else 0
        parts.append((np.zeros((int(rng.integers(1, 20)), d)) + flat).astype(x.dtype))
    if metric == "correlation" and x.dtype.kind == "f" and rng.random() < 0.3:
        top = 3 if x.dtype == np.float16 else 5  # float16 ends at 65,504
        parts[0] = (xf + 10 ** rng.uniform(0, top, (n0, 1))).astype(x.dtype)  # offsets
    if rng.random() < 0.3:  # a crowd around one record
        c, m = xf[rng.integers(0, n0)], int(rng.integers(20, 300))
        crowd = (c + rng.standard_normal((m, d)) * 1e-4 * (np.abs(c).mean() + 1e-6)
                 if x.dtype.kind == "f" else np.repeat(c[None], m, 0))
        parts.append(crowd.astype(x.dtype))
    x = np.concatenate(parts)
    if x.dtype.kind == "f" and rng.random() < 0.2:
        x[rng.integers(0, len(x), 3), 0] = np.nan
    x = x[rng.permutation(len(x))]
    return x, NearSpec(metric, **tol, grouping=str(rng.choice(["representative", "components"])),
                       mode="exact", recall_sample=0, channels=channels,
                       single_index_rows=int(rng.choice([10, 50, 20000])),
                       partition_rows=int(rng.choice([5, 20, 100])))


def _mapping_diff(got: dict[int, int], want: dict[int, int]) -> list:
    return [[k, got.get(k), want.get(k)] for k in sorted(got.keys() | want.keys())
            if got.get(k) != want.get(k)][:5]


def check_kernel(x: np.ndarray, spec: NearSpec, rng: np.random.Generator) -> list:
    r = find_near(x, np.arange(len(x)), spec)
    return _mapping_diff(dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)),
                         near_oracle(x, spec))


def check_online(x: np.ndarray, spec: NearSpec, rng: np.random.Generator) -> list:
    from filters.online import OnlineDedup

    x, spec = x[:400], replace(spec, grouping="representative")
    f, keep, s = OnlineDedup(near=spec), np.zeros(len(x), bool), 0
    while s < len(x):
        b = int(rng.integers(1, 100))
        keep[s:s + b] = f.keep_mask(x[s:s + b])
        s += b
    return np.flatnonzero(keep != stream_oracle(x, spec))[:5].tolist()


def check_job(x: np.ndarray, spec: NearSpec, rng: np.random.Generator) -> list:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline import run_job

    if x.dtype in (np.float16, np.int16):
        x = x.astype(np.float32)
    if x.shape[1] == 1 and spec.metric in ("cosine", "correlation"):
        spec = replace(spec, metric="l2")  # the job refuses a direction of one value
    spec = replace(spec, channels=1)  # the job centres channels of decoded images only
    work = Path(tempfile.mkdtemp(prefix="fuzz-near-"))
    try:
        (work / "in").mkdir()
        n = len(x)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
        ids = pa.array([f"r{i}" for i in range(n)])
        for k, (a, b) in enumerate([(0, n // 2), (n // 2, n)]):
            pq.write_table(pa.table({"id": ids[a:b], "emb": emb[a:b]}),
                           work / "in" / f"part-{k}.parquet",
                           row_group_size=int(rng.integers(50, 500)))
        mode = str(rng.choice(["exact", "exact", "auto", "bounded"]))
        near = {"metric": spec.metric, "grouping": spec.grouping, "mode": mode,
                "single_index_rows": spec.single_index_rows,
                "partition_rows": spec.partition_rows, "recall_sample": int(rng.choice([0, 50]))}
        near.update(dict(atol=spec.atol, rtol=spec.rtol) if spec.metric == "allclose"
                    else dict(threshold=spec.threshold))
        run_job({"input": {"format": "parquet", "path": str(work / "in" / "*.parquet"),
                           "tensor": "emb", "id": "id"},
                 "output": {"path": str(work / "out" / "clean")},
                 "report": str(work / "out" / "report"), "near": near,
                 "max_invalid_fraction": 1.0})
        dup = pq.read_table(work / "out" / "report" / "duplicates.parquet").to_pylist()
        got = {int(r["record_id"][1:]): (int(r["duplicate_of"][1:]), r["kind"]) for r in dup}
        first: dict[tuple, int] = {}
        exact = {i: first.setdefault(canonical_key(x[i]), i) for i in range(n)}
        exact = {i: k for i, k in exact.items() if k != i}
        want = near_oracle(x, spec)
        problems = [[r, k, kind, exact.get(r)] for r, (k, kind) in got.items()
                    if kind == "exact" and exact.get(r) != k][:5]
        if mode == "exact":
            problems += [p for p in (
                ["removed only by the job", sorted(set(got) - set(want) - set(exact))[:5]],
                ["removed only by the oracle", sorted((set(want) | set(exact)) - set(got))[:5]])
                if p[1]]
            problems += [[r, k, kind, want.get(r)] for r, (k, kind) in got.items()
                         if kind == "near" and r in want and r not in exact and want[r] != k][:5]
        else:  # bounded may miss pairs: each near removal must still be justified
            near_rows = [(r, k) for r, (k, kind) in got.items() if kind == "near"]
            problems += [["near removal names a removed record", r, k]
                         for r, k in near_rows if k in got][:5]
            if spec.grouping == "representative" and near_rows:
                r, k = (np.array(v) for v in zip(*near_rows, strict=True))
                problems += [["near removal out of tolerance", a, b] for a, b, ok in zip(
                    r, k, exact_distance(x[r], x[k], spec)[1], strict=True) if not ok][:5]
            elif near_rows:  # components: one oracle component (first record as its root)
                problems += [["near removal outside its component", r, k]
                             for r, k in near_rows if want.get(r, r) != want.get(k, k)][:5]
        clean = sum(pq.read_table(p).num_rows for p in (work / "out" / "clean").glob("*.parquet"))
        if clean != n - len(got):
            problems.append(["clean rows", clean, n - len(got)])
        return problems
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", choices=["kernel", "job", "online"], default="kernel")
    ap.add_argument("--seeds", default="0:1000", help="first:last (last excluded)")
    ap.add_argument("--minutes", type=float, default=10.0, help="stop after this long")
    args = ap.parse_args()
    check = {"kernel": check_kernel, "job": check_job, "online": check_online}[args.what]

    def case(seed: int, _stats) -> tuple[dict, list]:
        rng = np.random.default_rng(seed)
        x, spec = random_case(rng)
        what = {"seed": seed, "rows": len(x), "dim": x.shape[1], "dtype": str(x.dtype),
                "spec": str(spec)}
        return what, check(x, spec, rng)

    fuzz_seeds(args.what, args.seeds, args.minutes, case)

if __name__ == "__main__":
    main()
