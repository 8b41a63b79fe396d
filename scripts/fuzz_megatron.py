"""Differential fuzz of ``input.format: megatron`` against the same documents as Parquet
``list<uint16>`` rows (the twin's readers are checked against brute force elsewhere).

Each seed: 1-3 datasets written by megatron-core's ``IndexedDatasetBuilder`` (documents
of 0-60 tokens from a small vocabulary, so exact and near copies are common; documents
split into several sequences; now and then a multimodal index, or sequences after the
last document's end), exact dedup or jaccard (random threshold, n-gram size, grouping,
keep first / last), random unit and chunk sizes. Compared: the decisions (document,
what it copies, kind) and the invalid records equal the twin's; read = kept + removed +
invalid; each clean pair, read by Megatron, is the kept documents in order with their
sequence lengths.

    python scripts/fuzz_megatron.py [--seeds 0:200] [--minutes 10]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchkit import fuzz_seeds, stem_row  # noqa: E402


def _dataset(prefix: Path, docs: list[np.ndarray], rng: np.random.Generator,
             multimodal: bool, trailing: bool) -> list[list[int]]:
    """Megatron's builder over ``docs`` (each split at random); the sequence lengths."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16, multimodal=multimodal)
    splits = []
    for k, doc in enumerate(docs):
        cuts = np.sort(rng.integers(0, len(doc) + 1, int(rng.integers(0, 3))))
        lengths = np.diff(np.r_[0, cuts, len(doc)]).tolist()
        splits.append(lengths)
        seqs = torch.split(torch.from_numpy(doc.astype(np.int64)), lengths)
        for j, seq in enumerate(seqs):
            builder.add_item(seq, mode=j % 3) if multimodal else builder.add_item(seq)
        if not (trailing and k == len(docs) - 1):
            builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return splits


def _clean(prefix: Path) -> list[tuple[list[int], list[int]]]:
    """(tokens, sequence lengths) of each document, as Megatron reads them (its index
    reader alone where the .bin holds no token: ``IndexedDataset`` cannot map an empty
    file, which its own builder writes for a dataset of empty documents)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset, _IndexReader
    if Path(f"{prefix}.bin").stat().st_size == 0:
        i = _IndexReader(f"{prefix}.idx", multimodal=False)
        b, n = i.document_indices.tolist(), i.sequence_lengths.tolist()
        return [([], n[x:y]) for x, y in zip(b[:-1], b[1:], strict=True)]
    d = IndexedDataset(str(prefix))
    b = d.document_indices.tolist()
    return [(np.concatenate([d[s] for s in range(x, y)]).tolist() if y > x else [],
             d.sequence_lengths[x:y].tolist()) for x, y in zip(b[:-1], b[1:], strict=True)]


def run_case(seed: int, stats: collections.Counter) -> tuple[dict, list]:
    from pipeline import run_job

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    vocab = int(rng.integers(2, 40))
    docs: list[np.ndarray] = []
    for _ in range(n):
        if docs and rng.random() < 0.3:  # a copy, or an edited copy, of an earlier one
            src = docs[int(rng.integers(len(docs)))].copy()
            if rng.random() < 0.5 and len(src):
                src[int(rng.integers(len(src)))] = rng.integers(0, vocab)
            docs.append(src)
        else:
            docs.append(rng.integers(0, vocab, int(rng.integers(0, 60))).astype(np.uint16))
    files = int(rng.integers(1, 4))
    parts = [p.tolist() for p in np.array_split(np.arange(n), files)]
    near = None
    if rng.random() < 0.6:
        near = {"metric": "jaccard", "threshold": float(np.round(rng.uniform(0.5, 1.0), 2)),
                "shingles": {"unit": "token", "size": int(rng.integers(1, 6))},
                "grouping": str(rng.choice(["representative", "components"]))}
    keep = str(rng.choice(["first", "last"]))
    tuning = {"unit_rows": int(rng.integers(1, 200)), "chunk_rows": int(rng.integers(1, 100))}
    case = {"seed": seed, "documents": n, "files": files, "near": near, "keep": keep,
            "tuning": tuning}
    stats.update([f"near={'jaccard' if near else 'off'}", f"files={files}"])
    work = Path(tempfile.mkdtemp(prefix="fuzz-megatron-"))
    problems: list = []
    try:
        (work / "m").mkdir()
        (work / "p").mkdir()
        splits = []
        for k, rows in enumerate(parts):
            multimodal, trailing = rng.random() < 0.2, rng.random() < 0.2
            stats.update(["multimodal"] * multimodal + ["trailing"] * trailing)
            splits.append(_dataset(work / "m" / f"part-{k}", [docs[i] for i in rows], rng,
                                   multimodal, trailing))
            pq.write_table(pa.table({"t": pa.array([docs[i].tolist() for i in rows],
                                                   pa.list_(pa.uint16()))}),
                           work / "p" / f"part-{k}.parquet",
                           row_group_size=int(rng.integers(1, 100)))
        got = {}
        for fmt, glob, extra in (("megatron", "*.idx", {}), ("parquet", "*.parquet",
                                                            {"tensor": "t"})):
            cfg = {"input": {"format": fmt, "path": str(work / fmt[0] / glob), **extra},
                   "output": {"path": str(work / f"out-{fmt}" / "clean")},
                   "report": str(work / f"out-{fmt}" / "report"), "keep": keep,
                   "max_invalid_fraction": 1.0, "tuning": tuning,
                   **({"near": near} if near else {})}
            s = run_job(cfg, overwrite=True, quiet=True)
            if s.read != s.kept + sum(s.removed.values()) + s.invalid_count:
                problems.append(f"{fmt}: counts do not add up")
            rep = work / f"out-{fmt}" / "report"
            got[fmt] = (sorted((stem_row(d["record_id"]), stem_row(d["duplicate_of"]),
                                d["kind"]) for d in
                               pq.read_table(rep / "duplicates.parquet").to_pylist()),
                        sorted(stem_row(d["record_id"]) for d in
                               pq.read_table(rep / "invalid.parquet").to_pylist()))
        if got["megatron"] != got["parquet"]:
            a, b = (set(x[0]) | {("invalid", i) for i in x[1]} for x in
                    (got["megatron"], got["parquet"]))
            problems.append(f"decisions differ: {sorted(a ^ b, key=str)[:8]}")
        gone = {r for r, *_ in got["megatron"][0]} | set(got["megatron"][1])
        stats.update(["removed"] * len(got["megatron"][0]))
        for k, rows in enumerate(parts):
            want = [(docs[i].tolist(), splits[k][j]) for j, i in enumerate(rows)
                    if f"part-{k}:{j}" not in gone]
            if _clean(work / "out-megatron" / "clean" / f"part-{k}") != want:
                problems.append(f"part-{k}: the clean pair is not the kept documents")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return case, problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:200", help="first:last (last excluded)")
    ap.add_argument("--minutes", type=float, default=10)
    a = ap.parse_args()
    fuzz_seeds("megatron", a.seeds, a.minutes, run_case)


if __name__ == "__main__":
    main()
