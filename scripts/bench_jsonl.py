"""What reading JSON lines and Arrow IPC costs the job against Parquet: the same texts
(and, with ``--vectors``, embeddings) as Parquet, as plain, gzip and zstd JSON lines in 4
files, as one plain JSON lines file (a file is one read unit: one worker reads it) and as
4 Arrow IPC streams of 1,000-row batches (as Hugging Face save_to_disk writes), whole CLI
processes one after another, the near section of ``bench_row_groups`` (jaccard 0.8 on
texts, cosine 0.01 on vectors).

Per layout: wall and CPU seconds of the process tree, peak RSS, input bytes, the counts,
and whether the removals (record, what it is a copy of, kind) equal the Parquet job's.
Writes bench-jsonl.json.

    python scripts/bench_jsonl.py [--texts 100000] [--vectors 0]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_row_groups import build, run, run_cells  # noqa: E402
from benchkit import ROOT  # noqa: E402

FILES = 4
LAYOUTS = (("parquet", "", FILES), ("jsonl", "", FILES), ("jsonl", ".gz", FILES),
           ("jsonl", ".zst", FILES), ("jsonl", "", 1), ("arrow", "", FILES))


def _lines(t: pa.Table) -> bytes:
    """The rows as JSON lines (Python's json: full float precision)."""
    return "".join(json.dumps(r) + "\n" for r in t.to_pylist()).encode()


def write(t: pa.Table, data: Path, fmt: str, codec: str, files: int) -> int:
    """``t`` in ``files`` files of ``fmt``; their bytes in all."""
    data.mkdir(parents=True)
    size = -(-t.num_rows // files)
    for i in range(files):
        part = t.slice(i * size, size)
        path = data / f"part-{i}.{fmt}{codec}"
        if fmt == "parquet":
            pq.write_table(part, path)
        elif fmt == "arrow":
            with pa.ipc.new_stream(str(path), part.schema) as w:
                for batch in part.to_batches(max_chunksize=1000):
                    w.write_batch(batch)
        elif codec == ".gz":
            path.write_bytes(gzip.compress(_lines(part), 6))
        elif codec == ".zst":
            with pa.CompressedOutputStream(str(path), "zstd") as out:
                out.write(_lines(part))
        else:
            path.write_bytes(_lines(part))
    return sum(p.stat().st_size for p in data.iterdir())


def table(rows: list[dict]) -> str:
    lines = ["| data | layout | input MB | wall s | CPU s | peak MB | removed | same removals "
             "as Parquet |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['data']} ({r['records']:,}) | {r['layout']} | "
              f"{r['input_bytes'] / 1e6:,.0f} | {run_cells(r)}" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--vectors", type=int, default=0)
    ap.add_argument("--json", default="bench-jsonl.json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-jsonl-") as tmp:
        work = Path(tmp)
        for kind, n in (("texts", a.texts), ("vectors", a.vectors)):
            if not n:
                continue
            t = build(kind, n, work)
            if kind == "vectors":  # JSON numbers: float64 lists, read as such (all layouts)
                t = t.set_column(t.schema.get_field_index("emb"), "emb", t.column("emb").cast(
                    pa.list_(pa.float64())))
            first = None
            for fmt, codec, files in LAYOUTS:
                layout = f"{files} {fmt}{codec} file{'s' if files > 1 else ''}"
                data = work / kind / layout.replace(" ", "-")
                size = write(t, data, fmt, codec, files)
                r = run(kind, data, work / "out" / data.name, str(ROOT), fmt, f"*.{fmt}{codec}")
                got = r.pop("removals", None)
                first = got if first is None else first
                r |= {"data": kind, "records": t.num_rows, "layout": layout,
                      "input_bytes": size, "same": got is not None and got == first}
                r.pop("stderr_tail") if r["rc"] == 0 else None
                rows.append(r)
                print(f"{kind} {layout}: {r['wall_s']:.1f} s, {r['cpu_s']:.1f} CPU s, "
                      f"rc {r['rc']}", file=sys.stderr)
    print(table(rows))
    Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
