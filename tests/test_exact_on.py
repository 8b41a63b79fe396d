"""input.exact_on: bytes: exact dedup on the stored bytes, JPEGs decoded at reduced scale
for the resize (the fast path for photos). Files written by TensorFlow; results against
the default (pixels) run of the same data and a brute-force oracle of the distances."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from pipeline.run import main
from tests.imagekit import crops, encode, read_tfrecord, tf_jpeg, write_tfrecord
from transforms.images import decode_image, open_image

SIZE = (32, 32)


def run(tmp_path: Path, inp: dict, **top) -> int:
    cfg = {"input": inp, "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), **top}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    return main(["--config", str(tmp_path / "job.yaml"), "--quiet", "--overwrite"])


def with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The same JPEG (same coefficients, same pixels) with a COM segment after SOI: what a
    tool that rewrites metadata leaves."""
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def rotated(img: np.ndarray) -> bytes:
    """``img`` stored transposed with EXIF orientation 6 (shown as ``img``)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(np.rot90(img, 1))).save(buf, "JPEG", quality=90,
                                                                  exif=exif.tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, list[bytes], dict[int, str]]:
    """A TFRecord of 240 x 320 JPEGs (TensorFlow's encoder) with planted copies: row ->
    what it is a copy of."""
    tmp = tmp_path_factory.mktemp("exact_on")
    imgs = crops(30, 240, 320, seed=11)
    values = [tf_jpeg(im, 90) for im in imgs]
    planted = {30: "bytes of 4", 31: "bytes of 4", 32: "comment on 7", 33: "PNG of 9's pixels",
               34: "q75 of 12", 35: "EXIF-rotated 15"}
    values += [values[4], values[4], with_comment(values[7], b"edited"),
               encode(decode_image(values[9])[0]), tf_jpeg(imgs[12], 75), rotated(imgs[15])]
    write_tfrecord(tmp / "in" / "train.tfrecord", values)
    return tmp / "in" / "train.tfrecord", values, planted


def job(path: Path, **dec) -> dict:
    return {"format": "tfrecord", "path": str(path), "tensor": "image/encoded",
            "decode": "image", "resize": list(SIZE), **dec}


def removed(tmp_path: Path) -> dict[int, tuple[str, int, float | None]]:
    dups = pq.read_table(tmp_path / "out" / "report" / "duplicates.parquet").to_pylist()
    return {d["row"]: (d["kind"], int(d["duplicate_of"].rsplit(":", 1)[1]), d["distance"])
            for d in dups}


def test_bytes_mode_leaves_other_files_of_one_picture_to_near(tmp_path, dataset):
    """Pixels mode: byte copies, a metadata-only copy and a PNG of the same pixels are all
    exact copies. Bytes mode: only the byte copies are; the others are near copies, the
    metadata-only one at distance 0. Every distance is the oracle's (drafted decode), the
    same records are removed, and the clean shard holds the kept records' bytes."""
    path, values, _ = dataset
    near = {"metric": "l2", "threshold": 200.0}
    (tmp_path / "px").mkdir()
    assert run(tmp_path / "px", job(path), near=near) == 0
    by_pixels = removed(tmp_path / "px")
    assert {r: k for r, (k, _, _) in by_pixels.items()} == {
        30: "exact", 31: "exact", 32: "exact", 33: "exact", 34: "near", 35: "near"}

    assert run(tmp_path, job(path, exact_on="bytes"), near=near) == 0
    got = removed(tmp_path)
    assert {r: (k, of) for r, (k, of, _) in got.items()} == {
        30: ("exact", 4), 31: ("exact", 4), 32: ("near", 7), 33: ("near", 9),
        34: ("near", 12), 35: ("near", 15)}
    assert got[32][2] == 0.0
    x = np.stack([decode_image(v, resize=SIZE, channels=3, draft=True)[1]
                  for v in values]).reshape(len(values), -1).astype(np.float64)
    for row in (32, 33, 34, 35):
        assert got[row][2] == pytest.approx(np.linalg.norm(x[row] - x[got[row][1]]), abs=1e-3)
    d = np.sqrt(((x[:30, None] - x[None, :30]) ** 2).sum(-1)) + np.eye(30) * 1e9
    assert d.min() > near["threshold"]  # no distinct pair inside it: nothing else removed
    kept = set(range(len(values))) - set(got)
    assert read_tfrecord(tmp_path / "out" / "clean" / "train.tfrecord") == [
        r for i, r in enumerate(read_tfrecord(path)) if i in kept]
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == summary["kept"] + 6 and summary["invalid"] == 0


def test_bytes_mode_without_near_removes_only_byte_copies(tmp_path, dataset):
    path, _, _ = dataset
    assert run(tmp_path, job(path, exact_on="bytes")) == 0
    assert {r: (k, of) for r, (k, of, _) in removed(tmp_path).items()} == {
        30: ("exact", 4), 31: ("exact", 4)}


def test_draft_keeps_at_least_the_resize_once_oriented():
    """A JPEG stored transposed (EXIF 6) is drafted by its shown size: asked for 150 x 40
    (h x w) of a picture shown 240 x 320, the stored 320 x 240 cannot halve (it would
    show 120 high); asked for 60 x 40 it decodes at 1/4. The drafted resize stays close
    to the full decode's (within a few levels on average)."""
    img = crops(1, 240, 320, seed=5)[0]
    data = rotated(img)
    assert open_image(data, 10**8).size == (320, 240)
    assert open_image(data, 10**8, (150, 40)).size == (320, 240)
    assert open_image(data, 10**8, (60, 40)).size == (80, 60)
    for size in ((150, 40), (60, 40), (32, 32)):
        full = decode_image(data, resize=size)[1].astype(float)
        small = decode_image(data, resize=size, draft=True)[1].astype(float)
        assert small.shape == full.shape == (*size, 3)
        assert np.abs(small - full).mean() < 3
    png = encode(img)  # not a JPEG: decoded as without draft
    assert np.array_equal(decode_image(png, resize=SIZE, draft=True)[1],
                          decode_image(png, resize=SIZE)[1])


def test_store_and_reference_refuse_the_other_mode(tmp_path, dataset, capsys):
    """A store made on pixels refuses a bytes run (its digests would never match), and a
    reference set decoded otherwise than the input is refused: one line, exit 2."""
    path, _, _ = dataset
    store = {"path": str(tmp_path / "store")}
    assert run(tmp_path, job(path), store=store) == 0
    capsys.readouterr()
    assert run(tmp_path, job(path, exact_on="bytes"), store=store) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exact_on" in err[0] and "Traceback" not in err[0], err
    assert run(tmp_path, job(path, exact_on="bytes"),
               reference=job(path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: reference.exact_on:"), err


def test_exact_on_needs_decoded_images(tmp_path, capsys):
    (tmp_path / "x.parquet").write_bytes(b"")
    code = run(tmp_path, {"format": "parquet", "path": str(tmp_path / "x.parquet"),
                          "tensor": "t", "decode": "bytes", "exact_on": "bytes"})
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "input.exact_on" in err[0], err
    assert "decode: image" in err[0]
