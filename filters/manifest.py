"""What a finished dedup run removed, as a lookup for training-time filters (no hashing).

Why a manifest: the batch job already decided, with the whole dataset in view, which
records go; the training input only has to skip them. This reads the run's report
(``duplicates.parquet``, ``invalid.parquet``, ``summary.json``) once and answers
"is this record id removed?" for whole arrays of ids (Arrow ``is_in``), or gives the
kept indices of a dataset laid out like the job's input files.

Record ids are the job's: the ``input.id`` field when the config set one, else
``"<path>:<position>"`` with the input path exactly as the job's glob matched it
(``job_path`` maps a path as your loader spells it to that form).

Reports are read with ``pyarrow.fs`` (local paths and gs://, s3://, hdfs://, file://
URIs), so the filters need neither Beam nor the job's other dependencies; a scheme only
a Beam filesystem knows is read through Beam when it is installed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from transforms.io import (
    fs,  # Beam-free at import: only the Beam fallback below uses Beam
    layout,  # the report's file names (Beam-free, like transforms.io.fs)
)
from transforms.io.formats.base import default_ids_arrow


def _default_ids(file: dict) -> pa.Array:
    """The ids the job gave the records of one input file (summary "files" entry)."""
    return default_ids_arrow(file["input"], np.arange(file["read"]))


def _real(path: str, working_dir: str | None = None) -> str:
    """A local path resolved (links, relative to where the job ran); a URL as it is."""
    if not fs.is_local(path):
        return path
    return os.path.realpath(os.path.join(working_dir or "", path))


def _id_strings(ids: Sequence | np.ndarray | pa.Array) -> pa.Array:
    """Record ids as the job wrote them (strings; integers in decimal; nulls kept), or
    TypeError for ids of another kind: a float id (pandas makes an integer column with a
    missing value float) or one string passed as the ids would match nothing."""
    if isinstance(ids, str | bytes):
        raise TypeError(f"ids: one {type(ids).__name__} ({ids[:40]!r}), not a sequence of "
                        "record ids: pass [id]")
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(ids, pandas.Series | pandas.Index):
        # pd.NA (nullable Int64, string) and NaN are nulls: missing ids
        ids = pa.array(ids, from_pandas=True) if ids.dtype != object else [
            None if pandas.isna(i) else i for i in ids]
    if not isinstance(ids, pa.Array):
        if hasattr(ids, "numpy"):  # a torch or tf tensor of ids
            ids = ids.numpy()
        if isinstance(ids, np.ndarray) and ids.dtype != object:
            ids = pa.array(ids.reshape(-1))
        else:
            values = [i.decode("utf-8", errors="replace") if isinstance(i, bytes) else i
                      for i in ids]
            try:
                ids = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):  # integers and strings mixed
                ids = pa.array([str(i) if isinstance(i, str | int | np.integer) else i
                                for i in values])
    t = ids.type
    if pa.types.is_dictionary(t):
        ids, t = ids.dictionary_decode(), t.value_type
    if pa.types.is_null(t):
        return ids.cast(pa.string())
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_integer(t)
            or pa.types.is_string_view(t)):
        raise TypeError(f"record ids must be strings, bytes or integers, got {t} (a float "
                        "column: pandas turns integers with a missing value into floats; "
                        "cast them back, e.g. .astype('Int64'))")
    return ids.cast(pa.string())


class ManifestError(ValueError):
    """The report cannot serve as a manifest (missing files, unknown input path)."""


class _Report:
    """The files of a report directory: read with ``pyarrow.fs`` (local paths, gs://,
    s3://, hdfs://, file://); a scheme pyarrow does not know but a Beam filesystem does
    (one you registered) through Beam's ``FileSystems``, when Beam is installed."""

    def __init__(self, report: str) -> None:
        self.shown = report.rstrip("/") or report  # the directory as the caller spelled it
        self.beam = False
        if fs.is_local(report):
            self.filesystem, self.root = pafs.LocalFileSystem(), os.path.abspath(report)
            return
        try:
            self.filesystem, path = pafs.FileSystem.from_uri(report)
            self.root = path.rstrip("/")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            try:
                from apache_beam.io.filesystems import FileSystems
            except ImportError:
                raise ManifestError(f"{report}: pyarrow.fs cannot open this location ({e}); "
                                    "Beam, whose filesystems might, is not installed") from e
            try:
                FileSystems.get_filesystem(report)
            except ValueError:
                raise ManifestError(f"{report}: neither pyarrow.fs ({e}) nor Beam's "
                                    "filesystems can open this location") from e
            self.beam = True

    def name(self, file: str) -> str:
        return os.path.join(self.shown, file) if fs.is_local(self.shown) else f"{self.shown}/{file}"

    def is_file(self, file: str) -> bool:
        if self.beam:
            return fs.exists(fs.join(self.shown, file))
        return self.filesystem.get_file_info(f"{self.root}/{file}").type == pafs.FileType.File

    def open(self, file: str):
        """A seekable binary reader."""
        if self.beam:
            return fs.open_read(fs.join(self.shown, file))
        return self.filesystem.open_input_file(f"{self.root}/{file}")

    def read_table(self, file: str, columns: list[str]) -> pa.Table:
        """A Parquet table of the report, from files Arrow owns (``fs.read_parquet``): one
        file, or a directory of ``part-*.parquet`` files (a large run's), in name order."""
        if self.beam:
            return fs.read_parquet_parts(fs.join(self.shown, file), columns)
        info = self.filesystem.get_file_info(f"{self.root}/{file}")
        if info.type != pafs.FileType.Directory:
            with self.open(file) as f:
                return pq.read_table(f, columns=columns)
        names = sorted(i.path for i in self.filesystem.get_file_info(pafs.FileSelector(info.path))
                       if i.base_name.startswith("part-") and i.base_name.endswith(".parquet"))
        tables = []
        for name in names:
            with self.filesystem.open_input_file(name) as f:
                tables.append(pq.read_table(f, columns=columns))
        if not tables:
            raise ManifestError(f"{self.name(file)}: a directory without part-*.parquet files")
        return pa.concat_tables(tables)


@dataclass(frozen=True)
class Manifest:
    removed_ids: pa.Array  # string ids of every record the job did not keep
    id_field: str | None  # the job's input.id: None means ids are "<path>:<position>"
    files: tuple[dict, ...]  # summary.json "files": input, read, kept, ... per input file
    working_dir: str | None  # where the job ran: resolves relative input paths
    drop_invalid: bool = True  # invalid records (null ids among them) are not kept

    @classmethod
    def load(cls, report_dir: str | os.PathLike, *, drop_invalid: bool = True) -> Manifest:
        """Read a finished run's report directory.

        ``report_dir``: a local path or a URI ``pyarrow.fs`` reads (gs://, s3://, ...);
        another scheme through Beam's filesystems, if Beam is installed.
        ``drop_invalid``: also skip the records the job reported invalid (they are not in
        its clean output either); False keeps them in the training input."""
        report = _Report(os.fspath(report_dir))
        if not report.is_file(layout.SUMMARY):
            raise ManifestError(f"{report.name(layout.SUMMARY)} not found: point at the report "
                                "directory of a finished run (summary.json is written last)")
        with report.open(layout.SUMMARY) as f:
            summary = json.loads(f.read())
        tables = [layout.DUPLICATES] + ([layout.INVALID] if drop_invalid else [])
        ids = []
        for t in tables:
            ids.append(report.read_table(t, ["record_id"])["record_id"])
        removed = pa.chunked_array([c for col in ids for c in col.chunks], pa.string())
        return cls(removed.combine_chunks() if removed.num_chunks else pa.array([], pa.string()),
                   summary["config"]["input"].get("id"), tuple(summary["files"]),
                   summary.get("working_dir"), drop_invalid)

    def __len__(self) -> int:
        return len(self.removed_ids)

    def keep_mask(self, ids: Sequence | np.ndarray | pa.Array) -> np.ndarray:
        """True for each id the job kept. Ids are strings, bytes or integers (compared as
        the job wrote them: integers in decimal); a null id is a record the job reported
        invalid (kept only with ``drop_invalid=False``). Default ids ("<path>:<row>")
        that name none of the run's input files are refused: a filter that matches
        nothing would keep every record."""
        arr = _id_strings(ids)
        removed = pc.fill_null(pc.is_in(arr, value_set=self.removed_ids), False)
        keep = ~np.asarray(removed.to_numpy(zero_copy_only=False), dtype=bool)
        if arr.null_count:
            keep[~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))] = \
                not self.drop_invalid
        if self.id_field is None and not (~keep).any() and len(arr) > arr.null_count:
            self._check_default_ids(arr)
        return keep

    def _check_default_ids(self, arr: pa.Array) -> None:
        """Raise unless some id names one of the run's input files as the job spelled it."""
        paths = pc.replace_substring_regex(arr, ":[0-9]+$", "")
        if pc.any(pc.is_in(paths, value_set=self._job_paths)).as_py():
            return
        shown = next(i for i in arr.to_pylist() if i is not None)
        example = self.files[0]["input"] if self.files else "none"
        raise ManifestError(f"record id {shown!r} names none of the run's {len(self.files)} "
                            f"input files: the run named records '<path>:<row>' with paths "
                            f"as its glob matched them (e.g. '{example}:0'); map your paths "
                            "with job_path() or use file_ids()")

    @cached_property
    def _job_paths(self) -> pa.Array:
        return pa.array([f["input"] for f in self.files], pa.string())

    @cached_property
    def _by_realpath(self) -> dict[str, str]:
        return {_real(f["input"], self.working_dir): f["input"] for f in self.files}

    def job_path(self, path: str | os.PathLike) -> str:
        """The input path as the job spelled it in record ids, for ``path`` as you spell it."""
        found = self._by_realpath.get(_real(os.fspath(path)))
        if found is not None:
            return found
        raise ManifestError(f"{path} is not one of the run's {len(self.files)} input files "
                            f"(e.g. {self.files[0]['input'] if self.files else 'none'})")

    def file_ids(self, path: str | os.PathLike) -> pa.Array:
        """The default record ids ("<path>:<position>") of every record of one input file."""
        job_path = self.job_path(path)
        return _default_ids(next(f for f in self.files if f["input"] == job_path))

    def kept_indices(self, ids: Sequence | np.ndarray | pa.Array | None = None) -> np.ndarray:
        """Indices (int64) of the kept records of a dataset whose index i has record id
        ``ids[i]``; ``ids=None``: the job's input files concatenated in the job's order,
        with default ids (the layout ``file_ids`` describes)."""
        if ids is None:
            if self.id_field is not None:
                raise ManifestError(f"the run named records by input.id={self.id_field!r}: "
                                    "pass the dataset's ids")
            ids = pa.chunked_array([_default_ids(f) for f in self.files],
                                   pa.string()).combine_chunks()
        return np.flatnonzero(self.keep_mask(ids))
