"""Helpers for end-to-end job tests: write inputs with the real writers, read outputs
back with the real readers, run the CLI in-process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.run import main

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
EXT = {"parquet": "parquet", "tfrecord": "tfrecord", "hdf5": "h5", "arrow": "arrow"}


def interruptible() -> None:
    """``Popen(preexec_fn=interruptible)``: SIGINT back to its default in the child. A test
    run started in the background by a non-interactive shell (``pytest &`` in a script)
    ignores SIGINT, its children inherit that, and a test's Ctrl-C never reaches them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def write_input(fmt: str, path: Path, ids: list[str], tensors: np.ndarray,
                label: np.ndarray, **kw) -> None:
    """One input file holding ``tensors`` (first axis = records) with ids and a label."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("parquet", "arrow"):
        flat = pa.array(tensors.reshape(-1))
        col = flat
        for d in reversed(tensors.shape[1:]):
            col = pa.FixedSizeListArray.from_arrays(col, d)
        table = pa.table({"id": ids, "emb": col, "label": label})
        if fmt == "arrow":  # a stream of small batches, as Hugging Face datasets saves
            with pa.ipc.new_stream(str(path), table.schema) as w:
                for batch in table.to_batches(max_chunksize=kw.get("row_group_size", 64)):
                    w.write_batch(batch)
            return
        pq.write_table(table, path, row_group_size=kw.get("row_group_size", 64),
                       compression=kw.get("compression", "snappy"))
    elif fmt == "tfrecord":
        import tensorflow as tf

        opts = tf.io.TFRecordOptions(compression_type=kw.get("compression", ""))
        with tf.io.TFRecordWriter(str(path), options=opts) as w:
            for i, t, lab in zip(ids, tensors, label, strict=True):
                if tensors.dtype == np.float32:
                    emb = tf.train.Feature(float_list=tf.train.FloatList(value=t.reshape(-1)))
                else:
                    emb = tf.train.Feature(int64_list=tf.train.Int64List(value=t.reshape(-1)))
                feat = {"id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[i.encode()])),
                        "emb": emb,
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[lab]))}
                w.write(tf.train.Example(features=tf.train.Features(feature=feat))
                        .SerializeToString())
    else:
        with h5py.File(path, "w") as h:
            h.create_dataset("emb", data=tensors, chunks=(16, *tensors.shape[1:]),
                             compression="gzip")
            h.create_dataset("id", data=[i.encode() for i in ids])
            h.create_dataset("label", data=label)
            h.attrs["note"] = "kept"


def read_output(fmt: str, path: Path, shape: tuple[int, ...], dtype=np.float32
                ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids, tensors, labels) of a clean shard, read with the standard reader."""
    if fmt in ("parquet", "arrow"):
        t = pq.read_table(path) if fmt == "parquet" else pa.ipc.open_stream(
            pa.memory_map(str(path))).read_all()
        flat = t.column("emb").combine_chunks()
        for _ in shape:
            flat = flat.flatten()
        return (t.column("id").to_pylist(), flat.to_numpy().reshape(-1, *shape),
                t.column("label").to_numpy())
    if fmt == "tfrecord":
        import tensorflow as tf

        kind = tf.float32 if dtype == np.float32 else tf.int64
        spec = {"id": tf.io.FixedLenFeature([], tf.string),
                "emb": tf.io.FixedLenFeature(list(shape), kind),
                "label": tf.io.FixedLenFeature([], tf.int64)}
        comp = "GZIP" if open(path, "rb").read(2) == b"\x1f\x8b" else ""
        rows = [tf.io.parse_single_example(r, spec)
                for r in tf.data.TFRecordDataset(str(path), compression_type=comp)]
        return ([r["id"].numpy().decode() for r in rows],
                np.array([r["emb"].numpy() for r in rows]).reshape(-1, *shape),
                np.array([r["label"].numpy() for r in rows]))
    with h5py.File(path, "r") as h:
        return ([b.decode() for b in h["id"][:]], h["emb"][:], h["label"][:])


def run_job(tmp_path: Path, fmt: str, input_glob: str, *sets: str, args: tuple = (),
            **overrides) -> int:
    """Run ``python -m pipeline.run`` in-process with a config for ``input_glob`` (``args``:
    more command-line arguments, e.g. ``("--dry-run",)``)."""
    cfg = {"input": {"format": fmt, "path": input_glob, "tensor": "emb", "id": "id",
                     **overrides.pop("input", {})},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), **overrides}
    cfg_path = tmp_path / "job.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return main(["--config", str(cfg_path), "--quiet", *args,
                 *[a for s in sets for a in ("--set", s)]])


def report(tmp_path: Path) -> tuple[pa.Table, pa.Table]:
    r = tmp_path / "out" / "report"
    return pq.read_table(r / "duplicates.parquet"), pq.read_table(r / "invalid.parquet")


def tagged_processes(tag: str) -> list[int]:
    """Processes other than this one whose environment carries ``tag``: the services and
    the SDK workers inherit it (the test sets it before the run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if tag.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                pass
    return found


def assert_clean(tag: str, tmp: Path) -> None:
    assert tagged_processes(tag) == []
    assert list(tmp.iterdir()) == []
