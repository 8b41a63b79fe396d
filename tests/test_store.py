"""Fingerprint store against a brute-force model (Python dicts), on a local path and on an
object-store-like scheme (``fakegs://``, tests/fakefs.py): lookups, reruns replacing their
run, crash windows (commits and compactions), settings checks, bucket reads, compaction,
values bit for bit."""

from __future__ import annotations

import json
import pickle

import ml_dtypes
import numpy as np
import pyarrow as pa
import pytest

from tests import fakefs
from transforms.io import fs
from transforms.store import parts as store_parts
from transforms.store import segment as digest_segment
from transforms.store import store as store_mod
from transforms.store.store import FingerprintStore, StoreError

META = {"scheme": "xxh3-128/v1", "dtype": "float32", "shape": [4], "dim": 4}


@pytest.fixture(params=["local", "fakegs"])
def root(request, tmp_path, monkeypatch) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return fakefs.bucket(monkeypatch, tmp_path) + "/store"


def rand_words(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)


def ids_for(run_id: str, n: int) -> pa.Array:
    return pa.array([f"{run_id}/rec{i}" for i in range(n)])


class Model:
    """What the store should answer: runs in commit order, a rerun replaces its run,
    a digest in several runs belongs to the earliest committed one."""

    def __init__(self):
        self.runs: dict[str, tuple[int, np.ndarray, list[str]]] = {}
        self.seq = 0

    def commit(self, run_id: str, words: np.ndarray, ids: pa.Array) -> None:
        self.seq += 1
        self.runs.pop(run_id, None)
        self.runs[run_id] = (self.seq, words, ids.to_pylist())

    def expect(self, queries: np.ndarray, exclude: str | None = None) -> list:
        table: dict[tuple[int, int], tuple[str, str]] = {}
        for run_id, (_, words, ids) in sorted(self.runs.items(), key=lambda kv: kv[1][0]):
            if run_id != exclude:
                for key, rid in zip(map(tuple, words.tolist()), ids, strict=True):
                    table.setdefault(key, (rid, run_id))
        return [table.get(tuple(q)) for q in queries.tolist()]


def answers(store: FingerprintStore, queries: np.ndarray, exclude: str | None = None) -> list:
    found, ids, runs = store.lookup(queries, exclude_run=exclude)
    assert len(found) == len(ids) == len(runs) == len(queries)
    assert ids.null_count == runs.null_count == int((~found).sum())
    return [(i, r) if f else None
            for f, i, r in zip(found.tolist(), ids.to_pylist(), runs.to_pylist(), strict=True)]


def commit_run(store: FingerprintStore, run_id: str, words: np.ndarray, ids: pa.Array,
               parts: int = 3, x: np.ndarray | None = None, meta: dict = META,
               model: Model | None = None, split=None) -> str:
    """One run as the job does it: clean up, begin, write parts, commit."""
    store.cleanup_uncommitted()
    attempt = store.begin(run_id)
    split = np.array_split(np.arange(len(words)), parts) if split is None else split
    stats = []
    for p, rows in enumerate(split):
        stats.append(attempt.write_exact(p, words[rows], ids.take(pa.array(rows))))
        if x is not None:
            stats.append(attempt.write_vectors(p, words[rows], ids.take(pa.array(rows)),
                                               x[rows]))
    store.commit(attempt, stats, meta, {"note": run_id})
    if model is not None:
        model.commit(run_id, words, ids)
    return attempt.name


def markers(root: str, run_id: str) -> list[str]:
    return fs.match(fs.join(root, "commits", run_id, "*"))


def attempt_files(root: str, run_id: str) -> list[str]:
    return fs.match(fs.join(root, "runs", run_id, "**"))


def test_fs_helpers(root):
    path = fs.join(root, "a", "b.bin")
    fs.makedirs(fs.join(root, "a"))
    assert not fs.exists(path) and fs.match(fs.join(root, "**")) == []
    fs.write_bytes_atomic(path, b"old")
    fs.write_bytes_atomic(path, b"new contents")
    assert fs.read_bytes(path) == b"new contents"
    assert fs.match(fs.join(root, "**")) == [path]  # no temporary file left behind
    with fs.open_read(path) as f:
        f.seek(4)
        assert f.read(3) == b"con"
    fs.delete_tree(fs.join(root, "a"))
    fs.delete_tree(fs.join(root, "a"))  # missing: no error
    assert fs.match(fs.join(root, "**")) == [] and not fs.exists(path)


def test_lookup_matches_model(root):
    rng = np.random.default_rng(1)
    store, model = FingerprintStore(root), Model()
    assert store.runs() == [] and store.meta() is None
    history = []
    for k, run_id in enumerate(["2026-01-01", "2026-01-02", "2026-01-03"]):
        words = rand_words(rng, 3000)
        if history:  # some digests an earlier run already holds: the earliest run wins
            words[:50] = history[-1][:50]
        history.append(words)
        commit_run(store, run_id, words, ids_for(run_id, len(words)), parts=k + 1, model=model)
    queries = np.concatenate([h[rng.choice(len(h), 200, replace=False)] for h in history]
                             + [rand_words(rng, 200), history[0][:5], history[2][:5]])
    for exclude in [None, "2026-01-01", "2026-01-02", "2026-01-03", "other"]:
        assert answers(store, queries, exclude) == model.expect(queries, exclude)
    assert answers(store, queries[:0]) == []
    runs = store.runs()
    assert [r.run_id for r in runs] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert [r.records for r in runs] == [3000] * 3
    assert [len(r.parts) for r in runs] == [1, 2, 3] and not any(r.has_vectors for r in runs)
    assert runs[1].extra == {"note": "2026-01-02"} and runs[0].committed_at < runs[1].committed_at
    assert [r.run_id for r in store.runs(exclude="2026-01-02")] == ["2026-01-01", "2026-01-03"]
    assert store.meta() == META


def test_rerun_replaces_its_run(root):
    rng = np.random.default_rng(2)
    store, model = FingerprintStore(root), Model()
    a1, b = rand_words(rng, 1000), rand_words(rng, 1000)
    first = commit_run(store, "a", a1, ids_for("a1", 1000), model=model)
    commit_run(store, "b", b, ids_for("b", 1000), model=model)
    a2 = np.concatenate([a1[:300], rand_words(rng, 500)])  # the rerun keeps part of the old
    second = commit_run(store, "a", a2, ids_for("a2", 800), parts=2, model=model)
    assert second > first
    queries = np.concatenate([a1, a2, b])
    assert answers(store, queries) == model.expect(queries)
    assert sum(r.run_id == "a" for r in store.runs()) == 1
    assert [r.run_id for r in store.runs()] == ["b", "a"]  # a rerun counts as committed now
    assert markers(root, "a") == [fs.join(root, "commits", "a", f"{second}.json")]
    assert {p.split("/")[-2] for p in attempt_files(root, "a")} == {second}


def test_uncommitted_attempt_is_invisible_and_cleaned_up(root):
    rng = np.random.default_rng(3)
    store, model = FingerprintStore(root), Model()
    old = rand_words(rng, 500)
    kept = commit_run(store, "r", old, ids_for("old", 500), model=model)
    attempt = store.begin("r")  # a rerun that dies after writing one part
    new = rand_words(rng, 500)
    attempt.write_exact(0, new, ids_for("new", 500))
    fs.write_bytes_atomic(fs.join(root, "commits", "r", f".{attempt.name}.json.tmp-dead"),
                          b'{"half": ')  # and a marker that never got its rename
    never = store.begin("never")
    never.write_exact(0, rand_words(rng, 10), ids_for("never", 10))
    queries = np.concatenate([old, new])
    assert answers(store, queries) == model.expect(queries)
    assert [(r.run_id, r.attempt) for r in store.runs()] == [("r", kept)]
    store.cleanup_uncommitted()  # every run id's, not only the next run's
    assert {p.split("/")[-2] for p in attempt_files(root, "r")} == {kept}
    assert len(markers(root, "r")) == 1 and attempt_files(root, "never") == []
    assert answers(store, queries) == model.expect(queries)


@pytest.mark.parametrize("crash", ["before_old_deleted", "after_old_marker_deleted"])
def test_crash_during_commit_shows_one_attempt(root, monkeypatch, crash):
    rng = np.random.default_rng(4)
    store, model = FingerprintStore(root), Model()
    old = rand_words(rng, 400)
    commit_run(store, "r", old, ids_for("old", 400), model=model)
    new = rand_words(rng, 400)
    real_delete = fs.delete_tree

    def crashing_delete(path: str) -> None:
        if crash == "before_old_deleted" or "/runs/" in path:
            raise RuntimeError("killed")
        real_delete(path)

    with monkeypatch.context() as m:
        m.setattr(fs, "delete_tree", crashing_delete)
        with pytest.raises(RuntimeError, match="killed"):
            commit_run(store, "r", new, ids_for("new", 400))
    model.commit("r", new, ids_for("new", 400))  # the marker was written: it counts
    assert len(attempt_files(root, "r")) > 3  # both attempts' files are still there
    assert len(markers(root, "r")) == (2 if crash == "before_old_deleted" else 1)
    fresh = FingerprintStore(root)
    (visible,) = [r for r in fresh.runs() if r.run_id == "r"]
    queries = np.concatenate([old, new])
    assert answers(fresh, queries) == model.expect(queries)  # the new attempt only
    fresh.cleanup_uncommitted()
    assert {p.split("/")[-2] for p in attempt_files(root, "r")} == {visible.attempt}
    assert answers(fresh, queries) == model.expect(queries)


def test_settings_and_commit_checks(root):
    rng = np.random.default_rng(5)
    store = FingerprintStore(root)
    store.check_compatible(META)  # empty store: anything goes
    commit_run(store, "a", rand_words(rng, 10), ids_for("a", 10))
    store.check_compatible(dict(META))
    other = {**META, "dtype": "float64", "shape": [8]}
    with pytest.raises(StoreError) as err:
        commit_run(store, "b", rand_words(rng, 10), ids_for("b", 10), meta=other)
    msg = str(err.value)
    assert "\n" not in msg and 'dtype: store "float32", this run "float64"' in msg
    assert "shape: store [4], this run [8]" in msg and "use a new store path" in msg
    with pytest.raises(StoreError, match="extra: store absent, this run 1"):
        store.check_compatible({**META, "extra": 1})
    assert [r.run_id for r in store.runs()] == ["a"] and store.meta() == META
    attempt = store.begin("c")
    stats = attempt.write_exact(0, rand_words(rng, 5), ids_for("c", 5))
    with pytest.raises(StoreError, match="reported twice"):
        store.commit(attempt, [stats, stats], META)
    with pytest.raises(StoreError, match="exact-00001.seg is missing"):
        store.commit(attempt, [stats, {**stats, "part": 1, "file": "exact-00001.seg"}],
                     META)
    with pytest.raises(ValueError, match="not a usable run id"):
        store.begin("../escape")
    with pytest.raises(ValueError, match=r"\(n, 2\) uint64"):
        store.lookup(np.zeros((3, 2), np.int64))
    fs.write_bytes_atomic(fs.join(root, "STORE.json"), json.dumps(
        {"format": store_mod.FORMAT, "version": 99, "meta": META}).encode())
    with pytest.raises(StoreError, match=f"not a version-{store_mod.VERSION} fingerprint"):
        store.meta()


def test_retried_part_and_pickled_attempt(root):
    rng = np.random.default_rng(6)
    store, model = FingerprintStore(root), Model()
    words, ids = rand_words(rng, 300), ids_for("r", 300)
    attempt = pickle.loads(pickle.dumps(store.begin("r")))  # as a Beam worker gets it
    stats = [attempt.write_exact(0, words[:200], ids[:200]),
             attempt.write_exact(1, words[200:], ids[200:])]
    assert attempt.write_exact(1, words[200:], ids[200:]) == stats[1]  # a retried bundle
    store.commit(attempt, stats, META)
    model.commit("r", words, ids)
    assert answers(store, words) == model.expect(words)
    assert store.runs()[0].records == 300 and len(attempt_files(root, "r")) == 2


def test_edge_keys_and_small_buckets(root, monkeypatch):
    """Digests at the ends of the key space and on both sides of the sign bit, with many
    one-or-two-row buckets, and digests stored twice (two runs merged into one segment)."""
    monkeypatch.setattr(digest_segment, "BUCKET_ROWS", 2)
    top = 2**64 - 1
    his = [0, 1, 2**63 - 2, 2**63 - 1, 2**63, 2**63 + 1, top - 1, top]
    words = np.array([(h, lo) for h in his for lo in (0, 5, top)], np.uint64)
    store, model = FingerprintStore(root), Model()
    commit_run(store, "r", words, ids_for("r", len(words)), parts=1, model=model)
    near_misses = np.array([(h, lo) for h in his for lo in (1, top - 1)], np.uint64)
    queries = np.concatenate([words, near_misses, words[::-1]])
    assert answers(store, queries) == model.expect(queries)
    (part,) = store.runs()[0].parts
    assert part["min"] == "0" * 32 and part["max"] == "f" * 32
    commit_run(store, "s", words[8:], ids_for("s", 16), parts=1, model=model)  # same tier
    assert store.compact(fanin=2)["merges"] == 1  # one segment, each of s's digests twice
    (seg,) = store.plan().segments
    assert seg.rows == len(words) + 16
    for exclude in [None, "r", "s"]:
        assert answers(store, queries, exclude) == model.expect(queries, exclude)


def test_lookup_reads_about_one_bucket_per_digest(root, monkeypatch):
    monkeypatch.setattr(digest_segment, "_GAP_LOCAL", 0)  # no reading through gaps
    monkeypatch.setattr(digest_segment, "_GAP_REMOTE", 0)
    rng = np.random.default_rng(7)
    store, model = FingerprintStore(root), Model()
    words = rand_words(rng, 400_000)
    shard = (words[:, 0] >> np.uint64(60)).astype(np.int64)  # range parts, like the job
    split = [np.flatnonzero(shard == s) for s in range(16)]
    commit_run(store, "big", words, ids_for("big", len(words)), model=model, split=split)
    total_bytes = sum(len(fs.read_bytes(p)) for p in attempt_files(root, "big"))
    queries = np.concatenate([words[rng.choice(len(words), 10, replace=False)],
                              rand_words(rng, 10)])
    fetched = fakefs.FETCHED.total()
    assert answers(store, queries) == model.expect(queries)
    fetched = fakefs.FETCHED.total() - fetched  # what gs:// would download (0 when local)
    st = store.last_lookup_stats
    assert st["segments"] == 16 and st["segments_opened"] <= len(queries)
    # per digest: two directory entries, one bucket (256 rows of 16 bytes on average), a
    # run and an id of each hit; per segment opened, its header: a bound that does not
    # depend on the segment's size
    assert st["bytes_read"] <= len(queries) * 8192 + st["segments_opened"] * 100
    assert st["bytes_read"] < total_bytes / 50
    # and that is what an object store sends: no 16 MB read-ahead per bucket read (Beam's
    # GCS reader fetched each segment whole: 11.4 MB for 20 digests)
    assert fetched <= 1.1 * st["bytes_read"] + (8 << 10)
    one_shard = words[split[3][:5]]
    assert answers(store, one_shard) == model.expect(one_shard)
    assert store.last_lookup_stats["segments_opened"] == 1


def test_compaction_matches_model_and_keeps_lookups_few(root):
    """Many runs of mixed sizes, reruns and exclusions, compacted after every commit:
    every lookup still equals the model, the segments a lookup may open stay
    logarithmic in the runs, and what merges replaced is deleted."""
    rng = np.random.default_rng(9)
    store, model = FingerprintStore(root), Model()
    history: list[np.ndarray] = []
    for k in range(14):
        run_id = f"r{k % 11:02d}"  # r00..r02 are run again at the end: replaced attempts
        n = int(rng.choice([40, 60, 200]))
        words = rand_words(rng, n)
        if history:  # digests already stored, and one stored twice within the run
            old = np.concatenate(history)
            words[:10] = old[rng.choice(len(old), 10)]
            words[10] = words[0]
        history.append(words)
        commit_run(store, run_id, words, ids_for(f"{run_id}.{k}", n), parts=1 + k % 3,
                   model=model)
        store.compact(fanin=3)
        queries = np.concatenate([np.concatenate(history)[::3], rand_words(rng, 20)])
        for exclude in [None, run_id, "r00"]:
            assert answers(store, queries, exclude) == model.expect(queries, exclude)
        plan = store.plan()
        units = {s.unit for s in plan.segments}
        sizes = {}
        for s in plan.segments:
            sizes[s.unit] = sizes.get(s.unit, 0) + s.rows
        tiers = [int(np.log(max(v, 1)) / np.log(3) + 1e-9) for v in sizes.values()]
        assert all(tiers.count(t) < 3 for t in tiers)  # nothing left due
        assert len(units) <= 2 * (len(set(tiers)))
    compactions = fs.match(fs.join(root, "compactions", "*.json"))
    assert compactions and len(compactions) == len(
        {s.unit for s in store.plan().segments if not s.path.startswith(fs.join(root, "runs"))})
    on_disk = set(fs.match(fs.join(root, "**", "exact-*.seg")))
    assert on_disk == {s.path for s in store.plan().segments}  # nothing else kept


def test_crashed_compaction_changes_no_answer(root, monkeypatch):
    """A merge killed before its marker (files only), and one killed after its marker
    but before the replaced segments were deleted: answers stay right throughout, and
    the next compaction clears the leftovers."""
    rng = np.random.default_rng(10)
    store, model = FingerprintStore(root), Model()
    runs = {f"r{k}": rand_words(rng, 100) for k in range(4)}
    for run_id, words in list(runs.items())[:3]:
        commit_run(store, run_id, words, ids_for(run_id, 100), model=model)
    queries = np.concatenate(list(runs.values()))
    real_write = fs.write_bytes_atomic

    def no_marker(path, data):
        if "/compactions/" in path:
            raise RuntimeError("killed")
        real_write(path, data)

    with monkeypatch.context() as m:
        m.setattr(fs, "write_bytes_atomic", no_marker)
        with pytest.raises(RuntimeError, match="killed"):
            store.compact(fanin=3)
    assert fs.match(fs.join(root, "compacted", "**"))  # files without a marker
    assert answers(store, queries) == model.expect(queries)
    assert len({s.unit for s in store.plan().segments}) == 3

    with monkeypatch.context() as m:
        m.setattr(FingerprintStore, "_collect_garbage", lambda self: None)
        assert store.compact(fanin=3)["merges"] == 1
    (unit,) = {s.unit for s in store.plan().segments}
    assert len(fs.match(fs.join(root, "compacted", "*", "*"))) > 3  # the dead merge's too
    assert answers(store, queries) == model.expect(queries)
    commit_run(store, "r3", runs["r3"], ids_for("r3", 100), model=model)
    store.compact(fanin=3)
    assert answers(store, queries) == model.expect(queries)
    kept = set(fs.match(fs.join(root, "**", "exact-*.seg")))
    assert kept == {s.path for s in store.plan().segments}
    assert len(fs.match(fs.join(root, "compactions", "*"))) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "complex64"])
def test_vectors_roundtrip_bit_for_bit(root, monkeypatch, dtype):
    monkeypatch.setattr(store_parts, "VECTOR_GROUP_BYTES", 1000)  # several row groups
    rng = np.random.default_rng(8)
    store = FingerprintStore(root)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    sent = {}
    for run_id, n in [("a", 300), ("b", 150), ("c", 0)]:
        words = rand_words(rng, n)
        bits = rng.integers(0, 256, size=(n, 5 * dt.itemsize), dtype=np.uint8)
        x = bits.view(dt)  # any bit pattern: NaN payloads, -0.0, subnormals, inf
        meta = {**META, "dtype": dtype, "shape": [5], "dim": 5}
        commit_run(store, run_id, words, ids_for(run_id, n), parts=2, x=x, meta=meta)
        sent[run_id] = (words, ids_for(run_id, n).to_pylist(), bits)
    commit_run(store, "plain", rand_words(rng, 5), ids_for("plain", 5),
               meta={**META, "dtype": dtype, "shape": [5], "dim": 5})
    assert [r.has_vectors for r in store.runs()] == [True, True, True, False]
    for exclude in [None, "a"]:
        got: dict[str, list] = {}
        for words, ids, runs, x in store.vectors(exclude_run=exclude, batch_rows=64):
            assert len(words) == len(ids) == len(runs) == len(x) <= 64
            assert x.dtype == dt and x.shape[1] == 5
            for run_id in set(runs.to_pylist()):
                got.setdefault(run_id, []).append((words, ids.to_pylist(), x.view(np.uint8)))
        expected = {r for r in ("a", "b") if r != exclude}
        assert set(got) == expected
        for run_id in expected:
            words = np.concatenate([g[0] for g in got[run_id]])
            ids = sum((g[1] for g in got[run_id]), [])
            bits = np.concatenate([g[2] for g in got[run_id]])
            np.testing.assert_array_equal(words, sent[run_id][0])
            assert ids == sent[run_id][1]
            np.testing.assert_array_equal(bits, sent[run_id][2])


@pytest.mark.parametrize("first", ["complete", "marker_only"])
def test_commit_retried_ends_like_one_commit(root, monkeypatch, first):
    """Dataflow may run Publish's commit twice, or again after the first died once its
    marker was written: the store ends as after one commit (one marker, first commit
    time and order kept, the replaced attempt gone), never with the run twice."""
    rng = np.random.default_rng(9)
    store, model = FingerprintStore(root), Model()
    commit_run(store, "a", rand_words(rng, 300), ids_for("a", 300), model=model)
    old = rand_words(rng, 200)
    commit_run(store, "b", old, ids_for("old", 200), model=model)
    new = rand_words(rng, 200)
    attempt = store.begin("b")
    stats = [attempt.write_exact(0, new, ids_for("new", 200))]
    if first == "complete":
        store.commit(attempt, stats, META)
    else:
        with monkeypatch.context() as m:  # killed after the marker, before the old attempt goes
            m.setattr(FingerprintStore, "_prune", lambda *_a: (_ for _ in ()).throw(
                RuntimeError("killed")))
            with pytest.raises(RuntimeError, match="killed"):
                store.commit(attempt, stats, META)
    before = [(r.run_id, r.attempt, r.committed_ns) for r in store.runs()]
    store.commit(attempt, stats, META)  # the retry
    model.commit("b", new, ids_for("new", 200))
    assert [(r.run_id, r.attempt, r.committed_ns) for r in store.runs()] == before
    assert len(markers(root, "b")) == 1
    assert {p.split("/")[-2] for p in attempt_files(root, "b")} == {attempt.name}
    queries = np.concatenate([old, new])
    assert answers(store, queries) == model.expect(queries)


def test_a_file_removed_under_a_reader_is_one_line_naming_it(root):
    """A check-only run takes no lease: a run that updates the store meanwhile may
    compact it (its digest segments merged, then deleted) or replace a run (its values
    deleted). The reader's lookup with the plan it fixed, or its read of stored values,
    then names the file and what happened, where it was a bare FileNotFoundError."""
    rng = np.random.default_rng(21)
    store = FingerprintStore(root)
    words = [rand_words(rng, 50) for _ in range(3)]
    for k, w in enumerate(words):
        commit_run(store, f"r{k}", w, ids_for(f"r{k}", 50), parts=1,
                   x=rng.normal(size=(50, 4)).astype(np.float32))
    plan = store.plan()  # the reader's fixed view
    values = store.vectors(batch_rows=10)
    next(values)  # reading r0's values
    store.compact(fanin=3)  # the writer's upkeep deletes the segments the plan names
    with pytest.raises(StoreError, match=r"exact-\d+\.seg was removed while this run read "
                       r"the store: another run updated it meanwhile .*: run this one again"):
        store.lookup(np.concatenate(words), plan=plan)
    commit_run(store, "r1", words[1], ids_for("r1b", 50), parts=1,
               x=rng.normal(size=(50, 4)).astype(np.float32))  # r1 rerun: old values go
    with pytest.raises(StoreError, match=r"vectors-\d+\.parquet was removed while this run "
                       "read the store"):
        list(values)
