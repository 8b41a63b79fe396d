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
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from pipeline.config import DedupeConfig, InputConfig, keep_policy
from pipeline.embedding import Embedding, embedding
from pipeline.steps.elements import output_name
from pipeline.steps.store import StoreView, open_view, store_meta
from transforms import fs
from transforms.formats import get_format
from transforms.formats.base import Decode, InputError, TensorSpec, error_line
from transforms.formats.tfrecord import record_start
from transforms.near import NearSpec

T = TypeVar("T")
R = TypeVar("R")


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
    embed: Embedding | None = None  # the user's model, before the near stage

    def staging(self, final: str) -> str:
        """The hidden sibling the run writes ``final``'s files into before publishing."""
        return fs.sibling(final, f"staging-{self.attempt}")

    @property
    def spill(self) -> str:
        """Where the near stage keeps its cells' vectors until they are searched (beside
        the output: cleared with the staging directories, and by the next run if killed)."""
        return self.staging(self.output) + ".near"


# ------------------------------------------------------------------- remote filesystems
# A remote filesystem without network or credentials does not fail: its client retries
# for minutes. Every remote call here runs in a daemon thread (the process can still
# exit while one hangs) and is given tuning.remote_timeout_s to answer; files are
# inspected by REMOTE_WORKERS threads at once, each call bounded on its own.
REMOTE_WORKERS = 8


def _remote_fix(key: str) -> str:
    return (f"check the network and the credentials (gcloud auth application-default login; "
            f"tuning.remote_timeout_s sets the wait), or, for an offline --dry-run, --set "
            f"{key}=<a local path>")


def _reason(e: BaseException) -> str:
    """A filesystem error as one line; Beam's BeamIOError wraps the real one per path."""
    inner = list(getattr(e, "exception_details", None) or {})
    if isinstance(e, BeamIOError) and inner:
        e = e.exception_details[inner[0]]
    return error_line(e)


def _each_bounded(items: Sequence[str], fn: Callable[[str], R], key: str, what: str,
                  timeout: float) -> list[R]:
    """``[fn(p) for p in items]``; remote paths in parallel, each answer awaited at most
    ``timeout`` seconds. A timeout or an error (other than an InputError, which is
    already one line) becomes one InputError naming the path, what failed and the fix."""
    if all(fs.is_local(p) for p in items):
        return [fn(p) for p in items]
    results: list = [None] * len(items)
    done = [threading.Event() for _ in items]
    lock, todo = threading.Lock(), iter(range(len(items)))

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = (True, fn(items[i]))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                results[i] = (False, e)
            done[i].set()

    for _ in range(min(REMOTE_WORKERS, len(items))):
        threading.Thread(target=work, daemon=True, name="preflight-remote").start()
    out = []
    for i, path in enumerate(items):
        if not done[i].wait(timeout):
            raise InputError(f"{key}: {path}: no answer within {timeout:g} s ({what}): "
                             f"{_remote_fix(key)}")
        ok, value = results[i]
        if not ok:
            if isinstance(value, InputError):
                raise value
            raise InputError(f"{key}: {path}: {what} failed ({_reason(value)}): "
                             f"{_remote_fix(key)}") from None
        out.append(value)
    return out


def _bounded(path: str, fn: Callable[[str], T], key: str, what: str, timeout: float) -> T:
    """``fn(path)``, bounded like ``_each_bounded`` when ``path`` is remote."""
    return _each_bounded([path], fn, key, what, timeout)[0]


# ------------------------------------------------------------------- what a file looks like
HEAD_BYTES = 4096  # read from each input file: magic numbers, a TFRecord header
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # at 0, or 512, 1024, 2048 after a user block
PARQUET_MAGIC = b"PAR1"
_FORMAT_NAMES = {"parquet": "Parquet", "tfrecord": "TFRecord", "hdf5": "HDF5"}


class Sniffed(NamedTuple):
    """The format a file's first bytes show, and the evidence in words."""

    format: str
    evidence: str
    compression: str | None = None  # TFRecord: none | gzip | zlib


def sniff(head: bytes) -> Sniffed | None:
    """Which supported format ``head`` (a file's first bytes) is, or None (empty, damaged,
    or something else: left to the reader, which reports it as invalid)."""
    compression = record_start(head)
    if compression is not None:
        how = "" if compression == "none" else f" after {compression} decompression"
        return Sniffed("tfrecord", f"its first 12 bytes{how} are a TFRecord length and its "
                       "CRC", compression)
    for offset in (0, 512, 1024, 2048):
        if head[offset:offset + len(HDF5_SIGNATURE)] == HDF5_SIGNATURE:
            return Sniffed("hdf5", f"it has the HDF5 signature at byte {offset}")
    if head[:4] == PARQUET_MAGIC:
        return Sniffed("parquet", "it starts with PAR1")
    return None


def _head(path: str) -> bytes:
    with fs.open_read(path) as f:
        return f.read(HEAD_BYTES)


def _check_sniffed(files: list[str], found: list[Sniffed | None], source: InputConfig,
                   key: str) -> None:
    """Refuse files whose bytes show another format than ``input.format`` (read as that
    format, every record would be "invalid" and the clean output empty), or another
    TFRecord compression than a fixed ``input.compression``."""
    section = key.partition(".")[0]
    wrong = [(f, s) for f, s in zip(files, found, strict=True)
             if s is not None and s.format != source.format]
    if wrong:
        path, s = wrong[0]
        many = f" ({len(wrong)} of {len(files)} files)" if len(files) > 1 else ""
        raise InputError(f"{section}.format: {path} looks like a {_FORMAT_NAMES[s.format]} "
                         f"file ({s.evidence}), not {source.format}{many}: set "
                         f"{section}.format: {s.format}")
    fixed = source.compression
    for path, s in zip(files, found, strict=True):
        if s is not None and s.compression not in (None, fixed) and fixed != "auto":
            raise InputError(f"{section}.compression: {path} is {s.compression}-compressed "
                             f"TFRecord, not {fixed}: set {section}.compression: auto")


def _check_text_ids(path: str, column: str) -> None:
    """A Parquet id column of binary type must hold UTF-8 text: ids are strings in the
    reports and the shuffle, and the reader's cast would fail on the first bad value in
    the middle of the job. Reads the id column only, and only when its type is binary."""
    with fs.open_read(path) as f:
        try:
            pf = pq.ParquetFile(f)
        except (OSError, pa.ArrowException):
            return  # unreadable: reported as invalid by the reader
        if pf.schema_arrow.get_field_index(column) < 0:
            return
        kind = pf.schema_arrow.field(column).type
        if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_fixed_size_binary(kind)):
            return
        row = 0
        for batch in pf.iter_batches(columns=[column]):
            for value in batch.column(0).to_pylist():
                try:
                    _ = value is None or value.decode("utf-8")
                except UnicodeDecodeError:
                    raise InputError(
                        f"{path}: input.id: column {column!r} is {kind} and row {row} is not "
                        f"UTF-8 text ({value[:16]!r}): ids must be text; store them as "
                        "strings (e.g. hex), or leave input.id out (ids default to "
                        "<file>:<row>)") from None
                row += 1


def _inspect(files: list[str], source: InputConfig, spec: TensorSpec, key: str,
             timeout: float) -> list[TensorSpec]:
    """Each file's first bytes against ``source.format``, then the format's own check
    (schema / first record); remote files in parallel, each bounded by ``timeout``."""
    fmt = get_format(source.format, spec)

    def one(path: str) -> tuple[Sniffed | None, TensorSpec | None]:
        found = sniff(_head(path))
        if found is not None and found.format != source.format:
            return found, None  # reported for all files at once below
        if source.format == "parquet" and spec.id is not None:
            _check_text_ids(path, spec.id)
        return found, fmt.check(path, spec)

    seen = _each_bounded(files, one, key, "reading its first bytes and schema", timeout)
    _check_sniffed(files, [s for s, _ in seen], source, key)
    return [r for _, r in seen]


def _probe_dir(target: str) -> str:
    """The existing directory that the run's staging directory for ``target`` is created
    in (the target's parent, or its nearest existing ancestor)."""
    parent = Path(target).absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return str(parent)


def _check_writable(key: str, target: str, timeout: float) -> None:
    """Create and delete a probe file where the run stages ``target``: a read-only
    directory is found now, not when the job publishes after all its work."""
    if fs.is_local(target):
        where = _probe_dir(target)
        if not os.path.isdir(where):
            raise InputError(f"{key}: {where} is a file, not a directory: choose another {key}")
        try:
            handle, probe = tempfile.mkstemp(prefix=".tensordedup-probe-", dir=where)
            os.close(handle)
            os.remove(probe)
        except OSError as e:
            raise InputError(f"{key}: cannot write in {where} ({e.strerror}), where {target} "
                             f"is staged and published: make it writable or choose another "
                             f"{key}") from None
        return

    def probe(path: str) -> None:
        head, _, name = path.rpartition("/")
        name = f"{head}/.{name}.probe-{secrets.token_hex(6)}"
        with FileSystems.create(name, compression_type=fs.RAW) as f:
            f.write(b"")
        FileSystems.delete([name])

    _bounded(target, probe, key, "writing a probe file next to it", timeout)


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


def _files(pattern: str, key: str, timeout: float) -> list[str]:
    try:
        files = _bounded(pattern, fs.glob, key, "listing the files", timeout)
    except OSError as e:  # a local directory that cannot be listed
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
        exists = _bounded(target, fs.exists_under, key, "checking whether it exists",
                          cfg.tuning.remote_timeout_s)
        if exists and not replace:
            raise InputError(f"{key}: {target} already exists: remove it, choose another path, "
                             "or set output.overwrite: true (--overwrite)")


def _check_runner(cfg: DedupeConfig) -> None:
    """Runner settings that would lose records or cannot run this job: Beam 2.77's
    multi_threading mode set by hand skips the flush-race workaround ``runner.workers``
    applies (docs/beam-flush-race.md). A portable job service at ``runner.address`` must
    answer (``tuning.remote_timeout_s``)."""
    mode = cfg.runner.options.get("direct_running_mode")
    if cfg.runner.name == "local" and mode == "multi_threading":
        raise InputError("runner.options.direct_running_mode: multi_threading loses shuffle "
                         "elements in Beam 2.77's local runner; leave it out and set "
                         "runner.workers: N (parallel, with the workaround)")
    if cfg.runner.name == "portable" and cfg.runner.address is not None:
        from pipeline.portable import check_address

        problem = check_address(cfg.runner.address, cfg.tuning.remote_timeout_s)
        if problem is not None:
            raise InputError(problem)


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


def _spec(source: InputConfig, rank: str | None, chunk_bytes: int) -> TensorSpec:
    shape = None if source.shape is None else tuple(source.shape)
    decode = None
    if source.decode != "none":
        decode = Decode(source.decode, None if source.resize is None else tuple(source.resize),
                        source.channels, source.max_pixels, chunk_bytes)
    return TensorSpec(source.tensor, source.id, shape, source.dtype, rank, source.compression,
                      decode)


def _check_decode(cfg: DedupeConfig) -> None:
    """Distances need one shape and numbers that mean something: refuse a near stage on
    images of many sizes, and on stored bytes or text (those need an embedding)."""
    src = cfg.input
    if cfg.near is None or src.decode == "none":
        return
    if src.decode == "image" and src.resize is None and src.shape is None:
        raise InputError("near: decoded images of different sizes cannot be compared by "
                         "distance: set input.resize: [height, width] (or input.shape: "
                         "[h, w, c] when every image has that shape)")
    if src.decode in ("bytes", "text") and cfg.embed is None:
        raise InputError(f"near: input.decode: {src.decode} values have no distance until "
                         "they are embedded: add an embed section, or remove near (exact "
                         "dedup of the stored values needs none)")


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
    timeout = cfg.tuning.remote_timeout_s
    files = sorted({f for r in cfg.reference
                    for f in _files(r.path, "reference.path", timeout)})
    spec = _spec(src, None, cfg.tuning.decoded_chunk_bytes)
    for path, got in zip(files, _inspect(files, src, spec, "reference.path", timeout),
                         strict=True):
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
    _check_decode(cfg)
    run_id = resolve_run_id(cfg)
    cfg = _with_run_id(cfg, run_id)
    output = _target(cfg.output.path.replace(RUN_ID_FIELD, run_id))
    report = _target(cfg.report.replace(RUN_ID_FIELD, run_id))
    replace = _replaces(cfg)
    timeout = cfg.tuning.remote_timeout_s
    files = _files(cfg.input.path, "input.path", timeout)
    root = _common_dir(files)
    keep = keep_policy(cfg.keep)
    spec = _spec(cfg.input, keep[1], cfg.tuning.decoded_chunk_bytes)
    resolved = _inspect(files, cfg.input, spec, "input.path", timeout)
    refs = _references(cfg, resolved[0])
    _check_paths(cfg, files, root, output, report, refs.files if refs else [], replace)
    for key, target in (("output.path", output), ("report", report)):
        _check_writable(key, target, timeout)
    embed = embedding(cfg.embed)
    near = near_spec(cfg, "float32" if embed else resolved[0].dtype)
    store = None
    if cfg.store is not None:
        meta = store_meta(resolved[0], near, _settings(resolved[0], embed))
        store = _bounded(cfg.store.path, lambda path: open_view(path, run_id, meta),
                         "store.path", "reading the store", timeout)
    return Job(cfg, files, root, spec, resolved[0], keep, output, report, run_id,
               f"{os.getpid()}-{time.time_ns()}", replace, near, refs, store, embed)


def _settings(resolved: TensorSpec, embed: Embedding | None) -> dict:
    """Decode and model settings a store records: values decoded or embedded otherwise
    are other values, so a run with other ones is refused."""
    out: dict = {}
    if resolved.decode is not None:
        d = resolved.decode
        out["decode"] = {"kind": d.kind, "resize": d.resize, "channels": d.channels}
        if d.resize is not None:  # how resized pixels are made (earlier versions differ)
            from transforms.images import REDUCING_GAP

            out["decode"]["reducing_gap"] = REDUCING_GAP
    if embed is not None:
        out["embed"] = embed.meta()
    return out
