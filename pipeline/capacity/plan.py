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
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.capacity.jaccard import (
    KEY_SHARDS,
    SET_ONE_WORKER,
    SET_SHARDED,
    plan_sample,
    set_shuffled,
    set_spilled,
    set_units,
    working_sets,
)
from pipeline.capacity.workload import DRAWN, Workload, workload
from pipeline.config import DedupeConfig
from pipeline.config.runner import RunnerConfig
from pipeline.job import Job
from pipeline.runners.common import shuffle_carries_rows
from transforms.io.formats.base import rows_within
from transforms.io.layout import FILE_ROWS
from transforms.io.streams import REMOTE_READS
from transforms.near.plan import KMEANS_ITERATIONS, TRAIN_PER_CELL

RATES_ENV = "TENSORDEDUP_RATES"
DEFAULT_RATES = Path(__file__).with_name("rates.json")
# Steps that run on one worker whatever the cluster (the plan's k-means uses every core
# of that worker's machine). The local runner's parallel workers are threads of one
# interpreter: measured, 2 of them ran the 300k x 128 check no faster than one (15.3 s
# against 15.8 s), so its steps take one core's time however many threads it runs.
ONE_WORKER = ("plan", "merge", "report", "store")
POOLED = ("decode",)  # on every core even in the local runner's threads: Pillow decodes
# in a pool of threads (``transforms.io.formats.encoded``) and releases the GIL
# A fingerprint store (docs/runs.md): its stored values are read on one worker (the
# "store" step, at the read step's rates: Parquet files of values), and each new digest's
# lookup reads a bucket of a digest segment: 18 us a read when each needs its own
# (scripts/bench_incremental.py, 100,000 new digests against 64M stored, local disk).
LOOKUP_READ_S = 18e-6
# Dataflow assumptions (docs/scale.md names them): a worker VM's start-up and shutdown,
# the vCPUs and memory of machine families, the default machine and worker count. A GPU
# speeds no step up: measured on an H200, the near stage's products there took as long
# as on 16 CPU cores (1M x 384: 33.1 s against 33.7 s, docs/near.md), since each cell's
# products are too small for it; the plan counts the worker's vCPUs only.
DATAFLOW_STARTUP_S = 240.0
REQUEST_S = 0.02  # an object store's round trip per request (GCS: about 10-50 ms)
DATAFLOW_DEFAULT_MACHINE = "n1-standard-1"
DATAFLOW_DEFAULT_WORKERS = 10
GB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
REMOVED_SHARE, REMOVAL_BYTES = 0.2, 100  # removal lines: a fifth of the records removed
# The near merge's records: those cells leave open or in doubt (with their values), 788
# of 960,000 searched at 1M x 128 with default settings; the cells send their removals
# to their files themselves (pipeline/steps/near.py), 16 cells' lines at a time.
OPEN_SHARE = 0.001
SURE_CELLS = 16
# The recall's pairs its projected blocks compare, of all (data blocks paired with the
# sampled rows by the top principal coordinate, transforms/near/search.py): measured on
# 1M x 128 embedding-like vectors, a chunk's brute force 0.19 s against 0.58 s whole.
WINDOW_SHARE = 0.33
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
    held_per_line: float = 0.0  # jaccard: and bytes per byte of key lines
    process_s: float = 0.0  # jaccard, local worker processes: their start and hand-offs
    process_record: float = 0.0  # and seconds per record (elements between processes)
    process_rss: float = 0.0  # bytes: each worker process beyond its working set
    jaccard: Rates | None = None  # the rates of jobs with near.metric jaccard

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> Rates:
        """``path``, else TENSORDEDUP_RATES, else the defaults shipped in the package."""
        raw = json.loads(Path(path or os.environ.get(RATES_ENV) or DEFAULT_RATES).read_text())
        return cls.of(raw)

    @classmethod
    def of(cls, raw: dict) -> Rates:
        """Rates from their JSON (a ``jaccard`` section: the jaccard jobs' own)."""
        return cls(raw["steps"], raw["startup_s"], raw["baseline_rss"], raw["held_fixed"],
                   raw["held_per_byte"], raw["measured"],
                   **{k: raw[k] for k in ("held_per_line", "process_s", "process_record",
                                          "process_rss") if k in raw},
                   jaccard=cls.of(raw["jaccard"]) if "jaccard" in raw else None)


def units(w: Workload, out_bytes: float | None = None) -> dict[str, dict[str, float]]:
    """Each step's work in its units (``Rates.steps`` has a rate per unit); the output
    is taken as large as the input (every record kept) unless ``out_bytes`` is given."""
    n, d = w.records, w.dim
    tensor = n * w.record_bytes
    ns = w.searched  # the near stage's records: the input's and a store's values
    u = {"read": {"record": n, "byte": w.file_bytes},
         "fingerprint": {"record": n, "byte": tensor},
         "exact": {"record": n},
         "write": {"record": n, "byte": w.file_bytes if out_bytes is None else out_bytes},
         # the page and the histogram read a fixed number of records back: d, not n x d;
         # the report's tables are written per file ("parts", on every worker) and joined
         # into one file on the report's worker while they hold at most FILE_ROWS rows
         "parts": {"record": n},
         "report": {"run": 1, "record": min(n, FILE_ROWS / REMOVED_SHARE), "value": d},
         "framework": {"run": 1, "record": ns, "byte": ns * w.record_bytes}}
    if w.stored is not None:
        u["lookup"] = {"read": w.stored.lookups}
        if w.stored.values:
            u["store"] = {"record": w.stored.values, "byte": w.stored.value_bytes}
    if w.near is not None:
        p = w.near.cells
        scored = w.near.scored or p  # two levels: coarse + joined coarse x fine per coarse
        sample = training_rows(w) if p > 1 else 0
        u["sample"] = {"byte": ns * w.record_bytes}  # every record's search vector
        # k-means, one worker (two levels: each sample row meets coarse + its coarse's fine)
        u["plan"] = {"madd": sample * (w.near.trained or p) * d * KMEANS_ITERATIONS}
        # one matrix product per level (n x scored x d), then passes over the scores
        # ... and each cell a record joins, ranked and listed
        u["assign"] = ({"madd": ns * scored * d, "score": ns * scored,
                        "join": ns * w.near.joins} if p > 1 else {})
        u["search"] = {"madd": w.near.work * d, "record": ns * w.near.joins}
        s = min(w.recall_sample, ns)  # sampled x every record, through a projection when wide
        width = recall_width(d, s)
        share = WINDOW_SHARE if width != d else 1.0  # projected: blocks paired, fewer pairs
        u["recall"] = {"madd": s * ns * width * share, "score": s * ns * share, "record": ns}
        u["merge"] = {"run": 1, "record": ns}  # a fixed part, and the open records (~n)
    if w.decode_s:  # timed by the dry run itself, in seconds
        u["decode"] = {"second": n * w.decode_s}
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

    return min(TRAIN_PER_CELL * w.near.cells, sample_cap(w.dim) * 4 // 5, w.searched)


def step_seconds(rates: Rates, u: dict[str, dict[str, float]]) -> dict[str, float]:
    """One core's seconds per step."""
    return {step: sum(_rates_of(rates, step).get(k, 0.0) * v for k, v in amounts.items())
            for step, amounts in u.items()}


def _rates_of(rates: Rates, step: str) -> dict[str, float]:
    """A step's rates; a store's steps, which the rates file does not measure, at the
    read step's (its stored values) and ``LOOKUP_READ_S`` (its digest lookups); the
    images' decoding in the seconds the dry run timed (``workload.decode_seconds``)."""
    if step in rates.steps:
        return rates.steps[step]
    return {"store": rates.steps.get("read", {}), "lookup": {"read": LOOKUP_READ_S},
            "decode": {"second": 1.0}}.get(step, {})


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
    processes: bool = False  # the local runner's workers are processes (runner.processes)


def _machine_memory() -> float:
    """This machine's memory in bytes (the local runner's workers share it)."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _memory_warning(cap: Capacity) -> list[str]:
    """A line where the planned peak passes what a worker has."""
    c = cap.cluster
    if not c.memory or cap.peak_memory <= c.memory:
        return []
    if c.runner == "dataflow":
        return ["  warning: the peak exceeds the worker's memory: choose a machine type "
                "with more (runner.machine_type)"]
    return [f"  warning: the peak exceeds this machine's memory ({_size(_machine_memory())}) "
            f"shared by {c.workers} worker(s): lower runner.workers, or run on a larger "
            "machine or on Dataflow (runner.name: dataflow)"]


def cluster(cfg: RunnerConfig, rates: Rates) -> Cluster:
    """The runner's workers, cores and memory from the config (Dataflow: the machine type
    and max_workers, or the named defaults)."""
    from pipeline.runners.common import available_cores

    if cfg.name != "dataflow":
        workers = cfg.workers or available_cores()
        remote = cfg.address is not None
        mine = None if remote else _machine_memory() / workers  # its workers share it
        return Cluster(cfg.name, workers, 1, mine, None, cfg.name == "local" and workers > 1,
                       1 if remote else os.cpu_count() or 1, rates.startup_s,
                       ("the cluster at runner.address: runner.workers workers of one core "
                        "like this machine's",) if remote else (),
                       cfg.name == "local" and workers > 1 and bool(cfg.processes))
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
    object store (cells carry copies of the vectors, not row numbers: in the shuffle
    itself where the runner carries them, ``shuffle_carries_rows``, else in spill files)."""
    u = units(w)
    steps = {}
    for step, amounts in u.items():
        cpu = step_seconds(rates, {step: amounts})[step]
        if step in ONE_WORKER:
            steps[step] = cpu / (c.plan_cores if step == "plan" else 1)
        elif c.threads and step not in POOLED:
            steps[step] = cpu
        else:
            steps[step] = cpu / (c.workers * c.cores)
    wall = c.startup_s + sum(steps.values())
    n, b = w.records, w.record_bytes
    held = w.searched - n  # a store's values: spread by a shuffle, carried into the cells
    shuffled = n * (SHUFFLE_RECORD_BYTES + w.id_bytes) + held * (b + w.id_bytes + 16)
    spilled = 0.0
    if w.near is not None:
        carried = shuffle_carries_rows(c.runner)
        cells = w.near.joins * (w.searched * CELL_REF_BYTES + held * b
                                + (n * b if remote_spill or carried else 0))
        shuffled += cells
        spilled = n * b + (0 if carried else cells) \
            + min(w.recall_sample, w.searched) * b
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
                 3 * w.near.largest * d * 4 + 512 * 8192 * 8,  # a cell's search
                 SURE_CELLS * w.near.largest * REMOVED_SHARE * REMOVAL_BYTES]  # lines
        alone = max(3 * min(sample_cap(d), w.searched) * d * 4 + w.near.cells * d * 16,
                    w.searched * OPEN_SHARE * (b + REMOVAL_BYTES)  # the plan; the merge
                    + w.recall_sample * 64 * REMOVAL_BYTES)
    if w.stored is not None and w.stored.values:  # the store's values, read in batches
        alone = max(alone, 3 * min(w.stored.values, 65536) * b)
    held = rates.held_fixed + rates.held_per_byte * w.searched * b
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


def _figures(cap: Capacity, steps: dict[str, float]) -> list[str]:
    """The lines every plan has: wall time (the four longest ``steps`` named), bytes,
    memory and worker-hours."""
    c = cap.cluster
    busiest = sorted(((k, v) for k, v in steps.items() if v > 0), key=lambda kv: -kv[1])[:4]
    return [f"  wall time: {_time(cap.wall_s)} (start-up {_time(c.startup_s)}; "
            + ", ".join(f"{k} {_time(v)}" for k, v in busiest) + ")",
            f"  shuffled: {_size(cap.shuffled)}; spilled: {_size(cap.spilled)}",
            f"  peak memory per worker: {_size(cap.peak_memory)}"
            + (f" of {_size(c.memory)}" if c.memory else ""),
            f"  worker-hours: {cap.worker_hours:.3g}"
            + (f" ({cap.worker_hours * c.cores:.3g} vCPU-hours)" if c.runner == "dataflow"
               else "")]


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
    if w.decode_timed:
        out.append(f"  decode: {w.decode_s * 1e6:,.0f} us of one core per image, timed here on "
                   f"{w.decode_timed:,} of the first file's images (not in the rates)")
    if w.stored is not None:
        out.append(w.stored.line())
    if near is not None:
        held = (f" of {w.searched:,} records ({w.records:,} new + {w.searched - w.records:,} "
                "stored)" if w.searched > w.records else "")
        out.append(f"  near: {near.mode} search in {near.cells:,} cell(s){held}, "
                   f"{near.joins:.2f} cells per record, {near.work:.3g} pairs compared, "
                   f"largest cell {near.largest:,} records ({near.source})")
    out += _figures(cap, cap.steps)
    if near is not None and near.cells > 1 and training_rows(w) < min(
            TRAIN_PER_CELL * near.cells, w.searched):
        out.append(f"  warning: the planning sample trains {near.cells:,} cells on "
                   f"{training_rows(w):,} records (fewer than {TRAIN_PER_CELL} each): the "
                   "cells will be poor (docs/scale.md#where-the-plan-itself-must-change-at-"
                   "that-scale)")
    out += _memory_warning(cap)
    if near is not None and near.cells > 1 and shuffle_carries_rows(c.runner):
        out.append(f"  shuffle: the cells' rows travel in the runner's shuffle, values "
                   f"included ({near.joins:.2f} copies of each record), none through spill "
                   "files: no request per cell and chunk (docs/scale.md, the spill on "
                   "Cloud Storage)")
    elif near is not None and near.cells > 1 and remote_spill:
        slices = slice_reads(w)
        # two requests per slice: the object's metadata (the reader's open), then its range
        wait = 2 * slices * REQUEST_S / REMOTE_READS / (c.workers * c.cores)
        out.append(f"  object store: each cell reads its slice of every chunk's spill file it "
                   f"has rows in: about {slices:.3g} ranged reads ({slices / near.cells:,.0f} "
                   f"per cell, {REMOTE_READS} at a time), about {_time(wait)} of waiting per "
                   f"core at {REQUEST_S * 1000:.0f} ms a request, not in the wall time "
                   "(docs/scale.md, the spill on Cloud Storage)")
    return out + [f"  assumed: {a}" for a in c.assumed]


def slice_reads(w: Workload) -> float:
    """(chunk, cell) slices of the near spill: a chunk of r records, each joining j of the
    P cells, holds rows of about P (1 - e^(-r j / P)) cells (records spread over cells
    independently of the chunk they arrive in)."""
    rows = min(rows_within(w.chunking.chunk_rows, w.chunking.chunk_bytes, w.record_bytes),
               max(w.searched, 1))
    cells = w.near.cells
    return math.ceil(w.searched / rows) * cells * -math.expm1(-rows * w.near.joins / cells)


def _spread(c: Cluster) -> int:
    """Cores a jaccard job's parallel steps spread over: every core of the cluster; the
    local runner's worker processes (at most this machine's cores); one for its threads,
    which share one interpreter (as for vectors)."""
    if c.runner != "local":
        return c.workers * c.cores
    return min(c.workers, os.cpu_count() or 1) if c.processes else 1


def predict_sets(w: Workload, c: Cluster, rates: Rates) -> Capacity:
    """The plan of a jaccard job: ``rates`` are the jaccard jobs' (``Rates.jaccard``).
    The one-worker steps take one core's time, the sharded ones spread over at most
    their shards, the rest over every core; local worker processes add their start and
    hand-offs."""
    s = w.sets
    u = set_units(w.records, w.file_bytes, w.record_bytes, s, w.recall_sample, w.chunks)
    if w.stored is not None:  # a store: the new digests' lookups, its sets read
        u["lookup"] = {"read": w.stored.lookups}
        if w.stored.values:
            u["store"] = {"record": w.stored.values, "byte": w.stored.value_bytes}
    cores = _spread(c)
    steps = {step: step_seconds(rates, {step: amounts})[step]
             / (1 if step in SET_ONE_WORKER else min(cores, SET_SHARDED.get(step, cores)))
             for step, amounts in u.items()}
    if c.processes:
        steps["processes"] = rates.process_s + rates.process_record * w.records
    wall = c.startup_s + sum(steps.values())
    moved = sum(set_shuffled(w.records, w.id_bytes, s).values())
    return Capacity(wall, steps, moved, set_spilled(w.records, w.id_bytes, s),
                    set_memory(w, c, rates), wall * c.workers / 3600, c)


def set_memory(w: Workload, c: Cluster, rates: Rates) -> float:
    """Bytes per worker of a jaccard job: the largest step's working set on each core
    (``jaccard.working_sets``), the one-worker steps' alone; the local runner holds its
    elements between steps (fitted per text byte and per key line byte), its worker
    processes a baseline each; a Dataflow worker runs an SDK process per vCPU."""
    s = w.sets
    ws = working_sets(w.records, w.record_bytes, s, _chunk_rows(w), w.recall_sample,
                      plan_sample(w.near_spec))
    slots = (_spread(c) if c.processes else c.workers) if c.runner == "local" else c.cores
    hosts = 1 if c.runner == "local" else c.workers  # a sharded step's bundles spread over them
    each = max(v * (min(slots, math.ceil(SET_SHARDED[k] / hosts)) if k in SET_SHARDED
                    else slots) for k, v in ws.items() if k not in SET_ONE_WORKER)
    alone = max(ws[k] for k in SET_ONE_WORKER if k in ws)
    held = (rates.held_fixed + rates.held_per_byte * w.records * w.record_bytes
            + rates.held_per_line * set_shuffled(w.records, w.id_bytes, s)["keys"])
    if c.runner == "local":
        return (rates.baseline_rss + held + max(each, alone)
                + (c.workers * rates.process_rss if c.processes else 0))
    return c.cores * rates.baseline_rss + max(each, alone) + (
        0 if c.runner == "dataflow" else held / c.workers)


def _chunk_rows(w: Workload) -> int:
    return max(1, round(w.records / max(w.chunks, 1)))


# The stages a jaccard plan names: (name, its steps); "shuffle" is the framework's time
# per key line (the key lines' and the grouped lines' GroupByKeys).
SET_STAGES = (("read, digests, exact dedup", ("read", "exact")),
              ("shingles (+ spill)", ("fingerprint",)),
              ("keys", ("keys",)),
              ("key shuffle (GroupByKey)", ("shuffle",)),
              ("candidate groups", ("groups",)),
              ("components (one worker)", ("components",)),
              ("verification and decisions", ("decide",)),
              ("merge, report (one worker)", ("merge", "report")),
              ("report's tables, per file", ("parts",)),
              ("plan sample, recall", ("plan", "recall")),
              ("write", ("write",)),
              ("framework", ("framework", "processes")))
STORE_STAGE = ("store: sets read (one worker), lookups", ("store", "lookup"))


def set_lines(w: Workload, c: Cluster, rates: Rates, remote_spill: bool) -> list[str]:
    """The dry run's capacity lines of a jaccard job: its stages with their time, working
    memory and bytes, then the figures every plan has."""
    s, spec = w.sets, w.near_spec
    cap = predict_sets(w, c, rates)
    n = w.records
    steps = dict(cap.steps)
    line_s = rates.steps.get("framework", {}).get("line", 0.0) * set_units(
        n, w.file_bytes, w.record_bytes, s, w.recall_sample, w.chunks)["framework"]["line"]
    steps["shuffle"] = min(line_s / _spread(c), steps["framework"])
    steps["framework"] -= steps["shuffle"]
    ws = working_sets(n, w.record_bytes, s, _chunk_rows(w), w.recall_sample,
                      plan_sample(spec))
    moved = set_shuffled(n, w.id_bytes, s)
    keys = (f"signatures + band keys ({s.bands} x {s.rows})" if s.mode == "bounded"
            else "prefix tokens")
    said = {
        "read, digests, exact dedup": f"{_size(w.file_bytes)} read, "
                                      f"{_size(moved['digests'])} shuffled (digests)",
        "shingles (+ spill)": f"{_size(set_spilled(n, w.id_bytes, s))} of sets spilled",
        "keys": f"{n * s.entering * s.lines:,.0f} key lines",
        "key shuffle (GroupByKey)": f"{_size(moved['keys'])} moved, {KEY_SHARDS} key shards",
        "candidate groups": f"{n * s.groups:,.0f} groups of {n * s.grouped:,.0f} records "
                            f"({s.grouped:.1%}), largest {s.largest_group:,}",
        "components (one worker)": f"{_size(moved['groups'])} gathered, largest component "
                                   f"{s.largest_component:,} records",
        "verification and decisions": f"{n * s.compared:,.0f} pairs verified, "
                                      f"{n * s.removed:,.0f} removed",
        "merge, report (one worker)": f"{n * s.removed:,.0f} removal lines merged, "
                                      f"{min(n * s.removed, FILE_ROWS):,.0f} joined",
        "report's tables, per file": f"{n * s.removed:,.0f} rows written",
        "plan sample, recall": f"{min(w.recall_sample, n):,} sampled records x "
                               f"{w.chunks:,} chunks",
        "write": f"{_size(w.file_bytes)} written (at most)",
        "framework": "Beam's coders, bundles"
                     + (", worker processes" if c.processes else ""),
    }
    workers = (f"{c.workers} worker(s) x {c.cores} core(s)"
               + (" (processes)" if c.processes else "") + (f" + {c.gpu}" if c.gpu else ""))
    sh = spec.shingles
    out = [f"capacity plan ({c.runner}, {workers}; rates: {rates.measured}):",
           f"  input: {n:,} records of {_size(w.record_bytes)} each ({w.sized}), "
           f"{_size(w.file_bytes)} in files",
           f"  near: jaccard >= {spec.threshold:g} over {sh.unit} {sh.n}-grams, mode "
           f"{s.mode} ({s.why}); {s.shingles:.0f} shingles and {s.lines:.1f} keys per record",
           f"  candidates: {s.source}",
           "  stages (wall time on this cluster; working memory per core; what moves):"]
    if w.stored is not None:
        out.insert(2, w.stored.line())
        said[STORE_STAGE[0]] = (f"{w.stored.values:,} stored sets read, "
                                f"{w.stored.lookups:,.0f} bucket reads")
    for name, parts in SET_STAGES + ((STORE_STAGE,) if w.stored is not None else ()):
        t = sum(steps.get(p, 0.0) for p in parts)
        mem = max((ws.get(p, 0.0) for p in parts), default=0.0)
        stage = keys if name == "keys" else name
        out.append(f"    {stage}: {f'{t:.1f} s' if t < 10 else _time(t)}; "
                   + (f"{_size(mem)}; " if mem else "") + said[name])
    out += _figures(cap, steps)
    return out + _set_warnings(w, c, cap, ws, remote_spill) + [
        f"  assumed: {a}" for a in (*c.assumed, *_set_assumptions(w))]


def _set_warnings(w: Workload, c: Cluster, cap: Capacity, ws: dict[str, float],
                  remote_spill: bool) -> list[str]:
    """Where a jaccard plan meets the job's limits at this size."""
    out = []
    cores = _spread(c)
    if cores > KEY_SHARDS:
        out.append(f"  warning: candidate groups and decisions run in {KEY_SHARDS} shards: "
                   f"{KEY_SHARDS} of the {cores:,} cores work on them")
    if c.memory and ws["components"] > c.memory / 2:
        out.append(f"  warning: the components step holds {_size(ws['components'])} of "
                   "grouped lines on one worker")
    if c.memory and ws["decide"] > c.memory / max(c.cores, 1):
        out.append(f"  warning: a decision batch (the largest component, "
                   f"{w.sets.largest_component:,} records) holds {_size(ws['decide'])}, "
                   "more than a core's share of the worker's memory")
    if remote_spill:
        out.append(f"  warning: on an object store each of the {KEY_SHARDS} decision batches "
                   "reads whole spill files: up to "
                   f"{_size(KEY_SHARDS * set_spilled(w.records, w.id_bytes, w.sets))} read")
    out += _memory_warning(cap)
    return out


def _set_assumptions(w: Workload) -> list[str]:
    """What a jaccard plan takes for granted."""
    out = [] if w.whole else [f"records {DRAWN[False]} are a uniform sample of the input "
                              "(the job samples by digest over every record)"]
    if w.sets.sampled < w.records * w.sets.valid * w.sets.distinct:
        out.append("the input is duplicated throughout as in its sample: records in "
                   "candidate groups, pairs verified and removals per record stay as "
                   "measured; the largest group and component grow as they grew within it")
    return out


def plan_lines(job: Job, records: int | None = None, rates: Rates | None = None
               ) -> list[str]:
    """The capacity lines for a checked job (``records``: plan for that many records of
    the input's kind)."""
    from transforms.io import fs

    rates = rates or Rates.load()
    w = workload(job, records)
    remote = not fs.is_local(job.output)
    if w.sets is None or w.missing:
        return lines(w, cluster(job.cfg.runner, rates), rates, remote_spill=remote)
    if rates.jaccard is None:
        return _lacks(["rates of the jaccard stage: the rates file has no 'jaccard' section "
                       "(scripts/bench_rates.py --jaccard measures them)"])
    return set_lines(w, cluster(job.cfg.runner, rates.jaccard), rates.jaccard, remote)


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
    if cfg.near is not None and cfg.near.metric == "jaccard":
        missing.append("near jaccard: shingles, keys and candidate groups per record, from "
                       "a sample of the records")
    elif cfg.near is not None:
        missing.append("near cells per record: the planner needs a sample of the vectors")
    missing.append("to plan offline: point input.path at a local sample of the data and "
                   "give --plan-records N (the full set's records)")
    return _lacks(missing)


def _lacks(missing: list[str]) -> list[str]:
    return ["capacity plan: not computed; the model lacks:"] + [f"  {m}" for m in missing]
