"""What a Parquet file's row-group size costs the job: the same records as Hugging Face
``datasets`` wrote them from 2022 to its 5.x releases (1,000 rows per row group, 100 for
images; 5.x aims at 100 MB groups) and in large groups,
whole CLI processes one after another, default settings but the near section.

Data (each built here, deterministic):
- ``vectors``: ``bench_growth``'s 128-d embedding-like rows with 4% exact and 4% planted
  near copies, cosine 0.01;
- ``texts``: ``text_corpus.py``'s documents (real vocabulary, planted near copies, a
  crowd), jaccard 0.8 over word 5-grams;
- ``images``: 64 x 64 tiles of scikit-image's photos as PNG, a fifth of them again as a
  JPEG q95, in an HF ``Image()`` column, with ``configs/dedupe-images-hf.yaml``'s near
  section (correlation 0.02 at 32 x 32).

Per data set, layout and checkout: wall and CPU seconds of the process tree, peak RSS,
the counts, and whether the removals (record, what it is a copy of, kind) equal those of
the large-group layout. ``--base DIR`` runs the same from another checkout (the code
before a change). Writes bench-row-groups.json.

    python scripts/bench_row_groups.py [--vectors 250000] [--texts 100000] [--base DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_growth import make  # noqa: E402
from benchkit import ROOT, run_watched  # noqa: E402

LAYOUTS = {"vectors": (1_000, 65_536), "texts": (1_000, 16_384), "images": (100, 10_000)}
NEAR = {"vectors": {"metric": "cosine", "threshold": 0.01},
        "texts": {"metric": "jaccard", "threshold": 0.8},
        "images": {"metric": "correlation", "threshold": 0.02}}


def _tiles(seed: int = 0) -> pa.Table:
    """64 x 64 tiles (stride 32) of scikit-image's colour and grey photos, PNG, a fifth
    of them again as JPEG q95, shuffled, as an HF ``Image()`` column."""
    import skimage.data as d
    from PIL import Image

    out = []
    for name in ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
                 "retina", "hubble_deep_field", "colorwheel", "cat", "camera", "moon"):
        a = getattr(d, name)()
        a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
        for y in range(0, a.shape[0] - 64, 32):
            for x in range(0, a.shape[1] - 64, 32):
                out.append(a[y:y + 64, x:x + 64])
    encoded = []
    for i, t in enumerate(out):
        for fmt, kw in (("PNG", {}), ("JPEG", {"quality": 95})):
            if fmt == "JPEG" and i % 5:
                continue
            b = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(t)).save(b, fmt, **kw)
            encoded.append(b.getvalue())
    order = np.random.default_rng(seed).permutation(len(encoded))
    hf = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.table({"id": [f"t{i}" for i in range(len(order))],
                     "image": pa.array([{"bytes": encoded[i], "path": None} for i in order], hf)})


def build(kind: str, n: int, work: Path) -> pa.Table:
    """All records of ``kind`` as one table (ids in column ``id``)."""
    if kind == "vectors":
        make(n, work / "vectors-src")
        return pa.concat_tables(pq.read_table(p) for p in sorted(
            (work / "vectors-src").glob("*.parquet")))
    if kind == "texts":
        subprocess.run([sys.executable, str(ROOT / "scripts" / "text_corpus.py"), "--docs",
                        str(n), "--no-tokens", "--out", str(work / "texts-src")], check=True,
                       stdout=subprocess.DEVNULL)
        return pa.concat_tables(pq.read_table(p) for p in sorted(
            (work / "texts-src" / "text").glob("*.parquet")))
    return _tiles()


def config(kind: str, data: Path, out: Path, fmt: str = "parquet", glob: str = "*.parquet"
           ) -> Path:
    inp = {"format": fmt, "path": str(data / glob), "id": "id"}
    inp |= {"vectors": {"tensor": "emb"}, "texts": {"tensor": "text", "decode": "text"},
            "images": {"tensor": "image", "decode": "image", "resize": [32, 32],
                       "channels": 3}}[kind]
    cfg = {"input": inp, "near": NEAR[kind], "max_invalid_fraction": 0.2,
           "output": {"path": str(out / "clean"), "overwrite": True},
           "report": str(out / "report")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(cfg))
    return out / "job.json"


def run(kind: str, data: Path, out: Path, code: str, fmt: str = "parquet",
        glob: str = "*.parquet") -> dict:
    """One whole job's process tree: wall and CPU seconds, peak RSS, counts, removals."""
    cmd = [sys.executable, "-m", "pipeline.run", "--config",
           str(config(kind, data, out, fmt, glob))]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = run_watched(cmd, cwd=code, log=out / "stderr.log", limit_bytes=16 << 30,
                    timeout_s=1800, env={**os.environ, "PYTHONPATH": code})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r["rc"] == 0:
        s = json.loads((out / "report" / "summary.json").read_text())
        r["counts"] = {k: s[k] for k in ("read", "kept", "invalid")} | {
            k: v for k, v in s.items() if k.startswith("removed_")}
        dups = pq.read_table(out / "report" / "duplicates.parquet")
        r["removals"] = sorted(zip(*(dups[c].to_pylist() for c in (
            "record_id", "duplicate_of", "kind")), strict=True))
    return r


def run_cells(r: dict) -> str:
    """A ``run``'s cells of a table row: wall s | CPU s | peak MB | removed | same."""
    removed = sum(v for k, v in r.get("counts", {}).items() if k.startswith("removed_"))
    return (f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_bytes'] / 1e6:,.0f} | "
            f"{removed:,} | {r['same']} |")


def table(rows: list[dict]) -> str:
    lines = ["| data | rows per group | code | wall s | CPU s | peak MB | removed | same "
             "removals as large groups |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['data']} ({r['records']:,}) | {r['group']:,} | {r['code']} | "
              f"{run_cells(r)}" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vectors", type=int, default=250_000)
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--only", action="append", choices=list(LAYOUTS), default=[])
    ap.add_argument("--base", default=None, help="another checkout, run the same way")
    ap.add_argument("--json", default="bench-row-groups.json")
    a = ap.parse_args()
    codes = {"this": str(ROOT)} | ({"base": a.base} if a.base else {})
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-row-groups-") as tmp:
        work = Path(tmp)
        for kind in a.only or list(LAYOUTS):
            t = build(kind, {"vectors": a.vectors, "texts": a.texts}.get(kind, 0), work)
            large = {}
            for group in sorted(LAYOUTS[kind], reverse=True):
                data = work / kind / str(group)
                data.mkdir(parents=True)
                half = t.num_rows // 2  # two files
                for i, part in enumerate((t.slice(0, half), t.slice(half))):
                    pq.write_table(part, data / f"part-{i}.parquet", row_group_size=group)
                for name, code in codes.items():
                    r = run(kind, data, work / "out" / f"{kind}-{group}-{name}", code)
                    got = r.pop("removals", None)
                    large.setdefault(name, got)
                    r |= {"data": kind, "records": t.num_rows, "group": group, "code": name,
                          "same": got is not None and got == large[name]}
                    r.pop("stderr_tail") if r["rc"] == 0 else None
                    rows.append(r)
                    print(f"{kind} {group} {name}: {r['wall_s']:.1f} s, {r['cpu_s']:.1f} CPU s, "
                          f"rc {r['rc']}", file=sys.stderr)
    print(table(rows))
    Path(a.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
