"""Arrow IPC input (``input.format: arrow``): the same removals as the same rows in
Parquet, clean copies of the input's kind holding the kept rows with the schema and its
metadata, a stream cut short read up to the cut.

Files are written as users get them: streams of small record batches with a Hugging
Face ``datasets`` schema metadata (as ``save_to_disk`` writes them), IPC files by
``pyarrow.ipc.new_file``; read back by pyarrow's IPC readers. The Parquet twin's job is
the oracle of the decisions (its readers are checked against brute force elsewhere).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import imagekit
from tests.jobkit import report, run_job
from tests.textkit import crawl_corpus, token_ids

HF_META = {"huggingface": json.dumps({"info": {"features": {"id": {"dtype": "string",
                                                                   "_type": "Value"}}}})}


def _write(path, table: pa.Table, kind: str, batch: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(str(path),
                                                                     table.schema) as w:
        for b in table.to_batches(max_chunksize=batch):
            w.write_batch(b)


def _read(path) -> pa.Table:
    source = pa.memory_map(str(path))
    head = source.read(6)
    source.seek(0)
    return (pa.ipc.open_file if head == b"ARROW1" else pa.ipc.open_stream)(source).read_all()


def _twin_jobs(tmp_path, table: pa.Table, kind: str, tensor: str, batch: int, **cfg
               ) -> tuple[list, list, list]:
    """``table`` as three Arrow files of ``kind`` (batches of ``batch`` rows) and as three
    Parquet files: each job's (record_id, duplicate_of, kind), and the Arrow files."""
    table = table.replace_schema_metadata(HF_META)
    files, got = [], []
    for k, idx in enumerate(np.array_split(np.arange(table.num_rows), 3)):
        part = table.take(pa.array(idx))
        files.append(tmp_path / "a" / "in" / f"data-{k:05d}-of-00003.arrow")
        _write(files[-1], part, kind, batch)
        (tmp_path / "p" / "in").mkdir(parents=True, exist_ok=True)
        pq.write_table(part, tmp_path / "p" / "in" / f"part-{k}.parquet", row_group_size=40)
    extra = cfg.pop("input", {})
    for fmt, where, glob in (("arrow", "a", "*.arrow"), ("parquet", "p", "*.parquet")):
        assert run_job(tmp_path / where, fmt, str(tmp_path / where / "in" / glob),
                       "tuning.chunk_rows=64", input={"tensor": tensor, "id": "id", **extra},
                       **cfg) == 0
        dups, invalid = report(tmp_path / where)
        assert invalid.num_rows == 0
        got.append(sorted((d["record_id"], d["duplicate_of"], d["kind"])
                          for d in dups.to_pylist()))
    return got[0], got[1], files


def _kept_rows(files, removed: set[str]) -> None:
    """Each clean copy is its input's rows without the removed ones, in order, in a file
    of the input's kind, with its schema and metadata."""
    for src in files:
        dst = src.parents[1] / "out" / "clean" / src.name
        assert dst.read_bytes()[:6] == src.read_bytes()[:6]  # an IPC file or a stream
        a, b = _read(src), _read(dst)
        assert b.schema.equals(a.schema, check_metadata=True)
        keep = [i not in removed for i in a.column("id").to_pylist()]
        assert b.equals(a.filter(pa.array(keep)))


@pytest.mark.parametrize("kind", ["stream", "file"])
def test_vectors_in_arrow_give_the_parquet_jobs_removals(tmp_path, kind):
    """3,000 float32 vectors with exact and near copies (l2 0.01), in three Arrow files
    of batches of 100 rows (chunks of 64 cross them): the Parquet twin's removals, and
    clean copies that are the kept rows."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 32)).astype(np.float32)
    x[1::9] = x[::9][:len(x[1::9])]
    x[2::9] = x[::9][:len(x[2::9])] + 0.001
    table = pa.table({"id": [f"r{i}" for i in range(3000)],
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 32)})
    got, want, files = _twin_jobs(tmp_path, table, kind, "emb", 100,
                                  near={"metric": "l2", "threshold": 0.01})
    assert got == want and {k for *_, k in got} == {"exact", "near"} and len(got) > 600
    _kept_rows(files, {r for r, *_ in got})


@pytest.mark.parametrize("what", ["texts", "tokens", "images"])
def test_saved_datasets_give_the_parquet_jobs_removals(tmp_path, what):
    """What ``datasets`` saves: real licence / METADATA texts (jaccard 0.8), their token
    ids (lists of several lengths, jaccard) and Image() structs of PNG bytes with byte
    copies and re-encodes (resized, correlation): the Parquet twin's removals."""
    if what == "images":
        tiles = imagekit.crops(40, 48, 64, seed=2)
        encoded = [imagekit.encode(t) for t in tiles]
        encoded += encoded[:6] + [imagekit.encode(t, "JPEG", quality=95) for t in tiles[6:12]]
        values = pa.array([{"bytes": b, "path": None} for b in encoded],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        cfg = {"input": {"decode": "image", "resize": [32, 32], "channels": 3},
               "near": {"metric": "correlation", "threshold": 0.02}}
    else:
        texts = crawl_corpus()[:400]
        values = (pa.array(texts) if what == "texts" else
                  pa.array([t.tolist() for t in token_ids(texts)], pa.list_(pa.int32())))
        cfg = {"near": {"metric": "jaccard", "threshold": 0.8},
               **({"input": {"decode": "text"}} if what == "texts" else {})}
    table = pa.table({"id": [f"d{i}" for i in range(len(values))], "value": values})
    got, want, files = _twin_jobs(tmp_path, table, "stream", "value", 50, **cfg)
    assert got == want and len(got) >= 6
    _kept_rows(files, {r for r, *_ in got})


def test_a_stream_cut_short_is_read_up_to_the_cut(tmp_path):
    """A stream whose last bytes are missing (a copy interrupted): the records of its
    whole batches are read, the rest is one invalid record with the reason, and the
    clean copy holds the kept records before the cut; a stream cut inside its first
    batch is an unreadable file, no record. read = kept + removed + invalid."""
    texts = crawl_corpus()[:120]
    table = pa.table({"id": [f"d{i}" for i in range(120)], "text": texts})
    _write(tmp_path / "in" / "cut.arrow", table, "stream", 10)
    data = (tmp_path / "in" / "cut.arrow").read_bytes()
    (tmp_path / "in" / "cut.arrow").write_bytes(data[:len(data) // 2])
    _write(tmp_path / "in" / "first.arrow", table.slice(0, 30), "stream", 30)
    data = (tmp_path / "in" / "first.arrow").read_bytes()
    (tmp_path / "in" / "first.arrow").write_bytes(data[:len(data) - 100])
    assert run_job(tmp_path, "arrow", str(tmp_path / "in" / "*.arrow"),
                   input={"tensor": "text", "id": "id", "decode": "text"},
                   max_invalid_fraction=1.0) == 0
    _, invalid = report(tmp_path)
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    (bad,) = invalid.to_pylist()
    at = int(bad["record_id"].rsplit(":", 1)[1])
    assert 0 < at < 120 and at % 10 == 0
    assert bad["reason"].startswith("the file cannot be read from here on (")
    assert summary["read"] == at + 1 == summary["kept"] + summary["removed_exact"] + 1
    (first,) = summary["unreadable_files"]
    assert first["path"].endswith("first.arrow") and "unreadable Arrow IPC file" in first[
        "reason"]
    kept = _read(tmp_path / "out" / "clean" / "cut.arrow").column("id").to_pylist()
    removed = set(report(tmp_path)[0].column("record_id").to_pylist())
    assert kept == [f"d{i}" for i in range(at) if f"d{i}" not in removed]


def test_checks_before_any_work(tmp_path, capsys):
    """Exit 2 before any work, one line each: a saved dataset read as Parquet (set
    input.format: arrow); its save_to_disk metadata files in the glob (narrow it to the
    .arrow files); input.format: feather (read as arrow); token id lists of several
    lengths under an l2 near stage (distances need one size: jaccard named); then the
    narrowed glob runs."""
    from tests.test_checks import nothing_written, one_error_line

    texts = crawl_corpus()[:60]
    table = pa.table({"id": [f"d{i}" for i in range(60)],
                      "tokens": pa.array([t.tolist() for t in token_ids(texts)],
                                         pa.list_(pa.int32()))})
    folder = tmp_path / "saved"
    _write(folder / "data-00000-of-00001.arrow", table, "stream", 20)
    (folder / "state.json").write_text(json.dumps({"_data_files": [
        {"filename": "data-00000-of-00001.arrow"}]}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    tokens = {"tensor": "tokens", "id": "id"}
    for fmt, glob, extra, want in (
            ("parquet", "*.arrow", {}, "looks like an Arrow IPC file (it starts as an Arrow "
             "IPC stream (Hugging Face save_to_disk) does), not parquet: set input.format: "
             "arrow"),
            ("arrow", "*", {}, "dataset_info.json is a Hugging Face datasets metadata file "
             "(save_to_disk writes dataset_info.json, state.json beside the data), not "
             f"data: narrow input.path to the .arrow files, e.g. '{folder}/*.arrow'"),
            ("feather", "*.arrow", {}, "'feather' is not one of parquet, tfrecord, hdf5, "
             "jsonl, arrow, csv, npy, npz, megatron: Arrow IPC files and streams (Feather v2, "
             "Hugging Face save_to_disk) are read with input.format: arrow"),
            ("arrow", "*.arrow", {"near": {"metric": "l2", "threshold": 0.1}},
             "set near.metric: jaccard")):
        assert run_job(tmp_path, fmt, str(folder / glob), input=tokens, **extra) == 2
        line = one_error_line(capsys)
        assert want in line, line
        assert nothing_written(tmp_path)
    assert run_job(tmp_path, "arrow", str(folder / "*.arrow"), input=tokens,
                   near={"metric": "jaccard", "threshold": 0.8}) == 0
