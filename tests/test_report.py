"""The report's locations and groups (duplicates.parquet, files.parquet) against a
brute-force oracle, read back with the standard readers; rows read back by
``read_rows``; the page's pieces (PNG, thumbnails, sparklines); group ids over records.
The page in a real browser: tests/test_report_page.py."""

from __future__ import annotations

import io
import json
import re
import zlib

import matplotlib.image
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.report import html as report_html
from pipeline.steps.elements import REFERENCE_FILES, digest_hex, group_roots, where_key
from tests.jobkit import EXT, read_output, run_job, write_input
from tests.oracle import canonical_key
from transforms.fingerprint import fingerprint, fingerprint_batch
from transforms.io.formats import get_format
from transforms.io.formats.base import InputError, TensorSpec
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance

SHAPE = (4, 4)
T = 0.5
SPEC = NearSpec("l2", T)


def planted(seed: int, n: int = 240, ref: np.ndarray | None = None) -> np.ndarray:
    """Random records plus exact copies, near copies (L2 0.2), decoys (L2 1.0), and exact
    copies of near copies (an exact copy of a record the near stage removes), of each
    other and of ``ref`` (a reference set)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, *SHAPE)).astype(np.float32)
    pool = base if ref is None else np.concatenate([base, ref])

    def noise(k: int, norm: float) -> np.ndarray:
        z = rng.normal(size=(k, *SHAPE))
        return (norm * z / np.linalg.norm(z.reshape(k, -1), axis=1)[:, None, None]
                ).astype(np.float32)

    k = n // 10
    exact = pool[rng.choice(len(pool), k)]
    near = pool[rng.choice(len(pool), k)] + noise(k, 0.2)
    decoy = pool[rng.choice(len(pool), k)] + noise(k, 1.0)
    x = np.concatenate([base, exact, near, decoy])
    x = x[rng.permutation(len(x))]
    # copies of near copies, after them in input order (the file order is kept below)
    return np.concatenate([x, near[: k // 2]])


def oracle(protected: list[tuple[str, np.ndarray]], records: list[tuple[str, np.ndarray]]
           ) -> dict[str, tuple[str, str]]:
    """{removed id: (kind, duplicate_of)}: exact copies first (protected records kept
    first), then near duplicates (representative, nearest kept record, ties by keep
    order) among the exact survivors, in float64."""
    first: dict[tuple, tuple[str, str]] = {}
    out = {}
    for tier, recs in (("reference", protected), ("new", records)):
        for rid, t in recs:
            key = canonical_key(t)
            if key in first:
                if tier == "new":
                    pid, ptier = first[key]
                    out[rid] = ("exact" if ptier == "new" else f"{ptier}_exact", pid)
            else:
                first[key] = (rid, tier)
    kept: list[tuple[str, np.ndarray, str]] = [(i, t, "reference") for i, t in protected
                                               if first[canonical_key(t)][0] == i]
    for rid, t in records:
        if rid in out:
            continue
        if kept:
            d, ok = exact_distance(np.repeat(t.reshape(1, -1), len(kept), 0),
                                   np.array([k[1].reshape(-1) for k in kept]), SPEC)
            if ok.any():
                j = int(np.flatnonzero(ok)[np.argmin(d[ok])])
                out[rid] = ("near" if kept[j][2] == "new" else f"{kept[j][2]}_near",
                            kept[j][0])
                continue
        kept.append((rid, t, "new"))
    return out


def write_set(root, name: str, fmt: str, x: np.ndarray, files: int
              ) -> list[tuple[str, np.ndarray]]:
    ids = [f"{name}{i}" for i in range(len(x))]
    for f, rows in enumerate(np.array_split(np.arange(len(x)), files)):
        write_input(fmt, root / name / f"part-{f}.{EXT[fmt]}", [ids[i] for i in rows], x[rows],
                    np.arange(len(rows)) % 5)
    return list(zip(ids, x, strict=True))


def read_file(fmt: str, path: str) -> tuple[list[str], np.ndarray]:
    """(ids, tensors) of a whole input file, with the standard reader."""
    ids, tensors, _ = read_output(fmt, path, SHAPE)
    return ids, tensors


def root_of(rid: str, dup: dict[str, dict]) -> str:
    while rid in dup:
        rid = dup[rid]["duplicate_of"]
    return rid


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord", "hdf5"])
def test_duplicates_say_where_records_live_and_their_group(tmp_path, fmt):
    ref_x = np.random.default_rng(99).normal(size=(40, *SHAPE)).astype(np.float32)
    ref_x[7] = ref_x[6]  # the reference set holds a copy of its own: both are kept
    ref = write_set(tmp_path, "ref", "hdf5", ref_x, files=2)
    recs = write_set(tmp_path, "in", fmt, planted(1, ref=ref_x), files=3)
    shape = {"shape": list(SHAPE), "dtype": "float32"} if fmt == "tfrecord" else {}
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{EXT[fmt]}"), input=shape,
                   near={"metric": "l2", "threshold": T},
                   reference={"format": "hdf5", "path": str(tmp_path / "ref" / "*.h5"),
                              "tensor": "emb", "id": "id"}) == 0
    rep = tmp_path / "out" / "report"
    dups = pq.read_table(rep / "duplicates.parquet")
    assert dups.schema.names == ["record_id", "duplicate_of", "kind", "distance",
                                 "duplicate_of_run", "file", "row", "duplicate_of_file",
                                 "duplicate_of_row", "group"]
    rows = dups.to_pylist()
    expect = oracle(ref, recs)
    assert {r["record_id"]: (r["kind"], r["duplicate_of"]) for r in rows} == expect
    kinds = {k for k, _ in expect.values()}
    assert {"exact", "near", "reference_exact", "reference_near"} <= kinds

    files = {r["file"]: r for r in pq.read_table(rep / "files.parquet").to_pylist()}
    assert [f for f, r in files.items() if r["role"] == "input"] == [0, 1, 2]
    assert [f for f, r in files.items() if r["role"] == "reference"] == [
        REFERENCE_FILES, REFERENCE_FILES + 1]
    cache: dict[int, tuple[list[str], np.ndarray]] = {}

    def at(file: int, row: int) -> tuple[str, np.ndarray]:
        if file not in cache:
            f = files[file]
            cache[file] = read_file(fmt if f["role"] == "input" else "hdf5", f["path"])
        ids, tensors = cache[file]
        return ids[row], tensors[row]

    value = dict(recs) | dict(ref)
    for r in rows:
        rid, t = at(r["file"], r["row"])  # the removed record's own file and row
        assert rid == r["record_id"]
        np.testing.assert_array_equal(t.view(np.uint32), value[rid].view(np.uint32))
        sid, s = at(r["duplicate_of_file"], r["duplicate_of_row"])  # the one it duplicates
        assert sid == r["duplicate_of"] and r["duplicate_of_run"] is None
        np.testing.assert_array_equal(s.view(np.uint32), value[sid].view(np.uint32))
        if r["kind"].startswith("reference"):
            assert r["duplicate_of_file"] >= REFERENCE_FILES
        if r["kind"].endswith("near"):
            assert r["distance"] == pytest.approx(
                exact_distance(t.reshape(1, -1), s.reshape(1, -1), SPEC)[0][0], rel=1e-12)
    # group: the fingerprint of the record the whole group keeps, exact and near alike
    dup = {r["record_id"]: r for r in rows}
    for r in rows:
        assert r["group"] == fingerprint(value[root_of(r["record_id"], dup)]).hex()
    chained = [r for r in rows if r["kind"] == "exact" and r["duplicate_of"] in dup]
    assert {dup[r["duplicate_of"]]["kind"] for r in chained} >= {"near"}
    for r in chained:  # an exact copy of a near-removed record joins the near survivor's group
        assert r["group"] == dup[r["duplicate_of"]]["group"] != fingerprint(
            value[r["duplicate_of"]]).hex()
    # the page was written, with the largest group first
    page = (rep / "index.html").read_text()
    assert "data-page-error" not in page
    sizes = {}
    for r in rows:
        sizes[r["group"]] = sizes.get(r["group"], 1) + 1
    biggest = min(sizes, key=lambda g: (-sizes[g], g))
    assert f"<code>{biggest[:12]}</code>" in page
    assert page.index(biggest[:12]) < min(page.index(g[:12]) for g in sizes if g != biggest
                                          and g[:12] in page)


def test_store_kinds_name_the_earlier_run(tmp_path):
    """A survivor of an earlier run has no file or row here (null) and names its run; its
    group is its fingerprint, so it matches the group the earlier run reported."""
    day1 = np.random.default_rng(5).normal(size=(60, *SHAPE)).astype(np.float32)
    rng = np.random.default_rng(6)
    near = day1[10] + np.float32(0.1)
    day2 = np.concatenate([rng.normal(size=(20, *SHAPE)).astype(np.float32),
                           day1[3:4], near[None], near[None], day1[20:21] + np.float32(0.05)])
    write_set(tmp_path, "d1", "parquet", day1, files=1)
    d2 = dict(write_set(tmp_path, "d2", "parquet", day2, files=1))
    for name, run in (("d1", "day1"), ("d2", "day2")):
        assert run_job(tmp_path, "parquet", str(tmp_path / name / "*.parquet"),
                       f"run_id={run}", store={"path": str(tmp_path / "store")},
                       near={"metric": "l2", "threshold": T},
                       output={"path": str(tmp_path / "out" / "clean" / "{run_id}")},
                       report=str(tmp_path / "out" / "report" / "{run_id}")) == 0
    rows = pq.read_table(tmp_path / "out" / "report" / "day2" / "duplicates.parquet").to_pylist()
    got = {r["record_id"]: r for r in rows}
    assert {r["kind"] for r in rows} == {"store_exact", "store_near", "exact"}
    for r in rows:
        assert (r["file"], r["row"]) == (0, int(r["record_id"].removeprefix("d2")))
        if r["kind"].startswith("store"):
            assert r["duplicate_of_file"] is None and r["duplicate_of_row"] is None
            assert r["duplicate_of_run"] == "day1"
            stored = day1[int(r["duplicate_of"].removeprefix("d1"))]
            assert r["group"] == fingerprint(stored).hex()
        else:  # the second copy of the near copy: duplicate of the first, in the store's group
            assert (r["duplicate_of_file"], r["duplicate_of_row"]) == (0, 21)
            assert r["group"] == got[r["duplicate_of"]]["group"] == fingerprint(day1[10]).hex()
    np.testing.assert_array_equal(d2["d221"], near)


# ---------------------------------------------------------------------------- pieces


def test_group_roots_follow_chains_and_digest_hex():
    at = np.array([5, 7, 9, 11], np.int64)
    survivor = np.array([1, 5, 7, -1], np.int64)  # 7 -> 5 -> 1; 9 -> 7 -> 5 -> 1; 11: store
    digest = np.array([[1, 1], [5, 5], [7, 7], [3, 3]], np.uint64)
    assert group_roots(at, survivor, digest).tolist() == [[1, 1], [1, 1], [1, 1], [3, 3]]
    assert where_key(np.array([-1, 2]), np.array([4, 4])).tolist() == [-1, (2 << 40) | 4]
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    words = fingerprint_batch(x).view(">u8").reshape(-1, 2).astype(np.uint64)
    assert digest_hex(words).to_pylist() == [fingerprint(r).hex() for r in x]


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord", "hdf5"])
def test_read_rows_matches_the_standard_reader(tmp_path, fmt):
    x = np.random.default_rng(2).normal(size=(150, *SHAPE)).astype(np.float32)
    path = tmp_path / f"a.{EXT[fmt]}"
    write_input(fmt, path, [f"r{i}" for i in range(len(x))], x, np.zeros(len(x), int),
                row_group_size=32)
    spec = TensorSpec("emb", "id", shape=SHAPE if fmt == "tfrecord" else None,
                      dtype="float32" if fmt == "tfrecord" else None)
    want = [0, 31, 32, 33, 97, 149, 150, 4000]  # the last two are past the end
    got = get_format(fmt).read_rows(str(path), spec, want)
    assert sorted(got) == [0, 31, 32, 33, 97, 149]
    for p, t in got.items():
        np.testing.assert_array_equal(t.reshape(SHAPE), x[p])
    assert get_format(fmt).read_rows(str(tmp_path / "missing"), spec, [0]) == {}


def png_pixels(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, color type, raw rows) of a PNG, by hand (the encoder's inverse)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == int.from_bytes(data[pos + 8 + n:pos + 12 + n], "big")
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    w, h = int.from_bytes(chunks[b"IHDR"][:4], "big"), int.from_bytes(chunks[b"IHDR"][4:8], "big")
    return w, h, chunks[b"IHDR"][9], zlib.decompress(chunks[b"IDAT"])


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3), (5, 7, 4)])
def test_png_round_trip(shape):
    img = np.random.default_rng(1).integers(0, 256, shape).astype(np.uint8)
    w, h, color, raw = png_pixels(report_html.png(img))
    assert (w, h, color) == (7, 5, {2: 0, 3: 2, 4: 6}[len(shape) if len(shape) == 2 else shape[2]])
    stride = 1 + img[0].size
    rows = [raw[y * stride:(y + 1) * stride] for y in range(h)]
    assert all(r[0] == 0 for r in rows)
    assert b"".join(r[1:] for r in rows) == img.tobytes()
    back = matplotlib.image.imread(io.BytesIO(report_html.png(img)), format="png")
    np.testing.assert_array_equal((back * 255).round().astype(np.uint8).reshape(img.shape), img)


@pytest.mark.parametrize("shape,layout", [
    ((8, 8), "hw"), ((28, 28, 1), "hwc"), ((32, 32, 3), "hwc"), ((3, 32, 32), "chw"),
    ((16, 16, 4), "hwc"), ((384,), None), ((2, 3, 5), None), ((1, 384), None), ((), None)])
def test_what_looks_like_an_image(shape, layout):
    assert report_html.image_layout(shape) == layout
    t = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    out = report_html.tensor_html(t, -3.0, 3.0)
    if layout:
        assert out.startswith('<img class="t" src="data:image/png;base64,')
    else:
        assert "<svg" in out or shape == () and "[" in out
        assert str(tuple(shape)) in out


def test_big_images_are_subsampled_and_uint8_kept():
    img = np.arange(512 * 300, dtype=np.uint32).reshape(512, 300) % 251
    out = report_html._as_image(img.astype(np.uint8), "hw", 0, 1)
    assert out.shape == (128, 75) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, img[::4, ::4])


def test_page_without_tensors_or_near(tmp_path):
    """No read-back (ids only), no near stage, no removals: still a page."""
    files = pa.table({"file": pa.array([0], pa.int32()), "path": ["a.parquet"],
                      "role": ["input"]})
    from pipeline.report.tables import DUPLICATES_SCHEMA

    counts = {"read": 3, "kept": 3, "removed_exact": 0, "invalid": 0}
    shown = report_html.write_page(str(tmp_path), counts=counts,
                                   duplicates=DUPLICATES_SCHEMA.empty_table(), files=files)
    page = (tmp_path / "index.html").read_text()
    assert shown == {"groups": 0, "pairs": 0, "tensors": 0}
    assert "No duplicates were removed." in page and 'id="near"' not in page
    data = page.split('id="report-data">')[1].split("</script>")[0]
    assert json.loads(data)["counts"] == counts


def test_records_mode_removals_carry_the_group():
    """Dedup over a user's dicts (one record per batch), keep by a score: the exact copy
    of a near-removed record names that record, in another batch, and carries the near
    survivor's fingerprint as its group."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import BeamAssertException, assert_that

    from pipeline.steps import REMOVED, Dedup, Keep

    rng = np.random.default_rng(3)
    v = rng.normal(size=(6, 8)).astype(np.float32)
    near = v[0] + np.float32(0.05)
    xs = [v[0], near, near, *v[1:], v[2]]
    value = {f"r{i}": x for i, x in enumerate(xs)}
    score = {"r0": 9, "r1": 1, "r2": 2}  # r0 is kept, r2 is the copy exact dedup keeps
    recs = [{"id": i, "x": x, "s": score.get(i, 0)} for i, x in value.items()]

    def check(rows):
        dup = {r["record_id"]: r for r in rows}
        if len(rows) != 3 or sorted(r["kind"] for r in rows) != ["exact", "exact", "near"]:
            raise BeamAssertException(f"removals: {rows}")
        groups = {r["group"] for r in rows}
        for r in rows:
            if r["group"] != fingerprint(value[root_of(r["record_id"], dup)]).hex():
                raise BeamAssertException(f"group of {r}")
        want = {"r1": ("exact", "r2"), "r2": ("near", "r0")}
        if any((dup[i]["kind"], dup[i]["duplicate_of"]) != w for i, w in want.items()):
            raise BeamAssertException(f"removals: {rows}")
        if groups != {fingerprint(v[0]).hex(), fingerprint(v[2]).hex()}:
            raise BeamAssertException(f"groups: {groups}")

    with TestPipeline(runner=FnApiRunner(), blocking=True) as p:
        out = (p | beam.Create(recs) | Dedup(key="x", id="id", near=NearSpec("l2", 0.5),
                                             keep=Keep.max("s"), chunk_rows=1))
        assert_that(out[REMOVED] | beam.Map(
            lambda r: {k: r[k] for k in ("record_id", "kind", "duplicate_of", "group")}), check)


def test_the_page_takes_parquet_tensors_from_the_clean_copy(tmp_path, monkeypatch):
    """A Parquet job's page shows its records' tensors without reading the inputs again:
    the clean copy took them from its own pass (``WriteClean``'s ``show``). With reading
    back made to fail, every card of a near job over two files still has its tensor;
    and the same job with the copy's rows withheld shows none (so the page does need
    them from one of the two)."""
    from transforms.io.formats import parquet

    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x = np.concatenate([x, x[:40] + 0.01, np.repeat(x[:1], 4, axis=0)])
    for f, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
        write_input("parquet", tmp_path / "in" / f"part-{f}.parquet",
                    [f"id-{f}-{i}" for i in rows], x[rows], np.zeros(len(rows), int),
                    row_group_size=64)

    def unreadable(*_a, **_k):
        raise OSError("the report must not read the inputs back")

    monkeypatch.setattr(parquet, "read_rows", unreadable)
    pages = {}
    for name, show in (("copied", True), ("withheld", False)):
        if not show:
            monkeypatch.setattr(parquet, "write_showing", None)
        out = tmp_path / name
        out.mkdir()
        assert run_job(out, "parquet", str(tmp_path / "in" / "*.parquet"),
                       "runner.processes=false",
                       near={"metric": "l2", "threshold": 0.1, "borderline_pairs": 10}) == 0
        pages[name] = (out / "out" / "report" / "index.html").read_text()
    cards = pages["copied"].count('<figure class="rec')
    assert cards > 20 and pages["copied"].count('<svg class="spark"') == cards
    assert "not read back" not in pages["copied"]
    assert pages["withheld"].count("not read back") == cards


def test_report_tables_as_parts_hold_the_same_rows(tmp_path):
    """``tuning.report_file_rows: 0`` (what a run past the limit does): duplicates.parquet
    and invalid.parquet are directories of part-NNNNN.parquet files, one per input file
    with rows, written by the workers; together they hold the same rows, row for row
    (groups followed across files), as the one file a run under the limit writes, and
    pq.read_table, Manifest, RunSummary and the page read them alike."""
    from filters.manifest import Manifest
    from pipeline.report.parts import part_name
    from pipeline.report.summary import RunSummary

    write_set(tmp_path, "in", "parquet", planted(2), files=4)
    for f, row in ((0, 5), (1, 40), (2, None), (3, 7)):  # lists: one short in three files
        path = tmp_path / "in" / f"part-{f}.parquet"
        t = pq.read_table(path)
        emb = t.column("emb").to_pylist()
        if row is not None:
            emb[row] = emb[row][:3]  # an invalid record: 3 x 4 values, not 4 x 4
        pq.write_table(t.set_column(1, "emb", pa.array(emb, pa.list_(pa.list_(pa.float32())))),
                       path)
    reports = {}
    for name, limit in (("one", 1_000_000), ("parts", 0)):
        (tmp_path / name).mkdir()
        assert run_job(tmp_path / name, "parquet", str(tmp_path / "in" / "*.parquet"),
                       input={"shape": list(SHAPE), "dtype": "float32"},
                       near={"metric": "l2", "threshold": T},
                       tuning={"report_file_rows": limit}) == 0
        reports[name] = tmp_path / name / "out" / "report"
    one, parts = reports["one"], reports["parts"]
    for table in ("duplicates.parquet", "invalid.parquet"):
        assert (one / table).is_file() and (parts / table).is_dir()
        whole = pq.read_table(one / table)
        assert whole.num_rows and pq.read_table(parts / table).equals(whole)
        index = {r["path"]: r["file"] for r in pq.read_table(one / "files.parquet").to_pylist()}
        files = sorted(set(whole.column("file").to_pylist())) if "file" in whole.schema.names \
            else sorted({index[s] for s in whole.column("source").to_pylist()})
        assert sorted(p.name for p in (parts / table).iterdir()) == [part_name(f, 4) for f in files]
        for f in files:  # each part: its file's rows, in input order
            part = pq.read_table(parts / table / part_name(f, 4))
            if "file" in part.schema.names:
                assert set(part.column("file").to_pylist()) == {f}
                assert part.column("row").to_pylist() == sorted(part.column("row").to_pylist())
    rows = pq.read_table(one / "duplicates.parquet").to_pylist()
    removed = {r["record_id"]: r for r in rows}
    assert any(r["kind"] == "exact" and r["duplicate_of"] in removed
               and r["file"] != r["duplicate_of_file"] for r in rows)  # a chain across files
    assert Manifest.load(parts).removed_ids.equals(Manifest.load(one).removed_ids)
    assert RunSummary.load(parts).removals().equals(RunSummary.load(one).removals())
    assert RunSummary.load(parts).invalid().equals(RunSummary.load(one).invalid())
    assert [json.loads((r / "summary.json").read_text())["report_parts"] for r in (one, parts)
            ] == [[], ["duplicates.parquet", "invalid.parquet"]]
    codes = [re.findall(r"<code>([0-9a-f]{12})</code>", (r / "index.html").read_text())
             for r in (one, parts)]
    assert codes[0] and codes[0] == codes[1]


def test_show_of_a_tfrecord_list_of_several_sizes_is_one_line(tmp_path):
    """``input.show`` naming a TFRecord number list: one of one size is shown by that size
    (it was refused for want of input.shape); one of several sizes is refused, saying so."""
    import tensorflow as tf

    from pipeline.inputs import show_spec

    path = tmp_path / "a.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(6):
            feat = {"one": tf.train.Feature(int64_list=tf.train.Int64List(value=[i, i])),
                    "many": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * i))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feat))
                    .SerializeToString())
    assert show_spec(str(path), "tfrecord", "one", "input.show", 10.0).decode is None
    with pytest.raises(InputError) as e:
        show_spec(str(path), "tfrecord", "many", "input.show", 10.0)
    assert str(e.value) == (f"{path}: input.show: 'many' holds lists of numbers of several "
                            "sizes: show a text or image feature, or one of numbers of one size")


def _cards(page: str) -> dict[str, str]:
    """{record id: what its card shows} of every record card on the page."""
    return dict(re.findall(r'<figure class="rec[^"]*" data-id="([^"]*)">(.*?)<figcaption>',
                           page, re.S))


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord", "hdf5"])
def test_input_show_puts_another_column_on_the_cards(tmp_path, fmt):
    """``input.show``: the page shows that column of each record (here the ids, a text
    column / bytes feature / bytes dataset) instead of its tensor (sparklines of 16
    numbers, which tell a user nothing of what an embedding stands for)."""
    import html

    rng = np.random.default_rng(9)
    x = rng.normal(size=(200, 16)).astype(np.float32)
    x = np.concatenate([x, x[:30] + 0.01, np.repeat(x[:1], 3, axis=0)])
    ids = [f"doc <{i}> & more" for i in range(len(x))]  # escaped on the page
    for f, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
        write_input(fmt, tmp_path / "in" / f"part-{f}.{EXT[fmt]}", [ids[i] for i in rows],
                    x[rows], np.zeros(len(rows), int))
    glob = str(tmp_path / "in" / f"*.{EXT[fmt]}")
    near = {"metric": "l2", "threshold": 0.1, "borderline_pairs": 10}
    assert run_job(tmp_path, fmt, glob, near=near, input={"show": "id"}) == 0
    cards = _cards((tmp_path / "out" / "report" / "index.html").read_text())
    assert len(cards) > 20
    assert {k: v for k, v in cards.items()  # pairs' cards mark the words that differ
            if re.sub("</?mark>", "", v)
            != f'<div class="text">{html.escape(html.unescape(k))}</div>'} == {}


def test_input_show_pictures_and_a_wrong_name(tmp_path, capsys):
    """An encoded image column shown as pictures; a name the file lacks is one line
    naming input.show (exit 2, before any work)."""
    from tests.imagekit import encode

    rng = np.random.default_rng(10)
    x = rng.normal(size=(120, 8)).astype(np.float32)
    x = np.concatenate([x, x[:20] + 0.01])
    pics = [encode(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)) for _ in x]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(x))],
                             "emb": pa.array(list(x), pa.list_(pa.float32(), 8)),
                             "picture": pa.array(pics, pa.binary())}),
                   tmp_path / "in" / "a.parquet")
    glob = str(tmp_path / "in" / "*.parquet")
    near = {"metric": "l2", "threshold": 0.1, "borderline_pairs": 10}
    assert run_job(tmp_path, "parquet", glob, near=near, input={"show": "pictur"}) == 2
    err = capsys.readouterr().err
    assert err.endswith("input.show: no column 'pictur' (did you mean 'picture'?); the file "
                        "has columns id, emb, picture\n") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    assert run_job(tmp_path, "parquet", glob, near=near, input={"show": "picture"}) == 0
    cards = _cards((tmp_path / "out" / "report" / "index.html").read_text())
    assert len(cards) > 20 and all(v.startswith('<img class="t"') and 'alt="tensor 6x5"' in v
                                   for v in cards.values())
