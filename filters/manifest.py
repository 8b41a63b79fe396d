"""What a finished dedup run removed, as a lookup for training-time filters (no hashing).

Why a manifest: the batch job already decided, with the whole dataset in view, which
records go; the training input only has to skip them. This reads the run's report
(``duplicates.parquet``, ``invalid.parquet``, ``summary.json``) once and answers
"is this record id removed?" for whole arrays of ids (Arrow ``is_in``), or gives the
kept indices of a dataset laid out like the job's input files.

Record ids are the job's: the ``input.id`` field when the config set one, else
``"<path>:<position>"`` with the input path exactly as the job's glob matched it
(``job_path`` maps a path as your loader spells it to that form).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from transforms import fs
from transforms.formats.base import default_ids_arrow


def _default_ids(file: dict) -> pa.Array:
    """The ids the job gave the records of one input file (summary "files" entry)."""
    return default_ids_arrow(file["input"], np.arange(file["read"]))


def _real(path: str, working_dir: str | None = None) -> str:
    """A local path resolved (links, relative to where the job ran); a URL as it is."""
    if not fs.is_local(path):
        return path
    return os.path.realpath(os.path.join(working_dir or "", path))


class ManifestError(ValueError):
    """The report cannot serve as a manifest (missing files, unknown input path)."""


@dataclass(frozen=True)
class Manifest:
    removed_ids: pa.Array  # string ids of every record the job did not keep
    id_field: str | None  # the job's input.id: None means ids are "<path>:<position>"
    files: tuple[dict, ...]  # summary.json "files": input, read, kept, ... per input file
    working_dir: str | None  # where the job ran: resolves relative input paths

    @classmethod
    def load(cls, report_dir: str | os.PathLike, *, drop_invalid: bool = True) -> Manifest:
        """Read a finished run's report directory.

        ``report_dir``: a local path or any Beam filesystem's (gs://...).
        ``drop_invalid``: also skip the records the job reported invalid (they are not in
        its clean output either); False keeps them in the training input."""
        report = os.fspath(report_dir)
        summary_path = fs.join(report, "summary.json")
        if not fs.exists(summary_path):
            raise ManifestError(f"{summary_path} not found: point at the report directory of "
                                "a finished run (summary.json is written last)")
        summary = json.loads(fs.read_bytes(summary_path))
        tables = ["duplicates.parquet"] + (["invalid.parquet"] if drop_invalid else [])
        ids = []
        for t in tables:
            with fs.open_read(fs.join(report, t)) as f:
                ids.append(pq.read_table(f, columns=["record_id"])["record_id"])
        removed = pa.chunked_array([c for col in ids for c in col.chunks], pa.string())
        return cls(removed.combine_chunks() if removed.num_chunks else pa.array([], pa.string()),
                   summary["config"]["input"].get("id"), tuple(summary["files"]),
                   summary.get("working_dir"))

    def __len__(self) -> int:
        return len(self.removed_ids)

    def keep_mask(self, ids: Sequence | np.ndarray | pa.Array) -> np.ndarray:
        """True for each id the job kept (ids of any type are compared as strings)."""
        arr = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(
            [i.decode() if isinstance(i, bytes) else str(i) for i in ids], pa.string())
        removed = pc.is_in(arr.cast(pa.string()), value_set=self.removed_ids)
        return ~np.asarray(removed.to_numpy(zero_copy_only=False), dtype=bool)

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
