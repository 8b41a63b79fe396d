"""Benchmark near-duplicate search: this kernel and the job vs what users write, on planted data.

Data: N x 128 float32 vectors around 1,000 cluster centres, 5% planted near copies at
0.5-0.95 x the threshold (L2) and 2% decoys at 1.02-1.2 x, in random directions. Saved
once as x.npy and as one Parquet file (``id`` string, ``emb`` fixed_size_list<float32>).
Contenders (keep first, representative grouping for ours):
- this kernel, default settings (index auto) and partitioned (flat inside k-means
  partitions, exact by construction);
- IVF (nprobe 16): one faiss IVF index over everything (approximate);
- the job (Beam, near stage on): the ``pipeline.run`` CLI on the Parquet file: reading
  Parquet, the exact and near stages, writing the clean shards and the report
  (its removals are read back from duplicates.parquet);
- the hand-written baseline: faiss.IndexFlatL2 range_search over everything (radius t^2)
  plus union-find, keep the first of each component;
- quantize-round-hash: the core's quantized fingerprint with step t, keep first per digest.
The oracle is this kernel with a flat index over everything (an exact superset search,
verified in float64). Recall = oracle removals found; precision = removals that are
within tolerance of the record they are merged into.

Each contender (the oracle too) runs in its own fresh process: seconds are timed there
around the work only (no imports, no np.load; for the job, the whole CLI call) and peak
RSS is that process's VmHWM. Prints a table, writes JSON.

Usage: python scripts/bench_near.py [--rows 200000] [--partitions 64] [--only NAME_SUBSTRING]
                                    [--json bench-near.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
from benchkit import PEAK_RSS_MB, ROOT, run_python

from transforms.near import NearSpec, exact_distance

DIM, THRESHOLD, GROUP_ROWS = 128, 0.5, 65536
ORACLE = "oracle (this kernel, flat over everything)"
BASELINE = "baseline: IndexFlatL2 range_search + union-find"
JOB_NAME = "the job (Beam, near stage on)"


def make_data(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_near, n_decoy = int(n * 0.05), int(n * 0.02)
    n_base = n - n_near - n_decoy
    centers = rng.standard_normal((1000, DIM)) * 3
    base = centers[rng.integers(0, 1000, n_base)] + rng.standard_normal((n_base, DIM))

    def moved(rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
        u = rng.standard_normal(rows.shape)
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        return rows + u * (THRESHOLD * rng.uniform(lo, hi, (len(rows), 1)))

    near = moved(base[rng.choice(n_base, n_near)], 0.5, 0.95)
    decoys = moved(base[rng.choice(n_base, n_decoy)], 1.02, 1.2)
    x = np.concatenate([base, near, decoys]).astype(np.float32)
    return x[rng.permutation(n)]


def write_inputs(x: np.ndarray, work: Path) -> None:
    """x.npy for the in-memory contenders, in/part-0.parquet (id = row index) for the job."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    np.save(work / "x.npy", x)
    (work / "in").mkdir()
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    ids = pa.array(np.arange(len(x)).astype(str))
    pq.write_table(pa.table({"id": ids, "emb": emb}), work / "in" / "part-0.parquet",
                   row_group_size=GROUP_ROWS)


def first_of_groups(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(removed, kept) keeping the first row of each label."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    keeper = first[inverse]
    removed = np.flatnonzero(keeper != np.arange(len(labels)))
    return removed, keeper[removed]


def flat_union_find(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import faiss

    index = faiss.IndexFlatL2(x.shape[1])
    index.add(x)
    lims, _, ids = index.range_search(x, THRESHOLD**2)
    parent = list(range(len(x)))

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    rows = np.repeat(np.arange(len(x)), np.diff(lims.astype(np.int64)))
    for a, b in zip(rows.tolist(), ids.tolist(), strict=True):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return first_of_groups(np.array([find(u) for u in range(len(x))]))


def quantize_hash(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from transforms.fingerprint import quantized_fingerprint_batch

    digests = quantized_fingerprint_batch(x, step=THRESHOLD)
    return first_of_groups(np.unique(digests, return_inverse=True)[1])


# Each snippet runs in a fresh process (cwd = repo root) and sets ``seconds``; the array
# contenders save removed.npy / kept.npy (int64 rows, removed[i] merged into kept[i]) in OUT.
KERNEL = """
from transforms.near import NearSpec, near_duplicates
x = np.load(WORK + "/x.npy")
spec, rank = NearSpec("l2", threshold=THRESHOLD, **SPEC), np.arange(len(x))
start = time.perf_counter()
removed, kept, _ = near_duplicates(x, rank, spec, partitions=PARTITIONS)
seconds = time.perf_counter() - start
np.save(OUT + "/removed.npy", removed.astype(np.int64))
np.save(OUT + "/kept.npy", kept.astype(np.int64))
"""
PEER = """
sys.path.insert(0, SCRIPTS)
import bench_near
x = np.load(WORK + "/x.npy")
start = time.perf_counter()
removed, kept = getattr(bench_near, FUNCTION)(x)
seconds = time.perf_counter() - start
np.save(OUT + "/removed.npy", removed.astype(np.int64))
np.save(OUT + "/kept.npy", kept.astype(np.int64))
"""
JOB = """
from pipeline.run import main
start = time.perf_counter()
rc = main(["--config", CONFIG, "--quiet"])
seconds = time.perf_counter() - start
if rc != 0:
    sys.exit(f"the job exited with {rc}")
"""
FOOTER = f"""
print(json.dumps({{"seconds": seconds, "rss_mb": {PEAK_RSS_MB}}}))
"""


def run_snippet(code: str, **names: object) -> dict:
    """Run one contender in a fresh process; its last stdout line is {seconds, rss_mb}."""
    prelude = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    source = ("import json, sys, time\nimport numpy as np\n" + prelude
              + textwrap.dedent(code) + FOOTER)
    out, wall = run_python(source)
    return {**out, "process_wall_s": wall}


def job_config(work: Path) -> Path:
    import yaml

    cfg = {"input": {"format": "parquet", "path": str(work / "in" / "*.parquet"),
                     "tensor": "emb", "id": "id"},
           "output": {"path": str(work / "job" / "clean"), "overwrite": True},
           "report": str(work / "job" / "report"),
           "near": {"metric": "l2", "threshold": THRESHOLD}}
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def job_results(report: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """(removed, kept) rows from duplicates.parquet (exact and near) and the summary figures."""
    import pyarrow.parquet as pq

    dup = pq.read_table(report / "duplicates.parquet",
                        columns=["record_id", "duplicate_of", "kind"]).to_pydict()
    removed = np.array([int(i) for i in dup["record_id"]], dtype=np.int64)
    kept = np.array([int(i) for i in dup["duplicate_of"]], dtype=np.int64)
    summary = json.loads((report / "summary.json").read_text())
    near = summary["near"] or {}
    return removed, kept, {
        "summary_wall_time_s": summary["wall_time_s"],
        "removed_exact": dup["kind"].count("exact"), "removed_near": dup["kind"].count("near"),
        "near_partitions": near.get("partitions"),
        "near_pairs_within_tolerance": near.get("pairs_within_tolerance")}


def contenders(work: Path, partitions: int) -> dict[str, tuple[str, dict]]:
    """Name -> (snippet, names); the oracle first (it defines recall), table order after."""
    flat = {"index": "flat"}
    return {
        ORACLE: (KERNEL, dict(SPEC=flat, PARTITIONS=1)),
        "this kernel (index auto)": (KERNEL, dict(SPEC={}, PARTITIONS=None)),
        f"this kernel (partitioned {partitions}, flat)":
            (KERNEL, dict(SPEC=flat, PARTITIONS=partitions)),
        "IVF (nprobe 16)": (KERNEL, dict(SPEC={"index": "ivf", "nprobe": 16,
                                               "single_index_rows": 10**9}, PARTITIONS=None)),
        JOB_NAME: (JOB, dict(CONFIG=str(job_config(work)))),
        BASELINE: (PEER, dict(FUNCTION="flat_union_find")),
        "quantize-round-hash (step = threshold)": (PEER, dict(FUNCTION="quantize_hash")),
    }


def score(x: np.ndarray, removed: np.ndarray, kept: np.ndarray, oracle_removed: set[int],
          spec: NearSpec) -> dict:
    _, ok = exact_distance(x[removed], x[kept], spec)
    hit = len(set(removed.tolist()) & oracle_removed)
    return {"removed": len(removed), "recall": hit / max(len(oracle_removed), 1),
            "precision": float(ok.mean()) if len(ok) else 1.0}


def table(rows: int, results: dict[str, dict]) -> str:
    w = max(len(name) for name in results) + 2
    lines = [f"\nnear-duplicates, {rows:,} x {DIM} float32, L2 threshold {THRESHOLD} "
             "(each contender in its own process)",
             f"{'contender':<{w}}{'seconds':>9}{'vs flat':>9}{'peak RSS MB':>13}{'removed':>9}"
             f"{'recall':>8}{'precision':>11}"]
    for name, r in results.items():
        vs = "-" if r["vs_flat_baseline"] is None else f"{r['vs_flat_baseline']:.1f}x"
        lines.append(f"{name:<{w}}{r['seconds']:>9.2f}{vs:>9}{r['rss_mb']:>13.0f}"
                     f"{r['removed']:>9,}{r['recall']:>8.4f}{r['precision']:>11.4f}")
    if JOB_NAME in results:
        j = results[JOB_NAME]
        lines.append(f"the job: CLI call {j['seconds']:.2f} s (summary wall_time_s "
                     f"{j['summary_wall_time_s']:.2f} s); near stage: partitions "
                     f"{j['near_partitions']}, pairs within tolerance "
                     f"{j['near_pairs_within_tolerance']:,}; removed {j['removed_exact']:,} exact "
                     f"+ {j['removed_near']:,} near")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--only", action="append", default=[], metavar="NAME_SUBSTRING",
                    help="run only contenders whose name contains this (case-insensitive; "
                    "repeatable); the oracle always runs")
    ap.add_argument("--json", default="bench-near.json")
    args = ap.parse_args()
    spec = NearSpec("l2", threshold=THRESHOLD)
    x = make_data(args.rows)
    with tempfile.TemporaryDirectory(prefix="bench-near-") as tmp:
        work = Path(tmp)
        write_inputs(x, work)
        wanted = {name: c for name, c in contenders(work, args.partitions).items()
                  if name == ORACLE or not args.only
                  or any(s.lower() in name.lower() for s in args.only)}
        results: dict[str, dict] = {}
        oracle: set[int] = set()
        for i, (name, (code, names)) in enumerate(wanted.items()):
            out = work / f"contender-{i}"
            out.mkdir()
            print(f"running {name} ...", file=sys.stderr, flush=True)
            r = run_snippet(code, WORK=str(work), OUT=str(out), THRESHOLD=THRESHOLD,
                            SCRIPTS=str(ROOT / "scripts"), **names)
            if name == JOB_NAME:
                removed, kept, extra = job_results(work / "job" / "report")
                r.update(extra)
            else:
                removed, kept = np.load(out / "removed.npy"), np.load(out / "kept.npy")
            if name == ORACLE:
                oracle = set(removed.tolist())
            results[name] = {**r, **score(x, removed, kept, oracle, spec)}
    results[ORACLE] = results.pop(ORACLE)  # the oracle goes last in the table
    base = results.get(BASELINE, {}).get("seconds")
    for r in results.values():
        r["vs_flat_baseline"] = base / r["seconds"] if base else None
    print(table(args.rows, results))
    Path(args.json).write_text(json.dumps({"rows": args.rows, "dim": DIM,
                                           "threshold": THRESHOLD,
                                           "partitions": args.partitions,
                                           "results": results}, indent=2))


if __name__ == "__main__":
    main()
