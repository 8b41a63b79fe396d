"""Near dedup of images: which pixel distance (a per-record transform, then L2: what the
near kernel can search exactly) separates edited copies of a photo tile from other tiles
(issue 41 item 5). Research only: nothing of the job is imported.

The labelled set is ``scripts/bench_images_quality.py``'s, rebuilt here (its tile and edit
code copied, decoded as ``transforms/images.py`` decodes with ``resize: [32, 32]``,
``channels: 3``: Pillow, RGB, bilinear with ``reducing_gap=3.0``): 64 x 64 tiles of 20
photos (two halves of 10) plus flat tiles, each with 15 edits, in one shuffled keep order;
exact copies (the same full-resolution pixels) grouped first.

Every candidate maps a record's 32 x 32 x 3 pixels to a float64 vector z with |z| <= 1 and
measures d(a, b) = |z_a - z_b|^2 / 2 (for unit vectors: 1 - cos; for the channel-centred
unit vector: 1 - Pearson r, the shipped ``correlation``). A record whose every channel is
flat has no direction and is never within (as ``correlation``), unless the candidate
carries its mean. All pairs are found from float32 products with a wide slack and
measured again in float64; the groupings are brute force (representative: each record in
keep order joins its nearest kept earlier record within the threshold, ties by the
earlier; components: union-find over pairs within it).

The threshold is chosen on one half as the largest of a fixed grid (steps of ~10%) below
the smallest distance that joins two distinct tiles in the components grouping (at or
above it the components grouping merges; the representative grouping's groups lie inside
the components' groups, so below it neither merges) and measured on the other half;
then the halves are swapped.

    python scripts/bench_image_measures.py            # DEFAULT's candidates (~7 min, 2 cores)
    python scripts/bench_image_measures.py --only all  # every candidate (~15 min)
    python scripts/bench_image_measures.py --only corr,smooth2-g1.5 --detail smooth2-g1.5
    python scripts/bench_image_measures.py --only smooth2-g1.5 --at 0.014  # a fixed threshold
    python scripts/bench_image_measures.py --oracle corr  # per-tile oracle scaling bound

``--detail`` breaks each target kind's misses down by cause (``why``): a flat tile, a
flat copy, inseparable (no threshold, even one per tile, catches it without a merge),
beyond the threshold, or lost to the grouping.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_images_quality import HALVES, SIZE, edits, enc, tiles  # noqa: E402

REDUCING_GAP = 3.0
TARGET = ("jpeg q95", "jpeg q80", "jpeg q70", "jpeg q60", "resize +1px", "resize +2px",
          "resize -1px", "resize -2px", "brightness -10", "brightness +10")
KINDS = TARGET + ("brightness -5", "brightness +5", "crop 10% (not caught)",
                  "flip (not caught)", "letterbox (not caught)")
SHORT = {"jpeg q95": "q95", "jpeg q80": "q80", "jpeg q70": "q70", "jpeg q60": "q60",
         "resize +1px": "+1px", "resize +2px": "+2px", "resize -1px": "-1px",
         "resize -2px": "-2px", "brightness -10": "-10", "brightness +10": "+10"}
RECALL = 0.95
# thresholds: 1, 1.1, 1.2, ... 9 times powers of ten (steps of 5-10%)
GRID = np.array(sorted({round(m * 10.0 ** e, 6) for e in range(-4, 1)
                        for m in np.round(np.arange(1.0, 10.0, 0.1), 1)}))
FLAT_EPS = 1e-9  # a transformed channel whose values span less than this is flat


# ---- the set: bench_images_quality.py's tiles and edits; decoding inlined here ----

def decode(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(full-resolution RGB pixels, 32 x 32 x 3 as the job resizes them): what
    ``transforms.images.decode_image(data, resize=(32, 32), channels=3)`` gives for these
    8-bit PNGs and baseline JPEGs."""
    im = Image.open(io.BytesIO(data))
    im.load()
    if im.mode != "RGB":
        im = im.convert("RGB")
    full = np.asarray(im, dtype=np.uint8)
    if (im.height, im.width) == SIZE:
        return full, full
    small = im.resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR, reducing_gap=REDUCING_GAP)
    return full, np.asarray(small, dtype=np.uint8)


class Half:
    """One half's records in keep order: family (tile index), kind, 32 x 32 x 3 pixels;
    exact survivors (``surv``) and each record's survivor position (``pos``)."""

    def __init__(self, half: str) -> None:
        pics, src, self.dropped = tiles(half)
        fam, kind, data = [], [], []
        for i, p in enumerate(pics):
            for k, v in {"tile": enc(p), **edits(p)}.items():
                data.append(v)
                fam.append(i)
                kind.append(k)
        order = np.random.default_rng(1).permutation(len(data))
        self.fam, self.kind = np.array(fam)[order], np.array(kind)[order]
        full, small = zip(*(decode(data[i]) for i in order), strict=True)
        self.x = np.stack(small)
        first: dict[bytes, int] = {}
        to = np.array([first.setdefault(f.tobytes() + bytes(str(f.shape), "ascii"), i)
                       for i, f in enumerate(full)])
        self.surv = np.unique(to)
        self.pos = np.searchsorted(self.surv, to)
        self.src = np.array(src)
        self.tiles = len(pics)
        orig = np.flatnonzero(self.kind == "tile")
        self.orig = np.empty(self.tiles, np.int64)
        self.orig[self.fam[orig]] = orig
        # per tile: the spread of its 32 x 32 pixels (largest channel std), for diagnosis
        t = self.x[self.orig].reshape(self.tiles, -1, 3).astype(float)
        self.tile_std = t.std(axis=1).max(axis=1)


# ---- candidate transforms: (n, 32, 32, 3) float64 -> (n, D) float64 ----

def box3(x: np.ndarray) -> np.ndarray:
    """3 x 3 box blur, edges repeated."""
    p = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    y = p[:, :-2] + p[:, 1:-1] + p[:, 2:]
    return (y[:, :, :-2] + y[:, :, 1:-1] + y[:, :, 2:]) / 9.0


def gauss(x: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur (radius ceil(3 sigma)), edges repeated."""
    r = int(np.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    k /= k.sum()
    p = np.pad(x, ((0, 0), (r, r), (r, r), (0, 0)), mode="edge")
    h, w = x.shape[1:3]
    y = sum(k[i] * p[:, i:i + h] for i in range(2 * r + 1))
    return sum(k[i] * y[:, :, i:i + w] for i in range(2 * r + 1))


def down(x: np.ndarray, f: int) -> np.ndarray:
    """Mean of f x f blocks."""
    n, h, w, c = x.shape
    return x.reshape(n, h // f, f, w // f, f, c).mean(axis=(2, 4))


def luma_chroma(x: np.ndarray, w: float) -> np.ndarray:
    """BT.601 Y, Cb, Cr with the chroma scaled by w (a linear map per pixel)."""
    m = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]])
    m[1:] *= w
    return x @ m.T


def centred(x: np.ndarray) -> np.ndarray:
    """(n, D) each channel minus its mean; a flat channel is exactly 0."""
    n, c = len(x), x.shape[-1]
    y = x.reshape(n, -1, c)
    flat = (y.max(axis=1) - y.min(axis=1)) < FLAT_EPS
    y = y - y.mean(axis=1, keepdims=True)
    y[np.broadcast_to(flat[:, None, :], y.shape)] = 0.0
    return y.reshape(n, -1)


def unit(y: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(y, axis=1)
    return y / np.where(n == 0, 1, n)[:, None]


def floored(y: np.ndarray, c: float) -> np.ndarray:
    """Centred rows over sqrt(D (var + c^2)): |z| < 1; var >> c^2 -> correlation's unit
    vector, var << c^2 -> centred values / (c sqrt(D))."""
    var = np.einsum("ij,ij->i", y, y) / y.shape[1]
    return y / np.sqrt(y.shape[1] * (var + c * c))[:, None]


@dataclass
class Candidate:
    name: str
    desc: str
    parts: list[tuple[float, Callable[[np.ndarray], np.ndarray]]]  # (weight, x -> z, |z|<=1)
    tmax: float = 0.1
    mean_scale: float = 0.0  # > 0: carry the channel means, d += rms(dmean)^2 / M^2
    flat_scale: float = 0.0  # > 0: flat records (every channel constant) compare by colour

    def transform(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(z, directed): d = |z_a - z_b|^2 / 2 = sum of weight * d_part (+ the mean term)."""
        x = x.astype(np.float64)
        zs = [np.sqrt(w) * f(x) for w, f in self.parts]
        y = x.reshape(len(x), -1, 3)
        directed = (y.max(axis=1) != y.min(axis=1)).any(axis=1)
        if self.mean_scale:
            zs.append(y.mean(axis=1) * np.sqrt(2 / 3) / self.mean_scale)
            directed[:] = True
        if self.flat_scale:
            # flat records: 0 but for a unit offset (>= 1/2 from any other record) and
            # their colour: d = rms(colour difference)^2 / K^2 between two flat records
            flat = ~directed
            extra = np.zeros((len(x), 4))
            extra[flat, 0] = 1.0
            extra[flat, 1:] = y[flat, 0] * np.sqrt(2 / 3) / self.flat_scale
            zs = [np.where(flat[:, None], 0.0, z) for z in zs] + [extra]
            directed[:] = True
        return np.concatenate(zs, axis=1), directed


def corr(pre: Callable[[np.ndarray], np.ndarray] = lambda x: x) -> Callable:
    return lambda x: unit(centred(pre(x)))


def floor(c: float, pre: Callable[[np.ndarray], np.ndarray] = lambda x: x) -> Callable:
    return lambda x: floored(centred(pre(x)), c)


def variance(x: np.ndarray) -> np.ndarray:
    """Each record's variance over all its values, channels centred apart."""
    y = centred(x)
    return np.einsum("ij,ij->i", y, y) / y.shape[1]


def scaled(rho: Callable[[np.ndarray], np.ndarray],
           pre: Callable[[np.ndarray], np.ndarray] = lambda x: x) -> Callable:
    """Correlation's unit vector times sqrt(rho(record)), rho in [0, 1]: pairs of like rho
    measure rho * (1 - r); unlike rho adds (sqrt(rho_a) - sqrt(rho_b))^2 / 2."""
    return lambda x: unit(centred(pre(x))) * np.sqrt(rho(x))[:, None]


def lf_floor(c: float, sigma: float) -> Callable[[np.ndarray], np.ndarray]:
    """rho = v / (v + c^2), v the variance of the Gaussian-blurred record: contrast that
    JPEG and resizing keep."""
    def rho(x: np.ndarray) -> np.ndarray:
        v = variance(gauss(x, sigma))
        return v / (v + c * c)
    return rho


def smooth(p: float, sigma: float) -> Callable[[np.ndarray], np.ndarray]:
    """rho = (blurred variance / variance)^p: 1 for smooth records, small for fine
    texture or noise (whose JPEG copies are far in correlation)."""
    def rho(x: np.ndarray) -> np.ndarray:
        v, lf = variance(x), variance(gauss(x, sigma))
        return np.minimum(1.0, np.where(v > 0, lf / np.where(v > 0, v, 1), 1.0)) ** p
    return rho


def power(v0: float, beta: float) -> Callable[[np.ndarray], np.ndarray]:
    """rho = min(1, (v / v0)^beta): between correlation (beta 0) and centred L2 (beta 1)
    below v0; q60 copies' 1 - r grows like v^-0.74 on these tiles."""
    return lambda x: np.minimum(1.0, (variance(x) / v0) ** beta)


def grad(x: np.ndarray) -> np.ndarray:
    """Horizontal and vertical differences (brightness-proof without centring)."""
    return np.concatenate([(x[:, :, 1:] - x[:, :, :-1]).reshape(len(x), -1, x.shape[-1]),
                           (x[:, 1:] - x[:, :-1]).reshape(len(x), -1, x.shape[-1])], axis=1)


def candidates() -> list[Candidate]:
    g1 = lambda x: gauss(x, 1.0)  # noqa: E731
    g15 = lambda x: gauss(x, 1.5)  # noqa: E731
    d16 = lambda x: down(x, 2)  # noqa: E731
    d8 = lambda x: down(x, 4)  # noqa: E731
    out = [
        Candidate("corr", "shipped correlation: 1 - r, channels centred", [(1, corr())]),
        Candidate("corr-box3", "correlation after a 3x3 box blur", [(1, corr(box3))]),
        Candidate("corr-g1", "correlation after a Gaussian blur, sigma 1", [(1, corr(g1))]),
        Candidate("corr-g1.5", "correlation after a Gaussian blur, sigma 1.5",
                  [(1, corr(g15))]),
        Candidate("corr-16", "correlation of 16x16 (2x2 means)", [(1, corr(d16))]),
        Candidate("corr-8", "correlation of 8x8 (4x4 means)", [(1, corr(d8))]),
        Candidate("corr-y.5", "correlation of Y, Cb/2, Cr/2",
                  [(1, corr(lambda x: luma_chroma(x, 0.5)))]),
        Candidate("corr-grad", "cosine of the x/y differences",
                  [(1, lambda x: unit(grad(x).reshape(len(x), -1)))]),
    ]
    for c in (2, 4, 8, 16):
        out.append(Candidate(f"floor{c}", f"contrast-floored correlation, c={c}",
                             [(1, floor(c))]))
    for c in (4, 8):
        out.append(Candidate(f"floor{c}-g1", f"floored c={c} after Gaussian sigma 1",
                             [(1, floor(c, g1))]))
        out.append(Candidate(f"floor{c}-16", f"floored c={c} of 16x16", [(1, floor(c, d16))]))
    for c in (4, 8):
        out.append(Candidate(f"floor{c}-mean100", f"floored c={c} + channel means / 100",
                             [(1, floor(c))], mean_scale=100.0))
    for c in (1, 2, 4):
        for sg in (1.0, 2.0):
            out.append(Candidate(f"lffloor{c}-g{sg:g}",
                                 f"correlation x rho, rho = v/(v+{c}^2), v: variance after "
                                 f"Gaussian {sg:g}", [(1, scaled(lf_floor(c, sg)))]))
    for p, sg in ((0.5, 1.0), (1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (4.0, 1.0), (6.0, 1.0),
                  (1.0, 2.0), (2.0, 2.0), (3.0, 2.0)):
        out.append(Candidate(f"smooth{p:g}-g{sg:g}",
                             f"correlation x rho, rho = (v_blur{sg:g} / v)^{p:g}",
                             [(1, scaled(smooth(p, sg)))]))
    for v0, beta in ((400, 0.5), (400, 0.75), (100, 0.75), (1600, 0.5)):
        out.append(Candidate(f"pow{v0}-{beta:g}", f"correlation x rho, rho = min(1, (v/{v0})"
                             f"^{beta:g})", [(1, scaled(power(v0, beta)))]))
    for p, sg in ((1.5, 1.5), (2.0, 1.5), (2.5, 1.5), (3.0, 1.5), (1.5, 1.25), (2.0, 1.25),
                  (2.5, 1.25), (1.5, 1.75), (2.0, 1.75)):
        out.append(Candidate(f"smooth{p:g}-g{sg:g}",
                             f"correlation x rho, rho = (v_blur{sg:g} / v)^{p:g}",
                             [(1, scaled(smooth(p, sg)))]))
    out.append(Candidate("smooth2-g1-y.5", "smooth2-g1 on Y, Cb/2, Cr/2",
                         [(1, scaled(smooth(2.0, 1.0), lambda x: luma_chroma(x, 0.5)))]))
    out.append(Candidate("smooth2-g1-flat", "smooth2-g1, flat records by colour / 150",
                         [(1, scaled(smooth(2.0, 1.0)))], flat_scale=150.0))
    out.append(Candidate("corr-flat", "correlation, flat records by colour / 150",
                         [(1, corr())], flat_scale=150.0))
    out.append(Candidate("corr-8+16+32", "1/3 each: correlation of 8x8, 16x16, 32x32",
                         [(1 / 3, corr(d8)), (1 / 3, corr(d16)), (1 / 3, corr())]))
    return out


# what a plain run measures (about 8 minutes on 2 cores); --only all: every candidate
DEFAULT = ("corr", "corr-g1", "corr-16", "corr-8", "corr-y.5", "corr-grad", "floor2", "floor4",
           "floor8", "floor4-g1", "floor4-mean100", "lffloor1-g1", "pow400-0.5", "smooth1-g1",
           "smooth2-g1", "smooth1.5-g1.5", "smooth2-g1.5", "smooth2.5-g1.5", "smooth2-g1.75",
           "corr-flat")


# ---- pairs, groupings, measures ----

def all_pairs(z: np.ndarray, directed: np.ndarray, tmax: float, most: int = 2_000_000
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(i, j, d, limit) with j < i for every directed pair with d <= limit, d in float64;
    limit is tmax, or lower where more than ``most`` pairs are within tmax (the pairs
    found are then every pair within the lower limit)."""
    z32 = z.astype(np.float32)
    sq = np.einsum("ij,ij->i", z32, z32)
    slack = 1e-4  # far above float32 rounding of |z| <= 1 products
    ii, jj, dd, n = [], [], [], 0
    for a in range(0, len(z), 1024):
        e = min(a + 1024, len(z))  # earlier rows only: j < e
        d2 = (sq[a:e, None] + sq[None, :e] - 2 * (z32[a:e] @ z32[:e].T)) / 2
        i, j = np.nonzero(d2 <= tmax + slack)
        keep = (j < i + a) & directed[i + a] & directed[j]
        i, j = i[keep], j[keep]
        ii.append((i + a).astype(np.int32))
        jj.append(j.astype(np.int32))
        dd.append(d2[i, j])
        n += len(i)
        if n > most:  # lower the limit: keep the closest half
            d32 = np.concatenate(dd)
            tmax = float(np.partition(d32, most // 2)[most // 2]) - slack
            w = d32 <= tmax + slack
            ii, jj, dd = [np.concatenate(ii)[w]], [np.concatenate(jj)[w]], [d32[w]]
            n = int(w.sum())
    i, j = np.concatenate(ii).astype(np.int64), np.concatenate(jj).astype(np.int64)
    d = np.empty(len(i))
    for k in range(0, len(i), 50_000):
        dz = z[i[k:k + 50_000]] - z[j[k:k + 50_000]]
        d[k:k + 50_000] = np.einsum("ij,ij->i", dz, dz) / 2
    ok = d <= tmax
    return i[ok], j[ok], d[ok], tmax


def find(parent: np.ndarray, u: int) -> int:
    while parent[u] != u:
        parent[u] = parent[parent[u]]
        u = parent[u]
    return u


def critical(h: Half, i: np.ndarray, j: np.ndarray, d: np.ndarray) -> float:
    """The smallest threshold at which the components grouping puts two distinct tiles
    in one group (inf: none within the pairs)."""
    n = len(h.surv)
    parent = np.arange(n)
    tiles = np.zeros(n, np.int64)
    np.add.at(tiles, h.pos[h.orig], 1)
    for k in np.argsort(d, kind="stable"):
        a, b = find(parent, int(i[k])), find(parent, int(j[k]))
        if a == b:
            continue
        if tiles[a] and tiles[b]:
            return float(d[k])
        lo, hi = min(a, b), max(a, b)
        parent[hi] = lo
        tiles[lo] += tiles[hi]
    return float("inf")


def groups(h: Half, i: np.ndarray, j: np.ndarray, d: np.ndarray, t: float, grouping: str
           ) -> np.ndarray:
    """Each record's group (a survivor position) at threshold t."""
    n = len(h.surv)
    w = d <= t
    i, j, d = i[w], j[w], d[w]
    if grouping == "components":
        parent = np.arange(n)
        for a, b in zip(i.tolist(), j.tolist(), strict=True):
            ra, rb = find(parent, a), find(parent, b)
            parent[max(ra, rb)] = min(ra, rb)
        g = np.array([find(parent, u) for u in range(n)])
    else:
        order = np.lexsort((j, d, i))  # by row, then nearest, then earlier
        g = np.arange(n)
        removed = np.zeros(n, bool)
        for a, b in zip(i[order].tolist(), j[order].tolist(), strict=True):
            if removed[a] or removed[b]:
                continue
            removed[a] = True
            g[a] = b
    return g[h.pos]


def measure(h: Half, g: np.ndarray) -> dict:
    own = g[h.orig]
    _, inv, cnt = np.unique(own, return_inverse=True, return_counts=True)
    merged = cnt[inv] > 1
    caught = g == own[h.fam]
    return {"merged": int(merged.sum()),
            "merged_by_photo": {str(a): int(n) for a, n in zip(
                *np.unique(h.src[merged], return_counts=True), strict=True)},
            "recall": {k: float(caught[h.kind == k].mean()) for k in KINDS},
            "caught": caught}


def grid_below(t: float) -> float:
    below = GRID[GRID < t]
    return float(below[-1]) if len(below) else 0.0


def evaluate(c: Candidate, halves: dict[str, Half], at: float | None = None) -> dict:
    out = {}
    for name, h in halves.items():
        z, directed = c.transform(h.x[h.surv])
        i, j, d, limit = all_pairs(z, directed, c.tmax)
        out[name] = (i, j, d, min(critical(h, i, j, d), limit), limit)
    res = {}
    for pick, rep in (("choose", "report"), ("report", "choose")):
        t = grid_below(out[pick][3]) if at is None else at
        h = halves[rep]
        i, j, d, tstar, limit = out[rep]
        row = {"t": t, "t_star_pick": out[pick][3], "t_star_rep": tstar}
        assert t <= limit, (c.name, t, limit)
        for grouping in ("representative", "components"):
            row[grouping] = measure(h, groups(h, i, j, d, t, grouping))
        # the best the other half itself allows: just below its own critical distance
        row["own"] = measure(h, groups(h, i, j, d, np.nextafter(tstar, 0), "representative"))
        res[f"{pick}->{rep}"] = row
    return res


def fmt_row(name: str, r: dict) -> str:
    rep, comp = r["representative"], r["components"]
    rec = rep["recall"]
    low = min(rec[k] for k in TARGET)
    ok = "yes" if rep["merged"] == 0 and comp["merged"] == 0 and low >= RECALL else "no"
    return (f"| {name} | {r['t']:g} | {rep['merged']} / {comp['merged']} | "
            + " | ".join(f"{rec[k]:.2f}" for k in TARGET)
            + f" | {min(r['own']['recall'][k] for k in TARGET):.2f}"
            + f" ({r['t_star_rep']:.4g}) | {ok} |")


def misses(h: Half, caught: np.ndarray, kind: str) -> str:
    """Of one kind's misses: how many come from tiles of spread (largest channel std)
    under 2, 5, 10 grey levels, and the photos."""
    miss = np.flatnonzero((h.kind == kind) & ~caught)
    std = h.tile_std[h.fam[miss]]
    photos = {str(a): int(n) for a, n in zip(*np.unique(h.src[h.fam[miss]], return_counts=True),
                                             strict=True)}
    return (f"{kind}: {len(miss)} missed; tile std < 2: {(std < 2).sum()}, < 5: "
            f"{(std < 5).sum()}, < 10: {(std < 10).sum()}; by photo {photos}")


def why(c: Candidate, h: Half, t: float, caught: np.ndarray) -> dict[str, dict[str, int]]:
    """Per target kind, its misses by cause: the tile is flat at 32 x 32 (no direction);
    the copy is flat; inseparable (the copy is at least as far from its tile as the
    nearest other distinct tile is from the tile or from the copy: no threshold, even
    one per tile, catches it without merging); beyond (separable, but over t); other
    (within t of its tile, lost to the grouping)."""
    z, directed = c.transform(h.x)
    zt = z[h.orig]
    sq = np.einsum("ij,ij->i", z, z)
    to_tiles = (sq[:, None] + sq[h.orig][None] - 2 * z @ zt.T) / 2  # record x tile
    to_tiles[:, ~directed[h.orig]] = np.inf
    to_tiles[~directed] = np.inf
    rows = np.arange(len(z))
    own = to_tiles[rows, h.fam]
    other = to_tiles.copy()
    other[rows, h.fam] = np.inf
    near_copy = other.min(axis=1)  # the copy to the nearest other tile
    near_tile = other[h.orig].min(axis=1)  # each tile to the nearest other tile
    out = {}
    for kind in TARGET:
        m = np.flatnonzero((h.kind == kind) & ~caught)
        flat_tile = ~directed[h.orig][h.fam[m]]
        flat_copy = ~flat_tile & ~directed[m]
        rest = ~flat_tile & ~flat_copy
        insep = rest & (own[m] >= np.minimum(near_copy[m], near_tile[h.fam[m]]))
        beyond = rest & ~insep & (own[m] > t)
        out[kind] = {"missed": len(m), "flat tile": int(flat_tile.sum()),
                     "flat copy": int(flat_copy.sum()), "inseparable": int(insep.sum()),
                     "beyond t": int(beyond.sum()),
                     "other": int((rest & ~insep & ~beyond).sum())}
    return out


def oracle_bound(h: Half, base: Candidate, kappa: float) -> dict:
    """An upper bound for per-record scaling of ``base``'s vectors: every record of a
    family scaled by rho = min(1, kappa / e), e the farthest target edit of its tile in
    ``base`` (the labels pick the scale: no transform can know it). Recall in the
    representative grouping just below this half's own limit."""
    z, directed = base.transform(h.x)
    zt = z[h.orig][h.fam]
    e = np.einsum("ij,ij->i", z - zt, z - zt) / 2
    tgt = np.isin(h.kind, TARGET) & directed & directed[h.orig][h.fam]
    far = np.zeros(h.tiles)
    np.maximum.at(far, h.fam[tgt], e[tgt])
    rho = np.minimum(1.0, kappa / np.maximum(far, 1e-12))[h.fam]
    zs = (z * np.sqrt(rho)[:, None])[h.surv]
    i, j, d, limit = all_pairs(zs, directed[h.surv], 0.1)
    t = np.nextafter(min(critical(h, i, j, d), limit), 0)
    rec = measure(h, groups(h, i, j, d, t, "representative"))["recall"]
    return {"t": t, "recall": rec}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=",".join(DEFAULT),
                    help="comma-separated candidate names ('all': every one)")
    ap.add_argument("--at", type=float, default=None, help="a fixed threshold instead")
    ap.add_argument("--oracle", default="", help="a candidate: its per-tile oracle bound")
    ap.add_argument("--detail", default="", help="candidates whose misses to break down")
    args = ap.parse_args()
    t0 = time.time()
    halves = {name: Half(name) for name in HALVES}
    for name, h in halves.items():
        print(f"{name} half: {h.tiles} distinct tiles ({h.dropped} dropped as identical), "
              f"{len(h.kind):,} records, {len(h.surv):,} exact survivors")
    print(f"set built in {time.time() - t0:.0f} s")
    only = set() if args.only == "all" else set(filter(None, args.only.split(",")))
    detail = set(filter(None, args.detail.split(",")))
    if args.oracle:
        base = {c.name: c for c in candidates()}[args.oracle]
        print(f"\nper-tile oracle scale of {base.name} (each half at its own limit):\n")
        print("| half | kappa | limit | " + " | ".join(SHORT[k] for k in TARGET) + " |")
        print("|" + "---|" * (len(TARGET) + 3))
        for name, h in halves.items():
            for kappa in (0.005, 0.01, 0.02, 0.05):
                o = oracle_bound(h, base, kappa)
                print(f"| {name} | {kappa:g} | {o['t']:.4g} | "
                      + " | ".join(f"{o['recall'][k]:.2f}" for k in TARGET) + " |")
        return
    rows: dict[str, list[str]] = {"choose->report": [], "report->choose": []}
    for c in candidates():
        if only and c.name not in only:
            continue
        t1 = time.time()
        res = evaluate(c, halves, args.at)
        for k, r in res.items():
            rows[k].append(fmt_row(c.name, r))
            if c.name in detail:
                h = halves[k.split("->")[1]]
                comp = r["components"]
                print(f"  {c.name} {k} at {r['t']:g}: merged by photo (components) "
                      f"{comp['merged_by_photo']}")
                caught = r["representative"]["caught"]
                for kind in TARGET:
                    print("   ", misses(h, caught, kind))
                print("    misses by cause (of all tiles):")
                for kind, n in why(c, h, r["t"], caught).items():
                    print(f"      {kind}: " + ", ".join(f"{a} {v} ({v / h.tiles:.3f})"
                                                    for a, v in n.items()))
        print(f"{c.name}: {c.desc} ({time.time() - t1:.0f} s)", flush=True)
    head = ("| candidate | threshold | merged (repr. / comp.) | "
            + " | ".join(SHORT[k] for k in TARGET)
            + " | min recall at the half's own limit (limit) | target |")
    for k, lines in rows.items():
        pick, rep = k.split("->")
        print(f"\nthreshold chosen on the {pick} half, measured on the {rep} half "
              "(recall: representative grouping):\n")
        print(head)
        print("|" + "---|" * (len(TARGET) + 5))
        print("\n".join(lines))
    print(f"\ntotal {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
