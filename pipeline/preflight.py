"""Everything checked before any work: input files, fields, shapes, output paths.

Why up front: a job that fails after an hour because of a typo in a column name,
or that writes its output over its input, is the worst experience a batch tool
can give. Every problem here is one line naming the key or file and the fix.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import DedupeConfig, keep_policy
from transforms.formats import get_format
from transforms.formats.base import InputError, TensorSpec
from transforms.near import NearSpec


@dataclass(frozen=True)
class Job:
    """A checked config, resolved into what the graph needs."""

    cfg: DedupeConfig
    files: list[str]  # sorted: the "first" order
    root: str  # common directory of the inputs: output names are relative to it
    spec: TensorSpec  # from the config: what every record is read and checked against
    resolved: TensorSpec  # shape and dtype as the first file has them (for the summary)
    keep: tuple[str, str | None]  # ("first"|"last", None) | ("max"|"min", column)
    output: Path
    report: Path
    run_id: str
    near: NearSpec | None = None  # the near stage's settings, when it is on

    def staging(self, final: Path) -> Path:
        return final.parent / f".{final.name}.staging-{self.run_id}"


def output_name(path: str, root: str) -> str:
    """Where an input file's clean copy goes, relative to output.path."""
    return os.path.relpath(path, root)


def _files(pattern: str) -> list[str]:
    files = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not files:
        raise InputError(f"input.path: no files match {pattern!r} (relative to "
                         f"{os.getcwd()}): fix the path or glob")
    return files


def _check_paths(cfg: DedupeConfig, files: list[str], root: str) -> None:
    """Refuse outputs that equal, contain or would be matched by the input."""
    inputs = [Path(f).resolve() for f in files]
    pattern = str(Path(cfg.input.path).absolute())
    out = Path(cfg.output.path).resolve()
    report = Path(cfg.report).resolve()
    if out == report or out in report.parents or report in out.parents:
        raise InputError("report: the report and output.path must be separate directories, "
                         "neither inside the other")
    for key, target in (("output.path", out), ("report", report)):
        if any(target == f or target in f.parents for f in inputs):
            raise InputError(f"{key}: {target} contains input files: write outputs elsewhere "
                             "(output never overwrites input)")
        names = [target / output_name(f, root) for f in files] if key == "output.path" else [
            target / n for n in ("duplicates.parquet", "invalid.parquet", "summary.json")]
        if any(fnmatch.fnmatch(str(n), pattern) for n in names):
            raise InputError(f"{key}: {target} is matched by input.path {cfg.input.path!r}, so "
                             "a later run would read its own output: write outputs elsewhere")
        if target.exists() and not cfg.output.overwrite:
            raise InputError(f"{key}: {target} already exists: remove it, choose another path, "
                             "or set output.overwrite: true (--overwrite)")


def _check_runner(cfg: DedupeConfig) -> None:
    """Beam 2.77's local runner in multi_threading mode lost digest batches in our 1 M-row
    runs (24,896 records in one run of 8; the job's seen-count check caught it): refuse
    it up front (docs/pipeline.md#performance)."""
    mode = cfg.runner.options.get("direct_running_mode")
    if cfg.runner.name == "local" and mode == "multi_threading":
        raise InputError("runner.options.direct_running_mode: multi_threading loses shuffle "
                         "elements in Beam's local runner; leave it out (in_memory)")


def near_spec(cfg: DedupeConfig, dtype: str | None) -> NearSpec | None:
    """The kernel's settings from the config's near section; complex values have no
    distance FAISS can search."""
    if cfg.near is None:
        return None
    if dtype is not None and dtype.startswith("complex"):
        raise InputError(f"near: the tensors are {dtype}; near-duplicate search needs real "
                         "values: remove the near section or store real and imaginary parts")
    n = cfg.near
    return NearSpec(n.metric, n.threshold or 0.0, n.atol, n.rtol, n.grouping, n.index, n.nlist,
                    n.nprobe, n.M, n.single_index_rows, n.partition_rows)


def prepare(cfg: DedupeConfig) -> Job:
    """Check the config against the files and resolve it into a Job. Raises InputError."""
    _check_runner(cfg)
    files = _files(cfg.input.path)
    root = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    _check_paths(cfg, files, root)
    keep = keep_policy(cfg.keep)
    shape = None if cfg.input.shape is None else tuple(cfg.input.shape)
    spec = TensorSpec(cfg.input.tensor, cfg.input.id, shape, cfg.input.dtype, keep[1],
                      cfg.input.compression)
    fmt = get_format(cfg.input.format)
    resolved = [fmt.check(path, spec) for path in files]
    return Job(cfg, files, root, spec, resolved[0], keep, Path(cfg.output.path),
               Path(cfg.report), f"{os.getpid()}-{time.time_ns()}",
               near_spec(cfg, resolved[0].dtype))
