"""NumPy ``.npy`` input (``input.format: npy``): the same removals as the same rows in
Parquet, clean copies that ``np.load`` reads as the kept rows in the input's dtype, a
file cut short read up to the cut, checks before any work.

Files are written by ``np.save`` as users get them: C order, Fortran order
(``np.save(f, a.T)``), big-endian, float16, ml_dtypes' bfloat16 (saved as raw ``V2``),
uint16 token windows. The Parquet twin's job is the oracle of the decisions (its
readers are checked against brute force elsewhere); record ids are ``<file>:<row>`` in
both, compared by file stem and row.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline.run import main
from tests import fakefs
from tests.jobkit import report
from tests.test_checks import nothing_written, one_error_line
from tests.textkit import crawl_corpus, token_ids


def _job(tmp_path: Path, fmt: str, glob: str, *sets: str, args: tuple = (), **cfg) -> int:
    doc = {"input": {"format": fmt, "path": glob, **cfg.pop("input", {})},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), **cfg}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    return main(["--config", str(tmp_path / "job.yaml"), "--quiet", *args,
                 *[a for s in sets for a in ("--set", s)]])


def _row(record_id: str | None) -> str | None:
    """``…/in/part-1.npy:17`` -> ``part-1:17`` (the same record in either format)."""
    if record_id is None:
        return None
    path, _, row = record_id.rpartition(":")
    return f"{Path(path).stem}:{row}"


def _decisions(tmp_path: Path) -> list[tuple]:
    dups, invalid = report(tmp_path)
    assert invalid.num_rows == 0
    return sorted((_row(d["record_id"]), _row(d["duplicate_of"]), d["kind"])
                  for d in dups.to_pylist())


def _twin(tmp_path: Path, arrays: list[np.ndarray], value: pa.DataType | None,
          *sets: str, **cfg) -> tuple[list, list]:
    """The Parquet twin of ``arrays`` (one file each, ``value``: the Arrow type of a row
    where not a fixed-size list of the array's values) and its job's decisions, beside
    the npy job's (its files already written under ``tmp_path/n/in``)."""
    (tmp_path / "p" / "in").mkdir(parents=True)
    for k, a in enumerate(arrays):
        rows = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("="))
        col = (pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), rows.shape[1])
               if value is None else pa.array(rows.tolist(), value))
        pq.write_table(pa.table({"emb": col}), tmp_path / "p" / "in" / f"part-{k}.parquet",
                       row_group_size=500)
    got = []
    for fmt, where, glob, extra in (("npy", "n", "*.npy", {}),
                                    ("parquet", "p", "*.parquet", {"tensor": "emb"})):
        inp = {**cfg.get("input", {}), **extra}
        assert _job(tmp_path / where, fmt, str(tmp_path / where / "in" / glob), *sets,
                    **{**cfg, "input": inp}) == 0
        got.append(_decisions(tmp_path / where))
    return got[0], got[1]


def _kept_rows(tmp_path: Path, arrays: list[np.ndarray], removed: set[str]) -> None:
    """Each clean copy is its input's rows without the removed ones, in order, with the
    input's dtype as np.save writes it (byte order included; bfloat16 as V2), in C order."""
    for k, a in enumerate(arrays):
        out = np.load(tmp_path / "out" / "clean" / f"part-{k}.npy", allow_pickle=False)
        keep = [f"part-{k}:{i}" not in removed for i in range(len(a))]
        saved = np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(a.dtype))
        assert out.dtype == saved and out.flags.c_contiguous
        np.testing.assert_array_equal(out.view(np.uint8), np.ascontiguousarray(a[keep])
                                      .view(np.uint8))


def _clustered(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Embedding-like rows: 64 topics, unit vectors, with exact and near copies planted
    (near: cosine 0.0005-0.005 from their source)."""
    topics = rng.standard_normal((64, d))
    x = topics[rng.integers(0, 64, n)] + 0.35 * rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    src = rng.choice(n, n // 10, replace=False)
    dst = rng.choice(np.setdiff1d(np.arange(n), src), n // 10, replace=False)
    half = len(dst) // 2
    x[dst[:half]] = x[src[:half]]
    noise = rng.standard_normal((len(dst) - half, d))
    noise *= (np.sqrt(2 * rng.uniform(0.0005, 0.005, len(noise))) /
              np.linalg.norm(noise, axis=1))[:, None]
    x[dst[half:]] = x[src[half:]] + noise
    return x.astype(np.float32)


def test_embeddings_in_npy_give_the_parquet_jobs_removals(tmp_path):
    """12,000 clustered 48-d embeddings with exact and near copies (cosine 0.01) in three
    .npy files as np.save writes them (C order, Fortran order, big-endian), read in
    units of 3,000 rows and chunks of 1,000: the Parquet twin's removals, and clean
    copies that are the kept rows in each input's dtype."""
    x = _clustered(np.random.default_rng(0), 12_000, 48)
    arrays = [x[:5000], np.asfortranarray(x[5000:9000]), x[9000:].astype(">f4")]
    (tmp_path / "n" / "in").mkdir(parents=True)
    for k, a in enumerate(arrays):
        np.save(tmp_path / "n" / "in" / f"part-{k}.npy", a)
    assert np.load(tmp_path / "n" / "in" / "part-1.npy").flags.f_contiguous
    got, want = _twin(tmp_path, arrays, None, "tuning.chunk_rows=1000",
                      "tuning.unit_rows=3000", near={"metric": "cosine", "threshold": 0.01})
    assert got == want and {k for *_, k in got} == {"exact", "near"} and len(got) > 1000
    _kept_rows(tmp_path / "n", arrays, {r for r, *_ in got})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_arrays_lose_exactly_their_copies(tmp_path, dtype):
    """float16 and ml_dtypes' bfloat16 (np.save writes it as raw V2: read with
    input.dtype: bfloat16): exact dedup removes every row whose bytes an earlier row has,
    and no other (numpy's unique over the rows' bytes is the oracle)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6000, 24)).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    x[rng.choice(6000, 900)] = x[rng.choice(6000, 900)]
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "part-0.npy", x)
    extra = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    assert _job(tmp_path, "npy", str(tmp_path / "in" / "*.npy"), input=extra) == 0
    rows = x.view(np.uint8).reshape(len(x), -1)
    _, first = np.unique(rows, axis=0, return_index=True)
    want = sorted(set(range(len(x))) - set(first.tolist()))
    dups, _ = report(tmp_path)
    assert sorted(int(r.rsplit(":", 1)[1]) for r in dups.column("record_id").to_pylist()) == want
    _kept_rows(tmp_path, [x], {f"part-0:{i}" for i in want})


def test_token_windows_under_jaccard_give_the_parquet_jobs_removals(tmp_path):
    """Pretokenized windows (uint16, 128 tokens, zero-padded) of real licence and METADATA
    texts with edited copies, under jaccard 0.7: the removals of the same windows as
    Parquet lists of token ids."""
    ids = token_ids(crawl_corpus())
    windows = np.zeros((len(ids), 128), np.uint16)
    for i, t in enumerate(ids):
        windows[i, :min(128, len(t))] = t[:128]
    arrays = np.array_split(windows, 2)
    (tmp_path / "n" / "in").mkdir(parents=True)
    for k, a in enumerate(arrays):
        np.save(tmp_path / "n" / "in" / f"part-{k}.npy", a)
    got, want = _twin(tmp_path, arrays, pa.list_(pa.uint16()),
                      near={"metric": "jaccard", "threshold": 0.7})
    assert got == want and len(got) >= 50
    _kept_rows(tmp_path / "n", arrays, {r for r, *_ in got})


def test_a_file_cut_short_keeps_its_whole_rows(tmp_path):
    """A .npy file whose end is missing (a copy interrupted inside a row): its whole rows
    are read, the rest is one invalid record with the reason, the clean copy holds the
    kept whole rows; read = kept + removed + invalid, and the dry run counts the same
    records from the header."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, (4000, 8)).astype(np.int32)  # many exact copies
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "part-0.npy", x)
    data = (tmp_path / "in" / "part-0.npy").read_bytes()
    cut = 128 + 2500 * 32 + 7  # 2,500 whole rows, then 7 bytes of the next
    (tmp_path / "in" / "part-0.npy").write_bytes(data[:cut])
    np.save(tmp_path / "in" / "part-1.npy", np.asfortranarray(x[:100]))  # no whole row
    data = (tmp_path / "in" / "part-1.npy").read_bytes()
    (tmp_path / "in" / "part-1.npy").write_bytes(data[:-5])
    assert _job(tmp_path, "npy", str(tmp_path / "in" / "*.npy"), "tuning.unit_rows=1000",
                max_invalid_fraction=1.0) == 0
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    dups, invalid = report(tmp_path)
    bad, fortran = sorted(invalid.to_pylist(), key=lambda r: r["record_id"])
    assert bad["record_id"].endswith("part-0.npy:2500")
    assert "records 2,500 to 3,999 (1,500) are missing" in bad["reason"]
    assert fortran["record_id"].endswith("part-1.npy:0")
    assert "records 0 to 99 (100) are missing" in fortran["reason"]
    assert summary["read"] == 2502 == summary["kept"] + dups.num_rows + 2
    assert np.load(tmp_path / "out" / "clean" / "part-1.npy").shape == (0, 8)
    removed = {_row(r) for r in dups.column("record_id").to_pylist()}
    _, first = np.unique(x[:2500], axis=0, return_index=True)
    assert removed == {f"part-0:{i}" for i in set(range(2500)) - set(first.tolist())}
    _kept_rows(tmp_path, [x[:2500]], removed)


@pytest.mark.parametrize("fmt", ["npy", "npz"])
def test_remote_run_equals_local_run(tmp_path, monkeypatch, fmt):
    """The same files in an object store (fake gs://, ranged reads), .npy files and .npz
    archives (one stored, one compressed): the same report and the same clean bytes as
    the local run."""
    url = fakefs.bucket(monkeypatch, tmp_path / "gcs")
    bucket = tmp_path / "gcs" / url.removeprefix(f"{fakefs.SCHEME}://")
    x = _clustered(np.random.default_rng(3), 3000, 16)
    for where in (tmp_path / "local" / "in", bucket / "in"):
        where.mkdir(parents=True)
        if fmt == "npy":
            np.save(where / "part-0.npy", x[:1800])
            np.save(where / "part-1.npy", x[1800:].astype(">f4"))
        else:
            np.savez(where / "part-0.npz", emb=x[:1800], n=np.arange(1800))
            np.savez_compressed(where / "part-1.npz", emb=x[1800:], n=np.arange(1800, 3000))
    near = {"metric": "cosine", "threshold": 0.01}
    local, remote = tmp_path / "local", tmp_path / "remote"
    remote.mkdir()
    for where, glob in ((local, str(local / "in" / f"*.{fmt}")), (remote, f"{url}/in/*.{fmt}")):
        doc = {"input": {"format": fmt, "path": glob, **({"tensor": "emb", "id": "n"}
                                                          if fmt == "npz" else {})},
               "output": {"path": f"{url}/out/clean" if where is remote else
                          str(where / "out" / "clean")},
               "report": f"{url}/out/report" if where is remote else str(where / "out" / "report"),
               "runner": {"processes": False}, "near": near}
        (where / "job.yaml").write_text(yaml.safe_dump(doc))
        assert main(["--config", str(where / "job.yaml"), "--quiet",
                     "--set", "tuning.unit_rows=500"]) == 0
    for name in (f"part-0.{fmt}", f"part-1.{fmt}"):
        assert (bucket / "out" / "clean" / name).read_bytes() == (
            local / "out" / "clean" / name).read_bytes()
    a, b = (sorted((_row(d["record_id"]), _row(d["duplicate_of"]), d["kind"]) for d in
                   pq.read_table(p / "report" / "duplicates.parquet").to_pylist())
            for p in (local / "out", bucket / "out"))
    assert a == b and len(a) > 200


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_archives_give_the_parquet_jobs_removals(tmp_path, compressed):
    """Embeddings saved with their ids, a score, a label and metadata by np.savez (members
    stored: read by row ranges) or np.savez_compressed (read in order), keep the highest
    score, cosine 0.01: the removals of the same rows in Parquet with those columns; each
    clean archive holds every array with a row per record without the removed rows, the
    others as they were, each member compressed as it was."""
    rng = np.random.default_rng(4)
    x = _clustered(rng, 9000, 32)
    ids = np.array([f"doc-{i:05d}" for i in range(len(x))])
    score = rng.integers(0, 5, len(x)).astype(np.float64)
    label = rng.integers(0, 10, len(x)).astype(np.int16)
    save = np.savez_compressed if compressed else np.savez
    (tmp_path / "n" / "in").mkdir(parents=True)
    (tmp_path / "p" / "in").mkdir(parents=True)
    parts = np.array_split(np.arange(len(x)), 3)
    for k, rows in enumerate(parts):
        save(tmp_path / "n" / "in" / f"part-{k}.npz", emb=x[rows], ids=ids[rows],
             score=score[rows], label=label[rows], classes=np.arange(10), dim=np.int64(32))
        pq.write_table(pa.table({"ids": ids[rows], "emb": pa.FixedSizeListArray.from_arrays(
            pa.array(x[rows].reshape(-1)), 32), "score": score[rows]}),
            tmp_path / "p" / "in" / f"part-{k}.parquet", row_group_size=500)
    got = []
    for fmt, where in (("npz", "n"), ("parquet", "p")):
        assert _job(tmp_path / where, fmt, str(tmp_path / where / "in" / f"*.{fmt}"),
                    "tuning.unit_rows=1000", "tuning.chunk_rows=400",
                    input={"tensor": "emb", "id": "ids"}, keep={"max": "score"},
                    near={"metric": "cosine", "threshold": 0.01}) == 0
        dups, invalid = report(tmp_path / where)
        assert invalid.num_rows == 0
        got.append(sorted((d["record_id"], d["duplicate_of"], d["kind"])
                          for d in dups.to_pylist()))
    assert got[0] == got[1] and {k for *_, k in got[0]} == {"exact", "near"}
    removed = {r for r, *_ in got[0]}
    for k, rows in enumerate(parts):
        src = tmp_path / "n" / "in" / f"part-{k}.npz"
        dst = tmp_path / "n" / "out" / "clean" / f"part-{k}.npz"
        with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst) as b:
            assert [(i.filename, i.compress_type) for i in a.infolist()] == [
                (i.filename, i.compress_type) for i in b.infolist()]
        keep = np.array([i not in removed for i in ids[rows]])
        with np.load(src) as a, np.load(dst) as b:
            for name in ("emb", "ids", "score", "label"):
                assert b[name].dtype == a[name].dtype
                np.testing.assert_array_equal(b[name], a[name][keep])
            for name in ("classes", "dim"):
                np.testing.assert_array_equal(b[name], a[name])


def test_checks_before_any_work(tmp_path, capsys):
    """Exit 2 before any work, one line each: Python objects (pickled: never read),
    records with fields, a 0-d array, raw 2-byte values without input.dtype, an .npz
    archive under npy (set npz), an array it lacks (the nearest named), ids it lacks, ids
    that restart in every archive, an array of objects with a row per record (its rows
    cannot be dropped), torch.save and pickle files (never unpickled; named as such), a
    .npy read as Parquet, input.id, keep by a column, a dtype or shape that disagrees,
    jaccard over floats."""
    folder = tmp_path / "in"
    folder.mkdir()
    f32 = np.zeros((10, 4), np.float32)
    for name, value in (("obj", np.array([np.zeros(3), np.zeros(2)], dtype=object)),
                        ("rec", np.zeros(5, [("emb", "f4", (4,)), ("n", "i8")])),
                        ("scalar", np.float32(1)), ("bf", f32.astype(ml_dtypes.bfloat16)),
                        ("f32", f32)):
        np.save(folder / f"{name}.npy", value, allow_pickle=name == "obj")
    np.savez(folder / "saved.npz", emb=f32, label=np.arange(10))
    np.savez(folder / "objects.npz", emb=f32, note=np.array([None] * 10, dtype=object))
    for k in range(2):  # ids that restart in every archive
        np.savez(folder / f"rep-{k}.npz", emb=f32 + k, row=np.arange(10))
    torch.save(torch.zeros(10, 4), folder / "emb.pt")
    with open(folder / "emb.pkl", "wb") as f:
        pickle.dump(f32, f)
    for fmt, name, extra, want in (
            ("npy", "obj.npy", {}, "holds Python objects, which np.save pickles and this job "
             "never unpickles"),
            ("npy", "rec.npy", {}, "holds records with fields ['emb', 'n']: save the field to "
             "compare as an array of its own, e.g. python -c \"import numpy as np; np.save("
             f"'emb.npy', np.load('{folder / 'rec.npy'}')['emb'])\""),
            ("npy", "scalar.npy", {}, "has no axes"),
            ("npy", "bf.npy", {}, "holds raw 2-byte values: np.save writes bfloat16 "
             "(ml_dtypes) so; if these are, set input.dtype: bfloat16"),
            ("npy", "saved.npz", {}, "looks like a NumPy .npz file (it is a ZIP archive of "
             ".npy files, as np.savez writes), not npy: set input.format: npz"),
            ("npz", "saved.npz", {"input": {"tensor": "embs"}}, "no array 'embs' (the archive "
             "has arrays emb, label): did you mean 'emb'?"),
            ("npz", "saved.npz", {"input": {"tensor": "emb", "id": "names"}},
             "input.id: no array 'names'"),
            ("npz", "rep-*.npz", {"input": {"tensor": "emb", "id": "row"}}, "10 of the first "
             "records hold an id an earlier record holds"),
            ("npz", "objects.npz", {"input": {"tensor": "emb"}}, "array 'note' has a row per "
             "record and holds Python objects (pickled): the clean copy could not drop its "
             "rows without unpickling it"),
            ("npy", "emb.pt", {}, "(it is a PyTorch torch.save file (a ZIP archive holding a "
             "pickle); a .npy file starts with \\x93NUMPY): this job never unpickles input"),
            ("npy", "emb.pkl", {}, "(it is a Python pickle (pickle.dump, joblib.dump); a .npy "
             "file starts with \\x93NUMPY): this job never unpickles input"),
            ("parquet", "f32.npy", {"input": {"tensor": "emb"}}, "looks like a NumPy .npy file "
             "(it starts with \\x93NUMPY, as np.save writes), not parquet: set input.format: npy"),
            ("npy", "f32.npy", {"input": {"id": "id"}}, "input.id: a .npy file holds one "
             "array, no column 'id': remove input.id"),
            ("npy", "f32.npy", {"keep": {"max": "score"}}, "keep: a .npy file holds one array, "
             "no column 'score': remove keep"),
            ("npy", "f32.npy", {"input": {"dtype": "float64"}}, "holds float32, not float64: "
             "set input.dtype: float32 or leave it out"),
            ("npy", "f32.npy", {"input": {"shape": [8]}}, "holds records of shape [4], not [8]"),
            ("npy", "f32.npy", {"near": {"metric": "jaccard", "threshold": 0.8}},
             "jaccard compares rows of token ids")):
        assert _job(tmp_path, fmt, str(folder / name), **extra) == 2, name
        line = one_error_line(capsys)
        assert want in line, line
        assert nothing_written(tmp_path)
    assert _job(tmp_path, "npy", str(folder / "f32.npy")) == 0
    assert np.load(tmp_path / "out" / "clean" / "f32.npy").shape == (1, 4)
