"""tf.data filters on real TFRecord files: manifest mode against the job's clean output,
online mode against a brute-force sequential oracle."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import filters.tf  # noqa: E402
from filters.manifest import Manifest, ManifestError  # noqa: E402
from filters.online import OnlineDedup  # noqa: E402
from filters.tf import (  # noqa: E402
    online_filter,
    removed_predicate,
    skip_removed,
    tfrecord_dataset_with_ids,
)
from tests.jobkit import read_output, run_job, write_input  # noqa: E402
from tests.oracle import StreamOracle, canonical_key  # noqa: E402
from transforms.near.spec import NearSpec  # noqa: E402

DIM = 8
FEATURES = {"id": tf.io.FixedLenFeature([], tf.string),
            "emb": tf.io.FixedLenFeature([DIM], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64)}
PY_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}  # numpy_function, py_function
JOB_INPUT = {"shape": [DIM], "dtype": "float32"}


def parse(record: tf.Tensor) -> dict:
    return tf.io.parse_single_example(record, FEATURES)


def write_parts(root, parts, compressions=None) -> list[str]:
    paths = []
    for f, (ids, x) in enumerate(parts):
        path = root / f"part-{f}.tfrecord"
        write_input("tfrecord", path, ids, x, np.arange(len(ids)) * 10 + f,
                    compression=(compressions or [""] * len(parts))[f])
        paths.append(str(path))
    return paths


def records(paths, cycle_length: int = 1, parallel: bool = False) -> tf.data.Dataset:
    calls = tf.data.AUTOTUNE if parallel else None
    return tf.data.Dataset.from_tensor_slices(paths).interleave(
        tf.data.TFRecordDataset, cycle_length=cycle_length,
        num_parallel_calls=calls, deterministic=parallel or None).map(
        parse, num_parallel_calls=calls)


def values(ds) -> tuple[list[str], np.ndarray, list[int]]:
    rows = list(ds.as_numpy_iterator())
    return ([r["id"].decode() for r in rows], np.array([r["emb"] for r in rows]).reshape(-1, DIM),
            [int(r["label"]) for r in rows])


# ------------------------------------------------------------------------ manifest mode


def planted(seed: int, files: int = 3, rows: int = 40) -> list[tuple[list[str], np.ndarray]]:
    """Files of unique random rows with exact copies planted within and across files,
    one of them a -0.0 twin of a +0.0 value."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((files * rows, DIM)).astype(np.float32)
    for dst in rng.choice(np.arange(10, len(x)), 25, replace=False):
        x[dst] = x[rng.integers(0, dst)]
    x[3, 0], x[70] = 0.0, x[3]
    x[70, 0] = -0.0
    return [([f"f{f}-{i}" for i in range(rows)], x[f * rows:(f + 1) * rows])
            for f in range(files)]


def clean_output(root, files: int) -> list[tuple[list[str], np.ndarray, np.ndarray]]:
    return [read_output("tfrecord", root / "out" / "clean" / f"part-{f}.tfrecord", (DIM,))
            for f in range(files)]


@pytest.fixture(scope="module")
def id_job(tmp_path_factory):
    """A run with input.id = id over three plain files."""
    root = tmp_path_factory.mktemp("id_job")
    parts = planted(1)
    paths = write_parts(root / "in", parts)
    assert run_job(root, "tfrecord", str(root / "in" / "*.tfrecord"), input=JOB_INPUT) == 0
    return paths, parts, clean_output(root, len(parts)), Manifest.load(root / "out" / "report")


@pytest.fixture(scope="module")
def default_id_job(tmp_path_factory):
    """A run with default ids over a relative glob (GZIP and plain files), from another cwd."""
    root = tmp_path_factory.mktemp("default_id_job")
    parts = planted(2)
    paths = write_parts(root / "in", parts, ["GZIP", "", "GZIP"])
    here = os.getcwd()
    os.chdir(root)
    try:
        assert run_job(root, "tfrecord", "in/*.tfrecord", input={**JOB_INPUT, "id": None}) == 0
    finally:
        os.chdir(here)
    return paths, parts, clean_output(root, len(parts)), Manifest.load(root / "out" / "report")


def test_skip_removed_by_id_field_equals_clean_output(id_job):
    paths, parts, clean, manifest = id_job
    want_ids = [i for ids, _, _ in clean for i in ids]
    want_x = np.concatenate([x for _, x, _ in clean])
    assert 15 < len(manifest) and len(want_ids) + len(manifest) == 120  # dups were removed

    ids, x, labels = values(records(paths).apply(skip_removed(manifest, "id")))
    assert ids == want_ids
    np.testing.assert_array_equal(x.view(np.uint32), want_x.view(np.uint32))
    assert labels == [int(v) for _, _, lab in clean for v in lab]

    # parallel reads and parses, round robin over the files, prefetch: the survivors in
    # the interleave's order (looked up one by one and a batch at a time)
    keep = set(want_ids)
    round_robin = [i for row in zip(*(ids for ids, _ in parts), strict=True) for i in row]
    for batch_size in (None, 16):
        ds = records(paths, cycle_length=3, parallel=True).apply(
            skip_removed(manifest, "id", batch_size))
        got, _, _ = values(ds.prefetch(tf.data.AUTOTUNE))
        assert got == [i for i in round_robin if i in keep]

    # already batched: rows leave each batch, rebatch restores the size
    in_batches = records(paths).batch(10).apply(skip_removed(manifest, "id", batched=True))
    sizes = [int(tf.size(b["id"])) for b in in_batches]
    assert sum(sizes) == len(want_ids) and min(sizes) < 10
    rebatched = in_batches.rebatch(10)
    assert [i.decode() for b in rebatched for i in b["id"].numpy()] == want_ids
    assert [int(tf.size(b["id"])) for b in rebatched][:-1] == [10] * (len(want_ids) // 10)

    # under a tf.distribute strategy, batched
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    dist = strategy.experimental_distribute_dataset(
        records(paths).apply(skip_removed(manifest, lambda e: e["id"])).batch(8))
    assert [i.decode() for b in dist for i in b["id"].numpy()] == want_ids


def test_default_ids_from_tfrecord_dataset_with_ids(default_id_job, monkeypatch):
    paths, parts, clean, manifest = default_id_job
    monkeypatch.setattr(filters.tf, "ID_BATCH", 7)  # positions span several id batches
    assert manifest.id_field is None and manifest.files[0]["input"] == "in/part-0.tfrecord"
    assert len(manifest) > 15 and all(i.startswith("in/part-") for i in
                                      manifest.removed_ids.to_pylist())

    ds = tfrecord_dataset_with_ids(manifest).apply(skip_removed(manifest, 0, batch_size=32))
    rows = [(rid.numpy().decode(), parse(rec)) for rid, rec in ds]
    want = [(f"in/part-{f}.tfrecord:{parts[f][0].index(i)}", i, x)
            for f, (ids, xs, _) in enumerate(clean) for i, x in zip(ids, xs, strict=True)]
    assert [(rid, r["id"].numpy().decode()) for rid, r in rows] == [w[:2] for w in want]
    np.testing.assert_array_equal(np.array([r["emb"].numpy() for _, r in rows]).view(np.uint32),
                                  np.array([w[2] for w in want]).view(np.uint32))

    # local paths spelled differently (absolute, another order), interleaved in parallel,
    # compression given: ids stay the job's spelling, each file keeps exactly its survivors
    gz = tfrecord_dataset_with_ids(manifest, [paths[2], paths[0]], "GZIP", cycle_length=2,
                                   num_parallel_calls=tf.data.AUTOTUNE)
    got = [rid.decode() for rid, _ in
           gz.apply(skip_removed(manifest, lambda e: e[0])).as_numpy_iterator()]
    assert sorted(got) == sorted(w[0] for w in want if not w[0].startswith("in/part-1"))
    assert got[:2] == ["in/part-2.tfrecord:0", "in/part-0.tfrecord:0"]

    with pytest.raises(ManifestError, match="not one of the run's"):
        tfrecord_dataset_with_ids(manifest, [paths[0] + ".other"])


def test_tfrecord_dataset_with_ids_refuses_an_id_field_run(id_job):
    with pytest.raises(ManifestError, match="input.id='id'"):
        tfrecord_dataset_with_ids(id_job[3])


def test_empty_report_keeps_everything(tmp_path):
    x = np.random.default_rng(3).standard_normal((30, DIM)).astype(np.float32)
    paths = write_parts(tmp_path / "in", [([f"u{i}" for i in range(30)], x)])
    assert run_job(tmp_path, "tfrecord", str(tmp_path / "in" / "*.tfrecord"),
                   input=JOB_INPUT) == 0
    manifest = Manifest.load(tmp_path / "out" / "report")
    assert len(manifest) == 0
    for batch_size in (None, 8):
        ids, got, _ = values(records(paths).apply(skip_removed(manifest, "id", batch_size)))
        assert ids == [f"u{i}" for i in range(30)]
        np.testing.assert_array_equal(got, x)
    assert list(tf.data.Dataset.range(5).filter(removed_predicate(manifest))
                .as_numpy_iterator()) == list(range(5))


def test_id_kinds_and_element_structures():
    manifest = Manifest(pa.array(["3", "7", "x"]), "id", (), None)
    want = [0, 1, 2, 4, 5, 6, 8, 9, 10, 11]
    ints = tf.data.Dataset.range(12)  # int64: compared as their decimal text
    for ds, as_int in ((ints, int), (ints.map(tf.strings.as_string), int),
                       (ints.map(lambda i: tf.reshape(tf.strings.as_string(i), [1])),
                        lambda v: int(v[0]))):
        assert [as_int(v) for v in ds.filter(removed_predicate(manifest))
                .as_numpy_iterator()] == want
    # tuple elements (tf.data passes them unpacked) by index, a 1-tuple, a dict
    pairs = ints.map(lambda i: (tf.constant(b"payload"), i))
    ones = ints.map(lambda i: (i,))
    dicts = ints.map(lambda i: {"id": i, "x": tf.fill([3], i)})
    for ds, key in ((pairs, 1), (ones, 0), (dicts, "id"), (dicts, lambda e: e["id"])):
        one_by_one = list(ds.filter(removed_predicate(manifest, key)).as_numpy_iterator())
        assert len(one_by_one) == 10
        # a batch at a time: the same records, the element structure unchanged
        batched = ds.apply(skip_removed(manifest, key, batch_size=5))
        assert batched.element_spec == ds.element_spec
        assert str(list(batched.as_numpy_iterator())) == str(one_by_one)
    for make in (lambda: dicts.filter(removed_predicate(manifest, "idd")),
                 lambda: dicts.apply(skip_removed(manifest, "idd", batch_size=5))):
        with pytest.raises(ValueError, match="id_key='idd': the dataset's elements have "
                                             "keys 'id', 'x'"):
            make()


def graph_ops(ds: tf.data.Dataset) -> set[str]:
    """Every op type in a dataset's graph, its functions included."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef.FromString(ds._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN).numpy())
    ops = {n.op for n in graph.node}
    return ops | {n.op for f in graph.library.function for n in f.node_def}


def test_manifest_filter_is_entirely_in_graph(default_id_job):
    manifest = default_id_job[3]
    pred = removed_predicate(manifest, "id")
    graph = tf.function(pred).get_concrete_function(
        {"id": tf.TensorSpec([], tf.string), "emb": tf.TensorSpec([DIM], tf.float32)}).graph
    ops = {op.type for op in graph.get_operations()}
    assert "LookupTableFindV2" in ops and not ops & PY_OPS

    for batch_size in (None, 64):
        pipeline = tfrecord_dataset_with_ids(manifest).apply(
            skip_removed(manifest, 0, batch_size))
        ops = graph_ops(pipeline)
        assert {"TFRecordDataset", "LookupTableFindV2", "StringJoin"} <= ops
        assert not ops & PY_OPS
    # the same inspection does see the online filter's Python call
    online = pipeline.map(lambda i, r: parse(r)).apply(online_filter(OnlineDedup(), "emb"))
    assert graph_ops(online) & PY_OPS


# -------------------------------------------------------------------------- online mode


def stream_parts(seed: int, prefix: str, base: np.ndarray | None = None
                 ) -> list[tuple[list[str], np.ndarray]]:
    """Two files of random rows with exact copies (one a -0.0 twin), near copies, far
    decoys, chains (a, a+d, a+2d), scaled copies; ``base``: draw copies from it too."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((100, DIM)).astype(np.float32)
    src = x if base is None else np.concatenate([x, base])
    pick = rng.choice(len(src), 70, replace=False)
    step = 0.03 * rng.choice([-1, 1], (10, DIM))
    twin = x[:1].copy()
    x[0, 0] = twin[0, 0] = 0.0
    twin[0, 0] = -0.0
    rows = np.concatenate([
        x, twin, src[pick[:20]],  # exact
        src[pick[20:45]] + rng.uniform(-0.01, 0.01, (25, DIM)),  # near for every metric
        src[pick[45:55]] + 0.06 * rng.choice([-1, 1], (10, DIM)),  # decoys (not for cosine)
        src[pick[55:65]] + step, src[pick[55:65]] + 2 * step,  # chains
        2 * src[pick[65:70]],  # cosine distance 0
    ]).astype(np.float32)
    rows = rows[rng.permutation(len(rows))]
    rows = np.concatenate([rows, rows[:12]])  # exact copies of near copies too
    half = len(rows) // 2
    return [([f"{prefix}{f}-{i}" for i in range(half)], rows[f * half:(f + 1) * half])
            for f in range(2)]


@pytest.fixture(scope="module")
def stream_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    parts = stream_parts(11, "a")
    extra = stream_parts(12, "b", base=np.concatenate([x for _, x in parts]))
    return write_parts(root / "old", parts), write_parts(root / "new", extra)


def stream(paths, shuffle_seed: int | None) -> tf.data.Dataset:
    ds = records(paths)
    if shuffle_seed is not None:
        ds = ds.shuffle(64, seed=shuffle_seed, reshuffle_each_iteration=True)
    return ds


def epoch(it) -> list[tuple[str, np.ndarray]]:
    return [(r["id"].decode(), r["emb"]) for r in it]


def decided(ds: tf.data.Dataset, twin: tf.data.Dataset) -> tuple[list[str], list[tuple]]:
    """One pass of the filtered dataset and of its unfiltered twin (same shuffle order)."""
    out = list(ds.as_numpy_iterator())
    order = epoch(twin.as_numpy_iterator())
    by_id = dict(order)
    for r in out:  # elements come out whole
        np.testing.assert_array_equal(r["emb"], by_id[r["id"].decode()])
        assert r["label"] % 10 in (0, 1)
    return [r["id"].decode() for r in out], order


NEAR = [None, NearSpec("l2", threshold=0.1), NearSpec("cosine", threshold=0.002),
        NearSpec("allclose", atol=0.02)]


@pytest.mark.parametrize("spec", NEAR, ids=lambda s: s.metric if s else "exact")
def test_online_matches_oracle_each_epoch_without_ids(stream_files, spec):
    filtered = stream(stream_files[0], 5).apply(online_filter(OnlineDedup(near=spec), "emb",
                                                              batch_size=16))
    twin = stream(stream_files[0], 5)
    oracle = StreamOracle(spec, with_ids=False)
    orders = []
    for _ in range(2):  # each pass is deduplicated on its own, in its own order
        oracle.new_epoch()
        got = list(filtered.as_numpy_iterator())
        order = epoch(twin.as_numpy_iterator())
        assert [r["id"].decode() for r in got] == oracle.run(order)
        orders.append([rid for rid, _ in order])
    assert orders[0] != orders[1] and len(got) < len(orders[0]) - 20
    if spec is not None:
        assert oracle.near_drops >= 10


@pytest.mark.parametrize("spec", NEAR[:2], ids=lambda s: s.metric if s else "exact")
def test_online_with_ids_keeps_the_same_records_every_epoch(stream_files, spec):
    dedup = OnlineDedup(near=spec)
    filtered = stream(stream_files[0], 6).apply(online_filter(dedup, "emb", "id", 16))
    twin = stream(stream_files[0], 6)
    oracle = StreamOracle(spec, with_ids=True)
    first, order = decided(filtered, twin)
    assert first == oracle.run(order)
    second, order2 = decided(filtered, twin)
    assert sorted(second) == sorted(first) and second != first  # same set, reshuffled
    assert oracle.run(order2) == second
    assert dedup.stats.readmitted == len(first)


@pytest.mark.parametrize("spec", NEAR[:2], ids=lambda s: s.metric if s else "exact")
def test_online_state_restored_does_not_readmit(stream_files, spec, tmp_path):
    old, new = stream_files
    dedup = OnlineDedup(near=spec)
    oracle = StreamOracle(spec, with_ids=True)
    first = [r["id"].decode() for r in stream(old, 7).apply(
        online_filter(dedup, "emb", "id", 16)).as_numpy_iterator()]
    assert first == oracle.run(epoch(stream(old, 7).as_numpy_iterator()))
    dedup.save(tmp_path / "state.npz")

    restored = OnlineDedup.load(tmp_path / "state.npz")
    again = [r["id"].decode() for r in stream(old, 8).apply(
        online_filter(restored, "emb", "id", 16)).as_numpy_iterator()]
    assert sorted(again) == sorted(first)
    # new records arrive: copies (exact and near) of old ones under new ids, old records
    # again, new duplicates among themselves
    got = [r["id"].decode() for r in stream(new + old[:1], 9).apply(
        online_filter(restored, "emb", "id", 16)).as_numpy_iterator()]
    order = epoch(stream(new + old[:1], 9).as_numpy_iterator())
    assert got == oracle.run(order)
    old_values = {canonical_key(x) for _, x in epoch(stream(old, None).as_numpy_iterator())}
    copies = {rid for rid, x in order if rid.startswith("b") and canonical_key(x) in old_values}
    assert len(copies) >= 10 and not copies & set(got)
    assert {i for i in got if i.startswith("a")} <= set(first)
    assert any(i.startswith("b") for i in got)


def test_online_tuple_elements_keep_structure_and_order(stream_files):
    ds = stream(stream_files[0], None).map(lambda r: (r["id"], r["emb"], r["label"]))
    got = list(ds.apply(online_filter(OnlineDedup(), lambda e: e[1], 0, 7))
               .as_numpy_iterator())
    src = list(ds.as_numpy_iterator())
    want = StreamOracle(None, with_ids=True).run([(i, x) for i, x, _ in src])
    assert [g[0] for g in got] == want
    by_id = {i: (x, lab) for i, x, lab in src}
    for i, x, lab in got:
        np.testing.assert_array_equal(x, by_id[i][0])
        assert lab == by_id[i][1]


@pytest.mark.parametrize("spec", NEAR[:2], ids=lambda s: s.metric if s else "exact")
def test_online_after_batched_skip_removed(stream_files, spec):
    """skip_removed(batched=True) leaves batches of varying size; online_filter(batched=True)
    decides them as they are (batching them again fails) and keeps the oracle's records."""
    src = epoch(stream(stream_files[0], None).as_numpy_iterator())
    removed = [rid for k, (rid, _) in enumerate(src) if k % 7 == 3]
    manifest = Manifest(pa.array(removed), "id", (), None)
    batches = stream(stream_files[0], None).batch(10).apply(
        skip_removed(manifest, "id", batched=True))
    with pytest.raises(tf.errors.InvalidArgumentError):  # what batched=False does here
        list(batches.apply(online_filter(OnlineDedup(near=spec), "emb", "id")))

    dedup = OnlineDedup(near=spec)
    filtered = batches.apply(online_filter(dedup, "emb", "id", batched=True))
    assert filtered.element_spec == batches.element_spec
    oracle = StreamOracle(spec, with_ids=True)
    want = oracle.run([(rid, x) for rid, x in src if rid not in set(removed)])
    assert len(want) < len(src) - len(removed) - 20  # the online filter removed rows too
    for _ in range(2):  # a second pass (new_epoch) keeps the same records, with ids
        out = list(filtered.as_numpy_iterator())
        assert [i.decode() for b in out for i in b["id"]] == want
        assert max(len(b["id"]) for b in out) <= 10 and min(len(b["id"]) for b in out) < 10
        by_id = dict(src)
        for b in out:  # rows come out whole, components aligned
            for i, x in zip(b["id"], b["emb"], strict=True):
                np.testing.assert_array_equal(x, by_id[i.decode()])
    # the same records as the element-wise chain
    one_by_one = stream(stream_files[0], None).apply(skip_removed(manifest, "id")).apply(
        online_filter(OnlineDedup(near=spec), "emb", "id", 16))
    assert [r["id"].decode() for r in one_by_one.as_numpy_iterator()] == want
