"""transforms.io.formats.parquet on files written by pyarrow, read back by pyarrow."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.jobkit import run_job
from transforms.io.formats import parquet, parquet_write
from transforms.io.formats.base import Decode, InputError, TensorSpec, Unit


def _read_all(path, spec, unit_rows=1000, batch_rows=1000):
    chunks = [c for u in parquet.plan(str(path), 0, unit_rows)
              for c in parquet.read(u, spec, batch_rows)]
    return chunks, [r for c in chunks for r in c.invalid]


def test_a_struct_field_is_read_once_flattened_as_the_refusal_says(tmp_path):
    """The way out the refusal of ``features.embedding`` names: Table.flatten() makes it a
    column whose name holds a dot, which is read and written back like any other."""
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    nested = pa.table({"features": pa.StructArray.from_arrays(
        [pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 8), pa.array(range(50))],
        ["embedding", "n"])})
    path = tmp_path / "a.parquet"
    pq.write_table(nested, path)
    spec = TensorSpec("features.embedding")
    with pytest.raises(InputError, match="a field inside the struct column 'features'"):
        parquet.check(str(path), spec)
    pq.write_table(nested.flatten(), path)
    spec = parquet.check(str(path), spec)
    chunks, invalid = _read_all(path, spec)
    assert not invalid and spec.shape == (8,)
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), x)
    parquet.write(str(path), str(tmp_path / "b.parquet"), np.arange(0, 50, 2), spec)
    assert pq.read_table(tmp_path / "b.parquet").column("features.n").to_pylist() == list(
        range(1, 50, 2))


def test_variable_lists_group_by_shape_and_shape_is_enforced_when_given(tmp_path):
    rows = [[[1, 2], [3, 4]], [[1, 2, 3, 4]], [[5, 6], [7, 8]], [[1], [2, 3]], None,
            [[1, 2], [3, 4]]]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"t": pa.array(rows, pa.list_(pa.list_(pa.int16())))}), path)
    chunks, invalid = _read_all(path, TensorSpec("t"))
    by_shape = {c.tensors.shape[1:]: c.positions.tolist() for c in chunks if len(c.positions)}
    assert by_shape == {(2, 2): [0, 2, 5], (1, 4): [1]}
    assert [r.position for r in invalid] == [3, 4]  # ragged, null
    two_by_two = next(c for c in chunks if c.tensors.shape[1:] == (2, 2))
    np.testing.assert_array_equal(two_by_two.tensors[1], [[5, 6], [7, 8]])
    assert two_by_two.tensors.dtype == np.int16

    chunks, invalid = _read_all(path, TensorSpec("t", shape=(2, 2)))
    assert [r.position for r in invalid] == [1, 3, 4]
    assert "shape other than [2, 2]" in invalid[0].reason


def test_units_cover_every_row_group_once(tmp_path):
    path = tmp_path / "a.parquet"
    x = np.arange(1000 * 3, dtype=np.float32).reshape(1000, 3)
    pq.write_table(pa.table({"e": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 3)}),
                   path, row_group_size=64)
    units = parquet.plan(str(path), 4, 200)
    assert units[0] == Unit(4, str(path), 0, 256) and units[-1].stop == 1000
    assert all(a.stop == b.start for a, b in zip(units, units[1:], strict=False))
    chunks, invalid = _read_all(path, TensorSpec("e"), unit_rows=200, batch_rows=50)
    assert not invalid and max(len(c.positions) for c in chunks) <= 50
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), x)
    np.testing.assert_array_equal(np.concatenate([c.positions for c in chunks]), np.arange(1000))


def test_units_of_texts_are_cut_by_bytes_too(tmp_path, corpus, monkeypatch):
    """Records of no fixed size (texts) make units of at most about UNIT_BYTES of row
    groups, so one large file of texts is read by every worker; fixed-size records keep
    their units of rows. Units cover every row once, in order."""
    monkeypatch.setattr(parquet, "UNIT_BYTES", 1 << 20)
    texts = [f"{t} {i}" for i, t in enumerate(  # real texts, 8 MB or more, all distinct
        corpus * (8 * (1 << 20) // sum(map(len, corpus)) + 1))]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=200)
    meta = pq.ParquetFile(path).metadata
    groups = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    spec = TensorSpec("text", decode=Decode("text"))
    units = parquet.plan(str(path), 0, 1 << 18, spec)
    assert units[0].start == 0 and units[-1].stop == len(texts)
    assert all(a.stop == b.start for a, b in zip(units, units[1:], strict=False))
    held = [sum(groups[u.start // 200:-(-u.stop // 200)]) for u in units]
    assert sum(groups) >= 8 << 20 and max(held) < (1 << 20) + max(groups)
    assert len(units) >= 6
    chunks, invalid = _read_all(path, spec, unit_rows=1 << 18)
    assert not invalid and [t for c in chunks for t in c.tensors] == texts
    x = np.zeros((4000, 512), np.float32)  # 8 MB of vectors: cut by rows only
    pq.write_table(pa.table({"e": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)),
                                                                   512)}),
                   tmp_path / "v.parquet", row_group_size=200)
    assert len(parquet.plan(str(tmp_path / "v.parquet"), 0, 1 << 18, TensorSpec(
        "e", shape=(512,), dtype="float32"))) == 1


def test_write_keeps_schema_metadata_codec_and_row_groups(tmp_path):
    src, dst = tmp_path / "a.parquet", tmp_path / "out" / "a.parquet"
    x = np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32)
    table = pa.table({"id": [f"r{i}" for i in range(300)],
                      "e": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 4),
                      "w": np.arange(300, dtype=np.int8)}).replace_schema_metadata({"k": "v"})
    pq.write_table(table, src, row_group_size=100, compression="zstd")
    drop = np.array([0, 5, 150, 299])
    assert parquet.write(str(src), str(dst), drop) == 296
    out = pq.ParquetFile(dst)
    assert out.schema_arrow == table.schema and out.schema_arrow.metadata == {b"k": b"v"}
    assert out.metadata.num_row_groups == 3
    assert out.metadata.row_group(0).column(1).compression == "ZSTD"
    keep = np.setdiff1d(np.arange(300), drop)
    got = out.read()
    assert got["id"].to_pylist() == [f"r{i}" for i in keep]
    np.testing.assert_array_equal(got["w"].to_numpy(), keep.astype(np.int8))


def test_write_drops_the_same_rows_whether_it_slices_or_filters(tmp_path):
    """A group losing few rows is written from slices of its kept runs, one losing many
    from a filtered copy: both keep exactly the other rows, values, nulls and nesting
    as they were (drops at a group's ends and next to each other; a group losing every
    row keeps an empty group; one losing none is as read)."""
    rng = np.random.default_rng(1)
    n, g = 4 * 4096, 4096
    emb = [None if i % 997 == 0 else [float(v) if i % 13 else None for v in rng.random(3)]
           for i in range(n)]
    table = pa.table({"id": [None if i % 501 == 0 else f"r{i}" for i in range(n)],
                      "emb": pa.array(emb, pa.list_(pa.float32())),
                      "s": pa.array([{"a": i, "b": str(i)} for i in range(n)])})
    src, dst = tmp_path / "a.parquet", tmp_path / "out" / "a.parquet"
    pq.write_table(table, src, row_group_size=g)
    sparse = np.r_[0, 1, 2, 700, 701, g - 1] + g  # group 1: 6 of 4,096 (sliced)
    dense = np.sort(rng.choice(g, g // 3, replace=False)) + 2 * g  # group 2: filtered
    drop = np.concatenate([sparse, dense, np.arange(3 * g, 4 * g)])  # group 3: all
    assert g // len(sparse) >= parquet_write.SLICES_BELOW > g // len(dense)
    assert parquet.write(str(src), str(dst), drop) == n - len(drop)
    out = pq.ParquetFile(dst)
    assert [out.metadata.row_group(i).num_rows for i in range(out.metadata.num_row_groups)
            ][:3] == [g, g - len(sparse), g - len(dense)]
    keep = np.ones(n, bool)
    keep[drop] = False
    assert out.read().equals(table.filter(pa.array(keep)))


def test_write_showing_takes_the_same_tensors_as_read_rows(tmp_path):
    """The clean copy that also takes some records' tensors for the report writes the
    same file as ``write`` and returns what ``read_rows`` reads back: rows in several
    groups, at group edges, among dropped rows, of invalid records (left out by both) and
    past the end."""
    rng = np.random.default_rng(4)
    n, g = 3 * 1000, 1000
    emb = [None if i in (5, 1500) else [float(v) for v in rng.random(4 if i != 7 else 3)]
           for i in range(n)]
    table = pa.table({"id": [f"r{i}" for i in range(n)],
                      "emb": pa.array(emb, pa.list_(pa.float32()))})
    src = tmp_path / "a.parquet"
    pq.write_table(table, src, row_group_size=g)
    spec = TensorSpec("emb", "id", shape=(4,))
    drop = np.array([3, 999, 1000, 2001, 2002], np.int64)
    rows = [0, 3, 5, 7, 999, 1000, 1500, 1777, 2999, 3000, 5000]
    kept, shown = parquet.write_showing(str(src), str(tmp_path / "s" / "a.parquet"), drop,
                                        spec, rows)
    assert kept == parquet.write(str(src), str(tmp_path / "w" / "a.parquet"), drop, spec)
    assert pq.read_table(tmp_path / "s" / "a.parquet").equals(
        pq.read_table(tmp_path / "w" / "a.parquet"))
    want = parquet.read_rows(str(src), spec, rows)
    assert sorted(shown) == sorted(want) == [0, 3, 999, 1000, 1777, 2999]
    for r in want:
        assert shown[r].dtype == want[r].dtype and np.array_equal(shown[r], want[r])
        np.testing.assert_array_equal(shown[r], np.asarray(emb[r], np.float32))


def test_unreadable_row_group_is_reported_and_skipped(tmp_path):
    src = tmp_path / "a.parquet"
    x = np.random.default_rng(1).standard_normal((300, 16)).astype(np.float32)
    pq.write_table(pa.table({"e": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 16)}),
                   src, row_group_size=100, compression="snappy")
    meta = pq.ParquetFile(src).metadata.row_group(1).column(0)
    raw = bytearray(src.read_bytes())
    start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
    size = meta.total_compressed_size
    raw[start + 8: start + size - 8] = b"\x07" * (size - 16)  # garble row group 1's pages
    src.write_bytes(bytes(raw))
    chunks, invalid = _read_all(src, TensorSpec("e"), unit_rows=100)
    assert [r.position for r in invalid] == list(range(100, 200))
    assert all("row group 1" in r.reason for r in invalid)
    good = np.concatenate([c.positions for c in chunks])
    np.testing.assert_array_equal(good, np.r_[0:100, 200:300])
    assert parquet.write(str(src), str(tmp_path / "o.parquet"), np.arange(100, 200)) == 200


@pytest.mark.parametrize("spec,words", [
    (TensorSpec("nope"), "input.tensor: no column 'nope'; the file has columns e, s"),
    (TensorSpec("s"), "holds string, not numbers"),
    (TensorSpec("e", dtype="float64"), "input.dtype: column 'e' holds float32"),
    (TensorSpec("e", shape=(3,)), "shape [4], not [3]"),
    (TensorSpec("e", rank="s"), "keep: column 's' holds string"),
])
def test_check_messages(tmp_path, spec, words):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"e": pa.array([[1.0] * 4], pa.list_(pa.float32(), 4)),
                             "s": ["x"]}), path)
    with pytest.raises(InputError) as e:
        parquet.check(str(path), spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_unreadable_file_passes_check_and_reads_as_the_file_not_a_record(tmp_path):
    path = tmp_path / "a.parquet"
    path.write_bytes(b"PAR1 not really")
    assert parquet.check(str(path), TensorSpec("e")) == TensorSpec("e")
    chunks, invalid = _read_all(path, TensorSpec("e"))
    assert len(invalid) == 1 and invalid[0].record_id == str(path) and invalid[0].whole_file
    assert sum(c.n_read for c in chunks) == 0
    assert parquet.write(str(path), str(tmp_path / "o.parquet"), np.array([0])) == 0
    assert not (tmp_path / "o.parquet").exists()


WRITABLE_CODECS = ["none", "snappy", "gzip", "brotli", "lz4", "zstd"]  # all pyarrow writes


def _codec_table(n: int = 30) -> pa.Table:
    """Tensors with copies (i % 7), an id, and an INT96-able timestamp column."""
    x = (np.arange(n) % 7).astype(np.float32)[:, None] * np.ones(3, np.float32)
    return pa.table({"id": [f"r{i}" for i in range(n)],
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 3),
                     "ts": pa.array(np.arange(n) * 10**9 + 7, pa.timestamp("ns"))})


def _job_output(tmp_path, src) -> tuple[pq.ParquetFile, dict]:
    assert run_job(tmp_path, "parquet", str(src)) == 0
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    return pq.ParquetFile(tmp_path / "out" / "clean" / src.name), summary["files"][0]


@pytest.mark.parametrize("codec", WRITABLE_CODECS)
def test_job_keeps_every_codec_pyarrow_writes(tmp_path, codec):
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    table = _codec_table()
    pq.write_table(table, src, compression=codec, row_group_size=10)
    out, entry = _job_output(tmp_path, src)
    meta = pq.ParquetFile(src).metadata.row_group(0)
    for i in range(meta.num_columns):
        assert out.metadata.row_group(0).column(i).compression == meta.column(i).compression
    assert entry["notes"] == []
    assert entry["kept"] == len({tuple(v) for v in table["emb"].to_pylist()})


def test_job_keeps_per_column_codecs(tmp_path):
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    codecs = dict(zip(["id", "emb.list.element", "ts"], ["none", "zstd", "brotli"], strict=True))
    pq.write_table(_codec_table(), src, compression=codecs)
    out, _ = _job_output(tmp_path, src)
    rg = out.metadata.row_group(0)
    assert [rg.column(i).compression for i in range(3)] == ["UNCOMPRESSED", "ZSTD", "BROTLI"]


@pytest.mark.parametrize("version", ["1.0", "2.6"])
def test_job_keeps_int96_timestamps_and_format_version(tmp_path, version):
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    table = _codec_table()
    pq.write_table(table, src, version=version, use_deprecated_int96_timestamps=True)
    out, _ = _job_output(tmp_path, src)
    ts = out.schema_arrow.get_field_index("ts")
    assert out.schema.column(ts).physical_type == "INT96"
    assert out.schema_arrow == pq.ParquetFile(src).schema_arrow  # timestamp[ns], not [us]
    assert out.metadata.format_version == version
    kept = out.read()
    ids = [int(i[1:]) for i in kept["id"].to_pylist()]
    want = table["ts"].take(pa.array(ids)).cast(kept["ts"].type)
    # as integers: ns timestamps need pandas to become Python objects
    assert kept["ts"].cast(pa.int64()).to_pylist() == want.cast(pa.int64()).to_pylist()


def test_codec_mapping_keeps_writable_codecs_and_maps_the_others():
    for name in ("UNCOMPRESSED", "SNAPPY", "GZIP", "BROTLI", "LZ4", "ZSTD"):
        codec, note = parquet_write._codec(name, "c")
        assert note is None and codec in WRITABLE_CODECS
    codec, note = parquet_write._codec("UNKNOWN", "c")  # how pyarrow reports the old LZ4
    # Hadoop-framed and raw-block files alike: what was read, what was written
    assert codec == "lz4" and note == ("column 'c': read as the deprecated LZ4 codec "
                                       "(Hadoop-framed or raw blocks), which pyarrow cannot "
                                       "write; written as LZ4_RAW")
    codec, note = parquet_write._codec("LZO", "c")
    assert codec in WRITABLE_CODECS and "LZO" in note


def test_row_groups_read_ahead_within_a_byte_budget(tmp_path, monkeypatch):
    """Two row groups are read at once while two fit the budget, one when a group is
    bigger (wide tensors); the chunks read and the clean copy are the same either way."""
    from transforms.io.formats import parquet_files

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6000, 64)).astype(np.float32)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(x))],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 64)}),
                   path, row_group_size=500)
    pf = pq.ParquetFile(path)
    groups = list(parquet_files.row_groups(pf, 0, len(x)))
    spec = TensorSpec("emb", "id")
    outputs = []
    for budget, depth in ((1 << 30, 2), (pf.metadata.row_group(0).total_byte_size - 1, 1)):
        monkeypatch.setattr(parquet_files, "AHEAD_BYTES", budget)
        assert parquet_files.ahead_depth(pf, groups) == depth
        chunks = list(parquet.read(Unit(0, str(path)), spec, 500))
        np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), x)
        out = tmp_path / f"out-{depth}.parquet"
        assert parquet.write(str(path), str(out), np.arange(0, len(x), 3)) == 4000
        outputs.append(pq.read_table(out))
    assert outputs[0].equals(outputs[1])
    assert outputs[0].column("id").to_pylist() == [f"r{i}" for i in range(len(x)) if i % 3]


def _emb_table(n: int, d: int = 4, copies: int = 7) -> pa.Table:
    """n records (i % copies: exact copies), an id and a string column beside them."""
    x = (np.arange(n) % copies).astype(np.float32)[:, None] * np.ones(d, np.float32)
    return pa.table({"id": [f"r{i}" for i in range(n)],
                     "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), d),
                     "note": [f"note {i}" for i in range(n)]})


def _summary(tmp_path) -> dict:
    return json.loads((tmp_path / "out" / "report" / "summary.json").read_text())


def _accounted(summary: dict) -> bool:
    removed = sum(v for k, v in summary.items() if k.startswith("removed_"))
    return summary["read"] == summary["kept"] + removed + summary["invalid"]


def _chunk_span(path, rg: int, column: str) -> tuple[int, int]:
    """(first byte, bytes) of a row group's column chunk."""
    meta = pq.ParquetFile(path).metadata.row_group(rg)
    col = next(meta.column(j) for j in range(meta.num_columns)
               if meta.column(j).path_in_schema.split(".")[0] == column)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    return start, col.total_compressed_size


def test_page_crc_mismatch_makes_its_row_group_invalid_and_the_copy_keeps_crcs(tmp_path):
    """A page whose bytes changed after writing (its CRC says so) reads as other values:
    they were deduplicated and copied. Its row group is invalid now, with the reason, and
    the copy has page CRCs of its own (a later bit flip is found again)."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(_emb_table(300), src, row_group_size=100, compression="none",
                   use_dictionary=False, write_page_checksum=True)
    start, size = _chunk_span(src, 1, "emb")
    raw = bytearray(src.read_bytes())
    raw[start + size - 3] ^= 0x40  # a float's exponent in row group 1's last value
    src.write_bytes(bytes(raw))
    assert run_job(tmp_path, "parquet", str(src), "max_invalid_fraction=1") == 0
    summary = _summary(tmp_path)
    bad = pq.read_table(tmp_path / "out" / "report" / "invalid.parquet")
    assert summary["invalid"] == 100 and _accounted(summary)
    assert bad["record_id"].to_pylist() == [f"{src}:{i}" for i in range(100, 200)]
    assert all("row group 1" in r and "CRC" in r for r in bad["reason"].to_pylist())
    out = tmp_path / "out" / "clean" / "a.parquet"
    assert summary["kept"] == 7 and pq.read_table(out).num_rows == 7
    raw = bytearray(out.read_bytes())
    start, size = _chunk_span(out, 0, "emb")
    raw[start + size - 3] ^= 0x40
    (tmp_path / "flipped.parquet").write_bytes(bytes(raw))
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(tmp_path / "flipped.parquet", page_checksum_verification=True)


@pytest.mark.parametrize("decode", [None, "text"])
def test_a_row_group_whose_other_column_is_unreadable_is_invalid_not_a_failed_run(
        tmp_path, capsys, decode):
    """Only the tensor (id, keep) columns are read for dedup and every column for the
    copy: a group damaged in another column failed the run after all the work ("did the
    file change while the job ran?"). Its records are invalid now, the reason naming the
    column, and the other groups are deduplicated and copied."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    table = _emb_table(300, copies=150).append_column(  # group 1 holds kept records
        "text", pa.array([f"t{i % 150}" for i in range(300)]))
    pq.write_table(table, src, row_group_size=100, compression="none", use_dictionary=False)
    start, size = _chunk_span(src, 1, "note")
    raw = bytearray(src.read_bytes())
    raw[start + 8: start + size - 8] = b"\xff" * (size - 16)  # garble row group 1's notes
    src.write_bytes(bytes(raw))
    inp = {"tensor": "text", "decode": "text"} if decode else {}
    assert run_job(tmp_path, "parquet", str(src), "max_invalid_fraction=1", input=inp) == 0, \
        capsys.readouterr().err
    summary = _summary(tmp_path)
    bad = pq.read_table(tmp_path / "out" / "report" / "invalid.parquet")
    assert summary["invalid"] == 100 and _accounted(summary)
    assert bad["record_id"].to_pylist() == [f"{src}:{i}" for i in range(100, 200)]
    assert all("row group 1" in r and "column 'note'" in r for r in bad["reason"].to_pylist())
    kept = pq.read_table(tmp_path / "out" / "clean" / "a.parquet")
    assert summary["kept"] == kept.num_rows == 150  # 0-99, and 250-299 (no copy left)
    assert kept["id"].to_pylist() == [f"r{i}" for i in [*range(100), *range(250, 300)]]


def test_a_damaged_column_larger_than_the_read_fails_the_copy_naming_it(tmp_path, capsys):
    """The read pass checks other columns only up to the bytes it reads itself (images
    beside embeddings cost 15 times the read): a damaged column larger than that is found
    by the copy, which fails the run in one line naming the row group and the error;
    nothing is published."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    blobs = [np.random.default_rng(i % 150).bytes(600) for i in range(300)]
    pq.write_table(_emb_table(300, copies=150).append_column("blob", pa.array(blobs)), src,
                   row_group_size=100, compression="none", use_dictionary=False,
                   write_page_checksum=True)
    start, size = _chunk_span(src, 1, "blob")
    raw = bytearray(src.read_bytes())
    raw[start + size - 3] ^= 0x40  # CRC: the page no longer reads
    src.write_bytes(bytes(raw))
    assert run_job(tmp_path, "parquet", str(src)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing was published" in err[0], err
    assert "row group 1" in err[0] and "CRC" in err[0], err[0]
    assert not (tmp_path / "out" / "report").exists()


def test_footer_row_count_that_disagrees_with_its_row_groups(tmp_path):
    """A footer whose num_rows is not its row groups' (parquet-testing's
    repeated_no_annotation.parquet says 0 for 6): records are read and copied by the
    row groups, and the file's notes say so (the copy stopped at the footer's count and
    the run failed, "did the file change while the job ran?")."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(_emb_table(300), src, row_group_size=100)
    raw = src.read_bytes()
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    said = b"\x16\xd8\x04\x19"  # FileMetaData.num_rows: zigzag varint of 300, then row_groups
    assert raw.count(said, footer) == 1
    at = raw.index(said, footer)
    src.write_bytes(raw[:at] + b"\x16\xc8\x01\x19" + raw[at + 4:])  # says 100
    assert pq.ParquetFile(src).metadata.num_rows == 100
    assert run_job(tmp_path, "parquet", str(src)) == 0
    summary = _summary(tmp_path)
    (entry,) = summary["files"]
    assert (summary["read"], summary["kept"], summary["removed_exact"]) == (300, 7, 293)
    assert entry["notes"] == ["the footer says 100 rows, its row groups hold 300: read and "
                              "copied by its row groups (the copy's footer says what it holds)"]
    assert pq.ParquetFile(tmp_path / "out" / "clean" / "a.parquet").metadata.num_rows == 7


def test_copy_keeps_list_child_names(tmp_path):
    """``list<item: ...>`` (pyarrow before 13, many Spark/Hive writers) and legacy names
    came back as ``list<element: ...>``: the same values, but another schema, so tables
    of cleaned and uncleaned shards could not be concatenated."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    emb = pa.array([[float(i % 3)] * 4 for i in range(30)], pa.list_(pa.float32()))
    legacy = pa.list_(pa.field("array", pa.int32()))
    table = pa.table({"id": [f"r{i}" for i in range(30)], "emb": emb,
                      "tags": pa.array([[i, i + 1] for i in range(30)], legacy)})
    pq.write_table(table, src, use_compliant_nested_type=False, store_schema=False)
    assert str(pq.ParquetFile(src).schema_arrow.field("emb").type) == "list<item: float>"
    assert run_job(tmp_path, "parquet", str(src)) == 0
    out = pq.read_table(tmp_path / "out" / "clean" / "a.parquet")
    assert out.num_rows == 3
    assert str(out.schema) == str(pq.read_table(src).schema)
    assert pa.concat_tables([pq.read_table(src), out]).num_rows == 33
    # a standard file (``element``) keeps Parquet's standard names too
    std = tmp_path / "std.parquet"
    pq.write_table(table, std)
    copy = tmp_path / "std-out.parquet"
    assert parquet.write(str(std), str(copy), np.arange(3, 30)) == 3
    names = [c.path for c in pq.ParquetFile(copy).schema]
    assert names == [c.path for c in pq.ParquetFile(std).schema]
    assert str(pq.ParquetFile(copy).schema_arrow) == str(pq.ParquetFile(std).schema_arrow)


def _odd_columns(path) -> None:
    """A file with a column of each kind a tensor column cannot be, two of one name, and
    more columns than a refusal lists."""
    one = {"Embedding": pa.array([[1.0] * 4], pa.list_(pa.float32(), 4)),
           "strs": pa.array([["a", "b"]], pa.list_(pa.string())),
           "deep": pa.array([[[["a"]]]], pa.list_(pa.list_(pa.list_(pa.string())))),
           "pics": pa.array([[{"bytes": b"\x89PNG", "path": "a.png"}]], pa.list_(pa.struct(
               [("bytes", pa.binary()), ("path", pa.string())]))),  # images: not a text
           "nums": pa.array([{"b": [1.0, 2.0]}], pa.struct([("b", pa.list_(pa.float32()))])),
           "lv": pa.array([[1.0, 2.0]], pa.list_view(pa.float32())),
           "score": pa.array([1.0]), "name": pa.array(["x"]), "dup": pa.array([1]),
           **{f"c{i}": pa.array([i]) for i in range(20)}}
    arrays = [*one.values(), pa.array([2])]
    pq.write_table(pa.Table.from_arrays(arrays, names=[*one, "dup"]), path)


@pytest.mark.parametrize("spec,words", [
    (TensorSpec("embedding"), "input.tensor: no column 'embedding' (did you mean 'Embedding'?)"),
    (TensorSpec("Embedding", id="nme"), "input.id: no column 'nme' (did you mean 'name'?)"),
    (TensorSpec("Embedding", rank="scor"), "keep: no column 'scor' (did you mean 'score'?)"),
    (TensorSpec("nope"), "c0, c1, c2, ... (30 in all)"),
    (TensorSpec("dup"), "input.tensor: the file has 2 columns named 'dup', so the name is "
                        "ambiguous"),
    (TensorSpec("Embedding", id="Embedding"), "input.id: column 'Embedding' holds "
                                              "fixed_size_list<element: float>[4], which "
                                              "cannot be an id"),
    (TensorSpec("strs"), "column 'strs' holds string, not numbers: to read its texts set "
                         "input.decode: text"),  # a list of texts: one text per record
    (TensorSpec("deep"), "column 'deep' holds string, not numbers: to read its texts set "
                         "input.decode: text"),  # lists of lists of texts: one text too
    (TensorSpec("nums"), "so no input.decode reads it"),
    (TensorSpec("pics"), "so no input.decode reads it"),
    (TensorSpec("lv"), "holds list_view<element: float>, a list view, which is not read"),
    (TensorSpec("nums.b"), "input.tensor: 'nums.b' is a field inside the struct column "
                           "'nums' (its fields: b), and only top-level columns are read: "
                           "write the field as a column of its own (pyarrow's "
                           "Table.flatten() names it 'nums.b') and run again"),
])
def test_check_names_the_column_problem_and_the_fix(tmp_path, spec, words):
    """Typos get the nearest column (case first), the column list is capped, two columns
    of one name are ambiguous, an id column must cast to strings, and a column no decode
    reads says so with either decode (decode none advised text and text advised none)."""
    from transforms.io.formats import encoded_parquet
    from transforms.io.formats.base import Decode

    path = tmp_path / "a.parquet"
    _odd_columns(path)
    with pytest.raises(InputError) as e:
        parquet.check(str(path), spec)
    assert words in str(e.value) and "\n" not in str(e.value)
    if spec.tensor in ("nums", "lv", "pics") or spec.id == "Embedding":
        with pytest.raises(InputError) as e:
            encoded_parquet.check(str(path), replace(spec, decode=Decode("text")))
        assert words in str(e.value) and "\n" not in str(e.value)


def test_an_id_column_that_cannot_be_an_id_is_refused_before_any_work(tmp_path, capsys):
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    pq.write_table(_emb_table(30), src)
    assert run_job(tmp_path, "parquet", str(src), input={"id": "emb"}) == 2
    err = capsys.readouterr().err
    assert "input.id: column 'emb' holds fixed_size_list<element: float>[4], which cannot be " \
           "an id" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
