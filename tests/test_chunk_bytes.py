"""Chunks are cut by bytes as well as rows (tuning.chunk_bytes): wide tensors written by
pyarrow, h5py and TensorFlow come back in chunks within the byte budget, every record
once and in order, and the job's removals stay those of the brute-force oracles."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import ConfigError, parse_config
from tests import imagekit, shapes
from tests.jobkit import EXT, read_output, report, run_job, write_input
from tests.test_job_near import by_kind, expected
from transforms.io.formats import get_format
from transforms.io.formats.base import Chunking, Decode, TensorSpec, Unit, record_nbytes
from transforms.near.spec import NearSpec

SHAPE = (16, 16, 3)


def read_all(fmt: str, path, spec: TensorSpec, chunking: Chunking):
    f = get_format(fmt)
    spec = f.check(str(path), spec)
    units = f.plan(str(path), 0, chunking.unit_rows_for(record_nbytes(spec)), spec)
    chunks = [c for u in units for c in f.read(u, spec, chunking.chunk_rows,
                                               chunking.chunk_bytes)]
    return units, chunks


@pytest.mark.parametrize("fmt,dtype", [("parquet", "uint8"), ("parquet", "float32"),
                                       ("hdf5", "uint8"), ("tfrecord", "float32")])
def test_wide_records_come_in_chunks_within_the_budget(tmp_path, fmt, dtype):
    x, _ = shapes.images(300, SHAPE, dtype, seed=4)
    path = tmp_path / f"x.{EXT[fmt]}"
    write_input(fmt, path, [f"r{i}" for i in range(len(x))], x, np.zeros(len(x), np.int64),
                row_group_size=300)  # Parquet: one row group of every record
    budget = 10 * x[0].nbytes + 7  # 10 records
    inp = TensorSpec("emb", id="id", shape=SHAPE if fmt == "tfrecord" else None)
    units, chunks = read_all(fmt, path, inp, Chunking(4 << 16, 1 << 16, budget))
    assert all(c.tensors.nbytes <= budget for c in chunks)
    assert max(len(c.positions) for c in chunks) == 10
    assert np.array_equal(np.concatenate([c.positions for c in chunks]), np.arange(300))
    assert np.array_equal(np.concatenate([c.tensors for c in chunks]), x)
    if fmt == "hdf5":  # units: 4 chunks' worth of rows (40), rounded to h5 chunks of 16
        assert [u.start for u in units] == list(range(0, 300, 32))


def test_parquet_variable_size_lists_are_cut_by_their_stored_size(tmp_path):
    x, _ = shapes.images(200, SHAPE, "float32", seed=5)
    path = tmp_path / "x.parquet"
    shapes.write_parquet(path, x, row_group_rows=200, list_type="list")
    budget = 20 * x[0].nbytes
    _, chunks = read_all("parquet", path, TensorSpec("emb", id="id"), Chunking(chunk_bytes=budget))
    assert all(c.tensors.nbytes <= budget for c in chunks) and len(chunks) >= 10
    assert np.array_equal(np.concatenate([c.tensors for c in chunks]), x)


def test_chunking_rows_and_units():
    c = Chunking()
    assert c.chunk_bytes == 64 << 20 and c.unit_rows_for(None) == c.unit_rows
    assert c.unit_rows_for(512) == c.unit_rows  # 128 float32 values: rows decide
    assert c.unit_rows_for(16_384 * 4) == 4 * 1024  # 128x128 float32: 1,024 per chunk
    assert c.unit_rows_for(1 << 30) == 4  # one record per chunk at least
    with pytest.raises(ValueError, match="chunk_bytes"):
        Chunking(chunk_bytes=0)


def test_chunk_bytes_config_key(tmp_path):
    cfg = {"input": {"format": "parquet", "path": "x", "tensor": "e"},
           "output": {"path": "o"}, "report": "r"}
    assert parse_config(cfg).tuning.chunk_bytes == 64 << 20
    with pytest.raises(ConfigError, match="tuning.chunk_bytes"):
        parse_config(cfg, ["tuning.chunk_bytes=0"])


@pytest.mark.parametrize("fmt", ["parquet", "hdf5", "tfrecord"])
def test_job_with_small_chunks_matches_oracle(tmp_path, fmt):
    x, _ = shapes.images(160, SHAPE, "float32", seed=6)
    rng = np.random.default_rng(6)
    x = np.concatenate([x, x[rng.choice(160, 20)]])[rng.permutation(180)]  # + exact copies
    parts = [([f"f{f}-{i}" for i in range(len(c))], x[c])
             for f, c in enumerate(np.array_split(np.arange(len(x)), 2))]
    for f, (ids, t) in enumerate(parts):
        write_input(fmt, tmp_path / "in" / f"part-{f}.{EXT[fmt]}", ids, t, np.arange(len(ids)))
    spec = NearSpec("l2", threshold=shapes.image_tolerance(SHAPE, "float32"))
    inp = {"shape": list(SHAPE), "dtype": "float32"} if fmt == "tfrecord" else {}
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{EXT[fmt]}"),
                   f"tuning.chunk_bytes={3 * x[0].nbytes}", input=inp,
                   near={"metric": "l2", "threshold": spec.threshold}) == 0
    want_exact, want_near = expected(parts, spec)
    dups, invalid = report(tmp_path)
    assert len(want_exact) == 20 and len(want_near) >= 8 and invalid.num_rows == 0
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    gone = set(want_exact) | set(want_near)
    for f, (ids, t) in enumerate(parts):
        got_ids, got, _ = read_output(fmt, tmp_path / "out" / "clean" / f"part-{f}.{EXT[fmt]}",
                                      SHAPE)
        keep = [k for k, i in enumerate(ids) if i not in gone]
        assert got_ids == [ids[k] for k in keep] and np.array_equal(got, t[keep])


def _garble(path, rg: int, column: str) -> None:
    """Overwrite row group ``rg``'s pages of ``column`` (its header bytes kept)."""
    meta = pq.ParquetFile(path).metadata.row_group(rg)
    col = next(meta.column(j) for j in range(meta.num_columns)
               if meta.column(j).path_in_schema.split(".")[0] == column)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start + 8: start + col.total_compressed_size - 8] = b"\x07" * (
        col.total_compressed_size - 16)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("kind", ["vectors", "texts", "images"])
def test_small_row_groups_are_joined_into_chunks(tmp_path, kind):
    """Hugging Face ``datasets`` wrote 1,000 rows per row group (100 for images): read as
    one chunk per group, a job paid per-chunk costs 10-100x over. Consecutive groups are
    joined up to the chunk's rows and bytes; an unreadable group between them stays its
    records' reason, and every record comes once, in order, with its value."""
    n, group, rows = 2_500, 100, 1_024
    rng = np.random.default_rng(3)
    if kind == "vectors":
        x = rng.standard_normal((n, 16)).astype(np.float32)
        col, spec = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 16), TensorSpec("v")
    elif kind == "texts":
        x = [" ".join(rng.choice(["a", "bb", "ccc", "dd"], int(k))) for k in
             rng.integers(1, 40, n)]
        col, spec = pa.array(x), TensorSpec("v", decode=Decode("text"))
    else:
        tiles = imagekit.crops(50, 8, 8)
        x = [tiles[i % 50] for i in range(n)]
        col = pa.array([{"bytes": imagekit.encode(t), "path": None} for t in x])
        spec = TensorSpec("v", decode=Decode("image"))
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"v": col}), path, row_group_size=group)
    _garble(path, 13, "v")  # rows 1,300-1,399
    f = get_format("parquet", spec)
    spec = f.check(str(path), spec)
    chunks = [c for u in f.plan(str(path), 0, n, spec) for c in f.read(u, spec, rows)]
    sizes = [len(c.positions) for c in chunks]
    assert sizes == [1_000, 300, 0, 1_000, 100]  # 10 groups, 3 before the bad one, it, 10...
    assert [r.position for c in chunks for r in c.invalid] == list(range(1_300, 1_400))
    got = np.concatenate([c.positions for c in chunks])
    np.testing.assert_array_equal(got, np.r_[0:1_300, 1_400:n])
    values = [v for c in chunks for v in c.tensors]
    for p, v in zip(got.tolist(), values, strict=True):
        assert np.array_equal(v, x[p]) if kind != "texts" else v == x[p]
    if kind == "texts":  # and the bytes cap: about 2.5 groups' text per chunk at most
        budget = 12_000
        chunks = list(f.read(Unit(0, str(path)), spec, rows, budget))
        assert all(sum(len(t.encode()) for t in c.tensors) <= budget for c in chunks)
        assert max(len(c.positions) for c in chunks) > group  # groups still joined
        assert sum(len(c.positions) for c in chunks) == n - group


def test_a_job_gives_the_same_removals_whatever_its_row_groups(tmp_path):
    """The same records as one row group and in Hugging Face's former 100-row groups (joined
    into chunks): the same removals, the clean copies keep each input's groups."""
    x, _ = shapes.images(300, (8, 8, 1), "float32", seed=8)
    rng = np.random.default_rng(8)
    x = np.concatenate([x, x[rng.choice(300, 40)] + 1e-4])[rng.permutation(340)]
    x = np.repeat(x, 8, axis=0)[:2_600]  # + exact copies
    ids = [f"r{i}" for i in range(len(x))]
    got = []
    for group in (2_600, 100):
        where = tmp_path / f"g{group}"
        write_input("parquet", where / "in" / "a.parquet", ids, x, np.zeros(len(x)),
                    row_group_size=group)
        assert run_job(where, "parquet", str(where / "in" / "*.parquet"),
                       near={"metric": "l2", "threshold": 0.01}) == 0
        dups, _ = report(where)
        assert dups.num_rows > 2_000
        got.append(dups.select(["record_id", "duplicate_of", "kind"]).sort_by("record_id"))
        kept = len(x) - dups.num_rows
        assert pq.ParquetFile(where / "out" / "clean" / "a.parquet").metadata.num_row_groups == (
            1 if group == len(x) else len(x) // group)  # each group shrinks by its removals
        assert pq.read_table(where / "out" / "clean" / "a.parquet").num_rows == kept
    assert got[0].equals(got[1])


def test_an_index_of_image_paths_is_planned_in_units_of_about_2048_images(tmp_path):
    """A Parquet index of image files (HF ``Image()`` rows holding only a path, as the
    job tells a user with a folder of images to write) is ~100 bytes a row: planned by
    its stored bytes, 10,000 photos were one unit, decoded by one worker. Each path-only
    row now counts as an image's share of a unit; rows holding their bytes as before."""
    from transforms.io.formats import parquet

    photo = imagekit.encode(imagekit.crops(1, 64, 64, seed=2)[0], "JPEG", quality=90)
    (tmp_path / "p.jpg").write_bytes(photo)
    n = 10_000
    rows = {"paths": [{"bytes": None, "path": str(tmp_path / "p.jpg")}] * n,
            "bytes": [{"bytes": photo, "path": None}] * n}
    spec = TensorSpec("image", decode=Decode("image", resize=(32, 32), channels=3))
    target = Chunking().unit_rows_for(32 * 32 * 3)
    for kind, values in rows.items():
        path = tmp_path / f"{kind}.parquet"
        pq.write_table(pa.table({"image": pa.array(values, imagekit.HF_IMAGE)}), path,
                       row_group_size=500)
        units = parquet.plan(str(path), 0, target, spec)
        sizes = [u.stop - u.start for u in units]
        assert sum(sizes) == n and sizes[0] == (2_500 if kind == "paths" else n), (kind, sizes)
        chunks = list(get_format("parquet", spec).read(units[-1], spec, 65_536))
        assert sum(len(c.positions) for c in chunks) == sizes[-1]  # each image read whole
        assert all(c.tensors.shape[1:] == (32, 32, 3) and not c.invalid for c in chunks)
