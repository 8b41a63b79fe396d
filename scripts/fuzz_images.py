"""Differential fuzz of the whole job (``run_job``) with ``input.decode: image`` against an
oracle that decodes with Pillow on its own, by docs/images.md.

Each seed: 3-8 small pictures (8..64 px a side: noise, gradients, flat colours, photo
crops; RGB, grey, RGBA) in 20-120 records: PNGs with other metadata or compression, byte
copies, BMP, WebP, JPEG (also CMYK) at several qualities, GIF, palette, LA, RGBA flattened
on white, EXIF-oriented copies stored transposed, 16-bit PNGs, tRNS colour keys, resized
or brightened near copies, truncated files, empty bytes, TIFF, junk; as TFRecord Examples,
Hugging Face Parquet (``struct<bytes, path>``: also path-only rows, the file beside the
Parquet file or missing, null rows) or a binary column, 1-3 files, optional id and label;
random keep, channels, resize, exact_on (pixels | bytes), near (l2 or correlation, mode
exact | auto) and chunk sizes.

Oracle: Pillow opens JPEG/PNG/GIF/BMP/WebP (first frame); 16-bit samples become
round(v * 255 / 65535) (16-bit RGB/LA PNGs read by tf.io.decode_png: Pillow keeps their
high byte); anything transparent (alpha, palette or colour key) on white; grey stays
grey, the rest RGB, or ``channels``; EXIF orientation applied with numpy. Expected:
invalid = what it cannot decode; exact = all but the first of each (shape, pixels) group
in keep order, naming it (exact_on bytes: of each group of equal stored bytes, a picture
of one colour by its whole pixels instead, and a JPEG is drafted with Pillow's ``draft``
to the smallest scale at least ``resize`` as shown);
near (representative): survivors in keep order removed when within T of a kept one,
naming the nearest (l2: T^2 = k + 1/2 over integer squared distances, k often one that
occurs; correlation: 1 - r of each channel centred, T halfway between two that occur;
mode exact: exactly those, auto: each within T of a kept one);
the summary's counts; clean shards hold the kept rows in input order byte for byte.

Usage: python scripts/fuzz_images.py --seeds 0:100 --minutes 10 [--skip VARIANT,...]
"""

from __future__ import annotations

import argparse
import collections
import functools
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from benchkit import fuzz_seeds
from fuzz_images_oracle import ORIENT, distance, oracle, oracle_decode, shrink
from PIL import Image, PngImagePlugin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
UNDO = {6: 8, 8: 6}  # the others are their own inverse
HF = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
VARIANTS = {"png": 4, "copy": 5, "meta": 3, "bmp": 2, "webp": 1, "jpeg": 4, "cmyk": 1,
            "exif": 3, "palette": 2, "gif": 1, "flat": 2, "la": 1, "grey16": 1, "rgb16": 1,
            "trns": 1, "near": 3, "trunc": 1, "empty": 1, "tiff": 1, "junk": 1, "path": 2,
            "missing": 1, "null": 1, "nofeature": 1}
ONLY = {"path": ("hf",), "missing": ("hf",), "null": ("hf", "binary"), "nofeature": ("tfrecord",)}


@functools.cache
def photos() -> list[np.ndarray]:
    try:
        import skimage.data as d
    except ImportError:
        return []
    return [d.astronaut(), d.chelsea(), d.coffee(), d.camera(), d.rocket()]


def picture(rng: np.random.Generator) -> np.ndarray:
    """Noise, a gradient, a flat colour or a photo crop; RGB, grey (2-D) or RGBA."""
    h, w = (int(v) for v in rng.integers(8, 65, 2))
    kind, ph = rng.choice(["noise", "gradient", "photo", "flat"], p=[.25, .3, .35, .1]), photos()
    if kind == "photo" and ph:
        p = ph[rng.integers(len(ph))]
        y, x = rng.integers(p.shape[0] - h), rng.integers(p.shape[1] - w)
        a = np.atleast_3d(p[y:y + h, x:x + w])[..., [0, 0, 0] if p.ndim == 2 else [0, 1, 2]]
    elif kind == "noise":
        a = rng.integers(0, 256, (h, w, 3))
    else:
        t = np.add.outer(np.linspace(0, rng.random(), h), np.linspace(0, rng.random(), w))
        c0, c1 = rng.integers(0, 256, (2, 3))
        a = c0 + (c1 - c0) * (t[..., None] / max(t.max(), 1e-9)) * (kind == "gradient")
    a, r = np.asarray(a, np.uint8), rng.random()
    if r < 0.35:  # RGBA with opaque, transparent and partly transparent pixels
        alpha = rng.choice([0, 255, 255, int(rng.integers(256))], (h, w)).astype(np.uint8)
        return np.dstack([a, alpha])
    return np.ascontiguousarray(a[..., 1] if r > 0.8 else a)


def enc(a: np.ndarray | Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    (a if isinstance(a, Image.Image) else Image.fromarray(a)).save(buf, fmt, **kw)
    return buf.getvalue()


def rgb(a: np.ndarray) -> np.ndarray:
    return a if a.ndim == 2 else np.ascontiguousarray(a[..., :3])


def variant(kind: str, rng: np.random.Generator, pics: list, done: list[bytes]) -> bytes:
    p = pics[rng.integers(len(pics))]
    if kind == "copy" and done:
        return done[rng.integers(len(done))]
    if kind == "meta":
        (info := PngImagePlugin.PngInfo()).add_text("Comment", f"copy {rng.integers(1000)}")
        return enc(p, "PNG", pnginfo=info, compress_level=int(rng.integers(0, 10)))
    if kind == "gif" and rng.random() < 0.5:  # two frames: the first is the picture
        return enc(Image.fromarray(rgb(p)), "GIF", save_all=True,
                   append_images=[Image.fromarray(255 - rgb(p))])
    if kind in ("bmp", "webp", "gif", "tiff"):
        return enc(p, kind.upper(), **({"lossless": rng.random() < 0.7} if kind == "webp" else {}))
    if kind in ("jpeg", "cmyk"):
        im = Image.fromarray(rgb(p))
        return enc(im.convert("CMYK") if kind == "cmyk" else im, "JPEG",
                   quality=int(rng.integers(40, 101)))
    if kind == "exif":  # stored so that the tag turns it back (JPEG: near, not exact)
        o, exif, jpeg = int(rng.integers(1, 9)), Image.Exif(), rng.random() < 0.3
        exif[0x0112] = o
        stored = np.ascontiguousarray(ORIENT[UNDO.get(o, o)](p) if o > 1 else p)
        return enc(rgb(stored) if jpeg else stored, "JPEG" if jpeg else "PNG",
                   exif=exif.tobytes())
    if kind == "palette":
        im = Image.fromarray(rgb(p)).convert("RGB").quantize(int(rng.integers(2, 64)))
        return enc(im, "PNG", **({"transparency": 0} if rng.random() < 0.5 else {}))
    if kind == "flat":  # an RGBA picture as shown: on white, stored without alpha
        return enc(Image.alpha_composite(Image.new("RGBA", (p.shape[1], p.shape[0]), "white"),
                                         Image.fromarray(p).convert("RGBA")).convert("RGB"), "PNG")
    if kind == "la":
        return enc(Image.fromarray(p).convert("LA"), "PNG")
    if kind in ("grey16", "rgb16"):  # v * 257 + d, |d| <= 128: per the docs the 8-bit picture
        a = p if kind == "rgb16" else rgb(p) if p.ndim == 2 else rgb(p)[..., 1]
        v = np.clip(a.astype(np.int64) * 257 + rng.integers(-128, 129, a.shape), 0, 65535)
        v = v.astype(np.uint16)
        if kind == "grey16":
            return enc(Image.fromarray(v), "PNG")
        import tensorflow as tf  # Pillow writes no 16-bit RGB

        v = np.atleast_3d(v)
        return tf.io.encode_png(v[..., [0, 3]] if v.shape[2] == 4 and rng.random() < 0.4
                                else v).numpy()  # RGB, RGBA or LA
    if kind == "trns":  # a colour key: pixels of the top-left pixel's colour are transparent
        a = rgb(p)
        return enc(a, "PNG", transparency=a[0, 0].item() if a.ndim == 2 else tuple(
            a[0, 0].tolist()))
    if kind == "near":  # resized by a pixel or two, or brighter or darker
        im, (dh, dw) = Image.fromarray(p), rng.integers(-2, 3, 2)
        return enc(im.resize((max(8, im.width + dw), max(8, im.height + dh)),
                             Image.Resampling.BILINEAR) if rng.random() < 0.5 else
                   np.clip(p.astype(int) + int(rng.integers(-6, 7)), 0, 255).astype(np.uint8),
                   "PNG")
    if kind == "trunc":
        good = variant(str(rng.choice(["png", "jpeg", "gif", "webp", "bmp"])), rng, pics, done)
        return good[:rng.integers(1, len(good))]
    if kind in ("junk", "empty"):
        return rng.bytes(int(rng.integers(1, 200)) * (kind == "junk"))
    return enc(p, "PNG", compress_level=int(rng.integers(0, 10)))  # png, copy of nothing


def write(fmt: str, path: Path, recs: list[dict], ids: list[str], opts: dict):
    """The file; returns what its clean copy is compared with (Examples or the table)."""
    if fmt == "tfrecord":
        import tensorflow as tf

        t = tf.train
        b = lambda v: t.Feature(bytes_list=t.BytesList(value=[v]))  # noqa: E731
        rows = [t.Example(features=t.Features(feature={
            **({} if r["data"] is None else {"image/encoded": b(r["data"])}),
            **({"image/source_id": b(i.encode())} if opts["id"] else {}),
            **({"image/object/class/label": t.Feature(int64_list=t.Int64List(
                value=[r["label"]]))} if opts["label"] else {})})).SerializeToString()
            for r, i in zip(recs, ids, strict=True)]
        with tf.io.TFRecordWriter(str(path)) as w:
            for row in rows:
                w.write(row)
        return rows
    cols = {"id": pa.array(ids)} if opts["id"] else {}
    cols["image"] = pa.array([None if r["kind"] == "null" else {"bytes": r["data"], "path": r[
        "path"]} for r in recs], HF) if fmt == "hf" else pa.array([r["data"] for r in recs],
                                                                  pa.binary())
    cols.update({"label": pa.array([r["label"] for r in recs], pa.int64())} if opts["label"]
                else {})
    table = pa.table(cols).replace_schema_metadata({"huggingface": json.dumps(
        {"info": {"features": {"image": {"_type": "Image"}}}})} if fmt == "hf" else None)
    pq.write_table(table, path, row_group_size=opts["row_group"])
    return table


def make_case(seed: int, skip: set[str], work: Path) -> dict:
    """The records, written under ``work/in``, and the job's config."""
    rng = np.random.default_rng(seed)
    fmt = str(rng.choice(["tfrecord", "hf", "binary"]))
    ext = "tfrecord" if fmt == "tfrecord" else "parquet"
    pics = [picture(rng) for _ in range(int(rng.integers(3, 9)))]
    kinds = [k for k in VARIANTS if k not in skip and fmt in ONLY.get(k, (fmt,))]
    weights = np.array([VARIANTS[k] for k in kinds], float)
    n, files = int(rng.integers(20, 121)), int(rng.integers(1, 4))
    sizes = np.diff(np.r_[0, np.sort(rng.integers(0, n + 1, files - 1)), n]).tolist()
    opts = {"id": rng.random() < 0.7, "label": rng.random() < 0.5,
            "row_group": int(rng.integers(3, 64))}
    (work / "in" / "img").mkdir(parents=True)
    recs, ids, stored, done = [], [], [], []
    for f, size in enumerate(sizes):
        path, first = work / "in" / f"part-{f}.{ext}", len(recs)
        for j in range(size):  # each file starts with a good image (checked before work)
            kind = "png" if j == 0 else str(rng.choice(kinds, p=weights / weights.sum()))
            r = {"kind": kind, "file": f, "pos": j, "label": int(rng.integers(10)), "path": None}
            r["data"] = r["truth"] = None if kind in ("null", "nofeature", "missing") else \
                variant("png" if kind == "path" else kind, rng, pics, done)
            if kind in ("path", "missing"):  # a file beside the Parquet file, or none
                name = work / "in" / str(rng.choice(["", "img"])) / f"{len(recs)}.png"
                r["path"] = str(name) if rng.random() < 0.3 else str(name.relative_to(path.parent))
                if kind == "path":
                    name.write_bytes(r["data"])
                r["data"] = None
            elif fmt == "hf" and rng.random() < 0.3:  # bytes win over a path
                r["path"] = f"elsewhere/{len(recs)}.png"
            done += [r["data"]] if r["data"] else []
            recs.append(r)
            ids.append(f"img{len(recs) - 1}" if opts["id"] else f"{path}:{j}")
        stored.append(write(fmt, path, recs[first:], ids[first:], opts))
    resize = [int(v) for v in rng.integers(4, 33, 2)] if rng.random() < 0.65 else None
    keep, channels = str(rng.choice(["first", "last"])), [None, 1, 3][rng.integers(3)]
    cfg = {"input": {"format": ext, "path": str(work / "in" / f"*.{ext}"), "decode": "image",
                     "tensor": "image/encoded" if fmt == "tfrecord" else "image",
                     **({"id": "image/source_id" if fmt == "tfrecord" else "id"}
                        if opts["id"] else {}),
                     **({"channels": channels} if channels else {}),
                     **({"resize": resize} if resize else {}),
                     **({"exact_on": "bytes"} if rng.random() < 0.35 else {})},
           "keep": keep, "max_invalid_fraction": 1.0,
           "output": {"path": str(work / "out" / "clean")}, "report": str(work / "report"),
           "tuning": {"chunk_rows": int(rng.choice([1, 3, 65536])),
                      "decoded_chunk_bytes": int(rng.choice([1, 3000, 64 << 20]))}}
    return {"fmt": fmt, "ext": ext, "sizes": sizes, "recs": recs, "ids": ids, "rng": rng,
            "stored": stored, "opts": opts, "cfg": cfg, "keep": keep}


def pick_k(rng: np.random.Generator, small: dict) -> int:
    """Within: squared l2 <= k. Often a squared distance that occurs (or one less), so
    that decisions fall right beside the threshold; else RMS 0..10 per value."""
    x = np.stack(list(small.values()))
    sq = (x * x).sum(1)
    d2 = (sq[:, None] + sq[None] - 2 * x @ x.T)[np.triu_indices(len(x), 1)]  # exact: integers
    d2 = d2[d2 > 0]
    if len(d2) and rng.random() < 0.6:
        return int(rng.choice(d2)) - int(rng.integers(0, 2))
    return int(rng.integers(0, 21) ** 2 * x.shape[1] // 4)


def pick_t(rng: np.random.Generator, small: dict, channels: int) -> float:
    """Correlation: a threshold halfway between two 1 - r that occur (no pair sits on
    it, whatever the last bits of either computation), else 0.001..0.3."""
    x = list(small.values())
    d = sorted({distance(a, b, "correlation", channels) for i, a in enumerate(x)
                for b in x[i + 1:]} - {np.inf})
    gaps = [(lo + hi) / 2 for lo, hi in zip(d, d[1:], strict=False) if hi - lo > 1e-9]
    if gaps and rng.random() < 0.6:
        return float(rng.choice(gaps))
    return float(10 ** rng.uniform(-3, np.log10(0.3)))


def _flat_pixels(data: bytes, shown: np.ndarray, channels: int | None) -> tuple | None:
    """exact_on bytes: a picture of one colour (as shown, and decoded whole) is compared
    by its whole pixels, as without the setting (docs/images.md); None for the others."""
    one = lambda a: bool((a.reshape(-1, a.shape[-1]) == a.reshape(-1, a.shape[-1])[:1]).all())  # noqa: E731
    if not one(shown):
        return None
    whole = oracle_decode(data, channels)
    return (whole.shape, whole.tobytes()) if one(whole) else None


def run_case(seed: int, stats: collections.Counter, skip: set[str]) -> tuple[dict, list]:
    from pipeline import run_job

    work = Path(tempfile.mkdtemp(prefix="fuzz-images-"))
    try:
        c = make_case(seed, skip, work)
        cfg, recs, ids, at = c["cfg"], c["recs"], c["ids"], {i: n for n, i in enumerate(c["ids"])}
        resize, channels, rng = cfg["input"].get("resize"), cfg["input"].get("channels"), c["rng"]
        by_bytes = cfg["input"].get("exact_on") == "bytes"
        full = [oracle_decode(r["truth"], channels or (3 if resize else None),
                              resize if by_bytes else None) for r in recs]
        small = {i: shrink(a, resize) for i, a in enumerate(full) if a is not None and resize}
        same = [None if a is None else (a.shape, a.tobytes()) if not by_bytes
                else _flat_pixels(r["truth"], a, channels or (3 if resize else None))
                or r["truth"] for r, a in zip(recs, full, strict=True)]
        c["k"] = k = pick_k(rng, small) if resize and rng.random() < 0.8 else None
        c["metric"] = "correlation" if k is not None and rng.random() < 0.4 else "l2"
        c["channels"] = channels or 3
        if c["metric"] == "correlation":
            c["k"] = k = pick_t(rng, small, c["channels"])
        if k is not None:
            cfg["near"] = {"metric": c["metric"], "threshold": k if c["metric"] != "l2"
                           else float(np.sqrt(k + 0.5)),
                           "mode": str(rng.choice(["exact", "exact", "auto"]))}
        mode = cfg.get("near", {}).get("mode", "off")
        case = {"seed": seed, "format": c["fmt"], "sizes": c["sizes"], "keep": c["keep"],
                "channels": channels, "resize": resize, "near": mode, "near_k": k,
                "metric": c["metric"],
                "exact_on": "bytes" if by_bytes else "pixels",
                "opts": c["opts"], "tuning": cfg["tuning"]}
        want = oracle(ids, same, c["keep"], small, k, c["metric"], c["channels"])
        invalid = {ids[i] for i, a in enumerate(full) if a is None}
        problems = check(work, c, run_job(cfg, quiet=True).summary, want, invalid, small, at)
        stats.update([f"format={c['fmt']}", f"keep={c['keep']}", f"near={mode}",
                      f"metric={c['metric'] if k is not None else None}",
                      f"exact_on={case['exact_on']}",
                      f"channels={channels}", f"resize={bool(resize)}"]
                     + [f"v.{r['kind']}" for r in recs]
                     + [f"invalid.{recs[at[i]]['kind']}" for i in invalid]
                     + [f"removed {kind}" for kind, _ in want.values()]
                     + ["exact across containers"] * sum(
                         recs[at[r]]["truth"] != recs[at[d]]["truth"]
                         for r, (kind, d) in want.items() if kind == "exact"))
        return case, problems
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check(work: Path, c: dict, s: dict, want: dict, invalid: set, small: dict, at: dict
          ) -> list:
    recs, k = c["recs"], c["k"]
    named = lambda v: v and [*v, recs[at[v[1]]]["kind"]]  # noqa: E731 - with its variant
    dup = pq.read_table(work / "report" / "duplicates.parquet").to_pylist()
    got = {r["record_id"]: (r["kind"], r["duplicate_of"]) for r in dup}
    problems = [[f"{kind} differs (got, oracle)", r, recs[at[r]]["kind"], named(got.get(r)),
                 named(want.get(r))] for kind in ("exact", "near")
                for r in sorted(got.keys() | want.keys())
                if (kind == "exact" or c["cfg"].get("near", {}).get("mode") == "exact")
                and kind in (got.get(r, ("",))[0], want.get(r, ("",))[0])
                and got.get(r) != want.get(r)][:8]
    bad = pq.read_table(work / "report" / "invalid.parquet").to_pylist()
    if (got_bad := {b["record_id"] for b in bad}) != invalid or not all(b["reason"] for b in bad):
        problems.append(["invalid (got only, oracle only)", *[[(i, recs[at[i]]["kind"]) for i in
                                                               sorted(a - b)][:6] for a, b in (
            (got_bad, invalid), (invalid, got_bad))]])
    for row in dup:
        r, kind, d = row["record_id"], row["kind"], row["duplicate_of"]
        if kind == "near" and (k is None or want.get(r, ("",))[0] == "exact" or d in got
                               or at.get(r) not in small or at.get(d) not in small
                               or distance(small[at[r]], small[at[d]], c["metric"],
                                           c["channels"]) > k):
            problems.append(["near removal not within T of a kept survivor", r, d,
                             recs[at[r]]["kind"], recs[at.get(d, r)]["kind"]])
            continue
        dist = 0.0 if kind == "exact" else distance(small[at[r]], small[at[d]], c["metric"],
                                                    c["channels"])
        dist = np.sqrt(dist) if kind != "exact" and c["metric"] == "l2" else dist
        if not np.isclose(row["distance"], dist, rtol=1e-6, atol=1e-9):
            problems.append(["distance (got, oracle)", r, d, recs[at[r]]["kind"],
                             recs[at[d]]["kind"], row["distance"], float(dist)])
    counts = dict(collections.Counter(kind for kind, _ in got.values()))
    removed = {key[8:]: v for key, v in s.items() if key.startswith("removed_") and v}
    kept = [r for r, i in zip(recs, c["ids"], strict=True) if i not in got and i not in invalid]
    if (removed, s["read"], s["kept"], s["invalid"]) != (counts, len(recs), len(kept),
                                                         len(invalid)):
        problems.append(["summary (removed, read, kept, invalid), want", [
            removed, s["read"], s["kept"], s["invalid"]], [counts, len(recs), len(kept),
                                                           len(invalid)]])
    for f, stored in enumerate(c["stored"]):  # the kept rows, in order, byte for byte
        path, mine = work / "out" / "clean" / f"part-{f}.{c['ext']}", [
            r["pos"] for r in kept if r["file"] == f]
        if c["fmt"] == "tfrecord" and path.exists():
            import tensorflow as tf

            same = [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == [
                stored[j] for j in mine]
        else:
            same = path.exists() and pq.read_table(path).equals(
                stored.take(pa.array(mine, pa.int64())), check_metadata=True)
        if not same:
            problems.append([f"clean part-{f} differs", path.exists(), len(mine)])
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:1000", help="first:last (last excluded)")
    ap.add_argument("--minutes", type=float, default=10.0, help="stop after this long")
    ap.add_argument("--skip", default="", help="variants left out, comma-separated")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    fuzz_seeds("images", args.seeds, args.minutes,
               lambda seed, stats: run_case(seed, stats, skip))

if __name__ == "__main__":
    main()
