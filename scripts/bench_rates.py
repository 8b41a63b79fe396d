"""Per-core rates of the job's steps, for the capacity plan (``pipeline/capacity/plan.py``).

Why from the job itself: the plan must predict the job as it runs, with its Beam
overhead, its copies and its spill, not an idealised kernel. Each calibration run is the
real job (exact + near, the local runner with one worker, so every step's time is one
core's) on embedding-like vectors written to Parquet; Beam's own per-transform
execution times (``ptransform_execution_time``) are summed per step and divided by the
step's units (bytes read, tensor bytes hashed, records, row x cell x dimension
products, compared pairs x dimension, bytes written). What the steps do not account
for (Beam's shuffle, coders, bundle set-up) is fitted as a cost per record, and the
whole-process start-up (imports, checks, graph, publish) from a tiny run.

    python scripts/bench_rates.py                      # measure: table + rates JSON
    python scripts/bench_rates.py --check 100000 300000 1000000   # predicted vs actual
    python scripts/bench_rates.py --project            # 100M / 1B x 768-d on Dataflow
    python scripts/bench_rates.py --jaccard            # the jaccard stage's rates

``--json`` (default pipeline/capacity/rates.json, the defaults a dry run loads; a dry run reads
another file from TENSORDEDUP_RATES). Run measurements alone on the machine (wrap in
``flock /work/BENCH.lock``): they are timings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import run_watched  # noqa: E402

from tests.embeddings import embeddings, with_near_copies  # noqa: E402

THRESHOLD = 0.01  # cosine: the planted copies are at 0.001-0.02


def make_input(folder: Path, n: int, dim: int, files: int = 4) -> str:
    """``n`` embedding-like unit vectors (10% exact copies, 5% near copies, 2% decoys)
    as ``files`` Parquet files with an ``id`` column; returns the glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = embeddings(int(n / 1.17) + 1, dim=dim, clusters=max(50, n // 500))
    x = with_near_copies(base)
    rng = np.random.default_rng(2)
    x = np.concatenate([x, x[rng.integers(0, len(x), n - len(x))]])[:n] if len(x) < n \
        else x[:n]
    copies = rng.choice(n, n // 10, replace=False)
    x[copies] = x[rng.integers(0, n, len(copies))]
    folder.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(n), files)):
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x[part].reshape(-1)), dim)
        pq.write_table(pa.table({"id": [f"r{j}" for j in part], "emb": emb}),
                       folder / f"part-{i:03d}.parquet", row_group_size=65536)
    return str(folder / "*.parquet")


def job_config(data: str, out: Path, near: bool = True, workers: int = 1) -> dict:
    """The calibration and check job: exact + near (cosine), keep first, local runner."""
    cfg = {"input": {"format": "parquet", "path": data, "tensor": "emb", "id": "id"},
           "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report"), "runner": {"name": "local", "workers": workers}}
    if near:
        cfg["near"] = {"metric": "cosine", "threshold": THRESHOLD}
    return cfg


# ------------------------------------------------------------------ one calibration run
STEPS = (("Read/", "read"), ("Dedup/Fingerprint/", "fingerprint"),
         ("Dedup/DedupExact/", "exact"), ("Dedup/Decide/", "exact"),
         ("Dedup/DedupNear/SampleAndPlan/CombinePerKey/ExtractOutputs", "plan"),
         ("Dedup/DedupNear/SampleAndPlan", "sample"), ("Dedup/DedupNear/AssignCells", "assign"),
         ("Dedup/DedupNear/DecideCells", "search"), ("Dedup/DedupNear/BatchSure", "search"),
         ("Dedup/DedupNear/SureByFile", "search"), ("Dedup/DedupNear/GatherSure", "search"),
         ("Dedup/DedupNear/KnownRemovals", "search"),
         ("Dedup/DedupNear/Recall", "recall"),
         ("Dedup/DedupNear/GatherTruth", "recall"),
         ("Dedup/DedupNear/", "merge"), ("Write/", "write"), ("ReportParts/", "parts"),
         ("RowsToShow", "parts"), ("Report", "report"), ("CollectResults", "report"),
         ("Publish", "report"))


# A jaccard job's transforms (pipeline/steps/near_sets.py): its group-bys are the
# framework's (shuffles), every other transform of the stage a step of the plan.
JACCARD_STEPS = (("Read/", "read"), ("Dedup/Fingerprint/", "fingerprint"),
                 ("Dedup/DedupExact/", "exact"), ("Dedup/Decide/", "exact"),
                 ("Dedup/SpillExactRemovals", "exact"), ("Dedup/DedupNear/GroupBy", "framework"),
                 ("Dedup/DedupNear/Plan", "plan"), ("Dedup/DedupNear/RecallBruteForce", "recall"),
                 ("Dedup/DedupNear/GatherTruth", "recall"), ("Dedup/DedupNear/Keys", "keys"),
                 ("Dedup/DedupNear/Groups", "groups"),
                 ("Dedup/DedupNear/GatherGroups", "components"),
                 ("Dedup/DedupNear/Components", "components"),
                 ("Dedup/DedupNear/Decide", "decide"),
                 ("Dedup/DedupNear/GatherDecisions", "decide"), ("Dedup/DedupNear/", "merge"),
                 ("Dedup/SpillNearRemovals", "merge"), ("Dedup/DropSpill", "merge"),
                 ("Write/", "write"), ("ReportParts/", "parts"), ("RowsToShow", "parts"),
                 ("Report", "report"), ("CollectResults", "report"), ("Publish", "report"))


def step_of(transform: str, table: tuple = STEPS) -> str:
    """The plan's step a leaf transform's time counts for; the rest is the framework's."""
    return next((step for prefix, step in table if transform.startswith(prefix)), "framework")


def run_inside(config: dict, result: Path) -> None:
    """The job in this process, as ``api.execute`` runs it, keeping Beam's result for its
    per-transform times; writes them, the pipeline's wall time and summary.json there."""
    from collections import defaultdict

    from pipeline.api import publication, to_config
    from pipeline.graph import build
    from pipeline.preflight import prepare
    from pipeline.publish import own_stages
    from pipeline.runners import make_pipeline
    from transforms.io.fs import delete_tree

    job = prepare(to_config(config))
    pub = publication(job)
    p = make_pipeline(job.cfg.runner)
    build(p, job, pub)
    start = time.perf_counter()
    r = p.run()
    r.wait_until_finish()
    wall = time.perf_counter() - start
    for stage in own_stages(pub):
        delete_tree(stage)
    table = JACCARD_STEPS if job.near is not None and job.near.is_sets else STEPS
    transforms: dict[str, float] = defaultdict(float)
    for c in r.monitoring_metrics().query()["counters"]:
        if c.key.metric.name.endswith("ptransform_execution_time:total_msecs:v1"):
            transforms[c.key.step] += c.committed / 1000
    recall_split(transforms, r)
    steps = steps_of(transforms, wall, table)
    summary = json.loads((Path(job.report) / "summary.json").read_text())
    out_bytes = sum(f.stat().st_size for f in Path(job.output).rglob("*") if f.is_file())
    result.write_text(json.dumps({"steps": steps, "pipeline_s": wall, "summary": summary,
                                  "files": job.files, "out_bytes": out_bytes,
                                  "transforms": transforms}))


def recall_split(transforms: dict[str, float], result) -> None:
    """The near recall's brute force runs inside AssignCells (one read of each chunk):
    its seconds, which the step counts apart, move from that transform to the recall."""
    from apache_beam.metrics.metric import MetricsFilter

    from pipeline.steps.near import RECALL_MSECS

    found = result.metrics().query(MetricsFilter().with_name(RECALL_MSECS.metric_name.name))
    seconds = sum(c.committed for c in found["counters"]) / 1000
    run = next((k for k in transforms if k.startswith("Dedup/DedupNear/AssignCells/Run")), None)
    if run is not None and seconds:
        transforms[run] -= seconds
        transforms["Dedup/DedupNear/Recall (inside AssignCells)"] = seconds


def steps_of(transforms: dict[str, float], wall: float, table: tuple) -> dict[str, float]:
    """Seconds per step of the plan from Beam's seconds per leaf transform; what no
    transform accounts for (shuffles, coders, bundles) is the framework's."""
    from collections import defaultdict

    steps: dict[str, float] = defaultdict(float)
    for name, seconds in transforms.items():
        steps[step_of(name, table)] += seconds
    steps["framework"] += wall - sum(steps.values())
    return dict(steps)


def one_core_env() -> dict:
    """One BLAS/OpenMP thread: the rates are one core's."""
    return {**os.environ, **{k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                              "MKL_NUM_THREADS")}}


def calibrate(folder: Path, n: int, dim: int, near: bool = True) -> dict:
    """One run in its own process: step times, whole-process wall and peak memory."""
    data = make_input(folder / f"in-{n}-{dim}", n, dim)
    cfg, result = folder / f"cfg-{n}-{dim}.json", folder / f"result-{n}-{dim}.json"
    cfg.write_text(json.dumps(job_config(data, folder / f"out-{n}-{dim}", near)))
    got = run_watched([sys.executable, __file__, "--inside", str(cfg), str(result)],
                      cwd=ROOT, log=folder / f"log-{n}-{dim}.txt", env=one_core_env())
    if got["rc"] != 0:
        raise RuntimeError(f"calibration run failed: {got['stderr_tail']}")
    run = {**json.loads(result.read_text()), "n": n, "dim": dim, "wall_s": got["wall_s"],
           "peak_rss": got["peak_rss_bytes"]}
    result.write_text(json.dumps(run))  # --refit reads it again
    return run


def kmeans_rate(cells: int = 400, dim: int = 128, repeats: int = 3) -> float:
    """The planner's k-means (``near.plan.plan``, as the job's plan step runs it) on one
    thread: multiply-adds per second, the best of ``repeats`` (the step is short and the
    machine shared, so one slow repeat says little)."""
    from pipeline.capacity.plan import training_rows
    from pipeline.capacity.workload import NearCost, Workload
    from transforms import cores
    from transforms.near.plan import KMEANS_ITERATIONS, plan

    x = embeddings(80 * cells, dim=dim, clusters=cells)
    w = Workload(1000 * cells, 0, 4 * dim, dim, near=NearCost(cells, 1, 0, 0, "", ""))
    best = float("inf")
    with cores.threads(1):
        for _ in range(repeats):
            start = time.perf_counter()
            plan(x, 1000 * cells, 0.14, "auto", 3, cells)
            best = min(best, time.perf_counter() - start)
    return training_rows(w) * cells * dim * KMEANS_ITERATIONS / best


def observed(run: dict):
    """The model's inputs for a finished run, from its files and summary.json (the near
    figures are the job's own prediction, as a dry run's are)."""
    from pipeline.capacity.workload import NearCost, Workload

    s = run["summary"]
    near = None
    if s.get("near"):
        p, mode = s["near"]["prediction"], s["near"]["mode"]
        if p is None:
            near = NearCost(1, 1.0, float(s["read"]) ** 2, s["read"], mode, "one cell")
        else:
            key = "exact" if mode == "exact" else "bounded"
            near = NearCost(p["cells"], p[f"joins_{key}"], p[f"work_{key}"],
                            p[f"largest_{key}"], mode, "the job's prediction")
    return Workload(s["read"], sum(os.path.getsize(f) for f in run["files"]),
                    run["dim"] * 4, run["dim"], near=near,
                    recall_sample=s["config"]["near"]["recall_sample"] if near else 0)


def fit(runs: list[dict], kmeans: float) -> dict[str, dict[str, float]]:
    """Each step's seconds per unit: non-negative least squares over the runs; the plan's
    k-means from its own timing (``kmeans``: multiply-adds per second per core), since
    in the job it is a second or two of every run and the machine is shared."""
    from pipeline.capacity.plan import units

    table: dict[str, list[tuple[dict, float]]] = {}
    for run in runs:
        for step, amounts in units(observed(run), run["out_bytes"]).items():
            table.setdefault(step, []).append((amounts, run["steps"].get(step, 0.0)))
    del table["plan"]
    return {"plan": {"madd": 1 / kmeans}, **fit_steps(table)}


def fit_steps(table: dict[str, list[tuple[dict, float]]]) -> dict[str, dict[str, float]]:
    """Each step's seconds per unit from (units, seconds) of every run: non-negative
    least squares, the columns scaled first (units of very different sizes)."""
    from scipy.optimize import nnls

    rates = {}
    for step, rows in table.items():
        keys = sorted({k for amounts, _ in rows for k in amounts})
        a = np.array([[amounts.get(k, 0.0) for k in keys] for amounts, _ in rows], float)
        scale = np.maximum(a.max(axis=0), 1e-300)
        x, _ = nnls(a / scale, np.array([s for _, s in rows]))
        rates[step] = {k: float(v) for k, v in zip(keys, x / scale, strict=True)}
    return rates


# ------------------------------------------------------------------ measure, check, project
# Sizes and widths other than the check's (128 values): fixed costs are told apart from
# per-record ones by runs of 50k to 600k records, per-byte ones by 32 to 384 values.
CALIBRATION = ((50_000, 64), (200_000, 32), (150_000, 256), (600_000, 64), (400_000, 96),
               (60_000, 384))
TINY = (3_000, 16)  # the process's start-up and baseline memory
CHECK_DIM = 128


def held(runs: list[dict], raw: dict) -> tuple[float, float]:
    """What the local runner holds between steps: each run's peak less the process's
    baseline and its largest step's working set, fitted as bytes + bytes per tensor
    byte (non-negative least squares)."""
    from scipy.optimize import nnls

    from pipeline.capacity.plan import Cluster, Rates, peak_memory

    rates = Rates(raw["steps"], raw["startup_s"], raw["baseline_rss"], 0.0, 0.0, "")
    one = Cluster("local", 1, 1, None, None, False, 1, 0.0)
    ws = [observed(r) for r in runs]
    tensor = np.array([w.records * w.record_bytes for w in ws], float)
    extra = np.array([r["peak_rss"] - peak_memory(w, one, rates) for r, w in zip(runs, ws,
                                                                             strict=True)])
    (fixed, per_byte), _ = nnls(np.stack([np.full(len(ws), 1e9), tensor], axis=1), extra)
    return float(fixed * 1e9), float(per_byte)


def show(rates: dict) -> None:
    """The rates as a Markdown table (docs/scale.md quotes it)."""
    print(f"start-up {rates['startup_s']:.2f} s, baseline memory "
          f"{rates['baseline_rss'] / 2**20:.0f} MB, the local runner holds "
          f"{rates['held_fixed'] / 2**20:.0f} MB + {rates['held_per_byte']:.2f} x the "
          "tensor bytes")
    print("| step | rate per core |\n| --- | --- |")
    per = {"record": ("records/s", 1), "byte": ("MB/s", 1e6), "score": ("M scores/s", 1e6),
           "madd": ("G multiply-adds/s", 1e9), "value": ("dimensions/s", 1),
           "shingle": ("M shingles/s", 1e6), "ordered": ("M shingles ordered/s", 1e6),
           "minhash": ("M MinHash values/s", 1e6), "line": ("M key lines/s", 1e6),
           "member": ("M grouped lines/s", 1e6), "pair": ("k pairs verified/s", 1e3),
           "probe": ("k sampled records x chunks/s", 1e3), "removed": ("k removals/s", 1e3),
           "pair_shingle": ("M shingles of verified pairs/s", 1e6),
           "sampled_shingle": ("M shingles of the plan's sample/s (mode auto)", 1e6),
           "probe_shingle": ("M shingles of sampled records x chunks/s", 1e6),
           "join": ("M cells joined/s", 1e6)}
    for step, r in rates["steps"].items():
        parts = [f"{v:.3g} s per run" if k == "run" else
                 f"{1 / (v * per[k][1]):.3g} {per[k][0]}" for k, v in r.items() if v > 0]
        print(f"| {step} | {', '.join(parts) or 'negligible'} |")


def measure(folder: Path, out: Path, refit: bool = False) -> None:
    """Calibration runs (``refit``: those saved in ``folder`` by an earlier measurement,
    and the k-means rate of ``out``), the fit, the rates JSON and a table of them."""
    import platform

    if refit:  # the saved runs, their transforms' seconds mapped to steps as STEPS says now
        tiny, *runs = [json.loads((folder / f"result-{n}-{d}.json").read_text())
                       for n, d in (TINY, *CALIBRATION)]
        for r in (tiny, *runs):
            if "transforms" in r:
                r["steps"] = steps_of(r["transforms"], r["pipeline_s"], STEPS)
    else:
        tiny = calibrate(folder, *TINY)
        runs = [calibrate(folder, n, d) for n, d in CALIBRATION]
    rates = {"measured": f"{time.strftime('%Y-%m-%d')} on {platform.node()} "
                         f"({os.cpu_count()} cores), scripts/bench_rates.py",
             "startup_s": float(np.median([r["wall_s"] - r["pipeline_s"]
                                           for r in [tiny, *runs]])),
             "baseline_rss": float(tiny["peak_rss"]),
             "steps": fit(runs, 1 / json.loads(out.read_text())["steps"]["plan"]["madd"]
                          if refit else kmeans_rate())}
    rates["held_fixed"], rates["held_per_byte"] = held(runs, rates)
    if out.exists() and "jaccard" in (before := json.loads(out.read_text())):
        rates["jaccard"] = before["jaccard"]  # measured apart: --jaccard
    out.write_text(json.dumps(rates, indent=1) + "\n")
    show(rates)
    for run in runs:
        print(f"calibration {run['n']:,} x {run['dim']}: pipeline {run['pipeline_s']:.1f} s, "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(run["steps"].items())))
    print(f"wrote {out}")


def check(folder: Path, sizes: list[int], workers: int) -> list[dict]:
    """The CLI on each size (exact + near, ``workers`` local workers, one BLAS thread per
    worker), whole processes, against the dry run's plan of the same config."""
    from pipeline.api import to_config
    from pipeline.capacity.plan import Rates, cluster, predict
    from pipeline.capacity.workload import workload
    from pipeline.preflight import prepare

    rates, rows = Rates.load(), []
    for n in sizes:
        data = make_input(folder / f"check-{n}", n, CHECK_DIM)
        cfg = job_config(data, folder / f"check-out-{n}", workers=workers)
        cfg_path = folder / f"check-{n}.json"
        cfg_path.write_text(json.dumps(cfg))
        job = prepare(to_config(cfg))
        w = workload(job)
        plan = predict(w, cluster(job.cfg.runner, rates), rates, remote_spill=False)
        got = run_watched([sys.executable, "-m", "pipeline.run", "--config", str(cfg_path),
                           "--quiet"], cwd=ROOT, log=folder / f"check-{n}.log",
                          env=one_core_env(), timeout_s=1800)
        if got["rc"] != 0:
            raise RuntimeError(f"check run failed: {got['stderr_tail']}")
        rows.append({"records": n, "dim": CHECK_DIM, "workers": workers,
                     "predicted_s": plan.wall_s, "actual_s": got["wall_s"],
                     "error": plan.wall_s / got["wall_s"] - 1,
                     "predicted_peak_mb": plan.peak_memory / 2**20,
                     "actual_peak_mb": got["peak_rss_bytes"] / 2**20,
                     "cells": w.near.cells, "joins": w.near.joins, "mode": w.near.mode})
        r = rows[-1]
        print(f"| {n:,} x {CHECK_DIM} | {workers} | {r['mode']}, {r['cells']} cells, "
              f"{r['joins']:.2f} joins | {r['predicted_s']:.1f} s | {r['actual_s']:.1f} s | "
              f"{r['error']:+.0%} | {r['predicted_peak_mb']:.0f} MB | "
              f"{r['actual_peak_mb']:.0f} MB |", flush=True)
    return rows


PROJECTION = {  # docs/scale.md: Dataflow workers for 768-d embeddings
    "CPU": {"machine_type": "n1-standard-16", "max_workers": 100},
    "GPU": {"machine_type": "n1-standard-8", "max_workers": 100,
            "accelerator": {"type": "nvidia-tesla-t4", "count": 1}},
}


def project(records: list[int], dim: int = 768) -> None:
    """The plan for ``records`` x ``dim`` float32 embeddings (ids of 12 bytes, Parquet of
    the tensor bytes plus 3%), exact + near (cosine 0.01, bounded closed form) on
    Dataflow CPU and GPU workers."""
    from pipeline.capacity.plan import Rates, cluster, lines
    from pipeline.capacity.workload import Workload, closed_form
    from pipeline.config.runner import RunnerConfig
    from transforms.near.spec import NearSpec

    rates = Rates.load()
    spec = NearSpec("cosine", threshold=THRESHOLD)  # the near section's defaults
    for n in records:
        w = Workload(n, int(n * dim * 4 * 1.03), dim * 4, dim,
                     near=closed_form(spec, n, dim), near_spec=spec,
                     recall_sample=spec.recall_sample)
        for name, keys in PROJECTION.items():
            cfg = RunnerConfig(name="dataflow", project="my-project", region="us-central1",
                               temp_location="gs://my-bucket/tmp",
                               worker_image="us-docker.pkg.dev/my-project/w:1", **keys)
            print(f"\n{n:,} x {dim} on Dataflow {name} workers ({keys['machine_type']}):")
            print("\n".join(lines(w, cluster(cfg, rates), rates, remote_spill=True)))


# ------------------------------------------------------------------ jaccard (--jaccard)
# Calibration corpora (scripts/text_corpus.py: real vocabulary, 10% planted near copies,
# a crowd of docs / 20, boilerplate, CJK, two 1 MB pages), sizes, page sizes (long pages
# too: a verified pair costs in proportion to its sets' size), modes and
# signatures other than the check's (scripts/bench_plan_jaccard.py: 20k, 100k, 300k of
# ~1 KB, the default settings): (documents, median page bytes, near settings).
JACCARD_CALIBRATION = ((8_000, 1000, {"mode": "bounded"}),
                       (15_000, 3000, {"mode": "exact"}),
                       (30_000, 2000, {"mode": "exact"}),
                       (50_000, 600, {"mode": "bounded", "shingles": {"permutations": 64}}),
                       (40_000, 1500, {"mode": "bounded",
                                       "shingles": {"permutations": 112, "bands": 14}}),
                       (70_000, 1000, {"mode": "exact"}),
                       (120_000, 1000, {"mode": "bounded"}),
                       (8_000, 7000, {"mode": "bounded"}),
                       (6_000, 9000, {"mode": "exact"}),
                       (14_000, None, {"mode": "auto"}))
# doc_bytes None: crowds of real long texts (``crowd_input``), where most of the work is
# verified pairs of large sets (the corpora above verify at most 300k pairs, too few to
# price one): every other licence / README / METADATA text installed packages ship; mode
# auto, whose choice (the exact join's bound on the plan's sample) costs most on them.
CROWD_EDITS = 3  # words of a text replaced in each of its copies
CROWDS = "crowds-"  # the name of such a corpus's folder begins so
JACCARD_TINY = (600, 1000, {"mode": "bounded"})
JACCARD_THRESHOLD = 0.8


def crowd_input(folder: Path, docs: int, seed: int) -> str:
    """About ``docs`` records: half of the texts installed packages ship
    (``text_corpus.package_texts``, those at even places in name order), each copied
    ``docs`` / (their number) times with CROWD_EDITS words replaced by words of the
    texts, shuffled; one Parquet file of 2,000-row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import text_corpus

    out = folder / f"{CROWDS}{docs}-{seed}"
    if not (out / "corpus.parquet").exists():
        rng = np.random.default_rng(seed)
        texts = text_corpus.package_texts()[::2]
        vocab = sorted({w for t in texts for w in t.split()})
        copies = []
        for t in texts:
            words = t.split()
            for _ in range(max(1, docs // len(texts))):
                w = list(words)
                for k in rng.choice(len(w), min(CROWD_EDITS, len(w)), replace=False):
                    w[k] = vocab[rng.integers(len(vocab))]
                copies.append(" ".join(w))
        order = rng.permutation(len(copies))
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": [f"c{i}" for i in range(len(copies))],
                                 "text": [copies[i] for i in order]}),
                       out / "corpus.parquet", row_group_size=2_000)
    return str(out / "*.parquet")


def text_input(folder: Path, docs: int, doc_bytes: int | None, seed: int) -> str:
    """A corpus of ``docs`` pages (scripts/text_corpus.py, written once into ``folder``;
    ``doc_bytes`` None: ``crowd_input``); returns its Parquet glob."""
    import text_corpus

    if doc_bytes is None:
        return crowd_input(folder, docs, seed)
    out = folder / f"text-{docs}-{doc_bytes}-{seed}"
    if not (out / "corpus.json").exists():
        a = text_corpus.arguments(argparse.ArgumentParser()).parse_args(
            ["--seed", str(seed), "--doc-bytes", str(doc_bytes), "--no-tokens"])
        a.threshold = [JACCARD_THRESHOLD]
        text_corpus.make(docs, out, a, log=lambda line: None)
    return str(out / "text" / "*.parquet")


def jaccard_config(data: str, out: Path, near: dict, workers: int | None = 1) -> dict:
    """A jaccard job over a corpus (``workers`` None: the runner's defaults, as a user's
    config leaves them: on this machine worker processes, one per core)."""
    cfg = {"input": {"format": "parquet", "path": data, "tensor": "text", "id": "id",
                     "decode": "text"},
           "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report"),
           "near": {"metric": "jaccard", "threshold": JACCARD_THRESHOLD, **near}}
    if workers is not None:
        cfg["runner"] = {"name": "local", "workers": workers}
    return cfg


def jaccard_observed(cfg: dict, summary: dict):
    """The model's inputs for a finished jaccard run: the dry run's workload of its config
    with the counts the job reported (records in groups, pairs verified, removals,
    groups); the grouped lines in proportion to the records in groups."""
    from dataclasses import replace

    from pipeline.api import to_config
    from pipeline.capacity.workload import workload
    from pipeline.preflight import prepare

    w = workload(prepare(to_config(cfg)))
    near, n = summary["near"], w.records
    est = w.sets
    grouped = near["records_searched"] / n
    return replace(w, sets=replace(
        est, mode=near["mode"], bands=near["bands"], rows=near["rows"], grouped=grouped,
        members=est.members * grouped / max(est.grouped, 1e-12),
        compared=near["compared"] / n, removed=near["removed"] / n,
        groups=near["candidate_groups"] / n, largest_group=near["largest_group"]))


def jaccard_tag(docs: int, doc_bytes: int | None, near: dict) -> str:
    """A calibration run's name in the work folder."""
    return (f"jaccard-{docs}-{doc_bytes or 'crowds'}-{near['mode']}-"
            f"{near.get('shingles', {}).get('permutations', 'd')}")


def jaccard_calibrate(folder: Path, docs: int, doc_bytes: int | None, near: dict) -> dict:
    """One corpus, run twice, whole processes: in one process on one worker (each
    step's time, as Beam counts it) and with the runner's defaults (worker processes:
    their wall time and peak memory)."""
    data = text_input(folder, docs, doc_bytes, seed=1)
    tag = jaccard_tag(docs, doc_bytes, near)
    cfg = jaccard_config(data, folder / f"out-{tag}", near)
    cfg_path, result = folder / f"cfg-{tag}.json", folder / f"result-{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    got = run_watched([sys.executable, __file__, "--inside", str(cfg_path), str(result)],
                      cwd=ROOT, log=folder / f"log-{tag}.txt", env=one_core_env())
    if got["rc"] != 0:
        raise RuntimeError(f"calibration run failed: {got['stderr_tail']}")
    run = {**json.loads(result.read_text()), "config": cfg, "wall_s": got["wall_s"],
           "peak_rss": got["peak_rss_bytes"]}
    proc = jaccard_config(data, folder / f"out-{tag}-proc", near, workers=None)
    (folder / f"cfg-{tag}-proc.json").write_text(json.dumps(proc))
    got = run_watched([sys.executable, "-m", "pipeline.run", "--config",
                       str(folder / f"cfg-{tag}-proc.json"), "--quiet"], cwd=ROOT,
                      log=folder / f"log-{tag}-proc.txt")
    if got["rc"] != 0:
        raise RuntimeError(f"calibration run failed: {got['stderr_tail']}")
    run.update(proc_config=proc, proc_wall_s=got["wall_s"], proc_peak_rss=got["peak_rss_bytes"])
    result.write_text(json.dumps(run))  # --refit reads it again
    return run


def jaccard_fit(tiny: dict, runs: list[dict]) -> dict:
    """The jaccard section of the rates: each step's rates (non-negative least squares
    over the one-worker runs), the start-up and baseline, what the local runner holds
    (fitted per text byte and per key line byte), and the worker processes' cost beyond
    their share of the steps (fitted per run and per record) and memory."""
    import platform

    from scipy.optimize import nnls

    from pipeline.api import to_config
    from pipeline.capacity.jaccard import set_shuffled, set_units
    from pipeline.capacity.plan import Rates, cluster, predict_sets, set_memory
    from pipeline.config.runner import RunnerConfig
    from pipeline.preflight import prepare

    ws = [jaccard_observed(r["config"], r["summary"]) for r in runs]
    table: dict[str, list[tuple[dict, float]]] = {}
    for r, w in zip(runs, ws, strict=True):
        units = set_units(w.records, w.file_bytes, w.record_bytes, w.sets, w.recall_sample,
                          w.chunks, r["out_bytes"])
        for step, amounts in units.items():
            table.setdefault(step, []).append((amounts, r["steps"].get(step, 0.0)))
    raw = {"measured": f"{time.strftime('%Y-%m-%d')} on {platform.node()} "
                       f"({os.cpu_count()} cores), scripts/bench_rates.py --jaccard",
           "startup_s": float(np.median([r["wall_s"] - r["pipeline_s"]
                                         for r in [tiny, *runs]])),
           "baseline_rss": float(tiny["peak_rss"]), "held_fixed": 0.0, "held_per_byte": 0.0,
           "steps": fit_steps(table)}
    rates = Rates.of(raw)
    one = cluster(RunnerConfig(name="local", workers=1), rates)
    # What the runner holds, fitted over the page corpora: the crowds' peak (2.0 GB on
    # one worker against 0.86 GB modelled) comes from a step the memory model does not
    # name yet, and fitted per text byte it doubled every other plan's memory.
    pages = [(r, w) for r, w in zip(runs, ws, strict=True)
             if f"/{CROWDS}" not in r["config"]["input"]["path"]]
    text = np.array([w.records * w.record_bytes for _, w in pages], float)
    lines = np.array([set_shuffled(w.records, w.id_bytes, w.sets)["keys"] for _, w in pages])
    extra = np.array([r["peak_rss"] - set_memory(w, one, rates) for r, w in pages])
    (fixed, per_byte, per_line), _ = nnls(
        np.stack([np.full(len(pages), 1e9), text, lines], axis=1), extra)
    raw.update(held_fixed=float(fixed * 1e9), held_per_byte=float(per_byte),
               held_per_line=float(per_line))
    rates = Rates.of(raw)
    procs = [cluster(prepare(to_config(r["proc_config"])).cfg.runner, rates) for r in runs]
    rest = np.array([r["proc_wall_s"] - predict_sets(w, c, rates).wall_s
                     for r, w, c in zip(runs, ws, procs, strict=True)])
    n = np.array([w.records for w in ws], float)
    (per_run, per_record), _ = nnls(np.stack([np.full(len(ws), 1.0), n / n.max()], axis=1),
                                    rest)
    raw.update(process_s=float(per_run), process_record=float(per_record / n.max()))
    rss = [(r["proc_peak_rss"] - set_memory(w, c, rates)) / c.workers
           for r, w, c in zip(runs, ws, procs, strict=True)]
    raw["process_rss"] = float(max(np.median(rss), 0.0))
    return raw


def jaccard_measure(folder: Path, out: Path, refit: bool = False) -> None:
    """The jaccard calibration runs (``refit``: those saved in ``folder``), the fit,
    written as the ``jaccard`` section of ``out`` (its other keys kept), and a table."""
    folder.mkdir(parents=True, exist_ok=True)
    cases = (JACCARD_TINY, *JACCARD_CALIBRATION)
    if refit:
        tiny, *runs = [json.loads((folder / f"result-{jaccard_tag(*c)}.json").read_text())
                       for c in cases]
    else:
        tiny, *runs = [jaccard_calibrate(folder, *c) for c in cases]
    section = jaccard_fit(tiny, runs)
    rates = json.loads(out.read_text()) if out.exists() else {}
    rates["jaccard"] = section
    out.write_text(json.dumps(rates, indent=1) + "\n")
    show(section)
    print(f"worker processes: {section['process_s']:.2f} s per run + "
          f"{section['process_record'] * 1e6:.2f} us per record, "
          f"{section['process_rss'] / 2**20:.0f} MB each; the runner holds "
          f"{section['held_per_line']:.2f} x the key lines' bytes too")
    for r in runs:
        print(f"calibration {r['summary']['read']:,} pages, {r['config']['near']}: pipeline "
              f"{r['pipeline_s']:.1f} s (processes: {r['proc_wall_s']:.1f} s whole), "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["steps"].items())))
    print(f"wrote the jaccard section of {out}")


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "pipeline" / "capacity" / "rates.json")
    ap.add_argument("--check", type=int, nargs="*", metavar="RECORDS")
    ap.add_argument("--workers", type=int, default=1, help="--check: local workers")
    ap.add_argument("--project", action="store_true")
    ap.add_argument("--jaccard", action="store_true",
                    help="measure the jaccard stage's rates (the rates file's 'jaccard' "
                         "section; its check: scripts/bench_plan_jaccard.py)")
    ap.add_argument("--refit", action="store_true",
                    help="fit the rates again from the calibration runs saved in --dir")
    ap.add_argument("--inside", nargs=2, metavar=("CONFIG", "RESULT"), help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tensordedup-rates"))
    args = ap.parse_args()
    if args.inside:
        run_inside(json.loads(Path(args.inside[0]).read_text()), Path(args.inside[1]))
    elif args.project:
        project([100_000_000, 1_000_000_000])
    elif args.jaccard:
        jaccard_measure(args.dir, args.json, args.refit)
    elif args.check:
        json.dump(check(args.dir, args.check, args.workers), sys.stdout, indent=1)
    else:
        measure(args.dir, args.json, args.refit)


if __name__ == "__main__":
    main()
