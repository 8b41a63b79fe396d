"""The dedup job on real Parquet files from apache/parquet-testing (tests/data/parquet-testing).

Every numeric column of every checked-in file is the tensor once. The job must
deduplicate it, matching a brute-force oracle computed here with pyarrow and numpy and
keeping the file's schema (Arrow and Parquet physical types, INT96 included), format
version, codecs (or their noted nearest equivalent) and row-group boundaries; a column
with no usable row may instead stop with one line on stderr and exit code 2, and so must
a non-numeric one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.jobkit import report, run_job
from tests.oracle import expected_removals

DATA = Path(__file__).parent / "data" / "parquet-testing"
FILES = sorted(DATA.glob("*.parquet"))
_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
_NUMBERS = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)


def _levels(t: pa.DataType) -> tuple[int, pa.DataType]:
    """(list depth, leaf type) of a column type."""
    depth = 0
    while any(f(t) for f in _LISTS) and not pa.types.is_map(t):
        depth, t = depth + 1, t.value_type
    return depth, t


def _numeric_columns(path: Path) -> list[str]:
    return [f.name for f in pq.ParquetFile(path).schema_arrow
            if any(is_(_levels(f.type)[1]) for is_ in _NUMBERS)]


CASES = [pytest.param(p, c, id=f"{p.stem}-{c}") for p in FILES for c in _numeric_columns(p)]


def _tensor(value: object, depth: int, dtype: np.dtype) -> np.ndarray | None:
    """A row's tensor, or None when the row is unusable: null, a null inside, or ragged
    (sublists of one level differing in length), the job's rules for invalid records."""
    level, shape = [value], []
    for _ in range(depth):
        if any(v is None for v in level):
            return None
        lengths = {len(v) for v in level}
        if len(lengths) > 1:
            return None
        shape.append(lengths.pop() if lengths else 0)
        level = [x for v in level for x in v]
    if any(v is None for v in level):
        return None
    return np.array(level, dtype=dtype).reshape(shape)


def _oracle(path: Path, column: str) -> tuple[list[int], dict[str, str], list[int]]:
    """(invalid positions, {removed id: kept id}, kept positions) by brute force."""
    ids = [f"{path}:{i}" for i in range(pq.ParquetFile(path).metadata.num_rows)]
    col = pq.read_table(path, columns=[column]).column(0)
    depth, leaf = _levels(col.type)
    dtype = pa.array([], leaf).to_numpy(zero_copy_only=False).dtype  # no pandas here
    tensors = [_tensor(v, depth, dtype) for v in col.to_pylist()]
    invalid = [i for i, t in enumerate(tensors) if t is None]
    removed = expected_removals([(ids[i], t, 0.0) for i, t in enumerate(tensors)
                                 if t is not None])
    kept = [i for i, t in enumerate(tensors) if t is not None and ids[i] not in removed]
    return invalid, removed, kept


def _plain(x: object) -> object:
    """A Python value with NaN made comparable (NaN != NaN would fail equal rows)."""
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _physical(pf: pq.ParquetFile) -> list[str]:
    return [pf.schema.column(i).physical_type for i in range(len(pf.schema))]


def _codecs(pf: pq.ParquetFile) -> list[str]:
    rg = pf.metadata.row_group(0)
    return [rg.column(i).compression for i in range(rg.num_columns)]


def _one_line_exit_2(rc: int, err: str) -> None:
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("path,column", CASES)
def test_every_numeric_column_dedups_like_the_oracle_and_keeps_the_file(tmp_path, capsys,
                                                                        path, column):
    # nulls are common in these files: this test is about the usable rows (the invalid share
    # has its own tests in test_preflight.py)
    rc = run_job(tmp_path, "parquet", str(path), "max_invalid_fraction=1",
                 input={"tensor": column, "id": None})
    err = capsys.readouterr().err
    invalid, removed, kept = _oracle(path, column)
    if len(invalid) < pq.ParquetFile(path).metadata.num_rows:
        assert rc == 0, err  # usable tensors: the job must dedup them
    elif rc != 0:  # nothing usable: a run may refuse to publish an all-invalid output
        _one_line_exit_2(rc, err)
        return
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    (entry,) = summary["files"]
    n_removed = sum(v for k, v in summary.items() if k.startswith("removed_"))
    assert summary["read"] == summary["kept"] + n_removed + summary["invalid"]
    assert (entry["read"], entry["kept"], entry["invalid"]) == (
        pq.ParquetFile(path).metadata.num_rows, len(kept), len(invalid))
    dups, bad = report(tmp_path)
    assert dict(zip(dups["record_id"].to_pylist(), dups["duplicate_of"].to_pylist(),
                    strict=True)) == removed
    assert bad["record_id"].to_pylist() == [f"{path}:{i}" for i in invalid]

    src, out = pq.ParquetFile(path), pq.ParquetFile(tmp_path / "out" / "clean" / path.name)
    assert out.schema_arrow == src.schema_arrow
    assert out.schema_arrow.metadata == src.schema_arrow.metadata
    assert _physical(out) == _physical(src)  # INT96 stays INT96, INT32 decimals stay INT32
    assert out.metadata.format_version == src.metadata.format_version
    if len(kept):
        mapped = {"UNKNOWN": "LZ4"}  # Hadoop LZ4: pyarrow writes LZ4_RAW, reported "LZ4"
        assert _codecs(out) == [mapped.get(c, c) for c in _codecs(src)]
        hadoop = [src.metadata.row_group(0).column(i).path_in_schema
                  for i, c in enumerate(_codecs(src)) if c == "UNKNOWN"]
        assert len(entry["notes"]) == len(hadoop)
        # the old LZ4 codec, Hadoop-framed or not (non_hadoop_lz4_compressed), is named as
        # read, and what the copy wrote
        assert all(n.startswith(f"column {c!r}: read as the deprecated LZ4 codec (Hadoop-framed "
                                "or raw blocks)") and n.endswith("written as LZ4_RAW")
                   for c, n in zip(hadoop, entry["notes"], strict=True))
    drop = np.setdiff1d(np.arange(src.metadata.num_rows), kept)
    starts = np.cumsum([0] + [src.metadata.row_group(i).num_rows
                              for i in range(src.metadata.num_row_groups)])
    want_groups = [int(b - a - np.count_nonzero((drop >= a) & (drop < b)))
                   for a, b in zip(starts[:-1], starts[1:], strict=True)]
    assert [out.metadata.row_group(i).num_rows
            for i in range(out.metadata.num_row_groups)] == want_groups
    got, want = out.read(), src.read().take(pa.array(kept, pa.int64()))
    assert _plain(got.to_pylist()) == _plain(want.to_pylist())


@pytest.mark.parametrize("name,column", [
    ("int32_decimal.parquet", "value"),          # decimal128 stored as INT32
    ("int96_from_spark.parquet", "a"),           # INT96 timestamps
    ("alltypes_plain.parquet", "string_col"),    # binary
    ("large_string_map.brotli.parquet", "arr"),  # a map pyarrow cannot even read
])
def test_non_numeric_tensor_column_is_one_line_and_exit_2(tmp_path, capsys, name, column):
    rc = run_job(tmp_path, "parquet", str(DATA / name), input={"tensor": column, "id": None})
    err = capsys.readouterr().err
    _one_line_exit_2(rc, err)
    assert column in err and "not numbers" in err
    assert not (tmp_path / "out").exists()


def test_checked_in_files_cover_the_features_they_are_here_for():
    """The cases above are only as good as the files: they must hold these features."""
    codecs, physical, versions, groups = set(), set(), set(), 0
    for p in FILES:
        pf = pq.ParquetFile(p)
        codecs |= set(_codecs(pf))
        physical |= set(_physical(pf))
        versions.add(pf.metadata.format_version)
        groups = max(groups, pf.metadata.num_row_groups)
    assert {"UNCOMPRESSED", "SNAPPY", "GZIP", "ZSTD", "BROTLI", "LZ4", "UNKNOWN"} <= codecs
    assert "INT96" in physical and versions == {"1.0", "2.6"} and groups > 1
    assert len(CASES) > 40
