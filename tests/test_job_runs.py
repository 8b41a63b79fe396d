"""Production runs end to end: run ids, reruns, restarts after a failure, incremental dedup
against the fingerprint store, and reference sets (leakage check), against a brute-force
oracle over all records (earlier runs' kept records and reference records first, never
removed)."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import publish
from pipeline.report import tables as report
from pipeline.report.summary import human_summary
from pipeline.run import main
from pipeline.steps import store, write
from tests.jobkit import EXT, read_output, run_job, write_input
from tests.oracle import canonical_key
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance
from transforms.store import store as store_mod
from transforms.store.store import FingerprintStore

DIM = 8
THRESHOLD = 0.5
TIERS = {"reference": 2, "store": 1, "new": 0}  # precedence of a near duplicate's match
SPEC = NearSpec("l2", THRESHOLD)


def day(seed: int, n: int, earlier: list[np.ndarray] = ()) -> np.ndarray:
    """n records: fresh vectors, exact and near copies of each other and of ``earlier``
    (previous days / a reference set), and decoys just outside the threshold."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 4, (n, DIM)).astype(np.float32)
    pool = np.vstack([base, *earlier])
    out = base.copy()
    k = n // 8
    src = pool[rng.choice(len(pool), 3 * k)]
    noise = rng.normal(size=(3 * k, DIM))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    out[:k] = src[:k]  # exact copies
    out[k:2 * k] = src[k:2 * k] + (0.3 * noise[k:2 * k]).astype(np.float32)  # near
    out[2 * k:3 * k] = src[2 * k:] + (0.8 * noise[2 * k:]).astype(np.float32)  # decoys
    return out[rng.permutation(n)]


def oracle(protected: list[tuple[str, np.ndarray, str]], new: list[tuple[str, np.ndarray]]
           ) -> dict[str, tuple[str, str]]:
    """{removed id: (kind, duplicate_of)}: exact then near (representative, l2) with the
    protected records (id, tensor, "reference" | "store") kept first, in order; a near
    duplicate names its nearest record of the highest tier within the threshold
    (reference, then store, then this run's: docs/runs.md's precedence)."""
    keys = {}
    for pid, t, tier in protected:
        keys.setdefault(canonical_key(t), (pid, tier))
    out, survivors = {}, []
    for rid, t in new:
        k = canonical_key(t)
        if k in keys:
            pid, tier = keys[k]
            out[rid] = ("exact" if tier == "new" else f"{tier}_exact", pid)
        else:
            keys[k] = (rid, "new")
            survivors.append((rid, t))
    kept = [(pid, t, tier) for pid, t, tier in protected]
    for rid, t in survivors:
        if kept:
            d, ok = exact_distance(np.repeat(t[None], len(kept), 0),
                                   np.array([k[1] for k in kept]), SPEC)
            if ok.any():
                rank = np.array([TIERS[k[2]] for k in kept])
                top = np.flatnonzero(ok & (rank == rank[ok].max()))
                j = int(top[np.argmin(d[top])])
                tier = kept[j][2]
                out[rid] = ("near" if tier == "new" else f"{tier}_near", kept[j][0])
                continue
        kept.append((rid, t, "new"))
    return out


def write_day(tmp_path, name: str, x: np.ndarray, fmt: str = "parquet", files: int = 2):
    ids = [f"{name}-{i}" for i in range(len(x))]
    for f, rows in enumerate(np.array_split(np.arange(len(x)), files)):
        write_input(fmt, tmp_path / name / f"part-{f}.{EXT[fmt]}", [ids[i] for i in rows],
                    x[rows], np.arange(len(rows)) % 5)
    return list(zip(ids, x, strict=True))


def run_day(tmp_path, name: str, run_id: str, *sets: str, args: tuple = (), **cfg) -> int:
    cfg.setdefault("store", {"path": str(tmp_path / "store")})
    cfg.setdefault("near", {"metric": "l2", "threshold": THRESHOLD})
    cfg["output"] = {"path": str(tmp_path / "out" / "clean" / "{run_id}")}
    cfg["report"] = str(tmp_path / "out" / "report" / "{run_id}")
    # the tests patch steps in this process (store.FANIN, simulated crashes): the near
    # job's local workers must be its threads, not processes of their own
    return run_job(tmp_path, "parquet", str(tmp_path / name / "*.parquet"), f"run_id={run_id}",
                   "runner.processes=false", *sets, args=args, **cfg)


def removals(tmp_path, run_id: str) -> dict[str, tuple[str, str]]:
    t = pq.read_table(tmp_path / "out" / "report" / run_id / "duplicates.parquet").to_pylist()
    return {r["record_id"]: (r["kind"], r["duplicate_of"]) for r in t}


def summary(tmp_path, run_id: str) -> dict:
    return json.loads((tmp_path / "out" / "report" / run_id / "summary.json").read_text())


def kept_ids(tmp_path, run_id: str) -> list[str]:
    ids = []
    for f in sorted((tmp_path / "out" / "clean" / run_id).glob("*.parquet")):
        ids += read_output("parquet", f, (DIM,))[0]
    return ids


def check_accounting(s: dict) -> None:
    removed = sum(v for k, v in s.items() if k.startswith("removed_"))
    assert s["read"] == s["kept"] + removed + s["invalid"]


@pytest.fixture(params=[store_mod.FANIN, 2], ids=["fanin-default", "fanin-2"])
def fanin(request, monkeypatch) -> int:
    """Store compaction as shipped, and merging every second run (compacted segments,
    with rows of replaced attempts in them, then answer the lookups)."""
    monkeypatch.setattr(store_mod, "FANIN", request.param)
    return request.param


def test_successive_runs_dedup_against_everything_kept_before(tmp_path, fanin):
    d1 = write_day(tmp_path, "d1", day(1, 400))
    d2 = write_day(tmp_path, "d2", day(2, 400, [x for _, x in d1]))
    d3 = write_day(tmp_path, "d3", day(3, 300, [x for _, x in d1 + d2]))
    expect1 = oracle([], d1)
    assert run_day(tmp_path, "d1", "day1") == 0
    assert removals(tmp_path, "day1") == expect1
    stored1 = [(i, x, "store") for i, x in d1 if i not in expect1]

    assert run_day(tmp_path, "d2", "day2") == 0
    expect2 = oracle(stored1, d2)
    got2 = removals(tmp_path, "day2")
    assert got2 == expect2
    kinds = {k for k, _ in got2.values()}
    assert {"store_exact", "store_near", "exact", "near"} <= kinds  # the data plants each kind
    rows = pq.read_table(tmp_path / "out" / "report" / "day2" / "duplicates.parquet").to_pylist()
    assert {r["duplicate_of_run"] for r in rows if r["kind"].startswith("store_")} == {"day1"}
    assert {r["duplicate_of_run"] for r in rows if not r["kind"].startswith("store_")} == {None}
    s2 = summary(tmp_path, "day2")
    check_accounting(s2)
    assert s2["removed_store_exact"] == sum(k == "store_exact" for k, _ in expect2.values())
    assert s2["store"]["earlier_runs"] == 1 and s2["store"]["appended"] == s2["kept"]
    assert sorted(kept_ids(tmp_path, "day2")) == sorted(i for i, _ in d2 if i not in expect2)

    stored2 = stored1 + [(i, x, "store") for i, x in d2 if i not in expect2]
    assert run_day(tmp_path, "d3", "day3") == 0
    assert removals(tmp_path, "day3") == oracle(stored2, d3)
    store = FingerprintStore(str(tmp_path / "store"))
    assert [r.run_id for r in store.runs()] == ["day1", "day2", "day3"]
    units = {s.unit for s in store.plan().segments}
    assert len(units) == (2 if fanin == 2 else 3)  # day1 + day2 merged into one at fanin 2


def test_rerun_of_a_run_id_replaces_its_outputs_and_store_entries(tmp_path, fanin, capsys):
    d1 = write_day(tmp_path, "d1", day(4, 300))
    d2 = write_day(tmp_path, "d2", day(5, 300, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "day1") == 0
    assert run_day(tmp_path, "d2", "day2") == 0
    first = (tmp_path / "out" / "report" / "day2" / "duplicates.parquet").read_bytes()
    first_kept = kept_ids(tmp_path, "day2")
    assert summary(tmp_path, "day2")["store"]["replaces_records"] is None
    view = store.open_view(str(tmp_path / "store"), "day2", FingerprintStore(
        str(tmp_path / "store")).meta())
    assert f"already committed {len(first_kept):,} records" in view.replacing_line()
    assert store.open_view(view.path, "day3", view.meta).replacing_line() is None
    # --dry-run of the rerun says so too (it had said nothing), and changes nothing
    capsys.readouterr()
    assert main(["--config", str(tmp_path / "job.yaml"), "--dry-run", "--run-id", "day2"]) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("store:")]
    assert said == [f"store: run id day2 already committed {len(first_kept):,} records "
                    f"({view.replaces['committed_at'][:19]} UTC); this run would replace "
                    "them. A different batch needs its own run id (--run-id)"]
    assert (tmp_path / "out" / "report" / "day2" / "duplicates.parquet").read_bytes() == first
    assert run_day(tmp_path, "d2", "day2") == 0  # same id: replaces, no --overwrite needed
    again = summary(tmp_path, "day2")
    assert again["store"]["replaces_records"] == len(first_kept)
    assert f"replacing the {len(first_kept):,} this run id had" in human_summary(again)
    assert (tmp_path / "out" / "report" / "day2" / "duplicates.parquet").read_bytes() == first
    assert kept_ids(tmp_path, "day2") == first_kept
    runs = FingerprintStore(str(tmp_path / "store")).runs()
    assert [r.run_id for r in runs] == ["day1", "day2"]
    assert runs[1].records == summary(tmp_path, "day2")["kept"]  # not twice
    # a later run sees day2's records once: the same removals as after a single day2 run
    stored = [(i, x, "store") for i, x in d1 if i not in removals(tmp_path, "day1")]
    stored += [(i, x, "store") for i, x in d2 if i not in removals(tmp_path, "day2")]
    d3 = write_day(tmp_path, "d3", day(6, 200, [x for _, x in d1 + d2]))
    assert run_day(tmp_path, "d3", "day3") == 0
    assert removals(tmp_path, "day3") == oracle(stored, d3)
    assert not list((tmp_path / "out" / "clean").glob(".*"))  # no staging left behind


def test_check_only_runs_see_every_commit_and_need_a_store(tmp_path, capsys):
    """``store.update: false`` (a leakage or history check) appends nothing and replaces
    nothing, so it is checked against every committed run, its own run id's too: under
    the day's (default) run id after the day's commit it had skipped that commit's
    records while saying it replaced them. A store that is not there (a typo) stops it,
    where it had checked against nothing and exited 0."""
    d1 = write_day(tmp_path, "d1", day(14, 300))
    d2 = write_day(tmp_path, "d2", day(15, 300, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "day1") == 0
    stored = [(i, x, "store") for i, x in d1 if i not in removals(tmp_path, "day1")]
    capsys.readouterr()
    assert run_day(tmp_path, "d2", "day1", "store.update=false") == 0
    assert "replace" not in capsys.readouterr().err
    assert removals(tmp_path, "day1") == oracle(stored, d2)
    assert any(k == "store_exact" for k, _ in removals(tmp_path, "day1").values())
    described = summary(tmp_path, "day1")["store"]
    assert (described["earlier_runs"], described["replaces_records"]) == (1, None)
    assert [r.run_id for r in FingerprintStore(str(tmp_path / "store")).runs()] == ["day1"]

    typo = tmp_path / "stroe"
    assert run_day(tmp_path, "d2", "day2", "store.update=false", store={"path": str(typo)}) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: store.path: no fingerprint store at {typo} (no STORE.json), and a check-only "
        "run (store.update: false) checks against an existing one: fix store.path, or set "
        "store.update: true to start a store"]
    assert not typo.exists()



def test_the_recall_sample_is_drawn_among_this_runs_records_whatever_the_store_holds(
        tmp_path):
    """Stored records are never removed, so never judged: drawn among stored and new
    records alike, the recall sample shrank as the store grew (a fourth day: 401 of the
    2,000 asked for, and its interval widened). It is drawn among this run's records."""
    d1 = write_day(tmp_path, "d1", day(16, 3000))
    d2 = write_day(tmp_path, "d2", day(17, 400, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "day1") == 0
    assert run_day(tmp_path, "d2", "day2", "near.recall_sample=120") == 0
    stored = [(i, x, "store") for i, x in d1 if i not in removals(tmp_path, "day1")]
    assert removals(tmp_path, "day2") == oracle(stored, d2)
    s = summary(tmp_path, "day2")
    check_accounting(s)
    searched = s["read"] - s["removed_exact"] - s["removed_store_exact"]  # reach near
    recall = s["near"]["recall"]
    # about 120 of the ~350 records of day 2 (the rate: 120 / those records); drawn among
    # all ~3,000 they were about 14
    assert 85 <= recall["sampled"] <= min(160, searched), (recall, searched)
    assert recall["with_partners"] > 0 and recall["recalled"] == recall["with_partners"]
def test_a_stopped_runs_attempt_is_removed_by_the_next_run_whatever_its_run_id(tmp_path):
    """A run stopped after its workers wrote to the store leaves an attempt no reader
    sees (d x 4 bytes a record for a near store); it was removed only when that run id
    ran again, and a dated run id never does. The next run to update the store removes
    it, whatever its run id; the committed runs stay whole."""
    d1 = write_day(tmp_path, "d1", day(18, 300))
    d2 = write_day(tmp_path, "d2", day(19, 300, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "day1") == 0
    root = tmp_path / "store"
    lost = FingerprintStore(str(root)).begin("day1b")  # stopped before its commit
    words = np.arange(40, dtype=np.uint64).reshape(20, 2)
    lost.write_exact(0, words, pa.array([f"x{i}" for i in range(20)]))
    lost.write_vectors(0, words, pa.array([f"x{i}" for i in range(20)]),
                       np.ones((20, DIM), np.float32))
    retry = FingerprintStore(str(root)).begin("day1")  # and a rerun of day1, stopped too
    retry.write_exact(0, words, pa.array([f"y{i}" for i in range(20)]))
    visible = {r.run_id: r.attempt for r in FingerprintStore(str(root)).runs()}
    assert run_day(tmp_path, "d2", "day2") == 0
    stored = [(i, x, "store") for i, x in d1 if i not in removals(tmp_path, "day1")]
    assert removals(tmp_path, "day2") == oracle(stored, d2)
    left = {p.relative_to(root / "runs").parts[:2] for p in (root / "runs").rglob("*")
            if p.is_file()}
    after = {r.run_id: r.attempt for r in FingerprintStore(str(root)).runs()}
    assert left == set(after.items()) and after == {**visible, "day2": after["day2"]}
    assert not (root / "runs" / "day1b").exists() or not any((root / "runs" / "day1b").iterdir())


def test_stores_that_cannot_be_written_or_read_stop_the_run_before_any_work(tmp_path, capsys):
    """Each a one-line exit 2 naming store.path, --dry-run included: a file where the
    store's folder would be made (it was a raw "[Errno 20] Not a directory" once the job
    had started), a damaged settings file or commit marker (a JSON traceback, exit 1), a
    settings file lost from a store that holds runs (the next run's dtype relabelled it)."""
    d1 = write_day(tmp_path, "d1", day(16, 200))
    (tmp_path / "afile").write_text("not a folder")
    for args in ((), ("--dry-run",)):
        assert run_day(tmp_path, "d1", "day1", store={"path": str(tmp_path / "afile" / "st")},
                       args=args) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: store.path: {tmp_path / 'afile'} is a file, not a directory: choose "
            "another store.path"]
    assert run_day(tmp_path, "d1", "day1") == 0
    meta = tmp_path / "store" / "STORE.json"
    marker = next((tmp_path / "store" / "commits" / "day1").glob("*.json"))
    good = meta.read_bytes(), marker.read_bytes()
    for damaged, text in ((meta, b""), (marker, good[1][:50])):
        damaged.write_bytes(text)
        for args in ((), ("--dry-run",)):
            capsys.readouterr()
            assert run_day(tmp_path, "d1", "day2", args=args) == 2
            err = capsys.readouterr().err.splitlines()
            assert len(err) == 1 and err[0].startswith(
                f"error: store.path: {damaged} is damaged ({len(text):,} bytes, not JSON: "), err
            assert err[0].endswith("restore it from a copy, or use a new store path")
        meta.write_bytes(good[0])
        marker.write_bytes(good[1])
    meta.unlink()  # lost: a run of float64 values had relabelled the store as float64
    wide = write_day(tmp_path, "d64", day(16, 50).astype(np.float64))
    assert len(wide) == 50
    for args in ((), ("--dry-run",)):
        assert run_day(tmp_path, "d64", "day2", args=args) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: store.path: {meta} is missing, but the store holds committed runs: "
            "restore it from a copy, or use a new store path"]
    meta.write_bytes(good[0])
    assert run_day(tmp_path, "d1", "day2") == 0  # restored: the store works as before
    assert set(removals(tmp_path, "day2")) == set(d for d, _ in d1)


def _fail(*_a, **_k):
    raise RuntimeError("simulated crash")


@pytest.mark.parametrize("where", ["write", "store_commit", "summary"])
def test_a_run_that_failed_half_way_finishes_correctly_when_started_again(
        tmp_path, monkeypatch, where):
    """The failure hits the Write step (nothing published), the store commit (the output
    already swapped in, store not updated) or summary.json (written before anything is
    replaced: nothing published): in each case a second start of the same run id ends as a
    run that never failed."""
    d1 = write_day(tmp_path, "d1", day(7, 300))
    d2 = write_day(tmp_path, "d2", day(8, 300, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "day1") == 0
    target = {"write": (write.WriteFile, "process"), "store_commit": (store.StoreCommit,
              "commit"), "summary": (report, "write_summary")}[where]
    with monkeypatch.context() as m:
        m.setattr(*target, _fail)
        assert run_day(tmp_path, "d2", "day2") == 1
    assert not (tmp_path / "out" / "report" / "day2" / "summary.json").exists()
    runs = [r.run_id for r in FingerprintStore(str(tmp_path / "store")).runs()]
    assert runs == ["day1"]  # summary.json is written before the store commit

    assert run_day(tmp_path, "d2", "day2") == 0
    stored = [(i, x, "store") for i, x in d1 if i not in removals(tmp_path, "day1")]
    expect = oracle(stored, d2)
    assert removals(tmp_path, "day2") == expect
    assert sorted(kept_ids(tmp_path, "day2")) == sorted(i for i, _ in d2 if i not in expect)
    runs = FingerprintStore(str(tmp_path / "store")).runs()
    assert [r.run_id for r in runs] == ["day1", "day2"]
    assert runs[1].records == len(d2) - len(expect)
    leftovers = [p.name for p in (tmp_path / "out").rglob(".*")]
    assert leftovers == []


def _at_publish(monkeypatch, tmp_path, plant) -> threading.Thread:
    """Calls ``plant`` once the run waits inside Publish (everything staged; the test
    hook ``publish.HOLD_ENV``), then lets Publish go on: a real fault on the disk, put
    at a known point without timing guesses."""
    hold = tmp_path / "hold"
    monkeypatch.setenv(publish.HOLD_ENV, str(hold))

    def helper() -> None:
        reached, deadline = Path(f"{hold}.reached"), time.monotonic() + 120
        while not reached.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            plant()
        finally:
            hold.touch()
    t = threading.Thread(target=helper, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("fault", ["summary-write", "store-commit", "summary-rename"])
def test_a_failure_while_publishing_says_exactly_what_was_published(
        tmp_path, monkeypatch, capsys, fault):
    """Real faults on the disk (a directory where Publish writes a file, a file where the
    store needs its run's directory; as root, a read-only folder would not stop a write):
    - summary-write: summary.json cannot be written, as on a full disk (the sweep's case:
      the line said "nothing was published" after the output had been replaced and the
      store committed). It is written before anything is replaced: nothing is published.
    - store-commit: the store's marker cannot be written: the output is in place, the store
      and the report are not, and the line says so.
    - summary-rename: everything but summary.json is in place, and the line says so.
    In each case a rerun of the same run id, the fault removed, ends as a clean run."""
    d1 = write_day(tmp_path, "d1", day(41, 64))
    d2 = write_day(tmp_path, "d2", day(42, 64, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "day1") == 0
    out, rep, st = (tmp_path / "out" / "clean" / "day2", tmp_path / "out" / "report" / "day2",
                    tmp_path / "store")
    planted: list[Path] = []

    def plant() -> None:
        if fault == "store-commit":
            planted.append(st / "commits" / "day2")
            planted[0].write_text("not a directory")
            return
        (stage,) = (tmp_path / "out" / "report").glob(".day2.staging-*")
        names = ["summary.json"] + (["summary.json.pending"] if fault == "summary-write" else [])
        for name in names:  # a directory where the file goes: every write there fails
            planted.append(stage / name)
            planted[-1].mkdir()
    helper = _at_publish(monkeypatch, tmp_path, plant)
    capsys.readouterr()
    assert run_day(tmp_path, "d2", "day2") == 1
    helper.join()
    (line,) = capsys.readouterr().err.strip().splitlines()
    runs = [r.run_id for r in FingerprintStore(str(st)).runs()]
    if fault == "summary-write":
        assert line.startswith("error: the job failed; nothing was published (the previous "
                               "output, if any, is unchanged): "), line
        assert "IsADirectoryError" in line, line
        assert not out.exists() and not rep.exists() and runs == ["day1"]
    else:
        assert line.startswith("error: the job failed while publishing; publishing stopped "
                               f"part way: output.path {out} "), line
        why = "FileExistsError" if fault == "store-commit" else "IsADirectoryError"
        assert f"to finish: {why}: " in line, line
        assert "run it again with the same run id (day2) to finish" in line, line
        assert sorted(p.name for p in out.glob("*.parquet")) == ["part-0.parquet",
                                                                  "part-1.parquet"]
        assert not (rep / "summary.json").is_file()
        if fault == "store-commit":
            assert (f"but the store was not updated and the report ({rep}) was not "
                    "published" in line), line
            assert runs == ["day1"]
        else:
            assert (f"output.path {out} and the report ({rep}) hold this run's results and "
                    "the store holds its records, but summary.json was not written" in line)
            assert runs == ["day1", "day2"]
            planted = [rep / "summary.json"]  # moved in with the report
    for p in planted:  # the disk repaired (a staged report is gone with its run)
        if p.is_dir():
            p.rmdir()
        elif p.exists():
            p.unlink()
    monkeypatch.delenv(publish.HOLD_ENV)
    assert run_day(tmp_path, "d2", "day2") == 0
    stored = [(i, x, "store") for i, x in d1 if i not in removals(tmp_path, "day1")]
    assert removals(tmp_path, "day2") == oracle(stored, d2)
    assert [r.run_id for r in FingerprintStore(str(st)).runs()] == ["day1", "day2"]
    assert summary(tmp_path, "day2")["store"]["committed"] is True
    assert [p.name for p in (tmp_path / "out").rglob(".*")] == []
    assert not (rep / "summary.json.pending").exists()


@pytest.mark.parametrize("ref_fmt", ["hdf5", "parquet"])
def test_reference_set_leaks_are_removed_and_the_reference_is_kept(tmp_path, ref_fmt):
    rng = np.random.default_rng(9)
    test_set = rng.normal(0, 4, (120, DIM)).astype(np.float32)
    test_set[5] = test_set[4]  # the reference itself holds a copy: both are kept
    test_set[7] = test_set[6] + 0.1  # and a near pair: both kept
    ref = write_day(tmp_path, "ref", test_set, fmt=ref_fmt, files=2)
    train = write_day(tmp_path, "train", day(10, 500, [test_set]))
    cfg = {"near": {"metric": "l2", "threshold": THRESHOLD}, "store": None,
           "reference": {"format": ref_fmt, "path": str(tmp_path / "ref" / f"*.{EXT[ref_fmt]}"),
                         "tensor": "emb", "id": "id"}}
    assert run_day(tmp_path, "train", "r1", **cfg) == 0
    expect = oracle([(i, x, "reference") for i, x in ref], train)
    got = removals(tmp_path, "r1")
    assert got == expect
    assert {"reference_exact", "reference_near"} <= {k for k, _ in got.values()}
    s = summary(tmp_path, "r1")
    check_accounting(s)
    assert s["removed_reference_exact"] == sum(k == "reference_exact" for k, _ in expect.values())
    assert s["removed_reference_near"] == sum(k == "reference_near" for k, _ in expect.values())
    assert s["reference"] == {"files": 2, "read": 120, "invalid": 0}
    leaked = {i for i, (k, _) in got.items() if k.startswith("reference")}
    assert not leaked & set(kept_ids(tmp_path, "r1"))  # no test record left in training data
    assert all(d.startswith("ref-") for k, d in got.values() if k.startswith("reference"))


def test_reference_and_store_together(tmp_path):
    test_set = np.random.default_rng(11).normal(0, 4, (60, DIM)).astype(np.float32)
    ref = write_day(tmp_path, "ref", test_set, files=1)
    d1 = write_day(tmp_path, "d1", day(12, 200))
    d2 = write_day(tmp_path, "d2", day(13, 300, [x for _, x in d1] + [test_set]))
    refcfg = {"format": "parquet", "path": str(tmp_path / "ref" / "*.parquet"),
              "tensor": "emb", "id": "id"}
    assert run_day(tmp_path, "d1", "a", reference=refcfg) == 0
    protected = [(i, x, "reference") for i, x in ref]
    e1 = oracle(protected, d1)
    assert removals(tmp_path, "a") == e1
    assert run_day(tmp_path, "d2", "b", reference=refcfg) == 0
    stored = [(i, x, "store") for i, x in d1 if i not in e1]
    assert removals(tmp_path, "b") == oracle(protected + stored, d2)


@pytest.mark.parametrize("where", ["reference", "store"])
def test_a_near_copy_names_the_protected_record_before_a_nearer_one_of_the_run(
        tmp_path, where):
    """X within the threshold of a protected record P (0.45 away) and of R, a record of
    this run kept before it (0.35 away; R is 0.8 from P): X is a near copy of P, as the
    precedence says (it was reported as a plain near copy of R: a leak not counted)."""
    rng = np.random.default_rng(14)
    u = rng.normal(size=DIM)
    u /= np.linalg.norm(u)
    p = rng.normal(0, 4, DIM).astype(np.float32)
    r, x = (p + 0.8 * u).astype(np.float32), (p + 0.45 * u).astype(np.float32)
    old = write_day(tmp_path, "old", np.vstack([p, rng.normal(0, 4, (59, DIM))]).astype(
        np.float32), files=1)
    new = write_day(tmp_path, "new", np.vstack([r, x, day(15, 200)]))
    if where == "reference":
        refcfg = {"format": "parquet", "path": str(tmp_path / "old" / "*.parquet"),
                  "tensor": "emb", "id": "id"}
        assert run_day(tmp_path, "new", "b", store=None, reference=refcfg) == 0
    else:
        assert run_day(tmp_path, "old", "a") == 0
        assert run_day(tmp_path, "new", "b") == 0
    got = removals(tmp_path, "b")
    assert got["new-1"] == (f"{where}_near", "old-0")
    assert got == oracle([(i, v, where) for i, v in old], new)
    assert summary(tmp_path, "b")[f"removed_{where}_near"] >= 1


@pytest.mark.parametrize("variable", ["input", "reference"])
def test_lists_of_no_fixed_size_pair_with_fixed_size_lists(tmp_path, variable):
    """list<float> on one side (no input.shape), fixed_size_list<float, 8> on the other:
    both hold 8 floats a record, so they compare (as with input.shape: [8]); a reference
    record of another size is reported invalid, as input.shape does for the input."""
    test_set = np.random.default_rng(9).normal(0, 4, (40, DIM)).astype(np.float32)
    ref = write_day(tmp_path, "ref", test_set, files=1)
    train = write_day(tmp_path, "train", day(10, 200, [test_set]), files=1)
    side = tmp_path / ("train" if variable == "input" else "ref") / "part-0.parquet"
    t = pq.read_table(side)
    emb = t.column("emb").to_pylist()
    if variable == "reference":
        emb[-1] = emb[-1][:7]  # a record of another size
    pq.write_table(t.set_column(1, "emb", pa.array(emb, pa.list_(pa.float32()))), side)
    cfg = {"store": None, "reference": {"format": "parquet", "tensor": "emb", "id": "id",
                                        "path": str(tmp_path / "ref" / "*.parquet")}}
    assert run_day(tmp_path, "train", "v", **cfg) == 0
    compared = ref[:-1] if variable == "reference" else ref
    assert removals(tmp_path, "v") == oracle([(i, x, "reference") for i, x in compared], train)
    assert summary(tmp_path, "v")["reference"]["invalid"] == (variable == "reference")


def test_default_run_id_is_the_utc_date_and_paths_use_it(tmp_path):
    write_day(tmp_path, "d1", day(14, 50))
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    cfg = {"store": None, "near": None}
    cfg["output"] = {"path": str(tmp_path / "o" / "{run_id}" / "clean")}
    cfg["report"] = str(tmp_path / "o" / "{run_id}" / "report")
    assert run_job(tmp_path, "parquet", str(tmp_path / "d1" / "*.parquet"), **cfg) == 0
    s = json.loads((tmp_path / "o" / today / "report" / "summary.json").read_text())
    assert s["run_id"] == today and s["output"] == str(tmp_path / "o" / today / "clean")


@pytest.mark.parametrize("sets, needle", [
    (["run_id=a/b"], "config key 'run_id': 'a/b' is not a usable run id"),
    (["exact=false", "near=null"], "config keys 'store' and 'exact'"),
])
def test_run_config_errors_are_one_line(tmp_path, capsys, sets, needle):
    write_day(tmp_path, "d1", day(15, 20))
    assert run_day(tmp_path, "d1", "x", *sets) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_store_of_another_dtype_is_refused_before_any_work(tmp_path, capsys):
    write_day(tmp_path, "d1", day(16, 40))
    assert run_day(tmp_path, "d1", "a") == 0
    x = day(17, 40).astype(np.float64)
    write_input("parquet", tmp_path / "d2" / "p.parquet", [str(i) for i in range(40)], x,
                np.zeros(40, np.int64))
    capsys.readouterr()
    assert run_day(tmp_path, "d2", "b") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: store.path:"), err
    assert not (tmp_path / "out" / "report" / "b").exists()


def test_reference_of_another_shape_is_refused(tmp_path, capsys):
    write_day(tmp_path, "d1", day(18, 40))
    write_input("parquet", tmp_path / "ref" / "r.parquet", ["r0"], np.zeros((1, 3), np.float32),
                np.zeros(1, np.int64))
    ref = {"format": "parquet", "path": str(tmp_path / "ref" / "*.parquet"), "tensor": "emb"}
    assert run_day(tmp_path, "d1", "a", reference=ref) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "reference.path" in err[0] and "no record could match" in err[0]


def test_publish_clears_what_a_killed_run_left(tmp_path):
    final = tmp_path / "clean"
    (tmp_path / ".clean.staging-123-456").mkdir()
    (tmp_path / ".clean.old-789").mkdir()
    (tmp_path / ".other.staging-1").mkdir()
    publish.clear_leftovers(final)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.staging-1"]


def test_run_id_in_the_input_path_picks_that_run_s_files(tmp_path):
    d = write_day(tmp_path, "in/day-a", day(19, 30))
    write_day(tmp_path, "in/day-b", day(20, 30))
    cfg = {"store": None, "near": None}
    cfg["output"] = {"path": str(tmp_path / "o" / "{run_id}")}
    cfg["report"] = str(tmp_path / "r" / "{run_id}")
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "{run_id}" / "*.parquet"),
                   "run_id=day-a", **cfg) == 0
    s = json.loads((tmp_path / "r" / "day-a" / "summary.json").read_text())
    assert s["read"] == len(d) and all("day-a" in f["input"] for f in s["files"])


def test_exact_only_store_across_runs(tmp_path):
    d1 = write_day(tmp_path, "d1", day(21, 200))
    d2 = write_day(tmp_path, "d2", day(22, 200, [x for _, x in d1]))
    assert run_day(tmp_path, "d1", "a", near=None) == 0
    assert run_day(tmp_path, "d2", "b", near=None) == 0
    got = removals(tmp_path, "b")
    stored = {canonical_key(x): i for i, x in d1 if i not in removals(tmp_path, "a")}
    seen, expect = dict(stored), {}
    for i, x in d2:
        k = canonical_key(x)
        if k in seen:
            expect[i] = ("store_exact" if k in stored else "exact", seen[k])
        else:
            seen[k] = i
    assert got == expect and any(k == "store_exact" for k, _ in got.values())
    assert not FingerprintStore(str(tmp_path / "store")).runs()[1].has_vectors


def _write_with_empty_first(tmp_path, name: str, x: np.ndarray, fmt: str):
    """``part-0`` empty (sorted first: nothing to read a dtype or shape from), the records
    in ``part-1``."""
    write_input(fmt, tmp_path / name / f"part-0.{EXT[fmt]}", [], np.zeros((0, DIM), x.dtype),
                np.zeros(0, np.int64))
    ids = [f"{name}-{i}" for i in range(len(x))]
    write_input(fmt, tmp_path / name / f"part-1.{EXT[fmt]}", ids, x, np.arange(len(x)) % 5)
    return list(zip(ids, x, strict=True))


@pytest.mark.parametrize("where", ["store", "reference", "input", "nonfinite"])
def test_an_empty_first_file_does_not_stand_for_the_records(tmp_path, where):
    """An empty TFRecord file first in a set stood for its dtype and shape (none): the
    store was refused ('this run null'), a reference set too ('no record could match');
    with ``near.nonfinite: invalid`` an empty file's chunk crashed the read (reshape of
    size 0). Each run now equals the oracle."""
    fmt = "parquet" if where == "nonfinite" else "tfrecord"
    a = day(30, 80)
    near = {"metric": "l2", "threshold": THRESHOLD,
            **({"nonfinite": "invalid"} if where == "nonfinite" else {})}

    def run(name: str, run_id: str, **cfg) -> int:
        cfg["output"] = {"path": str(tmp_path / "out" / "clean" / "{run_id}")}
        cfg["report"] = str(tmp_path / "out" / "report" / "{run_id}")
        return run_job(tmp_path, fmt, str(tmp_path / name / f"*.{EXT[fmt]}"),
                       f"run_id={run_id}", "runner.processes=false", near=near, input=shape,
                       **cfg)

    shape = {"shape": [DIM]} if fmt == "tfrecord" else {}  # flat float_list features
    ref = {"format": fmt, "path": str(tmp_path / "r" / f"*.{EXT[fmt]}"), "tensor": "emb",
           "id": "id", **shape}
    if where == "store":
        store = {"path": str(tmp_path / "store")}
        first = write_day(tmp_path, "a", a, fmt=fmt, files=1)
        assert run(name="a", run_id="a", store=store) == 0
        protected = [(i, x, "store") for i, x in first if i not in removals(tmp_path, "a")]
        later = _write_with_empty_first(tmp_path, "b", day(31, 80, [a]), fmt)
        assert run(name="b", run_id="b", store=store) == 0
    elif where == "reference":
        protected = [(i, x, "reference") for i, x in _write_with_empty_first(tmp_path, "r", a,
                                                                             fmt)]
        later = write_day(tmp_path, "b", day(31, 80, [a]), fmt=fmt, files=1)
        assert run(name="b", run_id="b", reference=ref) == 0
    elif where == "input":
        protected = [(i, x, "reference") for i, x in write_day(tmp_path, "r", a, fmt=fmt,
                                                               files=1)]
        later = _write_with_empty_first(tmp_path, "b", day(31, 80, [a]), fmt)
        assert run(name="b", run_id="b", reference=ref) == 0
    else:
        protected, later = [], _write_with_empty_first(tmp_path, "b", day(31, 80), fmt)
        assert run(name="b", run_id="b") == 0
    expect = oracle(protected, later)
    assert removals(tmp_path, "b") == expect
    assert len(expect) >= 10
    s = summary(tmp_path, "b")
    check_accounting(s)
    assert s["read"] == len(later)
