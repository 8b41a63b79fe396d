"""Bad input never crashes a job silently or loses data (issue 16): a format that does not
match the files, mostly-invalid input, remote filesystems that hang or refuse, read-only
outputs, ids that are not text, a full disk and Ctrl-C each end in one line with the
right exit code, and a good earlier output survives every one of them byte for byte."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.inputs import sniff
from tests import slowfs
from tests.jobkit import interruptible, run_job, write_input

ROOT = Path(__file__).resolve().parents[1]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: "unchanged" means equal snapshots."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def good_run(tmp_path: Path, parquet_in: str) -> dict[str, bytes]:
    """A finished run's output and report, as a later failed run must leave them."""
    assert run_job(tmp_path, "parquet", parquet_in) == 0
    before = snapshot(tmp_path / "out")
    assert any(name.startswith("clean/") for name in before)
    assert "report/summary.json" in before
    return before


# --- what a file looks like ------------------------------------------------------------

@pytest.mark.parametrize("fmt,kw,expected", [
    ("parquet", {}, ("parquet", None)),
    ("tfrecord", {}, ("tfrecord", "none")),
    ("tfrecord", {"compression": "GZIP"}, ("tfrecord", "gzip")),
    ("tfrecord", {"compression": "ZLIB"}, ("tfrecord", "zlib")),
    ("hdf5", {}, ("hdf5", None)),
])
def test_sniff_knows_each_format_from_its_first_bytes(tmp_path, fmt, kw, expected):
    path = tmp_path / f"x.{fmt}"
    x = np.arange(80, dtype=np.float32).reshape(20, 4)
    write_input(fmt, path, [f"r{i}" for i in range(20)], x, np.zeros(20, int), **kw)
    found = sniff(path.read_bytes()[:4096])
    assert (found.format, found.compression) == expected


def test_sniff_finds_hdf5_after_a_user_block_and_nothing_in_other_bytes(tmp_path):
    path = tmp_path / "u.h5"
    with h5py.File(path, "w", userblock_size=512) as h:
        h.create_dataset("emb", data=np.zeros((2, 3), np.float32))
    assert sniff(path.read_bytes()[:4096]).evidence.endswith("at byte 512")
    assert sniff(b"") is None and sniff(b"id,emb\n1,2\n" * 100) is None
    assert sniff(np.random.default_rng(0).bytes(4096)) is None


@pytest.mark.parametrize("configured", ["tfrecord", "hdf5"])
def test_mismatched_format_is_refused_and_good_output_survives(tmp_path, parquet_in, capsys,
                                                               configured):
    before = good_run(tmp_path, parquet_in)
    capsys.readouterr()
    assert run_job(tmp_path, "parquet", parquet_in, "output.overwrite=true",
                   input={"format": configured}) == 2
    line = one_error_line(capsys)
    assert "a.parquet looks like a Parquet file (it starts with PAR1)" in line
    assert line.endswith("set input.format: parquet")
    assert snapshot(tmp_path / "out") == before


def test_tfrecord_compression_that_does_not_match_is_refused(tmp_path, capsys):
    path = tmp_path / "in" / "a.tfrecord"
    write_input("tfrecord", path, ["a", "b"], np.ones((2, 3), np.float32), np.zeros(2, int),
                compression="GZIP")
    assert run_job(tmp_path, "tfrecord", str(path),
                   input={"compression": "none", "shape": [3]}) == 2
    assert "gzip-compressed TFRecord, not none: set input.compression: auto" in \
        one_error_line(capsys)


def test_mostly_invalid_run_fails_and_publishes_nothing(tmp_path, parquet_in, capsys):
    before = good_run(tmp_path, parquet_in)
    capsys.readouterr()
    emb = pa.array([[1.0, 2.0, 3.0, 4.0]] + [None] * 9, pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": [f"n{i}" for i in range(10)], "emb": emb,
                             "label": np.zeros(10, int)}), tmp_path / "in" / "a.parquet")
    assert run_job(tmp_path, "parquet", parquet_in, "output.overwrite=true") == 1
    err = _error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "9 of 10 input records are invalid (90.0%), more than max_invalid_fraction 0.1" \
        in err[0] and "First: n1 in " in err[0]
    assert snapshot(tmp_path / "out") == before
    # the limit is a choice: 1.0 publishes the one good record and reports the rest
    assert run_job(tmp_path, "parquet", parquet_in, "output.overwrite=true",
                   "max_invalid_fraction=1.0") == 0
    assert pq.read_table(tmp_path / "out" / "report" / "invalid.parquet").num_rows == 9


# --- remote filesystems that hang or refuse ---------------------------------------------

@pytest.fixture
def release_hung_calls():
    slowfs.RELEASE.clear()  # calls hang from here on
    yield
    slowfs.RELEASE.set()  # the daemon threads still waiting end with the test


@pytest.mark.parametrize("where", ["input", "output"])
def test_hanging_remote_filesystem_stops_within_the_timeout(tmp_path, parquet_in, capsys,
                                                            release_hung_calls, where):
    sets = ["tuning.remote_timeout_s=0.5"]
    sets.append("input.path=hangfs://bucket/in/*.parquet" if where == "input" else
                "output.path=hangfs://bucket/out/clean")
    start = time.monotonic()
    assert run_job(tmp_path, "parquet", parquet_in, *sets) == 2
    assert time.monotonic() - start < 30  # the gs:// client's retries take ~2 minutes
    line = one_error_line(capsys)
    key = "input.path" if where == "input" else "output.path"
    assert line.startswith(f"error: {key}: hangfs://bucket/") and "no answer within 0.5 s" in line
    assert "credentials" in line and f"--set {key}=<a local path>" in line


def test_hanging_filesystem_does_not_keep_the_process_alive(tmp_path, parquet_in):
    """The CLI as a user runs it: the hung call is in a daemon thread, the process exits."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({
        "input": {"format": "parquet", "path": "hangfs://bucket/*.parquet", "tensor": "emb"},
        "output": {"path": str(tmp_path / "clean")}, "report": str(tmp_path / "report"),
        "tuning": {"remote_timeout_s": 1}}))
    code = ("import sys; from pipeline.run import main; import tests.slowfs; "
            f"sys.exit(main(['--config', {str(cfg)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "no answer within 1 s (listing the files)" in r.stderr


@pytest.mark.parametrize("where", ["input", "output"])
def test_refusing_remote_filesystem_is_one_line(tmp_path, parquet_in, capsys, where):
    sets = ["input.path=deniedfs://bucket/in/*.parquet" if where == "input" else
            "output.path=deniedfs://bucket/out/clean"]
    assert run_job(tmp_path, "parquet", parquet_in, *sets) == 2
    line = one_error_line(capsys)
    assert "PermissionError" in line and "storage.objects.list" in line and "credentials" in line


# --- outputs that cannot be written, ids that are not text --------------------------------

def test_read_only_output_directory_is_refused_before_any_work(tmp_path, parquet_in, capsys):
    """A directory this process cannot write in: one made read-only, or (as root, who
    writes anywhere chmod allows) sysfs, which refuses new files to everyone."""
    if os.geteuid() == 0:
        locked = Path("/sys")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
    before = sorted(p.name for p in locked.iterdir())
    try:
        assert run_job(tmp_path, "parquet", parquet_in,
                       f"output.path={locked / 'tensordedup-test' / 'clean'}") == 2
        line = one_error_line(capsys)
    finally:
        if locked != Path("/sys"):
            locked.chmod(0o755)
    assert f"output.path: cannot write in {locked} (Permission denied)" in line
    assert sorted(p.name for p in locked.iterdir()) == before
    assert not (tmp_path / "out").exists()


def test_parquet_binary_id_that_is_not_utf8_is_refused(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    ids = pa.array([b"a", b"b", b"\xff\xfe"], pa.binary())
    emb = pa.array([[1.0], [2.0], [3.0]], pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": ids, "emb": emb}), tmp_path / "in" / "b.parquet")
    glob = str(tmp_path / "in" / "*.parquet")
    assert run_job(tmp_path, "parquet", glob) == 2
    line = one_error_line(capsys)
    assert "input.id: column 'id' is binary and row 2 is not UTF-8 text" in line
    # binary ids that are text are fine
    pq.write_table(pa.table({"id": pa.array([b"a", b"b", b"c"], pa.binary()), "emb": emb}),
                   tmp_path / "in" / "b.parquet")
    assert run_job(tmp_path, "parquet", glob) == 0


def test_tfrecord_id_that_is_not_utf8_is_an_invalid_record(tmp_path):
    import tensorflow as tf

    path = tmp_path / "in" / "a.tfrecord"
    path.parent.mkdir()
    with tf.io.TFRecordWriter(str(path)) as w:
        for i, raw in enumerate([b"a", b"\xff\xfe", b"c"]):
            feat = {"id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[raw])),
                    "emb": tf.train.Feature(float_list=tf.train.FloatList(value=[i, 1.0]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feat))
                    .SerializeToString())
    assert run_job(tmp_path, "tfrecord", str(path), "max_invalid_fraction=1",
                   input={"shape": [2]}) == 0
    invalid = pq.read_table(tmp_path / "out" / "report" / "invalid.parquet").to_pylist()
    assert len(invalid) == 1 and "id is not UTF-8" in invalid[0]["reason"]



def test_hdf5_id_that_is_not_utf8_is_an_invalid_record(tmp_path):
    path = tmp_path / "in" / "a.h5"
    path.parent.mkdir()
    with h5py.File(path, "w") as f:
        f["emb"] = np.arange(6, dtype=np.float32).reshape(3, 2)
        f["id"] = np.array([b"a", b"\xff\xfe", b"c"], dtype="S2")
    assert run_job(tmp_path, "hdf5", str(path), "max_invalid_fraction=1") == 0
    invalid = pq.read_table(tmp_path / "out" / "report" / "invalid.parquet").to_pylist()
    assert len(invalid) == 1 and "id is not UTF-8" in invalid[0]["reason"]
    assert invalid[0]["record_id"] == "\\xff\\xfe"
    with h5py.File(tmp_path / "out" / "clean" / "a.h5") as f:
        assert f["id"][:].tolist() == [b"a", b"c"]


# --- a full disk and Ctrl-C, for real, in a child process ---------------------------------

def _cli(tmp_path: Path, glob: str, *extra: str) -> list[str]:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({
        "input": {"format": "parquet", "path": glob, "tensor": "emb", "id": "id"},
        "output": {"path": str(tmp_path / "out" / "clean")},
        "report": str(tmp_path / "out" / "report")}))
    return [sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--quiet",
            "--overwrite", *extra]


def _big_input(tmp_path: Path, files: int, rows: int) -> str:
    rng = np.random.default_rng(1)
    for f in range(files):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        write_input("parquet", tmp_path / "in" / f"p{f:02d}.parquet",
                    [f"f{f}r{i}" for i in range(rows)], x, np.zeros(rows, int),
                    row_group_size=4096)
    return str(tmp_path / "in" / "*.parquet")


def _error_lines(stderr: str) -> list[str]:
    """stderr without the start line ("deduplicating N file(s) ...")."""
    return [ln for ln in stderr.strip().splitlines() if not ln.startswith("deduplicating ")]


def _limit_file_size(limit: int):
    def apply() -> None:  # in the child: writes beyond `limit` bytes fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_disk_full_while_writing_is_one_line_and_publishes_nothing(tmp_path):
    glob = _big_input(tmp_path, 2, 4000)  # ~1 MB per clean shard
    first = subprocess.run(_cli(tmp_path, glob), cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    before = snapshot(tmp_path / "out")
    r = subprocess.run(_cli(tmp_path, glob), cwd=ROOT, capture_output=True, text=True,
                       preexec_fn=_limit_file_size(256 << 10))
    assert r.returncode == 1
    (line,) = _error_lines(r.stderr)
    assert line.startswith("error: the job failed") and "File too large" in line
    assert "free space or write the outputs elsewhere" in line
    assert snapshot(tmp_path / "out") == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["clean", "report"]


def test_ctrl_c_is_one_line_exit_130_and_publishes_nothing(tmp_path):
    glob = _big_input(tmp_path, 8, 30000)
    first = subprocess.run(_cli(tmp_path, glob), cwd=ROOT, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    before = snapshot(tmp_path / "out")
    child = subprocess.Popen(_cli(tmp_path, glob), cwd=ROOT, stderr=subprocess.PIPE,
                             preexec_fn=interruptible,
                             stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 300
    while not any(p.name.startswith(".clean.staging-") for p in (tmp_path / "out").iterdir()):
        assert child.poll() is None and time.monotonic() < deadline, "no staging directory"
        time.sleep(0.005)  # polling for the directory: the event waited on is its creation
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr
    assert _error_lines(stderr) == ["interrupted: nothing was published (earlier outputs are "
                                    "unchanged); run the same command again to redo the job"]
    assert snapshot(tmp_path / "out") == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["clean", "report"]
