"""Report: duplicates.parquet, files.parquet, invalid.parquet, index.html and (last)
summary.json; atomic publishing.

Rows are ordered by input order (file, position), so the same input and config
give byte-identical reports on every run and runner. Each removed record says where it
lives and where the record it duplicates lives (file index and row; files.parquet
names the files) and which group it belongs to. Outputs are built in hidden staging
directories and moved into place only after the job succeeded; summary.json is
written last, so its presence marks a complete run. Directories may be local or on
any Beam filesystem (gs://, s3://, ...).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.report import html as report_html
from pipeline.report import pick as report_pick
from pipeline.report.jaccard import write_jaccard_report
from pipeline.report.near import write_near_report
from pipeline.report.parts import DUPLICATES_SCHEMA, INVALID_SCHEMA, FileParts, invalid_rows
from pipeline.report.pick import Pick
from pipeline.steps.elements import KINDS, REFERENCE_FILES, FileResult, ReadFacts
from pipeline.steps.ids import Repeats, repeated_line
from pipeline.steps.near_cells import NN_PER_CELL
from transforms.io import fs, layout
from transforms.io.formats.base import (
    InvalidRecord,
    InvalidRecordError,
    TensorSpec,
    error_line,
    records_of,
)

if TYPE_CHECKING:
    from pipeline.steps.near import NearReport
    from transforms.near.spec import NearSpec

FILES_SCHEMA = pa.schema([("file", pa.int32()), ("path", pa.string()), ("role", pa.string())])


@dataclass(frozen=True)
class TensorSource:
    """How to read a set of files back (the report's page shows a few of their tensors)."""

    format: str  # one of transforms.io.formats.FORMATS
    spec: TensorSpec


def rows_to_show(pick: Pick, near_report: NearReport | None) -> dict[int, list[int]]:
    """{input file index: positions} of the records the report's page will show (the
    same selection: ``report_pick.page_records``), for the clean copy to take from its
    pass over the inputs (``WriteClean``'s ``show``); rows of reference files are read
    back by the report itself."""
    borderline = None if near_report is None else near_report.borderline
    recs = report_pick.page_records(pick, borderline)[3]
    out: dict[int, list[int]] = {}
    for f, row in report_pick.wanted_rows(recs):
        if f < REFERENCE_FILES:
            out.setdefault(f, []).append(row)
    return out


def _files_table(results: list[FileResult], reference_files: list[str] | None) -> pa.Table:
    """file index -> path: the input files, then the reference files (numbered from
    REFERENCE_FILES)."""
    rows = [(r.decision.file_index, r.decision.path, "input") for r in results]
    rows += [(REFERENCE_FILES + i, path, "reference")
             for i, path in enumerate(reference_files or [])]
    return pa.table({"file": pa.array([r[0] for r in rows], pa.int32()),
                     "path": pa.array([r[1] for r in rows], pa.string()),
                     "role": pa.array([r[2] for r in rows], pa.string())}, schema=FILES_SCHEMA)


def _unreadable(invalid: list[InvalidRecord]) -> str | None:
    """Why a file could not be opened at all (its first reason), or None."""
    return next((r.reason for r in invalid if r.whole_file), None)


def file_summary(res: FileResult) -> dict:
    removed = {f"removed_{kind}": sum(len(r) for r in res.decision.removed if r.kind == kind)
               for kind in KINDS}
    return {"input": res.decision.path, "output": res.output, "read": res.decision.n_read,
            "kept": res.kept, **removed, "invalid": res.decision.invalid_count(),
            "unreadable": _unreadable(res.decision.invalid), "notes": res.notes}


def _near_note(spec: NearSpec, stats: dict) -> str:
    """What the histogram's two series are, and how exact each is."""
    if spec.metric == "jaccard":
        return (f"Jaccard J of the shingle sets ({stats.get('unit')} {stats.get('size')}-grams; "
                f"duplicates.parquet's distance is 1 - J). Grey: every candidate pair whose J "
                "was computed; blue: each removed record with the kept record it duplicates. "
                "Found: " + ("every pair at J >= threshold (exact prefix-filter join)"
                             if stats.get("mode") == "exact" else "the pairs MinHash-LSH made "
                             "candidates (recall in summary.json)") + ".")
    what = ("max |a_i - b_i| to the L2-nearest neighbour" if spec.metric == "allclose"
            else f"{spec.metric} distance to the nearest neighbour")
    every = stats["histogram_every"]
    who = "every record" if every == 1 else f"about 1 in {every} records (chosen by digest)"
    if stats.get("cells_with_sampled_nearest"):
        who += (f"; in {stats['cells_with_sampled_nearest']} crowded cell(s) "
                f"{NN_PER_CELL} records' distances stand for the others")
    how = ("exact" if stats["partitions"] == 1 else
           f"exact up to the search radius (L2 {stats['search_radius_l2']:.4g} in search "
           "space), an upper bound above it (searched within the record's cell)")
    if spec.index in ("ivf", "hnsw"):
        how = f"from the approximate {spec.index} index (may overstate)"
    found = ("all of them (exact mode)" if stats.get("mode") == "exact"
             else "those the search found (recall is measured in summary.json)")
    if stats.get("pairs_estimated"):
        found += (f"; inside crowds of copies ({stats['cells_with_sampled_pairs']} cells) "
                  "the pairs with removed records were counted on a sample and scaled")
    return (f"Pairs within tolerance: {found}, each pair once. Nearest-neighbour "
            f"distances: {what}, for {who}; {how}.")


class TooManyInvalidError(InvalidRecordError):
    """More of the input was invalid than ``max_invalid_fraction`` allows."""


class RepeatedIdsError(InvalidRecordError):
    """Records share an id (``input.id``): the report and filters could not tell them apart."""


def check_repeated_ids(results: list[FileResult], repeated: Repeats | None,
                       column: str | None) -> None:
    """Fail the run (before Publish) when records share an id: removing one would drop
    the other wherever the report is applied by id (the filters)."""
    if repeated is None or not repeated.count:
        return
    path = {r.decision.file_index: r.decision.path for r in results}
    (fa, ra), (fb, rb) = repeated.examples[0]
    raise RepeatedIdsError(repeated_line(f"{repeated.count:,}", f"{path.get(fa, fa)} row {ra}",
                                         f"{path.get(fb, fb)} row {rb}", column))


def check_invalid_fraction(results: list[FileResult], limit: float) -> None:
    """Fail the run (before Publish, so the old output stays) when more than ``limit`` of
    the input records are invalid, or more than ``limit`` of the input files cannot be
    opened at all: a wrong input.format or a broken export reads as "all records
    invalid" (or no records at all), and publishing that would replace good output with
    nothing."""
    lost = [(r.decision.path, why) for r in results
            if (why := _unreadable(r.decision.invalid)) is not None]
    if limit < 1 and len(lost) > limit * len(results):
        raise TooManyInvalidError(
            f"{len(lost)} of {len(results)} input files cannot be read at all "
            f"({len(lost) / len(results):.1%}), more than max_invalid_fraction {limit:g}. "
            f"First: {lost[0][0]}: {lost[0][1]}. Fix or remove the "
            "files, or raise max_invalid_fraction (1.0: never fail)")
    read = sum(r.decision.n_read for r in results)
    n_bad = sum(r.decision.invalid_count() for r in results)
    if limit >= 1 or not read or n_bad <= limit * read:
        return
    path, first = next((r.decision.path, records_of(r.decision.invalid)[0]) for r in results
                       if records_of(r.decision.invalid))
    raise TooManyInvalidError(
        f"{n_bad:,} of {read:,} input records are invalid ({n_bad / read:.1%}), more "
        f"than max_invalid_fraction {limit:g}. First: {first.record_id} "
        f"in {path}: {first.reason}. Fix the input or its config (input.format, "
        "input.tensor), or raise max_invalid_fraction (1.0: never fail)")


def write_report(results: list[FileResult], staging: str, near: NearSpec | None = None,
                 near_report: NearReport | None = None, reference_files: list[str] | None = None,
                 reference_facts: list[tuple[int, ReadFacts]] | None = None,
                 max_invalid_fraction: float = 1.0, inputs: TensorSource | None = None,
                 reference: TensorSource | None = None, *, parts: list[FileParts],
                 pick: Pick, file_rows: int, repeated: Repeats | None = None,
                 id_column: str | None = None) -> dict:
    """The Report step: the Parquet reports, the near stage's histogram and borderline
    pairs, and index.html; returns the per-file counts and the stages' figures for
    summary.json. Raises RepeatedIdsError first when records share an id (``repeated``:
    ``RepeatedIds``' finding over the ``id_column``), then TooManyInvalidError when more
    than ``max_invalid_fraction`` of the input records are invalid (Publish then never
    runs).

    ``parts``, ``pick``: what the workers wrote of duplicates.parquet and invalid.parquet
    into ``staging`` and what the page shows of it (``ReportParts``); each table becomes
    one file while it holds at most ``file_rows`` rows.

    ``reference_*``: the reference files and what was read from them (reference records
    are never removed; unreadable ones go to reference_invalid.parquet). ``inputs`` /
    ``reference``: how to read their files back, so the page shows a few tensors (None:
    the page shows ids only)."""
    results = sorted(results, key=lambda r: r.decision.file_index)
    check_repeated_ids(results, repeated, id_column)
    check_invalid_fraction(results, max_invalid_fraction)
    files = _files_table(results, reference_files)
    with fs.local_dir_for(staging) as folder:  # a temporary directory for gs:// & co.
        in_parts = [name for name, schema, rows in (
            (layout.DUPLICATES, DUPLICATES_SCHEMA, sum(p.duplicates for p in parts)),
            (layout.INVALID, INVALID_SCHEMA, sum(p.invalid for p in parts)))
            if not join_parts(staging, folder, name, schema, rows, file_rows)]
        pq.write_table(files, os.path.join(folder, layout.FILES))
        near_stats = hist = None
        drawing: list = []  # the histogram's plot, drawn while the page reads rows back
        if near is not None and near_report is not None and near.is_sets:
            stats = near_report.stats
            hist = write_jaccard_report(folder, near_report.nn, near_report.pairs["verified_j"],
                                        near.threshold, near_report.borderline,
                                        _near_note(near, stats), drawing)
            near_stats = {**stats, "borderline_pairs": near_report.borderline.num_rows}
        elif near is not None and near_report is not None:
            stats = near_report.stats
            hist = write_near_report(folder, near_report.nn, near.marker, near.metric,
                                     near_report.borderline, _near_note(near, stats),
                                     near_report.pairs, stats.get("removed"),
                                     stats.get("histogram_every", 1), drawing)
            near_stats = {**stats, "histogram_records": hist["nearest_neighbour"]["n"],
                          "borderline_pairs": near_report.borderline.num_rows}
        ref_stats = None
        if reference_files is not None:
            ref_files, facts = reference_files, reference_facts or []
            first = REFERENCE_FILES
            rows = sorted(((i, r.position, r) for i, f in facts for r in f.invalid),
                          key=lambda t: t[:2])
            bad = [(ref_files[i - first], [r]) for i, _, r in rows]
            pq.write_table(invalid_rows(bad),
                           os.path.join(folder, layout.REFERENCE_INVALID))
            lost: dict[str, str] = {}  # reference files that could not be opened at all
            for i, _, r in rows:
                if r.whole_file:
                    lost.setdefault(ref_files[i - first], r.reason)
            ref_stats = {"files": len(ref_files), "read": sum(f.n_read for _, f in facts),
                         "invalid": sum(len(records_of(f.invalid)) for _, f in facts)}
            if lost:
                ref_stats["unreadable_files"] = [{"path": k, "reason": v}
                                                 for k, v in lost.items()]
        per_file = [file_summary(r) for r in results]
        sources = {"input": inputs, "reference": reference}
        where = dict(zip(files.column("file").to_pylist(), zip(
            files.column("path").to_pylist(), files.column("role").to_pylist(), strict=True),
            strict=True))
        try:
            report_html.write_page(
                folder, counts=_counts(per_file), duplicates=pick, files=files,
                near=None if near is None else {"metric": near.metric,
                                                "threshold": near.threshold if near.is_sets
                                                else near.marker,
                                                "stats": near_stats, "histogram": hist},
                borderline=None if near_report is None else near_report.borderline,
                read_rows=lambda f, rows: _shown(results, f, rows) or _read_back(
                    where.get(f), sources, rows),
                reference=ref_stats, drawing=drawing)
        except Exception as e:  # noqa: BLE001  (the page is a view: it never fails the run)
            report_html.write_fallback(folder, _counts(per_file), error_line(e))
        finally:  # the plot is part of the report whatever became of the page
            for plot in drawing:
                plot.result()
    return {"files": per_file, "near": near_stats, "reference": ref_stats,
            "report_parts": in_parts}


def join_parts(staging: str, folder: str, name: str, schema: pa.Schema, rows: int,
               limit: int) -> bool:
    """``name`` (a directory of the workers' part files in ``staging``) as one file in
    ``folder`` (the staging directory, or where its files are made) while it holds at
    most ``limit`` rows (True); above, the directory stays as it is (False)."""
    if rows and rows > limit:
        return False
    parts = fs.join(staging, name)
    tables = [fs.read_parquet(p) for p in sorted(fs.match(fs.join(parts, "part-*.parquet")))]
    table = pa.concat_tables([schema.empty_table(), *tables])
    if table.num_rows != rows:
        raise RuntimeError(f"{parts}: the parts hold {table.num_rows} rows, the files "
                           f"wrote {rows}")
    if tables:
        fs.delete_tree(parts)
    pq.write_table(table, os.path.join(folder, name))
    return True


def _counts(files: list[dict]) -> dict:
    """The whole run's counts, as summary.json will have them (not checked here)."""
    keys = ("read", "kept", *[f"removed_{kind}" for kind in KINDS], "invalid")
    return {k: sum(f[k] for f in files) for k in keys}


def _shown(results: list[FileResult], file: int, rows: list[int]
           ) -> dict[int, np.ndarray] | None:
    """{row: tensor} of an input file's rows as its clean copy took them, if it took
    them all (``WriteClean``'s ``show``), else None."""
    have = next((r.shown for r in results if r.decision.file_index == file), None)
    if have is None or not all(row in have for row in rows):
        return None
    return {row: have[row] for row in rows}


def _read_back(file: tuple[str, str] | None, sources: dict[str, TensorSource | None],
               rows: list[int]) -> dict[int, np.ndarray]:
    """{row: tensor} of some rows of one input or reference file ((path, role)); empty
    when the file is unknown or its set has no TensorSource. The report runs alone at
    the end of the job, so the file's pieces are read a core each (a local worker
    process reads one at a time: 1.7 s of the 1M x 384 near job's 2.8 s report, for 160
    rows spread over 16 row groups)."""
    from transforms.io.formats import ahead, get_format

    source = None if file is None else sources.get(file[1])
    if source is None:
        return {}
    with ahead.at_once(max(ahead.depth(), os.cpu_count() or 1)):
        return get_format(source.format, source.spec).read_rows(file[0], source.spec, rows)


def totals(files: list[dict]) -> dict:
    """Whole-run counts; read == kept + removed (every kind) + invalid, checked. Files
    that could not be opened at all hold no record anyone counted: they are listed
    (``unreadable_files``: path and reason), not counted."""
    removed = [f"removed_{kind}" for kind in KINDS]
    out = {k: sum(f[k] for f in files) for k in ("read", "kept", *removed, "invalid")}
    if out["read"] != out["kept"] + sum(out[k] for k in removed) + out["invalid"]:
        raise RuntimeError(f"records not accounted for: {out}")
    out["unreadable_files"] = [{"path": f["input"], "reason": f["unreadable"]}
                               for f in files if f.get("unreadable")]
    return out


def write_summary(report_dir: str, summary: dict, name: str = layout.SUMMARY) -> None:
    """summary.json (or ``name``), replaced in one step (a reader never sees half of it);
    the Publish step puts it in place last, so its presence marks a complete run on every
    filesystem."""
    data = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    fs.write_bytes_atomic(fs.join(report_dir, name), data.encode())
