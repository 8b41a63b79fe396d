"""Benchmark the dedup job against peers on the same files, in one run.

Parquet: 1 M rows x 128 float32 (64 Ki-row groups, 10% exact duplicates, an ``id``
column). Contenders: this job (exact only) with default settings, on the local runner
with one worker and with every core (``runner.workers`` set), and on Beam's DaskRunner
with a 2-process local cluster; duckdb keep-first
(``QUALIFY row_number() OVER (PARTITION BY emb ORDER BY id) = 1``) and a plain duckdb
copy (the read + write floor). TFRecord: 200 k tf.train.Example records x 128
float32; contenders: this job, a tf.data keep-first loop (parse, dict over the
tensor bytes, TFRecordWriter) and a tf.data copy (the floor).

Each contender runs in its own process (wall time includes start-up and imports;
peak RSS is that process's). Runs alternate and the median is reported; ratios
are to the peers measured in the same run. Prints a table, writes JSON.

Usage: python scripts/bench_pipeline.py [--quick] [--repeat 3] [--json bench-pipeline.json]
       python scripts/bench_pipeline.py --rows 10000000 --files 10 --no-tfrecord
(``--files N``: N Parquet files whose duplicates copy rows of any file; ``--only S``
runs the contenders whose names hold S, repeatable.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import textwrap
from pathlib import Path

import numpy as np
from benchkit import PEAK_RSS_MB, run_python

DIM, GROUP_ROWS, DUP_FRACTION = 128, 65536, 0.10


def make_vectors(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    unique = int(n * (1 - DUP_FRACTION))
    x = rng.standard_normal((unique, DIM), dtype=np.float32)
    x = np.concatenate([x, x[rng.integers(0, unique, n - unique)]])
    return x[rng.permutation(n)]


def write_vectors(path: Path, ids: np.ndarray, x: np.ndarray) -> None:
    """One Parquet file of ``id`` (int64) and ``emb`` (fixed-size lists), GROUP_ROWS a group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM)
    pq.write_table(pa.table({"id": ids, "emb": emb}), path, row_group_size=GROUP_ROWS)


def make_parquet(path: Path, n: int) -> None:
    write_vectors(path, np.arange(n, dtype=np.int64), make_vectors(n))


def make_parquet_files(folder: Path, n: int, files: int) -> None:
    """``files`` Parquet files of n / files rows each, ids running on across them; the 10%
    duplicates copy rows of any file (earlier or later), at random positions. Every
    file's unique rows are held at once (4.6 GB at 10 M)."""
    per = n // files
    uniq = int(per * (1 - DUP_FRACTION))
    rng = np.random.default_rng(7)
    source = [np.random.default_rng(100 + f).standard_normal((uniq, DIM), dtype=np.float32)
              for f in range(files)]
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        pick_file = rng.integers(0, files, per - uniq)
        pick_row = rng.integers(0, uniq, per - uniq)
        copies = np.empty((per - uniq, DIM), np.float32)
        for a in range(files):
            copies[pick_file == a] = source[a][pick_row[pick_file == a]]
        x = np.concatenate([source[f], copies])[rng.permutation(per)]
        write_vectors(folder / f"part-{f:03d}.parquet",
                      np.arange(f * per, (f + 1) * per, dtype=np.int64), x)


def make_tfrecord(path: Path, n: int) -> None:
    import tensorflow as tf

    x = make_vectors(n, seed=1)
    with tf.io.TFRecordWriter(str(path)) as w:
        for i, row in enumerate(x):
            feat = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "emb": tf.train.Feature(float_list=tf.train.FloatList(value=row))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feat))
                    .SerializeToString())


# Each snippet runs in a fresh process and prints {"rows_out": ...} on its last line.
JOB = """
import json, sys
from pipeline.runners.common import imports_frozen
from pipeline.run import main
imports_frozen()  # as the command does (pipeline.run.console), and it ends as it does
rc = main(["--config", CONFIG, "--quiet", "--overwrite"] + EXTRA)
s = json.load(open(REPORT + "/summary.json"))
print(json.dumps({"rows_out": s["kept"], "inner_s": s["wall_time_s"], "rc": rc}))
"""
DUCK_DEDUP = """
import duckdb, json
duckdb.sql("SET enable_progress_bar = false")
duckdb.sql(f"COPY (SELECT * FROM read_parquet('{SRC}') QUALIFY row_number() OVER "
           f"(PARTITION BY emb ORDER BY id) = 1) TO '{DST}' (FORMAT parquet)")
n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{DST}')").fetchall()[0][0]
print(json.dumps({"rows_out": n}))
"""
DUCK_COPY = """
import duckdb, json
duckdb.sql("SET enable_progress_bar = false")
duckdb.sql(f"COPY (SELECT * FROM read_parquet('{SRC}')) TO '{DST}' (FORMAT parquet)")
n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{DST}')").fetchall()[0][0]
print(json.dumps({"rows_out": n}))
"""
TF_DEDUP = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
spec = {"emb": tf.io.FixedLenFeature([128], tf.float32)}
seen, n = set(), 0
with tf.io.TFRecordWriter(DST) as w:
    for batch in tf.data.TFRecordDataset(SRC).batch(4096):
        embs = tf.io.parse_example(batch, spec)["emb"].numpy()
        for raw, e in zip(batch.numpy(), embs):
            key = e.tobytes()
            if key not in seen:
                seen.add(key)
                w.write(raw)
                n += 1
print(json.dumps({"rows_out": n}))
"""
TF_COPY = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
n = 0
with tf.io.TFRecordWriter(DST) as w:
    for raw in tf.data.TFRecordDataset(SRC).batch(4096):
        for r in raw.numpy():
            w.write(r)
            n += 1
print(json.dumps({"rows_out": n}))
"""
FOOTER = f"""
print(json.dumps({{**json.loads(_last), "rss_mb": {PEAK_RSS_MB}}}))
"""


# The command's end (``tensordedup``): exit handlers, then no interpreter teardown.
COMMAND_END = "from pipeline.runners.common import end_process\nend_process(0)\n"


def run_snippet(code: str, end: str = "", **names) -> dict:
    prelude = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    body = textwrap.dedent(code)
    wrapped = (prelude + "import io, contextlib, json\n_buf = io.StringIO()\n"
               "with contextlib.redirect_stdout(_buf):\n"
               + textwrap.indent(body, "    ")
               + "\n_last = _buf.getvalue().strip().splitlines()[-1]\n" + FOOTER + end)
    out, wall = run_python(wrapped)
    return {**out, "wall_s": wall}


def job_config(work: Path, fmt: str, src: Path) -> Path:
    import yaml

    cfg = {"input": {"format": fmt, "path": str(src), "tensor": "emb", "id": "id"},
           "output": {"path": str(work / f"job-{fmt}" / "clean")},
           "report": str(work / f"job-{fmt}" / "report"), "keep": "first"}
    if fmt == "tfrecord":
        cfg["input"].update(shape=[DIM], dtype="float32")
        cfg["tuning"] = {"chunk_rows": 16384}
    path = work / f"job-{fmt}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def job_contender(work: Path, fmt: str, src: Path, extra: list[str]) -> tuple[str, dict]:
    """The job as a contender, run as the command runs it: its snippet and names
    (config, report dir, extra --set; the command's end)."""
    return JOB, dict(CONFIG=str(job_config(work, fmt, src)),
                     REPORT=str(work / f"job-{fmt}" / "report"), EXTRA=extra, end=COMMAND_END)


def bench(contenders: dict[str, tuple[str, dict]], repeat: int) -> dict[str, dict]:
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, (code, names) in contenders.items():
            runs[name].append(run_snippet(code, **names))
    out = {}
    for name, rs in runs.items():
        out[name] = {"wall_s": statistics.median(r["wall_s"] for r in rs),
                     "rss_mb": max(r["rss_mb"] for r in rs), "rows_out": rs[0]["rows_out"],
                     "runs_wall_s": [round(r["wall_s"], 3) for r in rs]}
        if "inner_s" in rs[0]:
            out[name]["job_inner_s"] = statistics.median(r["inner_s"] for r in rs)
    return out


def table(title: str, res: dict[str, dict], ref: str, floor: str) -> str:
    peers = [p for p in (ref, floor) if p in res]
    w = max(len(ref), len(floor)) + 5
    lines = [f"\n{title}", f"{'contender':<32}{'wall s':>8}{'peak RSS MB':>13}{'rows out':>11}"
             + "".join(f"{'vs ' + p:>{w}}" for p in peers)]
    for name, r in res.items():
        lines.append(f"{name:<32}{r['wall_s']:>8.2f}{r['rss_mb']:>13.0f}{r['rows_out']:>11,}"
                     + "".join(f"{r['wall_s'] / res[p]['wall_s']:>{w - 1}.2f}x" for p in peers))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 k Parquet rows, 20 k TFRecords")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default="/tmp/tensordedup-bench")
    ap.add_argument("--json", default="bench-pipeline.json")
    ap.add_argument("--rows", type=int, help="Parquet rows (default 1 M; --quick 100 k)")
    ap.add_argument("--files", type=int, default=1, help="Parquet files the rows are split in")
    ap.add_argument("--no-tfrecord", action="store_true", help="skip the TFRecord comparison")
    ap.add_argument("--only", action="append", default=[], metavar="S",
                    help="run only the contenders whose names hold S (repeatable)")
    ap.add_argument("--job-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra --set for the job, e.g. runner.options.direct_num_workers=2")
    args = ap.parse_args()
    n_pq, n_tf = (100_000, 20_000) if args.quick else (1_000_000, 200_000)
    n_pq = args.rows or n_pq
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tf_src = work / f"vectors-{n_tf}.tfrecord"
    if args.files == 1:
        pq_src = pq_read = work / f"vectors-{n_pq}.parquet"
        if not pq_src.exists():
            make_parquet(pq_src, n_pq)
    else:
        pq_src = work / f"vectors-{n_pq}-{args.files}files"
        pq_read = pq_src / "*.parquet"
        if not (pq_src / f"part-{args.files - 1:03d}.parquet").exists():
            make_parquet_files(pq_src, n_pq, args.files)
    if not args.no_tfrecord and not tf_src.exists():
        make_tfrecord(tf_src, n_tf)
    extra = [a for kv in args.job_option for a in ("--set", kv)]

    cores = len(os.sched_getaffinity(0))
    def chosen(contenders: dict) -> dict:
        return {k: v for k, v in contenders.items()
                if not args.only or any(o in k for o in args.only)}

    pq_res = bench(chosen({
        "this job (default settings)": job_contender(work, "parquet", pq_read, extra),
        "this job (local, 1 worker)": job_contender(
            work, "parquet", pq_read, extra + ["--set", "runner.workers=1"]),
        f"this job (local, {cores} workers)": job_contender(
            work, "parquet", pq_read, extra + ["--set", f"runner.workers={cores}"]),
        "this job (dask, 2 processes)": job_contender(
            work, "parquet", pq_read, extra + ["--set", "runner.name=dask",
                                              "--set", "runner.workers=2"]),
        "duckdb keep-first": (DUCK_DEDUP, dict(SRC=str(pq_read), DST=str(work / "duck.parquet"))),
        "duckdb copy (floor)": (DUCK_COPY, dict(SRC=str(pq_read), DST=str(work / "copy.parquet"))),
    }), args.repeat)
    tf_res = {} if args.no_tfrecord else bench(chosen({
        "this job (default settings)": job_contender(work, "tfrecord", tf_src, extra),
        "this job (local, 1 worker)": job_contender(
            work, "tfrecord", tf_src, extra + ["--set", "runner.workers=1"]),
        f"this job (local, {cores} workers)": job_contender(
            work, "tfrecord", tf_src, extra + ["--set", f"runner.workers={cores}"]),
        "tf.data + set keep-first": (TF_DEDUP, dict(SRC=str(tf_src), DST=str(work / "tf.rec"))),
        "tf.data copy (floor)": (TF_COPY, dict(SRC=str(tf_src), DST=str(work / "copy.rec"))),
    }), args.repeat)

    size = sum(f.stat().st_size for f in ([pq_src] if pq_src.is_file() else pq_src.iterdir()))
    print(table(f"Parquet {n_pq:,} x {DIM} float32 in {args.files} file(s), {size / 1e6:.0f} MB "
                f"(median of {args.repeat})", pq_res, "duckdb keep-first", "duckdb copy (floor)"))
    if tf_res:
        print(table(f"TFRecord {n_tf:,} x {DIM} float32, {tf_src.stat().st_size / 1e6:.0f} MB "
                    f"(median of {args.repeat})", tf_res, "tf.data + set keep-first",
                    "tf.data copy (floor)"))
    verdict: dict = {"target_ratio": 1.0, "target_rss_mb": 3072, "cores": cores}
    job, one = pq_res.get("this job (default settings)"), pq_res.get("this job (local, 1 worker)")
    every = pq_res.get(f"this job (local, {cores} workers)")
    duck = pq_res.get("duckdb keep-first")
    best = job
    if best and duck:
        verdict.update(parquet_ratio_vs_duckdb_keep_first=round(best["wall_s"] / duck["wall_s"], 3),
                       parquet_peak_rss_mb=round(best["rss_mb"]))
        print(f"\nthe job (default settings) vs duckdb keep-first: "
              f"{verdict['parquet_ratio_vs_duckdb_keep_first']:.2f}x (target <= 1.0x); "
              f"peak RSS {verdict['parquet_peak_rss_mb']} MB (target <= 3072)")
    if every and one:
        verdict["speedup_1_to_all_workers"] = round(one["wall_s"] / every["wall_s"], 3)
    Path(args.json).write_text(json.dumps({"parquet": pq_res, "tfrecord": tf_res,
                                           "verdict": verdict, "rows": [n_pq, n_tf],
                                           "files": args.files}, indent=2))


if __name__ == "__main__":
    main()
