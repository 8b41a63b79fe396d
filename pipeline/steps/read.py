"""ReadTensors: input files -> units (row ranges) -> chunks of rows, plus what each read.

Units are planned on the driver from file metadata and spread over workers with a
Reshuffle, so a big HDF5 or Parquet file is read in parallel. Each chunk goes on
to Fingerprint; its record count and invalid records go to Decide.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline import progress
from pipeline.steps.elements import CHUNKS, FACTS, FILES, REFERENCE_FILES, ReadFacts
from pipeline.steps.tagged import SplitOutputs
from transforms.io import fs
from transforms.io.formats import get_format
from transforms.io.formats.base import (
    Chunk,
    Chunking,
    InvalidRecordError,
    TensorSpec,
    Unit,
    record_nbytes,
    records_of,
)
from transforms.near.sets import Shingles, blank_reason, blank_rows
from transforms.near.space import finite_rows


class ChunkCoder(beam.coders.Coder):
    """Pickle for Chunks moved between workers, but a size estimate without encoding:
    Beam samples element sizes for its metrics, and pickling 64 Ki-row chunks just to
    measure them cost ~10% of a local run."""

    def encode(self, chunk: Chunk) -> bytes:
        return pickle.dumps(chunk, protocol=5)

    def decode(self, data: bytes) -> Chunk:
        return pickle.loads(data)

    def estimate_size(self, chunk: Chunk) -> int:
        return chunk.tensors.nbytes + 24 * len(chunk.positions)

    def is_deterministic(self) -> bool:
        return False


beam.coders.registry.register_coder(Chunk, ChunkCoder)


def plan_units(format_name: str, files: list[str], unit_rows: int, spec: TensorSpec,
               first_index: int = 0) -> list[Unit]:
    fmt = get_format(format_name)
    return [u for i, path in enumerate(files, first_index)
            for u in fmt.plan(path, i, unit_rows, spec)]


class ReadChunks(beam.DoFn):
    """Unit -> chunks (main output) and (file_index, ReadFacts) (``FACTS`` output)."""

    CARRIES_VALUES = True  # its chunks are the records' values: a runner must not hold them

    def __init__(self, format_name: str, spec: TensorSpec, chunk_rows: int, fail_on_invalid: bool,
                 total_units: int, nonfinite_invalid: bool = False, total_records: int = 0,
                 stage: str = "read", chunk_bytes: int | None = None,
                 long_texts: Callable[[Chunk], tuple[Chunk, int]] | None = None,
                 blank: Shingles | None = None):
        self.format_name, self.spec, self.chunk_rows = format_name, spec, chunk_rows
        self.blank = blank
        self.long_texts = long_texts
        self.chunk_bytes = chunk_bytes
        self.fail_on_invalid, self.total_units = fail_on_invalid, total_units
        self.nonfinite_invalid = nonfinite_invalid
        self.total_records, self.stage = total_records, stage  # for progress only
        self.records = Metrics.counter("tensordedup", "records_read")
        self.invalid = Metrics.counter("tensordedup", "records_invalid")

    def setup(self) -> None:
        self.fmt = get_format(self.format_name, self.spec)  # decodes when spec.decode is set

    def process(self, unit: Unit) -> Iterator[Chunk | beam.pvalue.TaggedOutput]:
        progress.tick(self.stage, self.total_units, 0, "units", units=0,
                      total_records=self.total_records)
        for chunk in self.fmt.read(unit, self.spec, self.chunk_rows, self.chunk_bytes):
            if self.nonfinite_invalid and len(chunk.positions):  # (an empty file's chunk)
                chunk = chunk.reported_invalid(
                    ~finite_rows(chunk.tensors.reshape(len(chunk.positions), -1)),
                    "NaN or inf values cannot be compared by distance (near.nonfinite: "
                    "invalid; set near.nonfinite: keep to keep such records)")
            if self.blank is not None and len(chunk.positions):
                chunk = chunk.reported_invalid(
                    blank_rows(chunk.tensors, self.blank), blank_reason(self.blank.unit))
            long = 0
            if self.long_texts is not None and len(chunk.positions):  # embed.long
                chunk, long = self.long_texts(chunk)
            if chunk.invalid and self.fail_on_invalid:
                bad = chunk.invalid[0]
                what = "unreadable file" if bad.whole_file else f"invalid record {bad.record_id} in"
                raise InvalidRecordError(f"{what} {unit.path}: {bad.reason} (on_invalid: "
                                         "fail; set on_invalid: skip to report such records "
                                         "and go on)")
            self.records.inc(chunk.n_read)
            self.invalid.inc(len(records_of(chunk.invalid)))
            yield beam.pvalue.TaggedOutput(FACTS, (chunk.file_index,
                                                   ReadFacts(chunk.n_read, chunk.invalid, long)))
            if len(chunk.positions):
                yield chunk  # hashed (and sampled) by the fused steps before this returns
            progress.tick(self.stage, self.total_units, chunk.n_read, "units", units=0,
                          total_records=self.total_records)
        progress.tick(self.stage, self.total_units, 0, "units")


class ReadTensors(beam.PTransform):
    """Tensors of TFRecord, Parquet, HDF5 or JSON lines files as chunks of rows.

    Args:
      files: a glob pattern or a list of paths (any filesystem Beam knows); sorted, their
        order is the "first" order of ``Keep.first()``.
      format: one of ``transforms.io.formats.FORMATS`` (parquet, tfrecord, hdf5, jsonl,
        arrow, csv, npy, npz, megatron).
      spec: what each record holds (tensor field, id field, shape, dtype...).
      chunking: records per read task and per element, and tensor bytes per element.
      on_invalid: "skip" reports a bad record (FACTS) and goes on; "fail" stops the job.
      nonfinite_invalid: rows with NaN/inf count as invalid (distances can't compare them).
      reference: these files are a reference set: their records are compared with the
        input's but never removed (their file indexes start at REFERENCE_FILES).
      stage: the name progress lines give this read (default "read", "read reference").
      long_texts: ``embed.long``'s check (``pipeline.steps.embed.LongTexts``): counts the
        texts longer than the model takes (``ReadFacts.long``); with refuse, invalid.
      blank: jaccard's shingles: records with no unit of them (empty texts, empty
        sequences) are invalid, with the reason.

    Returns {CHUNKS: Chunk, FACTS: (file_index, ReadFacts), FILES: (file_index, path)}.
    """

    def __init__(self, files: str | Sequence[str], *, format: str, spec: TensorSpec,
                 chunking: Chunking | None = None, on_invalid: str = "skip",
                 nonfinite_invalid: bool = False, reference: bool = False,
                 stage: str | None = None,
                 long_texts: Callable[[Chunk], tuple[Chunk, int]] | None = None,
                 blank: Shingles | None = None):
        super().__init__()
        if on_invalid not in ("skip", "fail"):
            raise ValueError(f"on_invalid must be skip or fail, got {on_invalid!r}")
        self.files = fs.glob(files) if isinstance(files, str) else list(files)
        self.first_index = first_index = REFERENCE_FILES if reference else 0
        chunking = chunking or Chunking()
        self.units = plan_units(format, self.files, chunking.unit_rows_for(record_nbytes(spec)),
                                spec, first_index)
        known = all(u.stop is not None for u in self.units)  # TFRecord files: not before reading
        self.read = ReadChunks(format, spec, chunking.chunk_rows, on_invalid == "fail",
                               len(self.units), nonfinite_invalid,
                               sum(u.stop - u.start for u in self.units) if known else 0,
                               stage or ("read reference" if reference else "read"),
                               chunking.chunk_bytes, long_texts, blank)

    def expand(self, pbegin):
        out = (pbegin
               | "PlanUnits" >> beam.Create(self.units)
               | "SpreadUnits" >> beam.Reshuffle()
               | "ReadChunks" >> SplitOutputs(self.read, main=CHUNKS, tags=(FACTS,),
                                              types={CHUNKS: Chunk}))
        files = pbegin | "ListFiles" >> beam.Create(list(enumerate(self.files,
                                                                   self.first_index)))
        return {CHUNKS: out[CHUNKS], FACTS: out[FACTS], FILES: files}
