"""Benchmark near-duplicate removal of texts by Jaccard similarity (issue 43): the job
against the MinHash-LSH tools users run, side by side on the same Parquet.

Data: scripts/text_corpus.py (``--docs N``, default 100,000; real vocabulary, 10% planted
near copies at J uniform in [t, t + 0.1], 2% near misses below t, a crowd of N / 20
copies of a "page not found" page, boilerplate, CJK, 1 MB, one-word and empty documents),
written as 4 Parquet files (id, text); ``--corpus DIR`` reuses one already written.

Contenders, each a whole process (wall time and the peak RSS of its process tree, polled
every 0.1 s; killed above ``--memory-gb`` or ``--timeout``):
- datatrove (its own venv, ``--datatrove-venv``; version recorded): ParquetReader
  (text_key "text", id_key "id") and its four MinHash stages (signatures, buckets,
  cluster, filter: ``MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)``, 64-bit
  hashes as in its example), each a ``LocalPipelineExecutor(workers=2)`` (tasks: one per
  file, 14 buckets, 1, one per file); the filter writes the kept documents (Parquet) and
  the removed ones (its exclusion writer, JSONL), whose ids are the removals;
- datasketch ``MinHashLSH(threshold, num_perm=128)`` and rensa
  ``RMinHashDeduplicator(threshold, num_perm=128, use_lsh=True)`` (``--minhash-venv``), in
  one plain process each over the same word 5-gram shingles (this script's normalisation:
  NFKC, lower case, words = runs of letters, marks, digits): datasketch queries each
  document and inserts it when nothing is found (its documented dedup loop), rensa's
  ``add_pairs`` says which to keep; neither verifies a candidate by its true Jaccard;
- the job: ``python -m pipeline.run --config <yaml>`` with ``input: {format: parquet,
  path: DIR/text/*.parquet, tensor: text, id: id, decode: text}`` and ``near: {metric:
  jaccard, threshold: T, mode: bounded, shingles: {unit: word, size: 5, permutations: 112,
  bands: 14}}``, then again with ``mode: exact`` (the recall oracle at sizes the brute
  force below does not reach), with ``mode: auto`` (what a user gets by default; its
  choice is in the JSON) and with ``mode: bounded`` at the job's default permutations and
  bands (chosen from the threshold: issue 43's recall target for bounded). Removals:
  every ``record_id`` of the report's duplicates.parquet. A job that refuses the config
  is reported as not available.

Scores, computed here against this script's oracle: the greedy in keep order (row order)
over exact Jaccard of the shingle sets (as sorted 64-bit hashes; a pair is near when
|A & B| / |A | B| >= t in exact integer arithmetic): a document is removed when an earlier
kept one is near it. Candidates come from prefix filtering (AllPairs: each set's rarest
|x| - ceil(t |x|) + 1 tokens, tokens ordered by corpus frequency, those seen once skipped,
with the length filter), so every near pair is found and each is verified.
- recall: |removed & oracle-removed| / |oracle-removed|;
- precision: the share of removed documents with a document the tool kept at J >= t;
- left: documents the tool kept that have an earlier kept one at J >= t (0 for a clean
  output; "keep order" does not matter for it);
- planted: planted pairs (copy, source) at J >= t of which the tool removed either one;
- docs/s over the whole process, and per core (the machine's cores).
When the job's ``mode: exact`` run is there, recall is also measured against its removals
(``recall_vs_job_exact``); ``--no-oracle`` scores against them alone (sizes where the
brute force above would take too long).

Usage: python scripts/bench_jaccard.py [--docs 100000] [--threshold 0.8] [--corpus DIR]
         [--only datatrove --only job ...] [--json bench-jaccard.json] [--keep-work DIR]
The job contender, once issue 43 has landed (from the repo root, project venv):
  python scripts/bench_jaccard.py --docs 1000000 --only job --only datatrove
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import ROOT, run_watched

sys.path.insert(0, str(Path(__file__).resolve().parent))
import text_corpus  # noqa: E402

SCRIPTS = str(Path(__file__).resolve().parent)
DATATROVE_VENV = "/work/venvs/datatrove"
MINHASH_VENV = "/work/venvs/minhash"
NOT_AVAILABLE = "not available"

# Each snippet: a plain Python process; INPUT (the text folder), OUT (its folder),
# THRESHOLD, PARTS; writes OUT/removed.txt (one id a line) and OUT/info.json.
DATATROVE = """
import glob, gzip, json, os, importlib.metadata as md
from datatrove.executor.local import LocalPipelineExecutor
from datatrove.pipeline.dedup import (MinhashDedupBuckets, MinhashDedupCluster,
                                      MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.writers import JsonlWriter, ParquetWriter
from datatrove.utils.hashing import HashConfig

config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8,
                       hash_config=HashConfig(precision=64))
reader = ParquetReader(INPUT, text_key="text", id_key="id", glob_pattern="*.parquet")
W = OUT + "/work"
stage1 = LocalPipelineExecutor(pipeline=[reader, MinhashDedupSignature(
    output_folder=W + "/signatures", config=config)], tasks=PARTS, workers=2,
    logging_dir=W + "/logs/signatures")
stage2 = LocalPipelineExecutor(pipeline=[MinhashDedupBuckets(
    input_folder=W + "/signatures", output_folder=W + "/buckets", config=config)],
    tasks=config.num_buckets, workers=2, logging_dir=W + "/logs/buckets", depends=stage1)
stage3 = LocalPipelineExecutor(pipeline=[MinhashDedupCluster(
    input_folder=W + "/buckets", output_folder=W + "/remove_ids", config=config)],
    tasks=1, logging_dir=W + "/logs/clusters", depends=stage2)
stage4 = LocalPipelineExecutor(pipeline=[reader, MinhashDedupFilter(
    input_folder=W + "/remove_ids", exclusion_writer=JsonlWriter(W + "/removed")),
    ParquetWriter(W + "/deduplicated")], tasks=PARTS, workers=2,
    logging_dir=W + "/logs/filter", depends=stage3)
stage4.run()
removed = []
for f in sorted(glob.glob(W + "/removed/*.jsonl.gz")):
    with gzip.open(f, "rt") as fh:
        removed += [json.loads(line)["id"] for line in fh]
open(OUT + "/removed.txt", "w").write("\\n".join(removed))
json.dump({"version": md.version("datatrove"), "config": str(config)},
          open(OUT + "/info.json", "w"))
"""
SHINGLES = """
import glob, json, sys, importlib.metadata as md
import pyarrow.parquet as pq
sys.path.insert(0, SCRIPTS)
from text_corpus import shingle_strings, words_of

read = 0

def batches(size=10_000):
    global read
    files = sorted(glob.glob(INPUT + "/*.parquet"))
    if not files:
        sys.exit(f"no Parquet files in {INPUT}")
    for f in files:
        for b in pq.ParquetFile(f).iter_batches(size, columns=["id", "text"]):
            ids, texts = b.column(0).to_pylist(), b.column(1).to_pylist()
            read += len(ids)
            yield ids, [[s.encode() for s in shingle_strings(w)] for w in words_of(texts)]
"""
DATASKETCH = SHINGLES + """
from datasketch import MinHash, MinHashLSH
lsh = MinHashLSH(threshold=THRESHOLD, num_perm=128)
removed = []
for ids, sh in batches():
    some = [i for i, s in enumerate(sh) if s]  # no shingle: nothing to compare
    for i, m in zip(some, MinHash.bulk([sh[i] for i in some], num_perm=128)):
        if lsh.query(m):
            removed.append(ids[i])
        else:
            lsh.insert(ids[i], m)
open(OUT + "/removed.txt", "w").write("\\n".join(removed))
json.dump({"version": md.version("datasketch"), "bands_rows": [lsh.b, lsh.r], "read": read},
          open(OUT + "/info.json", "w"))
"""
RENSA = SHINGLES + """
from rensa import RMinHashDeduplicator
dedup = RMinHashDeduplicator(threshold=THRESHOLD, num_perm=128, use_lsh=True)
removed = []
for ids, sh in batches():
    some = [i for i, s in enumerate(sh) if s]
    keep = dedup.add_pairs((ids[i], [s.decode() for s in sh[i]]) for i in some)
    removed += [ids[i] for i, k in zip(some, keep) if not k]
open(OUT + "/removed.txt", "w").write("\\n".join(removed))
json.dump({"version": md.version("rensa"), "read": read}, open(OUT + "/info.json", "w"))
"""
ONLINE = """
import glob, json, sys
sys.path.insert(0, CODE)
import pyarrow.parquet as pq
from filters.online import OnlineDedup
from transforms.near.sets import Shingles, blank_rows
from transforms.near.spec import NearSpec
shingles = Shingles("word", 5)
dedup = OnlineDedup(near=NearSpec("jaccard", THRESHOLD, mode=MODE, shingles=shingles))
removed, read = [], 0
for f in sorted(glob.glob(INPUT + "/*.parquet")):
    for b in pq.ParquetFile(f).iter_batches(1024, columns=["id", "text"]):
        ids, texts = b.column(0).to_pylist(), b.column(1)
        read += len(ids)
        some = (~blank_rows(texts, shingles)).nonzero()[0]  # no shingle: nothing to compare
        keep = dedup.keep_mask(texts.take(some))
        removed += [ids[i] for i, k in zip(some.tolist(), keep.tolist()) if not k]
open(OUT + "/removed.txt", "w").write("\\n".join(removed))
json.dump({"mode": MODE, "stats": vars(dedup.stats), "state_mb": dedup.nbytes() / 2 ** 20,
           "read": read}, open(OUT + "/info.json", "w"))
"""


def job_config(corpus: Path, out: Path, threshold: float, mode: str) -> Path:
    import yaml

    near = {"metric": "jaccard", "threshold": threshold, "mode": mode.split("-")[0],
            "shingles": {"unit": "word", "size": 5}}
    if mode == "bounded":  # datatrove's 14 bands x 8 rows; "bounded-default": the job's own
        near["shingles"].update(permutations=112, bands=14)
    cfg = {"input": {"format": "parquet", "path": str(corpus / "text" / "*.parquet"),
                     "tensor": "text", "id": "id", "decode": "text"},
           "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report"), "near": near}
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def job_removed(out: Path) -> tuple[list[str], dict]:
    report = out / "report"
    dup = pq.read_table(report / "duplicates.parquet", columns=["record_id", "kind"])
    summary = json.loads((report / "summary.json").read_text())
    kinds = dup.column("kind").value_counts().to_pylist()
    return dup.column("record_id").to_pylist(), {
        "kinds": {k["values"]: k["counts"] for k in kinds},
        "near": {k: summary.get("near", {}).get(k) for k in (
            "mode", "mode_reason", "bands", "rows", "compared", "candidate_groups", "recall")},
        "summary_wall_time_s": summary.get("wall_time_s")}


def contenders(a: argparse.Namespace) -> dict[str, dict]:
    dt = Path(a.datatrove_venv) / "bin" / "python"
    mh = Path(a.minhash_venv) / "bin" / "python"
    return {
        "datatrove (4 minhash stages, 14x8, workers=2)": {"python": dt, "code": DATATROVE},
        "datasketch MinHashLSH (128 perms)": {"python": mh, "code": DATASKETCH},
        "rensa RMinHashDeduplicator (128 perms, LSH)": {"python": mh, "code": RENSA},
        "the job (bounded: 112 perms, 14 bands)": {"job": "bounded"},
        "the job (mode: exact)": {"job": "exact"},
        "the job (mode: auto)": {"job": "auto"},
        "the job (bounded, default bands)": {"job": "bounded-default"},
        "OnlineDedup stream filter (bounded)": {"python": Path(sys.executable),
                                                "code": 'MODE = "bounded"\n' + ONLINE},
        "OnlineDedup stream filter (exact)": {"python": Path(sys.executable),
                                              "code": 'MODE = "exact"\n' + ONLINE},
    }


class CpuWatch:
    """CPU seconds (user + system) of this process' descendants while the block runs,
    polled every 0.1 s per process (a worker's last 0.1 s before it exits may be missed):
    on a shared machine a steadier measure of a contender's work than its wall time.
    Rusage of reaped children would miss workers that no waiting parent reaps
    (datatrove's forkserver pool)."""

    def __enter__(self) -> CpuWatch:
        import threading

        import psutil

        self.seen: dict[int, float] = {}
        self.stop = threading.Event()
        me = psutil.Process()

        def poll() -> None:
            while not self.stop.wait(0.1):
                for p in me.children(recursive=True):
                    try:
                        t = p.cpu_times()  # its own only: reaped children are seen here
                        self.seen[p.pid] = t.user + t.system
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass

        self.thread = threading.Thread(target=poll, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


def run_contender(name: str, c: dict, corpus: Path, work: Path, a: argparse.Namespace,
                  parts: int) -> dict:
    out = work / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if "job" in c:
        cfg = job_config(corpus, out, a.threshold, c["job"])
        cmd = [sys.executable, "-m", "pipeline.run", "--config", str(cfg),
               "--verbose" if a.job_verbose else "--quiet"]
        cwd = a.code
    else:
        if not c["python"].exists():
            return {"error": f"{NOT_AVAILABLE}: no {c['python']} (see --help)"}
        prelude = "".join(f"{k} = {v!r}\n" for k, v in dict(
            INPUT=str(corpus / "text"), OUT=str(out), THRESHOLD=a.threshold, PARTS=parts,
            SCRIPTS=SCRIPTS, CODE=str(Path(a.code).resolve())).items())
        cmd = [str(c["python"]), "-c", prelude + textwrap.dedent(c["code"])]
        cwd = out
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    load = os.getloadavg()[0]
    code = code_state(a.code) if "job" in c else None
    with CpuWatch() as cpu:
        r = run_watched(cmd, cwd=cwd, log=out / "stderr.log", env=env,
                        limit_bytes=int(a.memory_gb * 2 ** 30), timeout_s=a.timeout)
    res = {"wall_s": r["wall_s"], "cpu_s": cpu.seconds,
           "peak_rss_mb": r["peak_rss_bytes"] / 2 ** 20,
           "rc": r["rc"], "load_1m_before": load}
    if code is not None:
        after_code = code_state(a.code)
        res["code"] = code if after_code == code else f"{code}, then {after_code} (edited)"
    if r["killed"] or r["rc"] != 0:
        tail = [ln for ln in r["stderr_tail"].splitlines() if ln.strip()]
        why = f"killed ({r['killed']})" if r["killed"] else f"exit {r['rc']}"
        if "job" in c and r["rc"] == 2:
            why = NOT_AVAILABLE
        return {**res, "error": f"{why}: {tail[-1] if tail else ''}"[:600]}
    if "job" in c:
        removed, info = job_removed(out)
    else:
        text = (out / "removed.txt").read_text()
        removed = text.split("\n") if text else []
        info = json.loads((out / "info.json").read_text())
    return {**res, "removed_ids": removed, "info": info}


def code_state(code: str) -> str:
    """The job's code as it runs: the commit, and a digest of the uncommitted changes to
    tracked files (the checkout is shared: others edit it between and during runs)."""
    import hashlib
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=code, capture_output=True,
                              text=True).stdout
    diff = git("diff", "HEAD")
    head = git("rev-parse", "--short", "HEAD").strip()
    if not head:  # an exported tree (git archive): its folder names it
        return f"{code} (not a git checkout)"
    if not diff:
        return head
    changed = ", ".join(git("diff", "HEAD", "--name-only").split())
    return f"{head} + diff {hashlib.sha1(diff.encode()).hexdigest()[:10]} ({changed})"


def versions(results: dict) -> dict:
    """What ran: each peer's package version (from its own process), the job's code (per
    job run, in its result's ``code``), Python's version."""
    out = {k: r["info"]["version"] for k, r in results.items() if "version" in r.get("info", {})}
    out.update({k: r["code"] for k, r in results.items() if "code" in r})
    out["python"] = sys.version.split()[0]
    return out


# ----------------------------------------------------------------------------- oracle


class PrefixIndex:
    """Exact near search over shingle sets: prefix filtering (AllPairs) with the length
    filter, every candidate verified in integer arithmetic. Tokens are ranked rarest
    first; tokens seen once in the corpus never make a candidate, so they are skipped."""

    def __init__(self, sets: text_corpus.ShingleSets, threshold: float):
        t = Fraction(str(threshold))
        self.num, self.den = t.numerator, t.denominator
        uniq, inv, counts = np.unique(sets.hashes, return_inverse=True, return_counts=True)
        rank = np.empty(len(uniq), np.int64)
        rank[np.lexsort((uniq, counts))] = np.arange(len(uniq))
        r = rank[inv].astype(np.int64)
        del inv, uniq
        doc = np.repeat(np.arange(len(sets)), sets.sizes)
        r = r[np.lexsort((r, doc))]
        self.ranks, self.offsets = r, sets.offsets
        self.sizes = sets.sizes
        need = -((-self.num * self.sizes) // self.den)  # ceil(t |x|), exactly
        self.prefix = np.where(self.sizes > 0, self.sizes - need + 1, 0)
        self.counts = counts[np.argsort(rank)]  # by rank
        self.postings: dict[int, list[int]] = {}
        self.capped = 0

    def _prefix(self, i: int) -> list[int]:
        a = int(self.offsets[i])
        p = self.ranks[a:a + int(self.prefix[i])]
        return p[self.counts[p] > 1].tolist()

    def add(self, i: int) -> None:
        for tok in self._prefix(i):
            self.postings.setdefault(tok, []).append(i)

    def near(self, i: int, j: int) -> bool:
        ni, nj = int(self.sizes[i]), int(self.sizes[j])
        if min(ni, nj) * self.den < self.num * max(ni, nj):  # the length filter
            return False
        x = self.ranks[self.offsets[i]:self.offsets[i + 1]]
        y = self.ranks[self.offsets[j]:self.offsets[j + 1]]
        inter = np.intersect1d(x, y, assume_unique=True).size
        return inter * self.den >= self.num * (ni + nj - inter)

    def probe(self, i: int, cap: int = 0) -> int:
        """An indexed set near set i (the first found), or -1; with ``cap``, at most that
        many verifications (then -1, counted in ``capped``)."""
        seen: set[int] = set()
        for tok in self._prefix(i):
            for j in self.postings.get(tok, ()):
                if j in seen or j == i:
                    continue
                seen.add(j)
                if self.near(i, j):
                    return j
                if cap and len(seen) >= cap:
                    self.capped += 1
                    return -1
        return -1


def oracle(index: PrefixIndex, valid: np.ndarray) -> np.ndarray:
    """Rows the greedy in keep order (row order) removes."""
    removed = np.zeros(len(valid), bool)
    for i in np.flatnonzero(valid).tolist():
        if index.probe(i) >= 0:
            removed[i] = True
        else:
            index.add(i)
    index.postings.clear()
    return removed


def score(index: PrefixIndex, valid: np.ndarray, removed: np.ndarray, truth: np.ndarray,
          planted: np.ndarray, kind: np.ndarray, cap: int = 5000) -> dict:
    """Precision (removed with a kept document near them) and left (kept documents with
    an earlier kept one near them), with the oracle's recall and the planted pairs; per
    kind of document too (removed, oracle-removed, both, false removals, left)."""
    kept = valid & ~removed
    index.capped = 0
    left = np.zeros(len(valid), bool)
    for i in np.flatnonzero(kept).tolist():  # keep order: probe the earlier kept, then add
        left[i] = index.probe(i, cap) >= 0
        index.add(i)
    false = np.zeros(len(valid), bool)
    for i in np.flatnonzero(removed).tolist():
        false[i] = index.probe(i, cap) < 0
    index.postings.clear()
    n_removed = int(removed.sum())
    by_kind = {str(k): {"docs": int((kind == k).sum()), "removed": int(removed[kind == k].sum()),
                        "oracle": int(truth[kind == k].sum()),
                        "both": int((removed & truth)[kind == k].sum()),
                        "false": int(false[kind == k].sum()), "left": int(left[kind == k].sum())}
               for k in np.unique(kind)}
    return {"removed": n_removed,
            "recall": int((removed & truth).sum()) / int(truth.sum()) if truth.any() else None,
            "precision": 1.0 - int(false.sum()) / n_removed if n_removed else 1.0,
            "false_removals": int(false.sum()), "left": int(left.sum()),
            "planted_resolved": float((removed[planted[:, 0]] | removed[planted[:, 1]]).mean())
            if len(planted) else None, "capped_probes": index.capped, "by_kind": by_kind}


# ------------------------------------------------------------------------------- main


def load(corpus: Path) -> tuple[list[str], pa.Array, pa.Table]:
    parts = sorted((corpus / "text").glob("*.parquet"))
    t = pa.concat_tables([pq.read_table(p, columns=["id", "text"]) for p in parts])
    truth = pq.read_table(corpus / "truth.parquet")
    return t.column("id").to_pylist(), t.column("text").combine_chunks(), truth


def table(b: dict) -> str:
    res = b["results"]
    w = max(len(k) for k in res) + 2
    base = next((r for k, r in res.items() if k.startswith("datatrove") and "docs_s" in r), None)
    lines = [f"\n{b['docs']:,} documents ({b['text_mb']:.0f} MB of text), Jaccard >= "
             f"{b['threshold']} over word 5-grams; oracle: {b['oracle_removed']:,} removals "
             f"({b['oracle_s']:.0f} s); {b['planted_pairs']:,} planted pairs at J >= t; "
             f"{b['cores']} cores",
             f"{'contender':<{w}}{'docs/s':>9}{'/core':>8}{'vs dt':>7}{'wall s':>8}{'cpu s':>8}"
             f"{'peak MB':>9}{'removed':>9}{'recall':>8}{'precision':>10}{'left':>7}"
             f"{'planted':>8}"]
    for k, r in res.items():
        if "error" in r:
            lines.append(f"{k:<{w}}{r['error']}")
            continue
        vs = f"{r['docs_s'] / base['docs_s']:.2f}x" if base else "-"
        pl = "-" if r["planted_resolved"] is None else f"{r['planted_resolved']:.4f}"
        cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else "-"
        lines.append(f"{k:<{w}}{r['docs_s']:>9,.0f}{r['docs_s_per_core']:>8,.0f}{vs:>7}"
                     f"{r['wall_s']:>8.1f}{cpu:>8}{r['peak_rss_mb']:>9,.0f}{r['removed']:>9,}"
                     f"{r['recall']:>8.4f}{r['precision']:>10.4f}{r['left']:>7,}{pl:>8}")
        if r.get("recall_vs_job_exact") is not None:
            lines.append(f"{'':<{w}}recall against the job's mode: exact: "
                         f"{r['recall_vs_job_exact']:.4f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--corpus", default=None, help="a folder text_corpus.py wrote (reused; "
                    "default: a new one in the work folder)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME_SUBSTRING")
    ap.add_argument("--json", default="bench-jaccard.json")
    ap.add_argument("--keep-work", default=None, help="work folder to keep (default: temp)")
    ap.add_argument("--datatrove-venv", default=DATATROVE_VENV,
                    help="a venv with pip install 'datatrove[processing]' spacy")
    ap.add_argument("--minhash-venv", default=MINHASH_VENV,
                    help="a venv with pip install datasketch rensa pyarrow")
    ap.add_argument("--code", default=str(ROOT), help="the checkout the job runs from")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per contender")
    ap.add_argument("--memory-gb", type=float, default=16)
    ap.add_argument("--job-verbose", action="store_true",
                    help="run the job with --verbose (its stage lines in <work>/<job>/stderr.log)")
    ap.add_argument("--no-oracle", action="store_true",
                    help="skip the brute-force oracle (scores against the job's exact run)")
    text_corpus.arguments(ap)
    a = ap.parse_args()
    a.threshold = (a.threshold or [0.8])[0]
    a.no_tokens = True
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench-jaccard-") as tmp:
        work = Path(a.keep_work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus = Path(a.corpus).resolve() if a.corpus else work / "corpus"
        if not (corpus / "truth.parquet").exists():
            log(f"building a corpus of {a.docs:,} documents in {corpus}")
            a.threshold = [a.threshold]
            text_corpus.make(a.docs, corpus, a, log)
            a.threshold = a.threshold[0]
        info = json.loads((corpus / "corpus.json").read_text())
        parts = len(list((corpus / "text").glob("*.parquet")))
        results: dict[str, dict] = {}
        for name, c in contenders(a).items():
            if a.only and not any(s.lower() in name.lower() for s in a.only):
                continue
            log(f"running {name} ...")
            results[name] = run_contender(name, c, corpus, work, a, parts)
            r = results[name]
            log(f"  {r.get('error') or ''} {r.get('wall_s', 0):.1f} s, "
                f"{r.get('peak_rss_mb', 0):.0f} MB, {len(r.get('removed_ids', [])):,} removed")
        bench = scoring(corpus, info, results, a, log)
        Path(a.json).write_text(json.dumps(bench, indent=2, default=float))
        print(table(bench), flush=True)


def scoring(corpus: Path, info: dict, results: dict, a: argparse.Namespace, log) -> dict:
    ids, texts, truth = load(corpus)
    row = {d: i for i, d in enumerate(ids)}
    n = len(ids)
    t0 = time.perf_counter()
    sets = text_corpus.shingle_sets(texts)
    valid = sets.sizes > 0
    index = PrefixIndex(sets, a.threshold)
    log(f"shingles of {n:,} documents and the index: {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    exact_job = next((r for k, r in results.items() if "exact" in k and "removed_ids" in r), None)
    if a.no_oracle and exact_job is None:
        sys.exit("--no-oracle needs the job's mode: exact run")
    if a.no_oracle:
        truth_removed = np.zeros(n, bool)
        truth_removed[[row[d] for d in exact_job["removed_ids"]]] = True
    else:
        truth_removed = oracle(index, valid)
    oracle_s = time.perf_counter() - t0
    log(f"oracle: {int(truth_removed.sum()):,} removals ({oracle_s:.0f} s)")
    src = truth.column("source").to_pylist()
    jw = truth.column("jaccard").to_numpy(zero_copy_only=False)
    planted = np.array([(row[d], row[s]) for d, s, j in zip(truth.column("id").to_pylist(), src,
                                                             jw, strict=True)
                        if s is not None and j >= a.threshold], np.int64).reshape(-1, 2)
    kind = np.array(truth.column("kind").to_pylist())
    cores = os.cpu_count() or 1
    job_exact = None
    if exact_job is not None:
        job_exact = np.zeros(n, bool)
        job_exact[[row[d] for d in exact_job["removed_ids"]]] = True
    out = {}
    for name, r in results.items():
        r = dict(r)
        if r.get("info", {}).get("read", n) != n:
            r.pop("removed_ids")
            r["error"] = f"read {r['info']['read']:,} of {n:,} documents"
        if "removed_ids" in r:
            removed = np.zeros(n, bool)
            removed[[row[d] for d in r.pop("removed_ids")]] = True
            r.update(score(index, valid, removed, truth_removed, planted, kind))
            r["docs_s"] = n / r["wall_s"]
            r["docs_s_per_core"] = r["docs_s"] / cores
            if job_exact is not None and not a.no_oracle:
                r["recall_vs_job_exact"] = float((removed & job_exact).sum() / max(
                    job_exact.sum(), 1))
            log(f"  scored {name}")
        out[name] = r
    return {"docs": n, "text_mb": info["text_bytes"] / 2 ** 20, "threshold": a.threshold,
            "versions": versions(results),
            "cores": cores, "oracle": "job mode: exact" if a.no_oracle else "prefix-filter greedy",
            "oracle_removed": int(truth_removed.sum()), "oracle_s": oracle_s,
            "planted_pairs": len(planted), "corpus": info, "results": out}


if __name__ == "__main__":
    main()
