"""Real photographs (scikit-image's bundled samples) cut into distinct crops, and encoded
images written the way users' datasets are: TFRecord by TensorFlow, Parquet as Hugging
Face ``datasets`` stores ``Image()`` (``struct<bytes, path>``), HDF5 vlen uint8."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry")
HF_IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def photos() -> list[np.ndarray]:
    import skimage.data

    return [getattr(skimage.data, name)() for name in PHOTOS]


def crops(n: int, h: int = 48, w: int = 64, seed: int = 0) -> list[np.ndarray]:
    """``n`` distinct crops of the photos at random places (distinct: no two equal)."""
    rng = np.random.default_rng(seed)
    pics, out, seen = photos(), [], set()
    while len(out) < n:
        p = pics[rng.integers(len(pics))]
        y, x = rng.integers(p.shape[0] - h), rng.integers(p.shape[1] - w)
        c = np.ascontiguousarray(p[y:y + h, x:x + w])
        if c.tobytes() not in seen:
            seen.add(c.tobytes())
            out.append(c)
    return out


def encode(img: np.ndarray, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, fmt, **kw)
    return buf.getvalue()


def tf_jpeg(img: np.ndarray, quality: int = 95) -> bytes:
    import tensorflow as tf

    return tf.io.encode_jpeg(img, quality=quality).numpy()


def write_tfrecord(path: Path, encoded: list[bytes], ids: list[str] | None = None) -> list[bytes]:
    """tf.train.Examples in the TF object-detection layout, written by TensorFlow; returns
    the serialized records (to compare clean shards byte for byte)."""
    import tensorflow as tf

    def b(v: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))

    records = []
    for i, data in enumerate(encoded):
        feats = {"image/encoded": b(data), "image/format": b(b"jpeg"),
                 "image/object/class/label": tf.train.Feature(
                     int64_list=tf.train.Int64List(value=[i % 7]))}
        if ids is not None:
            feats["image/source_id"] = b(ids[i].encode())
        records.append(tf.train.Example(features=tf.train.Features(feature=feats))
                       .SerializeToString())
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)
    return records


def read_tfrecord(path: Path) -> list[bytes]:
    import tensorflow as tf

    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def write_hf_parquet(path: Path, rows: list[dict], **kw) -> pa.Table:
    """Parquet as ``datasets`` writes an ``Image()`` column: struct<bytes, path> with the
    features in the schema's "huggingface" metadata."""
    features = {"image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}}
    table = pa.table({"image": pa.array([r["image"] for r in rows], HF_IMAGE),
                      "label": pa.array([r["label"] for r in rows], pa.int64())})
    table = table.replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=kw.get("row_group_size", 16))
    return table
