"""What reading Megatron indexed datasets (``.bin`` / ``.idx`` token shards) costs the job
against the same documents in Parquet, and against what a user did before (read the
dataset with Megatron's ``IndexedDataset`` and write Parquet first).

Documents of Zipf-distributed token ids (vocabulary 50,257, lengths log-normal around
``--tokens`` tokens) with exact copies and planted near copies (1% of the tokens
replaced), written by megatron-core's ``IndexedDatasetBuilder`` as ``preprocess_data.py``
does (uint16, one sequence per document) in 4 shards, and as Parquet ``list<uint16>``.
Whole CLI processes one after another, exact only and with jaccard 0.8 over token
5-grams. Per run: wall and CPU seconds of the process tree, peak RSS, input bytes,
removed, and whether the removals (shard and document, what they copy, kind) equal the
Parquet job's. Writes bench-megatron.json.

    python scripts/bench_megatron.py [--documents 200000] [--tokens 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import timed, timed_job  # noqa: E402

FILES = 4
VOCAB = 50_257
NEAR = {"metric": "jaccard", "threshold": 0.8}
# What a user ran before: each shard's documents read by Megatron and written as Parquet
CONVERT = """import sys, warnings, numpy as np, pyarrow as pa, pyarrow.parquet as pq
warnings.simplefilter("ignore")
from megatron.core.datasets.indexed_dataset import IndexedDataset
for prefix in sys.argv[1:]:
    d = IndexedDataset(prefix)
    b = d.document_indices
    docs = [np.concatenate([d[s] for s in range(b[i], b[i + 1])]) for i in range(len(b) - 1)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.uint16()))}),
                   prefix + ".parquet")
"""


def documents(n: int, tokens: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n`` documents: 90% distinct, 5% exact copies, 5% near copies of earlier ones."""
    lengths = np.maximum(8, rng.lognormal(np.log(tokens), 0.6, n)).astype(np.int64)
    ranks = rng.zipf(1.1, int(lengths.sum())) % VOCAB
    docs = np.split(ranks.astype(np.uint16), np.cumsum(lengths)[:-1])
    for i in rng.choice(np.arange(n // 10, n), n // 10, replace=False).tolist():
        src = docs[int(rng.integers(0, i))]
        if rng.random() < 0.5:
            docs[i] = src.copy()
        else:
            edit = src.copy()
            at = rng.random(len(edit)) < 0.01
            edit[at] = rng.integers(0, VOCAB, int(at.sum()))
            docs[i] = edit
    return docs


def _job(fmt: str, glob: str, out: Path, near: bool) -> dict:
    return timed_job({"format": fmt, "path": glob,
                      **({} if fmt == "megatron" else {"tensor": "tokens"})}, out,
                     NEAR if near else None)


def measure(n: int, tokens: int) -> list[dict]:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-megatron-") as tmp:
        work = Path(tmp)
        docs = documents(n, tokens, np.random.default_rng(0))
        for d in ("megatron", "parquet", "conv"):
            (work / d).mkdir()
        for i, part in enumerate(np.array_split(np.arange(n), FILES)):
            for where in ("megatron", "conv"):
                builder = IndexedDatasetBuilder(str(work / where / f"part-{i}.bin"),
                                                dtype=np.uint16)
                for k in part.tolist():
                    builder.add_document(torch.from_numpy(docs[k].astype(np.int64)),
                                         [len(docs[k])])
                builder.finalize(str(work / where / f"part-{i}.idx"))
            pq.write_table(pa.table({"tokens": pa.array([docs[k] for k in part.tolist()],
                                                        pa.list_(pa.uint16()))}),
                           work / "parquet" / f"part-{i}.parquet")
        size = {f: sum(p.stat().st_size for p in (work / f).iterdir())
                for f in ("megatron", "parquet")}
        globs = {"megatron": str(work / "megatron" / "*.idx"),
                 "parquet": str(work / "parquet" / "*.parquet")}
        for near in (False, True):
            mode = "jaccard 0.8" if near else "exact"
            first = None
            for fmt in ("parquet", "megatron"):
                r = _job(fmt, globs[fmt], work / "out" / f"{fmt}-{near}", near)
                got = r.pop("removals", None)
                first = got if first is None else first
                rows.append(r | {"what": f"tensordedup on {FILES} {fmt} shards", "mode": mode,
                                 "input_bytes": size[fmt], "same": got == first})
                print(f"{mode} {fmt}: {r['wall_s']:.1f} s, rc {r['rc']}", file=sys.stderr)
            if not near:
                r = timed([sys.executable, "-c", CONVERT, *(
                    str(work / "conv" / f"part-{i}") for i in range(FILES))],
                    work / "conv.log")
                rows.append(r | {"what": "IndexedDataset + pq.write_table (the conversion a "
                                 "user ran before)", "mode": "-",
                                 "input_bytes": size["megatron"], "same": None})
    for r in rows:
        r.pop("stderr_tail", None)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=200_000)
    ap.add_argument("--tokens", type=int, default=400, help="median tokens per document")
    ap.add_argument("--json", default="bench-megatron.json")
    a = ap.parse_args()
    rows = measure(a.documents, a.tokens)
    lines = [f"{a.documents:,} documents of about {a.tokens} tokens (uint16), {FILES} shards",
             "| run | mode | input MB | wall s | CPU s | peak MB | removed | same removals as "
             "Parquet |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['what']} | {r['mode']} | {r['input_bytes'] / 1e6:,.0f} | {r['wall_s']:.1f} | "
              f"{r['cpu_s']:.1f} | {r['peak_rss_bytes'] / 1e6:,.0f} | "
              f"{format(r['removed'], ',') if 'removed' in r else '-'} | "
              f"{'-' if r['same'] is None else r['same']} |" for r in rows]
    print("\n".join(lines))
    Path(a.json).write_text(json.dumps({"documents": a.documents, "tokens": a.tokens,
                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
