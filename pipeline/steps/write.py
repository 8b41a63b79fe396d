"""WriteClean: FileDecision -> a clean copy of the input file (second pass) -> FileResult.

Each input file is re-read and copied without its dropped records, in the same
format, schema and compression, into the run's staging directory (moved into
place only when the whole job succeeded). The per-file invariant
read == kept + removed + invalid is checked here, where all four are known.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.layout import output_shard
from pipeline.steps import progress
from pipeline.steps.elements import FileDecision, FileResult
from transforms import fs
from transforms.formats import get_format
from transforms.formats.base import TensorSpec


class WriteFile(beam.DoFn):
    def __init__(self, format_name: str, spec: TensorSpec, root: str | None, staging: str,
                 total_files: int):
        self.format_name, self.spec, self.root, self.staging = format_name, spec, root, staging
        self.total_files = total_files
        self.kept = Metrics.counter("tensordedup", "records_kept")

    def setup(self) -> None:
        self.fmt = get_format(self.format_name)

    def process(self, decision: FileDecision):
        progress.tick("write", self.total_files, 0, "files", units=0)  # its clock starts
        name = output_shard(decision.path, self.root)
        dst = fs.join(self.staging, name)
        drop = decision.drop()
        kept = self.fmt.write(decision.path, dst, drop, self.spec)
        accounted = kept + len(drop)
        if accounted != decision.n_read:
            raise RuntimeError(f"{decision.path}: read {decision.n_read} records but wrote "
                               f"{kept} and dropped {len(drop)}: did the file change while "
                               "the job ran?")
        self.kept.inc(kept)
        progress.tick("write", self.total_files, kept, "files")
        readable = fs.exists(dst)
        notes = getattr(self.fmt, "write_notes", lambda _: [])(decision.path) if readable else []
        yield FileResult(decision, name if readable else None, kept, notes)


class WriteClean(beam.PTransform):
    """FileDecision -> FileResult: each input file copied into ``output`` without the
    records its decision drops, in the same format, schema and compression.

    Args:
      output: a directory (any filesystem); the job passes its staging directory.
      format, spec: how the inputs were read (``ReadTensors``'s).
      root: the inputs' common directory: copies keep their paths below it (None: the
        files' names, flat).
      total_files: for progress lines only.
    """

    def __init__(self, output: str, *, format: str, spec: TensorSpec, root: str | None = None,
                 total_files: int = 0):
        super().__init__()
        self.fn = WriteFile(format, spec, root, output, total_files)

    def expand(self, decisions):
        return decisions | "WriteCleanFile" >> beam.ParDo(self.fn)
