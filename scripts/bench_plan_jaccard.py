"""The dry run's capacity plan of a jaccard job against the job itself (issue 43): what
``tensordedup --config X --dry-run`` predicts, then ``tensordedup --config X`` timed as a
whole process, on corpora of real vocabulary with planted near copies
(``scripts/text_corpus.py``: 10% planted copies, a crowd of docs / 20 "page not found"
copies, boilerplate, CJK, two 1 MB pages; ~1 KB pages, seed 0).

Why whole processes: the plan predicts what a user waits for, the process's start-up,
its worker processes and its exit included.

    python scripts/bench_plan_jaccard.py [--docs 20000 100000 300000] [--workers 1]
    python scripts/bench_plan_jaccard.py --project [--docs 100000]   # 1B pages on Dataflow

The job runs as a user's config leaves the runner (``--workers`` N: that many local
workers): near ``{metric: jaccard, threshold: 0.8}``, mode auto. The plan is the dry
run's (``pipeline.capacity.plan.set_lines``, the rates in pipeline/capacity/rates.json,
``jaccard`` section: ``scripts/bench_rates.py --jaccard``). Prints a Markdown table and
writes ``--json`` (default bench-plan-jaccard.json). Run it alone on the machine (wrap in
``flock /work/BENCH.lock``): wall times are the measure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_rates import jaccard_config, text_input  # noqa: E402
from benchkit import run_watched  # noqa: E402

DOC_BYTES = 1000  # the corpora's median page (text_corpus.py --doc-bytes)
SEED = 0  # the calibration corpora of bench_rates.py --jaccard use seed 1
DATAFLOW = {"machine_type": "n1-standard-16", "max_workers": 100}  # as docs/scale.md's CPU plan


def plan_of(cfg: dict, records: int | None = None, runner=None, remote_spill: bool = False):
    """(the dry run's capacity, its workload, its lines) for ``cfg``: what
    ``--dry-run [--plan-records N]`` prints, on ``runner`` when given."""
    from pipeline.api import to_config
    from pipeline.capacity.plan import Rates, cluster, predict_sets, set_lines
    from pipeline.capacity.workload import workload
    from pipeline.preflight import prepare

    rates = Rates.load().jaccard
    job = prepare(to_config(cfg))
    w = workload(job, records)
    c = cluster(runner or job.cfg.runner, rates)
    return predict_sets(w, c, rates), w, set_lines(w, c, rates, remote_spill)


def check(folder: Path, sizes: list[int], workers: int | None) -> list[dict]:
    """Each size: the plan, then the job as a whole process; a row each."""
    rows = []
    for n in sizes:
        data = text_input(folder, n, DOC_BYTES, SEED)
        text_mb = json.loads((Path(data).parents[1] / "corpus.json").read_text())[
            "text_bytes"] / 1e6
        tag = f"{n}-{workers or 'default'}"
        cfg = jaccard_config(data, folder / f"out-{tag}", {}, workers=workers)
        cfg_path = folder / f"check-{tag}.json"
        cfg_path.write_text(json.dumps(cfg))
        start = time.perf_counter()
        cap, w, lines = plan_of(cfg)
        plan_s = time.perf_counter() - start
        load = os.getloadavg()[0]
        got = run_watched([sys.executable, "-m", "pipeline.run", "--config", str(cfg_path),
                           "--quiet"], cwd=ROOT, log=folder / f"check-{tag}.log",
                          timeout_s=3600)
        if got["rc"] != 0:
            raise RuntimeError(f"the job failed: {got['stderr_tail']}")
        near = json.loads((Path(cfg["report"]) / "summary.json").read_text())["near"]
        s = w.sets
        c = cap.cluster
        rows.append({
            "docs": n, "text_mb": text_mb,
            "runner": f"local, {c.workers} {'processes' if c.processes else 'worker(s)'}",
            "plan": {"mode": s.mode, "compared": n * s.compared, "removed": n * s.removed,
                     "grouped": n * s.grouped, "largest_component": s.largest_component,
                     "steps_s": cap.steps, "dry_run_s": plan_s, "lines": lines},
            "job": {k: near.get(k) for k in ("mode", "compared", "removed",
                                             "records_searched", "largest_group")},
            "predicted_s": cap.wall_s, "actual_s": got["wall_s"],
            "error": cap.wall_s / got["wall_s"] - 1,
            "predicted_peak_mb": cap.peak_memory / 2**20,
            "actual_peak_mb": got["peak_rss_bytes"] / 2**20, "load_1m_before": load})
        print(row_line(rows[-1]), flush=True)
    return rows


HEADER = ("| documents (text) | runner | the plan: mode, pairs verified, removed | "
          "the job: mode, pairs verified, removed | predicted wall | actual wall | error | "
          "predicted peak | actual peak |\n"
          "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")


def row_line(r: dict) -> str:
    p, j = r["plan"], r["job"]
    return (f"| {r['docs']:,} ({r['text_mb']:.0f} MB) | {r['runner']} | {p['mode']}, "
            f"{p['compared']:,.0f}, {p['removed']:,.0f} | {j['mode']}, {j['compared']:,}, "
            f"{j['removed']:,} | {r['predicted_s']:.1f} s | {r['actual_s']:.1f} s | "
            f"{r['error']:+.0%} | {r['predicted_peak_mb']:,.0f} MB | "
            f"{r['actual_peak_mb']:,.0f} MB |")


def project(folder: Path, docs: int, records: int) -> list[str]:
    """The dry run's plan of ``records`` pages like the ``docs``-page corpus, on Dataflow
    (DATAFLOW; the spill on Cloud Storage)."""
    from pipeline.config.runner import RunnerConfig

    data = text_input(folder, docs, DOC_BYTES, SEED)
    cfg = jaccard_config(data, folder / f"out-project-{docs}", {}, workers=None)
    runner = RunnerConfig(name="dataflow", project="my-project", region="us-central1",
                          temp_location="gs://my-bucket/tmp",
                          worker_image="us-docker.pkg.dev/my-project/w:1", **DATAFLOW)
    _, _, lines = plan_of(cfg, records, runner, remote_spill=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, nargs="*", default=[20_000, 100_000, 300_000])
    ap.add_argument("--workers", type=int, default=None,
                    help="local workers (default: the runner's, as a config leaves it)")
    ap.add_argument("--project", action="store_true",
                    help="print the plan of --records pages on Dataflow instead")
    ap.add_argument("--records", type=int, default=1_000_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tensordedup-plan-jaccard"))
    ap.add_argument("--json", type=Path, default=ROOT / "bench-plan-jaccard.json")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    if a.project:
        print("\n".join(project(a.dir, a.docs[0], a.records)))
        return
    print(HEADER, flush=True)
    rows = check(a.dir, a.docs, a.workers)
    a.json.write_text(json.dumps({"rows": rows, "cores": os.cpu_count()}, indent=1,
                                 default=float))


if __name__ == "__main__":
    main()
