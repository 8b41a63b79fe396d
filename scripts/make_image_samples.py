"""Write the small image datasets the README's "Deduplicate an image dataset" runs on.

Tiles of scikit-image's bundled photographs (non-overlapping 48 x 64 crops: distinct
pictures), stored as users store them:

- ``data/images/tfrecord/train.tfrecord``: ``tf.train.Example``s in the TF object
  detection layout (``image/encoded`` JPEG by ``tf.io.encode_jpeg``, ``image/source_id``,
  ``image/format``, a label), written by TensorFlow: 40 tiles, 5 byte-identical copies,
  3 re-encodes at JPEG quality 70 and 2 copies resized by a pixel (near copies);
- ``data/images/hf/train-00000-of-00001.parquet``: a Hugging Face ``datasets`` ``Image()``
  column (``struct<bytes: binary, path: string>``): 30 tiles, 3 exact copies, the same
  pixels as a PNG (an exact copy in another container), 2 re-encodes at quality 75, and
  one row holding only a path (``extra/tile.png``, read relative to the Parquet file).

The planted counts go to ``data/images/EXPECTED.json``. Usage:
``python scripts/make_image_samples.py [--out data/images]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
TILE = (48, 64)


def tiles(n: int) -> list[np.ndarray]:
    """``n`` non-overlapping tiles of the bundled photographs with some texture (flat
    tiles of sky or background are near-identical pictures), in a fixed order."""
    import skimage.data

    out = []
    for name in ("astronaut", "coffee", "chelsea", "rocket"):
        photo = getattr(skimage.data, name)()
        h, w = TILE
        out += [t for y in range(0, photo.shape[0] - h + 1, h)
                for x in range(0, photo.shape[1] - w + 1, w)
                if (t := photo[y:y + h, x:x + w]).std() > 25]  # no flat sky or background
    rng = np.random.default_rng(5)
    return [np.ascontiguousarray(out[i]) for i in rng.choice(len(out), n, replace=False)]


def encode(img: np.ndarray, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, fmt, **kw)
    return buf.getvalue()


def nudged(img: np.ndarray) -> np.ndarray:
    """The tile resized by one pixel each way (a near copy at another size)."""
    h, w = img.shape[:2]
    return np.asarray(Image.fromarray(img).resize((w + 1, h + 1), Image.Resampling.BILINEAR))


def write_tfrecord(path: Path, pics: list[np.ndarray]) -> dict:
    import tensorflow as tf

    values = [tf.io.encode_jpeg(p, quality=90).numpy() for p in pics]
    values += [values[i] for i in (1, 4, 9, 9, 22)]  # exact: the same file stored again
    values += [tf.io.encode_jpeg(pics[i], quality=70).numpy() for i in (2, 13, 30)]
    values += [tf.io.encode_jpeg(nudged(pics[i]), quality=90).numpy() for i in (5, 17)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as w:
        for i, v in enumerate(values):
            feats = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[v])),
                     "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(
                         value=[b"jpeg"])),
                     "image/source_id": tf.train.Feature(bytes_list=tf.train.BytesList(
                         value=[f"img-{i:03d}".encode()])),
                     "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(
                         value=[i % 5]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feats))
                    .SerializeToString())
    return {"read": len(values), "exact": 5, "near": 5}


def write_hf(folder: Path, pics: list[np.ndarray]) -> dict:
    rows = [{"bytes": encode(p, quality=90), "path": f"tile-{i}.jpg"} for i, p in enumerate(pics)]
    rows += [dict(rows[i]) for i in (0, 7, 7)]
    decoded = np.asarray(Image.open(io.BytesIO(rows[11]["bytes"])))  # same pixels, as PNG
    rows.append({"bytes": encode(decoded, "PNG"), "path": "tile-11.png"})
    rows += [{"bytes": encode(pics[i], quality=75), "path": f"tile-{i}-q75.jpg"} for i in (3, 20)]
    (folder / "extra").mkdir(parents=True, exist_ok=True)
    extra = tiles(len(pics) + 1)[-1]
    Image.fromarray(extra).save(folder / "extra" / "tile.png")
    rows.append({"bytes": None, "path": "extra/tile.png"})
    features = {"image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}}
    table = pa.table({"image": pa.array(rows, pa.struct([("bytes", pa.binary()),
                                                         ("path", pa.string())])),
                      "label": pa.array([i % 3 for i in range(len(rows))], pa.int64())})
    table = table.replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, folder / "train-00000-of-00001.parquet", row_group_size=16)
    return {"read": len(rows), "exact": 4, "near": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/images")
    out = Path(ap.parse_args().out)
    pics = tiles(71)
    expected = {"tfrecord": write_tfrecord(out / "tfrecord" / "train.tfrecord", pics[:40]),
                "hf": write_hf(out / "hf", pics[40:70])}
    (out / "EXPECTED.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected))


if __name__ == "__main__":
    main()
