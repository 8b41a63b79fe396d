"""Everything checked before any work: input files, fields, shapes, output paths.

Why up front: a job that fails after an hour because of a typo in a column name,
or that writes its output over its input, is the worst experience a batch tool
can give. Every problem here is one line naming the key or file and the fix.
"""

from __future__ import annotations

import fnmatch
import math
import os
import posixpath
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline.config import DedupeConfig, InputConfig, keep_policy
from pipeline.store import StoreView, open_view, store_meta
from transforms import fs
from transforms.formats import get_format
from transforms.formats.base import InputError, TensorSpec, error_line
from transforms.near import NearSpec


@dataclass(frozen=True)
class References:
    """Reference-set files (protected records), read like the input."""

    format: str
    files: list[str]
    spec: TensorSpec


@dataclass(frozen=True)
class Job:
    """A checked config, resolved into what the graph needs."""

    cfg: DedupeConfig
    files: list[str]  # sorted: the "first" order
    root: str  # common directory of the inputs: output names are relative to it
    spec: TensorSpec  # from the config: what every record is read and checked against
    resolved: TensorSpec  # shape and dtype as the first file has them (for the summary)
    keep: tuple[str, str | None]  # ("first"|"last", None) | ("max"|"min", column)
    output: str  # a directory, or a URL (gs://...) on another filesystem; no trailing slash
    report: str
    run_id: str  # the user's run id ({run_id} in paths, store entries)
    attempt: str  # unique per attempt: staging directory names
    replace: bool  # an existing output/report is replaced: overwrite, or run-specific paths
    near: NearSpec | None = None  # the near stage's settings, when it is on
    references: References | None = None
    store: StoreView | None = None  # earlier runs' records, as of this run's start

    def staging(self, final: str) -> str:
        """The hidden sibling the run writes ``final``'s files into before publishing."""
        if fs.is_local(final):
            head, name = os.path.split(final)
            return os.path.join(head, f".{name}.staging-{self.attempt}")
        head, _, name = final.rpartition("/")
        return f"{head}/.{name}.staging-{self.attempt}"

    @property
    def spill(self) -> str:
        """Where the near stage keeps its cells' vectors until they are searched (beside
        the output: cleared with the staging directories, and by the next run if killed)."""
        return self.staging(self.output) + ".near"


def _target(path: str) -> str:
    """An output directory as the Job holds it: normalized like a Path locally (no
    trailing slash or './'); a URL without its trailing slash elsewhere (Path would fold
    the '//' of the scheme)."""
    return str(Path(path)) if fs.is_local(path) else path.rstrip("/")


def _common_dir(files: list[str]) -> str:
    """The inputs' deepest common directory (output names are relative to it)."""
    if fs.is_local(files[0]):
        return os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    return "/".join(os.path.commonprefix([f.split("/")[:-1] for f in files]))


def output_name(path: str, root: str) -> str:
    """Where an input file's clean copy goes, relative to output.path."""
    if fs.is_local(path):
        return os.path.relpath(path, root)
    return path[len(root):].lstrip("/")


def _files(pattern: str, key: str = "input.path") -> list[str]:
    try:
        files = fs.glob(pattern)
    except OSError as e:  # a bucket that does not exist or cannot be listed
        raise InputError(f"{key}: cannot list {pattern!r}: {error_line(e)}") from None
    if not files:
        where = f" (relative to {os.getcwd()})" if fs.is_local(pattern) else ""
        raise InputError(f"{key}: no files match {pattern!r}{where}: fix the path or glob")
    return files


def _location(path: str) -> str:
    """A path in a form that compares: resolved when local (symlinks, '..'), else the URL
    with its scheme in lower case and its path normalized."""
    if fs.is_local(path):
        return str(Path(path).resolve())
    scheme, _, rest = path.partition("://")
    return f"{scheme.lower()}://{posixpath.normpath(rest)}"


def _within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or below it (both from ``_location``)."""
    sep = os.sep if fs.is_local(folder) else "/"
    return path == folder or path.startswith(folder.rstrip(sep) + sep)


def _check_paths(cfg: DedupeConfig, files: list[str], root: str, output: str, report: str,
                 references: list[str], replace: bool) -> None:
    """Refuse outputs that equal, contain or would be matched by the input (or a
    reference set), and existing outputs unless ``replace``. On object stores an output
    "exists" when any object lies under its prefix."""
    inputs = [_location(f) for f in files + references]
    local = fs.is_local(cfg.input.path)
    pattern = str(Path(cfg.input.path).absolute()) if local else _location(cfg.input.path)
    out, report = _location(output), _location(report)
    for key, target in (("output.path", out), ("report", report)):
        if not fs.is_local(target) and "/" not in target.partition("://")[2]:
            raise InputError(f"{key}: {target} is a whole bucket: name a folder in it (the "
                             "run stages its files next to that folder)")
    if _within(out, report) or _within(report, out):
        raise InputError("report: the report and output.path must be separate directories, "
                         "neither inside the other")
    for key, target in (("output.path", out), ("report", report)):
        if any(_within(f, target) for f in inputs):
            raise InputError(f"{key}: {target} contains input or reference files: write "
                             "outputs elsewhere (output never overwrites input)")
        names = [output_name(f, root) for f in files] if key == "output.path" else [
            "duplicates.parquet", "invalid.parquet", "summary.json"]
        if any(fnmatch.fnmatch(fs.join(target, n), pattern) for n in names):
            raise InputError(f"{key}: {target} is matched by input.path {cfg.input.path!r}, so "
                             "a later run would read its own output: write outputs elsewhere")
        if fs.exists_under(target) and not replace:
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
    return NearSpec(n.metric, threshold=n.threshold or 0.0, atol=n.atol, rtol=n.rtol,
                    grouping=n.grouping, index=n.index, nlist=n.nlist, nprobe=n.nprobe,
                    hnsw_m=n.M, single_index_rows=n.single_index_rows,
                    partition_rows=n.partition_rows, mode=n.mode, probes=n.probes,
                    recall_sample=n.recall_sample, device=n.device)


def _spec(source: InputConfig, rank: str | None) -> TensorSpec:
    shape = None if source.shape is None else tuple(source.shape)
    return TensorSpec(source.tensor, source.id, shape, source.dtype, rank, source.compression)


def _references(cfg: DedupeConfig, resolved: TensorSpec) -> References | None:
    """Reference files, checked like input files; their records must be comparable with
    the input's (same dtype and size), or no reference record could ever match."""
    if not cfg.reference:
        return None
    formats = {r.format for r in cfg.reference}
    if len(formats) > 1:
        raise InputError("reference: all reference sets must have one format (got "
                         f"{', '.join(sorted(formats))}): convert them or run them separately")
    src = cfg.reference[0]
    if any(r.model_dump(exclude={"path"}) != src.model_dump(exclude={"path"})
           for r in cfg.reference[1:]):
        raise InputError("reference: reference sets must share tensor/id/shape/dtype keys "
                         "(only path may differ): run sets with other keys separately")
    files = sorted({f for r in cfg.reference for f in _files(r.path, "reference.path")})
    spec = _spec(src, None)
    fmt = get_format(src.format)
    for path in files:
        got = fmt.check(path, spec)
        if got.dtype != resolved.dtype or _size(got.shape) != _size(resolved.shape):
            raise InputError(f"reference.path: {path} holds {got.dtype} tensors of shape "
                             f"{list(got.shape or [])}, the input {resolved.dtype} of shape "
                             f"{list(resolved.shape or [])}: no record could match; use a "
                             "reference set of the input's dtype and size")
    return References(src.format, files, spec)


def _size(shape: tuple[int, ...] | None) -> int | None:
    return None if shape is None else math.prod(shape)


RUN_ID_FIELD = "{run_id}"


def _with_run_id(cfg: DedupeConfig, run_id: str) -> DedupeConfig:
    """'{run_id}' in input and reference paths (e.g. incoming/{run_id}/*.parquet) is this
    run's id; output paths keep the template (it marks them run-specific, see
    ``_replaces``) and are filled in by ``prepare``."""
    def fill(src: InputConfig) -> InputConfig:
        return src.model_copy(update={"path": src.path.replace(RUN_ID_FIELD, run_id)})
    return cfg.model_copy(update={"input": fill(cfg.input),
                                  "reference": [fill(r) for r in cfg.reference]})


def _replaces(cfg: DedupeConfig) -> bool:
    """An existing output is replaced with overwrite, or when the paths are run-specific
    ('{run_id}' in them): a rerun of the same id replaces its own outputs."""
    return cfg.output.overwrite or RUN_ID_FIELD in cfg.output.path + cfg.report


def resolve_run_id(cfg: DedupeConfig) -> str:
    return cfg.run_id or datetime.now(timezone.utc).strftime("%Y-%m-%d")


def prepare(cfg: DedupeConfig) -> Job:
    """Check the config against the files and resolve it into a Job. Raises InputError."""
    _check_runner(cfg)
    run_id = resolve_run_id(cfg)
    cfg = _with_run_id(cfg, run_id)
    output = _target(cfg.output.path.replace(RUN_ID_FIELD, run_id))
    report = _target(cfg.report.replace(RUN_ID_FIELD, run_id))
    replace = _replaces(cfg)
    files = _files(cfg.input.path)
    root = _common_dir(files)
    keep = keep_policy(cfg.keep)
    spec = _spec(cfg.input, keep[1])
    fmt = get_format(cfg.input.format)
    resolved = [fmt.check(path, spec) for path in files]
    refs = _references(cfg, resolved[0])
    _check_paths(cfg, files, root, output, report, refs.files if refs else [], replace)
    near = near_spec(cfg, resolved[0].dtype)
    store = None
    if cfg.store is not None:
        store = open_view(cfg.store.path, run_id, store_meta(resolved[0], near))
    return Job(cfg, files, root, spec, resolved[0], keep, output, report, run_id,
               f"{os.getpid()}-{time.time_ns()}", replace, near, refs, store)
