"""Report: duplicates.parquet, invalid.parquet and (last) summary.json; atomic publishing.

Rows are ordered by input order (file, position), so the same input and config
give byte-identical Parquet reports on every run and runner. Outputs are built
in hidden staging directories and moved into place only after the job
succeeded; summary.json is written last, so its presence marks a complete run.
Directories may be local or on any Beam filesystem (gs://, s3://, ...).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.near_report import write_near_report
from pipeline.steps.elements import KINDS, REFERENCE_FILES, FileResult, ReadFacts
from transforms import fs
from transforms.formats.base import InvalidRecord, InvalidRecordError

if TYPE_CHECKING:
    from pipeline.steps.near import NearReport
    from transforms.near import NearSpec

DUPLICATES_SCHEMA = pa.schema([("record_id", pa.string()), ("duplicate_of", pa.string()),
                               ("kind", pa.string()), ("distance", pa.float64()),
                               ("duplicate_of_run", pa.string())])
INVALID_SCHEMA = pa.schema([("record_id", pa.string()), ("source", pa.string()),
                            ("reason", pa.string())])


def _duplicates_table(results: list[FileResult]) -> pa.Table:
    """One row per removed record, by input order (file, then position)."""
    per_file = []
    for res in results:
        kinds = [pa.table({"record_id": r.record_id, "duplicate_of": r.duplicate_of,
                           "kind": pa.array([r.kind] * len(r), pa.string()),
                           "distance": pa.array(r.distance, pa.float64()),
                           "duplicate_of_run": pa.nulls(len(r), pa.string())
                           if r.duplicate_of_run is None else r.duplicate_of_run,
                           "position": r.position}) for r in res.decision.removed]
        if kinds:
            per_file.append(pa.concat_tables(kinds).sort_by("position").drop_columns("position"))
    return pa.concat_tables(per_file) if per_file else DUPLICATES_SCHEMA.empty_table()


def _invalid_table(per_file: list[tuple[str, list[InvalidRecord]]]) -> pa.Table:
    rows = [(r.record_id, path, r.reason) for path, invalid in per_file for r in invalid]
    return pa.table({name: [row[i] for row in rows] for i, name in
                     enumerate(INVALID_SCHEMA.names)}, schema=INVALID_SCHEMA)


def file_summary(res: FileResult) -> dict:
    removed = {f"removed_{kind}": sum(len(r) for r in res.decision.removed if r.kind == kind)
               for kind in KINDS}
    return {"input": res.decision.path, "output": res.output, "read": res.decision.n_read,
            "kept": res.kept, **removed, "invalid": len(res.decision.invalid),
            "notes": res.notes}


def _near_note(spec: NearSpec, stats: dict) -> str:
    what = ("max |a_i - b_i| to the L2-nearest neighbours" if spec.metric == "allclose"
            else f"{spec.metric} distance")
    every = stats["histogram_every"]
    who = "every record" if every == 1 else f"about 1 in {every} records (chosen by digest)"
    how = ("exact" if stats["partitions"] == 1 else
           f"exact up to the search radius (L2 {stats['search_radius_l2']:.4g} in search "
           "space), an upper bound above it (searched within the record's partition)")
    if spec.index in ("ivf", "hnsw"):
        how = f"from the approximate {spec.index} index (may overstate)"
    return f"{what} to the nearest neighbour, for {who}; {how}"


class TooManyInvalidError(InvalidRecordError):
    """More of the input was invalid than ``max_invalid_fraction`` allows."""


def check_invalid_fraction(results: list[FileResult], limit: float) -> None:
    """Fail the run (before Publish, so the old output stays) when more than ``limit`` of
    the input records are invalid: a wrong input.format or a broken export reads as
    "all records invalid", and publishing that would replace good output with nothing."""
    read = sum(r.decision.n_read for r in results)
    n_bad = sum(len(r.decision.invalid) for r in results)
    if limit >= 1 or not read or n_bad <= limit * read:
        return
    path, first = next((r.decision.path, r.decision.invalid[0]) for r in results
                       if r.decision.invalid)
    raise TooManyInvalidError(
        f"{n_bad:,} of {read:,} input records are invalid ({n_bad / read:.1%}), more "
        f"than max_invalid_fraction {limit:g}; nothing was published. First: {first.record_id} "
        f"in {path}: {first.reason}. Fix the input or its config (input.format, "
        "input.tensor), or raise max_invalid_fraction (1.0: never fail)")


def write_report(results: list[FileResult], staging: str, near: NearSpec | None = None,
                 near_report: NearReport | None = None, reference_files: list[str] | None = None,
                 reference_facts: list[tuple[int, ReadFacts]] | None = None,
                 max_invalid_fraction: float = 1.0) -> dict:
    """The Report step: the Parquet reports (and the near stage's histogram and borderline
    pairs); returns the per-file counts and the stages' figures for summary.json. Raises
    TooManyInvalidError first when more than ``max_invalid_fraction`` of the input
    records are invalid (Publish then never runs).

    ``reference_*``: the reference files and what was read from them (reference records
    are never removed; unreadable ones go to reference_invalid.parquet)."""
    results = sorted(results, key=lambda r: r.decision.file_index)
    check_invalid_fraction(results, max_invalid_fraction)
    with fs.local_dir_for(staging) as folder:  # a temporary directory for gs:// & co.
        pq.write_table(_duplicates_table(results), os.path.join(folder, "duplicates.parquet"))
        pq.write_table(_invalid_table([(r.decision.path, r.decision.invalid) for r in results]),
                       os.path.join(folder, "invalid.parquet"))
        near_stats = None
        if near is not None and near_report is not None:
            hist = write_near_report(folder, near_report.nn, near.marker, near.metric,
                                     near_report.borderline, _near_note(near, near_report.stats))
            near_stats = {**near_report.stats, "histogram_records": hist["n"],
                          "histogram_below_threshold": hist["below_threshold"],
                          "borderline_pairs": near_report.borderline.num_rows}
        ref_stats = None
        if reference_files is not None:
            files, facts = reference_files, reference_facts or []
            first = REFERENCE_FILES
            rows = sorted(((i, r.position, r) for i, f in facts for r in f.invalid),
                          key=lambda t: t[:2])
            bad = [(files[i - first], [r]) for i, _, r in rows]
            pq.write_table(_invalid_table(bad),
                           os.path.join(folder, "reference_invalid.parquet"))
            ref_stats = {"files": len(files), "read": sum(f.n_read for _, f in facts),
                         "invalid": sum(len(f.invalid) for _, f in facts)}
    return {"files": [file_summary(r) for r in results], "near": near_stats,
            "reference": ref_stats}


def totals(files: list[dict]) -> dict:
    """Whole-run counts; read == kept + removed (every kind) + invalid, checked."""
    removed = [f"removed_{kind}" for kind in KINDS]
    out = {k: sum(f[k] for f in files) for k in ("read", "kept", *removed, "invalid")}
    if out["read"] != out["kept"] + sum(out[k] for k in removed) + out["invalid"]:
        raise RuntimeError(f"records not accounted for: {out}")
    return out


def write_summary(report_dir: str, summary: dict) -> None:
    """summary.json, replaced in one step (a reader never sees half of it); the Publish
    step writes it last, so its presence marks a complete run on every filesystem."""
    data = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    fs.write_bytes_atomic(fs.join(report_dir, "summary.json"), data.encode())
