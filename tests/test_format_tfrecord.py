"""TFRecord format: files written by TensorFlow read back exactly; damage becomes invalid
records (the rest survives); write() drops positions and keeps bytes and compression."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf  # conftest.py quiets its logging

from transforms.io.formats import tfrecord, tfrecord_frames
from transforms.io.formats.base import InputError, TensorSpec, Unit

COMPRESSIONS = ["", "GZIP", "ZLIB"]


def _floats(v) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(v).tolist()))


def _ints(v) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=np.ravel(v).tolist()))


def _bytes(*v: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))


def _example(**features) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _write(path, records: list[bytes], compression: str = "") -> str:
    options = tf.io.TFRecordOptions(compression_type=compression)
    with tf.io.TFRecordWriter(str(path), options=options) as w:
        for r in records:
            w.write(r)
    return str(path)


def _tf_read(path: str, compression: str = "") -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=compression)]


def _read(path: str, spec: TensorSpec, batch_rows: int = 1000):
    """All chunks, and their valid rows and invalid records merged."""
    chunks = list(tfrecord.read(Unit(3, path), spec, batch_rows))
    assert all(c.file_index == 3 and c.n_read <= batch_rows for c in chunks)
    positions = np.concatenate([c.positions for c in chunks]) if chunks else np.empty(0)
    ids = np.concatenate([c.ids for c in chunks]) if chunks else np.empty(0, object)
    invalid = [r for c in chunks for r in c.invalid]
    return chunks, positions, ids, invalid


def _float_records(n: int, seed: int = 0) -> tuple[list[bytes], np.ndarray]:
    vals = np.random.default_rng(seed).standard_normal((n, 2, 3)).astype(np.float32)
    return [_example(emb=_floats(v), id=_bytes(f"r{i}".encode())) for i, v in enumerate(vals)], vals


SPEC = TensorSpec(tensor="emb", id="id", shape=(2, 3))


def _frame_offsets(records: list[bytes]) -> list[int]:
    return np.cumsum([0] + [len(r) + 16 for r in records]).tolist()


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_float_list_with_shape_and_bytes_ids(tmp_path, compression):
    records, vals = _float_records(5)
    path = _write(tmp_path / "a.tfrecord", records, compression)
    chunks, positions, ids, invalid = _read(path, SPEC)
    assert len(chunks) == 1 and not invalid
    c = chunks[0]
    assert c.tensors.dtype == np.float32 and c.tensors.shape == (5, 2, 3)
    np.testing.assert_array_equal(c.tensors, vals)
    assert positions.tolist() == list(range(5)) and positions.dtype == np.int64
    assert ids.tolist() == [f"r{i}" for i in range(5)] and c.rank is None


def test_explicit_compression_and_default_ids(tmp_path):
    records, vals = _float_records(3)
    path = _write(tmp_path / "a.tfrecord.gz", records, "GZIP")
    spec = TensorSpec(tensor="emb", shape=(2, 3), dtype="float32", compression="gzip")
    (c,), _, ids, _ = _read(path, spec)
    np.testing.assert_array_equal(c.tensors, vals)
    assert ids.tolist() == [f"{path}:{i}" for i in range(3)]


def test_int64_list_with_int_ids_and_rank(tmp_path):
    vals = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    records = [_example(t=_ints(v), key=_ints([100 + i]), score=_floats([i / 4]))
               for i, v in enumerate(vals)]
    path = _write(tmp_path / "i.tfrecord", records)
    spec = TensorSpec(tensor="t", id="key", shape=(4,), rank="score")
    (c,), _, ids, invalid = _read(path, spec)
    assert not invalid and c.tensors.dtype == np.int64
    np.testing.assert_array_equal(c.tensors, vals)
    assert ids.tolist() == ["100", "101", "102"]
    assert c.rank.dtype == np.float64 and c.rank.tolist() == [0.0, 0.25, 0.5]
    # int ranks; a bad record sends the batch through the record-by-record path
    records = [_example(t=_ints(v), r=_ints([7 - i])) for i, v in enumerate(vals)]
    records.insert(1, _example(t=_ints(vals[0]), r=_floats([1.5])))
    path = _write(tmp_path / "j.tfrecord", records)
    (c,), positions, _, invalid = _read(path, TensorSpec(tensor="t", shape=(4,), rank="r"))
    assert positions.tolist() == [0, 2, 3] and [r.position for r in invalid] == [1]
    np.testing.assert_array_equal(c.tensors, vals)
    assert c.tensors.dtype == np.int64 and c.tensors.shape == (3, 4)
    assert c.rank.dtype == np.int64 and c.rank.tolist() == [7, 6, 5]
    assert "'r' is float_list, not int64_list" in invalid[0].reason


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int8])
def test_serialized_tensors(tmp_path, dtype):
    vals = (np.random.default_rng(1).standard_normal((4, 3, 5)) * 20).astype(dtype)
    records = [_example(x=_bytes(tf.io.serialize_tensor(tf.constant(v)).numpy()),
                        id=_bytes(f"k{i}".encode())) for i, v in enumerate(vals)]
    path = _write(tmp_path / "s.tfrecord", records, "GZIP")
    name = np.dtype(dtype).name
    tfrecord.check(path, TensorSpec(tensor="x", dtype=name, shape=(3, 5)))
    (c,), _, ids, invalid = _read(path, TensorSpec(tensor="x", id="id"))
    assert not invalid and c.tensors.dtype == np.dtype(dtype) and c.tensors.shape == (4, 3, 5)
    assert c.tensors.tobytes() == vals.tobytes() and ids.tolist() == ["k0", "k1", "k2", "k3"]


def test_serialized_tensor_of_other_shape_or_dtype_is_invalid(tmp_path):
    tensors = [np.ones((2, 2), np.float32), np.ones((3,), np.float32),
               np.ones((2, 2), np.float16), np.full((2, 2), 4, np.float32)]
    records = [_example(x=_bytes(tf.io.serialize_tensor(t).numpy())) for t in tensors]
    records.append(_example(x=_bytes(b"\xff\xff not a tensor")))
    path = _write(tmp_path / "s.tfrecord", records)
    (c,), positions, _, invalid = _read(path, TensorSpec(tensor="x"))
    assert positions.tolist() == [0, 3] and c.tensors.tolist() == [[[1, 1]] * 2, [[4, 4]] * 2]
    assert [r.position for r in invalid] == [1, 2, 4]
    assert "shape [3], not [2, 2]" in invalid[0].reason
    assert "dtype float16, not float32" in invalid[1].reason
    assert "serialized tensor" in invalid[2].reason
    with pytest.raises(InputError, match=r"input.dtype: .* holds float32 tensors, not int8"):
        tfrecord.check(path, TensorSpec(tensor="x", dtype="int8"))
    with pytest.raises(InputError, match=r"input.shape: .* shape \[2, 2\], not \[4\]"):
        tfrecord.check(path, TensorSpec(tensor="x", shape=(4,)))


def test_tensor_protos_with_typed_values(tmp_path):
    # Protos made without tensor_content (float_val, broadcast scalar) are read too.
    protos = [tf.make_tensor_proto([1.0, 2.0], dtype=tf.float32), tf.make_tensor_proto([1.0])]
    protos[1].tensor_content = b""
    protos[1].float_val[:] = [3.0]
    protos[1].tensor_shape.dim[0].size = 2
    protos.append(tf.make_tensor_proto(["a", "b"]))
    records = [_example(x=_bytes(p.SerializeToString())) for p in protos]
    path = _write(tmp_path / "p.tfrecord", records)
    (c,), positions, _, invalid = _read(path, TensorSpec(tensor="x"))
    assert c.tensors.tolist() == [[1.0, 2.0], [3.0, 3.0]] and c.tensors.dtype == np.float32
    assert [r.position for r in invalid] == [2] and "dtype DT_STRING" in invalid[0].reason


def test_chunks_cover_the_file_in_order(tmp_path):
    records, vals = _float_records(25)
    path = _write(tmp_path / "a.tfrecord", records, "ZLIB")
    chunks, positions, ids, invalid = _read(path, SPEC, batch_rows=7)
    assert [c.n_read for c in chunks] == [7, 7, 7, 4] and not invalid
    assert positions.tolist() == list(range(25))
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals)
    assert tfrecord.plan(path, 3, 10) == [Unit(3, path, 0, None)]


def test_bad_examples_are_invalid_and_keep_their_ids(tmp_path):
    records, vals = _float_records(6)
    records[1] = _example(emb=_floats(np.zeros(5)), id=_bytes(b"short"))
    records[2] = b"\x0a\xff garbage, not a proto"
    records[3] = _example(other=_floats(np.zeros(6)), id=_bytes(b"nofeat"))
    records[4] = _example(emb=_floats(vals[4]))  # no id
    path = _write(tmp_path / "a.tfrecord", records)
    chunks, positions, ids, invalid = _read(path, SPEC, batch_rows=4)
    assert positions.tolist() == [0, 5] and ids.tolist() == ["r0", "r5"]
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals[[0, 5]])
    by_pos = {r.position: r for r in invalid}
    assert sorted(by_pos) == [1, 2, 3, 4]
    assert by_pos[1].record_id == "short" and "5 values, not 6" in by_pos[1].reason
    assert by_pos[2].record_id == f"{path}:2" and "tf.train.Example" in by_pos[2].reason
    assert by_pos[3].record_id == "nofeat" and "no feature 'emb'" in by_pos[3].reason
    assert by_pos[4].record_id == f"{path}:4" and "no feature 'id'" in by_pos[4].reason
    assert all("\n" not in r.reason for r in invalid)


def test_malformed_rank_is_invalid(tmp_path):
    records = [_example(t=_floats([i, i]), s=_floats([i] * k)) for i, k in enumerate([1, 2, 1])]
    path = _write(tmp_path / "a.tfrecord", records)
    (c,), positions, _, invalid = _read(path, TensorSpec(tensor="t", shape=(2,), rank="s"))
    assert positions.tolist() == [0, 2] and c.rank.tolist() == [0.0, 2.0]
    assert [r.position for r in invalid] == [1] and "'s' has 2 values" in invalid[0].reason


def test_data_crc_mismatch_invalidates_one_record(tmp_path):
    records, vals = _float_records(8)
    path = _write(tmp_path / "a.tfrecord", records)
    raw = bytearray(open(path, "rb").read())
    raw[_frame_offsets(records)[3] + 12 + 5] ^= 0x40
    open(path, "wb").write(raw)
    chunks, positions, ids, invalid = _read(path, SPEC, batch_rows=3)
    assert positions.tolist() == [0, 1, 2, 4, 5, 6, 7]
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals[positions])
    assert [(r.position, r.record_id) for r in invalid] == [(3, f"{path}:3")]
    assert "CRC mismatch" in invalid[0].reason


def test_corrupt_length_header_is_one_invalid_region(tmp_path):
    records, vals = _float_records(8)
    path = _write(tmp_path / "a.tfrecord", records)
    offsets = _frame_offsets(records)
    raw = bytearray(open(path, "rb").read())
    raw[offsets[2] + 1] ^= 0x01  # the length field of record 2
    open(path, "wb").write(raw)
    chunks, positions, ids, invalid = _read(path, SPEC)
    assert positions.tolist() == [0, 1, 3, 4, 5, 6, 7]  # the region takes position 2
    assert ids.tolist() == [f"r{i}" for i in (0, 1, 3, 4, 5, 6, 7)]
    np.testing.assert_array_equal(chunks[0].tensors, vals[[0, 1, 3, 4, 5, 6, 7]])
    assert len(invalid) == 1 and invalid[0].position == 2
    assert invalid[0].reason == f"corrupt bytes at offset {offsets[2]}..{offsets[3]}"


def _frame(data: bytes, crc_ok: bool = True) -> bytes:
    """A TFRecord frame built by hand (for damage TensorFlow's writer cannot make)."""
    length = len(data).to_bytes(8, "little")
    data_crc = tfrecord_frames._masked_crc(data) ^ (0 if crc_ok else 1)
    return (length + tfrecord_frames._masked_crc(length).to_bytes(4, "little") + data
            + data_crc.to_bytes(4, "little"))


@pytest.mark.parametrize("block", [1 << 20, 37])
def test_resync_passes_headers_without_valid_data(tmp_path, monkeypatch, block):
    monkeypatch.setattr(tfrecord_frames, "_BLOCK", block)  # small blocks: every boundary case
    records, vals = _float_records(3)
    junk = (b"\x01" + _frame(b"x" * 30, crc_ok=False) + bytes(50)
            + np.random.default_rng(2).bytes(300))
    path = tmp_path / "a.tfrecord"
    path.write_bytes(_frame(records[0]) + junk + _frame(records[1]) + _frame(records[2]))
    chunks, positions, ids, invalid = _read(str(path), SPEC, batch_rows=2)
    assert positions.tolist() == [0, 2, 3] and ids.tolist() == ["r0", "r1", "r2"]
    start = len(records[0]) + 16
    assert [r.reason for r in invalid] == [f"corrupt bytes at offset {start}..{start + len(junk)}"]
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_small_blocks_read_compressed_files(tmp_path, monkeypatch, compression):
    monkeypatch.setattr(tfrecord_frames, "_BLOCK", 29)
    records, vals = _float_records(20)
    path = _write(tmp_path / "a.tfrecord", records, compression)
    chunks, positions, _, invalid = _read(path, SPEC, batch_rows=6)
    assert positions.tolist() == list(range(20)) and not invalid
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals)


def test_garbage_inside_the_file_is_skipped(tmp_path):
    records, vals = _float_records(4)
    path = _write(tmp_path / "a.tfrecord", records)
    offsets = _frame_offsets(records)
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:offsets[2]] + b"\x07" * 100 + raw[offsets[2]:])
    _, positions, ids, invalid = _read(path, SPEC)
    assert positions.tolist() == [0, 1, 3, 4] and ids.tolist() == ["r0", "r1", "r2", "r3"]
    end = offsets[2] + 100
    assert [r.reason for r in invalid] == [f"corrupt bytes at offset {offsets[2]}..{end}"]


@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_truncated_tail(tmp_path, compression):
    records, vals = _float_records(5)
    path = _write(tmp_path / "a.tfrecord", records, compression)
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:-10])
    chunks, positions, ids, invalid = _read(path, SPEC)
    assert positions.tolist() == list(range(len(positions))) and len(positions) >= 3
    np.testing.assert_array_equal(chunks[0].tensors, vals[:len(positions)])
    assert len(invalid) == 1 and invalid[0].position == len(positions)
    assert ("truncated" if compression == "" else "ends early") in invalid[0].reason


def test_corrupt_gzip_keeps_what_precedes_the_damage(tmp_path):
    records, vals = _float_records(400)
    path = _write(tmp_path / "a.tfrecord.gz", records, "GZIP")
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2:len(raw) // 2 + 64] = bytes(range(64))
    open(path, "wb").write(raw)
    chunks, positions, ids, invalid = _read(path, SPEC, batch_rows=64)
    n = sum(c.n_read for c in chunks)
    assert invalid and 50 < len(positions) < 400
    assert sorted(positions.tolist() + [r.position for r in invalid]) == list(range(n))
    rows = np.array([int(i[1:]) for i in ids])
    np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals[rows])
    assert tfrecord.check(path, SPEC).dtype == "float32"  # does not raise: the start is fine


def test_unopenable_file(tmp_path):
    path = str(tmp_path / "missing.tfrecord")
    (c,) = tfrecord.read(Unit(0, path), SPEC, 10)
    assert c.n_read == 0 and c.invalid[0].position == 0 and c.invalid[0].record_id == path
    assert c.invalid[0].whole_file  # the file with its reason, no record
    assert tfrecord.write(path, str(tmp_path / "out" / "x"), np.array([], np.int64)) == 0
    assert not (tmp_path / "out" / "x").exists()
    tfrecord.check(path, SPEC)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_write_drops_positions_and_keeps_bytes_and_compression(tmp_path, compression):
    records, _ = _float_records(10)
    src = _write(tmp_path / "a.tfrecord", records, compression)
    dst = str(tmp_path / "out" / "sub" / "a.tfrecord")
    assert tfrecord.write(src, dst, np.array([0, 3, 4, 9], np.int64)) == 6
    assert _tf_read(dst, compression) == [records[i] for i in (1, 2, 5, 6, 7, 8)]
    head = open(dst, "rb").read(2)
    assert (head == b"\x1f\x8b") == (compression == "GZIP")
    assert (head[0] == 0x78) == (compression == "ZLIB")
    parsed = tf.io.parse_single_example(_tf_read(dst, compression)[0],
                                        {"emb": tf.io.FixedLenFeature([2, 3], tf.float32)})
    assert parsed["emb"].shape == (2, 3)


def test_write_skips_damaged_frames_with_read_positions(tmp_path):
    records, _ = _float_records(6)
    path = _write(tmp_path / "a.tfrecord", records)
    offsets = _frame_offsets(records)
    raw = bytearray(open(path, "rb").read())
    raw[offsets[1] + 3] ^= 0xFF  # length header: a corrupt region at position 1
    raw[offsets[4] + 20] ^= 0xFF  # data: a CRC mismatch at position 4
    open(path, "wb").write(raw)
    _, positions, _, invalid = _read(path, SPEC)
    assert positions.tolist() == [0, 2, 3, 5] and [r.position for r in invalid] == [1, 4]
    dst = str(tmp_path / "b.tfrecord")
    assert tfrecord.write(path, dst, np.array([3], np.int64)) == 3
    assert _tf_read(dst) == [records[0], records[2], records[5]]


def test_check_messages(tmp_path):
    records, _ = _float_records(2)
    path = _write(tmp_path / "a.tfrecord", records)
    tfrecord.check(path, SPEC)
    with pytest.raises(InputError, match=r"input.tensor: none of the first 2 records has a feature "
                                         r"'embedding' \(their features: emb, id\)"):
        tfrecord.check(path, TensorSpec(tensor="embedding", shape=(2, 3)))
    with pytest.raises(InputError, match=r"input.id: .*has a feature 'key'"):
        tfrecord.check(path, TensorSpec(tensor="emb", id="key", shape=(2, 3)))
    with pytest.raises(InputError, match=r"keep: .*has a feature 'score'"):
        tfrecord.check(path, TensorSpec(tensor="emb", rank="score", shape=(2, 3)))
    with pytest.raises(InputError, match=r"input.dtype: feature 'emb' is a float_list \(float32\)"
                                         r", not int32: set input.dtype: float32"):
        tfrecord.check(path, TensorSpec(tensor="emb", shape=(2, 3), dtype="int32"))
    assert tfrecord.check(path, TensorSpec(tensor="emb")).shape == (6,)  # one size: taken
    with pytest.raises(InputError, match=r"input.shape: .*6 values .*not 4"):
        tfrecord.check(path, TensorSpec(tensor="emb", shape=(4,)))
    with pytest.raises(InputError, match=r"keep: feature 'id' is bytes_list, not"):
        tfrecord.check(path, TensorSpec(tensor="emb", rank="id", shape=(2, 3)))
    # Without check(), read() reports the mismatch per record instead of raising.
    (c,) = tfrecord.read(Unit(0, path), TensorSpec(tensor="emb", dtype="int64"), 10)
    assert len(c.invalid) == 2 and "set input.dtype: float32" in c.invalid[0].reason


@pytest.mark.parametrize("kind", ["float_list", "int64_list"])
def test_flat_lists_of_several_sizes_are_quoted(tmp_path, kind):
    """Without input.shape a flat list's size comes from the file's first records: several
    sizes there are refused, quoted with the way out (int64 ids: jaccard too); a later
    record of another size is an invalid record with its reason."""
    feature = _floats if kind == "float_list" else _ints
    sizes = [5] * 6 + [3, 7, 5, 5]
    mixed = _write(tmp_path / "m.tfrecord", [_example(emb=feature(np.arange(k))) for k in sizes])
    with pytest.raises(InputError) as e:
        tfrecord.check(mixed, TensorSpec(tensor="emb"))
    jaccard = ", or set near.metric: jaccard" if kind == "int64_list" else ""
    assert str(e.value) == (
        f"{mixed}: input.shape: feature 'emb' is {'an' if kind[0] == 'i' else 'a'} {kind} "
        "of no fixed size: the first 10 "
        "records holding it hold 3 to 7 values (3 sizes; the most common, 5, 80% of them): "
        "set input.shape: [5] to read the records of that size (the others are then "
        "reported invalid)" + (jaccard and jaccard + " (with near.threshold, e.g. 0.8) for "
                               "the similarity of token sequences, or remove near (exact "
                               "dedup alone reads sequences of any length)"))
    assert tfrecord.check(mixed, TensorSpec(tensor="emb", shape=(5,))).shape == (5,)

    late = _write(tmp_path / "l.tfrecord",
                  [_example(emb=feature(np.arange(k))) for k in [4] * 150 + [6] + [4] * 9])
    assert tfrecord.check(late, TensorSpec(tensor="emb")).shape == (4,)
    chunks, positions, _, invalid = _read(late, TensorSpec(tensor="emb"), batch_rows=64)
    assert np.concatenate([c.tensors for c in chunks]).shape == (159, 4)
    assert [r.position for r in invalid] == [150]
    assert invalid[0].reason == ("feature 'emb' has 6 values, not 4 (the size of the "
                                 "file's first records)")


@pytest.mark.parametrize("odd", ["missing", "bytes_list"])
def test_odd_first_record_is_invalid_not_a_refusal(tmp_path, odd):
    """TFDS-style optional features: a first record without the tensor feature, or with
    it as another kind than the rest, is one invalid record (as at any other position)
    when the config says what the feature holds; without dtype and shape the refusal
    says the first record lacks it and asks whether it is optional."""
    records, vals = _float_records(30)
    records[0] = (_example(id=_bytes(b"r0"), label=_ints([1])) if odd == "missing" else
                  _example(emb=_bytes(vals[0].tobytes()), id=_bytes(b"r0")))
    path = _write(tmp_path / "a.tfrecord", records)
    spec = TensorSpec(tensor="emb", id="id", shape=(2, 3), dtype="float32")
    assert tfrecord.check(path, spec) == spec
    for batch_rows in (1000, 7):
        chunks, positions, ids, invalid = _read(path, spec, batch_rows)
        assert positions.tolist() == list(range(1, 30))
        np.testing.assert_array_equal(np.concatenate([c.tensors for c in chunks]), vals[1:])
        assert [(r.position, r.record_id) for r in invalid] == [(0, "r0")]
        assert invalid[0].reason == ("no feature 'emb'" if odd == "missing" else
                                     "feature 'emb' is bytes_list, not float_list like the "
                                     "file's first records")
    if odd == "missing":
        with pytest.raises(InputError, match=r"input.tensor: the first record has no feature "
                                             r"'emb' \(29 of the first 30 records have it, "
                                             r"as float_list of float32 of shape \[2, 3\]\): is "
                                             r"it optional\? .*set input.dtype: float32 and "
                                             r"input.shape: \[2, 3\]"):
            tfrecord.check(path, TensorSpec(tensor="emb", id="id", shape=(2, 3)))
        # encoded values: decode says what the feature holds
        from transforms.io.formats import get_format
        from transforms.io.formats.base import Decode

        images = [_example(img=_bytes(b"v%d" % i), id=_bytes(b"r%d" % i)) for i in range(5)]
        images[0] = _example(id=_bytes(b"r0"))
        enc = _write(tmp_path / "e.tfrecord", images)
        espec = TensorSpec(tensor="img", id="id", decode=Decode("bytes"))
        fmt = get_format("tfrecord", espec)
        got = fmt.check(enc, espec)
        bad = [r for c in fmt.read(Unit(0, enc), got, 100) for r in c.invalid]
        assert [(r.position, r.reason) for r in bad] == [(0, "no feature 'img'")]


def test_missing_feature_names_the_nearest_and_caps_the_list(tmp_path):
    records, _ = _float_records(3)
    path = _write(tmp_path / "a.tfrecord", records)
    for typo, meant in (("emd", "emb"), ("EMB", "emb"), ("ids", "id")):
        with pytest.raises(InputError, match=rf"none of the first 3 records has a feature "
                                             rf"'{typo}' \(their features: emb, id\): did you "
                                             rf"mean '{meant}'\?"):
            tfrecord.check(path, TensorSpec(tensor=typo, shape=(2, 3)))
    wide = _write(tmp_path / "w.tfrecord",
                  [_example(**{f"f{i:02d}": _floats([i]) for i in range(30)})])
    with pytest.raises(InputError, match=r"f00, f01, .*f11, \.\.\. \(30 in all\)\): name "
                                         r"one of them") as e:
        tfrecord.check(wide, TensorSpec(tensor="zzz", shape=(1,)))
    assert "f12" not in str(e.value)


@pytest.mark.parametrize("level", [None, "3"])
def test_tensorflow_import_prints_nothing_on_stderr(level):
    """--quiet promises nothing on stderr but errors: TensorFlow's C++ log lines at import
    (oneDNN, cuda drivers, absl) are not printed unless TF_CPP_MIN_LOG_LEVEL asks for
    them; 3 is what a Dask or portable worker inherits from the launcher (they printed 4
    lines per worker process before)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    code = ("from transforms.io.formats.tfrecord_parse import _tf; _tf()\n"
            "import sys; print('after', file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, cwd=os.getcwd())
    assert out.stderr == "after\n"


def test_check_does_not_raise_for_unreadable_files(tmp_path):
    garbage = tmp_path / "garbage.tfrecord"
    garbage.write_bytes(bytes(range(256)) * 4)
    tfrecord.check(str(garbage), SPEC)
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    tfrecord.check(str(empty), SPEC)
    assert list(tfrecord.read(Unit(0, str(empty)), SPEC, 10)) == []
    _, positions, _, invalid = _read(str(garbage), SPEC)
    assert len(positions) == 0
    assert [r.reason for r in invalid] == ["corrupt bytes at offset 0..1024"]


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_empty_compressed_files(tmp_path, compression):
    path = _write(tmp_path / "e.tfrecord", [], compression)
    assert list(tfrecord.read(Unit(0, path), SPEC, 10)) == []
    assert tfrecord.write(path, str(tmp_path / "o.tfrecord"), np.array([], np.int64)) == 0


def test_example_class_parses_what_tensorflow_writes():
    """transforms.io.formats.example_proto: the same messages as TensorFlow's, without it."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example.example_pb2 import Example as TFExample

    from transforms.io.formats.example_proto import example_class

    Example = example_class()
    records = [_example(f=_floats([1.5, -2.25, 3e38]), i=_ints([-3, 2 ** 62, 0]),
                        b=_bytes(b"\x00\xff", b""), e=tf.train.Feature()),
               _example(), tf.train.Example().SerializeToString()]
    for data in records:
        ours, theirs = Example.FromString(data), TFExample.FromString(data)
        assert ours.SerializeToString(deterministic=True) == \
            theirs.SerializeToString(deterministic=True)
        assert set(ours.features.feature) == set(theirs.features.feature)
        for name, feat in theirs.features.feature.items():
            kind = feat.WhichOneof("kind")
            assert ours.features.feature[name].WhichOneof("kind") == kind
            if kind:
                assert list(getattr(ours.features.feature[name], kind).value) == \
                    list(getattr(feat, kind).value)
    with pytest.raises(DecodeError):
        Example.FromString(b"\x0a\xff\xff")  # a length past the end
    with pytest.raises(DecodeError):
        TFExample.FromString(b"\x0a\xff\xff")


def test_encoded_values_and_writing_do_not_import_tensorflow(tmp_path):
    """Checking, reading encoded values and writing clean shards in a fresh process:
    importing TensorFlow alone took longer than decoding 4,000 photos."""
    import subprocess
    import sys

    from tests.imagekit import crops, encode, write_tfrecord

    src = tmp_path / "a.tfrecord"
    records = write_tfrecord(src, [encode(c, "JPEG") for c in crops(3, seed=2)])
    code = f"""
import sys
import numpy as np
from transforms.io.formats import get_format
from transforms.io.formats.base import Decode, TensorSpec, Unit
spec = TensorSpec("image/encoded", decode=Decode("image", resize=(8, 8)))
fmt = get_format("tfrecord", spec)
spec = fmt.check({str(src)!r}, spec)
n = sum(len(c.positions) for c in fmt.read(Unit(0, {str(src)!r}), spec, 100))
w = fmt.write({str(src)!r}, {str(tmp_path / "out.tfrecord")!r}, np.array([1]), spec)
print(n, w, "tensorflow" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=__import__("os").getcwd()).stdout.split()
    assert out == ["3", "2", "False"]
    assert _tf_read(str(tmp_path / "out.tfrecord")) == [records[0], records[2]]


def test_a_second_thread_waits_for_the_whole_tensorflow_import():
    """Two bundles' threads reading TFRecord features at once: the second asked while the
    first was importing TensorFlow and got the partly initialised module ("partially
    initialized module 'tensorflow' has no attribute 'float32'": 8 of 14 runs with two
    workers failed). It waits for the import now, as a plain import would."""
    import os
    import subprocess
    import sys

    code = """
import sys, threading
from transforms.io.formats.tfrecord_parse import _tf
first = threading.Thread(target=_tf)
first.start()
while "tensorflow" not in sys.modules:  # the first thread's import has begun
    pass
tf = _tf()
print(tf.float32.name, tf.io.FixedLenFeature.__name__)
first.join()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.getcwd(), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["float32", "FixedLenFeature"]
