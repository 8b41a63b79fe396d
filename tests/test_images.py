"""The image decoding kernel (transforms.images) on files Pillow writes: orientation,
16-bit, alpha, GIF frames, WebP, bombs, and resize as Pillow's BILINEAR; and the image
near default that the shipped configs, the README and docs/images.md state."""

from __future__ import annotations

import io
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from tests.imagekit import crops, encode
from transforms.images import BadImage, decode_image


def test_formats_decode_to_the_same_pixels():
    im = crops(1, seed=7)[0]
    for fmt, kw in (("PNG", {}), ("BMP", {}), ("WEBP", {"lossless": True}),
                    ("TIFF", None)):
        if kw is None:  # formats outside the list are refused, not decoded by some plugin
            with pytest.raises(BadImage, match="not a JPEG, PNG"):
                decode_image(encode(im, fmt))
            continue
        full, small = decode_image(encode(im, fmt, **kw))
        assert full is small and np.array_equal(full, im)


def test_exif_orientation_is_applied():
    im = crops(1, h=20, w=30, seed=8)[0]
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    data = encode(im, "PNG", exif=exif.tobytes())
    full, _ = decode_image(data)
    assert full.shape == (30, 20, 3) and np.array_equal(full, np.rot90(im, k=-1))


def test_sixteen_bit_alpha_grey_and_channels():
    ramp = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1024 + 7)
    full, _ = decode_image(_png16(ramp))
    assert full.shape == (8, 8, 1)
    want = np.rint(ramp.astype(np.float64) * 255 / 65535).astype(np.uint8)
    assert np.array_equal(full[..., 0], want)
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[:2, :, 3] = 255  # top half opaque red-ish, bottom half transparent
    full, _ = decode_image(encode(rgba))
    assert full[0, 0].tolist() == [200, 0, 0] and full[3, 3].tolist() == [255, 255, 255]
    grey, _ = decode_image(encode(rgba), channels=1)
    assert grey.shape == (4, 4, 1)
    rgb, _ = decode_image(encode(np.full((4, 4), 9, np.uint8)), channels=3)
    assert rgb.shape == (4, 4, 3) and (rgb == 9).all()


def _png16(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a.astype(np.uint16)).save(buf, "PNG")
    return buf.getvalue()


def _png16_by_hand(a: np.ndarray, interlace: bool = False) -> bytes:
    """A 16-bit PNG (grey + alpha, RGB or RGBA; Adam7 if ``interlace``) written by hand,
    every row with filter 0: Pillow writes no such file. (The filtered rows of a real
    encoder are in ``test_sixteen_bit_colour_png_from_tensorflow``.)"""
    h, w, c = a.shape
    passes = ([(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
               (1, 0, 2, 2), (0, 1, 1, 2)] if interlace else [(0, 0, 1, 1)])
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = a[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.astype(">u2").tobytes()
                            for row in sub.reshape(len(sub), -1))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))

    head = struct.pack(">IIBBBBB", w, h, 16, {2: 4, 3: 2, 4: 6}[c], 0, 0, int(interlace))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def _scaled(v: np.ndarray) -> np.ndarray:
    return np.rint(v.astype(np.float64) * 255 / 65535).astype(np.uint8)


@pytest.mark.parametrize("interlace", [False, True])
def test_sixteen_bit_colour_keeps_every_bit_before_scaling(interlace):
    """Pillow alone reads each sample of a 16-bit colour PNG as its high byte (v >> 8):
    51,460 became 201, not round(51,460 x 255 / 65,535) = 200 as 16-bit grey does, so a
    16-bit picture was not the exact copy of its 8-bit version (found by
    scripts/fuzz_images.py)."""
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 65536, (13, 11, 3))
    rgb[0, 0] = (100 * 257 - 5, 51460, 65535)  # >> 8: 99, 201, 255
    full, _ = decode_image(_png16_by_hand(rgb, interlace))
    assert full[0, 0].tolist() == [100, 200, 255]
    assert np.array_equal(full, _scaled(rgb))
    rgba = rng.integers(0, 65536, (9, 10, 4))
    rgba[..., 3] = 65535  # opaque: what is left is the colour
    rgba[0, 0, 3] = 0  # but this one pixel: white
    full, _ = decode_image(_png16_by_hand(rgba, interlace))
    want = _scaled(rgba[..., :3])
    want[0, 0] = 255
    assert np.array_equal(full, want)


def test_sixteen_bit_colour_png_from_tensorflow():
    """A real encoder's 16-bit PNG (filtered rows): the same as the 8-bit rounding of
    its samples, so it is the exact copy of that 8-bit picture."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(4)
    x = np.cumsum(rng.integers(0, 300, (31, 40, 3)), axis=1).astype(np.uint16)  # smooth
    full, _ = decode_image(tf.io.encode_png(x).numpy())
    assert np.array_equal(full, _scaled(x))
    eight, _ = decode_image(encode(_scaled(x)))
    assert np.array_equal(full, eight)


def test_sixteen_bit_grey_alpha_stays_grey():
    """Pillow opens 16-bit grey + alpha as RGBA: it came out RGB, while 8-bit LA is grey."""
    la = np.stack([np.full((3, 4), 100 * 257), np.full((3, 4), 65535)], axis=-1)
    la[0, 0, 1] = 0  # transparent: white
    full, _ = decode_image(_png16_by_hand(la))
    want = np.full((3, 4, 1), 100, np.uint8)
    want[0, 0] = 255
    assert full.shape == (3, 4, 1) and np.array_equal(full, want)


@pytest.mark.parametrize("mode", ["RGB", "L", "I;16"])
def test_colour_key_transparency_is_composited_on_white(mode):
    """A tRNS colour key (grey or RGB PNG) marks its pixels transparent: composited on
    white like an alpha channel, so the picture is the exact copy of the same picture
    stored with alpha. It was ignored (only alpha channels and palettes were)."""
    a = np.full((2, 2, 3), 40, np.uint8)
    a[0, 0] = (200, 10, 10)
    im = Image.fromarray(a).convert("L" if mode == "I;16" else mode)
    if mode == "I;16":
        im = Image.fromarray(np.asarray(im).astype(np.uint16) * 257)
    key = im.getpixel((0, 0))
    buf = io.BytesIO()
    im.save(buf, "PNG", transparency=key)
    full, _ = decode_image(buf.getvalue())
    assert full.shape[2] == (3 if mode == "RGB" else 1)
    assert (full[0, 0] == 255).all() and (full[1, 1] != 255).all()
    pixels = _scaled(np.asarray(im)) if mode == "I;16" else np.asarray(im)
    with_alpha = np.dstack([pixels, np.array([[0, 255], [255, 255]], np.uint8)])  # LA, RGBA
    same, _ = decode_image(encode(with_alpha))
    assert np.array_equal(full, same)


def test_gif_first_frame():
    frames = [Image.fromarray(np.full((6, 6, 3), v, np.uint8)) for v in (10, 250)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    full, _ = decode_image(buf.getvalue())
    assert full.shape == (6, 6, 3) and (np.abs(full.astype(int) - 10) <= 1).all()


def test_bombs_and_truncation_are_reasons():
    big = Image.new("L", (8000, 7000))  # 56 megapixels of zeros: a few KB as PNG
    buf = io.BytesIO()
    big.save(buf, "PNG")
    with pytest.raises(BadImage, match="56,000,000 pixels is over the limit of 50,000,000"):
        decode_image(buf.getvalue())
    data = encode(crops(1, seed=9)[0], "JPEG", quality=90)
    with pytest.raises(BadImage, match="corrupt or truncated JPEG"):
        decode_image(data[: len(data) // 2])


def test_resize_is_pillows_bilinear_and_exact_stays_full():
    im = crops(1, h=100, w=90, seed=10)[0]
    full, small = decode_image(encode(im), resize=(32, 24))
    want = np.asarray(Image.fromarray(im).resize((24, 32), Image.Resampling.BILINEAR))
    assert np.array_equal(full, im) and np.array_equal(small, want)
    # a shrink by more than 3x box-reduces first (Pillow's reducing_gap), full stays full
    full, small = decode_image(encode(im), resize=(10, 9))
    pil = Image.fromarray(im)
    want = np.asarray(pil.resize((9, 10), Image.Resampling.BILINEAR, reducing_gap=3.0))
    fair = np.asarray(pil.resize((9, 10), Image.Resampling.BILINEAR), np.int16)
    assert np.array_equal(full, im) and np.array_equal(small, want)
    assert 0 < np.abs(fair - small).max() <= 8


def test_the_image_near_default_is_one_in_configs_readme_and_docs():
    """The README and docs/images.md said l2 300 and l2 200; the default now comes from
    the benchmark's table (docs/images.md), and every place that states it agrees."""
    root = Path(__file__).resolve().parent.parent
    shipped = [yaml.safe_load((root / "configs" / f"dedupe-images-{f}.yaml").read_text())["near"]
               for f in ("hf", "tfrecord")]
    readme = re.search(r"^near: (\{.*?\})", (root / "README.md").read_text(), re.M)
    docs = (root / "docs" / "images.md").read_text()
    stated = re.search(r"`near: (\{.*?\})`", docs)
    assert readme and stated
    want = {"metric": "correlation", "threshold": 0.02}
    assert shipped == [want, want]
    assert yaml.safe_load(readme.group(1)) == want == yaml.safe_load(stated.group(1))
    assert "| **0.02** |" in docs  # the row the benchmark chose, marked in its table
