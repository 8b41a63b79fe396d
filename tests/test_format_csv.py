"""CSV input (``input.format: csv``): the same removals as the same rows in Parquet, clean
copies that are the header and the kept lines byte for byte (compressed as the input),
bad lines reported with their reasons and their neighbours read.

Files are written as users get them: by pandas' ``to_csv`` (plain, gzip, bz2; a TSV with
``sep='\\t'``) and pyarrow's zstd stream; read back by pandas. The Parquet twin's job is
the oracle of the decisions (its readers are checked against brute force elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.jobkit import report, run_job
from tests.test_feature_columns import _table
from tests.test_format_jsonl import _raw
from tests.textkit import crawl_corpus, package_texts

SUFFIXES = ("", ".gz", ".bz2", ".zst")


def _write(df: pd.DataFrame, path, sep: str = ",") -> None:
    if str(path).endswith(".zst"):
        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(df.to_csv(index=False, sep=sep).encode())
    else:
        df.to_csv(path, index=False, sep=sep)


def _twin_jobs(tmp_path, df: pd.DataFrame, tensor, sep: str = ",", extra: dict | None = None,
               **cfg) -> tuple:
    """``df`` in four CSV files (plain, gzip, bz2, zstd; ``sep``) and in four Parquet
    files: each job's (record_id, duplicate_of, kind, distance), and the CSV files."""
    ext, extra = (".tsv" if sep == "\t" else ".csv"), extra or {}
    files = []
    for k, (suffix, idx) in enumerate(zip(SUFFIXES, np.array_split(np.arange(len(df)), 4),
                                          strict=True)):
        for where in ("c", "p"):
            (tmp_path / where / "in").mkdir(parents=True, exist_ok=True)
        files.append(tmp_path / "c" / "in" / f"part-{k}{ext}{suffix}")
        _write(df.iloc[idx], files[-1], sep)
        pq.write_table(pa.Table.from_pandas(df.iloc[idx], preserve_index=False),
                       tmp_path / "p" / "in" / f"part-{k}.parquet", row_group_size=40)
    got = []
    for fmt, where, glob in (("csv", "c", f"*{ext}*"), ("parquet", "p", "*.parquet")):
        assert run_job(tmp_path / where, fmt, str(tmp_path / where / "in" / glob),
                       "tuning.chunk_rows=64", input={"tensor": tensor, "id": "id", **extra},
                       **cfg) == 0
        dups, invalid = report(tmp_path / where)
        assert invalid.num_rows == 0
        got.append(sorted((d["record_id"], d["duplicate_of"], d["kind"],
                           round(d["distance"], 9)) for d in dups.to_pylist()))
    return got[0], got[1], files


def _kept_lines(files, removed: set[str]) -> None:
    """Each clean copy is its input's header and kept lines, byte for byte, compressed as
    the input (its first bytes), and pandas reads it back."""
    for src in files:
        dst = src.parents[1] / "out" / "clean" / src.name
        assert dst.read_bytes()[:2] == src.read_bytes()[:2]
        lines = _raw(src).splitlines(keepends=True)
        sep = "\t" if ".tsv" in src.name else ","
        want = lines[:1] + [line for line in lines[1:]
                            if line.decode().split(sep)[0] not in removed]
        assert _raw(dst).splitlines(keepends=True) == want
        back = pd.read_csv(dst, sep=sep)
        assert list(back["id"]) == [line.decode().split(sep)[0] for line in want[1:]]


@pytest.mark.parametrize("sep", [",", "\t"])
def test_a_feature_table_as_csv_gives_the_parquet_jobs_removals(tmp_path, sep):
    """The breast cancer table with planted copies (33 numeric columns named by a glob
    and a count) as CSV and TSV of every compression: the Parquet job's removals, kept
    lines byte for byte."""
    df, features = _table()
    mine, theirs, files = _twin_jobs(tmp_path, df, ["mean_*", "*_error", "worst_*", "visits"],
                                     sep, near={"metric": "l2", "threshold": 1.0})
    assert mine == theirs and len(mine) >= 200
    _kept_lines(files, {r for r, *_ in mine})


def test_texts_as_csv_give_the_parquet_jobs_removals(tmp_path):
    """Real licence / METADATA texts with near and exact copies (jaccard 0.8); pandas
    quotes the texts (commas, quotes) and writes each on one line once its line breaks
    are spaces: the Parquet job's removals, kept lines byte for byte."""
    texts = [" ".join(t.split()) for t in crawl_corpus()]
    df = pd.DataFrame({"id": [f"d{i}" for i in range(len(texts))], "text": texts,
                       "lang": "en"})
    mine, theirs, files = _twin_jobs(tmp_path, df, "text", extra={"decode": "text"},
                                     near={"metric": "jaccard", "threshold": 0.8})
    assert mine == theirs
    kinds = [k for _, _, k, _ in mine]
    assert kinds.count("exact") >= 2 and kinds.count("near") > 50
    _kept_lines(files, {r for r, *_ in mine})


def test_bad_lines_are_invalid_records_and_their_neighbours_are_read(tmp_path):
    """Among good rows: a row with fields missing, a word in a number column, a quoted
    field holding a line break (both its lines), blank lines and CRLF endings: each bad
    line is one invalid record with its reason at its position, every good line is read,
    read = kept + removed + invalid, and the clean copy is the header and the good lines.
    (Past the first 1,000 lines, which the checks read: a quoted field holding a line
    break there stops the run before any work.)"""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 4))
    x[1150] = x[20]  # an exact copy
    good = [f"r{i},{','.join(repr(float(v)) for v in x[i])},note {i}".encode()
            for i in range(1200)]
    header = b"id,a,b,c,d,note"
    bad = {1060: (b"r1900,1.0,2.0", "3 fields, not the header's 6"),
           1090: (b"r1901,1.0,two,3.0,4.0,x", "column 'b' holds 'two', not a number as in "
                  "the first lines"),
           1120: (b'r1902,1.0,2.0,3.0,4.0,"a note', "a quoted field runs past the end of its "
                  "line"),
           1121: (b'that goes on",5', "a line inside a quoted field opened on an earlier line")}
    lines, expect, position = [header], {}, 0
    for i, line in enumerate(good):
        if position in bad:
            while position in bad:
                lines.append(bad[position][0])
                expect[position] = bad[position][1]
                position += 1
        lines.append(line + (b"\r" if i % 7 == 0 else b""))
        position += 1
        if i % 13 == 0:
            lines.append(b"")
    src = tmp_path / "in" / "rows.csv"
    src.parent.mkdir()
    src.write_bytes(b"\n".join(lines) + b"\n")
    assert run_job(tmp_path, "csv", str(src), input={"tensor": ["a", "b", "c", "d"],
                                                     "id": "id"}) == 0
    dups, invalid = report(tmp_path)
    got = {r["record_id"]: r["reason"] for r in invalid.to_pylist()}
    assert len(got) == len(expect)
    for position, why in expect.items():
        named = next((k for k in got if k.endswith(f":{position}")), None)
        assert named is not None and why in got[named], (position, got)
    assert dups.column("record_id").to_pylist() == ["r1150"]
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == 1204 == summary["kept"] + 1 + summary["invalid"]
    out = (tmp_path / "out" / "clean" / "rows.csv").read_bytes()
    assert out == b"\n".join(line for line in lines if line not in {b for b, _ in bad.values()}
                             and not line.startswith(b"r1150,")) + b"\n"

    early = tmp_path / "early" / "rows.csv"
    early.parent.mkdir()
    early.write_bytes(b"\n".join([header, *good[:5], bad[1120][0], bad[1121][0], *good[5:]]))
    assert run_job(tmp_path / "early", "csv", str(early),
                   input={"tensor": ["a", "b", "c", "d"], "id": "id"}) == 2


def test_checks_before_any_work(tmp_path, capsys):
    """Exit 2 before any work, one line each: CSV files read as Parquet (set
    input.format: csv); a README among CSV files; input.format: tsv (read as csv); a
    mistyped column (the nearest name); a text column read as numbers (decode named)."""
    from tests.test_checks import nothing_written, one_error_line

    texts = package_texts(30)
    df = pd.DataFrame({"id": [f"d{i}" for i in range(30)], "text": texts,
                       "score": np.arange(30.0)})
    (tmp_path / "in").mkdir()
    df.assign(text=[" ".join(t.split()) for t in texts]).to_csv(tmp_path / "in" / "a.csv",
                                                                index=False)
    (tmp_path / "in" / "README.md").write_text("# the data\n\nTexts, one per row.\n")
    csvs = str(tmp_path / "in" / "*.csv")
    text = {"tensor": "text", "decode": "text"}
    for fmt, glob, source, want in (
            ("parquet", csvs, text, "CSV files are read with input.format: csv"),
            ("csv", str(tmp_path / "in" / "*"), text, "README.md is not a CSV file"),
            ("tsv", csvs, text, "delimited text with a header line (comma or tab) is read "
             "with input.format: csv"),
            ("csv", csvs, {"tensor": ["scroe"]}, "no column 'scroe' (did you mean 'score'?)"),
            ("csv", csvs, {"tensor": "text"}, "column 'text' holds string, not numbers: to "
             "read its texts set input.decode: text")):
        assert run_job(tmp_path, fmt, glob, input={"id": "id", **source}) == 2
        line = one_error_line(capsys)
        assert want in line, line
        assert nothing_written(tmp_path)


def test_a_csv_with_no_header_is_told_how_to_add_one(tmp_path, capsys):
    """scikit-learn's digits.csv.gz (8x8 images as 64 counts and a label per line, no
    header line): exit 2 before any work with the command that adds one; run as given,
    the job reads every row under a glob of the new names and finds pandas' exact
    copies; a glob over columns that share a name is refused, naming it."""
    import shutil
    import subprocess
    import sys

    import sklearn

    from tests.test_checks import one_error_line

    src = tmp_path / "in" / "digits.csv.gz"
    src.parent.mkdir()
    shutil.copy(Path(sklearn.__file__).parent / "datasets" / "data" / "digits.csv.gz", src)
    assert run_job(tmp_path, "csv", str(src), input={"tensor": ["*"], "id": None}) == 2
    line = one_error_line(capsys)
    assert "its first line (0, 0, 5, 13, ...) is numbers, not a header" in line, line
    subprocess.run([sys.executable, "-c", line.split('python -c "')[1].split('"')[0]],
                   cwd=src.parent, check=True)
    src.unlink()
    headed = src.parent / "digits-header.csv.gz"
    assert run_job(tmp_path, "csv", str(headed), input={"tensor": ["c*"], "id": None}) == 0
    rows = pd.read_csv(headed)
    dups, invalid = report(tmp_path)
    assert invalid.num_rows == 0 and dups.num_rows == rows.duplicated().sum()
    assert json.loads((tmp_path / "out" / "report" / "summary.json").read_text())[
        "resolved"]["columns"] == [f"c{i}" for i in range(65)]

    twice = tmp_path / "twice" / "t.csv"
    twice.parent.mkdir()
    twice.write_text("id,x,x,y\na,1,2,3\nb,1,2,3\n")
    assert run_job(tmp_path / "twice", "csv", str(twice), input={"tensor": ["x*", "y"]}) == 2
    assert "input.tensor: 'x*' matches 'x', the name of 2 columns" in one_error_line(capsys)


def test_a_header_only_file_and_an_empty_column_are_read(tmp_path):
    """A file with a header and no row (what to_csv writes for an empty frame) first in
    the glob tells nothing (the next file's numbers decide), and a column empty in every
    line reads as numbers: its rows are invalid, named; under a glob both match."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("id,e0,e1\n")
    (tmp_path / "in" / "b.csv").write_text("id,e0,e1\n" + "".join(
        f"r{i},{i % 3}.5,{i % 2}\n" for i in range(20)))
    (tmp_path / "in" / "c.csv").write_text("id,e0,e1\n" + "".join(
        f"s{i},{i % 3}.5,\n" for i in range(5)))
    assert run_job(tmp_path, "csv", str(tmp_path / "in" / "*.csv"), "max_invalid_fraction=0.5",
                   input={"tensor": ["e*"], "id": "id"}) == 0
    dups, invalid = report(tmp_path)
    assert invalid.column("reason").to_pylist() == ["column 'e1': null"] * 5
    assert dups.num_rows == 20 - 6  # (i % 3, i % 2): six distinct rows
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["resolved"] == {"shape": [2], "dtype": "float64", "inputs": 3,
                                   "columns": ["e0", "e1"]}
