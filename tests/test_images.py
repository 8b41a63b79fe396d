"""The image decoding kernel (transforms.images) on files Pillow writes: orientation,
16-bit, alpha, GIF frames, WebP, bombs, and resize as Pillow's BILINEAR."""

from __future__ import annotations

import io

import numpy as np
import pytest
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
