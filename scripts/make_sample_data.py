"""Write the sample dataset that configs/dedupe*.yaml run on (small, with known duplicates).

Each format gets 3 files of 1,500 records of 64 float32 values, an ``id``, a
``label`` (and ``score`` in Parquet); NumPy's .npy files hold the values alone.
Planted: 10% exact copies (most of them in another file than their original), and
copies that differ only by -0.0/+0.0 or by NaN payload (still duplicates under the
fingerprint spec); 150 near copies at L2 distance 0.05-0.09 of another record and 50
decoys at 0.11-0.13 (for ``configs/dedupe-near.yaml``, threshold 0.1). The expected
counts, from independent oracles (canonical bytes; all pairs in float64), go to
``EXPECTED.json``; tests check the job against them.
Usage: ``python scripts/make_sample_data.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

FILES, ROWS, DIM = 3, 1500, 64
NEAR_THRESHOLD = 0.1


def make_records(seed: int = 7) -> tuple[np.ndarray, dict]:
    """(values (FILES*ROWS, DIM) float32 in file order, expected counts)."""
    rng = np.random.default_rng(seed)
    n = FILES * ROWS
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    x[rng.choice(n, 40, replace=False), 0] = 0.0  # +0.0 rows: their -0.0 copies are duplicates
    copies = rng.choice(n, n // 10, replace=False)
    sources = np.array([rng.choice(np.setdiff1d(np.arange(n), copies)) for _ in copies])
    x[copies] = x[sources]
    signed = copies[:20]
    x[signed, 0] = np.where(x[signed, 0] == 0.0, -0.0, x[signed, 0])
    nan_rows = copies[20:30]
    x[nan_rows, 1] = np.float32("nan")
    x[sources[20:30], 1] = np.frombuffer(np.uint32(0x7FC0BEEF).tobytes(), np.float32)[0]
    free = rng.permutation(np.setdiff1d(np.arange(n), np.concatenate([copies, sources])))
    for (lo, hi), (targets, origins) in (((0.05, 0.09), (free[:150], free[200:350])),
                                         ((0.11, 0.13), (free[150:200], free[350:400]))):
        u = rng.standard_normal((len(targets), DIM))
        u *= rng.uniform(lo, hi, (len(targets), 1)) / np.linalg.norm(u, axis=1, keepdims=True)
        x[targets] = (x[origins] + u).astype(np.float32)
    unique = len({r.tobytes() for r in _canonical(x)})
    near = _near_removals(x)
    return x, {"read": n, "kept": unique, "removed_exact": n - unique,
               "near": {"metric": "l2", "threshold": NEAR_THRESHOLD, "removed_near": near,
                        "kept": unique - near}}


def _near_removals(x: np.ndarray) -> int:
    """Records removed by representative L2 grouping (keep first) among the exact survivors
    with finite values: all pairs in float64."""
    seen, rows = set(), []
    for r in _canonical(x):
        if r.tobytes() not in seen:
            seen.add(r.tobytes())
            if np.isfinite(r).all():
                rows.append(r.astype(np.float64))
    v = np.array(rows)
    sq = (v * v).sum(axis=1)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * v @ v.T, 0))
    kept: list[int] = []
    removed = 0
    for i in range(len(v)):
        if kept and (d[i, kept] <= NEAR_THRESHOLD).any():
            removed += 1
        else:
            kept.append(i)
    return removed


def _canonical(x: np.ndarray) -> np.ndarray:
    """-0.0 -> 0.0 and one NaN, as the fingerprint spec does (for the expected counts)."""
    c = np.where(x == 0, np.float32(0), x)
    return np.where(np.isnan(c), np.float32("nan"), c)


def write_parquet(out: Path, x: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        rows = x[f * ROWS:(f + 1) * ROWS]
        table = pa.table({
            "id": [f"rec-{f}-{i:04d}" for i in range(ROWS)],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), DIM),
            "label": np.arange(ROWS, dtype=np.int64) % 10,
            "score": np.linspace(0, 1, ROWS),
        })
        pq.write_table(table, out / f"part-{f:05d}.parquet", row_group_size=500)


def write_tfrecord(out: Path, x: np.ndarray) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    out.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        with tf.io.TFRecordWriter(str(out / f"part-{f:05d}.tfrecord")) as w:
            for i in range(ROWS):
                feat = {
                    "id": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[f"rec-{f}-{i:04d}".encode()])),
                    "embedding": tf.train.Feature(float_list=tf.train.FloatList(
                        value=x[f * ROWS + i])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feat))
                        .SerializeToString())


def write_hdf5(out: Path, x: np.ndarray) -> None:
    import h5py

    out.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        with h5py.File(out / f"part-{f:05d}.h5", "w") as h:
            h.create_dataset("embedding", data=x[f * ROWS:(f + 1) * ROWS], chunks=(250, DIM),
                             compression="gzip", shuffle=True)
            h.create_dataset("id", data=[f"rec-{f}-{i:04d}".encode() for i in range(ROWS)])
            h.create_dataset("label", data=np.arange(ROWS) % 10)
            h.attrs["source"] = "tensordedup sample"


def write_npy(out: Path, x: np.ndarray) -> None:
    """The records alone, as np.save writes embeddings (ids are <file>:<row>)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        np.save(out / f"part-{f:05d}.npy", x[f * ROWS:(f + 1) * ROWS])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/sample")
    args = ap.parse_args()
    x, expected = make_records()
    out = Path(args.out)
    write_parquet(out / "parquet", x)
    write_tfrecord(out / "tfrecord", x)
    write_hdf5(out / "hdf5", x)
    write_npy(out / "npy", x)
    (out / "EXPECTED.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(f"wrote {out}: {expected}")


if __name__ == "__main__":
    main()
