"""The framework-free cores of the training filters: Manifest (a finished run's removals)
and OnlineDedup (stream state), against the batch job's output and a brute-force oracle."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from filters.manifest import Manifest, ManifestError
from filters.online import OnlineDedup
from tests.jobkit import read_output, run_job, write_input
from tests.oracle import planted_stream, stream_oracle
from transforms.near.spec import NearSpec

SPECS = [None, NearSpec("l2", threshold=0.1), NearSpec("cosine", threshold=0.002),
         NearSpec("allclose", atol=0.03, rtol=0.01)]


def stream(seed: int = 0, n: int = 1500, d: int = 16) -> np.ndarray:
    return planted_stream(seed, n, d, copies=n // 5, nans=5)


def run(f: OnlineDedup, x: np.ndarray, ids: np.ndarray | None, order: np.ndarray,
        batch: int = 333) -> np.ndarray:
    """Feed ``x[order]`` in batches; the keep mask in the rows of ``x``."""
    keep = np.zeros(len(x), dtype=bool)
    for s in range(0, len(order), batch):
        rows = order[s:s + batch]
        keep[rows] = f.keep_mask(x[rows], None if ids is None else ids[rows])
    return keep


# --- online ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "exact" if s is None else s.metric)
def test_online_equals_sequential_oracle(spec):
    x = stream()
    f = OnlineDedup(near=spec)
    keep = run(f, x, None, np.arange(len(x)))
    oracle = stream_oracle(x, spec)
    assert (keep == oracle).all()
    assert f.stats.seen == len(x) and f.stats.kept == oracle.sum()
    assert f.stats.dropped_exact + f.stats.dropped_near == len(x) - oracle.sum()
    if spec is not None:
        assert f.stats.dropped_near > 0


@pytest.mark.parametrize("spec", SPECS[:2], ids=["exact", "l2"])
def test_with_ids_every_epoch_keeps_the_same_records_whatever_the_order(spec):
    x = stream(1)
    ids = np.array([f"r{i}" for i in range(len(x))])
    f = OnlineDedup(near=spec)
    first = run(f, x, ids, np.arange(len(x)))
    rng = np.random.default_rng(5)
    for _ in range(2):
        f.new_epoch()  # a no-op with ids: the front ends call it anyway
        assert (run(f, x, ids, rng.permutation(len(x)), batch=250) == first).all()
    assert f.stats.readmitted == 2 * first.sum()


def test_without_ids_each_epoch_is_deduplicated_on_its_own():
    x = stream(2)
    f = OnlineDedup()
    run(f, x, None, np.arange(len(x)))
    order = np.random.default_rng(0).permutation(len(x))
    assert not run(f, x, None, order).any()  # no new epoch: everything was seen
    f.new_epoch()
    assert (run(f, x, None, order)[order] == stream_oracle(x[order])).all()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "exact" if s is None else s.metric)
def test_saved_state_resumes_without_readmitting(tmp_path, spec):
    x = stream(3)
    ids = np.arange(len(x))
    half = len(x) // 2
    whole = OnlineDedup(near=spec)
    expect = run(whole, x, ids, np.arange(len(x)))
    f = OnlineDedup(near=spec)
    run(f, x, ids, np.arange(half))
    f.save(tmp_path / "state.npz")
    g = OnlineDedup.load(tmp_path / "state.npz")
    assert g.stats == f.stats and g.settings() == f.settings()
    # the resumed run sees the first half again (a restarted epoch), then the rest
    got = run(g, x, ids, np.arange(len(x)))
    assert (got == expect).all()
    assert g.stats.readmitted == expect[:half].sum()


def test_state_file_is_not_a_pickle(tmp_path):
    f = OnlineDedup(near=NearSpec("l2", threshold=0.1))
    f.keep_mask(stream()[:100])
    f.save(tmp_path / "s.npz")
    with np.load(tmp_path / "s.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
        assert json.loads(str(z["meta"]))["version"] == 1


def test_max_items_forgets_the_oldest():
    x = np.arange(1000, dtype=np.float32).reshape(-1, 1)
    f = OnlineDedup(max_items=100)
    assert f.keep_mask(x).all()
    assert 90 <= f.remembered <= 100
    again = f.keep_mask(x[::-1].copy())[::-1]  # newest first: still remembered
    assert not again[-90:].any()  # the newest records are remembered
    assert again[:800].all()  # the oldest were forgotten, so they are admitted again


def test_bloom_drops_copies_and_new_records_only_at_its_rate():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 8)).astype(np.float32)
    f = OnlineDedup(bloom=0.01, bloom_capacity=20000)
    keep = f.keep_mask(x)
    lost = int((~keep).sum())  # every record is new: a drop is a false positive
    assert lost < 0.01 * len(x) * 2
    assert not f.keep_mask(x[:5000]).any()  # copies are always dropped (no false negatives)
    assert f.nbytes() < 20000 * 4  # two filters of ~1.2 B per record each at 1%


def test_bloom_with_ids_readmits_the_kept_record():
    x = stream(4)
    ids = np.arange(len(x))
    f = OnlineDedup(bloom=1e-6, bloom_capacity=10 * len(x))
    first = run(f, x, ids, np.arange(len(x)))
    assert (first == stream_oracle(x)).all()
    order = np.random.default_rng(1).permutation(len(x))
    assert (run(f, x, ids, order) == first).all()


def test_torch_tensors_and_device_kernel_give_the_same_mask():
    torch = pytest.importorskip("torch")
    x = stream(5)
    want = OnlineDedup().keep_mask(x)
    assert (OnlineDedup().keep_mask(torch.from_numpy(x)) == want).all()
    assert (OnlineDedup(backend="torch").keep_mask(torch.from_numpy(x)) == want).all()


def test_nan_rows_are_kept_and_never_compared_by_distance():
    x = np.zeros((4, 3), np.float32)
    x[0, 0] = x[1, 0] = np.nan
    x[2] = [1, 1, 1]
    x[3] = [1, 1, 1.01]
    keep = OnlineDedup(near=NearSpec("l2", threshold=0.1)).keep_mask(x)
    assert keep.tolist() == [True, False, True, False]  # NaN copy: exact; row 3: near


def test_one_record_at_a_time():
    f = OnlineDedup()
    assert f.keep([1.0, 2.0], id="a") and not f.keep([1.0, 2.0], id="b")
    assert f.keep(np.array([1.0, 2.0]), id="a")  # its owner, again


@pytest.mark.parametrize("kw, message", [
    ({"near": NearSpec("l2", threshold=0.1, grouping="components")}, "representative"),
    ({"bloom": 0.01, "near": NearSpec("l2", threshold=0.1)}, "does not combine"),
    ({"bloom": 2.0}, "false-positive rate"),
    ({"max_items": 0}, "max_items"),
])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        OnlineDedup(**kw)


def test_ids_always_or_never_and_one_per_row():
    f = OnlineDedup()
    f.keep_mask(np.zeros((2, 2)), ids=[1, 2])
    with pytest.raises(ValueError, match="always or never"):
        f.keep_mask(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="3 ids for a batch of 2"):
        f.keep_mask(np.zeros((2, 2)), ids=[1, 2, 3])


def test_state_of_another_version_is_refused(tmp_path):
    f = OnlineDedup()
    f.keep_mask(np.zeros((2, 2)))
    f.save(tmp_path / "s.npz")
    with np.load(tmp_path / "s.npz") as z:
        arrays = dict(z)
    arrays["meta"] = np.array(json.dumps({**json.loads(str(arrays["meta"])), "version": 99}))
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(ValueError, match="state version 99"):
        OnlineDedup.load(tmp_path / "s.npz")
    (tmp_path / "text.npz").write_text("not a state")
    (tmp_path / "other.npz").write_bytes((tmp_path / "s.npz").read_bytes()[:200])
    np.savez(tmp_path / "arrays.npz", x=np.zeros(3))
    np.savez(tmp_path / "prose.npz", meta=np.array("not json"))
    for name, why in (("text", "not an .npz archive"), ("other", ""), ("arrays", "meta"),
                      ("prose", "Expecting value")):
        with pytest.raises(ValueError, match="not a state that OnlineDedup.save wrote") as e:
            OnlineDedup.load(tmp_path / f"{name}.npz")
        assert why in str(e.value) and "pickle" not in str(e.value)  # numpy's advice was
        # to load it unsafely with allow_pickle
        if Path("/proc/self/fd").exists():  # the archive was left open (e's frames held it)
            held = [fd for fd in os.listdir("/proc/self/fd")
                    if os.path.realpath(f"/proc/self/fd/{fd}") == str(tmp_path / f"{name}.npz")]
            assert held == [], name


# --- manifest --------------------------------------------------------------------------

def job_with_copies(tmp_path, *sets: str, glob: str | None = None
                    ) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3, (2, 200, 4)).astype(np.float32)  # many natural copies
    x[1, 5, 0] = np.nan  # with near.nonfinite: invalid, this record is reported invalid
    ids = [[f"f{f}-{i}" for i in range(200)] for f in range(2)]
    for f in range(2):
        write_input("parquet", tmp_path / "in" / f"part-{f}.parquet", ids[f], x[f],
                    np.zeros(200, np.int64))
    assert run_job(tmp_path, "parquet", glob or str(tmp_path / "in" / "*.parquet"), *sets) == 0
    return [i for f in ids for i in f], x.reshape(400, 4)


def clean_ids(tmp_path) -> list[str]:
    return [i for f in range(2) for i in
            read_output("parquet", tmp_path / "out" / "clean" / f"part-{f}.parquet", (4,))[0]]


def test_manifest_keeps_exactly_the_clean_output(tmp_path):
    ids, _ = job_with_copies(tmp_path, "near.metric=l2", "near.threshold=0.5",
                             "near.nonfinite=invalid")
    m = Manifest.load(tmp_path / "out" / "report")
    assert m.id_field == "id"
    via_uri = Manifest.load((tmp_path / "out" / "report").as_uri())  # pyarrow.fs, file://
    assert via_uri.removed_ids.equals(m.removed_ids) and via_uri.files == m.files
    kept = np.array(ids)[m.kept_indices(ids)].tolist()
    assert kept == clean_ids(tmp_path)
    assert len(m) == 400 - len(kept)
    everything = Manifest.load(tmp_path / "out" / "report", drop_invalid=False)
    assert set(np.array(ids)[everything.kept_indices(ids)]) - set(kept) == {"f1-5"}
    assert m.keep_mask([b"f1-5", "f0-0"]).tolist() == [False, True]  # bytes ids too


def test_manifest_default_ids_follow_the_job_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the job globbed a relative path: ids carry it
    ids, _ = job_with_copies(tmp_path, "input.id=null", glob="in/*.parquet")
    m = Manifest.load(tmp_path / "out" / "report")
    assert m.id_field is None
    monkeypatch.chdir("/")  # resolved against the job's working_dir, not ours
    kept = np.array(ids)[m.kept_indices()].tolist()
    assert kept == clean_ids(tmp_path)
    assert m.job_path(tmp_path / "in" / "part-1.parquet") == "in/part-1.parquet"
    assert m.file_ids(tmp_path / "in" / "part-0.parquet")[3].as_py() == "in/part-0.parquet:3"
    with pytest.raises(ManifestError, match="not one of the run's 2 input files"):
        m.job_path(tmp_path / "elsewhere.parquet")


def test_manifest_null_float_and_foreign_ids(tmp_path, monkeypatch):
    """A null id is a record the job reported invalid: not kept (unless drop_invalid is
    False). Ids that cannot match (floats, as pandas makes an integer column with a
    missing value; one string; default ids spelt with other paths) are refused: a
    filter that matches nothing keeps every record."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, (300, 4)).astype(np.float32)
    ids = [str(i) for i in range(300)]
    ids[17] = None
    write_input("parquet", tmp_path / "in" / "part-0.parquet", ids, x, np.zeros(300, np.int64))
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet")) == 0
    clean = read_output("parquet", tmp_path / "out" / "clean" / "part-0.parquet", (4,))[0]
    m = Manifest.load(tmp_path / "out" / "report")
    assert 0 < len(clean) < 299
    assert np.array(ids, object)[m.keep_mask(ids)].tolist() == list(clean)
    as_ints = [None if i is None else int(i) for i in ids]
    assert m.keep_mask(as_ints).tolist() == m.keep_mask(ids).tolist()
    pd = pytest.importorskip("pandas")  # the fix the float refusal names, and pandas' NA
    for series in (pd.Series(as_ints, dtype="Int64"), pd.Series(ids, dtype="string"),
                   pd.Series(ids, dtype=object), pd.Index(as_ints, dtype="Int64")):
        assert m.keep_mask(series).tolist() == m.keep_mask(ids).tolist()
    with pytest.raises(TypeError, match=r"astype\('Int64'\)"):
        m.keep_mask(pd.Series(as_ints, dtype=float))
    assert Manifest.load(tmp_path / "out" / "report", drop_invalid=False).keep_mask(ids)[17]
    for bad in (np.array([1.0, 2.0]), [0.0], "12"):
        with pytest.raises(TypeError, match="record ids|not a sequence"):
            m.keep_mask(bad)
    (tmp_path / "noid").mkdir()
    monkeypatch.chdir(tmp_path / "noid")  # the job's ids carry the relative path
    job_with_copies(tmp_path / "noid", "input.id=null", glob="in/*.parquet")
    m = Manifest.load(tmp_path / "noid" / "out" / "report")
    spelt = [f"./in/part-0.parquet:{i}" for i in range(200)]
    with pytest.raises(ManifestError, match="names none of the run's 2 input files"):
        m.keep_mask(spelt)
    assert m.keep_mask([m.job_path(p.split(":")[0]) + ":" + p.split(":")[1]
                        for p in spelt]).sum() < 200


def test_manifest_needs_a_finished_run(tmp_path):
    with pytest.raises(ManifestError, match="summary.json"):
        Manifest.load(tmp_path)
    with pytest.raises(ManifestError, match="summary.json"):  # read with pyarrow.fs
        Manifest.load(tmp_path.as_uri())
    with pytest.raises(ManifestError, match="can(not)? open this location"):
        Manifest.load("nosuchscheme://bucket/report")


def test_a_bloom_state_pickles_for_spawned_workers():
    import pickle

    f = OnlineDedup(bloom=0.001, bloom_capacity=1000)
    x = stream(6)[:500]
    f.keep_mask(x)
    g = pickle.loads(pickle.dumps(f))
    assert g.stats == f.stats
    assert not g.keep_mask(x).any()


def test_precomputed_digests_and_tensor_ids():
    torch = pytest.importorskip("torch")
    from transforms.fingerprint import fingerprint_batch

    x = stream(7)[:300]
    want = OnlineDedup().keep_mask(x, ids=np.arange(300))
    got = OnlineDedup().keep_mask(x, ids=[torch.tensor(i) for i in range(300)],
                                  digests=fingerprint_batch(x))
    assert (got == want).all()


def test_near_records_of_another_size_are_refused_by_name():
    f = OnlineDedup(near=NearSpec("l2", threshold=0.1))
    f.keep_mask(np.zeros((3, 64)))
    with pytest.raises(ValueError, match="records of 10 values after records of 64"):
        f.keep_mask(np.ones((3, 10)))
