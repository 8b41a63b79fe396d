"""input.decode: encoded images in TFRecord (written by TensorFlow), Hugging Face Parquet,
pyarrow binary columns and HDF5, deduplicated on decoded pixels; clean shards read back
by tf.data, pyarrow and h5py; groups checked against a brute-force oracle."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from pipeline.run import main
from tests.imagekit import (
    crops,
    encode,
    read_tfrecord,
    tf_jpeg,
    write_hf_parquet,
    write_tfrecord,
)


def run(tmp_path: Path, inp: dict, **top) -> int:
    cfg = {"input": inp, "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), **top}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    return main(["--config", str(tmp_path / "job.yaml"), "--quiet"])


def reports(tmp_path: Path) -> tuple[list[dict], list[dict], dict]:
    r = tmp_path / "out" / "report"
    return (pq.read_table(r / "duplicates.parquet").to_pylist(),
            pq.read_table(r / "invalid.parquet").to_pylist(),
            json.loads((r / "summary.json").read_text()))


def oracle_exact(pixels: list[np.ndarray | None]) -> dict[int, int]:
    """{removed index: kept index}: the first record with the same decoded pixels."""
    first: dict[tuple, int] = {}
    out = {}
    for i, p in enumerate(pixels):
        if p is None:
            continue
        key = (p.shape, p.tobytes())
        if key in first:
            out[i] = first[key]
        else:
            first[key] = i
    return out


def tf_decode(data: bytes) -> np.ndarray:
    """TensorFlow's decoders; for JPEG the accurate integer DCT, which libjpeg-turbo under
    Pillow uses too (TF's default, INTEGER_FAST, differs by up to 4 on most pixels)."""
    import tensorflow as tf

    if data[:3] == b"\xff\xd8\xff":
        return tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE").numpy()
    return tf.io.decode_image(data, channels=3, expand_animations=False).numpy()


def test_tfrecord_jpeg_exact_matches_oracle_and_shards_keep_bytes(tmp_path):
    imgs = crops(50, seed=1)
    encoded = [tf_jpeg(im, 90) for im in imgs]
    # 5 byte-identical copies, and 2 copies stored as PNG of the same decoded pixels
    # (another container, same picture: exact duplicates at full resolution)
    encoded += [encoded[i] for i in (3, 7, 7, 20, 41)]
    encoded += [encode(tf_decode(encoded[i])) for i in (11, 30)]
    ids = [f"img-{i}" for i in range(len(encoded))]
    records = write_tfrecord(tmp_path / "in" / "train.tfrecord", encoded, ids)

    assert run(tmp_path, {"format": "tfrecord", "path": str(tmp_path / "in" / "*.tfrecord"),
                          "tensor": "image/encoded", "id": "image/source_id",
                          "decode": "image"}) == 0
    dups, invalid, summary = reports(tmp_path)
    expected = oracle_exact([tf_decode(e) for e in encoded])  # TensorFlow's decoder
    assert len(expected) == 7 and not invalid
    assert {d["record_id"]: d["duplicate_of"] for d in dups} == {
        ids[i]: ids[j] for i, j in expected.items()}
    assert summary["read"] == 57 and summary["kept"] == 50 and summary["removed_exact"] == 7
    # the clean shard, read by tf.data: the kept records' serialized bytes, in order
    kept = [r for i, r in enumerate(records) if i not in expected]
    assert read_tfrecord(tmp_path / "out" / "clean" / "train.tfrecord") == kept


def test_hf_parquet_struct_paths_and_bad_images(tmp_path):
    imgs = crops(30, seed=2)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "pics").mkdir()
    Image.fromarray(imgs[5]).save(folder / "pics" / "five.png")  # a path-only row's file
    rows = [{"image": {"bytes": encode(im, "JPEG", quality=92), "path": f"{i}.jpg"},
             "label": i} for i, im in enumerate(imgs)]
    rows.append({"image": {"bytes": rows[4]["image"]["bytes"], "path": "copy.jpg"}, "label": 4})
    rows.append({"image": {"bytes": None, "path": "pics/five.png"}, "label": 5})
    rows.append({"image": {"bytes": encode(imgs[5]), "path": None}, "label": 5})  # same pixels
    rows.append({"image": {"bytes": None, "path": "pics/missing.png"}, "label": 0})
    rows.append({"image": {"bytes": rows[9]["image"]["bytes"][:1500], "path": "cut.jpg"},
                 "label": 0})
    rows.append({"image": {"bytes": b"not an image at all", "path": None}, "label": 0})
    table = write_hf_parquet(folder / "train-00000-of-00001.parquet", rows)

    assert run(tmp_path, {"format": "parquet", "path": str(folder / "*.parquet"),
                          "tensor": "image", "decode": "image"}) == 0
    dups, invalid, summary = reports(tmp_path)
    assert summary["read"] == 36 and summary["invalid"] == 3
    assert {(d["row"], d["duplicate_of_row"]) for d in dups} == {(30, 4), (32, 31)}
    reasons = {r["record_id"].rsplit(":", 1)[1]: r["reason"] for r in invalid}
    assert "pics/missing.png" in reasons["33"] and "FileNotFoundError" in reasons["33"]
    assert "truncated" in reasons["34"]
    assert "not a JPEG, PNG" in reasons["35"]
    # the clean shard: same schema (HF metadata included), the kept rows as they were
    out = pq.read_table(tmp_path / "out" / "clean" / "train-00000-of-00001.parquet")
    assert out.schema == table.schema and out.schema.metadata == table.schema.metadata
    keep = [i for i in range(36) if i not in (30, 32, 33, 34, 35)]
    assert out.equals(table.take(pa.array(keep)))


def test_near_on_resized_reencodes_with_a_pillow_oracle(tmp_path):
    imgs = crops(40, h=64, w=64, seed=3)
    values = [encode(im, "PNG") for im in imgs]
    edits = {40: (0, "q70"), 41: (1, "q90"), 42: (2, "resize"), 43: (3, "png")}
    for src, how in edits.values():
        im = imgs[src]
        if how.startswith("q"):
            values.append(encode(im, "JPEG", quality=int(how[1:])))
        elif how == "resize":
            values.append(encode(np.asarray(Image.fromarray(im).resize((66, 65)))))
        else:
            values.append(encode(im, "PNG", compress_level=1))  # same pixels, other bytes
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(len(values))],
                             "png": pa.array(values, pa.binary())}),
                   tmp_path / "in.parquet", row_group_size=8)
    threshold = 300.0  # l2 over 32 x 32 x 3 values 0..255
    assert run(tmp_path, {"format": "parquet", "path": str(tmp_path / "in.parquet"),
                          "tensor": "png", "id": "key", "decode": "image", "resize": [32, 32],
                          "channels": 3},
               near={"metric": "l2", "threshold": threshold}) == 0
    dups, invalid, _ = reports(tmp_path)

    def small(data: bytes) -> np.ndarray:  # the oracle: Pillow directly, in float64
        im = Image.open(__import__("io").BytesIO(data)).convert("RGB")
        return np.asarray(im.resize((32, 32), Image.Resampling.BILINEAR, reducing_gap=3.0),
                          np.float64)

    x = np.stack([small(v) for v in values]).reshape(len(values), -1)
    dist = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    got = {d["row"]: (d["duplicate_of_row"], d["kind"], d["distance"]) for d in dups}
    assert got[43][:2] == (3, "exact")
    for row, (src, _) in edits.items():
        if row != 43:
            assert got[row][:2] == (src, "near")
            assert got[row][2] == pytest.approx(dist[row, src], rel=1e-9)
    # no distinct crop is within the threshold of another: nothing else removed
    distinct = dist[:40, :40] + np.eye(40) * 1e9
    assert distinct.min() > threshold and set(got) == set(edits) and not invalid
    # the report's page shows the pictures as stored (full resolution), not the 32 x 32
    # pixels the near stage compared; the resized copy at its own size
    page = (tmp_path / "out" / "report" / "index.html").read_text()
    assert page.count('alt="tensor 64x64"') >= 7 and 'alt="tensor 65x66"' in page
    assert 'alt="tensor 32x32"' not in page


def test_reference_set_of_tfrecord_images_against_hf_parquet(tmp_path):
    """A reference TFRecord of JPEGs (never removed) against an HF Image() Parquet input:
    a PNG of a reference picture's decoded pixels and a byte copy are reference_exact, a
    q70 re-encode is reference_near, a copy inside the input is plain exact."""
    refs = [tf_jpeg(im, 90) for im in crops(12, seed=7)]
    write_tfrecord(tmp_path / "ref" / "test.tfrecord", refs, [f"ref-{i}" for i in range(12)])
    imgs = crops(10, seed=8)
    values = [encode(im, "JPEG", quality=90) for im in imgs]
    values += [encode(tf_decode(refs[2])), refs[7], encode(tf_decode(refs[4]), "JPEG",
                                                           quality=70), values[3]]
    write_hf_parquet(tmp_path / "in" / "train.parquet",
                     [{"image": {"bytes": v, "path": None}, "label": 0} for v in values])
    dec = {"decode": "image", "resize": [32, 32], "channels": 3}
    threshold = 300.0
    assert run(tmp_path, {"format": "parquet", "path": str(tmp_path / "in" / "*.parquet"),
                          "tensor": "image", **dec},
               reference={"format": "tfrecord", "path": str(tmp_path / "ref" / "*.tfrecord"),
                          "tensor": "image/encoded", "id": "image/source_id", **dec},
               near={"metric": "l2", "threshold": threshold}) == 0
    dups, invalid, summary = reports(tmp_path)
    got = {d["row"]: (d["kind"], d["duplicate_of"]) for d in dups}
    assert got == {10: ("reference_exact", "ref-2"), 11: ("reference_exact", "ref-7"),
                   12: ("reference_near", "ref-4"), 13: ("exact", got[13][1])}
    assert got[13][1].endswith(":3") and not invalid
    assert summary["reference"] == {"files": 1, "read": 12, "invalid": 0}
    # the oracle: Pillow on every picture, the one near pair is the one planted
    from transforms.images import decode_image

    x = np.stack([decode_image(v, resize=(32, 32))[1] for v in refs + values[:10]])
    x = x.reshape(len(x), -1).astype(np.float64)
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1)) + np.eye(len(x)) * 1e9
    assert d.min() > threshold
    near = np.linalg.norm(decode_image(values[12], resize=(32, 32))[1].astype(float).ravel()
                          - x[4])
    assert near == pytest.approx(next(r["distance"] for r in dups if r["row"] == 12))
    assert near <= threshold


def test_hdf5_vlen_images_and_bytes_mode(tmp_path):
    imgs = crops(20, seed=4)
    values = [encode(im) for im in imgs] + [encode(imgs[2])]
    values.append(encode(imgs[3], "BMP"))  # same pixels as row 3, another container
    path = tmp_path / "in" / "images.h5"
    path.parent.mkdir()
    with h5py.File(path, "w") as h:
        ds = h.create_dataset("png", (len(values),), dtype=h5py.vlen_dtype(np.uint8))
        for i, v in enumerate(values):
            ds[i] = np.frombuffer(v, np.uint8)
        h.create_dataset("label", data=np.arange(len(values)))
    inp = {"format": "hdf5", "path": str(path), "tensor": "png"}
    assert run(tmp_path, {**inp, "decode": "image"}) == 0
    dups, _, _ = reports(tmp_path)
    assert {(d["row"], d["duplicate_of_row"]) for d in dups} == {(20, 2), (21, 3)}
    with h5py.File(tmp_path / "out" / "clean" / "images.h5") as h:
        assert [bytes(v) for v in h["png"][:]] == values[:20]
        assert h["label"][:].tolist() == list(range(20))
    # decode: bytes compares the files as stored: the BMP copy is another file
    assert run(tmp_path, {**inp, "decode": "bytes"}, output={
        "path": str(tmp_path / "out" / "clean"), "overwrite": True}) == 0
    dups, _, _ = reports(tmp_path)
    assert {(d["row"], d["duplicate_of_row"]) for d in dups} == {(20, 2)}


def test_decoded_chunks_are_bounded_by_bytes(tmp_path):
    from transforms.io.formats import get_format
    from transforms.io.formats.base import Decode, TensorSpec, Unit

    imgs = crops(40, h=60, w=80, seed=5)
    pq.write_table(pa.table({"img": [encode(im) for im in imgs]}), tmp_path / "a.parquet")
    budget = 60 * 80 * 3 * 5  # five images
    spec = TensorSpec("img", decode=Decode("image", chunk_bytes=budget))
    chunks = list(get_format("parquet", spec).read(Unit(0, str(tmp_path / "a.parquet")),
                                                    spec, 1000))
    # cut at five decoded images, or earlier where a slice of encoded bytes ends
    assert all(sum(t.nbytes for t in c.tensors) <= budget for c in chunks)
    assert len(chunks) >= 8 and max(len(c.positions) for c in chunks) == 5
    assert all(c.tensors.dtype == object for c in chunks)  # no resize: each its own size
    got = [t for c in chunks for t in c.tensors]
    assert all(np.array_equal(a, b) for a, b in zip(got, imgs, strict=True))


@pytest.mark.parametrize("inp, near, words", [
    ({"decode": "image"}, None, "not a bytes_list of one encoded value"),  # float feature
    ({}, None, "holds JPEG image bytes, not a serialized tensor: set input.decode: image"),
    ({"decode": "image"}, {"metric": "l2", "threshold": 1.0}, "set input.resize"),
    ({"resize": [8, 8]}, None, "input.resize applies to decoded images"),
    ({"decode": "image", "resize": [8]}, None, "[height, width]"),
    ({"decode": "image", "dtype": "float32"}, None,  # was accepted and ignored
     "input.dtype applies to stored tensors (input.decode: none); decode image makes uint8"),
])
def test_wrong_decode_settings_stop_before_work(tmp_path, capsys, inp, near, words):
    import tensorflow as tf

    enc = tf_jpeg(crops(1)[0])
    write_tfrecord(tmp_path / "in" / "a.tfrecord", [enc, enc])
    with tf.io.TFRecordWriter(str(tmp_path / "in" / "b.tfrecord")) as w:
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "image/encoded": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))}))
            .SerializeToString())
    path = "b.tfrecord" if words.startswith("not a bytes") else "a.tfrecord"
    extra = {"near": near} if near else {}
    code = run(tmp_path, {"format": "tfrecord", "path": str(tmp_path / "in" / path),
                          "tensor": "image/encoded", **inp}, **extra)
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt, side, words", [
    ("parquet", {"keep": {"max": "id"}}, "keep: column 'id' holds string, not numbers"),
    ("parquet", {"keep": {"min": "img"}}, "keep: column 'img' holds binary, not numbers"),
    ("hdf5", {"keep": {"max": "id"}}, "keep: dataset 'id' holds"),
    ("hdf5", {"id": "short"}, "input.id: dataset 'short' has shape (3,), not (6,)"),
    ("hdf5", {"keep": {"max": "short"}}, "keep: dataset 'short' has shape (3,), not (6,)"),
    ("hdf5", {"keep": {"max": "wide"}}, "keep: dataset 'wide' has shape (6, 2), not (6,)"),
])
def test_encoded_records_id_and_keep_are_checked_before_work(tmp_path, capsys, fmt, side,
                                                            words):
    """Encoded images in Parquet and HDF5: the id and keep columns get the numeric
    formats' checks (a string keep column failed after the work, with a traceback; a
    short HDF5 id dataset with IndexError)."""
    values = [encode(im) for im in crops(6, seed=7)]
    ids = [f"r{i}" for i in range(6)]
    path = tmp_path / "in" / ("a.parquet" if fmt == "parquet" else "a.h5")
    path.parent.mkdir()
    if fmt == "parquet":
        pq.write_table(pa.table({"id": ids, "img": values}), path)
    else:
        with h5py.File(path, "w") as h:
            ds = h.create_dataset("img", (6,), dtype=h5py.vlen_dtype(np.uint8))
            for i, v in enumerate(values):
                ds[i] = np.frombuffer(v, np.uint8)
            h["id"], h["short"], h["wide"] = np.array(ids, "S"), np.arange(3.0), np.ones((6, 2))
    keep = side.pop("keep", "first")
    code = run(tmp_path, {"format": fmt, "path": str(path), "tensor": "img", "decode": "image",
                          **side}, keep=keep)
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_undecodable_majority_publishes_nothing(tmp_path, capsys):
    good = [encode(im) for im in crops(3, seed=6)]
    values = good + [b"\x89PNG\r\n\x1a\n" + bytes(40)] * 7  # PNG signature, nothing after
    pq.write_table(pa.table({"img": pa.array(values, pa.binary())}), tmp_path / "a.parquet")
    code = run(tmp_path, {"format": "parquet", "path": str(tmp_path / "a.parquet"),
                          "tensor": "img", "decode": "image"})
    err = capsys.readouterr().err
    assert code == 1 and "7 of 10 input records are invalid" in err
    assert not (tmp_path / "out").exists()  # no clean shards, no report, no folder


def test_repeated_files_are_decoded_once_per_unit(tmp_path, monkeypatch):
    """A scraped column holds the same file many times: each distinct value is decoded
    once (across the unit's byte slices), rows get the same pixels and digest as when
    decoded alone, and every row of a repeated corrupt value is invalid with the reason."""
    from transforms.io.formats import encoded, get_format
    from transforms.io.formats.base import Decode, TensorSpec, Unit

    imgs = crops(6, h=40, w=50, seed=9)
    files = [encode(im) for im in imgs] + [b"\x89PNG\r\n\x1a\n broken"]
    order = np.random.default_rng(2).integers(0, len(files), 300)
    pq.write_table(pa.table({"img": [files[i] for i in order]}), tmp_path / "a.parquet")
    calls = []
    real = encoded.decode_image

    def counted(data, **kw):
        calls.append(data)
        return real(data, **kw)

    monkeypatch.setattr(encoded, "decode_image", counted)
    spec = TensorSpec("img", decode=Decode("image", resize=(16, 16), chunk_bytes=40 * 50 * 3 * 20))
    chunks = list(get_format("parquet", spec).read(Unit(0, str(tmp_path / "a.parquet")),
                                                    spec, 64))
    assert len(chunks) > 3 and sorted(set(calls)) == sorted(files) and len(calls) == len(files)
    alone = [encoded.decode_value(f, spec) for f in files[:-1]]
    got = {int(p): (t, d.tobytes()) for c in chunks
           for p, t, d in zip(c.positions, c.tensors, c.digests, strict=True)}
    bad = sorted(r.position for c in chunks for r in c.invalid)
    assert bad == np.flatnonzero(order == len(files) - 1).tolist()
    assert all(r.reason for c in chunks for r in c.invalid)
    for p, i in enumerate(order.tolist()):
        if i < len(alone):
            assert np.array_equal(got[p][0], alone[i][0]) and got[p][1] == alone[i][1]


def test_damaged_parquet_with_decode_is_invalid_records_not_a_traceback(tmp_path, capsys):
    """The encoded check read the file's first values without catching a read error: a
    damaged first row group was a traceback (exit 1). Its records are invalid now, as
    with decode none, and the values of the other groups are deduplicated."""
    src = tmp_path / "in" / "a.parquet"
    src.parent.mkdir()
    values = [f"value {i % 3}".encode() for i in range(40)]
    pq.write_table(pa.table({"b": pa.array(values, pa.binary())}), src, row_group_size=20,
                   compression="none", use_dictionary=False)
    meta = pq.ParquetFile(src).metadata.row_group(0).column(0)
    raw = bytearray(src.read_bytes())
    start, size = meta.data_page_offset, meta.total_compressed_size
    raw[start + 4: start + size - 4] = b"\xff" * (size - 8)  # garble row group 0's page
    src.write_bytes(bytes(raw))
    code = run(tmp_path, {"format": "parquet", "path": str(src), "tensor": "b",
                          "decode": "bytes"}, max_invalid_fraction=1.0)
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    _, invalid, summary = reports(tmp_path)
    assert (summary["read"], summary["kept"], summary["invalid"]) == (40, 3, 20)
    assert [r["record_id"] for r in invalid] == [f"{src}:{i}" for i in range(20)]
    assert all(r["reason"].startswith("unreadable row group 0: ") for r in invalid)


def test_null_text_is_reported_as_no_text(tmp_path):
    """A null in a text column read "null (no bytes and no path)", the words for a
    Hugging Face Image() struct."""
    src = tmp_path / "a.parquet"
    pq.write_table(pa.table({"t": ["a", None, "a"], "b": pa.array([b"x", None, b"x"])}), src)
    (tmp_path / "t").mkdir(), (tmp_path / "b").mkdir()
    for column, words in (("t", "null (no text)"), ("b", "null (no bytes)")):
        kind = "text" if column == "t" else "bytes"
        assert run(tmp_path / column, {"format": "parquet", "path": str(src), "tensor": column,
                                       "decode": kind}, max_invalid_fraction=1.0) == 0
        _, invalid, _ = reports(tmp_path / column)
        assert [r["reason"] for r in invalid] == [f"column {column!r}: {words}"]


def test_utf16_text_is_invalid_with_a_reason_that_names_it(tmp_path):
    """Texts written as UTF-16 (Windows tools, `str.encode("utf-16")`) in a binary column:
    invalid records whose reason names the byte-order mark and the fix, where it said only
    "invalid start byte at byte 0"."""
    src = tmp_path / "a.parquet"
    texts = ["The first text of the set", "A second and different one", "Third"]
    pq.write_table(pa.table({"t": pa.array([texts[0].encode(), texts[1].encode("utf-16"),
                                            texts[2].encode("utf-16-be").join([b"\xfe\xff", b""]),
                                            b"caf\xe9"])}), src)
    (tmp_path / "out").mkdir()
    assert run(tmp_path / "out", {"format": "parquet", "path": str(src), "tensor": "t",
                                  "decode": "text"}, max_invalid_fraction=1.0) == 0
    _, invalid, summary = reports(tmp_path / "out")
    assert summary["invalid"] == 3
    reasons = [r["reason"] for r in invalid]
    assert reasons[:2] == ["'t': not UTF-8 text (invalid start byte at byte 0; it starts with a "
                           "UTF-16 byte-order mark: write the texts as UTF-8)"] * 2
    assert "UTF-16" not in reasons[2] and "not UTF-8 text" in reasons[2]


def test_utf16_text_without_a_byte_order_mark_is_invalid_not_one_letter_words(tmp_path):
    """UTF-16 of ASCII text without its byte-order mark (`encode("utf-16-le")`) is valid
    UTF-8 with a NUL after every letter: it was read as a text of one-letter words and
    compared so. Now invalid with the reason, in a binary column and a string column
    alike; a text with one stray NUL is still a text."""
    texts = ["the quick brown fox jumps over the lazy dog and runs away",
             "a lazy dog jumps over the quick brown fox and then sleeps",
             "one stray\0NUL in a text stays a text"]
    values = [texts[2].encode(), texts[0].encode("utf-16-le"), texts[1].encode("utf-16-be")]
    for column in ("b", "s"):
        src = tmp_path / f"{column}.parquet"
        data = (pa.array(values) if column == "b" else
                pa.array([v.decode("utf-8") for v in values], pa.string()))
        pq.write_table(pa.table({column: data}), src)
        out = tmp_path / column
        out.mkdir()
        assert run(out, {"format": "parquet", "path": str(src), "tensor": column,
                         "decode": "text"}, max_invalid_fraction=1.0,
                   near={"metric": "jaccard", "threshold": 0.8}) == 0
        duplicates, invalid, summary = reports(out)
        assert (summary["kept"], summary["invalid"], duplicates) == (1, 2, [])
        n = len(texts[0]) * 2
        assert [r["reason"] for r in invalid] == [
            f"{column!r}: not UTF-8 text ({n // 2} of its {n} characters are NUL, as in "
            "UTF-16 text without a byte-order mark: write the texts as UTF-8)"] * 2


def test_damaged_images_at_the_start_are_invalid_records_not_a_wrong_setting(tmp_path, capsys):
    """A partly downloaded shard: its first 12 of 60 JPEGs truncated (most of the first 20
    the check tries; 20%, within max_invalid_fraction). They start as JPEGs do, so the
    setting is right: the job runs and reports them (it stopped before any work, advising
    decode: bytes or text). Values of another kind still tell a wrong setting. A 0-byte
    value's reason says so."""
    jpegs = [encode(im, "JPEG", quality=90) for im in crops(60, seed=8)]
    values = [j[:len(j) // 2] for j in jpegs[:12]] + jpegs[12:59] + [b""]
    pq.write_table(pa.table({"img": pa.array(values, pa.binary())}), tmp_path / "a.parquet")
    assert run(tmp_path, {"format": "parquet", "path": str(tmp_path / "a.parquet"),
                          "tensor": "img", "decode": "image"}, max_invalid_fraction=0.25) == 0
    _, invalid, summary = reports(tmp_path)
    reasons = {int(r["record_id"].rsplit(":", 1)[1]): r["reason"] for r in invalid}
    assert sorted(reasons) == [*range(12), 59] and summary["kept"] == 47
    assert all("truncated JPEG" in reasons[i] for i in range(12)), reasons
    assert reasons[59].endswith("(it is empty: 0 bytes)"), reasons[59]
    texts = [b"caption %d" % i for i in range(20)]
    pq.write_table(pa.table({"img": pa.array(texts, pa.binary())}), tmp_path / "b.parquet")
    assert run(tmp_path, {"format": "parquet", "path": str(tmp_path / "b.parquet"),
                          "tensor": "img", "decode": "image"}) == 2
    assert "is no image" in capsys.readouterr().err


def test_flat_pictures_in_other_containers_are_exact_copies_in_bytes_mode(tmp_path):
    """Blank and placeholder pictures (one colour) saved again as PNG, BMP, JPEG, WebP,
    GIF: near search never finds a flat picture near anything, so with exact_on: bytes
    every copy was kept. Their exact digest is their pixels' in both modes: the same
    removals as exact_on: pixels, which the Pillow-decoded pixels say (the oracle). Photo
    tiles still compare by bytes (a PNG and a BMP of one tile: not an exact copy)."""
    white, grey = np.full((64, 64, 3), 255, np.uint8), np.full((64, 64, 3), 200, np.uint8)
    small_white = np.full((48, 64, 3), 255, np.uint8)  # another size: never a copy
    tile = crops(1, seed=9)[0]
    values = [encode(white), encode(white, "BMP"), encode(white, "JPEG", quality=90),
              encode(white, "WEBP", lossless=True), encode(grey), encode(grey, "JPEG",
                                                                        quality=75),
              encode(grey, "GIF"), encode(small_white), encode(tile), encode(tile, "BMP")]
    decoded = [np.asarray(Image.open(__import__("io").BytesIO(v)).convert("RGB"))
               for v in values]
    want = oracle_exact(decoded[:8])  # the flat ones: copies by their pixels
    assert len(want) == 5
    pq.write_table(pa.table({"img": pa.array(values, pa.binary())}), tmp_path / "a.parquet")
    got = {}
    for mode in ("pixels", "bytes"):
        assert run(tmp_path, {"format": "parquet", "path": str(tmp_path / "a.parquet"),
                              "tensor": "img", "decode": "image", "resize": [32, 32],
                              "exact_on": mode},
                   near={"metric": "correlation", "threshold": 0.02},
                   output={"path": str(tmp_path / "out" / "clean"), "overwrite": True}) == 0
        dups, _, _ = reports(tmp_path)
        got[mode] = {d["row"]: d["duplicate_of_row"] for d in dups if d["kind"] == "exact"}
    assert got["bytes"] == want and got["pixels"] == {**want, 9: 8}
