"""A job that fails in a worker process says so in one line (issue 41): without --verbose,
nothing the workers, the job service or a Dask cluster logs on the way (a failed step's
traceback, logged by every worker that ran it, then by the runner) reaches the terminal;
with --verbose it does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = {"processes": ["runner.processes=true"], "portable": ["runner.name=portable"],
           "dask": ["runner.name=dask"]}


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory) -> Path:
    """3,000 rows of 64 floats, every fourth null: 25% invalid, over the default 10%."""
    path = tmp_path_factory.mktemp("bad") / "bad.parquet"
    x = np.random.default_rng(2).standard_normal((3000, 64)).astype(np.float32)
    values = [None if i % 4 == 0 else row.tolist() for i, row in enumerate(x)]
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(3000)],
                             "emb": pa.array(values, pa.list_(pa.float32()))}), path)
    return path


def run(tmp_path: Path, source: Path, *sets: str, verbose: bool = False):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({
        "input": {"format": "parquet", "path": str(source), "tensor": "emb", "id": "id"},
        "near": {"metric": "cosine", "threshold": 0.01},
        "output": {"path": str(tmp_path / "out" / "clean")},
        "report": str(tmp_path / "out" / "report")}))
    argv = [sys.executable, "-m", "pipeline.run", "--config", str(cfg),
            *(["--verbose"] if verbose else []), *[a for s in sets for a in ("--set", s)]]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


def said(stderr: str) -> list[str]:
    """stderr less what a run shows as it goes: progress lines, the start line and the
    near stage's notes."""
    return [ln for ln in stderr.splitlines()
            if ln and not ln.startswith(("[", "deduplicating ", "near: "))]


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_failure_in_a_worker_process_is_one_line(tmp_path, bad_input, runner):
    r = run(tmp_path, bad_input, *RUNNERS[runner])
    assert r.returncode == 1
    (line,) = said(r.stderr)
    assert line.startswith("error: the job failed") and "max_invalid_fraction" in line
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_verbose_keeps_the_workers_tracebacks(tmp_path, bad_input):
    r = run(tmp_path, bad_input, *RUNNERS["processes"], verbose=True)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "TooManyInvalidError" in r.stderr
    assert said(r.stderr)[-1].startswith("error: the job failed")
