"""tf.data front end: skip what a dedup run removed (in-graph), or dedup a stream online.

Manifest mode (``removed_predicate``, ``skip_removed``, ``tfrecord_dataset_with_ids``)
is pure TensorFlow: the removed ids sit in a ``tf.lookup.StaticHashTable`` built once
(1M ids: ~0.4 s; the ids' bytes plus ~100 B each), and each element costs one hash
lookup in the graph. Nothing calls back into Python, so it runs under ``AUTOTUNE``,
parallel ``interleave``/``map`` and ``tf.distribute`` like any other tf.data step.

Online mode (``online_filter``) runs ``OnlineDedup`` in Python: one
``tf.numpy_function`` call per batch, with the GIL held, in stream order and never in
parallel (the state is shared and the decision depends on what came before). The
state lives in this process: one per worker under multi-worker training, none under
the tf.data service. A 2-core CPU passes ~350-400k records/s (64 float32) through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from filters.manifest import Manifest, ManifestError
from filters.online import OnlineDedup
from transforms.io.formats.tfrecord_frames import TF_COMPRESSION, detect_compression

# Where an element keeps a value: a dict key, a tuple index, a function of the element,
# or None for the element itself.
Key = str | int | Callable[[Any], Any] | None
ID_BATCH = 1024  # records per in-graph id computation in tfrecord_dataset_with_ids


def _pick(element: Any, key: Key, what: str) -> Any:
    """The value at ``key`` (the argument named ``what``) of a dataset element."""
    if key is None:
        return element
    if callable(key):
        return key(element)
    if isinstance(element, Mapping) and key not in element:
        raise ValueError(f"{what}={key!r}: the dataset's elements have keys "
                         f"{', '.join(map(repr, element))}")
    return element[key]


def _element(args: tuple, key: Key) -> Any:
    """The element from the arguments tf.data passed: tuple elements arrive unpacked
    (a 1-tuple as its only member); a direct call passes the element itself."""
    if len(args) != 1:
        return args
    if isinstance(key, int) and not isinstance(args[0], tuple | list):
        return args  # a 1-tuple element, unpacked by tf.data
    return args[0]


def _id_text(ids: Any) -> tf.Tensor:
    """Record ids as the job wrote them: strings as they are, integers in decimal."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype == tf.string:
        return ids
    if ids.dtype.is_integer:
        return tf.strings.as_string(ids)
    raise TypeError(f"record ids must be strings, bytes or integers, got {ids.dtype.name}")


# ------------------------------------------------------------------------ manifest mode


def _removed_table(manifest: Manifest) -> tf.lookup.StaticHashTable:
    """removed id -> False, default True (kept)."""
    keys = manifest.removed_ids.to_numpy(zero_copy_only=False)
    values = tf.zeros([len(keys)], tf.bool)
    if not len(keys):  # a table cannot be empty: one entry that says "kept", like the default
        keys, values = [""], tf.ones([1], tf.bool)
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), values),
        default_value=True)


def removed_predicate(manifest: Manifest, id_key: Key = None) -> Callable[..., tf.Tensor]:
    """A ``ds.filter`` predicate: True for the records the job kept.

    ``id_key`` says where the element holds its record id (a scalar string or integer
    tensor; shape [1] is accepted too): a dict key, a tuple index, a function of the
    element, or None when the element is the id. The table is built here, once."""
    table = _removed_table(manifest)

    def kept(*args: Any) -> tf.Tensor:
        ids = _pick(_element(args, id_key), id_key, "id_key")
        return tf.reshape(table.lookup(_id_text(ids)), [])

    return kept


def skip_removed(manifest: Manifest, id_key: Key = None, batch_size: int | None = None,
                 batched: bool = False) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """For ``ds.apply``: drop the records the job removed.

    ``batch_size=None`` filters element by element (``removed_predicate``; any element).
    An int looks up that many ids at once (batch, mask, unbatch; elements and order
    unchanged): tf.data pays ~10-20 us per function call and element on a small CPU,
    so this is several times faster, but every component needs a fixed shape and
    ``id_key`` functions get the batched element. ``batched=True``: the elements already
    are batches (apply it after your ``ds.batch``); removed rows leave each batch, so
    batches may come out smaller (``ds.rebatch(n)`` restores the size). This is the
    cheapest form: one lookup per batch."""
    if batch_size is None and not batched:
        predicate = removed_predicate(manifest, id_key)
        return lambda ds: ds.filter(predicate)
    table = _removed_table(manifest)

    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        unpacked = isinstance(ds.element_spec, tuple)  # tf.data passes tuples unpacked

        def keep_rows(*args: Any) -> Any:
            batch = args if unpacked else args[0]
            keep = table.lookup(_id_text(tf.reshape(_pick(batch, id_key, "id_key"), [-1])))
            return tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), batch)

        # the table is read-only: batches are looked up in parallel, order kept
        parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}
        if batched:
            return ds.map(keep_rows, **parallel)
        return ds.batch(batch_size).map(keep_rows, **parallel).unbatch()

    return apply


def tfrecord_dataset_with_ids(manifest: Manifest, paths: Sequence[str | os.PathLike] | None = None,
                              compression_type: str | None = None, *, cycle_length: int = 1,
                              block_length: int = 1, num_parallel_calls: int | None = None,
                              buffer_size: int | None = None) -> tf.data.Dataset:
    """``(record_id, serialized_record)`` for the job's TFRecord inputs, ids computed in-graph.

    Why: without ``input.id`` the job named records ``"<path>:<position>"``; this gives
    each record that id (the path as the job spelled it, ``manifest.job_path``), so
    ``skip_removed(manifest, 0)`` can follow. ``paths``: local paths of (some of) the
    job's input files, default all of them in the job's order. ``compression_type``:
    "", "GZIP" or "ZLIB" for every file; None detects it per file as the job does.
    Files are read in order (``cycle_length=1``) or interleaved deterministically.
    A file with a damaged record stops with ``DataLossError`` (TensorFlow's reader
    cannot skip it; the job's clean output can be read instead)."""
    if manifest.id_field is not None:
        raise ManifestError(f"the run named records by input.id={manifest.id_field!r}: parse "
                            "that feature and use skip_removed(manifest, id_key=...)")
    if paths is None:  # the job's own files: their job paths are known
        job = [f["input"] for f in manifest.files]
        local = [os.path.join(manifest.working_dir or "", p) for p in job]
    else:
        local = [os.fspath(p) for p in paths]
        job = [manifest.job_path(p) for p in local]
    if compression_type is None:
        kinds = []
        for p in local:
            with open(p, "rb") as f:
                kinds.append(TF_COMPRESSION[detect_compression(f)])
    else:
        kinds = [compression_type] * len(local)
    files = tf.data.Dataset.from_tensor_slices(tuple(tf.constant(c, tf.string)
                                                     for c in (local, job, kinds)))

    def records(path: tf.Tensor, job_path: tf.Tensor, kind: tf.Tensor) -> tf.data.Dataset:
        def with_ids(b: tf.Tensor, recs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            position = b * ID_BATCH + tf.range(tf.size(recs, tf.int64))
            return tf.strings.join([job_path, tf.strings.as_string(position)], ":"), recs

        # ids a batch at a time: one function call per record would cost more than reading
        return tf.data.TFRecordDataset(path, kind, buffer_size).batch(ID_BATCH).enumerate() \
            .map(with_ids).unbatch()

    return files.interleave(records, cycle_length, block_length, num_parallel_calls,
                            deterministic=None if num_parallel_calls is None else True)


# -------------------------------------------------------------------------- online mode


def online_filter(dedup: OnlineDedup, tensor_key: Key = None, id_key: Key = None,
                  batch_size: int = 1024, batched: bool = False
                  ) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """For ``ds.apply``: drop each element whose tensor duplicates one kept earlier.

    ``tensor_key`` / ``id_key`` locate the tensor and the record id in the element
    (dict key, tuple index, function of the batched element, None = the element; no
    ``id_key``: no ids). Elements are batched, so every component needs a fixed shape.
    Cost: one ``tf.numpy_function`` call (GIL held) per ``batch_size`` elements, run in
    order on one thread; a larger batch amortises it. The elements, their structure and
    their order are kept.

    ``batched=True``: the elements already are batches, e.g. after your ``ds.batch`` or
    after ``skip_removed(..., batched=True)`` (whose batches vary in size, so they
    cannot be batched again). Each batch is one call (``batch_size`` is not used) and
    comes out without its duplicate rows: batches may shrink or come out empty
    (``ds.rebatch(n)`` restores the size).

    Every new pass over the returned dataset starts with ``dedup.new_epoch()`` (its first
    batch has index 0): without ids each pass is deduplicated on its own, so a state
    restored by ``OnlineDedup.load`` carries over to a new pass only with ids. Save the
    state when no decided batch is still buffered downstream (e.g. at the end of a pass):
    it already counts what a prefetch holds."""

    def decide(index: Any, values: Any, *ids: Any) -> Any:
        if index == 0:
            dedup.new_epoch()
        return dedup.keep_mask(values, ids[0] if ids else None)

    def keep_rows(index: tf.Tensor, batch: Any) -> Any:
        inputs = [index, _pick(batch, tensor_key, "tensor_key")]
        if id_key is not None:
            inputs.append(tf.reshape(_pick(batch, id_key, "id_key"), [-1]))
        keep = tf.numpy_function(decide, inputs, tf.bool, stateful=True, name="online_dedup")
        keep.set_shape([None])
        return tf.nest.map_structure(lambda t: tf.boolean_mask(t, keep), batch)

    def apply(ds: tf.data.Dataset) -> tf.data.Dataset:
        if batched:
            return ds.enumerate().map(keep_rows)
        return ds.batch(batch_size).enumerate().map(keep_rows).unbatch()

    return apply
