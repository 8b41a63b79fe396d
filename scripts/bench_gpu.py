"""The GPU paths on a real GPU: CUDA fingerprints, the near kernel's products and jaccard's
MinHash signatures on CUDA, checked against the CPU paths and the float64 oracles, and
timed beside them.

Why a script and not tests: CI has no GPU. A session lent a GPU machine runs this once
(``python scripts/bench_gpu.py --out DIR``; only numpy, torch, xxhash, ml_dtypes and
faiss-cpu are needed, no Beam) and quotes the table. Every check compares the GPU's
answer with the CPU's on the same machine; the near checks also with the oracles the
tests use. Each section is timed out on its own (``--section-s``) and written to
DIR/bench-gpu.json as it ends, so a cut-off run still reports what it finished.

The record's keys that issue 45's checks read: ``machine``; ``near_kernel_speedup``
(find_near, 1M x 384, cosine 0.01, bounded mode, cuda against cpu), ``job_speedup``
(the job's kernel steps in sequence: fingerprints, then find_near) and
``fingerprint_speedup`` (``1KB``, ``64KB``, ``4MB`` rows), each ``{"gpu_s", "cpu_s",
"ratio"}``; ``near_kernel_10m`` (10M x 384 made on the device, bounded: ``{"gpu_s",
"recall", "peak_gpu_bytes"}``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests import shapes  # noqa: E402
from tests.embeddings import embeddings, planted_copies  # noqa: E402
from tests.oracle import kept_set_oracle, near_oracle  # noqa: E402
from transforms.fingerprint import fingerprint, fingerprint_batch  # noqa: E402
from transforms.near.find import find_near  # noqa: E402
from transforms.near.spec import NearSpec  # noqa: E402

DEVICE = "cuda"  # --device cpu: a dry run of the script where there is no GPU


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(f, *a, **kw):
    _sync()
    t = time.perf_counter()
    out = f(*a, **kw)
    _sync()
    return out, time.perf_counter() - t


def environment() -> dict:
    import faiss

    from transforms.near.search import use_cuda

    dev = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "numpy": np.__version__, "faiss": faiss.__version__,
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "gpu": dev.name if dev else None,
            "gpu_memory_gb": round(dev.total_memory / 2**30, 1) if dev else None,
            "near_device_auto_uses_cuda": use_cuda("auto")}


def machine() -> dict:
    """The record's ``machine``: GPU, CPU cores, torch and CUDA versions."""
    dev = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {"gpu": dev.name if dev else None, "cpu_cores": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu_memory_bytes": dev.total_memory if dev else None}


def _speedup(gpu_s: float, cpu_s: float, **more) -> dict:
    return {"gpu_s": round(gpu_s, 3), "cpu_s": round(cpu_s, 3),
            "ratio": round(cpu_s / gpu_s, 2) if gpu_s > 0 else None, **more}


FINGERPRINT_ROWS = {"1KB": 1 << 10, "64KB": 1 << 16, "4MB": 1 << 22}
FINGERPRINT_BYTES = 1 << 30  # per row size: about 1 GiB of rows


def fingerprint_speedup(total: int = FINGERPRINT_BYTES) -> dict:
    """Digests of uint8 rows of 1 KB, 64 KB and 4 MB already on the device against the
    numpy path on the host, same bytes; equal digests required."""
    out = {}
    for name, width in FINGERPRINT_ROWS.items():
        rows = max(total // width, 4)
        host = torch.randint(0, 256, (rows, width), dtype=torch.uint8)
        dev = host.to(DEVICE)
        fingerprint_batch(dev[:2], backend="torch")  # warm-up
        gpu, tg = _timed(fingerprint_batch, dev, backend="torch")
        cpu, tc = _timed(fingerprint_batch, host.numpy())
        gb = rows * width / 1e9
        out[name] = _speedup(tg, tc, rows=rows, gpu_gb_s=round(gb / tg, 2),
                             cpu_gb_s=round(gb / tc, 2), equal=bool((gpu == cpu).all()))
        print(name, json.dumps(out[name]), flush=True)
        del dev
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def _find(x: np.ndarray, spec: NearSpec, gpu: bool):
    """find_near with k-means, assignment, the cells (many per launch) and the recall
    brute force through torch on DEVICE (``gpu``), or on the host's numpy path. With
    ``--device cpu`` the torch code runs on CPU tensors: a dry run of the same code."""
    if gpu:
        return find_near(x, np.arange(len(x)), replace(spec, device=DEVICE),
                         torch_device=torch.device(DEVICE))
    return find_near(x, np.arange(len(x)), replace(spec, device="cpu"))


def _kernel(x: np.ndarray, gpu: bool, mode: str = "bounded"):
    return _timed(_find, x, NearSpec("cosine", threshold=0.01, mode=mode), gpu)


def _compared(g, c) -> dict:
    """How two find_near results differ: removals in one only (bounded mode's cells come
    from k-means whose float sums ran in another order, so a capped record may meet other
    cells), and each one's recall as its brute-force sample judged it."""
    gs = set(zip(g.removed.tolist(), g.kept.tolist(), strict=True))
    cs = set(zip(c.removed.tolist(), c.kept.tolist(), strict=True))
    return {"same_removals": gs == cs, "removals_differ": len(gs ^ cs),
            "recall_gpu": g.recall.recall if g.recall else None,
            "recall_cpu": c.recall.recall if c.recall else None}


def near_kernel_speedup(rows: int) -> dict:
    """find_near at ``rows`` x 384 (embedding-like, planted copies), cosine 0.01, bounded
    mode, cuda against cpu; the same removals required."""
    x, _ = planted_copies(embeddings(round(rows / 1.07)))
    (g, tg), (c, tc) = _kernel(x, True), _kernel(x, False)
    return _speedup(tg, tc, rows=len(x), removed=int(len(g.removed)), cells=len(g.partitions),
                    mode=g.partitions.mode, **_compared(g, c))


def job_speedup(rows: int) -> dict:
    """The job's kernel steps in sequence, as its workers run them (the lent machine has
    no Beam): fingerprints of the rows, then find_near; the GPU side takes the rows to
    the device once, fingerprints them there and searches with ``near.device: cuda``."""
    x, _ = planted_copies(embeddings(round(rows / 1.07)))

    def steps(gpu: bool):
        t = time.perf_counter()
        if not gpu:
            digests = fingerprint_batch(x)
        else:
            digests = fingerprint_batch(torch.from_numpy(x).to(DEVICE), backend="torch")
        _sync()
        r, _ = _kernel(x, gpu)
        return (digests, r), time.perf_counter() - t

    (dg, g), tg = steps(True)
    (dc, c), tc = steps(False)
    return _speedup(tg, tc, rows=len(x), same_digests=bool((dg == dc).all()),
                    **_compared(g, c))


def near_kernel_10m(rows: int) -> dict:
    """``rows`` x 384 made on the device (clustered unit vectors with near copies), then
    find_near bounded on it with ``near.device: cuda``: seconds, the recall printed (its
    brute-force sample) and the device's peak memory."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    centres = torch.randn(rows // 500, 384, device=DEVICE, generator=g)
    pick = torch.randint(0, len(centres), (rows,), device=DEVICE, generator=g)
    x = centres[pick] + 0.6 * torch.randn(rows, 384, device=DEVICE, generator=g)
    copies = rows // 20
    x[-copies:] = x[:copies] + 0.02 * torch.randn(copies, 384, device=DEVICE, generator=g)
    x = torch.nn.functional.normalize(x, dim=1)
    host = x.cpu().numpy()
    del x, centres, pick
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    r, t = _kernel(host, True)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"rows": rows, "gpu_s": round(t, 1), "removed": int(len(r.removed)),
            "recall": r.recall.recall if r.recall else None,
            "recall_interval": [r.recall.low, r.recall.high] if r.recall else None,
            "recall_sampled_with_partners": r.recall.with_partners if r.recall else None,
            "peak_gpu_bytes": peak}


def fingerprint_checks() -> dict:
    """Digests of tensors on the GPU equal the numpy path's, for every dtype family,
    -0.0 and NaN payloads, wide rows (the host fallback) and image-shaped uint8."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 37, generator=g)
    a[0, 0], a[1, 1], a[2, 2] = -0.0, float("nan"), -float("nan")
    cases = {"float32": a, "float16": a.half(), "bfloat16": a.bfloat16(), "bool": a > 0,
             "int32": (a * 100).int(), "int64": (a * 1e6).long(), "float64": a.double(),
             "complex64": torch.complex(a, -a), "uint8 images 64x64x3":
             torch.randint(0, 256, (512, 64, 64, 3), dtype=torch.uint8, generator=g),
             "float32 wide rows (100,000 values: host fallback)": torch.randn(3, 100_000),
             "empty rows": torch.zeros(5, 0), "int8 3-d": (a[:, :36] * 50).to(
                 torch.int8).reshape(4096, 6, 6)}
    out = {}
    for name, t in cases.items():
        cpu = fingerprint_batch(t)  # a host tensor: the numpy path
        gpu = fingerprint_batch(t.to(DEVICE), backend="torch")
        one = fingerprint(t.to(DEVICE)[2]) == bytes(cpu[2])
        out[name] = bool((gpu == cpu).all() and one)
    return out


def fingerprint_speed() -> list[dict]:
    """Digests per second of data already on the GPU against the numpy path on the host
    (its 2 threads), same data; GB/s counts the tensor bytes."""
    rows = []
    for name, make in (("1M x 384 float32", lambda: torch.randn(1_000_000, 384)),
                       ("100k x 64x64x3 uint8", lambda: torch.randint(
                           0, 256, (100_000, 64, 64, 3), dtype=torch.uint8))):
        host = make()
        dev = host.to(DEVICE)
        fingerprint_batch(dev[:1000], backend="torch")  # warm-up: memory pool, kernels
        gpu, tg = _timed(fingerprint_batch, dev, backend="torch")
        arr = host.numpy()
        cpu, tc = _timed(fingerprint_batch, arr)
        gb = host.numel() * host.element_size() / 1e9
        rows.append({"data": name, "gb": round(gb, 3), "gpu_s": round(tg, 3),
                     "cpu_s": round(tc, 3), "gpu_gb_s": round(gb / tg, 2),
                     "cpu_gb_s": round(gb / tc, 2), "equal": bool((gpu == cpu).all())})
        del dev
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def _crowds(metric: str, seed: int = 0) -> tuple[np.ndarray, NearSpec]:
    t = 0.01 if metric == "cosine" else 0.05
    bg = shapes.background(4000, dim=64, seed=seed)
    parts = [bg, shapes.crowd(bg[1], 3000, t, metric, seed=1)]
    parts += [shapes.crowd(bg[10 + i], 300, t, metric, seed=2 + i) for i in range(5)]
    x = np.concatenate(parts)
    x = x[np.random.default_rng(seed).permutation(len(x))]
    return x, NearSpec(metric, threshold=t, single_index_rows=1000, partition_rows=300)


def _tight(n: int = 40_000) -> tuple[np.ndarray, NearSpec]:
    """Points at coordinates ~50 with planted pairs at 1e-6..2e-5 (the float32 ulp there
    is 3.8e-6): where float32 products lose small distances between large vectors."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 100, (n, 2))
    src = rng.choice(n, n // 20, replace=False)
    step = rng.standard_normal((len(src), 2))
    step *= rng.uniform(1e-6, 2e-5, (len(src), 1)) / np.linalg.norm(step, axis=1, keepdims=True)
    x = np.concatenate([x, x[src] + step])
    return x[rng.permutation(len(x))], NearSpec("l2", threshold=1e-5)


def _cancel(n: int = 20_000) -> tuple[np.ndarray, NearSpec]:
    """Standard-normal 32-d rows with planted copies at l2 1e-5..1e-4 (FAISS's BLAS path
    lost a third of such pairs above 4,000 rows)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, 32)).astype(np.float32)
    src = rng.choice(n, 600, replace=False)
    step = rng.standard_normal((600, 32))
    step *= rng.uniform(1e-5, 1e-4, (600, 1)) / np.linalg.norm(step, axis=1, keepdims=True)
    x = np.concatenate([x, (x[src] + step).astype(np.float32)])
    return x[rng.permutation(len(x))], NearSpec("l2", threshold=1e-4)


def _removals(x: np.ndarray, spec: NearSpec, gpu: bool) -> tuple[dict, float]:
    r, s = _timed(_find, x, spec, gpu)
    return dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True)), s


def near_checks() -> list[dict]:
    """find_near on CUDA against the CPU and, where it is cheap, the float64 oracle."""
    cases = []
    for metric in ("cosine", "l2"):
        x, spec = _crowds(metric)
        cases += [(f"crowds {metric}, exact", x, replace(spec, mode="exact"), "kept_set"),
                  (f"crowds {metric}, bounded 2 probes", x,
                   replace(spec, mode="bounded", probes=2), "kept_set")]
    x, _ = shapes.magnitudes(6000, dim=32, tolerance=0.01)
    cases.append(("magnitudes 1e-3..1e3, l2", x, NearSpec(
        "l2", threshold=0.01, single_index_rows=500, partition_rows=200, mode="exact"),
        "kept_set"))
    cases.append(("components: satellites of a crowd", shapes.satellites(0), NearSpec(
        "l2", threshold=0.05, grouping="components", mode="exact", single_index_rows=500,
        partition_rows=200), "pairs"))
    for name, x in (("identical", shapes.identical(500)), ("one cell", shapes.one_cell(
            3000, tolerance=0.01)), ("nothing within", shapes.nothing_within(
            3000, tolerance=0.01))):
        cases.append((f"degenerate: {name}", x, NearSpec("l2", threshold=0.01), "kept_set"))
    x, spec = _tight()
    cases.append(("tight: 42k x 2 at ~50, l2 1e-5", x, spec, None))
    x, spec = _cancel()
    cases.append(("cancellation: 20.6k x 32, l2 1e-4", x, spec, None))
    out = []
    for name, x, spec, oracle in cases:
        gpu, tg = _removals(x, spec, True)
        cpu, tc = _removals(x, spec, False)
        row = {"case": name, "rows": len(x), "removed": len(gpu), "gpu_s": round(tg, 2),
               "cpu_s": round(tc, 2), "gpu_equals_cpu": gpu == cpu}
        if oracle:
            want = kept_set_oracle(x, spec) if oracle == "kept_set" else near_oracle(x, spec)
            row["gpu_equals_oracle"] = gpu == want
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def filter_checks() -> list[dict]:
    """The training filter on a stream of GPU batches (exact + near, greedy in stream
    order) keeps the same rows as on the host, and as the stream oracle."""
    from filters.online import OnlineDedup
    from filters.torch import keep_mask_on_device
    from tests.oracle import StreamOracle

    x, _ = planted_copies(embeddings(4_500, dim=128, clusters=150, seed=5))
    x = np.concatenate([x, x[:300]])  # exact copies too
    spec = NearSpec("cosine", threshold=0.02)
    masks = {}
    for device in (DEVICE, "cpu"):
        state = OnlineDedup(near=replace(spec, device=device))
        t = time.perf_counter()
        masks[device] = np.concatenate([
            keep_mask_on_device(torch.from_numpy(x[a:a + 1024]).to(device), state).cpu().numpy()
            for a in range(0, len(x), 1024)])
        masks[device + "_s"] = time.perf_counter() - t
    oracle = StreamOracle(spec)
    want = np.array([oracle.keep(None, row) for row in x])
    return [{"case": f"online filter, {len(x):,} x 128 in batches of 1,024, cosine 0.02",
             "kept": int(masks[DEVICE].sum()), "gpu_s": round(masks[DEVICE + "_s"], 2),
             "cpu_s": round(masks["cpu_s"], 2),
             "gpu_equals_cpu": bool((masks[DEVICE] == masks["cpu"]).all()),
             "gpu_equals_oracle": bool((masks[DEVICE] == want).all())}]


def jaccard_signatures() -> list[dict]:
    """MinHash signatures (near metric jaccard) through torch on the device = NumPy's, and
    their speed, on real texts (the installed packages' licences and READMEs, repeated
    to about 100k documents' worth of shingles)."""
    from tests.textkit import package_texts
    from transforms.near.sets import Sets, record_sets, signatures, signatures_torch
    from transforms.near.spec import Shingles

    one = record_sets(package_texts(300), Shingles())
    sets = Sets.concat([one] * 40)  # ~12k documents, ~5M shingles
    out = []
    for k in (112, 128):
        want, cpu_s = _timed(signatures, sets, k)
        got, dev_s = _timed(signatures_torch, sets, k, torch.device(DEVICE))
        out.append({"case": f"{len(sets):,} documents, {len(sets.hashes):,} shingles, "
                            f"{k} permutations", "equal": bool(np.array_equal(got, want)),
                    "cpu_s": round(cpu_s, 3), "gpu_s": round(dev_s, 3),
                    "gpu_docs_per_s": round(len(sets) / dev_s)})
    return out


def _profiled(f, *a, **kw):
    """f(*a, **kw) under cProfile: (its result, the 25 functions with the most
    cumulative time as 'seconds  function' lines)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    out = prof.runcall(f, *a, **kw)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    lines = [ln for ln in text.getvalue().splitlines() if ln[:1].isspace() and "/" in ln]
    return out, [f"{ln.split()[3]:>8}  {ln.split(None, 5)[-1]}" for ln in lines]


def near_speed(rows: int, profile: bool = False) -> list[dict]:
    """find_near at scale, auto mode with its recall sample, on the CPU (all cores) and
    with the products on the GPU; the same removals expected."""
    x, _ = planted_copies(embeddings(round(rows / 1.07)))
    out = []
    for t in (0.01,):
        spec = NearSpec("cosine", threshold=t)
        res = {}
        for side in ("gpu", "cpu"):
            run = (lambda *a: _profiled(_timed, *a)) if profile else _timed
            got = run(_find, x, spec, side == "gpu")
            (r, s), top = got if profile else (got, None)
            res[side] = (r, s)
            if top:
                res[side + "_profile"] = top
        g, c = res["gpu"][0], res["cpu"][0]
        out.append({"data": f"{len(x):,} x 384 embeddings", "threshold": t,
                    "mode": g.partitions.mode, "cells": len(g.partitions),
                    "removed": int(len(g.removed)), "gpu_s": round(res["gpu"][1], 1),
                    "cpu_s": round(res["cpu"][1], 1), **_compared(g, c),
                    **{k: v for k, v in res.items() if k.endswith("_profile")}})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for bench-gpu.json")
    ap.add_argument("--rows", type=int, default=1_000_000, help="near_speed's rows")
    ap.add_argument("--only", action="append", default=[], help="section names to run")
    ap.add_argument("--profile", action="store_true", help="near_speed under cProfile: "
                    "the functions with the most cumulative time, per device, in the JSON")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of this script's own code, comparing CPU with CPU")
    ap.add_argument("--rows-10m", type=int, default=10_000_000, help="near_kernel_10m's rows")
    ap.add_argument("--fingerprint-bytes", type=int, default=FINGERPRINT_BYTES)
    ap.add_argument("--section-s", type=int, default=150, help="each section's time limit")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu: torch sees no CUDA device")
    path = Path(args.out) / "bench-gpu.json"
    result: dict = {"machine": machine(), "environment": environment()}
    sections = {"near_checks": near_checks,
                "near_kernel_speedup": lambda: near_kernel_speedup(args.rows),
                "fingerprint_speedup": lambda: fingerprint_speedup(args.fingerprint_bytes),
                "job_speedup": lambda: job_speedup(args.rows),
                "near_kernel_10m": lambda: near_kernel_10m(args.rows_10m),
                "fingerprint_checks": fingerprint_checks, "filter_checks": filter_checks,
                "jaccard_signatures": jaccard_signatures, "fingerprint_speed": fingerprint_speed,
                "near_speed": lambda: near_speed(args.rows, args.profile)}

    def overtime(*_):
        raise TimeoutError(f"over --section-s {args.section_s}")

    signal.signal(signal.SIGALRM, overtime)
    for name, f in sections.items():
        if args.only and name not in args.only:
            continue
        t = time.perf_counter()
        signal.alarm(args.section_s)
        try:
            result[name] = f()
        except Exception:  # report and go on: the other sections still tell something
            result[name] = {"error": traceback.format_exc(limit=6)}
        finally:
            signal.alarm(0)
        result[name + "_s"] = round(time.perf_counter() - t, 1)
        print(f"== {name}: {result[name + '_s']} s", flush=True)
        path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
