"""Benchmark the training-input filters: records/s through tf.data and a DataLoader,
without a filter, with the manifest filter and with the online filter, and what users
write instead.

Data: N records x 64 float32 (10% exact copies of other records), ids "r<i>", held in
memory so the pipelines measure the filter, not a disk. The manifest comes from the real
dedup job run on the same records written as one Parquet file. Every filtered pipeline
must keep exactly the records the job kept (the online filter keeps the first copy in
stream order, which is the job's keep: first); the script checks it.

Contenders run one after another in this process, each ``--repeat`` times (best time
kept), so ratios compare runs seconds apart on this shared machine. Peers (a Python
set of sha256 / tuple keys, the seeds' tricks) run on the first ``--peer-rows`` records,
and the online near filter on ``--near-rows`` (its flat search grows with the kept set).

Usage: python scripts/bench_filters.py [--rows 1000000] [--repeat 2] [--json bench-filters.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from benchkit import ROOT

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DIM, BATCH = 64, 1024


def make_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    copies = rng.choice(n, n // 10, replace=False)
    x[copies] = x[rng.integers(0, n, n // 10)]
    return x, np.char.add("r", np.arange(n).astype(str)).astype(object)


def run_job(x: np.ndarray, ids: np.ndarray, work: Path) -> Path:
    """The batch job (exact, keep first) on the records as one Parquet file: its report."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    (work / "in").mkdir()
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), DIM)
    pq.write_table(pa.table({"id": pa.array(ids.tolist(), pa.string()), "emb": emb}),
                   work / "in" / "part-0.parquet", row_group_size=65536)
    cfg = {"input": {"format": "parquet", "path": str(work / "in" / "*.parquet"),
                     "tensor": "emb", "id": "id"},
           "output": {"path": str(work / "out" / "clean")}, "report": str(work / "report")}
    (work / "job.yaml").write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "pipeline.run", "--config", str(work / "job.yaml"),
                    "--quiet"], cwd=ROOT, check=True)
    return work / "report"


def timed(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    """(best seconds, records out) over ``repeat`` runs."""
    best, out = float("inf"), -1
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


# --- tf.data ---------------------------------------------------------------------------

Contenders = dict[tuple[str, str], tuple[Callable[[], int], int]]


def tf_contenders(x: np.ndarray, ids: np.ndarray, manifest, near_rows: int, peer_rows: int
                  ) -> Contenders:
    import tensorflow as tf

    from filters.online import OnlineDedup
    from filters.tf import online_filter, skip_removed
    from transforms.near.spec import NearSpec

    def source(n: int) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices({"id": ids[:n].astype(bytes), "x": x[:n]})

    def count(make: Callable[[], tf.data.Dataset], batched: bool = False) -> Callable[[], int]:
        def go() -> int:
            ds = make() if batched else make().batch(BATCH)
            return sum(int(b["x"].shape[0]) for b in ds.prefetch(2))
        return go

    def sha256_peer() -> tf.data.Dataset:
        seen: set[str] = set()

        def new(t) -> bool:
            h = hashlib.sha256(t.numpy().tobytes()).hexdigest()
            if h in seen:
                return False
            seen.add(h)
            return True

        return source(peer_rows).filter(lambda e: tf.py_function(new, [e["x"]], tf.bool))

    n, g = len(x), "tf.data"
    near = NearSpec("l2", threshold=0.1)
    # the lookup tables are built once, before timing (1M ids: ~0.4 s)
    on_batches = skip_removed(manifest, "id", batched=True)
    per_element, per_1024 = skip_removed(manifest, "id"), skip_removed(manifest, "id", BATCH)
    return {
        (g, "no filter (slices -> batch 1024)"): (count(lambda: source(n)), n),
        (g, "manifest on batches (skip_removed batched=True)"): (count(
            lambda: source(n).batch(BATCH).apply(on_batches), batched=True), n),
        (g, "manifest per element (ds.filter, in-graph table)"):
            (count(lambda: source(n).apply(per_element)), n),
        (g, "manifest per element, 1024 ids per lookup"):
            (count(lambda: source(n).apply(per_1024)), n),
        (g, "online exact (online_filter)"): (count(
            lambda: source(n).apply(online_filter(OnlineDedup(), tensor_key="x"))), n),
        (g, "online exact, with ids"): (count(lambda: source(n).apply(
            online_filter(OnlineDedup(), tensor_key="x", id_key="id"))), n),
        (g, f"online near (l2 0.1), first {near_rows:,}"): (count(lambda: source(
            near_rows).apply(online_filter(OnlineDedup(near=near), tensor_key="x"))), near_rows),
        (g, f"peer: py_function sha256 set, first {peer_rows:,}"):
            (count(sha256_peer), peer_rows),
    }


# --- PyTorch ---------------------------------------------------------------------------

def torch_contenders(x: np.ndarray, ids: np.ndarray, manifest, near_rows: int,
                     peer_rows: int) -> Contenders:
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    from filters.online import OnlineDedup
    from filters.torch import OnlineDedupDataset, manifest_sampler
    from transforms.near.spec import NearSpec

    xt = torch.from_numpy(x)

    class Records(Dataset):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> torch.Tensor:
            return xt[i]

    class Batches(IterableDataset):
        def __init__(self, n: int) -> None:
            self.n = n

        def __iter__(self):
            return (xt[s:min(s + BATCH, self.n)] for s in range(0, self.n, BATCH))

    class TuplePeer(IterableDataset):
        def __iter__(self):
            seen: set[tuple] = set()
            for i in range(peer_rows):
                key = tuple(xt[i].tolist())
                if key not in seen:
                    seen.add(key)
                    yield xt[i]

    def count(make: Callable[[], DataLoader]) -> Callable[[], int]:
        return lambda: sum(len(b) for b in make())

    def loader(ds, **kw) -> Callable[[], DataLoader]:
        return lambda: DataLoader(ds, **kw)

    n, per, bat = len(x), "DataLoader, elements", "DataLoader, 1024-row batches"
    near = NearSpec("l2", threshold=0.1)
    sampler = manifest_sampler(manifest, ids)
    return {
        (per, "no filter (map-style, batch_size 1024)"):
            (count(loader(Records(n), batch_size=BATCH)), n),
        (per, "manifest (ManifestSampler)"): (count(loader(
            Records(n), batch_size=BATCH, sampler=sampler)), n),
        (per, "online exact (OnlineDedupDataset)"): (count(lambda: DataLoader(
            OnlineDedupDataset(Records(n), OnlineDedup()), batch_size=BATCH)), n),
        (per, f"peer: set of tuple(t.tolist()), first {peer_rows:,}"):
            (count(loader(TuplePeer(), batch_size=BATCH)), peer_rows),
        (bat, "no filter (iterable of batches, batch_size None)"):
            (count(loader(Batches(n), batch_size=None)), n),
        (bat, "online exact (OnlineDedupDataset batched=True)"): (count(lambda: DataLoader(
            OnlineDedupDataset(Batches(n), OnlineDedup(), batched=True), batch_size=None)), n),
        (bat, f"online near (l2 0.1), first {near_rows:,}"): (count(lambda: DataLoader(
            OnlineDedupDataset(Batches(near_rows), OnlineDedup(near=near), batched=True),
            batch_size=None)), near_rows),
    }


# --- the kernel alone ------------------------------------------------------------------

def kernel_contenders(x: np.ndarray, ids: np.ndarray) -> Contenders:
    from filters.online import OnlineDedup

    def feed(make: Callable[[], OnlineDedup], with_ids: bool) -> Callable[[], int]:
        def go() -> int:
            f, kept = make(), 0
            for s in range(0, len(x), BATCH):
                kept += int(f.keep_mask(x[s:s + BATCH], ids[s:s + BATCH] if with_ids
                                        else None).sum())
            return kept
        return go

    n, g = len(x), "OnlineDedup.keep_mask alone, 1024 rows a call"
    return {
        (g, "exact"): (feed(OnlineDedup, False), n),
        (g, "exact, with ids"): (feed(OnlineDedup, True), n),
        (g, "Bloom filter, rate 1e-3"): (
            feed(lambda: OnlineDedup(bloom=1e-3, bloom_capacity=n), False), n),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--peer-rows", type=int, default=100_000)
    ap.add_argument("--near-rows", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default="bench-filters.json")
    ap.add_argument("--only", default="", help="run only pipelines whose name contains this")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from filters.manifest import Manifest
    from tests.oracle import stream_oracle

    x, ids = make_data(args.rows)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        start = time.perf_counter()
        manifest = Manifest.load(run_job(x, ids, Path(tmp)))
        job_s = time.perf_counter() - start
    job_kept = args.rows - len(manifest)
    expect = {args.rows: job_kept,
              args.near_rows: None,  # near keeps fewer: checked against the oracle below
              args.peer_rows: int(stream_oracle(x[:args.peer_rows]).sum())}
    print(f"{args.rows:,} records x {DIM} float32; the job kept {job_kept:,} ({job_s:.1f} s "
          "incl. writing the Parquet input)", flush=True)

    rows, base = [], {}
    contenders = {**kernel_contenders(x, ids),
                  **tf_contenders(x, ids, manifest, args.near_rows, args.peer_rows),
                  **torch_contenders(x, ids, manifest, args.near_rows, args.peer_rows)}
    for (group, name), (fn, n_in) in contenders.items():
        if args.only not in group:
            continue
        one_shot = "peer" in name or "near" in name
        seconds, out = timed(fn, 1 if one_shot else args.repeat)
        want = None if "near" in name or "Bloom" in name else expect.get(n_in)
        if "no filter" in name:
            want, base[group] = n_in, n_in / seconds
        if want is not None and out != want:
            raise SystemExit(f"{group}: {name}: {out:,} records out, expected {want:,}")
        rate = n_in / seconds
        overhead = base[group] / rate if group in base else None
        rows.append({"pipeline": group, "contender": name, "records_in": n_in,
                     "records_out": out, "seconds": round(seconds, 3),
                     "records_per_s": round(rate),
                     "time_vs_unfiltered": None if overhead is None else round(overhead, 3)})
        ratio = "" if overhead is None else f"{overhead:6.2f}x"
        print(f"{group[:30]:30s} {name:50s} {seconds:7.2f} s {rate / 1e3:7.0f} k/s {ratio}",
              flush=True)
    Path(args.json).write_text(json.dumps({"rows": args.rows, "dim": DIM, "job_kept": job_kept,
                                           "results": rows}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
