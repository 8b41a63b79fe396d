"""Bytes a near job downloads from an object store, per kind of file (issue 44, the spill on
object stores): the job runs in this process on ``fakegs://`` (tests/fakefs.py: objects in
a local folder, read through Beam's own GCS reader, ``BeamBlobReader``, which counts what
each ranged download returned), or on ``fakes3://`` (Beam's S3 / Azure way of reading: a
16 MB buffer over ranged gets). ``--latency-ms`` gives each download request a round
trip, ``--remote-reads`` the files a cell reads at once (``transforms.io.streams``).

Data: N x D float32 Gaussian rows in 3 Parquet files, 5% near copies (l2 0.001 from a row
of another file), l2 threshold 0.05, cells of about 500 rows. Per kind of file (the input
Parquet files, the spill's value files, the cells' slices, the recall sample, the plan's
cells, the report): objects read, the bytes they hold, the bytes downloaded, the ratio.

    python scripts/bench_object_store.py [--rows 200000] [--dim 64] [--scheme fakegs]
        [--json bench-object-store.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.run import main as run_cli  # noqa: E402
from tests import fakefs  # noqa: E402
from transforms.io import streams  # noqa: E402

KINDS = [("input Parquet files", r"/in/"), ("spill: cells' slices (cells/)", r"\.near/cells/"),
         ("spill: chunk values (values/)", r"\.near/values/"),
         ("spill: recall sample (cells-recall/)", r"\.near/cells-recall/"),
         ("spill: plan (cells-plan/)", r"\.near/cells-plan/"), ("other", r"")]


def make(bucket: Path, n: int, d: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d)).astype(np.float32)
    m = n // 20
    x[n - m:] = x[:m] + np.float32(0.001)
    for f, rows in enumerate(np.array_split(np.arange(n), 3)):
        p = bucket / "in" / f"p{f}.parquet"
        p.parent.mkdir(parents=True, exist_ok=True)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x[rows].ravel()), d)
        pq.write_table(pa.table({"id": [f"r{i}" for i in rows], "emb": emb}), p,
                       row_group_size=65_536)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--scheme", choices=[fakefs.SCHEME, "fakes3"], default=fakefs.SCHEME)
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="a round trip per download request (GCS: about 10-50 ms)")
    ap.add_argument("--remote-reads", type=int, default=streams.REMOTE_READS,
                    help="files a cell reads at once (1: one after another, as before)")
    ap.add_argument("--json", default="bench-object-store.json")
    args = ap.parse_args()
    streams.REMOTE_READS = args.remote_reads
    if args.latency_ms:
        os.environ[fakefs.LATENCY_ENV] = str(args.latency_ms)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[fakefs.ENV] = str(Path(tmp) / "store")
        bucket = Path(tmp) / "store" / "bucket"
        make(bucket, args.rows, args.dim)
        url = f"{args.scheme}://bucket"
        job = {"input": {"format": "parquet", "path": f"{url}/in/*.parquet", "tensor": "emb",
                         "id": "id"},
               "output": {"path": f"{url}/out/clean"}, "report": f"{url}/out/report",
               "runner": {"processes": False},  # the fake is registered in this process
               "near": {"metric": "l2", "threshold": 0.05, "partition_rows": 500}}
        cfg = Path(tmp) / "job.yaml"
        cfg.write_text(yaml.safe_dump(job))
        start = time.perf_counter()
        if run_cli(["--config", str(cfg)]) != 0:
            sys.exit("the job failed")
        seconds = time.perf_counter() - start
        summary = json.loads((bucket / "out" / "report" / "summary.json").read_text())
    rows = {name: collections.Counter() for name, _ in KINDS}
    for path, got in fakefs.FETCHED.items():
        name = next(n for n, pattern in KINDS if re.search(pattern, path))
        rows[name].update(objects=1, held=fakefs.SIZES[path], fetched=got)
    out = {"rows": args.rows, "dim": args.dim, "scheme": args.scheme, "seconds": round(seconds, 1),
           "latency_ms": args.latency_ms, "remote_reads": args.remote_reads,
           "cells": summary["near"]["cells"], "removed_near": summary["removed_near"],
           "kinds": {k: dict(v) for k, v in rows.items() if v}}
    print(f"\n{args.rows:,} x {args.dim} float32 on {args.scheme}://, {out['cells']:,} cells, "
          f"{args.latency_ms:g} ms per request, {args.remote_reads} file(s) read at once: "
          f"{seconds:.1f} s\n")
    print("| files | objects read | bytes they hold | bytes downloaded | downloaded / held |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, v in out["kinds"].items():
        print(f"| {name} | {v['objects']:,} | {v['held']:,} | {v['fetched']:,} | "
              f"{v['fetched'] / max(v['held'], 1):.2f} |")
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
