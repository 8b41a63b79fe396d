"""A feature table, one numeric column per feature (``input.tensor: [a, b, c]``): each
row's values are its vector. The oracle is the same table with the vectors written as
one ``fixed_size_list`` column (whose readers are checked against brute force
elsewhere): the same removals, kinds and distances; the clean copy is the input's rows,
every column kept, without the removed ones.

Data: scikit-learn's breast cancer table (569 real rows of 30 float features, measured
at different scales) with planted exact copies, near copies (each feature moved by a
millionth of its range) and an integer column, written by pandas through pyarrow.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from sklearn.datasets import load_breast_cancer

from pipeline.run import main
from tests.jobkit import report, run_job

THRESHOLD = 1.0  # l2 over features in their own units: planted copies are ~0.01 away


def _table(seed: int = 0) -> tuple[pd.DataFrame, list[str]]:
    """The real rows, 120 exact and 120 near copies of them in a shuffled order, an
    integer feature (small counts) and a text column the job does not read."""
    data = load_breast_cancer(as_frame=True).frame.drop(columns="target")
    rng = np.random.default_rng(seed)
    data.columns = [c.replace(" ", "_") for c in data.columns]
    features = [*data.columns, "visits"]
    data["visits"] = rng.integers(0, 5, len(data)).astype(np.int64)
    exact = data.iloc[rng.choice(len(data), 120)]
    near = data.iloc[rng.choice(len(data), 120)].copy()
    span = (data.max() - data.min()).to_numpy()
    near.iloc[:, :-1] += rng.uniform(-1, 1, (len(near), len(features) - 1)) * span[:-1] * 1e-6
    df = pd.concat([data, exact, near], ignore_index=True)
    df = df.iloc[rng.permutation(len(df))].reset_index(drop=True)
    df.insert(0, "id", [f"p{i}" for i in range(len(df))])
    df["note"] = [f"patient {i}" for i in range(len(df))]
    return df, features


def _write(df: pd.DataFrame, folder, fmt: str) -> str:
    """``df`` in three files of ``fmt`` (Parquet with row groups of 100 rows)."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(np.array_split(np.arange(len(df)), 3)):
        t = pa.Table.from_pandas(df.iloc[part], preserve_index=False)
        if fmt == "parquet":
            pq.write_table(t, folder / f"part-{k}.parquet", row_group_size=100)
        elif fmt == "arrow":
            feather.write_feather(t, folder / f"part-{k}.arrow")
        else:
            (folder / f"part-{k}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in t.to_pylist()))
    return str(folder / f"*.{fmt}")


def _decisions(tmp_path) -> list[tuple]:
    dups, invalid = report(tmp_path)
    assert invalid.num_rows == 0
    return sorted((d["record_id"], d["duplicate_of"], d["kind"], round(d["distance"], 9))
                  for d in dups.to_pylist())


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "jsonl"])
def test_a_feature_table_gives_the_vector_columns_removals(tmp_path, fmt):
    df, features = _table()
    glob = _write(df, tmp_path / "cols" / "in", fmt)
    near = {"metric": "l2", "threshold": THRESHOLD}
    assert run_job(tmp_path / "cols", fmt, glob, "tuning.chunk_rows=64",
                   input={"tensor": features, "id": "id"}, near=near) == 0
    got = _decisions(tmp_path / "cols")

    twin = pd.DataFrame({"id": df["id"]})
    twin["vec"] = list(df[features].to_numpy(np.float64))
    table = pa.Table.from_pandas(twin, preserve_index=False)
    table = table.set_column(1, "vec", table.column("vec").cast(
        pa.list_(pa.float64(), len(features))))
    (tmp_path / "vec" / "in").mkdir(parents=True)
    pq.write_table(table, tmp_path / "vec" / "in" / "all.parquet", row_group_size=100)
    assert run_job(tmp_path / "vec", "parquet", str(tmp_path / "vec" / "in" / "*.parquet"),
                   "tuning.chunk_rows=64", input={"tensor": "vec", "id": "id"},
                   near=near) == 0
    assert got == _decisions(tmp_path / "vec")
    kinds = {k for _, _, k, _ in got}
    assert kinds == {"exact", "near"} and len(got) >= 200

    removed = {r for r, *_ in got}
    if fmt == "parquet":  # every column kept, rows in order, the removed ones left out
        clean = pq.read_table(tmp_path / "cols" / "out" / "clean").to_pandas()
        want = df[~df["id"].isin(removed)].reset_index(drop=True)
        pd.testing.assert_frame_equal(clean.sort_values("id").reset_index(drop=True),
                                      want.sort_values("id").reset_index(drop=True))


def test_a_null_feature_or_an_inexact_integer_is_an_invalid_record(tmp_path):
    """A null in any named column, or an int64 above 2^53 beside float columns (two such
    counts would compare as one float64; Arrow files carry no statistics to refuse it
    before the run, as Parquet's do), makes that row invalid with the column named; the
    other rows are read, and read = kept + removed + invalid."""
    df, features = _table()
    df = df.astype({"mean_radius": "Float64"})
    df.loc[[3, 50], "mean_radius"] = pd.NA
    df["visits"] = df["visits"].astype(np.int64)
    df.loc[7, "visits"] = 2 ** 53 + 1
    glob = _write(df, tmp_path / "in", "arrow")
    assert run_job(tmp_path, "arrow", glob, input={"tensor": features, "id": "id"},
                   near={"metric": "l2", "threshold": THRESHOLD}) == 0
    dups, invalid = report(tmp_path)
    reasons = {r["record_id"]: r["reason"] for r in invalid.to_pylist()}
    assert reasons == {"p3": "column 'mean_radius': null", "p50": "column 'mean_radius': null",
                       "p7": "column 'visits': 9007199254740993 is above 2^53, which float64 "
                             "does not hold exactly (set input.dtype: int64 if every column "
                             "holds integers)"}
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    kept = sum(feather.read_table(f).num_rows for f in (tmp_path / "out" / "clean").iterdir())
    assert summary["read"] == len(df) == kept + dups.num_rows + len(reasons)
    assert (summary["kept"], summary["invalid"]) == (kept, 3)


def test_input_dtype_reads_the_columns_as_it_says(tmp_path):
    """``input.dtype: float32``: the columns are read as float32 vectors, so the exact
    copies are the float32 vectors' (a float64 twin written as float32 agrees)."""
    df, features = _table(seed=1)
    glob = _write(df, tmp_path / "in", "parquet")
    assert run_job(tmp_path, "parquet", glob, input={"tensor": features, "id": "id",
                                                     "dtype": "float32"}) == 0
    got = _decisions(tmp_path)
    x = df[features].to_numpy(np.float32)
    _, first, inverse = np.unique(x, axis=0, return_index=True, return_inverse=True)
    want = sorted((df["id"][i], df["id"][first[inverse[i]]], "exact", 0.0)
                  for i in range(len(df)) if first[inverse[i]] != i)
    assert got == want and len(want) >= 120


def test_globs_name_the_columns_they_match(tmp_path, capsys):
    """``[mean_*, *_error, worst_*, visits]`` names the columns each glob matches, in the
    file's order (the id and the text column never): the explicit list's removals, and
    the run says which columns it compared (printed at the start, in summary.json)."""
    df, features = _table()
    glob = _write(df, tmp_path / "in", "parquet")
    near = {"metric": "l2", "threshold": THRESHOLD}
    got = []
    for tensor in (["mean_*", "*_error", "worst_*", "visits"], ["*"], features):
        assert run_job(tmp_path, "parquet", glob, "output.overwrite=true", near=near,
                       input={"tensor": tensor, "id": "id"}) == 0
        got.append(_decisions(tmp_path))
        summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
        assert summary["resolved"]["columns"] == features
    capsys.readouterr()
    assert main(["--config", str(tmp_path / "job.yaml"), "--overwrite", "--set",
                 "input.tensor=[mean_*, '*_error', worst_*, visits]"]) == 0
    assert ("input.tensor: ['mean_*', '*_error', 'worst_*', 'visits'] names 31 columns: "
            "mean_radius, mean_texture, mean_perimeter") in capsys.readouterr().err
    assert got[0] == got[1] == got[2] and len(got[0]) >= 200


def test_a_reference_set_reads_the_inputs_globs(tmp_path, capsys):
    """A reference set of the same layout, its columns named by the same globs, removes
    the input rows it holds (exact and near) as the explicit list does (a glob crashed the
    read of the reference files: found by fuzz_job.py seed 11505); a reference set whose
    globs match the columns in another order is refused before any work."""
    from tests.test_checks import nothing_written, one_error_line

    df, features = _table()
    glob = _write(df, tmp_path / "in", "parquet")
    ref = df.iloc[::7].assign(id=lambda r: "ref-" + r["id"])
    _write(ref, tmp_path / "ref", "parquet")
    near = {"metric": "l2", "threshold": THRESHOLD}
    got = []
    for tensor in (["mean_*", "*_error", "worst_*", "visits"], features):
        assert run_job(tmp_path, "parquet", glob, "output.overwrite=true", near=near,
                       input={"tensor": tensor, "id": "id"}, reference=[{
                           "format": "parquet", "path": str(tmp_path / "ref" / "*.parquet"),
                           "tensor": tensor, "id": "id"}]) == 0
        got.append(_decisions(tmp_path))
    kinds = {k for *_, k, _ in got[0]}
    assert got[0] == got[1] and {"reference_exact", "reference_near"} <= kinds
    shuffled = ref[["id", *features[::-1]]]
    (tmp_path / "ref2").mkdir()
    pq.write_table(pa.Table.from_pandas(shuffled, preserve_index=False),
                   tmp_path / "ref2" / "r.parquet")
    capsys.readouterr()
    (tmp_path / "x").mkdir()
    assert run_job(tmp_path / "x", "parquet", glob, near=near,
                   input={"tensor": ["*"], "id": "id"}, reference=[{
                       "format": "parquet", "path": str(tmp_path / "ref2" / "*.parquet"),
                       "tensor": ["*"], "id": "id"}]) == 2
    assert "names other columns in the reference files" in one_error_line(capsys)
    assert nothing_written(tmp_path / "x")


def test_checks_before_any_work(tmp_path, capsys):
    """Exit 2 before any work, one line each: a text column among the features (named);
    a mistyped column (the nearest name); a list under a format whose tensor is one
    feature or dataset; jaccard over feature columns; input.decode with a list; a column
    named twice; a glob that matches no numeric column; globs that match other columns
    in another file; a Parquet column of no value (null type); a Parquet int64 column
    above 2^53 beside floats (its statistics)."""
    from tests.test_checks import nothing_written, one_error_line

    df, features = _table()
    glob = _write(df, tmp_path / "in", "parquet")
    wide = df.assign(mean_extra=1.0)
    pq.write_table(pa.Table.from_pandas(wide.iloc[:10], preserve_index=False),
                   tmp_path / "two" / "b.parquet") if (tmp_path / "two").mkdir() is None else 0
    pq.write_table(pa.Table.from_pandas(df.iloc[10:], preserve_index=False),
                   tmp_path / "two" / "a.parquet")
    (tmp_path / "empty").mkdir()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False).append_column(
        "unused", pa.nulls(len(df))), tmp_path / "empty" / "a.parquet")
    big = df.assign(visits=df["visits"] + 2 ** 60)
    (tmp_path / "big").mkdir()
    pq.write_table(pa.Table.from_pandas(big, preserve_index=False),
                   tmp_path / "big" / "a.parquet")
    for fmt, tensor, extra, want in (
            ("parquet", ["x*"], {}, "input.tensor: 'x*' matches no numeric column; the file "
             "has columns id, mean_radius"),
            ("parquet", ["mean_*"], {"input": {"path": str(tmp_path / "two" / "*.parquet")}},
             "names other columns in"),
            ("parquet", [*features, "unused"], {"input": {
                "path": str(tmp_path / "empty" / "*.parquet")}}, "input.tensor: column 'unused' "
             "holds no value in the whole file (its type is null)"),
            ("parquet", features, {"input": {"path": str(tmp_path / "big" / "*.parquet")}},
             "column 'visits' holds integers up to 1,152,921,504,606,846,980 (row group 0's "
             "statistics), above 2^53"),
            ("parquet", [*features[:3], "note"], {},
             "input.tensor: column 'note' holds large_string, not numbers"),
            ("parquet", ["mean_radius", "mean_texure"], {},
             "no column 'mean_texure' (did you mean 'mean_texture'?)"),
            ("hdf5", features, {}, "input.tensor: a list of columns is read from parquet, "
             "arrow, jsonl and csv tables"),
            ("parquet", features, {"near": {"metric": "jaccard", "threshold": 0.8}},
             "near.metric: jaccard compares the texts or token sequences of one column"),
            ("parquet", features, {"input": {"decode": "text"}},
             "input.decode: text reads one column"),
            ("parquet", ["visits", "visits"], {}, "column 'visits' is named twice")):
        assert run_job(tmp_path, fmt, glob, input={"tensor": tensor, "id": "id",
                                                   **extra.pop("input", {})}, **extra) == 2
        line = one_error_line(capsys)
        assert want in line, line
        assert nothing_written(tmp_path)
