"""The job with its input, reference set, output and report on an object store (``fakegs://``,
tests/fakefs.py: no directories, listing by prefix): the same clean shards and reports as the
same job on local paths, reruns that replace the output with nothing left behind, a remote
reference set, summary.json as the mark of a complete run, and the path checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from filters.manifest import Manifest
from pipeline import graph, publish
from pipeline.config import DedupeConfig
from pipeline.preflight import prepare
from pipeline.report import tables as report_step
from pipeline.run import main
from pipeline.steps.elements import VecBatch
from tests import fakefs
from tests.jobkit import EXT, read_output, write_input
from transforms.io import fs
from transforms.io.streams import read_streams, write_streams

FORMATS = ["parquet", "tfrecord", "hdf5", "arrow"]
SHAPE = (2, 3)
# input files at two depths: names below the output keep the inputs' layout
NAMES = ["part-0", "part-1", "sub/part-2"]


class Span(NamedTuple):
    path: str
    offset: int
    size: int


@pytest.fixture
def gcs(tmp_path, monkeypatch) -> tuple[str, Path]:
    """(bucket URL, the local directory behind it)."""
    url = fakefs.bucket(monkeypatch, tmp_path / "gcs")
    return url, tmp_path / "gcs" / url.removeprefix(f"{fakefs.SCHEME}://")


def planted(seed: int, rows: int = 60) -> list[tuple[list[str], np.ndarray]]:
    """(ids, tensors) per file, with exact copies within and across files."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, (len(NAMES) * rows, *SHAPE)).astype(np.float32)
    return [([f"f{f}-{i}" for i in range(rows)], x[f * rows:(f + 1) * rows])
            for f in range(len(NAMES))]


def write_inputs(fmt: str, local: Path, bucket_dir: Path, parts) -> None:
    """The inputs under ``local/in`` (real writers) and the same bytes in the bucket."""
    for name, (ids, t) in zip(NAMES, parts, strict=True):
        write_input(fmt, local / "in" / f"{name}.{EXT[fmt]}", ids, t, np.arange(len(ids)) % 7)
    shutil.copytree(local / "in", bucket_dir / "in", dirs_exist_ok=True)


def run(tmp_path: Path, fmt: str, input_glob: str, out: str, *sets: str, **cfg) -> int:
    """The CLI in-process; output and report are ``out``/clean and ``out``/report."""
    doc = {"input": {"format": fmt, "path": input_glob, "tensor": "emb", "id": "id",
                     **({"shape": list(SHAPE)} if fmt == "tfrecord" else {})},
           "output": {"path": f"{out}/clean"}, "report": f"{out}/report",
           "runner": {"processes": False},  # fakegs:// is registered in this process only
           **cfg}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return main(["--config", str(path), "--quiet", *[a for s in sets for a in ("--set", s)]])


def files_below(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def assert_same_run(fmt: str, local_out: Path, remote_out: Path) -> None:
    """Same clean shards (names, ids, tensors bit for bit, labels) and the same reports."""
    names = files_below(local_out / "clean")
    assert names == files_below(remote_out / "clean") == [f"{n}.{EXT[fmt]}" for n in NAMES]
    for name in names:
        want, got = (read_output(fmt, d / "clean" / name, SHAPE) for d in (local_out, remote_out))
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
        np.testing.assert_array_equal(got[2], want[2])
        if fmt != "hdf5":  # same writer, same input: same bytes (HDF5 headers hold times)
            assert (remote_out / "clean" / name).read_bytes() == (
                local_out / "clean" / name).read_bytes()
    for table in ("duplicates.parquet", "invalid.parquet"):
        assert pq.read_table(remote_out / "report" / table).equals(
            pq.read_table(local_out / "report" / table))
    local, remote = (json.loads((d / "report" / "summary.json").read_text())
                     for d in (local_out, remote_out))
    counts = ("read", "kept", "removed_exact", "removed_near", "invalid")
    assert [remote[k] for k in counts] == [local[k] for k in counts]
    assert [f["output"] for f in remote["files"]] == [f["output"] for f in local["files"]]


def leftovers(bucket_dir: Path) -> list[str]:
    """Staging, swap or temporary objects anywhere in the bucket."""
    return [n for n in files_below(bucket_dir) if any(
        part.startswith(".") for part in n.split("/"))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_remote_run_equals_local_run(tmp_path, gcs, fmt):
    url, bucket_dir = gcs
    parts = planted(1)
    write_inputs(fmt, tmp_path / "local", bucket_dir, parts)
    glob = f"in/**/*.{EXT[fmt]}"  # `**/` also matches no directory, as locally
    assert run(tmp_path, fmt, str(tmp_path / "local" / glob), str(tmp_path / "local" / "out")) == 0
    assert run(tmp_path, fmt, f"{url}/{glob}", f"{url}/out") == 0
    assert_same_run(fmt, tmp_path / "local" / "out", bucket_dir / "out")
    dups = pq.read_table(bucket_dir / "out" / "report" / "duplicates.parquet")
    assert dups.num_rows > 20  # the data holds duplicates
    summary = json.loads((bucket_dir / "out" / "report" / "summary.json").read_text())
    assert (summary["output"], summary["report"]) == (f"{url}/out/clean", f"{url}/out/report")
    assert leftovers(bucket_dir) == []
    # training filters read the finished run's report from the bucket as from a disk
    remote, local = (Manifest.load(p) for p in (f"{url}/out/report",
                                                  tmp_path / "local" / "out" / "report"))
    every_id = [i for ids, _ in parts for i in ids]
    np.testing.assert_array_equal(remote.keep_mask(every_id), local.keep_mask(every_id))
    assert (~remote.keep_mask(every_id)).sum() == dups.num_rows
    assert remote.job_path(f"{url}/in/{NAMES[0]}.{EXT[fmt]}") == f"{url}/in/{NAMES[0]}.{EXT[fmt]}"


def test_rerun_with_overwrite_replaces_the_remote_output(tmp_path, gcs):
    url, bucket_dir = gcs
    write_inputs("parquet", tmp_path / "local", bucket_dir, planted(2))
    assert run(tmp_path, "parquet", f"{url}/in/**/*.parquet", f"{url}/out") == 0
    assert run(tmp_path, "parquet", f"{url}/in/*.parquet", f"{url}/out") == 2  # exists
    # a killed earlier attempt's staging and swap objects are cleared before the run
    for stale in (".clean.staging-1-2/part-0.parquet", ".report.old-3/summary.json"):
        (bucket_dir / "out" / stale).parent.mkdir(parents=True, exist_ok=True)
        (bucket_dir / "out" / stale).write_bytes(b"stale")
    # this run's report tables as the workers' part files (what a run past
    # tuning.report_file_rows writes): objects under a prefix, replacing single files
    assert run(tmp_path, "parquet", f"{url}/in/*.parquet", f"{url}/out", "output.overwrite=true",
               "keep=last", "tuning.report_file_rows=0") == 0
    assert leftovers(bucket_dir) == []
    assert sorted(p.name for p in (bucket_dir / "out" / "report" / "duplicates.parquet").iterdir()
                  ) == ["part-00000.parquet", "part-00001.parquet"]
    assert files_below(bucket_dir / "out" / "clean") == ["part-0.parquet", "part-1.parquet"]
    local_out = tmp_path / "local" / "out"
    assert run(tmp_path, "parquet", str(tmp_path / "local" / "in" / "*.parquet"), str(local_out),
               "keep=last") == 0
    for table in ("duplicates.parquet", "invalid.parquet"):
        assert pq.read_table(bucket_dir / "out" / "report" / table).equals(
            pq.read_table(local_out / "report" / table))
    assert Manifest.load(f"{url}/out/report").removed_ids.equals(
        Manifest.load(local_out / "report").removed_ids)
    summary = json.loads((bucket_dir / "out" / "report" / "summary.json").read_text())
    assert summary["config"]["keep"] == "last" and len(summary["files"]) == 2


def test_failed_remote_runs_publish_nothing_or_no_summary(tmp_path, gcs, monkeypatch):
    """A run that fails before Publish, or in Publish before anything is replaced (its
    summary.json cannot be written), leaves the old run as it was and no staging objects;
    one that dies after swapping its files in leaves no summary.json (the old one is gone
    too); started again, it completes."""
    url, bucket_dir = gcs
    write_inputs("parquet", tmp_path / "local", bucket_dir, planted(3))
    job = (tmp_path, "parquet", f"{url}/in/**/*.parquet", f"{url}/out")
    assert run(*job) == 0
    before = {n: (bucket_dir / n).read_bytes() for n in files_below(bucket_dir)}

    def crash(*_a, **_k):
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as m:
        m.setattr(graph, "write_report", crash)  # after Write filled the staging prefix
        assert run(*job, "output.overwrite=true") == 1
    assert {n: (bucket_dir / n).read_bytes() for n in files_below(bucket_dir)} == before
    with monkeypatch.context() as m:
        m.setattr(report_step, "write_summary", crash)  # written first, before any swap
        assert run(*job, "output.overwrite=true") == 1
    assert {n: (bucket_dir / n).read_bytes() for n in files_below(bucket_dir)} == before
    with monkeypatch.context() as m:
        m.setattr(publish, "_mark_complete", crash)  # the files swapped in, then a crash
        assert run(*job, "output.overwrite=true") == 1
    assert not (bucket_dir / "out" / "report" / "summary.json").exists()
    assert (bucket_dir / "out" / "report" / "duplicates.parquet").exists()
    assert leftovers(bucket_dir) == []
    assert run(*job, "output.overwrite=true") == 0
    assert (bucket_dir / "out" / "report" / "summary.json").exists()
    assert leftovers(bucket_dir) == []


def test_remote_reference_set_and_near_report(tmp_path, gcs):
    url, bucket_dir = gcs
    parts = planted(4)
    write_inputs("parquet", tmp_path / "local", bucket_dir, parts)
    ref = np.concatenate([parts[0][1][:10], parts[2][1][10:20] + np.float32(0.01)])
    write_input("hdf5", tmp_path / "local" / "ref" / "r.h5", [f"r{i}" for i in range(len(ref))],
                ref, np.zeros(len(ref), np.int64))
    shutil.copytree(tmp_path / "local" / "ref", bucket_dir / "ref")
    near = {"metric": "l2", "threshold": 0.05}
    outs = {"local": tmp_path / "local" / "out", "remote": bucket_dir / "out"}
    for root in (str(tmp_path / "local"), url):
        reference = {"format": "hdf5", "path": f"{root}/ref/*.h5", "tensor": "emb", "id": "id"}
        assert run(tmp_path, "parquet", f"{root}/in/**/*.parquet", f"{root}/out",
                   reference=reference, near=near) == 0
    assert_same_run("parquet", outs["local"], outs["remote"])
    kinds = set(pq.read_table(outs["remote"] / "report" / "duplicates.parquet")
                .column("kind").to_pylist())
    assert {"reference_exact", "reference_near"} <= kinds
    for name in ("borderline_pairs.parquet", "reference_invalid.parquet"):
        assert pq.read_table(outs["remote"] / "report" / name).equals(
            pq.read_table(outs["local"] / "report" / name))
    for name in ("near_distances.csv", "near_distances.json", "near_distances.png"):
        assert (outs["remote"] / "report" / name).stat().st_size > 0
    assert (outs["remote"] / "report" / "near_distances.csv").read_bytes() == (
        outs["local"] / "report" / "near_distances.csv").read_bytes()
    assert leftovers(bucket_dir) == []


def test_checks_before_work_read_heads_and_schemas_not_whole_files(tmp_path, gcs):
    """The checks before any work read each input file's first bytes and its schema: on an
    object store those bytes, not the 16 MB (or the whole file) that Beam's GCS reader
    fetches for a read of 4 KiB."""
    url, bucket_dir = gcs
    rng = np.random.default_rng(5)
    for f in range(3):
        write_input("parquet", bucket_dir / "in" / f"p{f}.parquet",
                    [f"f{f}-{i}" for i in range(20_000)],
                    rng.standard_normal((20_000, 32)).astype(np.float32),
                    np.zeros(20_000, np.int64), row_group_size=20_000)
    job = prepare(DedupeConfig.model_validate({
        "input": {"format": "parquet", "path": f"{url}/in/*.parquet", "tensor": "emb",
                  "id": "id"},
        "output": {"path": f"{url}/out/clean"}, "report": f"{url}/out/report"}))
    assert len(job.files) == 3
    for f in range(3):
        local = str(bucket_dir / "in" / f"p{f}.parquet")
        assert fakefs.SIZES[local] > 2 << 20
        assert fakefs.FETCHED[local] <= 256 << 10, fakefs.FETCHED[local]  # 4 KiB, 2 footers


def test_checks_of_json_lines_read_their_first_lines_once(tmp_path, gcs):
    """JSON lines have no schema to read: the checks take the fields' types from each
    file's first lines, and ask for them three or four times (types, first value, ids,
    sequences). On an object store those lines are fetched once per file in small
    ranged reads, not each time through Beam's 16 MB read-ahead (the whole file here)."""
    import gzip

    url, bucket_dir = gcs
    rng = np.random.default_rng(6)
    (bucket_dir / "in").mkdir(parents=True)
    for f in range(3):
        rows = "".join(json.dumps({"id": f"f{f}-{i}", "emb": rng.standard_normal(32).tolist()})
                       + "\n" for i in range(8_000)).encode()
        path = bucket_dir / "in" / f"p{f}.jsonl{'.gz' if f == 2 else ''}"
        path.write_bytes(gzip.compress(rows) if f == 2 else rows)
    job = prepare(DedupeConfig.model_validate({
        "input": {"format": "jsonl", "path": f"{url}/in/*.jsonl*", "tensor": "emb",
                  "id": "id", "dtype": "float32"},
        "output": {"path": f"{url}/out/clean"}, "report": f"{url}/out/report"}))
    assert len(job.files) == 3
    for f in range(3):
        local = str(bucket_dir / "in" / f"p{f}.jsonl{'.gz' if f == 2 else ''}")
        assert fakefs.SIZES[local] > 2 << 20
        assert fakefs.FETCHED[local] <= 3 << 19, fakefs.FETCHED[local]  # 1 MB of lines


@pytest.mark.parametrize("scheme", [fakefs.SCHEME, "fakes3"])
def test_a_slice_read_alone_fetches_its_bytes(gcs, scheme):
    """Spill streams read one slice per open (as a cell reads its slice of each chunk's
    file), through Beam's GCS reader (``fakegs``) and its S3 / Azure reader (``fakes3``,
    a 16 MB buffer over ranged gets): the rows of that slice, and those bytes fetched."""
    url = gcs[0].replace(fakefs.SCHEME, scheme, 1)
    rb = pa.record_batch({"x": pa.array(np.arange(400_000, dtype=np.int64))})
    runs = [(a, a + 2_000) for a in range(0, 400_000, 2_000)]
    path = f"{url}/spill/chunk.arrows"
    spans = [Span(path, at, size) for at, size in write_streams(path, rb, runs)]
    local = str(gcs[1] / "spill" / "chunk.arrows")
    for (lo, hi), span in reversed(list(zip(runs, spans, strict=True))):
        ((_, got),) = read_streams([span])
        assert got.equals(rb.slice(lo, hi - lo))
    assert fakefs.FETCHED[local] <= fakefs.SIZES[local] + len(spans)
    # many files at once (read by threads): every span, in (path, offset) order
    other = f"{url}/spill/another.arrows"
    more = [Span(other, at, size) for at, size in write_streams(other, rb, runs[:7])]
    got = read_streams((spans + more)[::-1])
    assert [s for s, _ in got] == sorted(spans + more, key=lambda s: (s.path, s.offset))
    want = {**{s: lo for s, (lo, _) in zip(spans, runs, strict=True)},
            **{s: lo for s, (lo, _) in zip(more, runs, strict=False)}}
    for s, batch in got:
        assert batch.equals(rb.slice(want[s], 2_000))


@pytest.mark.parametrize("scheme", [fakefs.SCHEME, "fakes3"])
def test_picked_rows_of_a_spilled_chunk_download_those_rows(gcs, scheme):
    """The planning and recall samples take a few rows of each chunk (at a billion
    records, under one per 21,845-row chunk of 768 values): read from a value file on an
    object store, those rows' bytes are downloaded, one request per run of rows less
    than RANGE_GAP apart, not the file (each sample downloaded every chunk whole)."""
    url = gcs[0].replace(fakefs.SCHEME, scheme, 1)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3_000, 768)).astype(np.float32)  # 9.2 MB, 3 KB rows
    n = len(x)
    batch = VecBatch(np.zeros((n, 2), np.uint64), np.zeros(n), np.arange(n),
                     np.zeros(n, np.int32), np.arange(n), pa.array([f"r{i}" for i in range(n)]),
                     x).spill(f"{url}/values")
    local = str(gcs[1] / batch.spilled[0].removeprefix(f"{url}/"))
    width = 768 * 4
    far = np.arange(2_990, 0, -(fs.RANGE_GAP // width + 50))  # each its own request
    got = batch.picked(far)
    assert np.array_equal(got.x, x[far]) and got.ids.equals(batch.ids.take(pa.array(far)))
    assert fakefs.FETCHED[local] <= len(far) * (width + 1), (fakefs.FETCHED[local], len(far))
    fakefs.FETCHED.clear()
    near = np.array([7, 5, 9, 400, 401, 1_200])  # close rows: one ranged read of their span
    assert np.array_equal(batch.picked(near).x, x[near])
    assert fakefs.FETCHED[local] <= (1_200 - 5 + 1) * width + 1, fakefs.FETCHED[local]


def test_near_cells_on_an_object_store_download_their_slices_once(tmp_path, gcs):
    """A cell reads its slice of each chunk's spill file, a few kilobytes: on an object store
    that is one ranged download of those bytes. Beam's GCS reader fetched 16 MB (or the
    rest of the file) for each: 400 MB for these 40,000 records of 32 values."""
    url, bucket_dir = gcs
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40_000, 32)).astype(np.float32)
    x[-2_000:] = x[:2_000] + np.float32(0.001)  # near copies, in another file
    for f, rows in enumerate(np.array_split(np.arange(len(x)), 3)):
        write_input("parquet", bucket_dir / "in" / f"p{f}.parquet", [f"r{i}" for i in rows],
                    x[rows], rows % 7, row_group_size=10_000)
    near = {"metric": "l2", "threshold": 0.05, "single_index_rows": 2_000,
            "partition_rows": 500}
    assert run(tmp_path, "parquet", f"{url}/in/*.parquet", f"{url}/out", near=near) == 0
    summary = json.loads((bucket_dir / "out" / "report" / "summary.json").read_text())
    assert summary["near"]["cells"] >= 50 and summary["removed_near"] == 2_000
    spill = {p: got for p, got in fakefs.FETCHED.items()
             if p.startswith(str(bucket_dir)) and p.endswith(".arrows")}
    assert len(spill) >= 3  # a file per chunk, each read by every cell it holds rows of
    for path, got in spill.items():  # every slice once, one extra byte per ranged read
        assert got <= fakefs.SIZES[path] + 4096, (path, got, fakefs.SIZES[path])
    # a chunk's values: read whole by the search's assignment alone (the recall's brute
    # force runs in the same step); at this size each sample's rows span the whole file
    # (picked rows: the test above). The recall sample's once by the step, once by the merge
    values = {p: got for p, got in fakefs.FETCHED.items() if "/values/" in p}
    assert len(values) >= 3
    for path, got in values.items():
        assert got <= 3 * fakefs.SIZES[path] + 4096, (path, got, fakefs.SIZES[path])
    (recall,) = [p for p in fakefs.FETCHED if "-recall/" in p]
    assert fakefs.FETCHED[recall] <= 2 * fakefs.SIZES[recall] + 4096
    assert leftovers(bucket_dir) == []


@pytest.mark.parametrize("input_glob, out, report, why", [
    ("in/**/*.parquet", "/in/", "rep", "contains input"),  # '//in/' is still the input's prefix
    ("in/**/*.parquet", "out", "out/clean/rep", "separate directories"),
    ("**/*.parquet", "out", "rep", "matched by input.path"),
    ("in/**/*.parquet", "", "rep", "a whole bucket"),
])
def test_remote_path_checks(tmp_path, gcs, capsys, input_glob, out, report, why):
    url, bucket_dir = gcs
    write_inputs("parquet", tmp_path / "local", bucket_dir, planted(5))
    doc = {"input": {"format": "parquet", "path": f"{url}/{input_glob}", "tensor": "emb"},
           "output": {"path": f"{url}/{out}"}, "report": f"{url}/{report}"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 2
    assert why in capsys.readouterr().err
    assert files_below(bucket_dir) == [f"in/{n}.parquet" for n in NAMES]


def test_glob_means_the_same_locally_and_on_an_object_store(tmp_path, gcs):
    url, bucket_dir = gcs
    for name in ("a.x", "b.y", "d/c.x", "d/e/f.x", "d2/g.x", "[h].x"):
        for root in (tmp_path / "local", bucket_dir):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(b"1")
    for pattern in ("*.x", "**/*.x", "d/**", "d/**/*.x", "d*/*.x", "?.x", "[ab].*", "[!a].*",
                    "d/c.x", "d", "nothing/*", "[h].x", "*", "d*", "d/*", "**"):
        local = fs.glob_matches(str(tmp_path / "local" / pattern))
        remote = fs.glob_matches(f"{url}/{pattern}")
        for kind in ("files", "directories"):
            mine = [Path(p).relative_to(tmp_path / "local").as_posix()
                    for p in getattr(local, kind)]
            theirs = [p.removeprefix(f"{url}/") for p in getattr(remote, kind)]
            assert theirs == mine, (pattern, kind)
    # a name with glob characters that exists is that file (as a glob: [h].x matches h.x)
    assert fs.glob(f"{url}/[h].x") == [f"{url}/[h].x"]
    # folders whose files the glob does not read; "d/**" names every file below d/e
    assert fs.glob_matches(f"{url}/*").directories == [f"{url}/d", f"{url}/d2"]
    assert fs.glob_matches(f"{url}/d/*").directories == [f"{url}/d/e"]
    assert fs.glob_matches(f"{url}/d/**").directories == []


def test_delete_files_is_one_call_and_ignores_missing_files(tmp_path, gcs, monkeypatch):
    """Publish deletes an old output's objects in one batched call (a retry may find some
    of them gone already); a file that cannot be deleted still raises."""
    from apache_beam.io.filesystem import BeamIOError

    url, bucket_dir = gcs
    for name in ("a", "b", "c"):
        (bucket_dir / "old" / name).parent.mkdir(parents=True, exist_ok=True)
        (bucket_dir / "old" / name).write_bytes(b"1")
    calls = []
    real = fakefs.FakeObjectStore.delete
    monkeypatch.setattr(fakefs.FakeObjectStore, "delete",
                        lambda self, paths: calls.append(list(paths)) or real(self, paths))
    fs.delete_files([f"{url}/old/{n}" for n in ("a", "gone", "b", "c")])
    assert calls[0] == [f"{url}/old/{n}" for n in ("a", "gone", "b", "c")]
    assert len(calls) <= 2  # the fake refuses the whole list for one missing path
    assert fs.match(f"{url}/old/*") == [] and not (bucket_dir / "old").exists()
    (bucket_dir / "old").mkdir()
    (bucket_dir / "old" / "stuck").write_bytes(b"1")  # a delete that fails: still raises

    def refuse(self, paths):
        raise BeamIOError("Delete operation failed", {p: PermissionError(p) for p in paths})

    monkeypatch.setattr(fakefs.FakeObjectStore, "delete", refuse)
    with pytest.raises(OSError):
        fs.delete_files([f"{url}/old/stuck"])


@pytest.mark.parametrize("path, fix", [
    ("hdfs://namenode/data/*.parquet", "install what the message names to read hdfs:// "
     "paths, or --set input.path=<a local path>"),
    ("s3://bucket/data/*.parquet", "check the network and the credentials (AWS credentials, "
     "or Beam's --s3_* options after --; tuning.remote_timeout_s sets the wait)")])
def test_an_input_on_another_object_store_is_told_its_own_fix(tmp_path, capsys, path, fix):
    """Every failure to list a remote input advised gcloud's login, for s3:// too, and for
    hdfs:// where Beam's hadoop extra is not installed: each scheme gets its own fix."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"input": {"format": "parquet", "path": path, "tensor": "emb"},
                                   "output": {"path": str(tmp_path / "out")},
                                   "report": str(tmp_path / "report")}))
    assert main(["--config", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: input.path: {path}: listing the files "
                                               "failed (") and fix in err[0], err
    assert "gcloud" not in err[0]
