"""Checks that came late or not at all (issue 41): each bad input now stops before any
work (exit 2, one line naming the key or file and the fix, nothing written), and a
damaged file of the right format is reported as that file, never counted as a record.

Inputs are written by the real writers (pyarrow, TensorFlow, h5py, Pillow) from real
data: scikit-image's photographs, the texts installed packages ship (their METADATA
files), this repository's README; expected figures are computed from the data here."""

from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.run import main
from tests import imagekit
from tests.jobkit import run_job, write_input
from tests.textkit import RUNNER_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
    / "site-packages"


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def nothing_written(tmp_path: Path) -> bool:
    """No output, report or staging directory: the run stopped before any work."""
    return not (tmp_path / "out").exists()


def texts(n: int) -> list[str]:
    """``n`` real texts: the METADATA files of installed packages (read as UTF-8)."""
    files = sorted(f for f in glob.glob(str(SITE / "*.dist-info" / "METADATA"))
                   if not Path(f).parent.name.startswith(RUNNER_PACKAGES))
    assert len(files) >= n
    return [Path(f).read_text("utf-8", errors="replace") for f in files[:n]]


def photo_crops(n: int, h: int = 32, w: int = 32) -> np.ndarray:
    return np.stack(imagekit.crops(n, h, w, seed=3))


def summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "report" / "summary.json").read_text())


# --- files that are not of input.format ---------------------------------------------------

def _stray(path: Path, kind: str) -> None:
    """A file of no supported format, as globs pick them up beside the data."""
    if kind == "readme":
        path.write_bytes((ROOT / "README.md").read_bytes())
    elif kind == "csv":
        x = photo_crops(20, 4, 4).reshape(20, -1)
        path.write_text("id,value\n" + "".join(f"r{i},{v}\n" for i, v in enumerate(x[:, 0])))
    else:
        path.write_bytes(imagekit.encode(photo_crops(1, 64, 64)[0], "PNG"))


@pytest.mark.parametrize("fmt,name", [("parquet", "docs.jsonl.gz"), ("hdf5", "docs.jsonl")])
def test_json_lines_under_another_format_are_told_to_set_jsonl(tmp_path, capsys, fmt, name):
    """The texts a user has as JSON lines, with another input.format: exit 2 before any
    work naming the format their bytes show; with it and a typo'd field, the nearest
    field's name; then the job reads them."""
    import gzip

    texts = [(ROOT / "README.md").read_text()[:400 * (i % 3 + 1)] for i in range(30)]
    rows = "".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(texts))
    path = tmp_path / "in" / name
    path.parent.mkdir()
    path.write_bytes(gzip.compress(rows.encode()) if name.endswith(".gz") else rows.encode())
    assert run_job(tmp_path, fmt, str(path), input={"tensor": "text", "decode": "text"}) == 2
    line = one_error_line(capsys)
    assert line.endswith(f"{path} looks like a JSON lines file (its first line"
                         f"{' after gzip decompression' if name.endswith('.gz') else ''} is a "
                         f"JSON object), not {fmt}: set input.format: jsonl"), line
    assert nothing_written(tmp_path)
    assert run_job(tmp_path, "jsonl", str(path), input={"tensor": "txt", "decode": "text"}) == 2
    assert one_error_line(capsys).endswith(  # a JSON line has fields, not columns
        f"{path}: input.tensor: no field 'txt' (did you mean 'text'?); its lines have fields "
        "id, text")
    assert run_job(tmp_path, "jsonl", str(path), input={"tensor": "text", "decode": "text"}) == 0
    assert summary(tmp_path)["removed_exact"] == 30 - 3


def test_a_json_array_is_told_how_to_write_json_lines(tmp_path, capsys):
    """JSON written as one array of objects (json.dump, many exporters), not one object
    per line: exit 2 before any work with the command that writes it as JSON lines,
    which, run as given, makes an input the job reads."""
    import subprocess

    path = tmp_path / "in" / "docs.json"
    path.parent.mkdir()
    path.write_text(json.dumps([{"id": f"r{i}", "text": t} for i, t in enumerate(texts(12) * 2)]))
    assert run_job(tmp_path, "jsonl", str(path), input={"tensor": "text", "decode": "text"}) == 2
    line = one_error_line(capsys)
    assert "it holds one JSON array, not JSON lines: write each as one object per line" in line
    assert nothing_written(tmp_path)
    subprocess.run([sys.executable, "-c", line.split('python -c "')[1].split('"')[0]],
                   cwd=path.parent, check=True)
    assert run_job(tmp_path, "jsonl", str(path.parent / "*.jsonl"),
                   input={"tensor": "text", "decode": "text"}) == 0
    assert summary(tmp_path)["removed_exact"] == 12


def test_csv_input_under_another_format_is_told_to_set_csv(tmp_path, capsys):
    """A table a user has as CSV, run with input.format: parquet: exit 2 before any work
    naming input.format: csv, which, set as told, reads every record."""
    path = tmp_path / "in" / "labels.csv"
    path.parent.mkdir()
    path.write_text("id,value\n" + "".join(f"r{i},{i % 7}\n" for i in range(30)))
    assert run_job(tmp_path, "parquet", str(path), input={"tensor": ["value"]}) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.endswith("CSV files are read with input.format: csv"), err
    assert run_job(tmp_path, "csv", str(path), input={"tensor": ["value"]}) == 0
    assert summary(tmp_path)["read"] == 30
    assert summary(tmp_path)["removed_exact"] == 23  # values 0..6: 7 kept


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_a_folder_of_image_files_is_told_how_to_index_them(tmp_path, capsys, fmt):
    """Photos as files in a folder (as imagededup and fastdup take them): exit 2 before
    any work with the command that writes a Parquet index of their paths; run as given,
    with the settings the line names, the job reads the pictures through it and removes a
    byte copy and a re-encode, and the clean copy is the index of the pictures kept."""
    import subprocess

    photos = imagekit.crops(6, 96, 128, seed=5)
    folder = tmp_path / "photos" / "sub"
    folder.mkdir(parents=True)
    for i, p in enumerate(photos):
        (folder / f"p{i}.{'png' if i % 2 else 'jpg'}").write_bytes(
            imagekit.encode(p, "PNG" if i % 2 else "JPEG", **({} if i % 2 else {"quality": 95})))
    (folder / "p0-copy.jpg").write_bytes((folder / "p0.jpg").read_bytes())
    (folder / "p1-q90.jpg").write_bytes(imagekit.encode(photos[1], "JPEG", quality=90))
    pattern = str(tmp_path / "photos" / "**" / "*")
    assert run_job(tmp_path, fmt, pattern, input={"tensor": "image", "decode": "image"}) == 2
    line = one_error_line(capsys)
    assert "8 of 8 files are not" in line and "image files are read through an index" in line
    assert nothing_written(tmp_path)
    command = line.split('python -c "')[1].split('"')[0]
    subprocess.run([sys.executable, "-c", command], cwd=tmp_path, check=True)
    settings = dict(kv.split(": ") for kv in line.split(", and set ")[1].split(" (")[0].split(
        ", "))
    assert settings == {"input.format": "parquet", "input.path": "images.parquet",
                        "input.tensor": "image", "input.id": "id", "input.decode": "image"}
    assert run_job(tmp_path, "parquet", str(tmp_path / "images.parquet"),
                   input={"tensor": "image", "id": "id", "decode": "image",
                          "resize": [32, 32], "channels": 3},
                   near={"metric": "correlation", "threshold": 0.02}) == 0
    dups = {d["record_id"].rsplit("/", 1)[1]: (d["kind"], d["duplicate_of"].rsplit("/", 1)[1])
            for d in pq.read_table(tmp_path / "out" / "report" / "duplicates.parquet").to_pylist()}
    assert dups == {"p0.jpg": ("exact", "p0-copy.jpg"), "p1.png": ("near", "p1-q90.jpg")}
    kept = pq.read_table(tmp_path / "out" / "clean" / "images.parquet").to_pylist()
    assert sorted(Path(r["image"]["path"]).name for r in kept) == [
        "p0-copy.jpg", "p1-q90.jpg", "p2.jpg", "p3.png", "p4.jpg", "p5.png"]
    assert all(Path(r["image"]["path"]).is_file() and r["image"]["bytes"] is None for r in kept)


@pytest.mark.parametrize("fmt,name,kind,words", [
    ("parquet", "README.md", "readme", "it is text: '# tensordedup'"),
    ("parquet", "labels.csv", "csv", "it is text: 'id,value'"),
    ("parquet", "photo.png", "png", "it is a PNG image"),
    ("hdf5", "labels.csv", "csv", "it is text"),
    ("tfrecord", "cover.png", "png", "it is a PNG image"),
])
def test_a_file_of_no_supported_format_in_the_glob_stops_before_any_work(
        tmp_path, capsys, fmt, name, kind, words):
    x = photo_crops(60, 4, 4).reshape(60, -1).astype(np.float32)
    ext = {"parquet": "parquet", "hdf5": "h5", "tfrecord": "tfrecord"}[fmt]
    for k in range(2):
        write_input(fmt, tmp_path / "in" / f"part-{k}.{ext}", [f"r{k}-{i}" for i in range(30)],
                    x[30 * k:30 * (k + 1)], np.arange(30))
    stray = tmp_path / "in" / name
    _stray(stray, kind)
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / "*"), input={"shape": [48]}) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: input.path: {stray} is not a") and words in line
    name = {"parquet": "Parquet", "hdf5": "HDF5", "tfrecord": "TFRecord"}[fmt]
    assert f"narrow input.path to the {name} files" in line
    assert nothing_written(tmp_path)
    stray.unlink()  # without it the same glob runs, every record read once
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / "*"), input={"shape": [48]}) == 0
    assert summary(tmp_path)["read"] == 60


def test_tfrecords_damaged_at_their_start_or_empty_are_still_read(tmp_path, capsys):
    """TFRecord has no magic number: a file whose first record header is damaged (a
    record header further in) is the reader's to report, and an empty file (what
    TensorFlow writes for no records) is an empty input; a PNG beside them is not."""
    x = photo_crops(40, 4, 4).reshape(40, -1).astype(np.float32)
    good = tmp_path / "in" / "a.tfrecord"
    write_input("tfrecord", good, [f"r{i}" for i in range(40)], x, np.arange(40))
    raw = bytearray(good.read_bytes())
    raw[2] ^= 0xFF  # the first record's length: its CRC no longer matches
    good.write_bytes(bytes(raw))
    (tmp_path / "in" / "b.tfrecord").write_bytes(b"")
    _stray(tmp_path / "in" / "c.tfrecord", "png")
    assert run_job(tmp_path, "tfrecord", str(tmp_path / "in" / "*.tfrecord"),
                   input={"shape": [48]}) == 2
    assert "c.tfrecord is not a TFRecord file (it is a PNG image" in one_error_line(capsys)
    (tmp_path / "in" / "c.tfrecord").unlink()
    assert run_job(tmp_path, "tfrecord", str(tmp_path / "in" / "*.tfrecord"),
                   input={"shape": [48]}) == 0
    s = summary(tmp_path)
    assert s["read"] == 40 and s["invalid"] == 1  # the damaged first record, as a region
    invalid = pq.read_table(tmp_path / "out" / "report" / "invalid.parquet").to_pylist()
    assert invalid[0]["reason"].startswith("corrupt bytes at offset 0..")


@pytest.mark.parametrize("fmt", ["parquet", "hdf5"])
def test_an_empty_parquet_or_hdf5_file_is_one_line_naming_it(tmp_path, capsys, fmt):
    """Parquet and HDF5 writers never write 0 bytes (a file with no rows still has its
    header and footer): a 0-byte file is an interrupted write or copy. An HDF5 file
    whose signature lies past a large user block is HDF5."""
    ext = {"parquet": "parquet", "hdf5": "h5"}[fmt]
    x = photo_crops(20, 4, 4).reshape(20, -1).astype(np.float32)
    write_input(fmt, tmp_path / "in" / f"a.{ext}", [f"r{i}" for i in range(20)], x,
                np.arange(20))
    empty = tmp_path / "in" / f"b.{ext}"
    empty.write_bytes(b"")
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{ext}")) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: input.path: {empty} is not a") and "empty (0 bytes)" in line
    assert "remove it or write it again" in line and nothing_written(tmp_path)
    (tmp_path / "in" / f"a.{ext}").unlink()  # the empty file alone: the same line
    assert run_job(tmp_path, fmt, str(empty)) == 2
    assert "empty (0 bytes)" in one_error_line(capsys) and nothing_written(tmp_path)
    if fmt == "hdf5":  # the signature may lie at any power of 2 from 512: past 4 KiB too
        with h5py.File(tmp_path / "in" / "u.h5", "w", userblock_size=8192) as h:
            h.create_dataset("emb", data=x)
            h.create_dataset("id", data=[f"r{i}".encode() for i in range(20)])
        assert (tmp_path / "in" / "u.h5").read_bytes()[8192:8200] == b"\x89HDF\r\n\x1a\n"
        assert run_job(tmp_path, fmt, str(tmp_path / "in" / "u.h5")) == 0
        assert summary(tmp_path)["read"] == 20


# --- a damaged file of the right format ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "hdf5"])
def test_a_damaged_file_is_reported_as_that_file_and_counts_no_record(tmp_path, capsys, fmt):
    ext = {"parquet": "parquet", "hdf5": "h5"}[fmt]
    x = photo_crops(300, 4, 4).reshape(300, -1).astype(np.float32)
    x[150:160] = x[:10]  # exact copies across files
    for k in range(3):
        write_input(fmt, tmp_path / "in" / f"part-{k}.{ext}",
                    [f"r{k}-{i}" for i in range(100)], x[100 * k:100 * (k + 1)], np.arange(100))
    bad = tmp_path / "in" / f"part-2.{ext}"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # keeps its magic
    pattern = str(tmp_path / "in" / f"*.{ext}")
    assert run_job(tmp_path, fmt, pattern, "max_invalid_fraction=0.5") == 0
    s = summary(tmp_path)
    assert s["read"] == 200 and s["invalid"] == 0 and s["kept"] == 190
    assert s["read"] == s["kept"] + s["removed_exact"] + s["invalid"]
    (lost,) = s["unreadable_files"]
    assert lost["path"] == str(bad) and lost["reason"].startswith(
        {"parquet": "unreadable Parquet file: ", "hdf5": "unreadable HDF5 file: "}[fmt])
    entry = next(f for f in s["files"] if f["input"] == str(bad))
    assert (entry["read"], entry["invalid"], entry["output"]) == (0, 0, None)
    assert entry["unreadable"] == lost["reason"]
    assert pq.read_table(tmp_path / "out" / "report" / "invalid.parquet").num_rows == 0
    # one file of three cannot be read at all: more than max_invalid_fraction 0.1
    assert run_job(tmp_path, fmt, pattern, "output.overwrite=true") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "1 of 3 input files cannot be read at all" in line and str(bad) in line


# --- near on records of several sizes -----------------------------------------------------

def _token_lists(n: int) -> tuple[list[list[int]], dict[str, int]]:
    """Token ids of real lines of text (METADATA files): one list per line, as a
    tokenizer's output is stored (list<int32>); empty lines are empty lists."""
    vocab: dict[str, int] = {}
    rows = []
    for text in texts(60):
        for line in text.splitlines():
            rows.append([vocab.setdefault(w, len(vocab)) for w in line.split()])
            if len(rows) == n:
                return rows, vocab
    raise AssertionError("not enough lines")


def test_near_on_token_lists_of_many_lengths_stops_before_any_work(tmp_path, capsys):
    """Token ids (list<int32>, one length per text line) cannot be compared by l2: the
    sizes are quoted before any work; lists of one length (embeddings) still run."""
    rows, _ = _token_lists(3000)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [f"l{i}" for i in range(len(rows))],
                             "emb": pa.array(rows, pa.list_(pa.int32()))}),
                   tmp_path / "in" / "tokens.parquet", row_group_size=2000)
    first = [len(r) for r in rows[:2000]]  # the first row group's lengths
    near = {"metric": "l2", "threshold": 1.0}
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"), near=near) == 2
    line = one_error_line(capsys)
    assert f"the first 2,000 records of {tmp_path / 'in' / 'tokens.parquet'} hold " \
           f"{min(first):,} to {max(first):,} values ({len(set(first)):,} sizes" in line
    assert "set input.shape" in line and "embed section" in line and "jaccard" in line
    assert nothing_written(tmp_path)
    # embeddings stored as list<float> (pandas' way: no fixed size in the schema, one
    # length in the data) are not refused
    x = photo_crops(200, 4, 4).reshape(200, -1).astype(np.float32) / 255
    x[100:110] = x[:10] + 1e-4
    (tmp_path / "one").mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(200)],
                             "emb": pa.array(list(x), pa.list_(pa.float32()))}),
                   tmp_path / "one" / "a.parquet")
    assert run_job(tmp_path, "parquet", str(tmp_path / "one" / "*.parquet"),
                   near={"metric": "l2", "threshold": 0.01}) == 0
    kept: list[np.ndarray] = []  # the oracle: keep first, removed within 0.01 of a kept one
    for v in x.astype(np.float64):
        if not kept or np.linalg.norm(np.array(kept) - v, axis=1).min() > 0.01:
            kept.append(v)
    assert summary(tmp_path)["removed_near"] == len(x) - len(kept) >= 10


def test_a_shape_no_record_has_is_refused_before_any_work(tmp_path, capsys):
    """Pictures stored as nested lists (h, w, c) with input.shape in the other order
    (c, h, w): every record was invalid after all the work ("null, null values, ragged
    or a shape other than [3, 8, 8]"). Refused now, quoting the records' shape; a shape
    some records have still runs (the others invalid, with their reason)."""
    x = photo_crops(60, 8, 8)
    (tmp_path / "in").mkdir()
    rows = x.tolist()
    rows[5] = x[5, :4].tolist()  # one record of another shape
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(60)],
                             "emb": pa.array(rows, pa.list_(pa.list_(pa.list_(pa.uint8()))))}),
                   tmp_path / "in" / "a.parquet", row_group_size=25)
    glob_ = str(tmp_path / "in" / "*.parquet")
    assert run_job(tmp_path, "parquet", glob_, input={"shape": [3, 8, 8]}) == 2
    line = one_error_line(capsys)
    assert "input.shape: no record of the first 25 of" in line
    assert "the most common shape there is [8, 8, 3], 96% of them): set input.shape: " \
           "[8, 8, 3] or leave it out" in line
    assert nothing_written(tmp_path)
    assert run_job(tmp_path, "parquet", glob_, input={"shape": [8, 8, 3]},
                   max_invalid_fraction=0.5) == 0
    assert summary(tmp_path)["invalid"] == 1


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord", "hdf5"])
def test_files_of_two_shapes_under_near_are_refused_before_any_work(tmp_path, capsys, fmt):
    """Two exports of one table at different widths (photo pixels 4x4x3 and 6x6x3,
    flattened) under near: exit 1 after the whole read ("records hold 48 and 108
    values"). Refused now, naming a file of each shape; exact dedup alone still runs."""
    ext = {"parquet": "parquet", "tfrecord": "tfrecord", "hdf5": "h5"}[fmt]
    for name, side in (("a", 4), ("b", 6)):
        x = photo_crops(40, side, side).reshape(40, -1).astype(np.float32)
        write_input(fmt, tmp_path / "in" / f"{name}.{ext}", [f"{name}{i}" for i in range(40)],
                    x, np.zeros(40, int))
    glob_ = str(tmp_path / "in" / f"*.{ext}")
    assert run_job(tmp_path, fmt, glob_, near={"metric": "l2", "threshold": 10.0}) == 2
    assert one_error_line(capsys) == (
        f"error: near: the input files hold records of 2 shapes ({tmp_path}/in/a.{ext}: "
        f"[48], {tmp_path}/in/b.{ext}: [108]); distances compare records of one shape: "
        "point input.path at the files of one shape (a run for each), or remove near "
        "(exact dedup needs none)")
    assert nothing_written(tmp_path)
    assert run_job(tmp_path, fmt, glob_) == 0
    assert summary(tmp_path)["read"] == 80


def test_an_hdf5_group_as_the_tensor_without_near_is_one_line(tmp_path, capsys):
    """Exact dedup alone peeks at the first HDF5 file for token sequences: a group named
    as input.tensor crashed that peek (AttributeError, a traceback) before the check could
    say what it is."""
    (tmp_path / "in").mkdir()
    with h5py.File(tmp_path / "in" / "a.h5", "w") as f:
        f.create_dataset("feat/emb", data=photo_crops(20, 4, 4).reshape(20, -1))
    assert run_job(tmp_path, "hdf5", str(tmp_path / "in" / "*.h5"),
                   input={"tensor": "feat", "id": None}) == 2
    assert one_error_line(capsys).endswith(
        "input.tensor: 'feat' is a group, not a dataset: name a dataset inside it")
    assert nothing_written(tmp_path)


def test_a_dry_run_over_a_column_with_null_records(tmp_path, capsys):
    """The plan's sample of vectors met a batch whose records were all null (a reshape of
    an empty array raised ValueError, with a traceback)."""
    x = photo_crops(60, 4, 4).reshape(60, -1).astype(np.float32)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(60)],
                             "emb": pa.array([None if i % 3 == 0 else v.tolist()
                                              for i, v in enumerate(x)],
                                             pa.list_(pa.float32()))}),
                   tmp_path / "in" / "a.parquet", row_group_size=25)
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   args=("--dry-run",), near={"metric": "l2", "threshold": 1.0},
                   max_invalid_fraction=0.5) == 0
    assert "capacity plan" in capsys.readouterr().out


# --- an l2 threshold no distance can reach ------------------------------------------------

def dry_run(tmp_path: Path, fmt: str, pattern: str, input_keys: dict, **keys) -> int:
    """``--dry-run``: every check of a real run, then the plan; nothing is run."""
    cfg = {"input": {"format": fmt, "path": pattern, "tensor": "emb", **input_keys},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), **keys}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    return main(["--config", str(tmp_path / "job.yaml"), "--dry-run"])


def test_cosine_on_records_of_one_value_is_refused(tmp_path, capsys):
    """A scalar column under cosine: every positive record was removed as a copy of the
    first (58 of 60 records); l2 still runs on it."""
    x = photo_crops(60, 4, 4).reshape(60, -1)[:, :1].astype(np.float32).ravel() + 1
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(60)], "emb": x}),
                   tmp_path / "in" / "a.parquet")
    pattern = str(tmp_path / "in" / "*.parquet")
    for metric, why in (("cosine", "every two of one sign would be at distance 0"),
                        ("correlation", "none would be near anything")):
        assert dry_run(tmp_path, "parquet", pattern, {},
                       near={"metric": metric, "threshold": 0.01}) == 2
        line = one_error_line(capsys)
        assert f"near.metric: {metric} compares the direction of records of several " \
               "values, and these hold one" in line and why in line and "use metric l2" in line
        assert nothing_written(tmp_path)
    assert dry_run(tmp_path, "parquet", pattern, {},
                   near={"metric": "l2", "threshold": 0.5}) == 0


def test_an_l2_threshold_at_or_above_the_largest_distance_is_refused(tmp_path, capsys):
    """uint8 images of 32x32x3 are at most 255 sqrt(3072) = 14,133.5 apart in l2: a
    threshold there or above would remove all but one record."""
    x = photo_crops(50)
    write_input("parquet", tmp_path / "in" / "a.parquet", [f"r{i}" for i in range(50)], x,
                np.arange(50))
    pattern = str(tmp_path / "in" / "*.parquet")
    top = 255 * math.sqrt(32 * 32 * 3)
    for threshold in (1e9, top):
        assert dry_run(tmp_path, "parquet", pattern, {},
                       near={"metric": "l2", "threshold": threshold}) == 2
        line = one_error_line(capsys)
        assert line.startswith(f"error: near.threshold: {threshold:g} is at or above the "
                               f"largest l2 distance two records can have ({top:,.1f}: "
                               "3,072 uint8 values")
        assert nothing_written(tmp_path)
    assert dry_run(tmp_path, "parquet", pattern, {},
                   near={"metric": "l2", "threshold": math.floor(top)}) == 0
    capsys.readouterr()
    # float values have no largest distance; cosine's bound is the config's (2)
    write_input("parquet", tmp_path / "f" / "a.parquet", [f"r{i}" for i in range(50)],
                x.reshape(50, -1).astype(np.float32), np.arange(50))
    assert dry_run(tmp_path, "parquet", str(tmp_path / "f" / "*.parquet"), {},
                   near={"metric": "l2", "threshold": 1e9}) == 0


def test_a_threshold_beyond_decoded_images_is_refused(tmp_path, capsys):
    """Decoded images compare at input.resize: 16x16 RGB is at most 255 sqrt(768) apart."""
    rows = [{"image": {"bytes": imagekit.encode(c, "PNG"), "path": None}, "label": i}
            for i, c in enumerate(imagekit.crops(20, 48, 64, seed=5))]
    imagekit.write_hf_parquet(tmp_path / "in" / "a.parquet", rows)
    top = 255 * math.sqrt(16 * 16 * 3)
    keys = {"tensor": "image", "decode": "image", "resize": [16, 16]}
    assert dry_run(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"), keys,
                   near={"metric": "l2", "threshold": math.ceil(top)}) == 2
    assert f"({top:,.1f}: 768 uint8 values" in one_error_line(capsys)
    assert dry_run(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"), keys,
                   near={"metric": "l2", "threshold": 500}) == 0


# --- a dry run of a text job --------------------------------------------------------------

def test_a_dry_run_of_a_text_job_plans_from_the_texts_sizes(tmp_path, capsys):
    docs = texts(120)
    (tmp_path / "in").mkdir()
    for k in range(3):
        part = docs[40 * k:40 * (k + 1)]
        pq.write_table(pa.table({"id": [f"d{k}-{i}" for i in range(40)], "emb": part}),
                       tmp_path / "in" / f"part-{k}.parquet")
    assert dry_run(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   {"decode": "text", "id": "id"}) == 0
    out = capsys.readouterr().out
    mean = np.mean([len(d.encode("utf-8")) for d in docs])  # every record is sampled
    assert f"  input: 120 records of {round(mean):,} values (" in out
    assert "text: the mean of 120 sampled records)" in out and "wall time: " in out
    assert "input.shape" not in out and nothing_written(tmp_path)


# --- ids that repeat ---------------------------------------------------------------------

def _digits_shards(tmp_path: Path, fmt: str, ids_of) -> np.ndarray:
    """scikit-learn's digits (1,797 x 64) in two shards of ``fmt``, the ids ``ids_of(k, n)``
    for shard k of n records, a hundred rows of shard 0 copied into shard 1."""
    from sklearn.datasets import load_digits

    x = load_digits().data.astype(np.float32)
    parts = [x[:900], np.concatenate([x[900:], x[:100]])]
    for k, part in enumerate(parts):
        write_input(fmt, tmp_path / "in" / f"shard-{k}.{fmt[:2]}", ids_of(k, len(part)),
                    part, np.zeros(len(part), np.int64))
    return x


def test_ids_restarting_in_every_shard_stop_the_run_before_any_work(tmp_path, capsys):
    """Row numbers as ids, restarting in each shard (pandas' index per shard): the job ran,
    and filtering by its report (Manifest.keep_mask) dropped kept records that shared an
    id with a removed one. Now one line, exit 2, naming both records."""
    _digits_shards(tmp_path, "parquet", lambda k, n: [str(i) for i in range(n)])
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.pa")) == 2
    line = one_error_line(capsys)
    assert "shard-0.pa row 0 and" in line and "shard-1.pa row 0 share their input.id 'id'" \
        in line and "remove input.id" in line, line
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("fmt", ["parquet", "hdf5"])
def test_ids_repeated_past_the_first_records_fail_the_run_and_publish_nothing(
        tmp_path, capsys, monkeypatch, fmt):
    """Ids that repeat where no check before the run looks (past the first records of a
    Parquet file, fewer here for time; HDF5 ids are read by the job alone): every
    record's id is checked by the job, which fails before publishing, naming the first
    pair. Unique ids run."""
    import pipeline.inputs

    monkeypatch.setattr(pipeline.inputs, "FIRST_IDS", 100)
    _digits_shards(tmp_path, fmt, lambda k, n: [f"d{i}" for i in range(n)] if k == 0 else
                   [f"d{2000 + i}" for i in range(n - 100)] + [f"d{i}" for i in range(100)])
    glob_ = str(tmp_path / "in" / f"*.{fmt[:2]}")
    assert run_job(tmp_path, fmt, glob_) == 1
    line = one_error_line(capsys)
    assert line.startswith("error: the job failed; nothing was published"), line
    assert "100 records hold an id an earlier record holds" in line, line
    assert f"shard-0.{fmt[:2]} row 0 and" in line and f"shard-1.{fmt[:2]} row 897 share" \
        in line, line
    assert not (tmp_path / "out" / "report").exists()
    _digits_shards(tmp_path, fmt, lambda k, n: [f"d{i + 1000 * k}" for i in range(n)])
    assert run_job(tmp_path, fmt, glob_) == 0
    assert summary(tmp_path)["removed_exact"] >= 100
