"""tf.train.Example records of a TFRecord file parsed into ids, tensors and ranks: a batch
at a time with ``tf.io.parse_example``, record by record (protobuf) only to name the bad
records. TensorFlow is imported on first use."""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from transforms.canonical import DTYPE_CODES, dtype_named
from transforms.io.formats.base import InputError, TensorSpec, no_such_name
from transforms.io.formats.example_proto import example_class

LIST_DTYPES = {"float_list": "float32", "int64_list": "int64"}  # flat tensor features
ID_KINDS = ("bytes_list", "int64_list")
RANK_KINDS = ("float_list", "int64_list")


TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"


_TF: dict[str, Any] = {}  # "tf": TensorFlow once its import has finished
_TF_IMPORT = threading.Lock()


def _tf() -> Any:
    """TensorFlow, for parsing numeric features a batch at a time and serialized tensors
    (framing, CRCs, one Example at a time and writing need none: example_proto).

    Its import prints C++ log lines on stderr in every process that imports it (oneDNN,
    "Could not find cuda drivers", absl's "All log messages before
    absl::InitializeLog()"), which ``TF_CPP_MIN_LOG_LEVEL`` no longer silences (TF
    2.17+: they are logged before TensorFlow reads it). Unless that variable asks for
    them (below 3: set by the user to see them; 3 is what a launcher's worker processes
    inherit from it), the import runs with the process's stderr pointed at /dev/null;
    its errors still reach the user as the ImportError below.

    One thread imports it; the others wait for the whole module. Returning
    ``sys.modules["tensorflow"]`` while another bundle's thread was still importing it
    gave them a partly initialised module: with two workers on 100k TFRecord records,
    8 runs of 14 failed with "partially initialized module 'tensorflow' has no attribute
    'float32'"."""
    if "tf" in _TF:
        return _TF["tf"]
    with _TF_IMPORT:
        if "tf" not in _TF:
            _TF["tf"] = _import_tf()
    return _TF["tf"]


def _import_tf() -> Any:
    quiet = os.environ.setdefault(TF_LOG_ENV, "3") == "3"
    try:
        with _stderr_muted(quiet and "tensorflow" not in sys.modules):
            import tensorflow as tf
    except ImportError as e:
        raise ImportError(f"{e}: reading TFRecord features needs TensorFlow: pip install "
                          "-c constraints.txt 'tensordedup[tf]'") from e
    return tf


@contextmanager
def _stderr_muted(mute: bool) -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null while the block runs (C++ code writes there,
    past ``sys.stderr``)."""
    if not mute:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


class BadExample(Exception):
    """A record that cannot be used; the message is the one-line reason."""


LEARN_RECORDS = 100  # the records of a file's first batch a layout learns the kinds from


@dataclass
class FeatureLayout:
    """What a file's records hold: the kinds of the features (the tensor's: the kind most
    of the first records that have it hold, among those the spec allows, ``tensor_kind``;
    the id's and rank's: the first record's that has them) and, for serialized tensors,
    the dtype and shape every record must have (from the spec, else from the first
    decodable tensor). Why most and not the first: a first record that lacks the
    feature, or holds it as another kind, is as invalid as one anywhere else."""

    kind: str | None = None  # of the tensor feature: float_list | int64_list | bytes_list
    id_kind: str | None = None
    rank_kind: str | None = None
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    problem: str | None = None  # why no record can be used (the spec disagrees with the file)

    def learn(self, examples: Iterator[dict[str, Any]], spec: TensorSpec) -> None:
        kinds: Counter[str | None] = Counter()
        held = []
        for feats in islice(examples, LEARN_RECORDS):
            if self.kind is None and spec.tensor in feats:
                kinds[feats[spec.tensor].WhichOneof("kind")] += 1
                held.append(feats)
            if spec.id is not None and self.id_kind is None and spec.id in feats:
                self.id_kind = kind_in(feats[spec.id], ID_KINDS)
            if spec.rank is not None and self.rank_kind is None and spec.rank in feats:
                self.rank_kind = kind_in(feats[spec.rank], RANK_KINDS)
        if self.kind is None:
            self.kind = tensor_kind(kinds, spec)
            if self.kind in LIST_DTYPES:
                self.problem = list_problem(spec, self.kind)
                if spec.shape is None and not spec.ragged:  # the most common size (check()
                    sizes = list_sizes(held, spec.tensor, self.kind)  # refuses several)
                    self.shape = (sizes.most_common(1)[0][0],)

    def ready(self, spec: TensorSpec) -> bool:
        return (self.kind is not None and (spec.id is None or self.id_kind is not None)
                and (spec.rank is None or self.rank_kind is not None))


def allowed_kinds(spec: TensorSpec) -> tuple[str, ...]:
    """The kinds of tensor feature the spec can read: encoded values and dtypes other
    than float32 and int64 only a bytes_list (one value), integer sequences an
    int64_list."""
    if spec.decode is not None:
        return ("bytes_list",)
    if spec.ragged:
        return ("int64_list",)
    lists = tuple(k for k, dtype in LIST_DTYPES.items() if spec.dtype in (None, dtype))
    return (*lists, "bytes_list")


def tensor_kind(kinds: Counter, spec: TensorSpec) -> str | None:
    """The tensor feature's kind, from how many of the first records hold each (None:
    empty): the most common of those the spec allows, else the most common (the spec
    disagrees with the file: ``list_problem`` says how); ties to the first seen."""
    held = [k for k in kinds if k is not None]
    pool = [k for k in held if k in allowed_kinds(spec)] or held
    return max(pool, key=lambda k: kinds[k]) if pool else None


CHECK_RECORDS = 100  # the first records check() looks at (LEARN_RECORDS: the same kinds)


def checked_features(path: str, spec: TensorSpec,
                     examples: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(the tensor feature's kind, the features of the first record holding it so) after
    refusing what no record can be read with: a tensor, id or keep feature that none of
    ``examples`` (a file's first records) has, an id or keep feature of a kind it cannot
    be, a tensor feature empty in all. A first record that lacks a feature or holds the
    tensor as another kind than most is not refused: it is invalid, as anywhere else."""
    for key, name in (("input.tensor", spec.tensor), ("input.id", spec.id), ("keep", spec.rank)):
        if name is not None and not any(name in feats for feats in examples):
            raise InputError(f"{path}: {key}: {_none_has(name, examples)}")
    for key, name, kinds, what in (("input.id", spec.id, ID_KINDS, "a string or integer"),
                                   ("keep", spec.rank, RANK_KINDS, "a numeric")):
        if name is None:
            continue
        feature = next(feats[name] for feats in examples if name in feats)
        if kind_in(feature, kinds) is None:
            raise InputError(f"{path}: {key}: feature {name!r} is "
                             f"{feature.WhichOneof('kind') or 'empty'}, not "
                             f"{' or '.join(kinds)}: name {what} feature")
    held = [feats for feats in examples if spec.tensor in feats]
    kind = tensor_kind(Counter(feats[spec.tensor].WhichOneof("kind") for feats in held), spec)
    if kind is None:
        records = "the first record" if len(examples) == 1 else \
            f"all {len(held)} of the first {len(examples)} records that have it"
        raise InputError(f"{path}: input.tensor: feature {spec.tensor!r} is empty in "
                         f"{records}: name a feature that holds the tensor")
    return kind, next(f for f in held if f[spec.tensor].WhichOneof("kind") == kind)


def _none_has(name: str, examples: list[dict[str, Any]]) -> str:
    """Why no record can be read: none of the first records has feature ``name``."""
    names = sorted({n for feats in examples for n in feats})
    where = ("the first record has no" if len(examples) == 1 else
             f"none of the first {len(examples)} records has a")
    what = "its features:" if len(examples) == 1 else "their features:"
    return f"{where} feature {name!r} {no_such_name(name, names, what, 'name one of them')}"


def kind_in(feature: Any, kinds: tuple[str, ...]) -> str | None:
    """The feature's list kind if it is one of ``kinds``, else None."""
    kind = feature.WhichOneof("kind")
    return kind if kind in kinds else None


def list_problem(spec: TensorSpec, kind: str) -> str | None:
    """Why a flat number list cannot be read with this spec (None if it can)."""
    dtype = LIST_DTYPES[kind]
    if spec.dtype is not None and spec.dtype != dtype:
        return (f"input.dtype: feature {spec.tensor!r} is a {kind} ({dtype}), not "
                f"{spec.dtype}: set input.dtype: {dtype}")
    if spec.ragged and kind != "int64_list":
        return (f"input.tensor: feature {spec.tensor!r} is a {kind}: near.metric jaccard "
                "compares integer sequences (an int64_list)")
    return None


def list_sizes(examples: Iterable[dict[str, Any]], name: str, kind: str) -> Counter[int]:
    """How many of ``examples`` (feature maps) hold feature ``name`` as a ``kind`` list of
    each size."""
    return Counter(len(getattr(e[name], kind).value) for e in examples
                   if name in e and e[name].WhichOneof("kind") == kind)


def list_shape(spec: TensorSpec, layout: FeatureLayout) -> tuple[int, ...]:
    """The shape of a flat list's records: ``input.shape``, else the size most of the
    file's first records hold (``FeatureLayout.learn``)."""
    shape = spec.shape or layout.shape
    assert shape is not None
    return tuple(shape)


@functools.cache
def _tf_dtypes() -> dict[int, np.dtype]:
    """TF DataType enum -> numpy dtype, for the dtypes a fingerprint takes."""
    tf = _tf()
    return {tf.as_dtype(name).as_datatype_enum: dtype_named(name)
            for name in DTYPE_CODES if name != "complex32"}


def parse_examples(datas: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The feature maps of the records that parse as tf.train.Example."""
    from google.protobuf.message import DecodeError

    Example = example_class()
    for data in datas:
        try:
            yield Example.FromString(data).features.feature
        except DecodeError:
            continue


def _value(feats: dict[str, Any], name: str, kinds: tuple[str, ...]) -> tuple[str, Any]:
    """(kind, value) of a one-value feature of one of ``kinds``."""
    if name not in feats:
        raise BadExample(f"no feature {name!r}")
    kind = feats[name].WhichOneof("kind")
    if kind not in kinds:
        raise BadExample(f"feature {name!r} is {kind or 'empty'}, not {' or '.join(kinds)}")
    values = getattr(feats[name], kind).value
    if len(values) != 1:
        raise BadExample(f"feature {name!r} has {len(values)} values, not 1")
    return kind, values[0]


def _id(feats: dict[str, Any], name: str) -> str:
    kind, value = _value(feats, name, ID_KINDS)
    if kind == "int64_list":
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadExample(f"feature {name!r}: id is not UTF-8") from None


def _tensor(feats: dict[str, Any], spec: TensorSpec, layout: FeatureLayout) -> Any:
    """The flat tensor as an array of its shape (``list_shape``), or the serialized
    TensorProto."""
    if layout.problem:
        raise BadExample(layout.problem)
    name = spec.tensor
    if name not in feats:
        raise BadExample(f"no feature {name!r}")
    kind = feats[name].WhichOneof("kind")
    if kind != layout.kind:
        raise BadExample(f"feature {name!r} is {kind or 'empty'}, not {layout.kind} like the "
                         "file's first records")
    if kind == "bytes_list":
        return _value(feats, name, (kind,))[1]
    values = getattr(feats[name], kind).value
    if spec.ragged:  # a sequence of its own length
        return np.asarray(values, dtype=LIST_DTYPES[kind])
    shape = list_shape(spec, layout)
    if len(values) != math.prod(shape):
        said = (f"input.shape {list(shape)}" if spec.shape is not None
                else "the size of the file's first records")
        raise BadExample(f"feature {name!r} has {len(values)} values, not {math.prod(shape)} "
                         f"({said})")
    return np.asarray(values, dtype=LIST_DTYPES[kind]).reshape(shape)


def parse_one(data: bytes, spec: TensorSpec, layout: FeatureLayout) -> tuple[Any, ...]:
    """(id, tensor, rank, reason) of one record; the reason says why it cannot be used."""
    from google.protobuf.message import DecodeError

    try:
        feats = example_class().FromString(data).features.feature
    except DecodeError as e:
        return None, None, None, f"not a tf.train.Example: {e}"
    record_id = None
    try:
        if spec.id is not None:
            record_id = _id(feats, spec.id)
        tensor = _tensor(feats, spec, layout)
        rank = None
        if spec.rank is not None:
            kinds = (layout.rank_kind,) if layout.rank_kind else RANK_KINDS
            rank = _value(feats, spec.rank, kinds)[1]
    except BadExample as e:
        return record_id, None, None, str(e)
    return record_id, tensor, rank, None


def _parse_batch(datas: list[bytes], spec: TensorSpec, layout: FeatureLayout) -> tuple | None:
    """(ids or None, tensors, ranks) of a batch in which every record is well-formed,
    parsed in one ``tf.io.parse_example``; None if any record is not."""
    if not datas or not layout.ready(spec) or layout.problem or spec.ragged:
        return None
    tf = _tf()
    kind_dtype = {"float_list": tf.float32, "int64_list": tf.int64, "bytes_list": tf.string}
    shape = [] if layout.kind == "bytes_list" else list(list_shape(spec, layout))
    features = {spec.tensor: tf.io.FixedLenFeature(shape, kind_dtype[layout.kind])}
    if spec.id is not None:
        features[spec.id] = tf.io.FixedLenFeature([], kind_dtype[layout.id_kind])
    if spec.rank is not None:
        features[spec.rank] = tf.io.FixedLenFeature([], kind_dtype[layout.rank_kind])
    try:
        out = {k: v.numpy() for k, v in tf.io.parse_example(datas, features).items()}
    except tf.errors.OpError:
        return None
    ids = None
    if spec.id is not None:
        if layout.id_kind == "int64_list":
            ids = [str(i) for i in out[spec.id].tolist()]
        else:
            try:
                ids = [b.decode("utf-8") for b in out[spec.id]]
            except UnicodeDecodeError:
                return None
    return ids, out[spec.tensor], None if spec.rank is None else out[spec.rank]


def tensor_header(serialized: bytes) -> tuple[Any, np.dtype, tuple[int, ...]]:
    """(TensorProto, numpy dtype, shape) of a tf.io.serialize_tensor value."""
    from google.protobuf.message import DecodeError

    _tf()  # its package first (quietly)
    from tensorflow.core.framework.tensor_pb2 import TensorProto
    from tensorflow.core.framework.types_pb2 import DataType

    try:
        proto = TensorProto.FromString(serialized)
    except DecodeError as e:
        raise BadExample(f"not a serialized tensor (tf.io.serialize_tensor): {e}") from None
    dtype = _tf_dtypes().get(proto.dtype)
    if dtype is None:
        name = DataType.Name(proto.dtype) if proto.dtype in DataType.values() else proto.dtype
        raise BadExample(f"unsupported tensor dtype {name}")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if proto.tensor_shape.unknown_rank or min(shape, default=0) < 0:
        raise BadExample("tensor of unknown shape")
    return proto, dtype, shape


def _tensor_bytes(serialized: bytes, layout: FeatureLayout) -> bytes:
    """The raw (C order, native byte order) data of a serialized tensor of the layout's
    dtype and shape; the first decodable tensor fixes what the spec leaves open."""
    proto, dtype, shape = tensor_header(serialized)
    if layout.dtype is None:
        layout.dtype = dtype
    if layout.shape is None:
        layout.shape = shape
    if dtype != layout.dtype:
        raise BadExample(f"tensor dtype {dtype.name}, not {layout.dtype.name}")
    if shape != layout.shape:
        raise BadExample(f"tensor shape {list(shape)}, not {list(layout.shape)}")
    nbytes = math.prod(shape) * dtype.itemsize
    content = proto.tensor_content
    if not content and nbytes:  # protos not made by serialize_tensor may use typed fields
        try:
            content = np.asarray(_tf().make_ndarray(proto), dtype=dtype).tobytes()
        except (TypeError, ValueError) as e:
            raise BadExample(f"unreadable tensor: {e}") from None
    if len(content) != nbytes:
        raise BadExample(f"tensor has {len(content)} bytes of data, not {nbytes}")
    return content


def _decode_tensors(values: Any, reasons: list[str | None], spec: TensorSpec,
                    layout: FeatureLayout) -> np.ndarray:
    """The tensors of the serialized values whose record is still ok; marks the others."""
    contents = []
    for i, value in enumerate(values):
        if reasons[i] is None:
            try:
                contents.append(_tensor_bytes(value, layout))
            except BadExample as e:
                reasons[i] = f"feature {spec.tensor!r}: {e}"
    if layout.dtype is None or layout.shape is None:
        return np.empty((0,))
    data = np.frombuffer(bytearray().join(contents), dtype=layout.dtype)
    return data.reshape((len(contents), *layout.shape))


def parse_records(datas: list[bytes], spec: TensorSpec,
           layout: FeatureLayout) -> tuple[list, np.ndarray, np.ndarray | None, list[str | None]]:
    """(ids or None per record, tensors and ranks of the usable records, reason per record
    or None if usable)."""
    n = len(datas)
    if not layout.ready(spec):
        layout.learn(parse_examples(datas), spec)
    reasons: list[str | None] = [None] * n
    fast = _parse_batch(datas, spec, layout)
    if fast is not None:
        ids, values, ranks = fast
        ids = ids or [None] * n
    else:
        ids, values, ranks = [None] * n, [None] * n, [None] * n
        for i, data in enumerate(datas):
            ids[i], values[i], ranks[i], reasons[i] = parse_one(data, spec, layout)
    if layout.kind == "bytes_list":
        tensors = _decode_tensors(values, reasons, spec, layout)
    elif fast is not None:
        tensors = values
    elif layout.kind in LIST_DTYPES and spec.ragged:
        tensors = np.empty(sum(why is None for why in reasons), object)
        tensors[:] = [v for v, why in zip(values, reasons, strict=True) if why is None]
    elif layout.kind in LIST_DTYPES:
        rows = [v for v, why in zip(values, reasons, strict=True) if why is None]
        tensors = np.array(rows, dtype=LIST_DTYPES[layout.kind])
        tensors = tensors.reshape((len(rows), *list_shape(spec, layout)))
    else:
        tensors = np.empty((0,))
    rank = None
    if spec.rank is not None:
        rank_dtype = np.int64 if layout.rank_kind == "int64_list" else np.float64
        if fast is None:
            ranks = [0 if why else r for r, why in zip(ranks, reasons, strict=True)]
        ok = np.array([why is None for why in reasons], dtype=bool)
        rank = np.asarray(ranks, dtype=rank_dtype)[ok]
    return ids, tensors, rank, reasons
