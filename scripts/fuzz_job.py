"""Differential fuzz of the whole job (``run_job``) against a brute-force oracle: keep
policies, reference sets, the fingerprint store, every input format.

Each seed takes a ``fuzz_near.random_case`` (exact/near copies, blanks, crowds, NaN rows,
l2/cosine/allclose, both groupings) and picks: the format (Parquet; TFRecord float_list /
int64_list / serialized tensors; HDF5; JSON lines; Arrow IPC files or streams) in 1-3
files, ``keep`` (first | last | {max|min: score}, scores with ties, NaN, nulls), the near
stage (off | exact | auto | bounded, ``nonfinite`` keep | invalid), a reference set
(copies, near copies, fresh records, copies within itself; any format holding the
dtype), a store (records split over two runs; the second is checked against the first's
kept records) and tiny or default ``tuning``.

Oracle (docs/pipeline.md, near.md, runs.md): keep order = the policy (ties by input order,
NaN last), protected records first (reference in file order, then the store); exact groups
keep their best record, or all name the first protected copy; near runs on the exact
survivors plus the protected records (representative: nearest kept record, ties by keep
order; components: each keeps its first record). Exact kinds must equal the oracle; near
kinds too in mode exact, else each must name a kept record within tolerance (components:
in its oracle component). Also read = kept + removed + invalid, per-kind counts, invalid
ids, clean shards read back with pyarrow / tf.data / h5py hold the kept records, and
exact mode's printed recall is 1.0 (where measured).

Usage: python scripts/fuzz_job.py --seeds 0:100 --minutes 10
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import fuzz_seeds, other_runner, same_as_local
from fuzz_near import ROOT, random_case

sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tests.oracle import (  # noqa: E402
    canonical_key,
    component_roots,
    keep_rank,
    near_decisions,
    near_pairs,
)
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance  # noqa: E402

EXT = {"parquet": "parquet", "tfrecord": "tfrecord", "hdf5": "h5", "jsonl": "jsonl",
       "arrow": "arrow", "csv": "csv", "npy": "npy", "npz": "npz"}


def write_file(fmt: str, tf_kind: str, path: Path, ids: list[str], x: np.ndarray,
               score: np.ndarray, rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("parquet", "arrow"):
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
        sc = pa.array(score, mask=np.isnan(score) & (rng.random(len(score)) < 0.5))
        table = pa.table({"id": ids, "emb": emb, "score": sc})
        group = int(rng.integers(20, 400))
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=group)
            return
        kind = str(rng.choice(["file", "stream"]))  # an IPC file or a stream of batches
        with (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(str(path),
                                                                         table.schema) as w:
            for batch in table.to_batches(max_chunksize=group):
                w.write_batch(batch)
    elif fmt == "tfrecord":
        import tensorflow as tf

        t_ = tf.train
        with tf.io.TFRecordWriter(str(path)) as w:
            for i, t, s in zip(ids, x, score, strict=True):
                ser = [tf.io.serialize_tensor(t).numpy()] if tf_kind == "serialized" else None
                emb = (t_.Feature(bytes_list=t_.BytesList(value=ser))
                       if tf_kind == "serialized" else t_.Feature(float_list=t_.FloatList(value=t))
                       if tf_kind == "float_list" else t_.Feature(int64_list=t_.Int64List(value=t)))
                feat = {"id": t_.Feature(bytes_list=t_.BytesList(value=[i.encode()])), "emb": emb,
                        "score": t_.Feature(float_list=t_.FloatList(value=[s]))}
                w.write(t_.Example(features=t_.Features(feature=feat)).SerializeToString())
    elif fmt == "csv":  # a feature table: a column per value (exact reprs), a blank line
        head = ",".join(["id", *(f"e{j}" for j in range(x.shape[1])), "score"])
        path.write_text(head + "\n" + "".join(
            ",".join([i, *(repr(v) for v in t.tolist()), "" if np.isnan(s) else repr(s)])
            + ("\n\n" if rng.random() < 0.05 else "\n")
            for i, t, s in zip(ids, x, score.tolist(), strict=True)))
    elif fmt == "npy":  # the values alone (ids are <file>:<row>), any byte order
        np.save(path, x.astype(x.dtype.newbyteorder(">")) if rng.random() < 0.3 else x)
    elif fmt == "npz":  # ids and scores as arrays beside the values, stored or compressed
        save = np.savez_compressed if rng.random() < 0.5 else np.savez
        save(path, emb=x, id=np.array(ids, dtype=str), score=score,
             dim=np.array(x.shape[1]))  # 0-d: no row per record, copied as it was
    elif fmt == "jsonl":  # Python's json (exact floats), a blank line now and then
        path.write_text("".join(json.dumps({"id": i, "emb": t.tolist(), "score": float(s)})
                                + ("\n\n" if rng.random() < 0.05 else "\n")
                                for i, t, s in zip(ids, x, score, strict=True)))
    else:
        with h5py.File(path, "w") as h:
            chunks = ((int(rng.integers(1, min(64, len(x)) + 1)), x.shape[1])
                      if len(x) and rng.random() < 0.5 else None)
            h.create_dataset("emb", data=x, chunks=chunks)
            h.create_dataset("id", data=np.array([i.encode() for i in ids], "S8"))
            h.create_dataset("score", data=score)


def read_file(fmt: str, tf_kind: str, path: Path, dtype: np.dtype, d: int, kept: list[str]
              ) -> tuple[list[str], np.ndarray]:
    """(ids, tensors) of a clean shard, read with the format's own reader; a .npy shard's
    rows are named by ``kept`` (its input's kept ids, in order) where as many."""
    if fmt == "npy":
        rows = np.load(path, allow_pickle=False).astype(dtype).reshape(-1, d)
        return (kept if len(kept) == len(rows) else ["?"] * len(rows)), rows
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as z:
            assert int(z["dim"]) == d, z["dim"]
            return z["id"].tolist(), z["emb"].astype(dtype).reshape(-1, d)
    if fmt in ("parquet", "arrow"):
        t = pq.read_table(path) if fmt == "parquet" else pa.ipc.open_file(str(path)).read_all(
        ) if path.read_bytes()[:6] == b"ARROW1" else pa.ipc.open_stream(str(path)).read_all()
        emb = t.column("emb").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        return t.column("id").to_pylist(), emb.reshape(-1, d)
    if fmt == "tfrecord":
        import tensorflow as tf

        ids, rows = [], []
        for rec in tf.data.TFRecordDataset(str(path)):
            f = tf.train.Example.FromString(rec.numpy()).features.feature
            ids.append(f["id"].bytes_list.value[0].decode())
            if tf_kind == "serialized":
                rows.append(tf.io.parse_tensor(f["emb"].bytes_list.value[0],
                                               tf.as_dtype(dtype)).numpy())
            else:
                rows.append(np.array(getattr(f["emb"], tf_kind).value, dtype))
        return ids, np.array(rows, dtype).reshape(-1, d)
    if fmt == "csv":
        import pyarrow.csv as pv

        t = pv.read_csv(path)
        cols = [t.column(f"e{j}").to_numpy().astype(dtype) for j in range(d)]
        return t.column("id").to_pylist(), np.stack(cols, axis=1).reshape(-1, d)
    if fmt == "jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r["id"] for r in rows], np.array([r["emb"] for r in rows], dtype).reshape(-1, d)
    with h5py.File(path, "r") as h:
        return [b.decode() for b in h["id"][:]], h["emb"][:]


def write_set(fmt: str, tf_kind: str, folder: Path, ids: list[str], x: np.ndarray,
              score: np.ndarray, files: int, rng: np.random.Generator) -> list[list[int]]:
    """Rows split in order over ``files`` files part-0, part-1, ... (input order), some of
    them possibly empty. Empty files found two faults, both mended: an empty TFRecord file
    first stood for the set's dtype and shape (a store or reference set was refused), and
    with near.nonfinite: invalid an empty file's chunk crashed the read."""
    cuts = np.sort(rng.integers(0, len(x) + 1, files - 1))
    parts = [p.tolist() for p in np.split(np.arange(len(x)), cuts)]
    for k, rows in enumerate(parts):
        path = folder / f"part-{k}.{EXT[fmt]}"
        if fmt == "npy":  # the job names a .npy file's records <file>:<row>
            ids[rows[0] if rows else 0:rows[-1] + 1 if rows else 0] = [
                f"{path}:{j}" for j in range(len(rows))]
        write_file(fmt, tf_kind, path, [ids[i] for i in rows], x[rows], score[rows], rng)
    return parts


def input_config(fmt: str, tf_kind: str, folder: Path, d: int, dtype: np.dtype) -> dict:
    if fmt == "npy":  # one array per file: no tensor name, no id column
        return {"format": fmt, "path": str(folder / "*.npy")}
    tensor = "emb" if fmt != "csv" else ["e*"] if d % 2 else [f"e{j}" for j in range(d)]
    return {"format": fmt, "path": str(folder / f"*.{EXT[fmt]}"), "tensor": tensor, "id": "id",
            **({"shape": [d]} if tf_kind in ("float_list", "int64_list") else {}),
            **({"dtype": str(dtype)} if fmt in ("jsonl", "csv") else {})}  # numbers: no width


def oracle(ids: list[str], x: np.ndarray, score: np.ndarray, keep: str,
           prot: list[tuple[str, np.ndarray, str]], spec: NearSpec | None):
    """({removed id: (kind, duplicate_of)}, {id: component root id}, {id: tier}, {id: x})."""
    pkey: dict[tuple, tuple[str, str]] = {}
    for pid, t, tier in prot:
        pkey.setdefault(canonical_key(t), (pid, tier))
    order = keep_rank(keep, score)
    groups: dict[tuple, list[int]] = {}
    for i in order.tolist():
        groups.setdefault(canonical_key(x[i]), []).append(i)
    out, surv = {}, []
    for key, members in groups.items():
        if key in pkey:
            pid, tier = pkey[key]
            out.update({ids[m]: (f"{tier}_exact", pid) for m in members})
        else:
            surv.append(members[0])
            out.update({ids[m]: ("exact", ids[members[0]]) for m in members[1:]})
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    surv.sort(key=lambda i: pos[i])
    pool_ids = [p[0] for p in prot] + [ids[i] for i in surv]
    tier = dict(zip(pool_ids, [p[2] for p in prot] + ["new"] * len(surv), strict=True))
    values = {p[0]: p[1] for p in prot} | {ids[i]: x[i] for i in range(len(ids))}
    root: dict[str, str] = {}
    if spec is None or not pool_ids:
        return out, root, tier, values
    pool = np.stack([values[i] for i in pool_ids])
    pairs = near_pairs(pool, spec)
    kind = lambda e: "near" if tier[pool_ids[e]] == "new" else f"{tier[pool_ids[e]]}_near"  # noqa: E731
    roots = component_roots(pairs)
    root = {pool_ids[i]: pool_ids[roots.get(i, i)] for i in range(len(pool_ids))}
    rem = near_decisions(pairs, spec.grouping, protected=len(prot),  # reference, then store
                         tiers=[0 if t == "reference" else 1 for *_, t in prot])
    out.update({pool_ids[r]: (kind(e), pool_ids[e]) for r, e in rem.items()})
    return out, root, tier, values


def check_run(got, summary, want, root, tier, values, spec, mode, clean, kept_ids, invalid
              ) -> list:
    problems = []
    exact_kinds = ("exact", "reference_exact", "store_exact")
    g_ex = {r: v for r, v in got.items() if v[0] in exact_kinds}
    w_ex = {r: v for r, v in want.items() if v[0] in exact_kinds}
    problems += [["exact kinds differ", r, g_ex.get(r), w_ex.get(r)]
                 for r in sorted(g_ex.keys() | w_ex.keys()) if g_ex.get(r) != w_ex.get(r)][:5]
    g_near = {r: v for r, v in got.items() if r not in g_ex}
    if spec is not None and mode == "exact":
        for r in sorted(g_near.keys() | (want.keys() - w_ex.keys())):
            g, w = got.get(r), want.get(r)
            if g != w and not (spec.grouping == "components" and g and w and g[0] == w[0]
                               == "store_near" and root.get(g[1]) == root.get(w[1])):
                problems.append(["near differs (got, oracle)", r, g, w])  # store order:
            if len(problems) > 8:  # unspecified within a run, so any store record of
                break               # the component may keep it
    for r, (k, dup) in list(g_near.items())[:500]:
        want_kind = "near" if tier.get(dup) == "new" else f"{tier.get(dup)}_near"
        if spec is None or k != want_kind or r in w_ex or dup in got:
            problems.append(["near removal: wrong kind, no near stage, or names a removed / "
                             "exact-removed record", r, k, dup])
        elif spec.grouping == "representative":
            if not exact_distance(values[r][None].astype(np.float64),
                                  values[dup][None].astype(np.float64), spec)[1][0]:
                problems.append(["near removal out of tolerance", r, dup])
        elif root.get(r) != root.get(dup):
            problems.append(["near removal outside its component", r, dup])
    recall = ((summary.get("near") or {}).get("recall") or {}).get("recall")
    if mode == "exact" and recall not in (None, 1.0):  # every decision is the oracle's
        problems.append(["exact mode's recall is not 1.0", summary["near"]["recall"]])
    counts = collections.Counter(k for k, _ in got.values())
    removed = {k.removeprefix("removed_"): v for k, v in summary.items()
               if k.startswith("removed_")}
    if {k: v for k, v in removed.items() if v} != dict(counts):
        problems.append(["summary counts", removed, dict(counts)])
    if summary["read"] != summary["kept"] + sum(removed.values()) + summary["invalid"]:
        problems.append(["read != kept + removed + invalid", summary["read"], summary["kept"],
                         removed, summary["invalid"]])
    if summary["invalid"] != len(invalid) or summary["kept"] != len(kept_ids):
        problems.append(["kept, invalid (got, want)", summary["kept"], summary["invalid"],
                         len(kept_ids), len(invalid)])
    if [i for i, _ in clean] != kept_ids:
        problems.append(["clean ids", len(clean), len(kept_ids),
                         sorted(set(kept_ids) ^ {i for i, _ in clean})[:5]])
    elif any(canonical_key(t) != canonical_key(values[i]) for i, t in clean):
        problems.append(["clean values differ"])
    return problems


def run_case(seed: int, stats: collections.Counter, runner: dict | None = None
             ) -> tuple[dict, list]:
    from pipeline import run_job

    rng = np.random.default_rng(seed)
    x, spec = random_case(rng)
    fmt = str(rng.choice(["parquet", "tfrecord", "hdf5", "jsonl", "arrow", "csv", "npy",
                          "npz"]))
    tf_kind = str(rng.choice(["serialized", "list"])) if fmt == "tfrecord" else ""
    if fmt in ("jsonl", "csv") and not np.isfinite(x.astype(np.float64)).all():
        fmt = "parquet"  # JSON has no NaN or infinity (json.dumps writes what no parser reads)
    if fmt in ("parquet", "jsonl", "arrow", "csv") and x.dtype in (np.float16, np.int16):
        x = x.astype(np.float32)
    if tf_kind == "list":
        tf_kind = "float_list" if x.dtype.kind == "f" else "int64_list"
        x = x.astype(np.float32 if x.dtype.kind == "f" else np.int64)
    if x.shape[1] == 1 and spec.metric in ("cosine", "correlation"):
        spec = replace(spec, metric="l2")  # the job refuses a direction of one value
    spec = replace(spec, channels=1)  # channels are a decoded image's, never a config key
    n, d = x.shape
    keep = str(rng.choice(["first", "last", "max", "min"]))
    keep = "last" if fmt == "npy" and keep in ("max", "min") else keep  # .npy: no score
    score = rng.integers(0, 5, n).astype(np.float64)
    score[rng.random(n) < 0.1] = np.nan
    mode = str(rng.choice(["off", "exact", "exact", "auto", "bounded"]))
    spec = None if mode == "off" else spec
    use_ref, use_store = rng.random() < 0.4, rng.random() < 0.4
    nonfinite = "invalid" if spec is not None and rng.random() < 0.25 else "keep"
    case = {"seed": seed, "rows": n, "dim": d, "dtype": str(x.dtype), "format": fmt,
            "tf": tf_kind, "keep": keep, "mode": mode, "spec": str(spec),
            "reference": use_ref, "store": use_store, "nonfinite": nonfinite}
    stats.update([f"format={fmt}{'/' + tf_kind if tf_kind else ''}", f"keep={keep}",
                  f"near={mode}", f"reference={use_ref}", f"store={use_store}",
                  f"nonfinite={nonfinite}"]
                 + ([f"grouping={spec.grouping}"] if spec else []))
    work = Path(tempfile.mkdtemp(prefix="fuzz-job-"))
    try:
        cfg = {"keep": keep if keep in ("first", "last") else {keep: "score"},
               "max_invalid_fraction": 1.0, "tuning": {
                   "chunk_rows": int(rng.choice([5, 64, 65536])),
                   "unit_rows": int(rng.choice([17, 262144])),
                   "shards": int(rng.choice([1, 3, 16]))}}
        case["tuning"] = cfg["tuning"]
        if spec is not None:
            cfg["near"] = {"metric": spec.metric, "grouping": spec.grouping, "mode": mode,
                           "single_index_rows": spec.single_index_rows,
                           "partition_rows": spec.partition_rows,
                           "recall_sample": int(rng.choice([0, 50])), "nonfinite": nonfinite,
                           **(dict(atol=spec.atol, rtol=spec.rtol) if spec.metric == "allclose"
                              else dict(threshold=spec.threshold))}
        prot: list[tuple[str, np.ndarray, str]] = []
        if use_ref:  # copies and near copies of input records, fresh ones, copies within
            m = int(rng.integers(1, 60))
            ref = x[rng.integers(0, n, m)].astype(np.float64)
            near_ = rng.random(m) < 0.4
            ref[near_] += rng.standard_normal((near_.sum(), d)) * 1e-3 * (
                np.nanmean(np.abs(ref)) + 1e-6)
            fresh = rng.random(m) < 0.3
            xf = x.astype(np.float64)[np.isfinite(x).all(1)]
            scale = float(np.abs(xf).mean()) if xf.size else 1.0
            ref[fresh] = rng.standard_normal((fresh.sum(), d)) * scale
            ref = (ref if x.dtype.kind == "f" else np.clip(np.round(ref), 0, 3)).astype(x.dtype)
            ref = np.concatenate([ref, ref[rng.integers(0, m, int(rng.integers(0, 3)))]])
            ref_fmts = ["hdf5", fmt] + ([] if x.dtype in (np.float16, np.int16) else ["parquet"])
            ref_fmt = str(rng.choice(ref_fmts))
            ref_tf = tf_kind if ref_fmt == "tfrecord" else ""
            ref_ids = [f"ref{j}" for j in range(len(ref))]
            parts = write_set(ref_fmt, ref_tf, work / "ref", ref_ids, ref, np.zeros(len(ref)),
                              int(rng.integers(1, 3)), rng)
            prot = [(ref_ids[j], ref[j], "reference") for p in parts for j in p]
            cfg["reference"] = input_config(ref_fmt, ref_tf, work / "ref", d, x.dtype)
            case["reference_format"] = ref_fmt
        runs = [np.arange(n)]
        if use_store:
            cut = int(rng.integers(1, n))
            runs = [np.arange(cut), np.arange(cut, n)]
            cfg["store"] = {"path": str(work / "store")}
        problems = []
        for k, rows in enumerate(runs):
            ids = [f"r{i}" for i in rows]
            folder = work / f"in{k}"
            files = write_set(fmt, tf_kind, folder, ids, x[rows], score[rows],
                              int(rng.integers(1, 4)), rng)
            out = work / f"out{k}"
            job = {**cfg, "input": input_config(fmt, tf_kind, folder, d, x.dtype),
                   "output": {"path": str(out / "clean")}, "report": str(out / "report"),
                   "run_id": f"run{k}"}
            s = run_job(job, quiet=True)
            if runner is not None:  # the same job on the other runner, its own store
                other = work / f"out{k}-{runner['name']}"
                t = run_job({**job, "runner": runner, "output": {"path": str(other / "clean")},
                             "report": str(other / "report"),
                             **({"store": {"path": str(work / "store-other")}}
                                if use_store else {})}, quiet=True)
                problems += [[f"run {k} on {runner['name']}", *p]
                             for p in same_as_local(out, other, s, t)]
                stats.update([f"runner={runner['name']}"])
            dup = pq.read_table(out / "report" / "duplicates.parquet").to_pylist()
            got = {r["record_id"]: (r["kind"], r["duplicate_of"]) for r in dup}
            stats.update(f"removed {kind}" for kind, _ in got.values())
            ok = np.isfinite(x[rows]).all(1) | (nonfinite == "keep")
            invalid = [i for i, o in zip(ids, ok, strict=True) if not o]
            want, root, tier, values = oracle([i for i, o in zip(ids, ok, strict=True) if o],
                                              x[rows][ok], score[rows][ok], keep, prot, spec)
            values.update(zip(ids, x[rows], strict=True))
            kept_ids = [i for i in ids if i not in got and i not in invalid]
            bad = set(pq.read_table(out / "report" / "invalid.parquet")["record_id"].to_pylist())
            if bad != set(invalid):
                problems.append([f"run {k}: invalid ids", sorted(bad ^ set(invalid))[:5]])
            shards = [read_file(fmt, tf_kind, out / "clean" / f"part-{f}.{EXT[fmt]}", x.dtype, d,
                                [i for i in kept_ids if i.startswith(
                                    f"{folder / f'part-{f}.{EXT[fmt]}'}:")])
                      for f in range(len(files))
                      if (out / "clean" / f"part-{f}.{EXT[fmt]}").exists()]
            clean = [c for got_ids, got_x in shards for c in zip(got_ids, got_x, strict=True)]
            summary = s.summary
            if use_ref and summary.get("reference", {}).get("read") != len(prot) - sum(
                    t == "store" for *_, t in prot):
                problems.append([f"run {k}: reference read", summary.get("reference")])
            problems += [[f"run {k}", *p] for p in check_run(
                got, summary, want, root, tier, values, spec, mode, clean, kept_ids, invalid)]
            if problems:
                break  # the next run's store: the records this run kept
            kept = set(kept_ids)
            prot = prot + [(i, t, "store") for i, t in zip(ids, x[rows], strict=True) if i in kept]
        return case, problems
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:1000", help="first:last (last excluded)")
    ap.add_argument("--minutes", type=float, default=10.0, help="stop after this long")
    ap.add_argument("--runner", choices=["dask", "portable"],
                    help="also run each job on this runner and compare the bytes")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        runner = other_runner(stack, args.runner)
        fuzz_seeds("job", args.seeds, args.minutes,
                   lambda seed, stats: run_case(seed, stats, runner))

if __name__ == "__main__":
    main()
