"""The local runner's worker processes (``runner.processes``, ``pipeline.runners.local``): a
near job on them gives the bytes one in-process worker gives, the CLI shows their
progress and none of Beam's worker chatter, and the default picks them for near jobs
only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import ConfigError, parse_config
from pipeline.preflight import prepare
from tests.test_dask import (  # noqa: F401 (near_input: a fixture)
    NEAR_ROWS,
    assert_same_runs,
    near_input,
    near_sets,
)
from tests.test_runners import ROOT, ROWS, run_on


def test_near_job_on_worker_processes_matches_one_worker(tmp_path, near_input):  # noqa: F811
    """Exact + near with a reference set and a store, 51,500 rows: two worker processes
    (the default for a near job on 2+ cores) write the same clean shards, report files,
    counts and store as one in-process worker."""
    runs = {}
    for name, sets in (("one", ("runner.workers=1",)),
                       ("processes", ("runner.workers=2", "runner.processes=true"))):
        store = tmp_path / f"{name}-store"
        shutil.copytree(near_input / "store", store)
        runs[name] = run_on(tmp_path / name, near_input / "in", *sets,
                            *near_sets("representative", near_input, store))
    one, procs = runs["one"], runs["processes"]
    assert procs["config"]["runner"]["processes"] is True
    assert one["near"]["cells"] > 1 and one["removed_near"] > 0
    assert one["read"] == ROWS + NEAR_ROWS
    assert_same_runs(tmp_path, runs, "one", "processes")


def test_the_cli_shows_the_workers_progress_and_not_their_logs(tmp_path):
    """A near job on two worker processes through the CLI, stderr a pipe: the workers'
    stages appear as progress lines, and no worker log line (Beam's INFO chatter, its
    import warnings) reaches the terminal."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4000, 48)).astype(np.float32)
    x[3000:] = x[:1000] + rng.normal(0, 1e-4, (1000, 48)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(x))], "emb": list(x)}),
                   tmp_path / "in.parquet")
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "in.parquet"),
                     "tensor": "emb", "id": "id"},
           "near": {"metric": "cosine", "threshold": 0.01},
           "runner": {"workers": 2, "processes": True},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "pipeline.run", "--config",
                           str(tmp_path / "job.yaml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(ln.startswith("[near search] 1/1 cells done") for ln in lines), lines
    assert any(ln.startswith("[write] 1/1 files done") for ln in lines), lines
    assert [ln for ln in lines if ln.startswith(("INFO:", "WARNING:", "DEBUG:"))] == []
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["config"]["runner"]["processes"] is True
    assert summary["removed_near"] >= 1000


def test_processes_are_the_default_for_near_jobs_without_a_model(tmp_path):
    """Unset ``runner.processes``: true with a near section over narrow records in 32 MB of
    input files or more (their start costs more than they gain below), false for less, for
    an exact-only job and for wide records, as given when set; only the local runner takes
    the key."""
    from pipeline.preflight import PROCESS_INPUT_BYTES

    rng = np.random.default_rng(0)
    pad = [rng.bytes(PROCESS_INPUT_BYTES // 2) for _ in range(2)]  # random: no smaller
    base = {"input": {"format": "parquet", "path": str(tmp_path / "*.parquet"),
                      "tensor": "emb", "id": "id"},
            "output": {"path": str(tmp_path / "o")}, "report": str(tmp_path / "r")}
    near = {"near": {"metric": "l2", "threshold": 0.1}}

    def resolved(extra: dict, sets: tuple[str, ...] = ()) -> bool | None:
        return prepare(parse_config({**base, **extra}, list(sets))).cfg.runner.processes

    def write(emb: list, big: bool) -> None:
        for f in tmp_path.glob("*.parquet"):
            f.unlink()
        pq.write_table(pa.table({"id": ["a", "b"], "emb": emb}), tmp_path / "in.parquet")
        if big:  # a second file: the bytes of every input file count
            pq.write_table(pa.table({"id": ["c", "d"], "emb": emb, "pad": pad}),
                           tmp_path / "pad.parquet", compression="none")

    write([[1.0, 2.0], [1.0, 2.0]], big=False)
    assert resolved(near) is False
    assert resolved(near, ("runner.processes=true",)) is True
    write([[1.0, 2.0], [1.0, 2.0]], big=True)
    assert sum(f.stat().st_size for f in tmp_path.glob("*.parquet")) > PROCESS_INPUT_BYTES
    assert resolved(near) is True
    assert resolved({}) is False
    write(list(np.zeros((2, 64 * 64 * 3), np.uint8)), big=True)  # 12 KB records: threads
    assert resolved(near) is False
    assert resolved(near, ("runner.processes=true",)) is True
    assert resolved(near, ("runner.processes=false",)) is False
    with pytest.raises(ConfigError, match="runner.name: local"):
        parse_config({**base, "runner": {"name": "dask", "processes": True}}, [])


def test_worker_processes_start_with_few_malloc_arenas(monkeypatch):
    """glibc keeps each thread's freed memory in its own arena (8 per core): the workers
    start with MALLOC_ARENA_MAX=2 (1M copies of one record: 3.18 -> 2.7 GB at peak), and
    Arrow's mimalloc with no purge delay, unless the user set them; the command's
    environment runs as the shell reads it."""
    from pipeline.runners import local as processes

    for user, want, purge in ((None, "2", "0"), ("4", "4", "10")):
        if user is None:
            monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
            monkeypatch.delenv("MIMALLOC_PURGE_DELAY", raising=False)
        else:
            monkeypatch.setenv("MALLOC_ARENA_MAX", user)
            monkeypatch.setenv("MIMALLOC_PURGE_DELAY", purge)
        with processes._local_workers() as command:
            shown = command.replace(f"exec {sys.executable} -m pipeline.processes",
                                    "exec env")
            out = subprocess.run(["sh", "-c", shown], capture_output=True, text=True,
                                 check=True).stdout
        assert f"MALLOC_ARENA_MAX={want}\n" in out
        assert f"MIMALLOC_PURGE_DELAY={purge}\n" in out  # Arrow's allocator, likewise


STREAM_CHECK = """
import ctypes, gc, sys
import apache_beam as beam
import numpy as np
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from pipeline.runners import local as processes

def mapped(_):  # bytes of large blocks malloc holds live (mmap'd): the 160 MB arrays'
    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Mallinfo2
    return libc.mallinfo2().hblkhd

if sys.argv[1] == "drop":
    processes.finished_outputs_dropped()
with beam.Pipeline(runner=FnApiRunner()) as p:
    (p | beam.Create([0]) | beam.Map(lambda _: np.ones(20_000_000))  # one 160 MB element
     | "Apart" >> beam.Reshuffle() | beam.Map(lambda a: a.nbytes)
     | "Later" >> beam.Reshuffle() | beam.Map(mapped) | beam.Map(lambda b: print(b >> 20)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallinfo2")
def test_a_finished_stage_lets_go_of_its_output_buffer():
    """Beam's worker kept a finished stage's output stream, whose buffer had grown to
    hold its largest element, until the job ended (one crowd's cell: 0.5 GB). With the
    streams dropped, a later stage sees at least that much less memory held."""
    def held(how: str) -> int:
        out = subprocess.run([sys.executable, "-c", STREAM_CHECK, how], capture_output=True,
                             text=True, check=True,
                             cwd=os.path.dirname(os.path.dirname(__file__))).stdout
        return int(out.split()[-1])

    kept, dropped = held("keep"), held("drop")
    assert kept - dropped >= 150, (kept, dropped)  # MB: the 160 MB element's buffer


TRIM_CHECK = """
import gc, os, sys, time
from pipeline.runners import local as processes

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

base = rss()
blocks = [bytearray(4000) for _ in range(100_000)]  # 400 MB of heap, not mmap'd
kept = blocks[::500]  # a few live blocks all along the heap: its top cannot shrink
del blocks
gc.collect()
held = rss() - base
with processes.freed_memory_released():
    deadline = time.monotonic() + 30
    while rss() - base > 100 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
print(held >> 20, (rss() - base) >> 20, len(kept))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_local_processes_hand_freed_heap_memory_back():
    """glibc keeps freed memory in the middle of its heap resident; the local runner's
    processes return it in the background (a finished step's pieces otherwise stack on
    the next step's peak: one crowd of 750k records, components, 3.1 -> 2.7 GB)."""
    out = subprocess.run([sys.executable, "-c", TRIM_CHECK], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout
    held, after, _ = (int(v) for v in out.split())
    assert held > 300  # MB: freed, still resident, as glibc leaves it
    assert after < 100  # handed back by the trimming thread
