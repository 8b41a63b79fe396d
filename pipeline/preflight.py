"""Everything checked before any work: the runner, the output paths, the config against
the files, resolved into a ``Job`` (``prepare``).

Why up front: a job that fails after an hour because of a typo in a column name,
or that writes its output over its input, is the worst experience a batch tool
can give. Every problem here is one line naming the key or file and the fix. The
files themselves are opened by ``pipeline.inputs``; remote calls are bounded by
``transforms.io.remote``; where the run's files go is ``transforms.io.layout``'s.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import posixpath
import secrets
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from apache_beam.io.filesystems import FileSystems

from pipeline.config import DedupeConfig, keep_policy
from pipeline.config.sections import InputConfig
from pipeline.embedding import Embedding, embedding
from pipeline.inputs import (
    as_sequences,
    check_first_ids,
    check_one_shape,
    check_one_size,
    check_shape_seen,
    columns_note,
    common_dir,
    expanded_columns,
    first_known,
    holds_sequences,
    inspect_files,
    list_files,
    mixed_dtypes,
    references,
    show_spec,
)
from pipeline.job import Job
from pipeline.steps.store import open_view, store_meta
from transforms.canonical import dtype_named
from transforms.io import fs, layout
from transforms.io.conditional import lease_refusal
from transforms.io.formats import megatron
from transforms.io.formats.base import InputError, TensorSpec
from transforms.io.remote import bounded
from transforms.near.search import use_cuda
from transforms.near.space import cosine_rounding
from transforms.near.spec import NearSpec, complex_refusal, unit_for


def _probe_dir(target: str) -> str:
    """The existing directory that the run's staging directory for ``target`` is created
    in (the target's parent, or its nearest existing ancestor)."""
    parent = Path(target).absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return str(parent)


def _check_writable(key: str, target: str, timeout: float, inside: bool = False) -> None:
    """Create and delete a probe file where the run stages ``target`` (``inside`` it
    where it exists: a store is written into): a read-only directory, or a file where a
    directory must be made, is found now, not when the job publishes after all its work."""
    if fs.is_local(target):
        where = target if inside and os.path.isdir(target) else _probe_dir(target)
        if not os.path.isdir(where):
            raise InputError(f"{key}: {where} is a file, not a directory: choose another {key}")
        try:
            handle, probe = tempfile.mkstemp(prefix=layout.LOCAL_PROBE, dir=where)
            os.close(handle)
            os.remove(probe)
        except OSError as e:
            raise InputError(f"{key}: cannot write in {where} ({e.strerror}), where {target} "
                             f"is staged and published: make it writable or choose another "
                             f"{key}") from None
        return

    def probe(path: str) -> None:
        name = layout.probe(path, secrets.token_hex(6))
        with FileSystems.create(name, compression_type=fs.RAW) as f:
            f.write(b"")
        FileSystems.delete([name])

    bounded(target, probe, key, "writing a probe file next to it", timeout)


def _target(path: str) -> str:
    """An output directory as the Job holds it: normalized like a Path locally (no
    trailing slash or './'); a URL without its trailing slash elsewhere (Path would fold
    the '//' of the scheme)."""
    return str(Path(path)) if fs.is_local(path) else path.rstrip("/")



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
    reference set), a store that overlaps them, and existing outputs unless ``replace``.
    On object stores an output "exists" when any object lies under its prefix."""
    inputs = [_location(f) for f in files + references]
    both = sorted(set(inputs[:len(files)]) & set(inputs[len(files):]))
    if both:
        raise InputError(f"reference.path: {both[0]} is also an input file"
                         f"{f' (and {len(both) - 1:,} more)' if len(both) > 1 else ''}: each "
                         "of its records would be removed as a leak of itself; use reference "
                         "files apart from the input's")
    local = fs.is_local(cfg.input.path)
    pattern = str(Path(cfg.input.path).absolute()) if local else _location(cfg.input.path)
    out, report = _location(output), _location(report)
    store = None if cfg.store is None else _location(cfg.store.path)
    for key, target in (("output.path", out), ("report", report), ("store.path", store)):
        if target is not None and (refused := lease_refusal(target)):
            raise InputError(f"{key}: {target}: {refused}")
    if store is not None:
        _check_store_apart(store, inputs, (("output.path", out), ("report", report)))
        _check_store_place(store, cfg.tuning.remote_timeout_s)
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
        names = ([layout.output_shard(f, root) for f in files] if key == "output.path"
                 else layout.REPORT_TABLES)
        if key == "output.path" and cfg.input.format == "megatron":  # each .idx's .bin
            names = [*names, *(megatron.data_path(n) for n in names)]
        if any(fs.glob_names(pattern, fs.join(target, n)) for n in names):
            raise InputError(f"{key}: {target} is matched by input.path {cfg.input.path!r}, so "
                             "a later run would read its own output: write outputs elsewhere")
        exists = bounded(target, fs.exists_under, key, "checking whether it exists",
                          cfg.tuning.remote_timeout_s)
        if exists:
            found = bounded(target, _listing, key, "listing what it holds",
                            cfg.tuning.remote_timeout_s)
            if found is not None and layout.STORE_META in found:
                raise InputError(f"{key}: {target} is a fingerprint store "
                                 f"({layout.STORE_META}): choose another {key} (a run never "
                                 "replaces a store)")
            _check_ours(key, target, found, names if key == "output.path" else None)
        if exists and not replace:
            raise InputError(f"{key}: {target} already exists: remove it, choose another path, "
                             "or set output.overwrite: true (--overwrite)")


def _listing(path: str) -> list[str] | None:
    """The files below an existing output or report ('/'-separated, relative), or None
    when it is a file."""
    if fs.is_local(path):
        if not os.path.isdir(path):
            return None
        return sorted(os.path.relpath(os.path.join(at, n), path).replace(os.sep, "/")
                      for at, _, names in os.walk(path) for n in names)
    if fs.exists(path):
        return None
    return [f[len(path.rstrip("/")) + 1:] for f in fs.match(path.rstrip("/") + "/**")]


def _check_ours(key: str, target: str, found: list[str] | None,
                shards: list[str] | None) -> None:
    """An existing output (``shards``: this run's clean shard names) or report (None)
    that holds anything a run does not write there (``found``: ``_listing``), or is a
    file, is never replaced: overwrite replaces an earlier run's output, not a folder of
    other files."""
    if found is None:
        raise InputError(f"{key}: {target} is a file, not a tensordedup output: choose "
                         f"another {key}, or delete it yourself")
    mine = layout.ours(shards is None, shards or [])
    foreign = [f for f in found if not mine(f)]
    if foreign:
        more = f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else ""
        shards = all(f.rsplit("/", 1)[-1].partition(".")[2] in _SHARD_EXTENSIONS
                     for f in foreign)
        what = "another input.format's clean shards?" if shards else "files of your own?"
        raise InputError(f"{key}: {target} holds files this run would not write there "
                         f"({', '.join(foreign[:3])}{more}: {what}), and a run replaces "
                         f"only its own kind of output: choose another {key}, or delete "
                         "them yourself")


# What clean shards of any input format are called (``_check_ours``' words for them)
_SHARD_EXTENSIONS = {"parquet", "h5", "hdf5", "tfrecord", "tfrecord.gz", "tfrecord.zlib",
                     "tfrecords", "arrow", "feather", "npy", "npz", "idx", "bin",
                     *(f"{e}{z}" for e in ("jsonl", "ndjson", "json", "csv", "tsv")
                       for z in ("", ".gz", ".bz2", ".zst"))}


def _check_store_apart(store: str, inputs: list[str],
                       outputs: tuple[tuple[str, str], ...]) -> None:
    """A store shares no directory with the output or the report (their swap would
    replace it, or publish it half-written) and holds no input or reference file (all
    paths from ``_location``)."""
    for key, target in outputs:
        if _within(store, target) or _within(target, store):
            raise InputError(f"store.path: {store} and {key} {target} overlap (the same "
                             "directory or one inside the other): keep the store in a "
                             f"directory of its own, apart from output.path and report")
    if any(_within(f, store) for f in inputs):
        raise InputError(f"store.path: {store} contains input or reference files: keep the "
                         "store in a directory of its own")


# what a fingerprint store holds at its top (transforms/store/store.py); a folder holding
# only these and no STORE.json is a store whose first run did not commit
STORE_NAMES = (layout.STORE_META, layout.STORE_LEASE, "commits", "runs", "compactions",
               "compacted")


def _check_store_place(store: str, timeout: float) -> None:
    """store.path is a fingerprint store (it holds STORE.json) or a new or empty folder:
    not a folder inside a store (the outer store's clean-up of its run folders deletes an
    inner store; a path into a store by mistake, ``store/runs``, would be a new, empty
    store that no run is checked against), not a file and not a folder of other files."""
    outer = bounded(store, _enclosing_store, "store.path", "looking for a store around it",
                    timeout)
    if outer is not None:
        raise InputError(f"store.path: {store} is inside the fingerprint store {outer} (it "
                         f"holds {layout.STORE_META}; the outer store would delete a store "
                         f"inside it): set store.path to {outer} to use that store, or to a "
                         "folder outside it for a new one")
    top = bounded(store, _top_names, "store.path", "listing what it holds", timeout)
    if top is None:
        raise InputError(f"store.path: {store} is a file, not a fingerprint store: set "
                         "store.path to a new or empty folder (or an existing store's)")
    foreign = sorted(n for n in top if n not in STORE_NAMES and not fs.is_temp(n)
                     and not n.startswith(layout.LOCAL_PROBE))
    if layout.STORE_META not in top and foreign:
        more = f" and {len(foreign) - 3:,} more" if len(foreign) > 3 else ""
        raise InputError(f"store.path: {store} is a folder of other files "
                         f"({', '.join(foreign[:3])}{more}) and no fingerprint store (no "
                         f"{layout.STORE_META}): set store.path to a new or empty folder for "
                         "a new store, or to the folder that holds the store's STORE.json")


def _enclosing_store(store: str) -> str | None:
    """The outermost folder above ``store`` that holds a STORE.json, or None."""
    if fs.is_local(store):
        parents = [str(p) for p in Path(store).parents]
    else:
        scheme, _, rest = store.partition("://")
        parts = rest.split("/")
        parents = [f"{scheme}://{'/'.join(parts[:i])}" for i in range(len(parts) - 1, 0, -1)]
    return next((p for p in reversed(parents) if fs.exists(fs.join(p, layout.STORE_META))),
                None)


def _top_names(store: str) -> set[str] | None:
    """The names at the top of an existing ``store`` folder (empty when there is none),
    or None when it is a file."""
    if fs.is_local(store):
        if not os.path.exists(store):
            return set()
        return set(os.listdir(store)) if os.path.isdir(store) else None
    if fs.exists(fs.join(store, layout.STORE_META)):
        return {layout.STORE_META}
    if fs.exists(store):
        return None
    return {f[len(store) + 1:].split("/", 1)[0] for f in fs.match(store + "/**")}


# A job started while a process spawned by multiprocessing imports its parent's script:
# Dask's local workers are started so, and a script that runs the job when imported
# would run it again in every worker, each taking the outputs' leases.
SPAWNED_AGAIN = ("the job was started again in a worker process, which Python starts by "
                 "importing your script again: call the job under `if __name__ == "
                 "\"__main__\":` (Dask's local cluster starts its workers so)")


def _check_runner(cfg: DedupeConfig) -> None:
    """A runner this job cannot run on: the job started again by a process Python spawned
    (a script without the main guard), a portable job service or a Dask scheduler at
    ``runner.address`` that does not answer (``tuning.remote_timeout_s``)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise InputError(SPAWNED_AGAIN)
    if cfg.near is not None and cfg.near.device == "cuda" and cfg.runner.address is None \
            and cfg.runner.name in ("local", "dask", "portable"):  # workers on this machine
        try:
            use_cuda("cuda")
        except RuntimeError:
            raise InputError("near.device: cuda, but torch sees no CUDA device on this "
                             "machine, where the workers run: set near.device: auto (the "
                             "GPU when there is one) or cpu") from None
    if cfg.runner.name in ("portable", "dask") and cfg.runner.address is not None:
        if cfg.runner.name == "portable":
            from pipeline.runners.portable import check_address
        else:
            from pipeline.runners.dask import check_address

        problem = check_address(cfg.runner.address, cfg.tuning.remote_timeout_s)
        if problem is not None:
            raise InputError(problem)


def largest_l2(dtype: str | None, shape: tuple[int, ...] | None) -> float | None:
    """The largest l2 distance two records of ``dtype`` and ``shape`` can be apart: the
    dtype's whole range on every value, sqrt(n) (max - min) (uint8 images of 32x32x3:
    14,134); None for floats (no largest value worth the name) or an unknown shape."""
    if dtype is None or shape is None:
        return None
    if dtype == "bool":
        span = 1
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(np.dtype(dtype))
        span = int(info.max) - int(info.min)
    else:
        return None
    return math.sqrt(math.prod(shape)) * span


def near_spec(cfg: DedupeConfig, dtype: str | None, channels: int = 1,
              shape: tuple[int, ...] | None = None) -> NearSpec | None:
    """The kernel's settings from the config's near section; complex values have no
    distance FAISS can search. ``channels``: a decoded image's (correlation centres each
    on its own mean). An l2 threshold at or above the largest distance two records of
    ``dtype`` and ``shape`` can have would make every record a near copy of the first
    (as a cosine threshold above 2 would, which the config refuses)."""
    if cfg.near is None:
        return None
    if dtype is not None and (refused := complex_refusal(dtype)):
        raise InputError(refused)
    n = cfg.near
    if n.metric == "jaccard":
        return _jaccard_spec(cfg, dtype)
    top = largest_l2(dtype, shape) if n.metric == "l2" else None
    if top is not None and n.threshold is not None and n.threshold >= top:
        raise InputError(f"near.threshold: {n.threshold:g} is at or above the largest l2 "
                         f"distance two records can have ({top:,.1f}: "
                         f"{math.prod(shape):,} {dtype} values, each across its whole "
                         "range), so every record would be a near copy of the first: use a "
                         f"threshold below {top:,.1f} (a small share of it for near copies)")
    if n.metric in ("cosine", "correlation") and shape is not None:
        values = math.prod(shape)
        if values == 1:
            why = ("every two of one sign would be at distance 0" if n.metric == "cosine" else
                   "each would be centred to 0, so none would be near anything")
            raise InputError(f"near.metric: {n.metric} compares the direction of records of "
                             f"several values, and these hold one: {why}: use metric l2, or "
                             "name a tensor of several values")
        if n.threshold < (floor := cosine_rounding(values)):
            print(f"warning: near.threshold {n.threshold:g} is below what float64 resolves "
                  f"of 1 - cos over {values:,} values (about {floor:.2g}): pairs that close "
                  "are decided by rounding, and a removal may be up to that far apart",
                  file=sys.stderr)  # even with --quiet: it may remove what is beyond it
    return n.to_spec(channels)




def _jaccard_spec(cfg: DedupeConfig, dtype: str | None) -> NearSpec:
    """Jaccard's settings: word shingles for text, token shingles for integer sequences
    (the only numbers a token n-gram means anything over); a threshold below 0.5 warned
    of (records sharing half their shingles are rarely copies)."""
    n = cfg.near
    text = cfg.input.decode == "text"
    if cfg.input.columns:
        raise InputError("near.metric: jaccard compares the texts or token sequences of one "
                         "column, and input.tensor lists columns (one number each): use "
                         "near.metric: l2 or cosine on them")
    if not text and not (dtype or "").startswith(("int", "uint")):
        raise InputError(f"near.metric: jaccard on column {cfg.input.tensor!r} of {dtype} "
                         "values: jaccard compares texts (input.decode: text) or integer "
                         "sequences (token ids); use a distance metric for other numbers")
    if n.threshold is not None and n.threshold < 0.5:
        print(f"warning: near.threshold {n.threshold:g} for jaccard: records that share "
              "less than half their shingles are rarely copies of each other; 0.7-0.9 is "
              "usual", file=sys.stderr)  # even with --quiet: it may remove what is no copy
    spec = n.to_spec(unit=unit_for(text))
    sh = spec.shingles
    if sh.unit == "char" and sh.n < CHAR_WARN:
        print(f"warning: near.shingles.size {sh.n} for unit char: texts that have nothing "
              "to do with each other share most short character n-grams; 24 is the default "
              "(docs/text.md)", file=sys.stderr)
    if spec.mode == "exact" and (sh.permutations or sh.bands):
        print("note: near.shingles.permutations and bands set the MinHash signature of "
              "mode bounded; mode exact does not use them", file=sys.stderr)
    return spec


CHAR_WARN = 10  # char shingles shorter than this: warned of (unrelated texts share them)
RUN_ID_FIELD = "{run_id}"


def _with_run_id(cfg: DedupeConfig, run_id: str) -> DedupeConfig:
    """'{run_id}' in input and reference paths (e.g. incoming/{run_id}/*.parquet) is this
    run's id; output paths keep the template (it marks them run-specific, see
    ``_replaces``) and are filled in by ``prepare``."""
    def fill(src: InputConfig) -> InputConfig:
        return src.model_copy(update={"path": src.path.replace(RUN_ID_FIELD, run_id)})
    return cfg.model_copy(update={"input": fill(cfg.input),
                                  "reference": [fill(r) for r in cfg.reference]})


# runner.processes unset: worker processes for near jobs over records of at most this many
# bytes (embeddings: 1.5 KB at 384 x float32). Wider records spend their time in large
# products that release the interpreter's lock, and each process's own heap of wide
# cells cost memory: 100k images of 64x64x3 uint8 peaked at 3.50 GB on two processes
# against 2.91 GB on two threads (their bound: 3.4 GB).
PROCESS_ROW_BYTES = 4096
# ... and over at least this many bytes of input files: two processes' start (imports of
# Beam and numpy, 2 s idle, 5 s beside other work) costs more than they gain below it. A
# near job over 64-d float32 on 2 cores, threads against processes: 2,000 records 7.3 s
# against 9.2 s, 50,000 9.7 s against 10.7 s, 120,000 (33 MB) 13.0 s against 13.4 s,
# 300,000 20.4 s against 19.5 s.
PROCESS_INPUT_BYTES = 32 << 20


def _local_defaults(cfg: DedupeConfig, exact_only: bool, embeds: bool,
                   row_bytes: int | None, input_bytes: int | None) -> DedupeConfig:
    """``runner.workers`` unset on the local runner: one worker for an exact-only job over
    stored tensors. Its steps keep both cores busy themselves (row groups read ahead,
    two files copied at once), and the data plane between parallel local workers costs
    more than it gains there: 10 M x 128 float32 in 10 Parquet files took 22.7 s on one
    worker and 27.5 s on two (docs/pipeline.md). Decoding, embedding and the near search
    gain from parallel workers: they keep all cores. ``runner.processes`` unset: worker
    processes for a near job without a model over records of at most PROCESS_ROW_BYTES
    (or of a size it cannot tell before reading them; ``pipeline.runners.local`` says why)
    in input files of PROCESS_INPUT_BYTES or more (or on remote storage), threads otherwise
    (one model in one process serves every thread)."""
    if cfg.runner.name != "local":
        return cfg
    update = {}
    if cfg.runner.workers is None and exact_only:
        update["workers"] = 1
    if cfg.runner.processes is None:
        update["processes"] = (cfg.near is not None and not embeds
                               and (row_bytes or 0) <= PROCESS_ROW_BYTES
                               and (input_bytes is None or input_bytes >= PROCESS_INPUT_BYTES))
    return cfg.model_copy(update={"runner": cfg.runner.model_copy(update=update)})


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
    timeout = cfg.tuning.remote_timeout_s
    files = list_files(cfg.input.path, "input.path", timeout, cfg.input.format)
    root = common_dir(files)
    keep = keep_policy(cfg.keep)
    spec = as_sequences(cfg, cfg.input.to_spec(keep.column, cfg.tuning.decoded_chunk_bytes),
                        cfg.near is None and holds_sequences(files[0], cfg.input, timeout))
    checked = inspect_files(files, cfg.input, spec, "input.path", timeout)
    spec = expanded_columns(files, checked, spec)
    if cfg.input.format in ("parquet", "jsonl", "arrow", "csv", "npz") and spec.id is not None:
        check_first_ids(files, spec.id, cfg.input.format)
    first = first_known(checked)
    resolved = checked[first]
    if cfg.near is not None and cfg.embed is None and spec.decode is None \
            and cfg.near.metric != "jaccard":
        check_one_shape(files, checked)
        if cfg.input.format in ("parquet", "arrow") and resolved.shape is None:
            check_one_size(files[first], cfg.input, timeout)
    if (cfg.input.format in ("parquet", "arrow") and spec.decode is None
            and cfg.input.shape is not None
            and not spec.ragged and not spec.columns):
        check_shape_seen(files[first], cfg.input, timeout)
    refs = references(cfg, resolved)
    _check_paths(cfg, files, root, output, report, refs.files if refs else [], replace)
    for key, target in (("output.path", output), ("report", report)):
        _check_writable(key, target, timeout)
    if cfg.store is not None and cfg.store.update:
        _check_writable("store.path", cfg.store.path, timeout, inside=True)
    embed = embedding(cfg.embed)
    image = resolved.decode is not None and resolved.decode.kind == "image"
    near = near_spec(cfg, "float32" if embed else resolved.dtype,
                     resolved.shape[-1] if image and not embed and resolved.shape else 1,
                     None if embed else resolved.shape)
    cfg = _local_defaults(cfg, near is None and embed is None and spec.decode is None,
                         embed is not None, _row_bytes(resolved, files[first], cfg.input),
                         _local_bytes([*files, *(refs.files if refs else [])]))
    store = None
    if cfg.store is not None:
        meta = store_meta(resolved, near, _settings(resolved, embed))
        store = bounded(cfg.store.path,
                        lambda path: open_view(path, run_id, meta, cfg.store.update),
                        "store.path", "reading the store", timeout)
    show = None if cfg.input.show is None else show_spec(
        files[first], cfg.input.format, cfg.input.show, "input.show", timeout)
    return Job(cfg=cfg, files=files, root=root, spec=spec, resolved=resolved, keep=keep,
               chunking=cfg.tuning.chunking(), output=output, report=report, run_id=run_id,
               attempt=f"{os.getpid()}-{time.time_ns()}", replace=replace, near=near,
               references=refs, store=store, embed=embed,
               notes=columns_note(cfg.input, spec) + mixed_dtypes(files, checked), show=show)


def _local_bytes(files: list[str]) -> int | None:
    """The input files' bytes in all where every one is local, else None."""
    try:
        return (sum(os.path.getsize(f) for f in files)
                if all(fs.is_local(f) for f in files) else None)
    except OSError:  # gone since it was read: the reader reports it
        return None


def _row_bytes(resolved: TensorSpec, first: str, source: InputConfig) -> int | None:
    """About how many bytes one record's values take: exact where every record has one
    shape, else for a local Parquet file the first record's (read through a 1 MB buffer,
    not the whole column chunk; through Arrow's own file, never a Python one:
    ``fs.read_parquet`` says why); None where neither tells (or the file is damaged)."""
    if resolved.shape is not None and resolved.dtype is not None:
        return math.prod(resolved.shape) * dtype_named(resolved.dtype).itemsize
    if source.format != "parquet" or not fs.is_local(first):
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pa.OSFile(first) as f:
            batches = pq.ParquetFile(f, buffer_size=1 << 20).iter_batches(
                batch_size=1, columns=[source.tensor])
            one = next(iter(batches), None)
    except (OSError, pa.ArrowException):  # a damaged file: the reader reports it
        return None
    return None if one is None else one.nbytes


def _settings(resolved: TensorSpec, embed: Embedding | None) -> dict:
    """Decode and model settings a store records: values decoded or embedded otherwise
    are other values, so a run with other ones is refused."""
    out: dict = {}
    if resolved.decode is not None:
        d = resolved.decode
        out["decode"] = {"kind": d.kind, "resize": d.resize, "channels": d.channels}
        if d.kind == "image":  # how pixels are made (earlier versions differ)
            from transforms.images import PIXELS, REDUCING_GAP

            out["decode"]["pixels"] = PIXELS
            if d.exact_on != "pixels":  # absent from stores made before the setting
                out["decode"]["exact_on"] = d.exact_on
            if d.resize is not None:
                out["decode"]["reducing_gap"] = REDUCING_GAP
    if embed is not None:
        out["embed"] = embed.meta()
    return out
