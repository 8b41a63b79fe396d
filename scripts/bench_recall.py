"""What the recall estimate costs and how narrow it is (issue 44): the job at default
settings with the recall sample off, drawn uniformly (``--uniform-code``: a checkout
before stratified drawing, e.g. landed main) and drawn in strata (this checkout).

Data: ``bench_growth``'s (128-d embedding-like records, 4% exact and 4% planted near
copies, cosine 0.01, 8 Parquet files). Whole CLI processes, ``--repeat`` rounds with the
contenders interleaved (this machine is shared: the medians and the same round's
ratios are the point). Per contender: median wall seconds, the recall's share of the
job's time (its median over the median with the sample off, less one), the printed
recall, its 95% interval and half-width ((high - low) / 2), records judged, the capped
records sampled, and the planted recall (share of planted near pairs with either side
removed), which the interval should hold.

    python scripts/bench_recall.py --rows 1000000 --uniform-code /tmp/main-before

Writes bench-recall.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_growth import make, run_job, score  # noqa: E402
from benchkit import ROOT  # noqa: E402


def contenders(uniform_code: str | None) -> list[tuple[str, str, list[str]]]:
    out = [("recall off", str(ROOT), ["near.recall_sample=0"]),
           ("stratified (this checkout)", str(ROOT), [])]
    if uniform_code:
        out.insert(1, ("uniform (before)", uniform_code, []))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--uniform-code", default=None,
                    help="a checkout whose recall sample is uniform (landed main)")
    ap.add_argument("--work", default=None, help="keep data and outputs here (default: temp)")
    ap.add_argument("--json", default="bench-recall.json")
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-recall-") as tmp:
        work = Path(a.work or tmp)
        data = work / f"data-{a.rows}"
        if (data / "planted.npy").exists():
            x, planted = np.load(data / "x.npy", mmap_mode="r"), np.load(data / "planted.npy")
        else:
            x, planted = make(a.rows, data)
            np.save(data / "planted.npy", planted)
        for k in range(a.repeat):
            for name, code, sets in contenders(a.uniform_code):
                out = work / f"out-{k}-{name.split()[0]}"
                r = run_job(data, out, code, sets)
                if r["rc"] != 0:
                    sys.exit(f"{name} failed: {r['stderr_tail']}")
                s = score(x, planted, out)
                rec = json.loads((out / "report" / "summary.json").read_text())["near"]["recall"]
                row = {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], **s,
                       "drawn": (rec or {}).get("drawn", "uniform" if rec else None),
                       "capped_sampled": ((rec or {}).get("strata") or {}).get(
                           "capped", {}).get("sampled"),
                       "sampled": (rec or {}).get("sampled")}
                runs.setdefault(name, []).append(row)
                print(name, json.dumps(row), file=sys.stderr, flush=True)
    off = statistics.median(r["wall_s"] for r in runs["recall off"])
    lines = ["| contender | wall s (median) | recall's share of the job | recall printed "
             "(95% interval) | half-width | judged / sampled | capped sampled | planted "
             "recall |", "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    summary = {}
    for name, rows in runs.items():
        wall = statistics.median(r["wall_s"] for r in rows)
        last = rows[-1]
        share = None if name == "recall off" else wall / off - 1
        half = None if last["recall"] is None else (last["recall_high"] - last["recall_low"]) / 2
        summary[name] = {"wall_s": wall, "recall_share": share, "half_width": half,
                         "runs": rows}
        rec = ("-" if last["recall"] is None else
               f"{last['recall']:.4f} ({last['recall_low']:.4f}-{last['recall_high']:.4f})")
        lines.append(
            f"| {name} | {wall:.1f} | {'-' if share is None else f'{share:.1%}'} | {rec} | "
            f"{'-' if half is None else f'{half:.4f}'} | "
            f"{last['recall_with_partners'] or '-'} / {last['sampled'] or '-'} | "
            f"{last['capped_sampled'] or '-'} | {last['planted_recall']:.4f} |")
    Path(a.json).write_text(json.dumps({"rows": a.rows, "repeat": a.repeat,
                                        "contenders": summary}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
