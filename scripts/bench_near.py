"""Benchmark near-duplicate removal: the job and this kernel against what users write.

Data sets (``--data``, repeatable):
- ``embeddings``: N unit vectors x 384 shaped like sentence embeddings (tests/embeddings.py:
  a shared direction, 2,000 topics of Zipf-like sizes, anisotropic noise; median
  random-pair cosine ~0.3), plus near copies of 5% of them at cosine distances
  0.001-0.02 and decoys of 2% at 0.021-0.03. Thresholds: cosine 0.01 and 0.02.
- ``sentences``: real all-MiniLM-L6-v2 embeddings of sentences from Python's own help
  texts plus edited variants (scripts/make_sentence_embeddings.py). Cosine 0.02, 0.05.
- ``blobs``: N x 128 float32 around 1,000 well-separated centres, 5% planted copies at
  0.5-0.95 x the threshold and 2% decoys at 1.02-1.2 x. L2 0.5.

Contenders (keep first, representative grouping, every pair verified in float64):
- the job (auto): ``python -m pipeline.run`` on a Parquet file, timed as a whole
  process (imports, reading, exact and near stages, writing the clean shard and report);
- this kernel in one process (``transforms.near.find.find_near``), exact cells and bounded;
- FAISS IVF kNN: one IndexIVFFlat (nlist sqrt n, nprobe 8), 10 neighbours per row;
- SemDeDup-style: spherical k-means into cells of ~1,000 rows, all pairs inside each
  cell only (what SemDeDup does per cluster);
- flat all-pairs: FAISS IndexFlat range search over everything (over a 100k-row subset
  when N is larger, its time extrapolated by (N / 100k)^2: said in the table).

Recall is measured here, not taken from the contenders: 2,000 records drawn with a
seeded RNG are compared with all N records by brute force in float64; a sampled record
with near duplicates counts as recalled when, for each of them, the contender removed
it or its partner (no near-duplicate pair survives in the clean data). Recall is the
recalled share with a Wilson 95% interval; pair recall is resolved pairs / pairs. With
few sampled positives that interval is wide, so the planted pairs (every planted copy or
edited sentence within tolerance of its original) give a second, population-wide
recall. Precision: removals within tolerance of the record they name. Each contender runs in
its own fresh process; seconds time the work (the job: the whole CLI process), peak
RSS is that process's VmHWM or its process tree's (the job's worker processes), the
higher. Prints a table per data set and threshold; writes JSON.

Issue 21's shapes (``--data identical | crowds | magnitudes | blank | blank-l2 | wide |
wide-128 | wide-u8 | wide-f32 | crowd-1m | crowds-of-20 | distinct-1m``, scripts/benchshapes.py):
the job alone, as a whole CLI process, with the peak memory of its process tree against
max(3 GB, 3 x tensor bytes), killed above 16 GB; ``--scale`` shrinks the rows,
``--code DIR`` runs the job from another checkout (e.g. main, for before/after).

Usage: python scripts/bench_near.py [--data embeddings] [--rows 1000000]
         [--threshold 0.01 ...] [--only NAME ...] [--growth 250000] [--json bench-near.json]
       python scripts/bench_near.py --data crowds --data wide [--scale 0.5] [--code DIR]
         [--timeout 900] [--json bench-shapes.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from benchkit import PEAK_RSS_MB, ROOT, run_python

sys.path.insert(0, str(ROOT))
from tests.embeddings import embeddings, planted_copies  # noqa: E402
from transforms.near.recall import wilson  # noqa: E402
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance  # noqa: E402

GROUP_ROWS = 65536
SAMPLE = 2000
# ... plus this many rows of planted pairs (both ends; about half have a partner within
# the tolerance), so that the recall estimate rests on at least 400 records that have
# near duplicates (2,000 random rows of the embeddings hold about 80)
PLANTED_SAMPLE = 1200
FLAT_SUBSET = 100_000
JOB = "the job (auto)"
FLAT = "flat all-pairs (FAISS range search)"
SENTENCES = ROOT / "bench-data" / "sentences.npz"


def make_blobs(n: int, threshold: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n_near, n_decoy = int(n * 0.05), int(n * 0.02)
    n_base = n - n_near - n_decoy
    centers = rng.standard_normal((1000, 128)) * 3
    base = centers[rng.integers(0, 1000, n_base)] + rng.standard_normal((n_base, 128))

    def moved(rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
        u = rng.standard_normal(rows.shape)
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        return rows + u * (threshold * rng.uniform(lo, hi, (len(rows), 1)))

    near = moved(base[rng.choice(n_base, n_near)], 0.5, 0.95)
    decoys = moved(base[rng.choice(n_base, n_decoy)], 1.02, 1.2)
    x = np.concatenate([base, near, decoys]).astype(np.float32)
    return x[rng.permutation(n)]


def dataset(name: str, rows: int) -> tuple[np.ndarray, str, list[float], np.ndarray | None]:
    """(vectors, metric, thresholds, planted (original, copy) row pairs or None)."""
    if name == "embeddings":
        x, pairs = planted_copies(embeddings(round(rows / 1.07)))
        return x, "cosine", [0.01, 0.02], pairs
    if name == "blobs":
        return make_blobs(rows, 0.5), "l2", [0.5], None
    if not SENTENCES.exists():
        sys.exit(f"{SENTENCES} is missing: run python scripts/make_sentence_embeddings.py")
    with np.load(SENTENCES) as z:
        x, source = z["vectors"].astype(np.float32), z["source"]
    first = {}
    for row, s in enumerate(source.tolist()):
        first.setdefault(s, []).append(row)
    pairs = np.array([r for r in first.values() if len(r) == 2], np.int64).reshape(-1, 2)
    return x, "cosine", [0.02, 0.05], pairs


def write_inputs(x: np.ndarray, work: Path) -> None:
    """x.npy for the in-memory contenders, in/part-0.parquet (id = row index) for the job."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    np.save(work / "x.npy", x)
    (work / "in").mkdir(exist_ok=True)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    ids = pa.array(np.arange(len(x)).astype(str))
    pq.write_table(pa.table({"id": ids, "emb": emb}), work / "in" / "part-0.parquet",
                   row_group_size=GROUP_ROWS)


# Each snippet runs in a fresh process (cwd = repo root), sets ``seconds`` and saves
# removed.npy / kept.npy (int64 rows, removed[i] merged into kept[i]) in OUT.
LOAD = """
from transforms.near.spec import NearSpec
x = np.load(WORK + "/x.npy")
if ROWS is not None:
    x = x[:ROWS]
spec = NearSpec(METRIC, threshold=THRESHOLD, **SPEC)
"""
KERNEL = LOAD + """
from transforms.near.find import find_near
start = time.perf_counter()
r = find_near(x, np.arange(len(x)), spec)
seconds = time.perf_counter() - start
np.save(OUT + "/removed.npy", r.removed)
np.save(OUT + "/kept.npy", r.kept)
extra = {"mode": r.partitions.mode, "cells": len(r.partitions)}
"""
PEER = LOAD + """
sys.path.insert(0, SCRIPTS)
import bench_near
start = time.perf_counter()
removed, kept, extra = getattr(bench_near, FUNCTION)(x, spec)
seconds = time.perf_counter() - start
np.save(OUT + "/removed.npy", removed)
np.save(OUT + "/kept.npy", kept)
"""
CLI = """
from pipeline.run import main
start = time.perf_counter()
rc = main(["--config", CONFIG, "--quiet"])
seconds = time.perf_counter() - start
if rc != 0:
    sys.exit(f"the job exited with {rc}")
extra = {}
"""
FOOTER = f"""
print(json.dumps({{"seconds": seconds, "rss_mb": {PEAK_RSS_MB}, **extra}}))
"""


def search_vectors(x: np.ndarray, spec: NearSpec) -> np.ndarray:
    """float32 rows the peers search: unit vectors for cosine."""
    if spec.metric != "cosine":
        return np.ascontiguousarray(x, dtype=np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _grouped(x: np.ndarray, a: np.ndarray, b: np.ndarray, spec: NearSpec
             ) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs -> verified in float64 -> representative grouping (keep first):
    rows in order, each removed in favour of its nearest earlier kept partner (the pair
    list is the peers' method; the job never builds one)."""
    from transforms.near.verify import verify

    later, earlier = np.maximum(a, b), np.minimum(a, b)
    keep = later != earlier
    later, earlier = later[keep], earlier[keep]
    dist, within, _ = verify(x[later], x[earlier], spec)
    later, earlier, dist = later[within], earlier[within], dist[within]
    o = np.lexsort((earlier, dist, later))
    removed: dict[int, int] = {}
    for r, e in zip(later[o].tolist(), earlier[o].tolist(), strict=True):
        if r not in removed and e not in removed:
            removed[r] = e
    rows = np.array(sorted(removed), np.int64)
    return rows, np.array([removed[r] for r in rows.tolist()], np.int64)


def _loose(spec: NearSpec) -> float:
    """A radius a little wider than the tolerance for peers' float32 searches (then
    verified), so their float32 rounding is not what they are measured on."""
    r = math.sqrt(2 * spec.threshold) if spec.metric == "cosine" else spec.threshold
    return r * 1.01 + 1e-4


def ivf_knn(x: np.ndarray, spec: NearSpec) -> tuple[np.ndarray, np.ndarray, dict]:
    import faiss

    v = search_vectors(x, spec)
    n, d = v.shape
    nlist = max(1, int(math.sqrt(n)))
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
    rng = np.random.default_rng(0)
    index.train(v[rng.choice(n, min(n, 64 * nlist), replace=False)])
    index.add(v)
    index.nprobe = min(8, nlist)
    dist, ids = index.search(v, 10)
    rows = np.repeat(np.arange(n), 10)
    ids, dist = ids.reshape(-1), dist.reshape(-1)
    hit = (ids >= 0) & (dist <= _loose(spec) ** 2)
    removed, kept = _grouped(x, rows[hit], ids[hit].astype(np.int64), spec)
    return removed, kept, {"nlist": nlist, "nprobe": index.nprobe, "k": 10}


def semdedup(x: np.ndarray, spec: NearSpec) -> tuple[np.ndarray, np.ndarray, dict]:
    """k-means (spherical for cosine), then all pairs within each cluster only."""
    import faiss

    v = search_vectors(x, spec)
    n, d = v.shape
    k = max(1, n // 1000)
    km = faiss.Kmeans(d, k, niter=20, seed=0, spherical=spec.metric == "cosine",
                      max_points_per_centroid=256)
    km.train(v)
    label = km.index.search(v, 1)[1][:, 0]
    order = np.argsort(label, kind="stable")
    bounds = np.searchsorted(label[order], np.arange(k + 1))
    r2 = _loose(spec) ** 2
    pa, pb = [], []
    for c in range(k):
        m = order[bounds[c]:bounds[c + 1]]
        vm = v[m]
        sq = (vm * vm).sum(axis=1)
        dd = sq[:, None] + sq[None, :] - 2 * vm @ vm.T
        i, j = np.nonzero(np.triu(dd <= r2, 1))
        pa.append(m[i])
        pb.append(m[j])
    removed, kept = _grouped(x, np.concatenate(pa), np.concatenate(pb), spec)
    return removed, kept, {"clusters": k}


def flat(x: np.ndarray, spec: NearSpec) -> tuple[np.ndarray, np.ndarray, dict]:
    import faiss

    v = search_vectors(x, spec)
    index = faiss.IndexFlatL2(v.shape[1])
    index.add(v)
    lims, _, ids = index.range_search(v, _loose(spec) ** 2)
    rows = np.repeat(np.arange(len(v)), np.diff(lims.astype(np.int64)))
    removed, kept = _grouped(x, rows, ids.astype(np.int64), spec)
    return removed, kept, {}


def run_snippet(code: str, **names: object) -> dict:
    prelude = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    source = ("import json, sys, time\nimport numpy as np\n" + prelude
              + textwrap.dedent(code) + FOOTER)
    out, wall = run_python(source)
    return {**out, "process_wall_s": wall}


def job_config(work: Path, spec: NearSpec, tag: str) -> Path:
    import yaml

    cfg = {"input": {"format": "parquet", "path": str(work / "in" / "*.parquet"),
                     "tensor": "emb", "id": "id"},
           "output": {"path": str(work / tag / "clean"), "overwrite": True},
           "report": str(work / tag / "report"),
           "near": {"metric": spec.metric, "threshold": spec.threshold}}
    path = work / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def job_results(report: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    import pyarrow.parquet as pq

    dup = pq.read_table(report / "duplicates.parquet",
                        columns=["record_id", "duplicate_of"]).to_pydict()
    removed = np.array([int(i) for i in dup["record_id"]], dtype=np.int64)
    kept = np.array([int(i) for i in dup["duplicate_of"]], dtype=np.int64)
    s = json.loads((report / "summary.json").read_text())
    near = s["near"]
    return removed, kept, {"summary_wall_time_s": s["wall_time_s"], "mode": near["mode"],
                           "cells": near["cells"], "own_recall": near["recall"]}


def truth(x: np.ndarray, spec: NearSpec, sample: np.ndarray) -> dict[int, list[int]]:
    """{sampled row: rows within tolerance}, by brute force in float64 (a slack on the
    float64 products, then the metric itself)."""
    x64 = x.astype(np.float64)
    if spec.metric == "cosine":
        x64 /= np.linalg.norm(x64, axis=1, keepdims=True)
        r = math.sqrt(2 * spec.threshold)
    else:
        r = spec.threshold
    sq = np.einsum("ij,ij->i", x64, x64)
    out: dict[int, list[int]] = {}
    for a in range(0, len(sample), 256):
        s = sample[a:a + 256]
        d2 = sq[s][:, None] + sq[None, :] - 2 * x64[s] @ x64.T
        i, j = np.nonzero(d2 <= (r * 1.001) ** 2 + 1e-9)
        keep = s[i] != j
        i, j = s[i][keep], j[keep]
        _, ab = exact_distance(x[i], x[j], spec)
        _, ba = exact_distance(x[j], x[i], spec)
        for p, q in zip(i[ab | ba].tolist(), j[ab | ba].tolist(), strict=True):
            out.setdefault(p, []).append(q)
    return out


def score(x: np.ndarray, removed: np.ndarray, kept: np.ndarray, spec: NearSpec,
          partners: dict[int, list[int]], planted: np.ndarray | None = None) -> dict:
    gone = np.zeros(len(x), bool)
    gone[removed] = True
    planted_recall = None
    if planted is not None and len(planted):
        within = exact_distance(x[planted[:, 0]], x[planted[:, 1]], spec)[1]
        p = planted[within]
        planted_recall = float((gone[p[:, 0]] | gone[p[:, 1]]).mean()) if len(p) else None
    resolved = {s: sum(gone[s] or gone[p] for p in ps) for s, ps in partners.items()}
    recalled = sum(resolved[s] == len(ps) for s, ps in partners.items())
    pairs = sum(len(ps) for ps in partners.values())
    lo, hi = wilson(recalled, len(partners))
    _, ok = exact_distance(x[removed], x[kept], spec)
    return {"removed": int(len(removed)),
            "recall": recalled / len(partners) if partners else None,
            "recall_low": lo, "recall_high": hi, "with_partners": len(partners),
            "pair_recall": sum(resolved.values()) / pairs if pairs else None,
            "planted_recall": planted_recall,
            "precision": float(ok.mean()) if len(ok) else 1.0}


def contenders(work: Path, spec: NearSpec, rows: int, flat_rows: int = FLAT_SUBSET
               ) -> dict[str, tuple[str, dict]]:
    base = dict(WORK=str(work), METRIC=spec.metric, THRESHOLD=spec.threshold,
                SCRIPTS=str(ROOT / "scripts"), ROWS=None)
    sub = min(rows, flat_rows)
    flat_name = FLAT if sub == rows else (
        f"{FLAT} on {sub // 1000}k rows, time x {(rows / sub) ** 2:.0f}")
    return {
        JOB: (CLI, dict(base, CONFIG=str(job_config(work, spec, "job")))),
        "kernel, auto with its recall sample (as the job)": (KERNEL, dict(base, SPEC={})),
        "kernel, exact cells": (KERNEL, dict(base, SPEC={"mode": "exact", "recall_sample": 0})),
        "kernel, bounded (3 probes)": (KERNEL, dict(base, SPEC={"mode": "bounded",
                                                                 "recall_sample": 0})),
        "FAISS IVF kNN (nlist sqrt n, nprobe 8, k 10)": (PEER, dict(base, SPEC={},
                                                                     FUNCTION="ivf_knn")),
        "SemDeDup-style (k-means, pairs within clusters)": (PEER, dict(
            base, SPEC={}, FUNCTION="semdedup")),
        flat_name: (PEER, dict(base, SPEC={}, FUNCTION="flat", ROWS=sub if sub < rows else None)),
    }


def bench(name: str, x: np.ndarray, spec: NearSpec, work: Path, only: list[str],
          growth: int | None, planted: np.ndarray | None, flat_rows: int = FLAT_SUBSET) -> dict:
    rng = np.random.default_rng(7)
    sample = rng.choice(len(x), min(SAMPLE, len(x)), replace=False)
    if planted is not None and len(planted):
        ends = np.unique(planted.reshape(-1))
        sample = np.concatenate([sample, rng.choice(ends, min(PLANTED_SAMPLE, len(ends)),
                                                    replace=False)])
    sample = np.unique(sample)
    t = time.perf_counter()
    partners = truth(x, spec, sample)
    print(f"  brute force of {len(sample):,} sampled records: {len(partners):,} have near "
          f"duplicates ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
    results: dict[str, dict] = {}
    for cname, (code, names) in contenders(work, spec, len(x), flat_rows).items():
        if only and not any(s.lower() in cname.lower() for s in only):
            continue
        out = work / f"out-{len(results)}"
        out.mkdir(exist_ok=True)
        print(f"  running {cname} ...", file=sys.stderr, flush=True)
        r = run_snippet(code, OUT=str(out), **names)
        if code is CLI:
            removed, kept, extra = job_results(work / "job" / "report")
            r.update(extra)
        else:
            removed, kept = np.load(out / "removed.npy"), np.load(out / "kept.npy")
        if names.get("ROWS"):  # the subset run: scored on its own rows, time extrapolated
            r["measured_seconds"] = r["seconds"]
            r["seconds"] *= (len(x) / names["ROWS"]) ** 2
            sub = {s: [p for p in ps if p < names["ROWS"]] for s, ps in partners.items()
                   if s < names["ROWS"]}
            r.update(score(x[:names["ROWS"]], removed, kept, spec,
                           {s: ps for s, ps in sub.items() if ps}))
        else:
            r.update(score(x, removed, kept, spec, partners, planted))
        results[cname] = r
        print(f"    {r['seconds']:.1f} s, {r['rss_mb']:.0f} MB, recall {r['recall']}",
              file=sys.stderr, flush=True)
    if growth and JOB in results:
        small = work / "small"
        small.mkdir(exist_ok=True)
        write_inputs(x[:growth], small)
        r = run_snippet(CLI, CONFIG=str(job_config(small, spec, "job")))
        results[JOB]["growth"] = {"rows": growth, "seconds": r["seconds"],
                                  "ratio": results[JOB]["seconds"] / r["seconds"]}
    flat_s = next((r["seconds"] for k, r in results.items() if k.startswith(FLAT)), None)
    for r in results.values():
        r["vs_flat"] = flat_s / r["seconds"] if flat_s else None
    return {"data": name, "rows": len(x), "dim": x.shape[1], "metric": spec.metric,
            "threshold": spec.threshold, "sample": len(sample),
            "sampled_with_partners": len(partners),
            "planted_pairs": None if planted is None else int(exact_distance(
                x[planted[:, 0]], x[planted[:, 1]], spec)[1].sum()),
            "results": results}


def table(b: dict) -> str:
    res = b["results"]
    w = max(len(k) for k in res) + 2
    planted = "" if b["planted_pairs"] is None else (
        f"; planted: {b['planted_pairs']:,} planted pairs within tolerance")
    lines = [f"\n{b['data']}: {b['rows']:,} x {b['dim']}, {b['metric']} threshold "
             f"{b['threshold']} (recall: {b['sampled_with_partners']} of {b['sample']:,} "
             f"sampled records have near duplicates{planted})",
             f"{'contender':<{w}}{'seconds':>9}{'vs flat':>9}{'peak MB':>9}{'removed':>9}"
             f"{'recall [95% CI]':>22}{'pair rec.':>10}{'planted':>9}{'precision':>10}"]
    for k, r in res.items():
        vs = "-" if r["vs_flat"] is None else f"{r['vs_flat']:.1f}x"
        rec = "-" if r["recall"] is None else (
            f"{r['recall']:.4f} [{r['recall_low']:.3f},{r['recall_high']:.3f}]")
        pr = "-" if r["pair_recall"] is None else f"{r['pair_recall']:.4f}"
        pl = "-" if r.get("planted_recall") is None else f"{r['planted_recall']:.4f}"
        lines.append(f"{k:<{w}}{r['seconds']:>9.1f}{vs:>9}{r['rss_mb']:>9.0f}"
                     f"{r['removed']:>9,}{rec:>22}{pr:>10}{pl:>9}{r['precision']:>10.4f}")
    if JOB in res:
        j = res[JOB]
        own = j.get("own_recall") or {}
        lines.append(f"the job: {j['mode']} mode, {j['cells']} cells; its own recall estimate "
                     f"{own.get('recall')} [{own.get('low', 0):.3f}, {own.get('high', 0):.3f}];"
                     f" summary wall time {j['summary_wall_time_s']:.1f} s")
        if "growth" in j:
            g = j["growth"]
            lines.append(f"the job at {g['rows']:,} rows: {g['seconds']:.1f} s; "
                         f"{b['rows']:,} rows took {g['ratio']:.2f}x as long")
    return "\n".join(lines)


def _variants(args: argparse.Namespace) -> list[dict]:
    """shapes: each --grouping with each --mode (near settings; none given: the defaults)."""
    return [{k: v for k, v in (("grouping", g), ("mode", m)) if v}
            for g in args.grouping or [None] for m in args.mode or [None]]


def shapes_main(names: list[str], args: argparse.Namespace) -> None:
    """Issue 21's cases, one fresh work folder each; the table and JSON after each."""
    import benchshapes

    out: list[dict] = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
            out.extend(benchshapes.run_case(name, args.scale, Path(tmp),
                                            Path(args.code).resolve(), args.timeout,
                                            _variants(args)))
        Path(args.json).write_text(json.dumps(out, indent=2, default=float))
    print(benchshapes.table(out), flush=True)


def main() -> None:
    import benchshapes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", choices=[
        "embeddings", "sentences", "blobs", *benchshapes.CASES, *benchshapes.GROUPS])
    ap.add_argument("--rows", type=int, default=None, help="embeddings: 1,000,000; blobs: "
                    "200,000")
    ap.add_argument("--threshold", type=float, action="append", help="default: per data set")
    ap.add_argument("--only", action="append", default=[], metavar="NAME_SUBSTRING")
    ap.add_argument("--growth", type=int, default=None, metavar="ROWS",
                    help="also time the job on the first ROWS rows (time growth)")
    ap.add_argument("--json", default=None, help="default bench-near.json (bench-shapes.json "
                    "for issue 21's shapes)")
    ap.add_argument("--flat-rows", type=int, default=FLAT_SUBSET,
                    help="the flat search runs on this many rows, its time x (n / them)^2")
    ap.add_argument("--scale", type=float, default=1.0, help="shapes: rows x this")
    ap.add_argument("--code", default=str(ROOT), help="shapes: the checkout the job runs from")
    ap.add_argument("--timeout", type=float, default=900, help="shapes: seconds per job")
    ap.add_argument("--grouping", action="append", choices=["representative", "components"],
                    help="shapes: run each case with each grouping given (default: the job's)")
    ap.add_argument("--mode", action="append", choices=["auto", "exact", "bounded"],
                    help="shapes: and each mode given (default: the job's)")
    args = ap.parse_args()
    names = [c for n in args.data or ["embeddings"] for c in benchshapes.GROUPS.get(n, [n])]
    shaped = [n for n in names if n in benchshapes.CASES]
    if shaped:
        if len(shaped) != len(names):
            sys.exit("--data: run issue 21's shapes and the contender data sets separately")
        args.json = args.json or "bench-shapes.json"
        return shapes_main(shaped, args)
    args.json = args.json or "bench-near.json"
    out = []
    for name in names:
        rows = args.rows or {"embeddings": 1_000_000, "blobs": 200_000}.get(name, 0)
        x, metric, thresholds, planted = dataset(name, rows)
        with tempfile.TemporaryDirectory(prefix="bench-near-") as tmp:
            work = Path(tmp)
            write_inputs(x, work)
            for t in args.threshold or thresholds:
                print(f"{name}: {len(x):,} rows, {metric} {t}", file=sys.stderr, flush=True)
                b = bench(name, x, NearSpec(metric, threshold=t), work, args.only, args.growth,
                          planted, args.flat_rows)
                print(table(b), flush=True)
                out.append(b)
                Path(args.json).write_text(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
