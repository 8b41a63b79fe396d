"""Benchmark how the jaccard near stage handles big crowds (issue 43, target 2): one
piece of real boilerplate copied with small edits 100,000 times, run through the
``tensordedup`` command as a user would.

Why: a crowd is the input where a near stage goes quadratic or holds everything at once.
The target: the job finishes with the peak RSS of its process tree at most max(3 GB, 3x
the input's text bytes), and a crowd of m copies costs at most 2m verified pairs.

Data, all real and offline, deterministic by ``--seed``:
- the crowd's template: an MIT licence an installed package ships
  (``site-packages/*/LICENSE*``, the first by name; ``--licence PATH``), or a banner
  paragraph of 28 words copied across installed packages' METADATA (Tidelift's
  sponsorship note, as importlib_metadata and zipp ship it);
- edits: words replaced by real words (the docstrings' vocabulary) at positions at least
  5 words apart, so each breaks 5 shingles; a copy's count of edits is drawn so its
  Jaccard to the template lands at a target drawn uniformly from the case's range, then
  measured exactly (``transforms.near.sets``: word 5-grams, normalised);
- the rest of the corpus: ``--others`` real documents (installed packages' licence /
  README / METADATA files and Python's docstrings, ``scripts/text_corpus.py``) whose
  Jaccard to the template is below 0.3, shuffled in among the copies (row order is the
  keep order: ``keep: first``).

Cases (each a Parquet corpus of 4 files, columns ``id``, ``text``):
- ``licence-j0.8``: m copies of the licence, each at J >= 0.8 to the template (targets
  uniform in [0.8, 0.97]); thresholds 0.7, 0.8, 0.9;
- ``licence-j0.7-0.95``: the same with targets uniform in [0.7, 0.95] (copies differ
  among themselves); thresholds 0.7, 0.8, 0.9;
- ``identical``: m identical copies of the licence; threshold 0.8;
- ``banner``: m copies of the banner, one word replaced each (at a uniform position);
  threshold 0.8.

Each run: ``tensordedup --config job.yaml --quiet`` with ``near: {metric: jaccard,
threshold: T}`` (word 5-grams, ``mode: auto``, the runner as a config leaves it), timed
as a whole process; peak RSS of its process tree polled every 0.1 s (``benchkit``; killed
above ``--memory-gb`` or after ``--timeout``). From report/summary.json: the mode auto
chose, ``near.compared`` (pairs whose exact Jaccard was computed), the removals.
- pairs per member: compared / m (every pair the job verified, the other documents'
  too, over the crowd's size m), against the target of 2;
- precision: every removed record's ``duplicate_of`` (report/duplicates.parquet) at true
  J >= T, recomputed here with ``transforms.near.sets.text_sets`` / ``jaccard``;
- recall: against a brute-force greedy in keep order (each record compared with every
  record kept before it, exact integer arithmetic: removed when one is at J >= T; what
  ``mode: exact`` must equal). The copies and the other documents are decided apart
  when every copy is nearer the template by more than 1 - T (then no pair across is
  near: the Jaccard distance is a metric), the copies as template-relative sets (one
  matrix product per block against the kept ones); otherwise over shared-shingle
  postings up to ``--oracle-budget``, and above it the job's ``mode: exact`` run when it
  finishes within ``--oracle-timeout`` (else none; said so in the table). "recall
  printed" is the job's own estimate (summary.json ``near.recall``).

Usage: python scripts/bench_jaccard_crowds.py [--copies 100000] [--others 5000]
         [--only banner ...] [--json bench-jaccard-crowds.json] [--keep-work DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from benchkit import ROOT, run_watched

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import text_corpus  # noqa: E402
from bench_jaccard import CpuWatch, code_state  # noqa: E402

from transforms.near.sets import Sets, jaccard, text_sets  # noqa: E402
from transforms.near.spec import Shingles  # noqa: E402

WORDS = Shingles("word", 5)
WORD = re.compile(r"([^\W_]+)")  # split keeps the words at odd positions
BANNER_KEY = "working with Tidelift to deliver one enterprise subscription"
MIT_KEY = "Permission is hereby granted, free of charge"
BOUND_FLOOR = 3e9  # bytes: the target's max(3 GB, 3x the text)
PARTS = 4
# (case, template, edits: (lo, hi) target J to the template | "one" | None, thresholds)
CASES = [("licence-j0.8", "licence", (0.8, 0.97), (0.7, 0.8, 0.9)),
         ("licence-j0.7-0.95", "licence", (0.7, 0.95), (0.7, 0.8, 0.9)),
         ("identical", "licence", None, (0.8,)),
         ("banner", "banner", "one", (0.8,))]


# ------------------------------------------------------------------------------ data


def find_licence() -> Path:
    """The first MIT licence (by path) that an installed package ships."""
    site = text_corpus.site_packages()
    for p in sorted(site.glob("*/LICENSE*")):
        t = p.read_text(encoding="utf-8", errors="replace")
        if MIT_KEY in t and len(t.split()) < 250:
            return p
    sys.exit(f"no MIT licence under {site}/*/LICENSE*: pass --licence PATH")


def find_banner() -> tuple[str, str]:
    """A boilerplate paragraph installed packages' METADATA share (whitespace joined)."""
    site = text_corpus.site_packages()
    for p in sorted(site.glob("*.dist-info/METADATA")):
        for para in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace")):
            if BANNER_KEY in " ".join(para.split()):
                return " ".join(para.split()), str(p)
    sys.exit(f"no METADATA under {site} holds the banner paragraph ({BANNER_KEY!r})")


def vocabulary(texts: list[str]) -> list[str]:
    """Real words for the edits: lower-case ASCII words of 3-12 letters, once each."""
    words = {w for t in texts for w in re.findall(r"\b[a-z]{3,12}\b", t)}
    return sorted(words)


def edit(template: str, k: int, rng: np.random.Generator, vocab: list[str],
         anywhere: bool = False) -> str:
    """The template with k words replaced by other real words, at positions at least 5
    apart (each breaks its own 5 shingles); ``anywhere``: one uniform position."""
    tokens = WORD.split(template)
    n = len(tokens) // 2
    if anywhere:
        chosen = [int(rng.integers(n))]
    else:
        chosen = []
        for p in rng.permutation(n).tolist():
            if all(abs(p - q) >= 5 for q in chosen):
                chosen.append(p)
                if len(chosen) == k:
                    break
    for p in chosen:
        old = tokens[2 * p + 1].lower()
        new = old
        while new == old:
            new = vocab[int(rng.integers(len(vocab)))]
        tokens[2 * p + 1] = new
    return "".join(tokens)


def to_template(sets: Sets, template: np.ndarray) -> np.ndarray:
    """Each record's exact Jaccard to the template's set (vectorised over the CSR)."""
    hit = np.r_[np.isin(sets.hashes, template).astype(np.int64), 0]  # a last empty row too
    inter = np.add.reduceat(hit, sets.offsets[:-1])
    inter = np.where(sets.sizes > 0, inter, 0)
    return inter / (sets.sizes + len(template) - inter)


def crowd(template: str, spec, m: int, rng: np.random.Generator, vocab: list[str]
          ) -> tuple[list[str], np.ndarray]:
    """m copies of the template edited per ``spec``, and each one's J to the template."""
    tset = text_sets([template], WORDS).row(0)
    if spec is None:
        return [template] * m, np.ones(m)
    if spec == "one":
        copies = [edit(template, 1, rng, vocab, anywhere=True) for _ in range(m)]
        return copies, to_template(text_sets(copies, WORDS), tset)
    lo, hi = spec
    s = len(tset)
    target = rng.uniform(lo, hi, m)  # k edits break 5k shingles: J = (s - 5k) / (s + 5k)
    k = np.maximum(1, np.rint(s * (1 - target) / (5 * (1 + target)))).astype(int)
    copies = [edit(template, int(x), rng, vocab) for x in k]
    j = to_template(text_sets(copies, WORDS), tset)
    for _ in range(20):  # below the range (a repeated shingle, an edit at the end): fewer
        low = np.flatnonzero((j < lo) & (k > 1))
        if not len(low):
            break
        k[low] -= 1
        for i in low.tolist():
            copies[i] = edit(template, int(k[i]), rng, vocab)
        j[low] = to_template(text_sets([copies[i] for i in low], WORDS), tset)
    return copies, j


def others(template: str, count: int, rng: np.random.Generator) -> list[str]:
    """Real documents unrelated to the template (J < 0.3 to it), a seeded sample."""
    pool = text_corpus.package_texts() + text_corpus.docstring_texts()
    sets = text_sets(pool, WORDS)
    j = to_template(sets, text_sets([template], WORDS).row(0))
    ok = np.flatnonzero((j < 0.3) & (sets.sizes > 0))
    pick = rng.choice(ok, size=min(count, len(ok)), replace=False)
    return [pool[i] for i in sorted(pick.tolist())]


def write_corpus(folder: Path, copies: list[str], other: list[str], rng: np.random.Generator
                 ) -> tuple[list[str], list[str]]:
    """Copies and other documents shuffled together, as PARTS Parquet files; (ids, texts)
    in keep order."""
    texts = copies + other
    ids = [f"crowd-{i:06d}" for i in range(len(copies))] + [
        f"other-{i:06d}" for i in range(len(other))]
    order = rng.permutation(len(texts))
    ids, texts = [ids[i] for i in order], [texts[i] for i in order]
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(texts) // PARTS)
    for p in range(PARTS):
        sl = slice(p * step, (p + 1) * step)
        pq.write_table(pa.table({"id": ids[sl], "text": texts[sl]}),
                       folder / f"part-{p:05d}.parquet")
    return ids, texts


# ----------------------------------------------------------------------------- oracle


def crowd_greedy(sets: Sets, template: np.ndarray, threshold: float, block: int = 256
                 ) -> np.ndarray:
    """The greedy in keep order over records near a template, each against every record
    kept before it, exactly and without listing postings: a record is its missing
    template shingles M (dense over the template) and its other shingles Q (sparse), so
    |A & B| = |T| - |M_A| - |M_B| + |M_A & M_B| + |Q_A & Q_B|: one matrix product per
    block of records against the kept ones. Returns the removed rows."""
    from scipy import sparse

    t = Fraction(str(threshold))
    num, den = t.numerator, t.denominator
    n, nt = len(sets), len(template)
    rec = np.repeat(np.arange(n), sets.sizes)
    pos = np.searchsorted(template, sets.hashes)
    inside = template[np.minimum(pos, nt - 1)] == sets.hashes
    miss = np.ones((n, nt), np.float32)  # M: the template's shingles a record lacks
    miss[rec[inside], pos[inside]] = 0
    _, extra = np.unique(sets.hashes[~inside], return_inverse=True)
    q = sparse.csr_matrix((np.ones(len(extra), np.float32), (rec[~inside], extra)),
                          shape=(n, int(extra.max(initial=-1)) + 1))
    m = miss.sum(axis=1).astype(np.int64)
    size = sets.sizes.astype(np.int64)
    kept = np.zeros(n, np.int64)  # rows kept so far, in order: kept[:k]
    k = 0
    removed = np.zeros(n, bool)

    def inter(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        x = nt - m[a][:, None] - m[b][None, :] + (miss[a] @ miss[b].T).astype(np.int64)
        qq = (q[a] @ q[b].T).tocoo()
        np.add.at(x, (qq.row, qq.col), qq.data.astype(np.int64))
        return x

    def near(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return x * den >= num * (size[a][:, None] + size[b][None, :] - x)

    for lo in range(0, n, block):
        rows = np.arange(lo, min(lo + block, n))
        gone = near(inter(rows, kept[:k]), rows, kept[:k]).any(axis=1) if k else \
            np.zeros(len(rows), bool)
        inner = near(inter(rows, rows), rows, rows)
        mine: list[int] = []
        for i in range(len(rows)):
            if gone[i] or (mine and inner[i, mine].any()):
                removed[rows[i]] = True
            else:
                mine.append(i)
        kept[k:k + len(mine)] = rows[mine]
        k += len(mine)
    return removed


def split_greedy(sets: Sets, template: np.ndarray, threshold: float, budget: int
                 ) -> tuple[np.ndarray | None, str]:
    """The greedy's removals over a crowd and unrelated records, as two greedies: when
    every copy is nearer the template than every other record by more than 1 -
    threshold, no copy is near another record (the Jaccard distance is a metric:
    d(o, c) >= d(o, T) - d(c, T)), so each side's decisions are its own. None when the
    gap is not there or the others' brute force passes its budget."""
    jt = to_template(sets, template)
    crowd = jt >= 0.5
    gap = jt[crowd].min(initial=1.0) - jt[~crowd].max(initial=0.0)
    if not crowd.any() or gap <= 1 - threshold:
        return None, f"no gap: copies and others {gap:.3f} apart in J to the template"
    removed = np.zeros(len(sets), bool)
    c, o = np.flatnonzero(crowd), np.flatnonzero(~crowd)
    removed[c] = crowd_greedy(sets.take(c), template, threshold)
    rest, _ = brute_force(sets.take(o), threshold, budget)
    if rest is None:
        return None, "the other documents' brute force passed its budget"
    removed[o] = rest
    return removed, (f"copies at J >= {jt[crowd].min():.3f} to the template, others at "
                     f"<= {jt[~crowd].max(initial=0.0):.3f}")


def brute_force(sets: Sets, threshold: float, budget: int) -> tuple[np.ndarray | None, int]:
    """Rows the greedy in keep order removes: each record against every record kept
    before it that shares a shingle with it (the others are at J = 0), exact integer
    arithmetic. None when the postings visited pass ``budget``; and the count visited."""
    t = Fraction(str(threshold))
    num, den = t.numerator, t.denominator
    _, ids = np.unique(sets.hashes, return_inverse=True)
    sizes = sets.sizes.astype(np.int64)
    post: dict[int, list[int]] = {}
    removed = np.zeros(len(sets), bool)
    visited = 0
    for i in range(len(sets)):
        row = ids[sets.offsets[i]:sets.offsets[i + 1]].tolist()
        hits = list(itertools.chain.from_iterable(post[s] for s in row if s in post))
        visited += len(hits)
        if visited > budget:
            return None, visited
        if hits:
            kept, inter = np.unique(np.asarray(hits, np.int64), return_counts=True)
            union = sizes[i] + sizes[kept] - inter
            if (inter * den >= num * union).any():
                removed[i] = True
                continue
        for s in row:
            post.setdefault(s, []).append(i)
    return removed, visited


# ------------------------------------------------------------------------------- runs


def job_config(corpus: Path, out: Path, threshold: float, mode: str | None,
               recall_sample: int | None) -> Path:
    """The README's "Deduplicate a text or token dataset" config over the corpus."""
    near = {"metric": "jaccard", "threshold": threshold}
    if mode:
        near["mode"] = mode
    if recall_sample is not None:
        near["recall_sample"] = recall_sample
    cfg = {"input": {"format": "parquet", "path": str(corpus / "*.parquet"), "tensor": "text",
                     "id": "id", "decode": "text"},
           "near": near, "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report")}
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run_job(corpus: Path, out: Path, threshold: float, a: argparse.Namespace,
            mode: str | None = None, timeout: float | None = None,
            recall_sample: int | None = None) -> dict:
    """One ``tensordedup`` process: wall, CPU, peak RSS of its tree, the report's figures."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = job_config(corpus, out, threshold, mode, recall_sample)
    exe = Path(sys.executable).parent / "tensordedup"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "pipeline.run"]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    load = os.getloadavg()[0]
    code = code_state(str(ROOT))  # the checkout is shared: others edit it during runs
    with CpuWatch() as cpu:
        r = run_watched([*cmd, "--config", str(cfg), "--quiet"], cwd=out,
                        log=out / "stderr.log", env=env,
                        limit_bytes=int(a.memory_gb * 2 ** 30),
                        timeout_s=timeout or a.timeout)
    res = {"wall_s": r["wall_s"], "cpu_s": cpu.seconds,
           "peak_rss_mb": r["peak_rss_bytes"] / 2 ** 20, "rc": r["rc"], "load_1m_before": load,
           "load_1m_after": os.getloadavg()[0]}
    after = code_state(str(ROOT))
    res["code"] = code if after == code else f"{code}, then {after} (edited)"
    if r["killed"] or r["rc"] != 0:
        tail = [ln for ln in r["stderr_tail"].splitlines() if ln.strip()]
        why = f"killed ({r['killed']} after {r['wall_s']:.0f} s)" if r["killed"] else \
            f"exit {r['rc']}"
        return {**res, "error": f"{why}: {tail[-1] if tail and not r['killed'] else ''}"[:600]}
    s = json.loads((out / "report" / "summary.json").read_text())
    dup = pq.read_table(out / "report" / "duplicates.parquet",
                        columns=["record_id", "duplicate_of", "kind"])
    near = s["near"]
    return {**res, "mode": near.get("mode"), "mode_reason": near.get("mode_reason"),
            "bands": near.get("bands"), "rows": near.get("rows"),
            "compared": near.get("compared"), "candidate_groups": near.get("candidate_groups"),
            "recall_estimate": (near.get("recall") or {}).get("recall"),
            "read": s["read"], "kept": s["kept"], "removed_exact": s["removed_exact"],
            "removed_near": s["removed_near"],
            "pairs": list(zip(dup.column("record_id").to_pylist(),
                              dup.column("duplicate_of").to_pylist(), strict=True))}


def verify(pairs: list[tuple[str, str]], row: dict[str, int], sets: Sets, threshold: float
           ) -> dict:
    """Each removal's true Jaccard to the record it names (exact: intersection / union)."""
    t = Fraction(str(threshold))
    bad, low = 0, 1.0
    for rid, of in pairs:
        a, b = sets.row(row[rid]), sets.row(row[of])
        j = jaccard(a, b)
        inter = np.intersect1d(a, b, assume_unique=True).size
        if inter * t.denominator < t.numerator * (len(a) + len(b) - inter):
            bad += 1
        low = min(low, j)
    return {"precision": 1.0 - bad / len(pairs) if pairs else 1.0, "below_threshold": bad,
            "lowest_j": low if pairs else None}


def pairwise(sets: Sets, rows: np.ndarray, rng: np.random.Generator, n: int = 2000) -> dict:
    """Jaccard between random pairs of copies: how much the crowd differs among itself."""
    a, b = rng.choice(rows, n), rng.choice(rows, n)
    j = np.array([jaccard(sets.row(x), sets.row(y)) for x, y in zip(a, b, strict=True) if x != y])
    return {f"p{q}": float(np.percentile(j, q)) for q in (10, 50, 90)}


def run_case(case: tuple, a: argparse.Namespace, work: Path, src: dict, log) -> list[dict]:
    name, which, spec, thresholds = case
    rng = np.random.default_rng([a.seed, [c[0] for c in CASES].index(name)])
    template = src[which]
    t0 = time.perf_counter()
    copies, jt = crowd(template, spec, a.copies, rng, src["vocab"])
    other = src["others"][which]
    ids, texts = write_corpus(work / name / "corpus", copies, other, rng)
    text_bytes = sum(len(t.encode()) for t in texts)
    sets = text_sets(texts, WORDS)
    row = {d: i for i, d in enumerate(ids)}
    crowd_rows = np.array([row[f"crowd-{i:06d}"] for i in range(len(copies))])
    tset = text_sets([template], WORDS).row(0)
    info = {"case": name, "template": which, "m": len(copies), "others": len(other),
            "documents": len(texts), "text_bytes": text_bytes,
            "bound_bytes": max(BOUND_FLOOR, 3 * text_bytes),
            "template_words": len(WORD.split(template)) // 2,
            "template_shingles": len(tset),
            "j_to_template": {"min": float(jt.min()), "p50": float(np.median(jt)),
                              "max": float(jt.max())},
            "j_among_copies": pairwise(sets, crowd_rows, rng)}
    log(f"{name}: {len(texts):,} documents ({text_bytes / 1e6:.0f} MB), J to the template "
        f"{jt.min():.3f}-{jt.max():.3f}, among copies {info['j_among_copies']} "
        f"({time.perf_counter() - t0:.0f} s)")
    out: list[dict] = []
    truths: dict = {}  # threshold -> the oracle's removals (shared by a case's runs)
    for t in thresholds:
        if a.only and not any(s in f"{name}@{t}" for s in a.only):
            continue
        for recall_sample in (None, 0):
            log(f"  {name} @ {t}{'' if recall_sample is None else ', recall_sample: 0'}: "
                "tensordedup ...")
            r = run_job(work / name / "corpus", work / name / f"t{t}-{recall_sample}", t, a,
                        recall_sample=recall_sample)
            res = {**info, "threshold": t, "recall_sample": recall_sample,
                   **{k: v for k, v in r.items() if k != "pairs"}}
            res["within_memory"] = r["peak_rss_mb"] * 2 ** 20 <= res["bound_bytes"]
            if "error" not in r:
                res.update(verify(r["pairs"], row, sets, t))
                res["pairs_per_member"] = r["compared"] / len(copies)
                res["within_2m"] = r["compared"] <= 2 * len(copies)
                removed = np.zeros(len(texts), bool)
                removed[[row[d] for d, _ in r["pairs"]]] = True
                res["crowd_kept"] = int((~removed[crowd_rows]).sum())
                res.update(score(removed, sets, tset, t, work / name, a, r, truths, log))
            log(f"    {r.get('error', '')} {r['wall_s']:.1f} s, {r['peak_rss_mb']:,.0f} MB, "
                f"mode {r.get('mode')}, compared {r.get('compared')}, "
                f"recall {res.get('recall')}, precision {res.get('precision')}")
            out.append(res)
            # the stage alone, without the recall estimate's brute force, where the run
            # failed or passed the memory bound
            if not a.isolate or ("error" not in r and res["within_memory"]):
                break
    if not a.keep_corpus:
        shutil.rmtree(work / name / "corpus", ignore_errors=True)
    return out


def score(removed: np.ndarray, sets: Sets, template: np.ndarray, t: float, folder: Path,
          a: argparse.Namespace, r: dict, truths: dict, log) -> dict:
    """Recall against the brute-force greedy, or the job's exact mode above its budget
    (``truths`` keeps an oracle for the case's next run at the same threshold)."""
    if t not in truths:
        truths[t] = oracle(sets, template, t, folder, a, r, log)
    truth, res = truths[t]
    res = dict(res)
    if truth is None:
        if r["mode"] != "exact":
            return res
        truth, res["oracle"] = removed, "the job itself (mode: exact)"
    res["oracle_removed"] = int(truth.sum())
    res["recall"] = float((removed & truth).sum() / truth.sum()) if truth.any() else 1.0
    return res


def oracle(sets: Sets, template: np.ndarray, t: float, folder: Path, a: argparse.Namespace,
           r: dict, log) -> tuple[np.ndarray | None, dict]:
    """The greedy's removals by brute force, or by the job's ``mode: exact`` (without its
    recall estimate) when the brute force passes its budget; None when neither ends."""
    t0 = time.perf_counter()
    truth, why = split_greedy(sets, template, t, a.oracle_budget)
    if truth is not None:
        return truth, {"oracle_s": time.perf_counter() - t0, "oracle": "brute force",
                       "oracle_split": why}
    truth, visited = brute_force(sets, t, a.oracle_budget)
    res: dict = {"oracle_s": time.perf_counter() - t0, "oracle_postings": visited,
                 "oracle_split": why}
    if truth is not None:
        return truth, {**res, "oracle": "brute force"}
    if r["mode"] == "exact" or a.oracle_timeout <= 0:
        return None, {**res, "oracle": "none (brute force over budget)"}
    log(f"    brute force over budget ({visited:,} postings): the job's mode: exact ...")
    ex = run_job(folder / "corpus", folder / f"t{t}-exact", t, a, "exact", a.oracle_timeout,
                 recall_sample=0)
    res["exact_run"] = {k: v for k, v in ex.items() if k != "pairs"}
    if "error" in ex:
        return None, {**res, "oracle": f"none (brute force over budget; mode: exact "
                                       f"{ex['error'][:60]})"}
    ids = [d for f in sorted((folder / "corpus").glob("*.parquet"))
           for d in pq.read_table(f, columns=["id"]).column("id").to_pylist()]
    row = {d: i for i, d in enumerate(ids)}
    truth = np.zeros(len(sets), bool)
    truth[[row[d] for d, _ in ex["pairs"]]] = True
    return truth, {**res, "oracle": "the job, mode: exact"}


# ------------------------------------------------------------------------------ table


def table(results: list[dict]) -> str:
    head = ("| case | documents (text) | t | mode | wall s | peak MB (bound) | m | pairs "
            "verified | per member | crowd kept | removed | oracle | recall | recall printed | "
            "precision |")
    lines = [head, "| " + " | ".join(["---"] * 4 + ["---:"] * 11) + " |"]
    for r in results:
        case = r["case"] + ("" if r["recall_sample"] is None else " (recall_sample: 0)")
        docs = f"{r['documents']:,} ({r['text_bytes'] / 1e6:.0f} MB)"
        mem = f"{r['peak_rss_mb']:,.0f} ({r['bound_bytes'] / 2 ** 20:,.0f})"
        if not r["within_memory"]:
            mem = f"**{mem}**"
        if "error" in r:
            lines.append(f"| {case} | {docs} | {r['threshold']} | - | {r['wall_s']:.0f} | "
                         f"{mem} | {r['m']:,} | {r['error'][:90]} | | | | | | | |")
            continue
        per = f"{r['pairs_per_member']:.2f}" + ("" if r["within_2m"] else " **> 2**")
        rec = f"{r['recall']:.4f}" if r.get("recall") is not None else "-"
        est = f"{r['recall_estimate']:.4f}" if r.get("recall_estimate") is not None else "-"
        orc = r["oracle"] if "oracle_removed" not in r else \
            f"{r['oracle']}: {r['oracle_removed']:,}"
        lines.append(
            f"| {case} | {docs} | {r['threshold']} | {r['mode']} | {r['wall_s']:.1f} | "
            f"{mem} | {r['m']:,} | {r['compared']:,} | {per} | {r['crowd_kept']:,} | "
            f"{r['removed_exact'] + r['removed_near']:,} | {orc} | {rec} | {est} | "
            f"{r['precision']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=100_000, help="crowd size m (default 100,000)")
    ap.add_argument("--others", type=int, default=5000, help="unrelated real documents")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--licence", default=None, help="the licence file copied (default: the "
                    "first MIT licence under site-packages/*/LICENSE*)")
    ap.add_argument("--only", action="append", default=[], metavar="CASE@T",
                    help="run only the runs whose 'case@threshold' holds this (repeatable)")
    ap.add_argument("--json", default="bench-jaccard-crowds.json")
    ap.add_argument("--keep-work", default=None, help="work folder to keep (default: temp)")
    ap.add_argument("--keep-corpus", action="store_true", help="keep each case's Parquet")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per job run")
    ap.add_argument("--memory-gb", type=float, default=16, help="kill a job run above this")
    ap.add_argument("--oracle-budget", type=int, default=500_000_000,
                    help="brute force: shared-shingle postings visited at most")
    ap.add_argument("--no-isolate", dest="isolate", action="store_false",
                    help="no second run with recall_sample: 0 where a run failed or passed "
                    "the memory bound")
    ap.add_argument("--oracle-timeout", type=float, default=900,
                    help="seconds for the job's mode: exact as oracle (0: none)")
    a = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    licence = Path(a.licence) if a.licence else find_licence()
    banner, banner_from = find_banner()
    log(f"licence: {licence} ({len(licence.read_text().split())} words); banner from "
        f"{banner_from}: {banner!r}")
    src = {"licence": licence.read_text(encoding="utf-8"), "banner": banner}
    docs = text_corpus.docstring_texts()
    src["vocab"] = vocabulary(docs)
    rng = np.random.default_rng([a.seed, 99])
    src["others"] = {k: others(src[k], a.others, rng) for k in ("licence", "banner")}
    cases = [c for c in CASES if not a.only or any(
        s in f"{c[0]}@{t}" for s in a.only for t in c[3])]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-crowds-") as tmp:
        work = Path(a.keep_work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        for case in cases:
            results += run_case(case, a, work, src, log)
    bench = {"copies": a.copies, "others": a.others, "seed": a.seed, "licence": str(licence),
             "banner": banner, "banner_from": banner_from, "cores": os.cpu_count(),
             "code": code_state(str(ROOT)), "python": sys.version.split()[0],
             "date": time.strftime("%Y-%m-%d"), "results": results}
    Path(a.json).write_text(json.dumps(bench, indent=2, default=float))
    print(table(results), flush=True)


if __name__ == "__main__":
    main()
