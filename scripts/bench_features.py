"""A feature table (one numeric column per feature, as pandas writes a DataFrame)
deduplicated by the job (``input.tensor: [f00, ..., visits]``) against the tools people
use for it: pandas' ``drop_duplicates`` and DuckDB's ``DISTINCT ON``, whole processes one
after another, each reading the same Parquet files and writing the kept rows as Parquet,
then the same table as CSV files (each writing CSV).

The table: ``--rows`` rows of 32 float64 features drawn around 1,000 centres at
different scales, an int64 count and a text column; 5% of the rows are exact copies of
earlier ones and 5% near copies (each feature moved by up to a millionth of its range).
The job runs exact only, then with ``near: {metric: l2, threshold: 0.01}`` (the
near copies' largest distance is about 0.0005); also over the same vectors written as
one ``fixed_size_list`` column (what the columns cost). Exact removals are checked
equal to pandas' (the same rows, keep first).

Per run: wall and CPU seconds of the process tree, peak RSS, rows removed, and whether
the exact removals equal pandas'. Writes bench-features.json.

    python scripts/bench_features.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pv
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import ROOT, run_watched  # noqa: E402

FEATURES = [f"f{i:02d}" for i in range(32)]
COLUMNS = [*FEATURES, "visits"]
FILES = 4


def build(n: int, data: Path, seed: int = 0) -> None:
    """The table in FILES Parquet files (pandas' layout: one column per feature), and its
    twin with the vectors as one column (``vec``) in ``data / 'vec'``."""
    rng = np.random.default_rng(seed)
    distinct = n - 2 * (n // 20)
    centres = rng.normal(size=(1000, 32)) * rng.uniform(0.1, 100, 32)
    x = centres[rng.integers(0, 1000, distinct)] + rng.normal(size=(distinct, 32))
    visits = rng.integers(0, 50, distinct)
    src = rng.integers(0, distinct, (2, n // 20))
    span = x.max(axis=0) - x.min(axis=0)
    near = x[src[1]] + rng.uniform(-1, 1, (n // 20, 32)) * span * 1e-6
    x = np.concatenate([x, x[src[0]], near])
    visits = np.concatenate([visits, visits[src[0]], visits[src[1]]])
    order = rng.permutation(n)
    x, visits = x[order], visits[order]
    cols = {"id": pa.array([f"r{i}" for i in range(n)])}
    cols |= {f: pa.array(x[:, j]) for j, f in enumerate(FEATURES)}
    cols |= {"visits": pa.array(visits.astype(np.int64)),
             "note": pa.array([f"row {i} of the table" for i in range(n)])}
    table = pa.table(cols)
    vec = np.concatenate([x, visits[:, None]], axis=1).reshape(-1)
    twin = pa.table({"id": cols["id"], "vec": pa.FixedSizeListArray.from_arrays(
        pa.array(vec), len(COLUMNS)), "note": cols["note"]})
    for folder, t in ((data / "cols", table), (data / "vec", twin), (data / "csv", table)):
        folder.mkdir(parents=True)
        size = -(-n // FILES)
        for i in range(FILES):
            if folder.name == "csv":
                pv.write_csv(t.slice(i * size, size), folder / f"part-{i}.csv")
            else:
                pq.write_table(t.slice(i * size, size), folder / f"part-{i}.parquet")


def _timed(cmd: list[str], log: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_watched(cmd, cwd=ROOT, log=log, limit_bytes=16 << 30, timeout_s=3600,
                    env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return r


def job(data: Path, out: Path, tensor, near: bool, fmt: str = "parquet") -> dict:
    """One whole CLI job; its removals (ids, exact ones apart)."""
    out.mkdir(parents=True)
    cfg = {"input": {"format": fmt, "path": str(data / f"*.{fmt}"), "tensor": tensor,
                     "id": "id"},
           "output": {"path": str(out / "clean")}, "report": str(out / "report")}
    if near:
        cfg["near"] = {"metric": "l2", "threshold": 0.01}
    (out / "job.yaml").write_text(yaml.safe_dump(cfg))
    r = _timed([sys.executable, "-m", "pipeline.run", "--config", str(out / "job.yaml"),
                "--quiet"], out / "stderr.log")
    if r["rc"] == 0:
        dups = pq.read_table(out / "report" / "duplicates.parquet")
        ids, kinds = dups["record_id"].to_pylist(), dups["kind"].to_pylist()
        r["removed"] = len(ids)
        r["exact_ids"] = sorted(i for i, k in zip(ids, kinds, strict=True) if k == "exact")
    return r


PANDAS = """
import glob, sys, pandas as pd
fmt = sys.argv[4]
files = sorted(glob.glob(sys.argv[1] + "/*." + fmt))
df = pd.concat([getattr(pd, "read_" + fmt)(f) for f in files], ignore_index=True)
dup = df.duplicated(subset=sys.argv[3].split(","), keep="first")
getattr(df[~dup], "to_" + fmt)(sys.argv[2] + "/kept." + fmt, index=False)
open(sys.argv[2] + "/removed.txt", "w").write("\\n".join(sorted(df["id"][dup])))
"""

DUCKDB = """
import sys, duckdb
cols, fmt = ", ".join(sys.argv[3].split(",")), sys.argv[4]
duckdb.sql(f"COPY (SELECT DISTINCT ON ({cols}) * FROM read_{fmt}('{sys.argv[1]}/*.{fmt}'))"
           f" TO '{sys.argv[2]}/kept.{fmt}' (FORMAT {fmt})")
"""


def peer(name: str, source: str, data: Path, out: Path, rows: int,
         fmt: str = "parquet") -> dict:
    out.mkdir(parents=True)
    r = _timed([sys.executable, "-c", source, str(data), str(out), ",".join(COLUMNS), fmt],
               out / "stderr.log")
    if r["rc"] == 0:
        kept = out / f"kept.{fmt}"
        r["removed"] = rows - (pq.ParquetFile(kept).metadata.num_rows if fmt == "parquet"
                               else pv.read_csv(kept).num_rows)
        if (out / "removed.txt").exists():
            r["exact_ids"] = sorted((out / "removed.txt").read_text().split())
    return r


def table(rows: list[dict]) -> str:
    lines = ["| tool | run | wall s | CPU s | peak MB | removed | exact removals as pandas' |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['tool']} | {r['run']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
              f"{r['peak_rss_bytes'] / 1e6:,.0f} | {r.get('removed', 'failed')} | "
              f"{r.get('same', '')} |" for r in rows]
    return "\n".join(lines)


def measure(work: Path, n: int) -> list[dict]:
    """Every run of the table of ``n`` rows built under ``work``, one after another."""
    build(n, work / "data")
    cols, vec, csv = work / "data" / "cols", work / "data" / "vec", work / "data" / "csv"
    runs = [("pandas", "drop_duplicates", lambda o: peer("pandas", PANDAS, cols, o, n)),
            ("duckdb", "DISTINCT ON", lambda o: peer("duckdb", DUCKDB, cols, o, n)),
            ("tensordedup", "exact, 33 columns", lambda o: job(cols, o, COLUMNS, False)),
            ("tensordedup", "exact, one list column", lambda o: job(vec, o, "vec", False)),
            ("tensordedup", "exact + near l2 0.01, 33 columns",
             lambda o: job(cols, o, COLUMNS, True)),
            ("tensordedup", "exact + near l2 0.01, one list column",
             lambda o: job(vec, o, "vec", True)),
            ("pandas", "CSV: drop_duplicates", lambda o: peer("pandas", PANDAS, csv, o, n, "csv")),
            ("duckdb", "CSV: DISTINCT ON", lambda o: peer("duckdb", DUCKDB, csv, o, n, "csv")),
            ("tensordedup", "CSV: exact, 33 columns", lambda o: job(csv, o, COLUMNS, False, "csv")),
            ("tensordedup", "CSV: exact + near l2 0.01, 33 columns",
             lambda o: job(csv, o, COLUMNS, True, "csv"))]
    rows, oracle = [], None
    for k, (tool, run, fn) in enumerate(runs):
        r = fn(work / f"out-{k}")
        ids = r.pop("exact_ids", None)
        oracle = ids if tool == "pandas" and oracle is None else oracle
        r |= {"tool": tool, "run": run, "rows": n,
              "same": None if ids is None or oracle is None else ids == oracle}
        if r["rc"] == 0:
            r.pop("stderr_tail")
        rows.append(r)
        print(f"{tool} {run}: {r['wall_s']:.1f} s, rc {r['rc']}", file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", default="bench-features.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-features-") as tmp:
        rows = measure(Path(tmp), a.rows)
    print(table(rows))
    Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
