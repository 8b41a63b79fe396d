"""The PyTorch front end through real DataLoaders (worker processes included): the manifest
sampler against the batch job's clean output, the online dataset and the device mask
against a sequential brute-force oracle."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from filters.manifest import Manifest, ManifestError
from filters.online import OnlineDedup
from filters.torch import (
    ManifestSampler,
    OnlineDedupDataset,
    keep_mask_on_device,
    manifest_sampler,
    manifest_subset,
)
from tests.jobkit import read_output, run_job, write_input
from tests.oracle import StreamOracle, canonical_key, planted_stream, stream_oracle
from transforms.near.spec import NearSpec

SPEC = NearSpec("l2", threshold=0.1)


# --- oracles and data --------------------------------------------------------------------

def id_oracle(records: list[tuple[str, np.ndarray]]) -> list[bool]:
    """Exact filter with record ids: a value's first record owns it; a later record with
    that value is kept only if it is the owner (a later epoch)."""
    oracle = StreamOracle(with_ids=True)
    return [oracle.keep(rid, t) for rid, t in records]


def stream(seed: int, n: int = 240, d: int = 8) -> np.ndarray:
    """Exact, near and decoy copies, NaNs, and -0.0 / +0.0 rows (one value)."""
    return planted_stream(seed, n, d, copies=n // 4, nans=4, zeros=6)


class Rows(Dataset):
    """Map-style: element i is (tensor, i)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = torch.from_numpy(x)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], i


class Shuffled(IterableDataset):
    """Yields (tensor, id) in a new seeded order every pass, like a shuffling reader."""

    def __init__(self, x: np.ndarray, ids: list[str], seed: int = 0) -> None:
        self.x, self.ids, self.seed, self.epoch = torch.from_numpy(x), ids, seed, 0

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(len(self.x))

    def __iter__(self):
        order = self.order(self.epoch)
        self.epoch += 1
        return ((self.x[i], self.ids[i]) for i in order.tolist())


class Records(IterableDataset):
    """Yields (tensor, id) of a fixed list of records, in order."""

    def __init__(self, records: list[tuple[str, np.ndarray]]) -> None:
        self.records = [(torch.from_numpy(t), r) for r, t in records]

    def __iter__(self):
        return iter(self.records)


def by_id(element, index):
    return element[1]


def out_ids(loader) -> list:
    return [e[1] for e in loader]


# --- manifest mode -----------------------------------------------------------------------

class ParquetRecords(Dataset):
    """The job's input files concatenated in the job's order: element i is (id, tensor)."""

    def __init__(self, manifest: Manifest) -> None:
        parts = [read_output("parquet", Path(manifest.working_dir or "") / f["input"], (4,))
                 for f in manifest.files]
        self.ids = [i for p in parts for i in p[0]]
        self.x = torch.from_numpy(np.concatenate([p[1] for p in parts]))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[str, torch.Tensor]:
        return self.ids[i], self.x[i]


def manifest_job(tmp_path, *sets: str) -> tuple[Manifest, ParquetRecords, list[str], np.ndarray]:
    """Run the real job on two parquet files with many copies; (manifest, dataset over its
    input, clean ids and tensors in output order)."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3, (2, 150, 4)).astype(np.float32)
    for f in range(2):
        write_input("parquet", tmp_path / "in" / f"part-{f}.parquet",
                    [f"f{f}-{i}" for i in range(150)], x[f], np.zeros(150, np.int64))
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"), *sets) == 0
    m = Manifest.load(tmp_path / "out" / "report")
    clean = [read_output("parquet", tmp_path / "out" / "clean" / f"part-{f}.parquet", (4,))
             for f in range(2)]
    ids = [i for c in clean for i in c[0]]
    assert 40 < len(ids) < 250  # the run removed copies, not everything
    return m, ParquetRecords(m), ids, np.concatenate([c[1] for c in clean])


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return manifest_job(tmp_path_factory.mktemp("job"))


def test_sampler_in_a_dataloader_gives_the_clean_output(job):
    m, ds, clean_ids, clean_x = job
    loader = DataLoader(ds, sampler=manifest_sampler(m, ds.ids), num_workers=2, batch_size=16)
    batches = list(loader)
    assert [i for ids, _ in batches for i in ids] == clean_ids  # the job's order
    got = torch.cat([x for _, x in batches]).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), clean_x.view(np.uint32))

    sub = manifest_subset(ds, m, ds.ids)
    assert [sub[k][0] for k in range(len(sub))] == clean_ids

    shuffled = manifest_sampler(m, ds.ids, shuffle=True, seed=3)
    assert len(shuffled) == len(clean_ids)
    epochs = []
    for epoch in range(2):
        shuffled.set_epoch(epoch)
        epochs.append([i for ids, _ in DataLoader(ds, sampler=shuffled, batch_size=16)
                       for i in ids])
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(clean_ids)
    assert epochs[0] != clean_ids and epochs[0] != epochs[1]  # really shuffled, per epoch


@pytest.mark.parametrize("shuffle, drop_last", [(False, False), (True, False), (True, True)])
def test_sampler_ranks_split_the_kept_set_evenly(job, shuffle, drop_last):
    m, ds, clean_ids, _ = job
    kept = m.kept_indices(ds.ids)
    ranks = [ManifestSampler(kept, num_replicas=2, rank=r, shuffle=shuffle, seed=1,
                             drop_last=drop_last) for r in range(2)]
    for s in ranks:
        s.set_epoch(4)
    out = [list(s) for s in ranks]
    assert len(out[0]) == len(out[1]) == len(ranks[0]) == len(ranks[1])  # no DDP hang
    together = Counter(out[0] + out[1])
    if drop_last:
        assert len(out[0]) == len(kept) // 2 and set(together) <= set(kept.tolist())
        assert max(together.values()) == 1
    else:
        assert set(together) == set(kept.tolist())  # every kept record, nothing else
        assert sum(together.values()) == 2 * -(-len(kept) // 2)  # padded by at most one
    assert {ds.ids[i] for i in together} <= set(clean_ids)
    # the same ranks from a bool keep mask
    mask = np.zeros(len(ds), dtype=bool)
    mask[kept] = True
    again = ManifestSampler(mask, num_replicas=2, rank=1, shuffle=shuffle, seed=1,
                            drop_last=drop_last)
    again.set_epoch(4)
    assert list(again) == out[1]


def test_default_ids_follow_the_job_layout(tmp_path):
    m, ds, clean_ids, _ = manifest_job(tmp_path, "input.id=null")
    assert m.id_field is None
    got = [ds.ids[i] for i in manifest_sampler(m)]
    assert got == clean_ids
    assert [e[0] for e in manifest_subset(ds, m)] == clean_ids
    with pytest.raises(ManifestError, match="the dataset has 299 records but the run read 300"):
        manifest_subset(torch.utils.data.Subset(ds, range(299)), m)
    with pytest.raises(ManifestError, match="299 records but 300 ids were given"):
        manifest_subset(torch.utils.data.Subset(ds, range(299)), m, ds.ids)


# --- online mode -------------------------------------------------------------------------

def test_exact_digest_route_two_workers_two_shuffled_epochs_keep_the_same_records():
    x = stream(1)
    ids = [f"r{i}" for i in range(len(x))]
    src = Shuffled(x, ids)
    ds = OnlineDedupDataset(src, OnlineDedup(), id_fn=by_id, chunk=64)
    assert ds.route == "digest"
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    first_order = src.order(0)
    want = {ids[i] for i, k in zip(first_order, stream_oracle(x[first_order]), strict=True)
            if k}
    second_order = src.order(1)
    fresh = {ids[i] for i, k in zip(second_order, stream_oracle(x[second_order]), strict=True)
             if k}
    assert fresh != want  # a filter that forgot the first epoch would fail below
    for _ in range(2):
        got = out_ids(loader)
        assert len(got) == len(set(got)) and set(got) == want


def test_near_replicate_route_two_workers_matches_the_oracle():
    x = stream(2)
    ds = OnlineDedupDataset(Rows(x), OnlineDedup(near=SPEC), chunk=50)
    assert ds.route == "replicate"
    loader = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    want = np.flatnonzero(stream_oracle(x, SPEC)).tolist()
    assert 0 < len(want) < 0.8 * len(x)
    for _ in range(2):  # ids (the default index ids): the same records every epoch
        batches = list(loader)
        got = torch.cat([i for _, i in batches]).tolist()
        assert Counter(got) == Counter(want)
        rows = torch.cat([t for t, _ in batches]).numpy()
        np.testing.assert_array_equal(rows, x[torch.cat([i for _, i in batches]).numpy()])


@pytest.mark.parametrize("spec", [None, SPEC], ids=["exact", "near"])
def test_no_workers_is_the_sequential_filter(spec):
    x = stream(3)
    ds = OnlineDedupDataset(Rows(x), OnlineDedup(near=spec), chunk=37)
    want = np.flatnonzero(stream_oracle(x, spec)).tolist()
    for _ in range(2):
        assert out_ids(DataLoader(ds, batch_size=None)) == want  # in source order
    assert ds.dedup.stats.readmitted == len(want)


def test_without_ids_each_epoch_is_deduplicated_on_its_own():
    x = stream(4)
    src = Shuffled(x, [None] * len(x), seed=9)
    ds = OnlineDedupDataset(src, OnlineDedup(), chunk=40)  # an iterable: no default ids
    for epoch in range(2):
        order = src.order(epoch)
        got = [e[0] for e in ds]
        want = x[order][stream_oracle(x[order])]
        np.testing.assert_array_equal(torch.stack(got).numpy(), want)


def test_state_dir_resumes_in_new_worker_processes_without_readmitting(tmp_path):
    rng = np.random.default_rng(55)
    old = stream(5)
    new = rng.normal(size=(60, 8)).astype(np.float32)
    new = np.concatenate([new, new[:15], old[:20]])  # copies among the new, and of old
    first = [(f"a{i}", t) for i, t in enumerate(old)]
    second = ([(f"b{i}", t) for i, t in enumerate(old[::-1])]  # old values, new ids
              + [(f"n{i}", t) for i, t in enumerate(new)]
              + first[:30])  # old records again, under their own ids
    keep = id_oracle(first + second)
    want = [[r for (r, _), k in zip(part, ks, strict=True) if k]
            for part, ks in ((first, keep[:len(first)]), (second, keep[len(first):]))]
    assert 40 < len(want[1]) < 100 and not any(r.startswith("b") for r in want[1])

    for part, expect in zip((first, second), want, strict=True):
        ds = OnlineDedupDataset(Records(part), OnlineDedup(), id_fn=by_id, chunk=32,
                                state_dir=tmp_path)  # a new DataLoader: new processes
        got = out_ids(DataLoader(ds, batch_size=None, num_workers=2))
        assert Counter(got) == Counter(expect)
    # each worker remembered only its own share of the digests
    shares = []
    for w in range(2):
        with np.load(tmp_path / f"online-digest-w{w}-of-2.npz") as z:
            shares.append({bytes(d) for d in z["digests"]})
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert len(shares[0] | shares[1]) == len({canonical_key(t) for _, t in first + second})
    with pytest.raises(ValueError, match="another route or number of workers"):
        list(OnlineDedupDataset(Records(first), OnlineDedup(), id_fn=by_id,
                                state_dir=tmp_path))


def test_state_dir_without_workers_and_in_near_mode(tmp_path):
    x = stream(6)
    half = len(x) // 2
    ds = OnlineDedupDataset(Rows(x[:half]), OnlineDedup(near=SPEC), state_dir=tmp_path)
    first = out_ids(ds)
    assert (tmp_path / "online-replicate-w0-of-1.npz").is_file()
    # a new filter object, resumed: the whole stream; the first half's records own theirs
    # (and the device kernel now: the backend changes how digests are computed, not them)
    ds = OnlineDedupDataset(Rows(x), OnlineDedup(near=SPEC, backend="torch"),
                            state_dir=tmp_path)
    assert out_ids(ds) == np.flatnonzero(stream_oracle(x, SPEC)).tolist()
    assert ds.dedup.backend == "torch"
    assert first == np.flatnonzero(stream_oracle(x[:half], SPEC)).tolist()
    with pytest.raises(ValueError, match="was saved with"):
        list(OnlineDedupDataset(Rows(x), OnlineDedup(near=NearSpec("l2", threshold=0.2)),
                                state_dir=tmp_path))


class Batches(IterableDataset):
    """Yields (tensor batch, list of ids) of ``size`` rows."""

    def __init__(self, x: np.ndarray, size: int) -> None:
        self.x, self.size = torch.from_numpy(x), size

    def __iter__(self):
        for s in range(0, len(self.x), self.size):
            yield self.x[s:s + self.size], [f"r{i}" for i in range(s, min(s + self.size,
                                                                          len(self.x)))]


@pytest.mark.parametrize("spec", [None, SPEC], ids=["exact", "near"])
def test_batched_source_yields_filtered_batches(spec):
    x = stream(7)
    x[40:80] = x[:40]  # the second source batch is all copies: skipped, not empty
    want = stream_oracle(x, spec)
    ds = OnlineDedupDataset(Batches(x, 40), OnlineDedup(near=spec), batched=True,
                            id_fn=lambda batch, start: batch[1])
    for _ in range(2):
        out = list(DataLoader(ds, batch_size=None))
        assert all(len(t) == len(i) > 0 for t, i in out)
        np.testing.assert_array_equal(torch.cat([t for t, _ in out]).numpy(), x[want])
        assert [i for _, b in out for i in b] == [f"r{i}" for i in np.flatnonzero(want)]
    assert len(out) == -(-len(x) // 40) - 1
    # a mapping batch: every field keeps the same rows, a list of ids row by row
    x = torch.tensor([[1.0], [2.0], [1.0], [3.0]])
    batch = {"x": x, "label": np.arange(4), "id": list("abcd"), "pair": (x, x[:, 0])}
    (out,) = OnlineDedupDataset([batch], OnlineDedup(), batched=True,
                                tensor_fn=lambda b: b["x"])
    assert out["x"].tolist() == [[1.0], [2.0], [3.0]] and out["label"].tolist() == [0, 1, 3]
    assert out["id"] == ["a", "b", "d"] and out["pair"][1].tolist() == [1.0, 2.0, 3.0]


def test_a_chunk_of_mixed_dtypes_shapes_and_frameworks_is_decided_per_kind():
    rng = np.random.default_rng(8)
    pool = [rng.integers(0, 2, 4).astype(np.float32), rng.integers(0, 2, 4).astype(np.float64),
            rng.integers(0, 2, (2, 2)).astype(np.float32), rng.integers(0, 2, 6).astype(np.int32)]
    pool.append(pool[0].view(np.int32))  # the same bytes as pool[0], another dtype
    records = [(f"r{k}", pool[j]) for k, j in enumerate(rng.integers(0, len(pool), 200))]
    records += [(f"s{k}", rng.integers(0, 2, 3).astype(np.float32)) for k in range(40)]
    records = [records[i] for i in rng.permutation(len(records))]
    # a third as torch tensors: a torch copy of a numpy record is the same value
    source = [(torch.from_numpy(t) if k % 3 else t, r) for k, (r, t) in enumerate(records)]
    ds = OnlineDedupDataset(source, OnlineDedup(), id_fn=by_id, chunk=64)
    want = [r for (r, _), k in zip(records, id_oracle(records), strict=True) if k]
    assert out_ids(ds) == want and len(want) > 5
    a, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    torch_first = [(torch.from_numpy(b), "b"), (a, "a"), (torch.from_numpy(a), "a-copy")]
    assert out_ids(OnlineDedupDataset(torch_first, OnlineDedup(), id_fn=by_id)) == ["b", "a"]
    assert list(OnlineDedupDataset([3, 1.5, 3, 2, 1.5], OnlineDedup())) == [3, 1.5, 2]


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="near copies have different digests"):
        OnlineDedupDataset(Rows(stream(0)), OnlineDedup(near=SPEC), route="digest")
    with pytest.raises(ValueError, match="route must be"):
        OnlineDedupDataset(Rows(stream(0)), OnlineDedup(), route="round-robin")
    x = stream(0)[:10]
    half_ids = Records([(f"r{i}" if i % 2 else None, t) for i, t in enumerate(x)])
    with pytest.raises(ValueError, match="gave None for 5 of 10"):
        list(OnlineDedupDataset(half_ids, OnlineDedup(), id_fn=by_id))
    dicts = [{"emb": torch.from_numpy(t)} for t in x]
    with pytest.raises(TypeError, match="tensor_fn"):
        list(OnlineDedupDataset(dicts, OnlineDedup()))
    got = list(OnlineDedupDataset(dicts, OnlineDedup(), tensor_fn=lambda e: e["emb"]))
    assert len(got) == stream_oracle(x).sum()


# --- device batches ----------------------------------------------------------------------

def test_device_mask_equals_the_numpy_path_and_the_oracle():
    x = stream(9)
    t = torch.from_numpy(x)
    mask = keep_mask_on_device(t, backend="torch")
    assert mask.dtype == torch.bool and mask.device == t.device
    assert (mask.numpy() == keep_mask_on_device(t, backend="numpy").numpy()).all()
    assert (mask.numpy() == stream_oracle(x)).all() and not mask.all()
    with pytest.raises(ValueError, match="pass a dedup state"):
        keep_mask_on_device(t, ids=list(range(len(x))))


def test_device_mask_with_state_across_batches():
    x = stream(10)
    ids = np.arange(len(x))
    half = len(x) // 2
    f = OnlineDedup(backend="torch")
    masks = [keep_mask_on_device(torch.from_numpy(x[s]), f, ids=ids[s], backend="torch")
             for s in (slice(0, half), slice(half, None))]
    assert (torch.cat(masks).numpy() == stream_oracle(x)).all()
    assert f.stats.seen == len(x)
    again = keep_mask_on_device(torch.from_numpy(x[::-1].copy()), f, ids=ids[::-1])
    assert (again.numpy()[::-1] == stream_oracle(x)).all()  # ids own their values
    with pytest.raises(ValueError, match="set it on the OnlineDedup"):
        keep_mask_on_device(torch.from_numpy(x), f, backend="numpy")
