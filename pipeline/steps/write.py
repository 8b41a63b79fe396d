"""WriteClean: FileDecision -> a clean copy of the input file (second pass) -> FileResult.

Each input file is re-read and copied without its dropped records, in the same
format, schema and compression, into the run's staging directory (moved into
place only when the whole job succeeded). The per-file invariant
read == kept + removed + invalid is checked here, where all four are known.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from pipeline import progress
from pipeline.steps.elements import FileDecision, FileResult
from transforms.io import fs
from transforms.io.formats import get_format
from transforms.io.formats.base import TensorSpec
from transforms.io.layout import output_shard


class WriteFile(beam.DoFn):
    """Copies up to ``at_once`` files of a bundle at a time: a copy is mostly Arrow
    encoding, which releases the GIL, and keeps about 1.3 cores busy (its reads run
    ahead in other threads), so two at once use the rest. Results come out in the order
    the files came in, the last ones from ``finish_bundle``; a failed copy fails the
    bundle."""

    def __init__(self, format_name: str, spec: TensorSpec, root: str | None, staging: str,
                 total_files: int, at_once: int):
        self.format_name, self.spec, self.root, self.staging = format_name, spec, root, staging
        self.total_files, self.at_once = total_files, at_once
        self.kept = Metrics.counter("tensordedup", "records_kept")

    def setup(self) -> None:
        self.fmt = get_format(self.format_name)
        # what reads the tensors (decoded images: a wrapper) says whether the copy can take
        # them: only a format whose tensors are the stored values can
        self.showing = getattr(get_format(self.format_name, self.spec), "write_showing", None)

    def start_bundle(self) -> None:
        self.pool = ThreadPoolExecutor(self.at_once, thread_name_prefix="write-clean")
        self.pending: deque[Future] = deque()

    def process(self, decision: FileDecision, show: dict[int, list[int]] | None = None):
        progress.tick("write", self.total_files, 0, "files", units=0)  # its clock starts
        rows = (show or {}).get(decision.file_index, [])
        self.pending.append(self.pool.submit(self._copy, decision, rows))
        while self.pending and (len(self.pending) >= self.at_once or self.pending[0].done()):
            yield self._done(self.pending.popleft())

    def finish_bundle(self):
        while self.pending:
            yield GlobalWindows.windowed_value(self._done(self.pending.popleft()))
        self.pool.shutdown()

    def teardown(self) -> None:
        if getattr(self, "pool", None) is not None:  # a bundle that failed mid-way
            self.pool.shutdown(cancel_futures=True)

    def _done(self, copy: Future) -> FileResult:
        """A finished copy's result, counted here: metrics and progress belong to the
        bundle's thread. When the bundle fails here (a failed copy, Ctrl-C while waiting),
        the other copies are cancelled or waited for, so none writes into a staging
        directory the job is about to delete."""
        try:
            result: FileResult = copy.result()
        except BaseException:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pending.clear()
            raise
        self.kept.inc(result.kept)
        progress.tick("write", self.total_files, result.kept, "files")
        return result

    def _copy(self, decision: FileDecision, rows: list[int]) -> FileResult:
        name = output_shard(decision.path, self.root)
        dst = fs.join(self.staging, name)
        drop = decision.drop()
        shown = None
        if rows and self.showing is not None:  # from the groups the copy reads anyway
            kept, shown = self.showing(decision.path, dst, drop, self.spec, rows)
        else:
            kept = self.fmt.write(decision.path, dst, drop, self.spec)
        accounted = kept + len(drop)
        if accounted != decision.n_read:
            raise RuntimeError(f"{decision.path}: read {decision.n_read} records but wrote "
                               f"{kept} and dropped {len(drop)}: did the file change while "
                               "the job ran?")
        readable = fs.exists(dst)
        notes = getattr(self.fmt, "write_notes", lambda _: [])(decision.path) if readable else []
        return FileResult(decision.counted(), name if readable else None, kept, notes, shown)


class WriteClean(beam.PTransform):
    """FileDecision -> FileResult: each input file copied into ``output`` without the
    records its decision drops, in the same format, schema and compression.

    Args:
      output: a directory (any filesystem); the job passes its staging directory.
      format, spec: how the inputs were read (``ReadTensors``'s).
      root: the inputs' common directory: copies keep their paths below it (None: the
        files' names, flat).
      total_files: for progress lines only.
      files_at_once: files a worker copies at once (threads); above 1 the last copies of
        a bundle are emitted from ``finish_bundle``, which Beam 2.77's DaskRunner drops:
        keep 1 there (the job sets 2 on the local runner's one worker; 10 files of
        1 M x 128 float32: 12.0 s against 13.5 s one at a time).
      show: a side input (``AsSingleton``) of {file index: positions}: each copy also
        returns those records' tensors (``FileResult.shown``) where its format can take
        them from the pass the copy makes anyway (Parquet: ``write_showing``), so a
        report need not read the file again.
    """

    def __init__(self, output: str, *, format: str, spec: TensorSpec, root: str | None = None,
                 total_files: int = 0, files_at_once: int = 1, show=None):
        super().__init__()
        if files_at_once < 1:
            raise ValueError(f"files_at_once must be at least 1, got {files_at_once}")
        self.fn = WriteFile(format, spec, root, output, total_files, files_at_once)
        self.show = show

    def expand(self, decisions):
        if self.show is None:
            return decisions | "WriteCleanFile" >> beam.ParDo(self.fn)
        return decisions | "WriteCleanFile" >> beam.ParDo(self.fn, show=self.show)
