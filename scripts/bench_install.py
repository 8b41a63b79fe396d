"""Measure the install: pip's wall time and the installed size of each install set, each in
a fresh virtualenv, from this checkout.

Sets (every one with ``-c constraints.txt``, as the README says):

- ``base``: ``tensordedup`` alone: the kernels, the manifest and online filter cores
- ``torch``: ``tensordedup[torch]``: + the PyTorch filters
- ``tf``: ``tensordedup[tf]``: + the tf.data filters
- ``job``: ``tensordedup[job]``: the Beam dedup job (Parquet and HDF5 input)
- ``all``: ``tensordedup[all]``: everything the README uses
- ``readme``: ``tensordedup[all,dev]``: the README's one install command (+ test tools)

How: the package is built once into a wheel (from a copy of the checkout's pyproject,
README and packages, so no build files land in the tree). Then (unless ``--no-warm``)
every wheel of ``all,dev`` is downloaded once with ``pip download``, timed and sized on
its own (what a cold install of ``all,dev`` fetches); that fills pip's cache, so the
timed installs measure pip's resolve, unpack and install rather than the network, where
the index allows it: whether the cache did fill is measured and reported (an index whose
responses carry no cache headers leaves it empty, and then every timed install downloads
its wheels again). Each set then gets a fresh venv
(``python -m venv``, its bundled pip), ``pip install`` is timed, site-packages is measured
(disk usage, like ``du``; the empty venv's pip and setuptools are reported separately),
and a smoke import of what the set promises runs outside the checkout. The venvs are
deleted afterwards unless ``--keep``. Times on a shared machine are noisy: compare rows
of one run.

Usage: python scripts/bench_install.py [--sets base,torch,tf,job,all,readme]
       [--json bench-install.json] [--no-warm] [--keep] [--src CHECKOUT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {  # name: (extras, what the smoke import checks)
    "base": ("", "import filters.manifest, filters.online, transforms.keys, "
                 "transforms.fingerprint, transforms.io.formats.tfrecord"),
    "torch": ("torch", "import filters.torch, filters.manifest"),
    "tf": ("tf", "import filters.tf, filters.manifest"),
    "job": ("job", "import pipeline.run, transforms.io.formats.hdf5, transforms.near.find"),
    "all": ("all", "import pipeline.run, filters.torch, filters.tf, pipeline.runners"),
    "readme": ("all,dev", "import pipeline.run, filters.torch, filters.tf, pytest, duckdb"),
}
# what a set must not hold: the lean promise (checked with the installed distributions)
ABSENT = {"base": ["apache-beam", "tensorflow", "torch", "pydantic", "h5py", "faiss-cpu",
                   "matplotlib"],
          "torch": ["apache-beam", "tensorflow", "pydantic"],
          "tf": ["apache-beam", "torch", "pydantic"],
          "job": ["tensorflow", "torch"]}
COPY = ["pyproject.toml", "README.md", "constraints.txt", "pipeline", "transforms", "filters"]


def run(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n"
                           f"{r.stderr[-3000:]}")
    return r, wall


def disk_usage(path: Path) -> int:
    """Bytes on disk below ``path`` (st_blocks, as du counts; hard links once)."""
    seen, total = set(), 0
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            st = os.lstat(os.path.join(folder, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def pip_cache_bytes() -> int:
    r = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True,
                       text=True)
    cache = Path(r.stdout.strip()) if r.returncode == 0 else None
    return disk_usage(cache) if cache and cache.exists() else 0


def build_wheel(work: Path, checkout: Path) -> Path:
    src = work / "src"
    src.mkdir()
    for name in COPY:
        if (checkout / name).is_dir():
            shutil.copytree(checkout / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(checkout / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"),
         str(src)])
    return next((work / "dist").glob("tensordedup-*.whl"))


def warm(wheel: Path, work: Path) -> dict:
    """Download every wheel of the README's install once: fills pip's cache."""
    before = pip_cache_bytes()
    dl = work / "download"
    _, wall = run([sys.executable, "-m", "pip", "download", "-q", "-c",
                   str(ROOT / "constraints.txt"), "-d", str(dl), f"{wheel}[all,dev]"])
    files = [p for p in dl.iterdir() if p.name != wheel.name]
    size = sum(p.stat().st_size for p in files)
    shutil.rmtree(dl)
    return {"set": "all,dev", "seconds": round(wall, 1), "files": len(files),
            "wheel_mb": round(size / 1e6, 1),
            "pip_cache_mb_before": round(before / 1e6, 1),
            "pip_cache_mb_after": round(pip_cache_bytes() / 1e6, 1)}


def cache_state(warm_up: dict | None) -> str:
    """What pip's cache held for the timed installs, in words."""
    if warm_up is None:
        return f"as found ({pip_cache_bytes() / 1e6:,.0f} MB), no warm-up"
    grew = warm_up["pip_cache_mb_after"] - warm_up["pip_cache_mb_before"]
    if grew >= 0.5 * warm_up["wheel_mb"]:
        return (f"warm: the warm-up downloaded every wheel once ({warm_up['wheel_mb']:,.0f} MB) "
                "and pip cached them")
    return (f"cold: pip cached {max(grew, 0):,.0f} MB of the {warm_up['wheel_mb']:,.0f} MB the "
            "warm-up downloaded (the index's responses carry no cache headers), so each "
            f"install downloads its wheels again; download alone: "
            f"{warm_up['wheel_mb'] / warm_up['seconds']:,.0f} MB/s")


def measure(name: str, wheel: Path, work: Path, keep: bool) -> dict:
    extras, smoke = SETS[name]
    venv = work / f"venv-{name}"
    run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    empty = disk_usage(site_packages(venv))
    spec = f"{wheel}[{extras}]" if extras else str(wheel)
    cache_before = pip_cache_bytes()
    _, seconds = run([str(py), "-m", "pip", "install", "-q", "-c",
                      str(ROOT / "constraints.txt"), spec], cwd=work)
    cache_after = pip_cache_bytes()
    size = disk_usage(site_packages(venv))
    listed, _ = run([str(py), "-m", "pip", "list", "--format=json"], cwd=work)
    dists = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(listed.stdout)}
    present = [d for d in ABSENT.get(name, []) if d in dists]
    if present:
        raise RuntimeError(f"set {name} installed {present}: not lean")
    _, import_s = run([str(py), "-c", smoke], cwd=work,
                      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if not keep:
        shutil.rmtree(venv)
    return {"set": name, "install": f"tensordedup[{extras}]" if extras else "tensordedup",
            "pip_seconds": round(seconds, 1), "site_packages_mb": round(size / 1e6, 1),
            "empty_venv_mb": round(empty / 1e6, 1), "distributions": len(dists) - 2,
            "torch": dists.get("torch"), "tensorflow": dists.get("tensorflow"),
            "apache_beam": dists.get("apache-beam"), "smoke_import": smoke,
            "smoke_import_seconds": round(import_s, 1),
            "pip_cache_grew_mb": round((cache_after - cache_before) / 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--json", default=str(ROOT / "bench-install.json"))
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="skip the pip download that fills pip's cache first")
    ap.add_argument("--keep", action="store_true", help="keep the venvs (printed)")
    ap.add_argument("--src", type=Path, default=ROOT,
                    help="the checkout to build the package from (default: this one)")
    args = ap.parse_args()
    names = [s for s in args.sets.split(",") if s]
    unknown = set(names) - set(SETS)
    if unknown:
        ap.error(f"unknown sets {sorted(unknown)}: choose from {list(SETS)}")

    work = Path(tempfile.mkdtemp(prefix="tensordedup-bench-install-"))
    pip_version = run([sys.executable, "-m", "pip", "--version"])[0].stdout.split()[1]
    result = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                         f"{platform.platform()}",
              "pip_config": run([sys.executable, "-m", "pip", "config", "list"])[0]
              .stdout.strip().splitlines(),
              "pip_of_the_script": pip_version, "work": str(work)}
    try:
        wheel = build_wheel(work, args.src)
        print(f"wheel: {wheel.name} ({wheel.stat().st_size / 1e3:.0f} kB)", file=sys.stderr)
        if args.warm:
            result["warm_up"] = warm(wheel, work)
            w = result["warm_up"]
            print(f"warm-up: pip download of [all,dev]: {w['files']} wheels, "
                  f"{w['wheel_mb']:,.0f} MB in {w['seconds']} s; pip cache "
                  f"{w['pip_cache_mb_before']:,.0f} -> {w['pip_cache_mb_after']:,.0f} MB",
                  file=sys.stderr)
        result["cache"] = cache_state(result.get("warm_up"))
        rows = []
        for name in names:
            print(f"installing {name} ...", file=sys.stderr, flush=True)
            rows.append(measure(name, wheel, work, args.keep))
            r = rows[-1]
            print(f"  {r['pip_seconds']} s, {r['site_packages_mb']:,.0f} MB", file=sys.stderr)
        result["sets"] = rows
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\npip install -c constraints.txt <set>, fresh venv, cache: {result['cache']}")
    print(f"{result['machine']}, Python {result['python']}, {result['date']}\n")
    print("| set | install | pip install (s) | site-packages (MB) | distributions |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['set']} | `{r['install']}` | {r['pip_seconds']:.1f} | "
              f"{r['site_packages_mb']:,.0f} | {r['distributions']} |")
    print(f"\n(an empty venv's pip and setuptools: {rows[0]['empty_venv_mb']:.0f} MB, "
          "included above)")
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
