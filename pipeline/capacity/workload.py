"""What a job must process, as the capacity plan needs it: records, bytes, dimensions,
and for the near stage the cells, joins and compared pairs its own planner predicts.

Why measured from the input and not from the config: the cost of a near search depends
on how the vectors lie (how many cells a record must meet within the radius), which
only the data shows. The near figures come from the job's own planner
(``transforms.near.plan.plan``) run on a sample of the input, so the dry run predicts
what the job will decide; past what a dry run can train (``MAX_SAMPLE_CELLS`` cells)
they come from the closed form the plan is built on (cells of max(partition_rows,
sqrt n) rows, each record in at most ``probes`` cells), and the plan says so.

A fingerprint store (``job.store``) adds its earlier runs' records where the job
processes them (``Stored``, docs/runs.md): the Exact step looks the new digests up in
the store's digest segments (bucket reads, not the stored records), and with ``near`` the
stage reads every stored value (or shingle set) and searches it with the input's, so
its records, cells and memory are those of the input plus the store, and its planning
sample is drawn from both in proportion (as the job's sample by digest is).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from pipeline.capacity.jaccard import SAMPLE, SetsCost, sets_cost
from pipeline.job import Job
from pipeline.steps.store import StoreView
from transforms.canonical import dtype_named
from transforms.io import fs
from transforms.io.formats import get_format
from transforms.io.formats.base import Chunking, Decode, record_nbytes
from transforms.io.formats.megatron import data_path
from transforms.near.plan import (
    TRAIN_PER_CELL,
    assign_width,
    coarse_count,
    plan,
    train_width,
)
from transforms.near.space import search_radius, search_space, value_scale
from transforms.near.spec import NearSpec
from transforms.store.segment import BUCKET_ROWS
from transforms.store.store import FingerprintStore

# A dry run trains the planner's k-means itself up to this many cells (64 sample rows
# each: about 2 s at 128 dimensions on one core); beyond, the closed form.
MAX_SAMPLE_CELLS = 1024
SAMPLE_HELD = 5  # the planner predicts from one sample row in five


@dataclass(frozen=True)
class NearCost:
    """The near stage's plan: ``cells``, cells each record joins, pairs compared."""

    cells: int
    joins: float
    work: float  # (query, candidate) row pairs compared in all cells
    largest: int  # rows in the largest cell
    mode: str
    source: str  # how it was found, in words
    scored: float = 0.0  # centroids a record is scored against when assigned (0: cells)
    trained: float = 0.0  # centroids a sample row meets in the plan's k-means (0: cells)


@dataclass(frozen=True)
class Stored:
    """A fingerprint store's earlier runs as this job processes them: the digests its
    Exact step looks the new records up among, and the values (or shingle sets) its near
    stage reads and searches together with the input's."""

    records: int  # records the earlier runs committed (their digests)
    runs: int  # earlier runs the job sees (this run id's own commit excluded)
    values: int  # stored values the near stage reads and searches; 0 without near
    value_bytes: float  # the values files' bytes (what the near stage reads)
    segments: int  # digest segments of the lookup plan
    lookups: float  # bucket reads the new records' lookups make (expected)
    lookup_bytes: float  # bytes those reads fetch
    sets: bool = False  # the values are shingle sets (a jaccard store)

    def line(self) -> str:
        """The plan's line about the store."""
        near = (f"searched with this run's ({'shingle sets' if self.sets else 'values'}: "
                f"{_bytes(self.value_bytes)} read on one worker)" if self.values
                else "not searched (no near stage)")
        return (f"  store: {self.values or self.records:,} records of {self.runs:,} earlier "
                f"run(s), {near}; exact lookups: {self.segments:,} digest segment(s), "
                f"about {self.lookups:,.0f} bucket reads ({_bytes(self.lookup_bytes)})")


def _bytes(x: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


@dataclass(frozen=True)
class Workload:
    """The model's inputs; a field is None when it could not be learnt (see ``missing``)."""

    records: int | None
    file_bytes: int | None  # the input files as stored
    record_bytes: int | None  # tensor bytes per record, as read
    dim: int | None  # values per record (the search space's dimensions)
    id_bytes: int = 12  # bytes of a record id (default ids: <file>:<row>, ~ path length)
    near: NearCost | None = None
    near_spec: NearSpec | None = None
    recall_sample: int = 0
    sets: SetsCost | None = None  # jaccard: what the stage does per record
    chunks: int = 1  # elements the input is cut into (the recall's probes are per chunk)
    missing: list[str] = field(default_factory=list)
    sized: str | None = None  # how a record's size was found, when the spec does not fix it
    chunking: Chunking = field(default_factory=Chunking)  # tuning's: what a chunk holds
    whole: bool = False  # jaccard's sample was drawn from every record (``reads_whole``)
    decode_s: float = 0.0  # one core's seconds per record to decode stored images ...
    decode_timed: int = 0  # ... timed here on this many (``decode_seconds``)
    stored: Stored | None = None  # a fingerprint store's earlier runs (``records``: new only)

    @property
    def searched(self) -> int:
        """Records the near stage reads and searches: the input's and the stored ones."""
        return self.records + (self.stored.values if self.stored else 0)


def _size(path: str) -> int:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def count_records(job: Job) -> int | None:
    """Records in the input from each file's index (Parquet footers, HDF5 shapes). Where
    a format has none (TFRecord, JSON lines: a file must be read to be counted), an input
    of at most WHOLE_BYTES is read and counted (the sample reads it whole anyway), a
    larger one gives None."""
    fmt = get_format(job.cfg.input.format, job.spec)
    units = [u for i, path in enumerate(job.files)
             for u in fmt.plan(path, i, 1 << 62, job.spec)]
    if all(u.stop is not None for u in units):
        return sum(u.stop - u.start for u in units)
    if sum(_size(f) for f in job.files) > WHOLE_BYTES:
        return None
    return sum(chunk.n_read for u in units for chunk in fmt.read(u, job.spec,
                                                                 job.chunking.chunk_rows))


def count_chunks(job: Job, rows: int) -> int | None:
    """Chunks the job cuts the input into at ``rows`` records each: within each of its
    read units, consecutive small Parquet row groups (each file's smallest units) joined
    while they hold at most ``rows`` (``parquet_files.joined``), a larger one cut alone;
    None where a format cannot say."""
    fmt = get_format(job.cfg.input.format, job.spec)
    each = job.chunking.unit_rows_for(record_nbytes(job.spec))
    total = 0
    for i, path in enumerate(job.files):
        groups = fmt.plan(path, i, 1, job.spec)
        if any(g.stop is None for g in groups):
            return None
        for u in fmt.plan(path, i, each, job.spec):
            held = 0
            for g in groups:
                n = g.stop - g.start
                if g.start < u.start or g.stop > u.stop:
                    continue
                if held and held + n > rows:
                    total, held = total + 1, 0
                if n > rows:
                    total += math.ceil(n / rows)
                else:
                    held += n
            total += held > 0 or u.stop == u.start
    return total


WHOLE = 5  # a dry run reads the whole input when it holds at most this many samples
WHOLE_BYTES = 16 << 20  # (or, where the files cannot be counted, this many bytes)
SPREAD = 8  # else: records from this many evenly spaced places of each file
DRAWN = {True: "drawn uniformly from every record",
         False: f"from {SPREAD} evenly spaced places of each file"}


def reads_whole(job: Job, rows: int, counted: int | None) -> bool:
    """Whether ``sample_records(job, rows, counted)`` reads every record (``counted``:
    ``count_records(job)``): at most ``WHOLE`` times what it samples, so a dry run costs
    a few seconds, not the job's read."""
    return counted <= WHOLE * rows if counted is not None else \
        sum(_size(f) for f in job.files) <= WHOLE_BYTES


def sample_records(job: Job, rows: int, counted: int | None) -> Iterator[np.ndarray]:
    """Chunks of up to ``rows`` records in all, in read order (the records as the job
    reads them). The job's planner samples uniformly (by digest) over every record; a
    small input (``reads_whole``) is read whole and sampled uniformly too, so ordered
    data (sorted by label, consecutive windows of one text) is planned from what the job
    sees. A larger one is read from ``SPREAD`` evenly spaced places of each file (a named
    assumption of the plan: that they stand for the whole)."""
    if reads_whole(job, rows, counted):
        yield from _uniform(job, rows)
        return
    fmt = get_format(job.cfg.input.format, job.spec)
    per_file = max(1, math.ceil(rows / len(job.files)))
    for i, path in enumerate(job.files):
        units = fmt.plan(path, i, max(1, per_file // SPREAD), job.spec)
        picks = np.unique(np.linspace(0, len(units) - 1, min(SPREAD, len(units))).round())
        each = max(1, math.ceil(per_file / len(picks)))
        for unit in (units[int(p)] for p in picks):
            got = 0
            for chunk in fmt.read(unit, job.spec, min(each, job.chunking.chunk_rows)):
                yield chunk.tensors[:each - got]
                got += min(len(chunk.tensors), each - got)
                if got >= each:
                    break


def _uniform(job: Job, rows: int) -> Iterator[np.ndarray]:
    """``rows`` records drawn uniformly from every record of the input (the smallest of
    a random key per record), in read order."""
    rng = np.random.default_rng(0)
    keys: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for tensors in _every_chunk(job):
        keys.append(rng.random(len(tensors)))
        held.append(tensors)
        if sum(map(len, keys)) > 2 * rows:  # keep the smallest ``rows`` keys
            keys, held = _smallest(keys, held, rows)
    yield from _smallest(keys, held, rows)[1]


def _every_chunk(job: Job) -> Iterator[np.ndarray]:
    """The records of every file, chunk by chunk, in read order."""
    fmt = get_format(job.cfg.input.format, job.spec)
    for i, path in enumerate(job.files):
        for unit in fmt.plan(path, i, 1 << 62, job.spec):
            for chunk in fmt.read(unit, job.spec, job.chunking.chunk_rows):
                yield chunk.tensors


def _smallest(keys: list[np.ndarray], held: list[np.ndarray], rows: int
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each chunk's rows among the ``rows`` smallest keys of all, in order."""
    if not keys or sum(map(len, keys)) <= rows:
        return keys, held
    cut = np.partition(np.concatenate(keys), rows - 1)[rows - 1]
    picked = [np.flatnonzero(k <= cut) for k in keys]
    return ([k[p] for k, p in zip(keys, picked, strict=True) if len(p)],
            [t[p] for t, p in zip(held, picked, strict=True) if len(p)])


def _distinct_sample(job: Job, rows: int) -> tuple[list, tuple[float, float] | None]:
    """Every record read once: up to ``rows`` distinct records with something to compare
    (by their content's hash, the smallest: a uniform draw, all of them when they fit, as
    the job's plan samples after exact dedup), and the input's shares of records with
    something to compare and of distinct ones among those. A uniform draw over every
    record, copies included, held fewer distinct records than the job's sample (14,522
    of 19,237 where 29,272 records held 10,035 copies) and the fit over them planned
    36% more removals than the job made."""
    import xxhash

    from transforms.near.sets import blank_rows

    shingles = job.near.shingles
    total = valid = 0
    seen: set[int] = set()
    held: dict[int, tuple[int, object]] = {}  # hash -> (first seen, value)
    for values in _every_chunk(job):
        total += len(values)
        try:
            ok = np.flatnonzero(~blank_rows(values, shingles))
        except TypeError:  # values of the other kind: sets_cost says so
            ok = np.arange(len(values))
        valid += len(ok)
        for j in ok.tolist():
            v = values[j]
            h = xxhash.xxh3_64_intdigest(v.encode() if isinstance(v, str)
                                         else np.asarray(v).tobytes())
            if h not in seen:
                seen.add(h)
                held[h] = (len(seen), v)
        if len(held) > 2 * rows:
            held = {h: held[h] for h in sorted(held)[:rows]}
    kept = sorted(held[h] for h in sorted(held)[:rows])  # in read order: the keep order
    shares = (valid / total, len(seen) / valid) if valid else None
    return [v for _, v in kept], shares


def sample_vectors(job: Job, rows: int, counted: int | None) -> np.ndarray:
    """Up to ``rows`` tensors as (rows, values), drawn across the input (a chunk whose
    records were all invalid holds none)."""
    parts = [x.reshape(len(x), -1) for x in sample_records(job, rows, counted) if len(x)]
    return np.concatenate(parts)[:rows] if parts else np.zeros((0, 1), np.float32)


SIZE_SAMPLE = 2_000  # records read to measure the size of records of no fixed size


def _sizes(tensors: np.ndarray) -> tuple[list[int], list[int]]:
    """(bytes, values) of each record of a chunk: text counts its UTF-8 bytes (what
    exact dedup hashes), an array its own values."""
    if tensors.dtype != object:
        return ([tensors[0].nbytes] * len(tensors), [tensors[0].size] * len(tensors)) \
            if len(tensors) else ([], [])
    sizes = [len(v.encode("utf-8")) if isinstance(v, str) else np.asarray(v).nbytes
             for v in tensors]
    values = [n if isinstance(v, str) else np.asarray(v).size
              for v, n in zip(tensors, sizes, strict=True)]
    return sizes, values


def measured_size(job: Job, counted: int | None, rows: int = SIZE_SAMPLE
                  ) -> tuple[float, float, int] | None:
    """(mean bytes, mean values, records sampled) of records whose size the spec does not
    fix (text, stored bytes, lists of no fixed size), from records drawn across the input;
    None when none could be read."""
    sizes: list[int] = []
    values: list[int] = []
    for tensors in sample_records(job, rows, counted):
        b, v = _sizes(tensors)
        sizes += b
        values += v
    if not sizes:
        return None
    return float(np.mean(sizes)), float(np.mean(values)), len(sizes)


def near_cost(job: Job, n: int, dim: int, stored: Stored | None,
              counted: int | None) -> NearCost:
    """The near stage's cells, joins and work for ``n`` records (the input's and the
    ``stored`` values it searches with them): the job's planner on a sample of both, or
    the closed form past ``MAX_SAMPLE_CELLS`` cells."""
    spec = job.near
    cells = spec.cells(n, dim)
    if cells <= MAX_SAMPLE_CELLS:
        want = TRAIN_PER_CELL * cells * SAMPLE_HELD // (SAMPLE_HELD - 1) + SAMPLE_HELD
        x = _near_sample(job, max(want, 2_000) if cells > 1 else min(n, 20_000), n, stored,
                         counted)
        if len(x) >= 2:
            z = search_space(x, spec).astype(np.float32)
            radius = search_radius(spec, dim, value_scale(x, spec))
            parts = plan(z, n, radius, spec.mode, spec.probes, cells,
                         levels=spec.levels)
            p = parts.prediction
            if p is None:  # one cell: every record against every other
                return NearCost(1, 1.0, float(n) ** 2, n, parts.mode,
                                "one cell (all pairs)")
            exact = parts.mode == "exact"
            coarse = None if parts.coarse is None else len(parts.coarse)
            joins = p.joins_exact if exact else p.joins_bounded
            return NearCost(len(parts), joins, p.work_exact if exact else p.work_bounded,
                            p.largest_exact if exact else p.largest_bounded, parts.mode,
                            f"the job's planner on {len(x):,} sampled records",
                            assign_width(len(parts), coarse, joins, parts.probes),
                            train_width(len(parts), coarse))
    return closed_form(spec, n, dim)


def _near_sample(job: Job, rows: int, n: int, stored: Stored | None,
                 counted: int | None) -> np.ndarray:
    """``rows`` search vectors drawn from the input and the store in proportion to their
    records (``n`` in all), as the job's planner samples by digest over both."""
    held = stored.values if stored is not None else 0
    if not held:
        return sample_vectors(job, rows, counted)
    mine = max(1, round(rows * (n - held) / max(n, 1)))
    parts = [sample_vectors(job, mine, counted), stored_vectors(job.store, rows - mine)]
    parts = [x for x in parts if len(x)]
    width = {x.shape[1] for x in parts}
    return np.concatenate(parts) if len(width) == 1 else parts[0]


def _stored_runs(view: StoreView) -> tuple[FingerprintStore, list]:
    """The store and the earlier runs this job's view sees, oldest first."""
    store = FingerprintStore(view.path)
    seen = set(view.earlier)
    return store, [r for r in store.runs(exclude=view.run_id) if r.run_id in seen]


STORED_PARTS = 64  # a dry run samples stored values from at most this many values files


def stored_vectors(view: StoreView, rows: int) -> np.ndarray:
    """Up to ``rows`` stored values as (rows, values): from at most ``STORED_PARTS``
    evenly spaced values files, each read whole when small (``WHOLE`` times its share)
    else from ``SPREAD`` evenly spaced row groups, its share drawn uniformly from what was
    read."""
    import pyarrow.parquet as pq

    from transforms.io import fs
    from transforms.store.parts import DTYPE_KEY

    store, runs = _stored_runs(view)
    parts = [(r, p) for r in runs for p in r.vector_parts if p["rows"]]
    if rows < 1 or not parts:
        return np.zeros((0, 1), np.float32)
    picks = np.unique(np.linspace(0, len(parts) - 1, min(STORED_PARTS, len(parts))).round())
    chosen = [parts[int(i)] for i in picks]
    total = sum(p["rows"] for _, p in chosen)
    rng = np.random.default_rng(0)
    out = []
    for run, p in chosen:
        share = max(1, round(rows * p["rows"] / total))
        with fs.open_read(store._data(run, p["file"])) as f:
            pf = pq.ParquetFile(f)
            groups = pf.metadata.num_row_groups
            if p["rows"] > WHOLE * share and groups > SPREAD:
                take = np.unique(np.linspace(0, groups - 1, SPREAD).round()).astype(int)
            else:
                take = np.arange(groups)
            dtype = dtype_named(pf.schema_arrow.metadata[DTYPE_KEY].decode())
            col = pf.read_row_groups(take.tolist(), columns=["x"])["x"].combine_chunks()
        x = col.flatten().to_numpy(zero_copy_only=False).view(dtype).reshape(-1, p["dim"])
        out.append(x[np.sort(rng.choice(len(x), min(share, len(x)), replace=False))])
    return np.concatenate(out)[:rows]


def stored(job: Job, n: int) -> Stored | None:
    """What the job does with its fingerprint store for ``n`` new records; None without
    one or when no earlier run committed records."""
    view = job.store
    if view is None:
        return None
    store, runs = _stored_runs(view)
    records = sum(r.records for r in runs)
    if not records:
        return None
    parts = [(r, p) for r in runs for p in r.vector_parts if p["rows"]]
    values = sum(p["rows"] for _, p in parts) if job.near is not None else 0
    value_bytes = 0.0
    if values:
        from apache_beam.io.filesystems import FileSystems

        found = FileSystems.match([store._data(r, p["file"]) for r, p in parts])
        value_bytes = float(sum(m.size_in_bytes for f in found for m in f.metadata_list))
    lookups = lookup_bytes = 0.0
    for seg in view.plan.segments:  # digests are uniform: a segment meets its range's share
        share = (int(seg.max, 16) - int(seg.min, 16) + 1) / 2.0 ** 128
        buckets = max(1.0, seg.rows / BUCKET_ROWS)
        reads = buckets * -math.expm1(-n * share / buckets)  # distinct buckets met
        lookups += reads
        lookup_bytes += min(reads * BUCKET_ROWS * 16, seg.rows * 40.0)
    return Stored(records, len(runs), values, value_bytes, len(view.plan.segments), lookups,
                  lookup_bytes, job.near is not None and job.near.is_sets)


def closed_form(spec: NearSpec, n: int, dim: int) -> NearCost:
    """The plan's bound without a sample: the cells the job would make, each record in
    ``probes`` of them (bounded mode's cap), the largest cell twice the mean."""
    cells = spec.cells(n, dim)
    rows = n / cells
    coarse = coarse_count(cells) if spec.levels == 2 and cells > 1 else None
    two = f" (two levels, {coarse:,} coarse)" if coarse else ""
    return NearCost(cells, float(spec.probes), n * spec.probes * rows, math.ceil(2 * rows),
                    "bounded", f"closed form: {cells:,} cells{two} of about {rows:,.0f} "
                    f"records, each record in {spec.probes} (probes), largest cell twice the "
                    "mean", assign_width(cells, coarse, spec.probes, spec.probes),
                    train_width(cells, coarse))


def workload(job: Job, records: int | None = None) -> Workload:
    """The model's inputs for ``job``; ``records`` plans for that many records of the
    input's kind, e.g. when the input is a local sample of a larger set (file bytes in
    proportion; where the files cannot be counted, the tensor bytes stand for them)."""
    missing = []
    shape, dtype = job.resolved.shape, job.resolved.dtype
    dim = math.prod(shape) if shape is not None else None
    record_bytes, sized = None, None
    counted = count_records(job)  # once: every sample below asks whether to read all
    if dim is not None and dtype is not None:
        record_bytes = dim * np.dtype(dtype).itemsize
    elif (mean := measured_size(job, counted)) is not None:  # text, stored bytes, ragged lists
        record_bytes, dim = max(1, round(mean[0])), max(1, round(mean[1]))
        text = job.spec.decode is not None and job.spec.decode.kind == "text"
        sized = (f"{'text' if text else 'sizes vary'}: the mean of {mean[2]:,} sampled "
                 "records")
    else:
        missing.append("record size: the records' size is not fixed and none could be "
                       "read to measure it: set input.shape and input.dtype")
    file_bytes = sum(_size(f) for f in job.files)
    if job.cfg.input.format == "megatron":  # the tokens are in each .idx's .bin
        file_bytes += sum(_size(data_path(f)) for f in job.files if fs.exists(data_path(f)))
    if counted is None and records is None:
        missing.append(f"records: {job.cfg.input.format} files have no index to count "
                       "them from: give --plan-records N")
    elif counted is None:
        file_bytes = records * record_bytes if record_bytes else None
    elif records is not None:
        file_bytes = round(file_bytes * records / max(counted, 1))
    n = records if records is not None else counted
    held = stored(job, n) if n else None  # ``records`` counts the input's only
    near = None
    if job.embed is not None:
        missing.append("embed: the model's time and its vectors' size are not in the model "
                       "(scripts/bench_embed.py measures a model)")
    elif job.near is not None and job.near.is_sets and n and record_bytes:
        return _with_sets(job, Workload(n, file_bytes, record_bytes, dim, near_spec=job.near,
                                        chunking=job.chunking,
                                        recall_sample=job.near.recall_sample,
                                        missing=missing, sized=sized, stored=held), counted)
    elif job.near is not None and n and dim:
        near = near_cost(job, n + (held.values if held else 0), dim, held, counted)
    decode_s, timed = decode_seconds(job) if not missing else (0.0, 0)
    return Workload(n, file_bytes, record_bytes, dim, near=near, near_spec=job.near,
                    chunking=job.chunking,
                    recall_sample=job.near.recall_sample if job.near else 0,
                    missing=missing, sized=sized, stored=held, decode_s=decode_s,
                    decode_timed=timed)


DECODE_ROWS = 2_048  # images the dry run decodes to time them, at most ...
DECODE_TIMING_S = 1.0  # ... and for about this long


def decode_seconds(job: Job) -> tuple[float, int]:
    """One core's seconds per record that decoding stored images adds to reading them
    (``input.decode: image``), and on how many it was timed: the first records of the
    first file read decoded, then read as their stored bytes. Not a rate of the rates
    file: it depends on the images' sizes and formats more than on the machine. Left
    out, 200k 28 x 28 PNGs took 27 s where the plan said 19 s (decoding: 82 us each)."""
    dec = job.spec.decode
    if dec is None or dec.kind != "image" or not job.files:
        return 0.0, 0
    from transforms import cores

    def timed(spec, rows: int, budget: float) -> tuple[int, float]:
        fmt = get_format(job.cfg.input.format, spec)
        n, start = 0, time.process_time()  # every thread's: decoding runs in a pool
        with cores.threads(1):
            for unit in fmt.plan(job.files[0], 0, 1 << 62, spec):
                for chunk in fmt.read(unit, spec, 256):
                    n += len(chunk.tensors)
                    if n >= rows or time.process_time() - start > budget:
                        return n, time.process_time() - start
        return n, time.process_time() - start

    timed(job.spec, 256, DECODE_TIMING_S)  # warm: Pillow's plugins, the decoding pool
    n, decoded = timed(job.spec, DECODE_ROWS, DECODE_TIMING_S)
    if not n:
        return 0.0, 0
    m, stored = timed(replace(job.spec, decode=Decode("bytes")), n, math.inf)
    return max(0.0, decoded / n - stored / max(m, 1)), n


def parquet_text_bytes(job: Job) -> float | None:
    """Mean UTF-8 bytes of the text column over every record, from the Parquet footers
    (each column chunk's uncompressed size, less a 4-byte length per value): the first
    records of a file can hold a few very long pages that are not the mean. None when
    the input is not text in Parquet files."""
    from transforms.io.formats.parquet_files import open_file

    if job.cfg.input.format != "parquet" or job.spec.decode is None \
            or job.spec.decode.kind != "text":
        return None
    total = rows = 0
    for path in job.files:
        pf = open_file(path)
        if isinstance(pf, Exception):
            return None
        for g in range(pf.metadata.num_row_groups):
            rg = pf.metadata.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.path_in_schema == job.spec.tensor:
                    total += col.total_uncompressed_size - 4 * col.num_values
                    rows += col.num_values
    return total / rows if rows and total > 0 else None


def _with_sets(job: Job, w: Workload, counted: int | None) -> Workload:
    """``w`` with the jaccard stage's figures (``jaccard.sets_cost`` on records drawn
    across the input), the text's mean size over all records where the files say it, and
    the chunks the input is cut into."""
    from transforms.io.formats.base import rows_within

    if (text := parquet_text_bytes(job)) is not None:
        w = replace(w, record_bytes=max(1, round(text)),
                    sized="text: the Parquet column's size over every record")

    local = counted if counted is not None else w.records
    whole = reads_whole(job, SAMPLE, counted)
    if whole:  # as the job samples: among the distinct records (all of them if they fit)
        values, shares = _distinct_sample(job, SAMPLE)
    else:
        values, shares = [v for chunk in sample_records(job, SAMPLE, counted) for v in chunk], None
    cost = (sets_cost(job.near, values, local, w.records, DRAWN[whole], shares)
            if values else None)
    if cost is None:
        return replace(w, missing=[*w.missing, "near jaccard: no sampled record holds a "
                                   f"{job.near.shingles.unit} to compare"])
    if w.stored is not None:  # the store's sets are searched with the input's
        cost = cost.with_stored(w.stored.values, w.records)
    decode = job.spec.decode
    rows = rows_within(job.chunking.chunk_rows, decode.chunk_bytes if decode is not None
                       else job.chunking.chunk_bytes, w.record_bytes)
    chunks = count_chunks(job, rows) if counted is not None else None
    chunks = (math.ceil(w.records / rows) + len(job.files) if chunks is None
              else chunks * w.records / max(counted, 1))
    return replace(w, sets=cost, chunks=max(1, round(chunks)), whole=whole)
