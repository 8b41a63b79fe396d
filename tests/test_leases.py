"""One writer at a time per output and per store (transforms/io/lease.py), raced for real:
two ``python -m pipeline.run`` processes, on a local disk and on the fake object store.

No sleeps decide anything: the first run is held inside Publish by a test hook
(``$TENSORDEDUP_TEST_HOLD_PUBLISH``: it touches ``<hold>.reached`` and waits for
``<hold>``), the test starts the rival once the first run is there, and every other wait
is on a file appearing or a process ending. Also: Publish and the store commit run twice
or after a partial first try (Dataflow retries) end exactly like one clean run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.io.filesystems import FileSystems

from pipeline import graph, publish
from pipeline.run import main
from tests import fakefs
from tests.jobkit import write_input
from transforms.io import conditional, fs, layout, lease, owner
from transforms.store import segment as digest_segment
from transforms.store.store import FingerprintStore

ROOT = Path(__file__).resolve().parents[1]
# the real CLI (pipeline.run's main, as ``python -m pipeline.run`` runs it), with the fake
# object store registered (a child process does not import tests/fakefs.py by itself)
FAKE_CLI = "import sys, pipeline.run, tests.fakefs; sys.exit(pipeline.run.main())"


@pytest.fixture(params=["local", "fakegs"])
def where(request, tmp_path, monkeypatch) -> tuple[str, Path]:
    """(URL or directory where outputs and stores go, the local directory behind it)."""
    if request.param == "local":
        return str(tmp_path / "data"), tmp_path / "data"
    url = fakefs.bucket(monkeypatch, tmp_path / "gcs")
    return url + "/data", tmp_path / "gcs" / "bucket" / "data"


def make_input(folder: Path, seed: int, rows: int = 200, copies_of: np.ndarray | None = None
               ) -> np.ndarray:
    """Three parquet files of random 8-d rows with planted in-run copies; with
    ``copies_of``, its first 60 rows are in this input too (store duplicates)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3 * rows, 8)).astype(np.float32)
    x[rows // 2: rows // 2 + 20] = x[:20]
    if copies_of is not None:
        x[-60:] = copies_of[:60]
    for f in range(3):
        part = x[f * rows:(f + 1) * rows]
        write_input("parquet", folder / f"p{f}.parquet", [f"{seed}-{f}-{i}" for i in
                                                          range(rows)], part, np.zeros(rows, int))
    return x


def config(tmp_path: Path, name: str, inputs: Path, out: str, store: str | None = None
           ) -> Path:
    doc = {"input": {"format": "parquet", "path": str(inputs / "*.parquet"), "tensor": "emb",
                     "id": "id"},
           "output": {"path": f"{out}/clean"}, "report": f"{out}/report"}
    if store is not None:
        doc["store"] = {"path": store}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def spawn(cfg: Path, *args: str, hold: Path | None = None) -> subprocess.Popen:
    """The CLI in a new process (the fake object store registered when in use)."""
    env = dict(os.environ)
    env.pop(publish.HOLD_ENV, None)
    if hold is not None:
        env[publish.HOLD_ENV] = str(hold)
    cli = ["-c", FAKE_CLI] if fakefs.ENV in env else ["-m", "pipeline.run"]
    return subprocess.Popen([sys.executable, *cli, "--config", str(cfg), "--quiet", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 600) -> None:
    """Until ``path`` exists; fails at once if ``proc`` ended first (a poll on a file, with
    a generous limit only so a broken run cannot hang the suite)."""
    tick, deadline = threading.Event(), time.monotonic() + limit_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (rc {proc.returncode}) before {path.name}: {err}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        tick.wait(0.02)


def finish(proc: subprocess.Popen) -> tuple[int, list[str]]:
    _, err = proc.communicate()
    return proc.returncode, err.strip().splitlines()


def assert_one_line_refusal(rc: int, err: list[str], holder_run: str, what: str) -> None:
    errors = [ln for ln in err if not ln.startswith("deduplicating ")]
    assert rc == 2 and len(errors) == 1, err
    assert errors[0].startswith("error: ") and what in errors[0], errors
    assert f"in use by run {holder_run} " in errors[0] and "delete " in errors[0], errors


def assert_complete(out: Path) -> dict:
    """summary.json is there and tells the truth: every shard it lists exists with the
    kept rows it says; no staging, journal or lease is left beside the outputs."""
    s = json.loads((out / "report" / "summary.json").read_text())
    assert s["read"] == s["kept"] + s["removed_exact"] + s["removed_store_exact"] + s["invalid"]
    for f in s["files"]:
        shard = out / "clean" / f["output"]
        assert shard.exists(), f"summary lists {shard}, which is missing"
        assert pq.ParquetFile(shard).metadata.num_rows == f["kept"]
    assert files_below(out / "clean") == sorted(f["output"] for f in s["files"])
    assert [f for f in files_below(out) if f.split("/")[0] not in ("clean", "report")] == []
    return s


def files_below(folder: Path) -> list[str]:
    """Files only: the fake object store's backing directory keeps empty folders."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def store_digests(store: str) -> np.ndarray:
    """Every digest the store's lookups can see, one row per stored record."""
    keys = [digest_segment.read_all(seg.path)[0] for seg in FingerprintStore(store).plan().segments]
    return np.concatenate(keys) if keys else np.empty(0)


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "new-output"])
def test_a_second_run_on_a_busy_output_is_refused(tmp_path, where, overwrite):
    out, local = where
    make_input(tmp_path / "in", 1)
    cfg = config(tmp_path, "job", tmp_path / "in", out)
    args = ["--overwrite"] if overwrite else []
    if overwrite:  # an earlier run's output is in place
        assert main(["--config", str(cfg), "--quiet"]) == 0
    hold = tmp_path / "hold"
    first = spawn(cfg, *args, "--run-id", "first", hold=hold)
    wait_for(Path(f"{hold}.reached"), first)  # staged everything, inside Publish
    rc, err = finish(spawn(cfg, *args, "--run-id", "second"))
    assert_one_line_refusal(rc, err, "first", f"{out}/clean")
    hold.touch()
    rc, err = finish(first)
    assert rc == 0, err
    s = assert_complete(local)
    assert s["run_id"] == "first" and s["read"] == 600 and s["removed_exact"] == 20


def test_two_runs_on_one_store_commit_one_at_a_time(tmp_path, where):
    out, local = where
    store = f"{out}/store"
    day1 = make_input(tmp_path / "d1", 1)
    make_input(tmp_path / "d2", 2, copies_of=day1)
    cfg1 = config(tmp_path, "day1", tmp_path / "d1", f"{out}/one", store)
    cfg2 = config(tmp_path, "day2", tmp_path / "d2", f"{out}/two", store)
    hold = tmp_path / "hold"
    first = spawn(cfg1, "--run-id", "day1", hold=hold)
    wait_for(Path(f"{hold}.reached"), first)
    rc, err = finish(spawn(cfg2, "--run-id", "day2"))
    assert_one_line_refusal(rc, err, "day1", f"fingerprint store {store}")
    assert files_below(local / "two") == []  # refused before writing anything
    dry = spawn(cfg2, "--run-id", "day2", "--dry-run")  # says so (it was silent)
    said, _ = dry.communicate()
    held = [ln for ln in said.splitlines() if ln.startswith("a run now would be refused: ")]
    assert dry.returncode == 0 and len(held) == 1, said
    assert f"fingerprint store {store} is in use by run day1 " in held[0], held
    hold.touch()
    assert finish(first)[0] == 0
    rc, err = finish(spawn(cfg2, "--run-id", "day2"))  # once day1 is done: sees its records
    assert rc == 0, err
    s1, s2 = assert_complete(local / "one"), assert_complete(local / "two")
    assert s2["removed_store_exact"] == 60
    keys = store_digests(store)
    assert len(keys) == s1["kept"] + s2["kept"] == len(np.unique(keys))
    assert not fs.exists(layout.store_lease(store))


def test_a_killed_holder_does_not_block_the_next_run(tmp_path, where):
    out, local = where
    store = f"{out}-store"
    make_input(tmp_path / "in", 3)
    cfg = config(tmp_path, "job", tmp_path / "in", out, store)
    hold = tmp_path / "hold"
    first = spawn(cfg, "--run-id", "a", hold=hold)
    wait_for(Path(f"{hold}.reached"), first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    paths = [layout.dir_lease(f"{out}/clean"), layout.store_lease(store)]
    assert all(fs.exists(p) for p in paths)  # left behind by the dead holder
    rc, err = finish(spawn(cfg, "--run-id", "a"))
    assert rc == 0, err
    s = assert_complete(local)
    assert s["read"] == 600 and not any(fs.exists(p) for p in paths)
    assert len(store_digests(store)) == s["kept"]


def _lease_doc(**kw) -> bytes:
    now = time.time()
    doc = {"token": "t" * 32, "run_id": "other", "target": "x", "host": "elsewhere",
           "pid": 1, "pid_start": None, "started": now - 60, "expires": now + 600,
           "detached": False, **kw}
    return json.dumps(doc).encode()


def test_stale_rule(tmp_path, where):
    """Another host's lease holds until its expiry; a dead local pid frees it at once,
    but not a detached (Dataflow) lease; release never deletes someone else's lease."""
    out, _ = where
    path = f"{out}/x.lease.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for doc, held in [(_lease_doc(), True),
                      (_lease_doc(expires=time.time() - 1), False),
                      (_lease_doc(host=owner.HOST, pid=dead.pid), False),
                      (_lease_doc(host=owner.HOST, pid=dead.pid, detached=True), True),
                      (_lease_doc(host=owner.HOST, pid=os.getpid()), True)]:
        fs.delete(path)
        assert conditional.create_exclusive(path, doc)
        if held:
            with pytest.raises(lease.LeaseHeld) as e:
                lease.acquire(path, "target", "mine")
            assert "\n" not in str(e.value) and path in str(e.value)
            assert fs.read_bytes(path) == doc
        else:
            mine = lease.acquire(path, "target", "mine")
            assert mine.holds() and mine.renew()
            mine.release()
            assert not fs.exists(path)
    fs.delete(path)
    other = lease.acquire(path, "target", "other")
    lease.Lease(path, "target", "not-the-token", 1.0).release()
    assert other.holds()
    other.release()


# A launcher for a runner that does not wait (Dataflow) whose submission the test holds:
# Dataflow itself cannot be reached from a test, so the job goes to a runner that stands
# for its launcher (it returns a submitted job at once, or waits at the submission for
# the test to kill it); the leases are the real ones, on disk.
LAUNCHER = """
import sys, tempfile, time
from pathlib import Path
import apache_beam as beam
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState
from pipeline import api
from pipeline.runners import common

cfg, hold = sys.argv[1], Path(sys.argv[2])

class Submitted(PipelineResult):
    def job_id(self):
        return "job-1"

class Launcher(PipelineRunner):
    def run_pipeline(self, pipeline, options):
        staged = Path(tempfile.mkdtemp())  # as Beam's stager leaves one on Dataflow
        (staged / "pickled_main_session").touch()
        Path(f"{hold}.staged").write_text(str(staged))
        Path(f"{hold}.submitting").touch()
        while not hold.exists():  # the test kills the launcher here, or lets it submit
            time.sleep(0.02)
        return Submitted(PipelineState.RUNNING)

api.beam_pipeline = lambda job: beam.Pipeline(runner=Launcher())
common.launcher_waits = lambda runner: False  # as on Dataflow
print(api.run_job(cfg, quiet=True).job_id)
"""


def _lease_files(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(out.rglob(".*.lease.json"))}


@pytest.mark.parametrize("fate", ["killed", "submitted"])
def test_a_launcher_holds_pid_bound_leases_until_the_job_is_submitted(tmp_path, fate):
    """A launcher killed before it submitted (SIGKILL: the sweep's scheduler timeout) left
    24 h detached leases that refused every run for a day; now they are bound to its pid
    until the submission returns, and detached (24 h) only then."""
    make_input(tmp_path / "in", 1)
    cfg = config(tmp_path, "job", tmp_path / "in", str(tmp_path / "out"))
    hold = tmp_path / "hold"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(cfg), str(hold)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    wait_for(Path(f"{hold}.submitting"), launcher)
    held = _lease_files(tmp_path)
    assert sorted(held) == [".clean.lease.json", ".report.lease.json"]
    for info in held.values():  # before the submission: this launcher's, like any run's
        assert info["detached"] is False and info["pid"] == launcher.pid
        assert info["expires"] - time.time() <= lease.TTL_S
    if fate == "killed":
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert main(["--config", str(cfg), "--quiet"]) == 0  # not refused for a day
        assert_complete(tmp_path / "out")
        return
    hold.touch()
    out, err = launcher.communicate()
    assert launcher.returncode == 0 and out.strip() == "job-1", err
    assert not Path(Path(f"{hold}.staged").read_text()).exists()  # the launch's temp folder
    held = _lease_files(tmp_path)
    assert sorted(held) == [".clean.lease.json", ".report.lease.json"]
    for info in held.values():  # the job's now, for its Publish to release
        assert info["detached"] is True
        assert info["expires"] - time.time() > lease.DETACHED_TTL_S - 120


def test_renewing_never_shortens_a_detached_lease(tmp_path):
    mine = lease.acquire(str(tmp_path / "x.lease.json"), "target", "r")
    assert mine.detach()
    assert mine.renew()
    info = json.loads((tmp_path / "x.lease.json").read_text())
    assert info["detached"] is True and info["expires"] - time.time() > lease.DETACHED_TTL_S - 60
    mine.release()
    assert not mine.detach()  # no longer ours


@pytest.mark.parametrize("content", [b"", b'{"run_id": "x', b"[]"],
                         ids=["empty", "cut-short", "not-a-lease"])
def test_an_unreadable_lease_file_is_named_so(tmp_path, where, content):
    """An empty or corrupt lease file is refused as unreadable with what to do, not as
    'in use by run ? (host ?, pid ?, since ?...)'; it is left for the user to judge."""
    path = f"{where[0]}/.clean.lease.json"
    assert conditional.create_exclusive(path, content)
    with pytest.raises(lease.LeaseHeld) as e:
        lease.acquire(path, "out/clean", "mine")
    assert str(e.value) == (f"out/clean has a lease file that cannot be read ({path} is "
                            "empty or not a lease tensordedup wrote): if no run is using it, "
                            "delete that file and run again")
    assert fs.read_bytes(path) == content


RACE = """
import sys, threading, os
sys.path.insert(0, {root!r})
import tests.fakefs
from transforms.io import lease
tick = threading.Event()
while not os.path.exists({go!r}):
    tick.wait(0.005)
try:
    lease.acquire({path!r}, "target", "r" + sys.argv[1])
    print("won", flush=True)
except lease.LeaseHeld:
    print("refused", flush=True)
while not os.path.exists({done!r}):  # the winner stays alive until every rival decided:
    tick.wait(0.005)                 # a lease whose process is gone is stale, rightly
"""


def test_racing_processes_exactly_one_wins(tmp_path, where):
    out, _ = where
    go, done = tmp_path / "go", tmp_path / "done"
    code = RACE.format(root=str(ROOT), go=str(go), done=str(done),
                       path=f"{out}/race.lease.json")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], stdout=subprocess.PIPE,
                              text=True) for i in range(6)]
    go.touch()
    try:
        results = sorted(p.stdout.readline().strip() for p in procs)
    finally:
        done.touch()
        for p in procs:
            p.communicate()
    assert results == ["refused"] * 5 + ["won"]


# Dataflow retries: Publish run twice, or again after a partial first try


def _snapshot(local: Path, store: str) -> dict:
    """What a run left, comparable across runs: output and report bytes, summary.json
    without its timings and attempt, the store's runs and digests."""
    files = {str(p.relative_to(local)): p.read_bytes() for p in sorted(local.rglob("*"))
             if p.is_file() and "store" not in p.relative_to(local).parts
             and p.name != "summary.json"}
    s = json.loads((local / "out" / "report" / "summary.json").read_text())
    for key in ("wall_time_s", "attempt"):
        s.pop(key)
    s["store"].pop("compaction_merges")
    runs = [(r.run_id, r.records) for r in FingerprintStore(store).runs()]
    markers = [p for p in fs.match(f"{store}/commits/**")]
    return {"files": files, "summary": s, "runs": runs, "markers": len(markers),
            "digests": np.sort(store_digests(store)).tobytes()}


_real_publish = publish.publish_run
_real_rename = fs.rename_tree
_real_delete = fs.delete
_real_commit = FingerprintStore.commit


class Crash(RuntimeError):
    pass


def _partial(name: str):
    """A stand-in for one fs/store operation that does part of its work, then crashes."""
    if name == "move":  # half the staged files moved in
        def step(src, dst):
            src, dst = src.rstrip("/"), dst.rstrip("/")
            files = fs.match(src + "/**")
            half = files[:max(1, len(files) // 2)]
            FileSystems.rename(half, [dst + f[len(src):] for f in half])
            raise Crash("killed while moving files in")
        return "rename_tree", step
    if name == "delete":  # the old output partly deleted
        count = [0]

        def step(path):
            count[0] += 1
            if count[0] == 3:
                raise Crash("killed while deleting the old output")
            _real_delete(path)
        return "delete", step
    raise ValueError(name)


def publish_twice(taken, store_parts, pub):
    """Publish as Dataflow may run it: once (complete), then again."""
    _real_publish(taken, store_parts, pub)
    return _real_publish(taken, store_parts, pub)


def publish_after_crash(taken, store_parts, pub):
    """Publish whose first try dies part way (which step: $CRASH_AT), then a retry."""
    how = os.environ["CRASH_AT"]
    if how == "commit":
        def crash_after_commit(self, *a, **k):
            _real_commit(self, *a, **k)
            raise Crash("killed after the store commit")
        FingerprintStore.commit = crash_after_commit
    else:
        attr, step = _partial(how)
        setattr(fs, attr, step)
    try:
        _real_publish(taken, store_parts, pub)
        raise AssertionError("the crash did not happen")
    except (Crash, publish.PublishIncomplete) as e:  # after the swap began: says what it did
        assert isinstance(e, Crash) or isinstance(e.__cause__, Crash), e
    finally:
        fs.rename_tree, fs.delete, FingerprintStore.commit = (_real_rename, _real_delete,
                                                              _real_commit)
    return _real_publish(taken, store_parts, pub)


def _run_day(tmp_path: Path, out: str, store: str, *sets: str) -> int:
    cfg = config(tmp_path, "job", tmp_path / "in", f"{out}/out", store)
    return main(["--config", str(cfg), "--quiet", "--overwrite", "--run-id", "r1",
                 *[a for s in sets for a in ("--set", s)]])


@pytest.mark.parametrize("retry", ["twice", "move", "delete", "commit"])
def test_publish_retried_ends_like_one_clean_run(tmp_path, monkeypatch, retry):
    url = fakefs.bucket(monkeypatch, tmp_path / "gcs")
    local = tmp_path / "gcs" / "bucket"
    make_input(tmp_path / "old", 5, rows=50)
    make_input(tmp_path / "in", 6)
    results = []
    for attempt in ("clean", retry):
        fs.delete_tree(url)
        store = f"{url}/store"
        old = config(tmp_path, "old", tmp_path / "old", f"{url}/out")  # an older output
        assert main(["--config", str(old), "--quiet"]) == 0
        if attempt != "clean":
            monkeypatch.setenv("CRASH_AT", retry)
            monkeypatch.setattr(graph, "publish_run",
                                publish_twice if retry == "twice" else publish_after_crash)
        assert _run_day(tmp_path, url, store) == 0
        monkeypatch.setattr(graph, "publish_run", _real_publish)
        results.append(_snapshot(local, store))
        assert {f.split("/")[0] for f in files_below(local / "out")} == {"clean", "report"}
    assert results[0] == results[1]


@pytest.mark.parametrize("key, path", [("store.path", "s3://bucket/store"),
                                       ("output.path", "s3://bucket/out"),
                                       ("report", "hdfs://namenode/report")])
def test_a_path_that_cannot_hold_a_lease_is_one_line_before_any_work(tmp_path, capsys, key,
                                                                     path):
    """s3:// and hdfs:// offer no create-if-absent write, so no run can hold a lease
    there: an s3:// store was listed first and refused as a network or credentials
    failure (gcloud advice for an S3 path, "Must provide one of client or options"), and
    an hdfs:// output stopped with a traceback (hdfs not installed). Now one line naming
    the key and the fix, exit 2, and nothing written locally."""
    make_input(tmp_path / "in", 1)
    cfg = config(tmp_path, "job", tmp_path / "in", str(tmp_path / "out"), str(tmp_path / "st"))
    assert main(["--config", str(cfg), "--quiet", "--set", f"{key}={path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    scheme = path.partition("://")[0]
    assert err == [f"error: {key}: {path}: {scheme}:// offers no create-if-absent write, "
                   "which the one-writer lease needs: use a local path or gs:// for outputs, "
                   "reports and stores"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "st").exists()
