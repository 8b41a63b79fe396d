"""The capacity plan a dry run prints: wall time, bytes shuffled and spilled, peak memory
per worker and worker-hours, for the configured runner and input.

Why a model of the job's own steps: a user sizing a cluster needs the figures before
the first run, and a rule of thumb (GB per hour) is wrong by an order of magnitude for
the near stage, whose cost depends on the cells each record meets. Each step's work is
counted in its own unit (``units``: bytes read, tensor bytes hashed, records, row x
cell x dimension multiply-adds, compared pairs x dimensions, bytes written) and timed
with per-core rates that ``scripts/bench_rates.py`` measures from the real job on this
machine (``pipeline/capacity/rates.json``; another file: TENSORDEDUP_RATES). docs/scale.md
explains the model, checks it against local runs and names its assumptions.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.capacity.workload import Workload, workload
from pipeline.config import DedupeConfig
from pipeline.config.runner import RunnerConfig
from pipeline.job import Job
from transforms.near.plan import KMEANS_ITERATIONS, TRAIN_PER_CELL

RATES_ENV = "TENSORDEDUP_RATES"
DEFAULT_RATES = Path(__file__).with_name("rates.json")
# Steps that run on one worker whatever the cluster (the plan's k-means uses every core
# of that worker's machine). The local runner's parallel workers are threads of one
# interpreter: measured, 2 of them ran the 300k x 128 check no faster than one (15.3 s
# against 15.8 s), so its steps take one core's time however many threads it runs.
ONE_WORKER = ("plan", "merge", "report")
# Dataflow assumptions (docs/scale.md names them): a worker VM's start-up and shutdown,
# the vCPUs and memory of machine families, the default machine and worker count. A GPU
# speeds no step up: measured on an H200, the near stage's products there took as long
# as on 16 CPU cores (1M x 384: 33.1 s against 33.7 s, docs/near.md), since each cell's
# products are too small for it; the plan counts the worker's vCPUs only.
DATAFLOW_STARTUP_S = 240.0
DATAFLOW_DEFAULT_MACHINE = "n1-standard-1"
DATAFLOW_DEFAULT_WORKERS = 10
GB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
REMOVED_SHARE, REMOVAL_BYTES = 0.2, 100  # the merge's lines: a fifth of the records removed
SHUFFLE_RECORD_BYTES = 33  # a digest, file, position, tier per record (plus its id)
CELL_REF_BYTES = 32  # a row's reference in a cell's batch: digest, order keys, row number


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of each step on one core, as ``scripts/bench_rates.py`` measured."""

    steps: dict[str, dict[str, float]]
    startup_s: float  # the process beyond the pipeline: imports, checks, graph, exit
    baseline_rss: float  # bytes: a tiny job's whole process
    held_fixed: float  # what an in-process runner holds between steps: bytes
    held_per_byte: float  # and bytes per tensor byte
    measured: str  # where and when

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> Rates:
        """``path``, else TENSORDEDUP_RATES, else the defaults shipped in the package."""
        raw = json.loads(Path(path or os.environ.get(RATES_ENV) or DEFAULT_RATES).read_text())
        return cls(raw["steps"], raw["startup_s"], raw["baseline_rss"], raw["held_fixed"],
                   raw["held_per_byte"], raw["measured"])


def units(w: Workload, out_bytes: float | None = None) -> dict[str, dict[str, float]]:
    """Each step's work in its units (``Rates.steps`` has a rate per unit); the output
    is taken as large as the input (every record kept) unless ``out_bytes`` is given."""
    n, d = w.records, w.dim
    tensor = n * w.record_bytes
    u = {"read": {"record": n, "byte": w.file_bytes},
         "fingerprint": {"record": n, "byte": tensor},
         "exact": {"record": n},
         "write": {"record": n, "byte": w.file_bytes if out_bytes is None else out_bytes},
         # the page and the histogram read a fixed number of records back: d, not n x d
         "report": {"run": 1, "record": n, "value": d},
         "framework": {"run": 1, "record": n, "byte": tensor}}
    if w.near is not None:
        p = w.near.cells
        sample = training_rows(w) if p > 1 else 0
        u["sample"] = {"byte": tensor}  # every record's search vector, on every worker
        u["plan"] = {"madd": sample * p * d * KMEANS_ITERATIONS}  # k-means, one worker
        # one matrix product (n x p x d), then passes over the n x p scores
        u["assign"] = {"madd": n * p * d, "score": n * p} if p > 1 else {}
        u["search"] = {"madd": w.near.work * d, "record": n * w.near.joins}
        s = min(w.recall_sample, n)  # sampled x every record, through a projection when wide
        u["recall"] = {"madd": s * n * recall_width(d, s), "score": s * n, "record": n}
        u["merge"] = {"record": n}
    return u


def recall_width(dim: int, sampled: int) -> int:
    """Columns of the recall brute force's products: the projected ones
    (``transforms.near.project``) when it applies, else the records' own."""
    from transforms.near.find import PROJECT_QUERIES
    from transforms.near.project import DIM, MIN_DIM

    return DIM + 2 if dim >= MIN_DIM and sampled >= PROJECT_QUERIES else dim


def training_rows(w: Workload) -> int:
    """Sample records the plan's k-means trains on: 64 per cell, at most four fifths of
    the capped planning sample (one in five predicts the cost)."""
    from transforms.near.find import sample_cap

    return min(TRAIN_PER_CELL * w.near.cells, sample_cap(w.dim) * 4 // 5, w.records)


def step_seconds(rates: Rates, u: dict[str, dict[str, float]]) -> dict[str, float]:
    """One core's seconds per step."""
    return {step: sum(rates.steps.get(step, {}).get(k, 0.0) * v for k, v in amounts.items())
            for step, amounts in u.items()}


@dataclass(frozen=True)
class Cluster:
    """Where the job runs, as the plan needs it."""

    runner: str
    workers: int
    cores: int  # per worker
    memory: float | None  # bytes per worker, when known
    gpu: str | None  # shown in the plan's heading; it speeds no step up (above)
    threads: bool  # workers are threads of one process (the local runner)
    plan_cores: int  # cores the one-worker k-means uses (all of its machine's)
    startup_s: float  # beyond the pipeline: VMs, or the process
    assumed: tuple[str, ...] = ()


def cluster(cfg: RunnerConfig, rates: Rates) -> Cluster:
    """The runner's workers, cores and memory from the config (Dataflow: the machine type
    and max_workers, or the named defaults)."""
    from pipeline.runners.common import available_cores

    if cfg.name != "dataflow":
        workers = cfg.workers or available_cores()
        remote = cfg.address is not None
        return Cluster(cfg.name, workers, 1, None, None, cfg.name == "local" and workers > 1,
                       1 if remote else os.cpu_count() or 1, rates.startup_s,
                       ("the cluster at runner.address: runner.workers workers of one core "
                        "like this machine's",) if remote else ())
    assumed = []
    machine = cfg.machine_type or DATAFLOW_DEFAULT_MACHINE
    if cfg.machine_type is None:
        assumed.append(f"machine type unset: Dataflow's default {machine}")
    m = re.fullmatch(r"[a-z0-9]+-(standard|highmem|highcpu)-(\d+)", machine)
    vcpus, memory = (int(m.group(2)), int(m.group(2)) * GB_PER_VCPU[m.group(1)] * 2**30) \
        if m else (4, None)
    if m is None:
        assumed.append(f"machine type {machine}: 4 vCPUs assumed, memory unknown")
    workers = cfg.max_workers or cfg.num_workers or DATAFLOW_DEFAULT_WORKERS
    if not (cfg.max_workers or cfg.num_workers):
        assumed.append(f"max_workers unset: {workers} workers assumed")
    assumed.append("a vCPU does what one core of the machine that measured the rates does")
    gpu = cfg.accelerator.type if cfg.accelerator is not None else None
    if gpu is not None:
        assumed.append(f"{gpu}: speeds no step up (measured: the near products on an H200 "
                       "took as long as on 16 CPU cores); only the vCPUs count")
    return Cluster("dataflow", workers, vcpus, memory, gpu, False, vcpus,
                   rates.startup_s + DATAFLOW_STARTUP_S, tuple(assumed))


@dataclass(frozen=True)
class Capacity:
    """The plan's figures."""

    wall_s: float
    steps: dict[str, float]  # wall seconds per step
    shuffled: float  # bytes through the runner's shuffles
    spilled: float  # bytes the near stage writes beside the output
    peak_memory: float  # bytes per worker
    worker_hours: float
    cluster: Cluster


def predict(w: Workload, c: Cluster, rates: Rates, remote_spill: bool) -> Capacity:
    """The plan for workload ``w`` on cluster ``c``; ``remote_spill``: the spill is on an
    object store (cells carry copies of the vectors, not row numbers)."""
    u = units(w)
    steps = {}
    for step, amounts in u.items():
        cpu = step_seconds(rates, {step: amounts})[step]
        if step in ONE_WORKER:
            steps[step] = cpu / (c.plan_cores if step == "plan" else 1)
        elif c.threads:
            steps[step] = cpu
        else:
            steps[step] = cpu / (c.workers * c.cores)
    wall = c.startup_s + sum(steps.values())
    n, b = w.records, w.record_bytes
    shuffled = n * (SHUFFLE_RECORD_BYTES + w.id_bytes)
    spilled = 0.0
    if w.near is not None:
        copy = b if remote_spill else 0
        shuffled += n * w.near.joins * (CELL_REF_BYTES + copy)
        spilled = n * b + n * w.near.joins * (CELL_REF_BYTES + copy) \
            + min(w.recall_sample, n) * b
    return Capacity(wall, steps, shuffled, spilled, peak_memory(w, c, rates),
                    wall * c.workers / 3600, c)


def peak_memory(w: Workload, c: Cluster, rates: Rates) -> float:
    """Bytes per worker: the largest step's working set on each core, each in a process
    of its own (Dataflow starts an SDK process per vCPU), or, for the local runner's
    threads, all in one process; plus what the runner itself holds between steps: the
    local runner all of it (measured per tensor byte), a local Dask cluster or job
    service a share per worker, Dataflow none (its shuffle is a service)."""
    from transforms.near.find import sample_cap

    b, d = w.record_bytes, w.dim
    chunk = min(w.chunking.chunk_rows * b, w.chunking.chunk_bytes)
    sets = [3 * chunk]  # a chunk as read, its copy for the digests, the shard split
    alone = 0.0  # the one-worker steps' working set, while the worker's other cores idle
    if w.near is not None:
        sets += [chunk + (64 << 20),  # assignment: a chunk and its score blocks
                 3 * w.near.largest * d * 4 + 512 * 8192 * 8]  # a cell's search
        alone = max(3 * min(sample_cap(d), w.records) * d * 4 + w.near.cells * d * 16,
                    w.records * REMOVED_SHARE * REMOVAL_BYTES)  # the plan; the merge
    held = rates.held_fixed + rates.held_per_byte * w.records * b
    if c.threads or c.runner == "local":
        return rates.baseline_rss + max(c.workers * max(sets), alone) + held
    return c.cores * rates.baseline_rss + max(c.cores * max(sets), alone) + (
        0 if c.runner == "dataflow" else held / c.workers)


def _size(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def _time(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def lines(w: Workload, c: Cluster, rates: Rates, remote_spill: bool) -> list[str]:
    """The dry run's capacity lines: the figures, or what the model lacks."""
    if w.missing:
        return _lacks(w.missing)
    cap = predict(w, c, rates, remote_spill)
    near = w.near
    workers = (f"{c.workers} worker(s) x {c.cores} core(s)"
               + (f" + {c.gpu}" if c.gpu else ""))
    out = [f"capacity plan ({c.runner}, {workers}; rates: {rates.measured}):",
           f"  input: {w.records:,} records of {w.dim:,} values ({_size(w.record_bytes)} each"
           + (f", {w.sized}" if w.sized else "") + f"), {_size(w.file_bytes)} in files"]
    if near is not None:
        out.append(f"  near: {near.mode} search in {near.cells:,} cell(s), {near.joins:.2f} "
                   f"cells per record, {near.work:.3g} pairs compared, largest cell "
                   f"{near.largest:,} records ({near.source})")
    busiest = sorted(cap.steps.items(), key=lambda kv: -kv[1])[:4]
    out += [f"  wall time: {_time(cap.wall_s)} (start-up {_time(c.startup_s)}; "
            + ", ".join(f"{k} {_time(v)}" for k, v in busiest) + ")",
            f"  shuffled: {_size(cap.shuffled)}; spilled: {_size(cap.spilled)}",
            f"  peak memory per worker: {_size(cap.peak_memory)}"
            + (f" of {_size(c.memory)}" if c.memory else ""),
            f"  worker-hours: {cap.worker_hours:.3g}"
            + (f" ({cap.worker_hours * c.cores:.3g} vCPU-hours)" if c.runner == "dataflow"
               else "")]
    if near is not None and near.cells > 1 and training_rows(w) < min(
            TRAIN_PER_CELL * near.cells, w.records):
        out.append(f"  warning: the planning sample trains {near.cells:,} cells on "
                   f"{training_rows(w):,} records (fewer than {TRAIN_PER_CELL} each): the "
                   "cells will be poor (docs/scale.md#where-the-plan-itself-must-change-at-"
                   "that-scale)")
    if c.memory and cap.peak_memory > c.memory:
        out.append("  warning: the peak exceeds the worker's memory: choose a machine type "
                   "with more (runner.machine_type)")
    return out + [f"  assumed: {a}" for a in c.assumed]


def plan_lines(job: Job, records: int | None = None, rates: Rates | None = None
               ) -> list[str]:
    """The capacity lines for a checked job (``records``: plan for that many records of
    the input's kind)."""
    from transforms.io import fs

    rates = rates or Rates.load()
    return lines(workload(job, records), cluster(job.cfg.runner, rates), rates,
                 remote_spill=not fs.is_local(job.output))


def lacking(cfg: DedupeConfig, problem: str) -> list[str]:
    """The lines of a dry run that could not read its input: what the model lacks."""
    src = cfg.input
    missing = [f"records and file bytes: the input could not be read ({problem})"]
    if src.decode in ("text", "bytes"):
        missing.append(f"record size: the stored {src.decode}'s size, measured from a sample "
                       "of the records")
    elif (src.shape is None or src.dtype is None) and not (
            src.decode == "image" and src.resize is not None):
        missing.append("record size: input.shape and input.dtype are not both set")
    if cfg.near is not None:
        missing.append("near cells per record: the planner needs a sample of the vectors")
    missing.append("to plan offline: point input.path at a local sample of the data and "
                   "give --plan-records N (the full set's records)")
    return _lacks(missing)


def _lacks(missing: list[str]) -> list[str]:
    return ["capacity plan: not computed; the model lacks:"] + [f"  {m}" for m in missing]
