"""The oracle of ``fuzz_images.py``: Pillow on its own, following docs/images.md (what
a decoded image is, and which records a job removes)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
ORIENT = {2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
          5: lambda a: a.swapaxes(0, 1), 6: lambda a: np.rot90(a, -1),
          7: lambda a: a[::-1, ::-1].swapaxes(0, 1), 8: lambda a: np.rot90(a, 1)}


def oracle_decode(data: bytes | None, channels: int | None, draft: list[int] | None = None
                  ) -> np.ndarray | None:
    """(h, w, c) uint8 pixels per docs/images.md, or None: not a usable image. ``draft``
    (exact_on: bytes): a JPEG decoded at reduced scale, no smaller than that as shown."""
    if data is None:
        return None
    try:
        im = Image.open(io.BytesIO(data), formats=FORMATS)
        im.seek(0)
        if draft and im.format == "JPEG":
            h, w = draft[::-1] if im.getexif().get(0x0112, 1) in (5, 6, 7, 8) else draft
            im.draft(im.mode, (w, h))
        im.load()
        orient = im.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - Pillow raises many kinds for bad input
        return None
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[24] == 16 and data[25] in (2, 4, 6):
        import tensorflow as tf

        v = tf.io.decode_png(data, dtype=tf.uint16).numpy().astype(np.float64)
        a = np.rint(v * 255 / 65535).astype(np.uint8)
        im = Image.fromarray(a[..., 0] if a.shape[2] == 1 else a)  # L, LA, RGB, RGBA
    elif im.mode.startswith("I;16") or im.mode == "I":
        v = np.asarray(im, np.float64)
        im = Image.fromarray(np.rint(v * 255 / 65535).astype(np.uint8))
    elif im.mode == "1":
        im = im.convert("L")
    grey = im.mode in ("L", "LA")
    if "A" in im.mode or "transparency" in im.info:  # composited on white
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        im = Image.alpha_composite(white, im.convert("RGBA")).convert("L" if grey else "RGB")
    elif im.mode not in ("L", "RGB"):
        im = im.convert("RGB")
    target = {1: "L", 3: "RGB"}.get(channels or 0, im.mode)
    im = im if im.mode == target else im.convert(target)
    a = np.atleast_3d(np.asarray(im, np.uint8))
    return np.ascontiguousarray(ORIENT[orient](a) if orient in ORIENT else a)


def shrink(a: np.ndarray, resize: list[int]) -> np.ndarray:
    return np.asarray(Image.fromarray(a[..., 0] if a.shape[2] == 1 else a).resize(
        resize[::-1], Image.Resampling.BILINEAR, reducing_gap=3.0), np.float64).reshape(-1)


def distance(a: np.ndarray, b: np.ndarray, metric: str, channels: int) -> float:
    """l2: the squared distance (integers, exact); correlation: 1 - Pearson r with each
    channel centred on its own mean, inf when either is flat in every channel."""
    if metric == "l2":
        return float(((a - b) ** 2).sum())
    ca, cb = (v.reshape(-1, channels) - v.reshape(-1, channels).mean(axis=0) for v in (a, b))
    flat = lambda v: (np.ptp(v.reshape(-1, channels), axis=0) == 0).all()  # noqa: E731
    if flat(a) or flat(b):
        return np.inf
    return float(1 - (ca * cb).sum() / np.sqrt((ca * ca).sum() * (cb * cb).sum()))


def oracle(ids: list[str], same: list, keep: str, small: dict, k: float | None,
           metric: str = "l2", channels: int = 1) -> dict:
    """{removed id: (kind, duplicate_of)}; exact: equal ``same`` (None: invalid); near when
    ``k`` (within: ``distance`` <= k: squared l2, or 1 - r)."""
    order = list(range(len(ids)))[::-1 if keep == "last" else 1]
    groups: dict[tuple, list[int]] = {}
    for i in order:
        if same[i] is not None:
            groups.setdefault(same[i], []).append(i)
    out = {ids[m]: ("exact", ids[g[0]]) for g in groups.values() for m in g[1:]}
    if k is None:
        return out
    kept: list[int] = []
    for i in sorted((g[0] for g in groups.values()), key=order.index):
        d = [distance(small[i], small[j], metric, channels) for j in kept] or [np.inf]
        if min(d) <= k:  # the nearest, ties by keep order
            out[ids[i]] = ("near", ids[kept[int(np.argmin(d))]])
        else:
            kept.append(i)
    return out
