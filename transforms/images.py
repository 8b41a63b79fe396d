"""Encoded images -> uint8 pixels, the same way on every worker (``input.decode: image``).

Why one kernel: exact dedup compares decoded pixels, so two copies of a picture must
decode to the same array whatever container or metadata they carry, and every worker
must produce the same bytes. Pillow decodes (JPEG through libjpeg-turbo, PNG, GIF's
first frame, BMP, WebP); then, in this order: EXIF orientation is applied, 16-bit
samples are scaled to 8 bits, alpha is composited on white, ``channels`` converts to
grey (1) or RGB (3). The result is (h, w, c) uint8. ``resize`` then stretches it with
Pillow's antialiased bilinear filter (rounded to uint8), so the near stage compares
copies stored at other sizes; a large shrink first box-reduces by an integer factor
while staying at least ``REDUCING_GAP`` times the target (Pillow's ``reducing_gap``):
the bilinear pass over full-resolution pixels was as slow as the JPEG decode itself.
Images over ``max_pixels`` are refused from their header, before their pixels are
allocated (decompression bombs).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageFile, ImageOps

# Formats decoded; anything else Pillow can open (TIFF, ICO, PSD...) is refused so that a
# run's results do not depend on optional Pillow plugins.
FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
# Shrinks by more than this factor box-reduce first (Image.reduce) to a size at least this
# many times the target, then filter: on 240 x 320 photos to 32 x 32 the resize takes
# 0.13 ms instead of 0.22 (the decode 0.24), values differ from a single bilinear pass by
# 0.18 on average (at most 7 of 255). Part of what a resized image is (store settings).
REDUCING_GAP = 3.0
# What decoded pixels are, recorded by a fingerprint store (a store made by another
# version is refused): 2 since 16-bit colour PNGs keep every bit of their samples before
# scaling (Pillow alone keeps the high byte) and tRNS colour keys are transparent.
PIXELS = 2
# Raw modes Pillow reads 16-bit PNGs with, where it keeps only the high byte -> the raw
# mode that reads the rest of the same bytes, and the mode they make.
_PNG16 = {"RGB;16B": ("RGB;16L", "RGB"), "RGBA;16B": ("RGBA;16L", "RGBA"),
          "LA;16B": ("RGBA", "LA")}
# Leading bytes of the formats decoded (for error messages about wrong decode settings).
MAGIC = {b"\xff\xd8\xff": "JPEG", b"\x89PNG\r\n\x1a\n": "PNG", b"GIF87a": "GIF",
         b"GIF89a": "GIF", b"BM": "BMP"}


class BadImage(ValueError):
    """An image that cannot be used; the message is the one-line reason."""


def sniff(data: bytes) -> str | None:
    """The image format ``data`` starts like (JPEG, PNG, GIF, BMP, WEBP), or None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in MAGIC.items() if data.startswith(magic)), None)


def _png_samples(im: Image.Image, data: bytes, tile: ImageFile._Tile | None) -> Image.Image:
    """A 16-bit colour or grey + alpha PNG (``im``, loaded from ``data`` by ``tile``)
    with every sample scaled as ``_eight_bit`` scales grey, alpha from a tRNS colour key
    included. Pillow keeps only each sample's high byte of such a file (and opens grey +
    alpha as RGBA); decoding the same bytes again with another raw mode (one more pass
    of the zlib stream and its filters) gives the low bytes. Other images: ``im``."""
    if tile is None or tile.args not in _PNG16:
        return im
    again, mode = _PNG16[tile.args]
    other = Image.open(io.BytesIO(data), formats=("PNG",))
    other.tile = [tile._replace(args=again)]
    other.load()
    b = np.asarray(other).astype(np.uint32)
    if mode == "LA":  # one pass: raw mode RGBA reads the 4 bytes as they are
        x = np.stack([b[..., 0] << 8 | b[..., 1], b[..., 2] << 8 | b[..., 3]], axis=-1)
    else:
        x = np.asarray(im).astype(np.uint32) << 8 | b
    key = im.info.get("transparency")
    if mode == "RGB" and isinstance(key, tuple) and len(key) == 3:
        alpha = np.where((x == np.array(key)).all(axis=-1), 0, 65535)
        x, mode = np.concatenate([x, alpha[..., None]], axis=-1), "RGBA"
    eight = np.rint(x * (255.0 / 65535.0)).astype(np.uint8)
    out = Image.fromarray(eight, mode)
    out.info = {k: v for k, v in im.info.items() if k != "transparency"}
    return out


def _eight_bit(im: Image.Image) -> Image.Image:
    """16-bit and 32-bit grey samples scaled to 0..255 (PNG's 16-bit grey is 0..65535)."""
    if im.mode in ("I", "F") or im.mode.startswith("I;16"):
        x = np.asarray(im, dtype=np.float64)
        x = x * (255.0 / 65535.0) if im.mode != "F" else x * 255.0 if x.max() <= 1 else x
        grey = np.clip(np.rint(x), 0, 255).astype(np.uint8)
        key = im.info.get("transparency")
        if im.mode != "F" and isinstance(key, int):  # a tRNS key of 16-bit grey
            alpha = np.where(np.asarray(im) == key, 0, 255).astype(np.uint8)
            return Image.fromarray(np.stack([grey, alpha], axis=-1), "LA")
        return Image.fromarray(grey, "L")
    if im.mode == "1":
        return im.convert("L")
    return im


def _flatten_alpha(im: Image.Image) -> Image.Image:
    """Transparent pixels composited on white; grey stays grey."""
    has_alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        im.mode in ("P", "L", "RGB") and "transparency" in im.info)  # palette, colour key
    if not has_alpha:
        return im if im.mode in ("L", "RGB") else im.convert("RGB")
    grey = im.mode in ("LA", "La", "L")
    rgba = im.convert("RGBA")
    out = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return out.convert("L" if grey else "RGB")


def _draft(im: Image.Image, size: tuple[int, int]) -> None:
    """Let a JPEG decode at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling) while staying at
    least ``size`` (height, width) once EXIF orientation is applied; other formats as is."""
    if im.format != "JPEG":
        return
    h, w = size
    if im.getexif().get(0x0112, 1) in (5, 6, 7, 8):  # stored transposed: shown w x h
        h, w = w, h
    im.draft(im.mode, (w, h))


def open_image(data: bytes, max_pixels: int, draft: tuple[int, int] | None = None
               ) -> Image.Image:
    """The first frame of ``data`` as an 8-bit L or RGB image, oriented and flattened.
    ``draft`` (height, width): a JPEG may be decoded smaller, down to that size."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data), formats=FORMATS)
        except Image.DecompressionBombError as e:
            raise BadImage(f"image over Pillow's size limit: {e}") from None
        except Exception:  # noqa: BLE001 - Pillow raises many kinds for bad input
            kind = sniff(data)
            if kind is not None:
                raise BadImage(f"corrupt or truncated {kind} image (its header cannot be "
                               f"read; {len(data):,} bytes)") from None
            raise BadImage("not a JPEG, PNG, GIF, BMP or WebP image (" + (
                f"it starts with {bytes(data[:8])!r})" if len(data) else "it is empty: 0 bytes)")
            ) from None
        w, h = im.size
        if w * h > max_pixels:
            raise BadImage(f"image of {w} x {h} = {w * h:,} pixels is over the limit of "
                           f"{max_pixels:,} (a decompression bomb?): raise input.max_pixels "
                           "to accept it")
        try:
            im.seek(0)
            if draft is not None:
                _draft(im, draft)
            tile = im.tile[0] if im.format == "PNG" and len(im.tile) == 1 else None
            im.load()
            im = _png_samples(im, data, tile)
            if im.getexif().get(0x0112, 1) != 1:  # EXIF orientation: rotate/flip as shown
                im = ImageOps.exif_transpose(im)
        except Exception as e:  # noqa: BLE001 - truncated data, bad chunks, bad EXIF
            raise BadImage(f"corrupt or truncated {im.format} image ({type(e).__name__}: "
                           f"{' '.join(str(e).split())})") from None
    return _flatten_alpha(_eight_bit(im))


def to_channels(im: Image.Image, channels: int | None) -> Image.Image:
    if channels == 1 and im.mode != "L":
        return im.convert("L")
    if channels == 3 and im.mode != "RGB":
        return im.convert("RGB")
    return im


def pixels(im: Image.Image) -> np.ndarray:
    """(h, w, c) uint8 array of an L or RGB image."""
    x = np.asarray(im, dtype=np.uint8)
    return x[:, :, None] if x.ndim == 2 else x


def decode_image(data: bytes, *, channels: int | None = None,
                 resize: tuple[int, int] | None = None,
                 max_pixels: int = 50_000_000, draft: bool = False
                 ) -> tuple[np.ndarray | None, np.ndarray]:
    """(full-resolution pixels, pixels resized to ``resize`` or the same array).

    ``channels`` None keeps grey images grey and makes every other one RGB; with
    ``resize`` and no ``channels`` images become RGB (one shape for all). ``draft`` (with
    ``resize``): JPEGs are decoded at a reduced scale no smaller than ``resize`` and the
    full resolution is never made: the first item is None unless no resize was needed
    (``exact_on: bytes``: half the work on photos). Raises BadImage with the reason for
    data that is not a usable image.
    """
    im = open_image(data, max_pixels, tuple(resize) if draft and resize else None)
    im = to_channels(im, channels or (3 if resize else None))
    if resize is None or (im.height, im.width) == tuple(resize):
        full = pixels(im)
        return full, full
    small = pixels(im.resize((resize[1], resize[0]), Image.Resampling.BILINEAR,
                             reducing_gap=REDUCING_GAP))
    return (None if draft else pixels(im)), small
