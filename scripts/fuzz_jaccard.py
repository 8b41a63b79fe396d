"""Fuzz the job's jaccard stage against the brute-force oracle (tests/textkit.py): random
real-text corpora (licences and METADATA files of the installed packages, edited, with
exact copies, blanks and crowds) in Parquet or, for odd seeds, JSON lines (gzip every
other), random settings (unit, size, threshold, grouping, keep first / last / max or
min of a score with ties and nulls, files, chunk and unit sizes, mode exact; every third
seed a reference set of copies, edits and other texts; every fifth a store: two runs,
the second against the first's kept texts), the job's removals compared with the
oracle's, record by record (kind, duplicate_of), and exact mode's recall (1.0 where
measured). ``--runner dask|portable``: each run also on a local Dask cluster or the
portable runner, its report and clean shards byte for byte the local run's.

Usage: python scripts/fuzz_jaccard.py [--seeds 30] [--first 0] [--runner dask|portable]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchkit import other_runner, same_as_local  # noqa: E402

from pipeline import run_job  # noqa: E402
from tests.oracle import keep_rank, near_decisions  # noqa: E402
from tests.textkit import edited, oracle, package_texts  # noqa: E402
from transforms.near.sets import Shingles, record_sets  # noqa: E402

TEXTS = package_texts(120)


def corpus(rng: np.random.Generator) -> list[str]:
    base = [TEXTS[i][: int(rng.integers(200, 3000))]
            for i in rng.choice(len(TEXTS), int(rng.integers(5, 40)), replace=False)]
    vocab = sorted({w for t in base for w in t.split()})
    docs = list(base)
    for _ in range(int(rng.integers(0, 80))):
        docs.append(edited(base[int(rng.integers(len(base)))], rng.uniform(0, 0.15), rng, vocab))
    for _ in range(int(rng.integers(0, 4))):
        docs.append(docs[int(rng.integers(len(docs)))])  # exact copies
    docs += [""] * int(rng.integers(0, 3)) + ["a b"] * int(rng.integers(0, 3))
    return [docs[i] for i in rng.permutation(len(docs))]


def _blank(doc: str) -> bool:
    return not doc.strip() or not any(c.isalnum() for c in doc)


TIERS = {"reference": 0, "store": 1}  # a reference record names a copy before a stored one


def expected(docs: list[str], ids: list[str], sh: Shingles, t: float, grouping: str,
             order: np.ndarray, prot: list[tuple[str, str, str]] = ()) -> dict:
    """The oracle's removals; ``prot``: (id, text, "reference" | "store") records kept
    first, in that order, never removed: an input text equal to one goes as
    <tier>_exact (naming the first), one within t of one as <tier>_near
    (tests/oracle.near_decisions over every pair of the protected records' and the
    exact survivors' sets: the most protected tier first, then the highest J).
    ``order``: the input positions in keep order."""
    prot = [p for p in prot if not _blank(p[1])]
    first: dict[str, tuple[str, str]] = {}
    for pid, text, tier in prot:
        first.setdefault(text, (pid, tier))
    seen, keep, out = {}, [], {}
    for i in order.tolist():
        if _blank(docs[i]):
            continue  # blank: invalid
        if docs[i] in first:
            pid, tier = first[docs[i]]
            out[ids[i]] = (f"{tier}_exact", pid)
        elif docs[i] in seen:
            out[ids[i]] = ("exact", ids[seen[docs[i]]])
        else:
            seen[docs[i]] = i
            keep.append(i)
    if not prot:
        sets = record_sets([docs[i] for i in keep], sh)
        for r, (k, _) in oracle(sets, t, grouping).items():
            out[ids[keep[r]]] = ("near", ids[keep[k]])
        return out
    pool = [p[0] for p in prot] + [ids[i] for i in keep]
    sets = record_sets([p[1] for p in prot] + [docs[i] for i in keep], sh)
    rows = [set(sets.row(i).tolist()) for i in range(len(sets))]
    pairs: dict[int, list] = {}
    for b in range(len(rows)):
        for a in range(b):
            j = Fraction(len(rows[a] & rows[b]), len(rows[a] | rows[b]))
            if j >= Fraction(str(t)):
                pairs.setdefault(b, []).append((1 - j, a))
    tiers = [TIERS[p[2]] for p in prot]
    for r, e in near_decisions(pairs, grouping, protected=len(prot), tiers=tiers).items():
        out[pool[r]] = (f"{prot[e][2]}_near" if e < len(prot) else "near", pool[e])
    return out


def _inputs(folder: Path, fmt: str, ids: list[str], docs: list[str], score: np.ndarray,
            files: int, rng: np.random.Generator, gz: bool) -> None:
    """The texts in ``files`` files, with ids and a score (NaN: null in JSON)."""
    folder.mkdir(parents=True)
    for f, part in enumerate(np.array_split(np.arange(len(docs)), files)):
        group = int(rng.integers(5, 60))
        if fmt == "parquet":
            pq.write_table(pa.table({"id": [ids[i] for i in part],
                                     "text": [docs[i] for i in part],
                                     "score": score[part]}),
                           folder / f"in{f}.parquet", row_group_size=group)
            continue
        lines = "".join(json.dumps({"id": ids[i], "text": docs[i], "score": None if np.isnan(
            score[i]) else float(score[i])}) + "\n" for i in part)
        if gz:
            (folder / f"in{f}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
        else:
            (folder / f"in{f}.jsonl").write_text(lines)


def one(seed: int, tmp: Path, runner: dict | None = None) -> str | None:
    """One seed's runs compared with the oracle (and, given ``runner``, each run on it
    with the local run, byte for byte); None, or what differs."""
    rng = np.random.default_rng(seed)
    docs = corpus(rng)
    unit = str(rng.choice(["word", "char"]))
    size = int(rng.integers(1, 7)) if unit == "word" else int(rng.integers(4, 25))
    t = float(np.round(rng.uniform(0.5, 0.95), 2))
    grouping = str(rng.choice(["representative", "components"]))
    keep = str(rng.choice(["first", "first", "last", "max", "min"]))
    score = rng.integers(0, 4, len(docs)).astype(np.float64)  # ties, and NaN (never first)
    score[rng.random(len(docs)) < 0.1] = np.nan
    files = int(rng.integers(1, 4))
    fmt = "jsonl" if seed % 2 else "parquet"  # odd seeds: JSON lines (gzip every other)
    prot: list[tuple[str, str, str]] = []
    cfg = {"near": {"metric": "jaccard", "threshold": t, "mode": "exact", "grouping": grouping,
                    "shingles": {"unit": unit, "size": size}},
           "keep": keep if keep in ("first", "last") else {keep: "score"},
           "max_invalid_fraction": 1.0,
           "tuning": {"chunk_rows": int(rng.integers(3, 100))}}
    if seed % 3 == 2:  # a reference set: copies and edits of the input's texts, and others
        vocab = sorted({w for d in docs for w in d.split()})
        refs = []
        for _ in range(int(rng.integers(1, 25))):
            d = docs[int(rng.integers(len(docs)))]
            refs.append(d if rng.random() < 0.4 else edited(d, rng.uniform(0, 0.2), rng, vocab))
        refs += [TEXTS[int(i)][:1500] for i in rng.choice(len(TEXTS), 3, replace=False)]
        refs = [refs[i] for i in rng.permutation(len(refs))]
        pq.write_table(pa.table({"id": [f"e{j}" for j in range(len(refs))], "text": refs}),
                       tmp / "ref.parquet", row_group_size=int(rng.integers(3, 30)))
        cfg["reference"] = [{"format": "parquet", "path": str(tmp / "ref.parquet"),
                             "tensor": "text", "id": "id", "decode": "text"}]
        prot = [(f"e{j}", r, "reference") for j, r in enumerate(refs)]
    runs = [np.arange(len(docs))]
    if seed % 5 == 4 and len(docs) > 1:  # a store: the second run against the first's kept
        cut = int(rng.integers(1, len(docs)))
        runs = [np.arange(cut), np.arange(cut, len(docs))]
        cfg["store"] = {"path": str(tmp / "store")}
    what = (f"seed {seed} ({unit} {size}, t {t}, {grouping}, keep {keep}, "
            f"{len(prot)} references, {len(runs)} run(s))")
    for k, rows in enumerate(runs):
        ids, texts = [f"d{i}" for i in rows], [docs[i] for i in rows]
        _inputs(tmp / f"in{k}", fmt, ids, texts, score[rows], files, rng, seed % 4 == 1)
        out = tmp / f"out{k}"
        job = {**cfg, "input": {"format": fmt, "path": str(tmp / f"in{k}" / "in*"),
                                "tensor": "text", "id": "id", "decode": "text"},
               "output": {"path": str(out / "clean")}, "report": str(out / "report"),
               "run_id": f"run{k}"}
        s = run_job(job, overwrite=True, quiet=True)
        if runner is not None:  # the same run on the other runner, with its own store
            other = tmp / f"out{k}-{runner['name']}"
            o = run_job({**job, "runner": runner, "output": {"path": str(other / "clean")},
                         "report": str(other / "report"),
                         **({"store": {"path": str(tmp / "store-other")}}
                            if "store" in cfg else {})}, overwrite=True, quiet=True)
            differ = same_as_local(out, other, s, o)
            if differ:
                return f"{what}, run {k} on {runner['name']}: {differ[:4]}"
        got = {r["record_id"]: (r["kind"], r["duplicate_of"])
               for r in pq.read_table(out / "report" / "duplicates.parquet").to_pylist()}
        want = expected(texts, ids, Shingles(unit, size), t, grouping,
                        keep_rank(keep, score[rows]), prot)
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))[:6]
            return f"{what}, run {k}: {diff}"
        if s.read != s.kept + sum(s.removed.values()) + s.invalid_count:
            return f"{what}, run {k}: counts do not add up"
        recall = json.loads((out / "report" / "summary.json").read_text())["near"]["recall"]
        if recall and recall["recall"] not in (None, 1.0):  # exact mode: the oracle's
            return f"{what}, run {k}: exact mode's recall {recall['recall']}"
        prot = prot + [(i, d, "store") for i, d in zip(ids, texts, strict=True)
                       if i not in got and not _blank(d)]
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--runner", choices=["dask", "portable"],
                    help="also run each job on this runner and compare the bytes")
    a = ap.parse_args()
    bad = []
    with contextlib.ExitStack() as stack:
        runner = other_runner(stack, a.runner)
        for seed in range(a.first, a.first + a.seeds):
            with tempfile.TemporaryDirectory() as d:
                why = one(seed, Path(d), runner)
            print(why or f"seed {seed}: same as the oracle", flush=True)
            if why:
                bad.append(why)
    print(json.dumps({"seeds": a.seeds, "failing": len(bad)}))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
