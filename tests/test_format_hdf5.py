"""transforms.io.formats.hdf5 against real h5py files and numpy oracles."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from transforms.io.formats import hdf5
from transforms.io.formats.base import InputError, TensorSpec, Unit

N = 1000
CHUNK = 100
SPEC = TensorSpec("feat/emb", id="ids", rank="score")


def oracle(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "feat/emb": rng.standard_normal((n, 4, 8), dtype=np.float32),
        "ids": np.array([f"rec-{i}-é" for i in range(n)], dtype=object),
        "int_ids": np.arange(n, dtype=np.int64) * 7 + 1,
        "score": rng.random(n),
        "labels": (np.arange(n) % 10).astype(np.int16),
    }


def make_file(path: Path, n: int = N) -> dict[str, np.ndarray]:
    """The tensor (chunked, gzip + shuffle) in a group, ids, ranks, labels and unrelated data."""
    data = oracle(n)
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "demo"
        f.attrs["version"] = np.int32(3)
        g = f.create_group("feat")
        g.attrs["note"] = "group attr"
        emb = g.create_dataset("emb", data=data["feat/emb"], chunks=(CHUNK, 4, 8),
                               compression="gzip", compression_opts=6, shuffle=True,
                               maxshape=(None, 4, 8))
        emb.attrs["units"] = np.bytes_(b"m")
        f.create_dataset("ids", data=data["ids"], dtype=h5py.string_dtype())
        f.create_dataset("int_ids", data=data["int_ids"], chunks=(50,), compression="gzip")
        f.create_dataset("score", data=data["score"])
        labels = f.create_dataset("labels", data=data["labels"], chunks=(64,), fletcher32=True,
                                  compression="lzf")
        labels.attrs["classes"] = np.arange(10)
        f.create_dataset("meta/classes", data=np.array([1.0, 2.0, 3.0]))
        f["alias"] = h5py.SoftLink("/feat/emb")
        f["hard"] = emb  # a second hard link to the tensor
    return data


@pytest.fixture
def h5file(tmp_path: Path) -> tuple[str, dict[str, np.ndarray]]:
    path = tmp_path / "data.h5"
    return str(path), make_file(path)


def read_all(path: str, spec: TensorSpec, target_rows: int = 250, batch_rows: int = 64):
    return [c for u in hdf5.plan(path, 0, target_rows) for c in hdf5.read(u, spec, batch_rows)]


def corrupt_chunk(path: str, dataset: str, first_row: int) -> None:
    """Overwrite bytes in the middle of the (compressed) chunk that starts at ``first_row``."""
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        infos = [ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())]
    info = next(i for i in infos if i.chunk_offset[0] == first_row)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xff" * max(1, info.size // 4))  # stays inside this chunk


def garbage_files(tmp_path: Path) -> list[str]:
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an HDF5 file\n" * 100)
    truncated = tmp_path / "truncated.h5"
    make_file(truncated)
    truncated.write_bytes(truncated.read_bytes()[:5000])
    return [str(junk), str(truncated)]


# check

def test_check_resolves_shape_and_dtype(h5file):
    path, _ = h5file
    spec = hdf5.check(path, SPEC)
    assert (spec.shape, spec.dtype) == ((4, 8), "float32")
    assert hdf5.check(path, spec) == spec
    assert hdf5.check(path, TensorSpec("feat/emb", id="int_ids")).id == "int_ids"


@pytest.mark.parametrize("spec, words", [
    (TensorSpec("emb"), ["input.tensor", "'emb'", "feat/emb", "labels", "meta/classes",
                         "did you mean 'feat/emb'?"]),
    (TensorSpec("feat/emd"), ["no dataset 'feat/emd'", "did you mean 'feat/emb'?"]),
    (TensorSpec("Labels"), ["did you mean 'labels'?"]),
    (TensorSpec("zzz"), ["labels", "meta/classes", "set input.tensor to one of them"]),
    (TensorSpec("feat"), ["input.tensor", "group", "not a dataset"]),
    (TensorSpec("ids"), ["input.tensor", "holds text values", "set input.decode: text"]),
    (TensorSpec("feat/emb", shape=(4, 9)), ["input.shape", "[4, 8]", "[4, 9]"]),
    (TensorSpec("feat/emb", dtype="float64"), ["input.dtype", "float32", "float64"]),
    (TensorSpec("feat/emb", id="meta/classes"), ["input.id", "(3,)", f"({N},)"]),
    (TensorSpec("feat/emb", id="nope"), ["input.id", "'nope'"]),
    (TensorSpec("feat/emb", id="score"), ["input.id", "float64", "strings or integers"]),
    (TensorSpec("feat/emb", rank="feat/emb"), ["keep", "(1000, 4, 8)"]),
])
def test_check_errors_name_file_key_and_fix(h5file, spec, words):
    path, _ = h5file
    with pytest.raises(InputError) as e:
        hdf5.check(path, spec)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(path)
    for w in words:
        assert w in msg


def test_check_names_what_reads_texts_and_token_sequences(tmp_path):
    """A string dataset names decode: text (an AttributeError under jaccard, before); one
    of integer sequences of no fixed length is read as sequences (ragged: jaccard, or
    exact dedup alone) and refused with its reason by distances."""
    path = str(tmp_path / "t.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("text", data=["a b c", "d e"], dtype=h5py.string_dtype())
        seqs = f.create_dataset("seqs", (2,), dtype=h5py.vlen_dtype(np.int32))
        seqs[0], seqs[1] = np.arange(3), np.arange(5)
        blobs = f.create_dataset("blobs", (2,), dtype=h5py.vlen_dtype(np.uint8))
        blobs[0], blobs[1] = np.frombuffer(b"\x89PNG", np.uint8), np.zeros(7, np.uint8)
    for spec, words in [(TensorSpec("text"), "to read them set input.decode: text"),
                        (TensorSpec("blobs"), "holds binary values (object), not numbers: "
                                              "to read them set input.decode: text, bytes"),
                        (TensorSpec("text", ragged=True), "input.decode: text (jaccard"),
                        (TensorSpec("seqs"), "sequences of int32 of no fixed length: "
                                             "near.metric: jaccard compares them")]:
        with pytest.raises(InputError, match=re.escape(words)):
            hdf5.check(path, spec)
    got = hdf5.check(path, TensorSpec("seqs", ragged=True))
    assert (got.shape, got.dtype) == (None, "int32")


def test_check_caps_long_dataset_lists(tmp_path):
    path = str(tmp_path / "wide.h5")
    with h5py.File(path, "w") as f:
        for i in range(40):
            f[f"col{i:02d}"] = np.zeros((3, 2), np.float32)
    with pytest.raises(InputError, match=r"col00, col01, .*col11, \.\.\. \(40 in all\)\): "
                                         r"set input.tensor to one of them") as e:
        hdf5.check(path, TensorSpec("zzz"))
    assert "col12" not in str(e.value)


def test_text_decode_first_value_not_utf8_is_one_invalid_record(tmp_path):
    """decode text over a dataset where 1 value in 50 is not UTF-8, the first among them:
    that record is invalid, as the others at 50, 100; a dataset of binary values is
    refused with the fix."""
    from transforms.io.formats import get_format
    from transforms.io.formats.base import Decode

    path = str(tmp_path / "t.h5")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("txt", (150,), dtype=h5py.string_dtype("ascii"))
        for i in range(150):
            d[i] = b"\xff\xfe" + str(i).encode() if i % 50 == 0 else f"x{i % 7}".encode()
        f.create_dataset("raw", data=np.array([b"\xff\xfe%d" % i for i in range(30)],
                                              dtype=h5py.string_dtype("ascii")))
    spec = TensorSpec("txt", decode=Decode("text"))
    fmt = get_format("hdf5", spec)
    spec = fmt.check(path, spec)
    chunks = list(fmt.read(Unit(0, path), spec, 1000))
    invalid = [r for c in chunks for r in c.invalid]
    assert [r.position for r in invalid] == [0, 50, 100]
    assert all("not UTF-8 text" in r.reason for r in invalid)
    assert sum(len(c.positions) for c in chunks) == 147
    raw = TensorSpec("raw", decode=Decode("text"))
    with pytest.raises(InputError, match=r"input.decode: dataset 'raw' in the first record is "
                                         r"not UTF-8 text .*so are 19 of the next 19: use "
                                         r"input.decode: bytes"):
        get_format("hdf5", raw).check(path, raw)


def test_check_scalar_tensor(tmp_path):
    path = str(tmp_path / "s.h5")
    with h5py.File(path, "w") as f:
        f["x"] = 1.0
    with pytest.raises(InputError, match="input.tensor.*no axes"):
        hdf5.check(path, TensorSpec("x"))


# plan

def test_plan_aligns_units_to_chunks_and_covers_every_row(h5file):
    path, _ = h5file
    for target in (1, 99, 250, 420, 5000):
        units = hdf5.plan(path, 7, target)
        assert all(u.file_index == 7 and u.start % CHUNK == 0 for u in units)
        assert units[-1].stop is None
        stops = [u.stop if u.stop is not None else N for u in units]
        covered = np.concatenate([np.arange(u.start, s) for u, s in zip(units, stops,
                                                                         strict=True)])
        np.testing.assert_array_equal(covered, np.arange(N))
    assert [(u.start, u.stop) for u in hdf5.plan(path, 0, 250)] == [
        (0, 200), (200, 400), (400, 600), (600, 800), (800, None)]


@pytest.mark.parametrize("kind", ["text", "tokens"])
def test_units_of_texts_and_token_ids_are_cut_by_bytes_too(tmp_path, corpus, tokens,
                                                          monkeypatch, kind):
    """A variable-length dataset (texts, token ids) makes units of at most about
    UNIT_BYTES of values, judged from a sample of them (the dataset stores references):
    one large file of texts was one unit of 262,144 rows, read, shingled and hashed by
    one worker. Units cover every row once, in order, and read back every value."""
    from transforms.io.formats import get_format
    from transforms.io.formats.base import Decode

    monkeypatch.setattr(hdf5, "UNIT_BYTES", 1 << 20)
    path = str(tmp_path / "t.h5")
    if kind == "text":  # real texts, 8 MB or more, all distinct
        values = [f"{t} {i}" for i, t in enumerate(
            corpus * (8 * (1 << 20) // sum(map(len, corpus)) + 1))]
        nbytes = [len(v.encode()) for v in values]
        dtype, spec = h5py.string_dtype(), TensorSpec("v", decode=Decode("text"))
    else:  # the corpus's token ids as int32, 8 MB or more
        values = [t.astype(np.int32) for t in tokens * (2 * (1 << 20) // sum(map(len, tokens)) + 1)]
        nbytes = [v.nbytes for v in values]
        dtype, spec = h5py.vlen_dtype(np.int32), TensorSpec("v", ragged=True)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("v", (len(values),), dtype=dtype, chunks=(50,))
        d[:] = values if kind == "tokens" else np.array(values, dtype=object)
    units = hdf5.plan(path, 0, 1 << 18, spec)
    assert units[0].start == 0 and units[-1].stop == len(values)
    assert all(a.stop == b.start and a.start % 50 == 0 for a, b in zip(units, units[1:],
                                                                      strict=False))
    held = [sum(nbytes[u.start:u.stop]) for u in units]
    assert sum(nbytes) >= 8 << 20 and max(held) < 1.5 * (1 << 20), held
    fmt = get_format("hdf5", spec)
    spec = fmt.check(path, spec)
    got = [v for u in units for c in fmt.read(u, spec, 1000) for v in c.tensors]
    if kind == "text":
        assert got == values
    else:
        assert len(got) == len(values) and all(
            np.array_equal(a, b) for a, b in zip(got, values, strict=True))
    assert len(hdf5.plan(path, 0, 1 << 18, TensorSpec("v", shape=(), dtype="int32"))) == 1


def test_plan_contiguous_file(tmp_path):
    path = str(tmp_path / "c.h5")
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((10, 3))
    assert [(u.start, u.stop) for u in hdf5.plan(path, 0, 4)] == [(0, 4), (4, 8), (8, None)]


# read

def test_read_in_batches_equals_oracle(h5file):
    path, data = h5file
    chunks = read_all(path, SPEC)
    assert all(0 < len(c.positions) <= 64 and not c.invalid for c in chunks)
    positions = np.concatenate([c.positions for c in chunks])
    assert positions.dtype == np.int64
    np.testing.assert_array_equal(positions, np.arange(N))
    tensors = np.concatenate([c.tensors for c in chunks])
    assert tensors.dtype == np.float32
    np.testing.assert_array_equal(tensors, data["feat/emb"])
    ids = np.concatenate([c.ids for c in chunks])
    assert ids.dtype == object and list(ids) == list(data["ids"])
    np.testing.assert_array_equal(np.concatenate([c.rank for c in chunks]), data["score"])


def test_read_int_and_default_ids(h5file):
    path, data = h5file
    ids = np.concatenate([c.ids for c in read_all(path, TensorSpec("feat/emb", id="int_ids"))])
    assert list(ids) == [str(i) for i in data["int_ids"]]
    chunks = list(hdf5.read(Unit(0, path, 200, 300), TensorSpec("feat/emb"), 1000))
    assert len(chunks) == 1 and chunks[0].rank is None
    assert list(chunks[0].ids) == [f"{path}:{p}" for p in range(200, 300)]


def test_unreadable_files(tmp_path):
    for path in garbage_files(tmp_path):
        assert hdf5.check(path, SPEC) == SPEC
        assert hdf5.plan(path, 3, 100) == [Unit(3, path, 0, None)]
        chunks = list(hdf5.read(Unit(3, path), SPEC, 64))
        assert len(chunks) == 1 and chunks[0].n_read == 0 and not len(chunks[0].positions)
        bad = chunks[0].invalid[0]  # the file, with its reason: no record counted
        assert (bad.position, bad.record_id, bad.whole_file) == (0, path, True)
        assert "unreadable HDF5 file" in bad.reason and "\n" not in bad.reason
        dst = tmp_path / "out" / Path(path).name
        assert hdf5.write(path, str(dst), np.array([0])) == 0
        assert not dst.exists()


def test_corrupt_chunks_invalidate_only_their_rows(h5file):
    path, data = h5file
    corrupt_chunk(path, "feat/emb", 300)
    corrupt_chunk(path, "int_ids", 500)
    spec = TensorSpec("feat/emb", id="int_ids", rank="score")
    chunks = read_all(path, spec)
    invalid = [r for c in chunks for r in c.invalid]
    bad = np.r_[300:400, 500:550]
    assert [r.position for r in invalid] == bad.tolist()
    assert sum(c.n_read for c in chunks) == N
    by_pos = {r.position: r for r in invalid}
    assert by_pos[300].record_id == str(data["int_ids"][300])  # its id chunk is fine
    assert "/feat/emb[300:" in by_pos[300].reason and "OSError" in by_pos[300].reason
    assert by_pos[520].record_id == f"{path}:520" and "/int_ids[500:550]" in by_pos[520].reason
    ok = np.setdiff1d(np.arange(N), bad)
    np.testing.assert_array_equal(np.concatenate([c.positions for c in chunks]), ok)
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]),
                                  data["feat/emb"][ok])
    np.testing.assert_array_equal(np.concatenate([c.rank for c in chunks]), data["score"][ok])


# write

def test_write_drops_rows_in_every_record_dataset(h5file, tmp_path):
    path, data = h5file
    drop = np.unique(np.r_[0:N:3, 450:620, N - 1]).astype(np.int64)
    keep = np.setdiff1d(np.arange(N), drop)
    dst = tmp_path / "out" / "sub" / "clean.h5"
    assert hdf5.write(path, str(dst), drop) == len(keep)
    with h5py.File(path, "r") as f, h5py.File(dst, "r") as g:
        for name in ("feat/emb", "int_ids", "score", "labels"):
            np.testing.assert_array_equal(g[name][:], data[name][keep])
            assert g[name].dtype == f[name].dtype
        assert [s.decode() for s in g["ids"][:]] == list(data["ids"][keep])
        assert h5py.check_string_dtype(g["ids"].dtype).encoding == "utf-8"
        emb, src = g["feat/emb"], f["feat/emb"]
        assert (emb.chunks, emb.compression, emb.compression_opts, emb.shuffle) == (
            (CHUNK, 4, 8), "gzip", 6, True)
        assert emb.maxshape == (None, 4, 8)
        assert (g["labels"].compression, g["labels"].fletcher32) == ("lzf", True)
        assert g["labels"].maxshape == (len(keep),)
        for a, b in ((g, f), (g["feat"], f["feat"]), (emb, src), (g["labels"], f["labels"])):
            assert dict(a.attrs).keys() == dict(b.attrs).keys()
            for k in b.attrs:
                np.testing.assert_array_equal(a.attrs[k], b.attrs[k])
                assert a.attrs.get_id(k).dtype == b.attrs.get_id(k).dtype
        np.testing.assert_array_equal(g["meta/classes"][:], [1.0, 2.0, 3.0])
        assert g.get("alias", getlink=True).path == "/feat/emb"
        assert g["hard"] == emb  # still one object, not a second copy
    # What the job does next: the clean copy reads back as the kept records, in order.
    chunks = read_all(str(dst), SPEC)
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]),
                                  data["feat/emb"][keep])


def test_write_clips_chunks_of_fixed_datasets(h5file, tmp_path):
    path, data = h5file
    keep = np.array([5, 77, 901])
    dst = tmp_path / "few.h5"
    assert hdf5.write(path, str(dst), np.setdiff1d(np.arange(N), keep)) == 3
    with h5py.File(dst, "r") as g:
        assert g["labels"].chunks == (3,) and g["labels"].maxshape == (3,)
        assert g["feat/emb"].chunks == (CHUNK, 4, 8)  # unlimited axis: chunk kept
        np.testing.assert_array_equal(g["labels"][:], data["labels"][keep])
    assert hdf5.write(path, str(dst), np.arange(N)) == 0
    with h5py.File(dst, "r") as g:
        assert g["feat/emb"].shape == (0, 4, 8) and g["labels"].shape == (0,)


def test_write_stamps_no_time_so_reruns_write_the_same_bytes(h5file, tmp_path):
    """HDF5 stamps a creation time on each new object unless told not to: a rerun, or
    the same job on another runner, then wrote other bytes (found by fuzz_job --runner)."""
    path, _ = h5file
    drop = np.arange(0, N, 5)
    dst = tmp_path / "clean.h5"
    hdf5.write(path, str(dst), drop)
    with h5py.File(dst, "r") as g:
        stamped = []
        g.visititems(lambda name, obj: stamped.append(name) if h5py.h5o.get_info(
            obj.id).ctime else None)
    assert stamped == []
    again = tmp_path / "again.h5"
    hdf5.write(path, str(again), drop)
    assert again.read_bytes() == dst.read_bytes()


def test_write_skips_unreadable_rows(h5file, tmp_path):
    path, data = h5file
    corrupt_chunk(path, "feat/emb", 300)
    corrupt_chunk(path, "labels", 640)  # a dataset read() does not read
    invalid = [r.position for c in read_all(path, SPEC) for r in c.invalid]
    assert invalid == list(range(300, 400))
    drop = np.r_[0:50, 300:400].astype(np.int64)
    dst = tmp_path / "clean.h5"
    keep = np.setdiff1d(np.arange(N), np.r_[drop, 640:704])
    assert hdf5.write(path, str(dst), drop) == len(keep)  # honest: 640..703 are lost too
    with h5py.File(dst, "r") as g:
        np.testing.assert_array_equal(g["feat/emb"][:], data["feat/emb"][keep])
        np.testing.assert_array_equal(g["labels"][:], data["labels"][keep])
        assert len(g["ids"]) == len(keep)
