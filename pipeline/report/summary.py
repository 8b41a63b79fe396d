"""What a run returns: ``RunSummary`` (summary.json's counts and paths, the report's tables
on demand) and ``human_summary`` (the lines the CLI prints), kept apart from the code that
runs the job (``pipeline.api``), which returns them."""

from __future__ import annotations

import dataclasses
import html
import json
import os

from transforms.io import layout
from transforms.io.fs import exists, join, read_bytes, read_parquet_parts
from transforms.near.recall import recall_line


@dataclasses.dataclass(frozen=True, repr=False)
class RunSummary:
    """What a run did: summary.json's counts and paths, and its report files on demand.

    ``removed`` maps each kind (exact, near, reference_exact, reference_near,
    store_exact, store_near) to its count. ``near``: summary.json's near section (the
    settings, mode, cells, recall...) when the near stage ran; ``recall`` its measured
    recall (decisions judged against the records kept) and ``recall_removed`` the share
    of sampled records with an earlier near duplicate, kept or not, that were removed
    (``transforms.near.recall``). ``summary``: summary.json as a dict. A run handed to a
    runner that does not wait (Dataflow) has ``submitted`` True and no counts yet: its
    report appears when the job succeeds (``RunSummary.load(report)`` reads it then)."""

    run_id: str
    output: str
    report: str
    read: int | None = None
    kept: int | None = None
    removed: dict[str, int] = dataclasses.field(default_factory=dict)
    invalid_count: int | None = None
    wall_time_s: float | None = None
    near: dict | None = None
    recall: float | None = None
    recall_removed: float | None = None
    submitted: bool = False
    job_id: str | None = None
    summary: dict | None = None

    @classmethod
    def of(cls, summary: dict) -> RunSummary:
        """From summary.json's contents."""
        near = summary.get("near")
        recall = (near or {}).get("recall") or {}
        return cls(run_id=summary["run_id"], output=summary["output"], report=summary["report"],
                   read=summary["read"], kept=summary["kept"],
                   removed={k.removeprefix("removed_"): v for k, v in summary.items()
                            if k.startswith("removed_")},
                   invalid_count=summary["invalid"], wall_time_s=summary.get("wall_time_s"),
                   near=near, recall=recall.get("recall"),
                   recall_removed=recall.get("recall_removed"), summary=summary)

    @classmethod
    def load(cls, report: str | os.PathLike) -> RunSummary:
        """A finished run's summary from its report directory (local or gs:// & co.)."""
        return cls.of(json.loads(read_bytes(join(os.fspath(report), layout.SUMMARY))))

    @property
    def removed_total(self) -> int:
        return sum(self.removed.values())

    @property
    def near_settings(self) -> dict | None:
        """The near stage's settings as used (metric, threshold, mode...), or None."""
        return None if self.near is None else self.near.get("settings")

    def _table(self, name: str):
        path = join(self.report, name)
        if not exists(join(self.report, layout.SUMMARY)) or not exists(path):
            what = ("the job was submitted and has not finished" if self.submitted
                    else "the run is not complete")
            raise FileNotFoundError(f"{path}: no such report ({what}: {self.report}/summary.json "
                                    "marks a complete run)")
        return read_parquet_parts(path)

    def removals(self):
        """report/duplicates.parquet as a ``pyarrow.Table``: record_id, duplicate_of,
        kind, distance, duplicate_of_run; one row per removed record, in input order."""
        return self._table(layout.DUPLICATES)

    def invalid(self):
        """report/invalid.parquet as a ``pyarrow.Table``: record_id, source, reason."""
        return self._table(layout.INVALID)

    def removals_df(self):
        """``removals()`` as a pandas DataFrame (needs pandas)."""
        return _to_pandas(self.removals(), "removals_df")

    def invalid_df(self):
        """``invalid()`` as a pandas DataFrame (needs pandas)."""
        return _to_pandas(self.invalid(), "invalid_df")

    def _counts(self) -> str:
        kinds = ", ".join(f"{k} {v:,}" for k, v in self.removed.items() if v) or "none"
        return (f"read {self.read:,}, kept {self.kept:,}, removed {self.removed_total:,} "
                f"({kinds}), invalid {self.invalid_count:,}")

    def __repr__(self) -> str:
        if self.summary is None:
            return (f"RunSummary(run_id={self.run_id!r}, submitted=True, job_id={self.job_id!r},"
                    f" report={self.report!r})")
        near = (f", near {self.near['mode']} recall {self.recall:.4f}"
                if self.near and self.recall is not None else "")
        return (f"RunSummary(run {self.run_id}: {self._counts()}{near}; output {self.output}, "
                f"report {self.report})")

    def __str__(self) -> str:
        """The lines the CLI prints at the end."""
        if self.summary is None:
            job = f" job {self.job_id}" if self.job_id else ""
            return (f"submitted{job}: the job publishes its outputs and writes {self.report}"
                    "/summary.json when it succeeds (it holds the output's lease until then)")
        return human_summary(self.summary)

    def _repr_html_(self) -> str:
        e = html.escape
        if self.summary is None:
            return f"<p>{e(str(self))}</p>"
        rows = [("run", self.run_id), ("read", f"{self.read:,}"), ("kept", f"{self.kept:,}")]
        rows += [(f"removed ({k})", f"{v:,}") for k, v in self.removed.items() if v]
        rows += [("invalid", f"{self.invalid_count:,}")]
        if self.near:
            mode = self.near.get("mode")
            rows.append(("near", f"{mode} search in {self.near.get('cells'):,} "
                                 f"cell(s); {recall_line(self.near['recall'], mode)}"
                         if self.near.get("recall") else str(mode)))
        rows += [("output", self.output), ("report", self.report)]
        if self.wall_time_s is not None:
            rows.append(("time", f"{self.wall_time_s:.1f} s"))
        body = "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td>{e(v)}</td></tr>"
                       for k, v in rows)
        return f"<table><caption>RunSummary</caption>{body}</table>"


def _to_pandas(table, method: str):
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise ImportError(f"RunSummary.{method}() needs pandas, which is not installed: pip "
                          "install pandas, or use the pyarrow Table that "
                          f"{method.removesuffix('_df')}() returns") from None
    return table.to_pandas()


def _table(s: dict, name: str) -> str:
    """A report table's name, as a directory of part files where the run wrote one."""
    return f"{name}/ (a part file per input file)" if name in s.get("report_parts", ()) \
        else name


def _long_texts(embed: dict | None) -> str:
    """The first line's clause on texts longer than the embedding model takes, if any."""
    if not embed or not embed.get("long_records"):
        return ""
    return (f"; {embed['long_records']:,} text(s) longer than the model's "
            f"{embed['max_seq_length']} tokens (embed.long: {embed['long']})")


def human_summary(s: dict) -> str:
    """A finished run in a few lines: counts, where the outputs are, near and store."""
    removed = {k.removeprefix("removed_"): v for k, v in s.items()
               if k.startswith("removed_") and v}
    how = ", ".join(f"{k} {v:,}" for k, v in removed.items()) or "none"
    lines = [f"run {s['run_id']}: read {s['read']:,} records: kept {s['kept']:,}, removed "
             f"{sum(removed.values()):,} ({how}), invalid {s['invalid']:,} in "
             f"{s['wall_time_s']:.1f} s" + _long_texts(s.get("embed")),
             f"clean shards: {s['output']}/ ({_files(s)})",
             f"report: {s['report']}/ (index.html, {_table(s, 'duplicates.parquet')}, "
             f"files.parquet, {_table(s, 'invalid.parquet')}, summary.json"
             + (", near_distances.png/.json/.csv, borderline_pairs.parquet" if s.get("near")
                else "") + (", reference_invalid.parquet" if s.get("reference") else "") + ")"]
    if s.get("unreadable_files"):
        u = s["unreadable_files"]
        lines.append(f"unreadable: {len(u)} file(s) could not be opened, no records counted "
                     f"from them (summary.json: unreadable_files); first: {u[0]['path']}: "
                     f"{u[0]['reason']}")
    if s.get("near"):
        n = s["near"]
        if n.get("metric") == "jaccard":
            how = (f"{n['bands']} bands x {n['rows']} rows (MinHash-LSH)" if n["mode"] == "bounded"
                   else "prefix-filter join")
            lines.append(f"near: jaccard >= {n['threshold_jaccard']:g} over {n['unit']} "
                         f"{n['size']}-grams, {n['mode']} ({how}); {n['compared']:,} "
                         f"pair{'' if n['compared'] == 1 else 's'} verified; "
                         f"{recall_line(n['recall'], n['mode'])}")
        else:
            how = f", at most {n['probes']} per record" if n["mode"] == "bounded" else ""
            lines.append(f"near: {n['mode']} search in {n['cells']:,} cell(s){how}; "
                         f"{recall_line(n['recall'], n['mode'])}")
    if s.get("reference"):
        r = s["reference"]
        lost = len(r.get("unreadable_files") or [])
        lines.append(f"reference: {r['read']:,} records in {r['files']} file(s) ({r['invalid']:,}"
                     " invalid" + (f", {lost} file(s) unreadable" if lost else "")
                     + "); removed as leaks: "
                     f"{s['removed_reference_exact'] + s['removed_reference_near']:,}")
    if s.get("store"):
        st = s["store"]
        line = f"store: {st['path']}: checked against {st['earlier_runs']} earlier run(s); "
        if not st.get("committed"):
            line += "not updated (store.update: false)"
        else:
            line += f"{st['appended']:,} records appended"
            if st.get("replaces_records") is not None:
                line += (f", replacing the {st['replaces_records']:,} this run id had "
                         "committed before")
            if st.get("compaction_merges"):
                line += f"; {st['compaction_merges']} compaction merge(s)"
        lines.append(line)
    return "\n".join(lines)


def _files(s: dict) -> str:
    n = sum(f["output"] is not None for f in s["files"])
    return f"{n} file" if n == 1 else f"{n:,} files"
