"""What reading NumPy .npy files and .npz archives costs the job against Parquet, and
against what a user did before (convert to Parquet first; or numpy's own exact dedup,
``np.unique(axis=0)``).

The vectors of ``bench_growth.make`` (128-d embedding-like float32 rows with exact and
planted near copies) in 4 files, as ``np.save`` and ``np.savez`` write them and as Parquet (a
``fixed_size_list`` column, no id column: ids are ``<file>:<row>`` in both), whole CLI
processes one after another, exact only and with cosine 0.01. Per run: wall and CPU
seconds of the process tree, peak RSS, input bytes, removed, and whether the removals
(file stem and row, what they copy, kind) equal the Parquet job's. Writes bench-npy.json.

    python scripts/bench_npy.py [--vectors 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_growth import make  # noqa: E402
from benchkit import timed, timed_job  # noqa: E402

FILES = 4
FORMATS = ("parquet", "npy", "npz")  # the first is the one the others are compared with
NEAR = {"metric": "cosine", "threshold": 0.01}
# What a user ran before: each .npy file written as Parquet, then the Parquet job
CONVERT = """import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
for src in sys.argv[1:]:
    a = np.load(src)
    pq.write_table(pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)),
                                                                      a.shape[1])}),
                   src.replace(".npy", ".parquet"))
"""
# numpy's exact dedup of the rows (no report, no clean copies: the floor of the work)
UNIQUE = """import sys, numpy as np
a = np.concatenate([np.load(f) for f in sys.argv[1:]])
_, first = np.unique(a, axis=0, return_index=True)
print(len(a) - len(first))
"""


def _job(fmt: str, data: Path, out: Path, near: bool) -> dict:
    return timed_job({"format": fmt, "path": str(data / f"*.{fmt}"),
                      **({} if fmt == "npy" else {"tensor": "emb"})}, out, NEAR if near else None)


def measure(n: int) -> tuple[list[dict], int]:
    """Every run's row, and the vectors' width."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-npy-") as tmp:
        work = Path(tmp)
        make(n, work / "src")
        x = np.load(work / "src" / "x.npy", mmap_mode="r")  # every row, in the files' order
        for fmt in FORMATS:
            (work / fmt).mkdir()
        for i, part in enumerate(np.array_split(x, FILES)):
            np.save(work / "npy" / f"part-{i}.npy", part)
            np.savez(work / "npz" / f"part-{i}.npz", emb=part)
            emb = pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), part.shape[1])
            pq.write_table(pa.table({"emb": emb}), work / "parquet" / f"part-{i}.parquet")
        size = {f: sum(p.stat().st_size for p in (work / f).iterdir()) for f in FORMATS}
        npys = [str(p) for p in sorted((work / "npy").glob("*.npy"))]
        for near in (False, True):
            mode = "cosine 0.01" if near else "exact"
            first = None
            for fmt in FORMATS:
                r = _job(fmt, work / fmt, work / "out" / f"{fmt}-{near}", near)
                got = r.pop("removals", None)
                first = got if first is None else first
                rows.append(r | {"what": f"tensordedup on {FILES} {fmt} files", "mode": mode,
                                 "input_bytes": size[fmt], "same": got == first})
                print(f"{mode} {fmt}: {r['wall_s']:.1f} s, rc {r['rc']}", file=sys.stderr)
            if not near:
                (work / "conv").mkdir()
                for p in npys:
                    os.link(p, work / "conv" / Path(p).name)
                r = timed([sys.executable, "-c", CONVERT, *sorted(
                    str(p) for p in (work / "conv").glob("*.npy"))], work / "conv.log")
                rows.append(r | {"what": "np.load + pq.write_table (the conversion a user "
                                 "ran before)", "mode": "-", "input_bytes": size["npy"],
                                 "same": None})
                r = timed([sys.executable, "-c", UNIQUE, *npys], work / "unique.log")
                rows.append(r | {"what": "numpy np.unique(axis=0) of all rows (no report, "
                                 "no copies)", "mode": "exact", "input_bytes": size["npy"],
                                 "same": None})
        width = x.shape[1]
    for r in rows:
        r.pop("stderr_tail", None)
    return rows, width


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vectors", type=int, default=1_000_000)
    ap.add_argument("--json", default="bench-npy.json")
    a = ap.parse_args()
    rows, width = measure(a.vectors)
    lines = [f"{a.vectors:,} x {width} float32 vectors, {FILES} files",
             "| run | mode | input MB | wall s | CPU s | peak MB | removed | same removals as "
             "Parquet |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['what']} | {r['mode']} | {r['input_bytes'] / 1e6:,.0f} | {r['wall_s']:.1f} | "
              f"{r['cpu_s']:.1f} | {r['peak_rss_bytes'] / 1e6:,.0f} | "
              f"{format(r['removed'], ',') if 'removed' in r else '-'} | "
              f"{'-' if r['same'] is None else r['same']} |" for r in rows]
    print("\n".join(lines))
    Path(a.json).write_text(json.dumps({"vectors": a.vectors, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
