"""tf.train.Example records of a TFRecord file parsed into ids, tensors and ranks: a batch
at a time with ``tf.io.parse_example``, record by record (protobuf) only to name the bad
records. TensorFlow is imported on first use."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from transforms.canonical import DTYPE_CODES
from transforms.io.formats.base import TensorSpec
from transforms.io.formats.example_proto import example_class

LIST_DTYPES = {"float_list": "float32", "int64_list": "int64"}  # flat tensor features
ID_KINDS = ("bytes_list", "int64_list")
RANK_KINDS = ("float_list", "int64_list")


def _tf() -> Any:
    """TensorFlow, for parsing numeric features a batch at a time and serialized tensors
    (framing, CRCs, one Example at a time and writing need none: example_proto)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(f"{e}: reading TFRecord features needs TensorFlow: pip install "
                          "-c constraints.txt 'tensordedup[tf]'") from e
    return tf


class BadExample(Exception):
    """A record that cannot be used; the message is the one-line reason."""


@dataclass
class FeatureLayout:
    """What a file's records hold: the kinds of the features (from the first record
    that has them) and, for serialized tensors, the dtype and shape every record must
    have (from the spec, else from the first decodable tensor)."""

    kind: str | None = None  # of the tensor feature: float_list | int64_list | bytes_list
    id_kind: str | None = None
    rank_kind: str | None = None
    dtype: np.dtype | None = None
    shape: tuple[int, ...] | None = None
    problem: str | None = None  # why no record can be used (the spec disagrees with the file)

    def learn(self, examples: Iterator[dict[str, Any]], spec: TensorSpec) -> None:
        for feats in examples:
            if self.kind is None and spec.tensor in feats:
                self.kind = feats[spec.tensor].WhichOneof("kind")
                if self.kind in LIST_DTYPES:
                    self.problem = list_problem(spec, self.kind)
            if spec.id is not None and self.id_kind is None and spec.id in feats:
                self.id_kind = kind_in(feats[spec.id], ID_KINDS)
            if spec.rank is not None and self.rank_kind is None and spec.rank in feats:
                self.rank_kind = kind_in(feats[spec.rank], RANK_KINDS)
            if self.ready(spec):
                return

    def ready(self, spec: TensorSpec) -> bool:
        return (self.kind is not None and (spec.id is None or self.id_kind is not None)
                and (spec.rank is None or self.rank_kind is not None))


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
    if spec.shape is None and not spec.ragged:
        return (f"input.shape: feature {spec.tensor!r} is a flat {kind}: set input.shape "
                "to the per-record shape")
    return None


def np_dtype_of(name: str) -> np.dtype:
    """The numpy dtype of a dtype name, bfloat16 (ml_dtypes) included."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


@functools.cache
def _tf_dtypes() -> dict[int, np.dtype]:
    """TF DataType enum -> numpy dtype, for the dtypes a fingerprint takes."""
    tf = _tf()
    return {tf.as_dtype(name).as_datatype_enum: np_dtype_of(name)
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
    """The flat tensor as an array of ``spec.shape``, or the serialized TensorProto."""
    if layout.problem:
        raise BadExample(layout.problem)
    name = spec.tensor
    if name not in feats:
        raise BadExample(f"no feature {name!r}")
    kind = feats[name].WhichOneof("kind")
    if kind != layout.kind:
        raise BadExample(f"feature {name!r} is {kind or 'empty'}, not {layout.kind} like the first "
                   "record")
    if kind == "bytes_list":
        return _value(feats, name, (kind,))[1]
    values = getattr(feats[name], kind).value
    if spec.ragged:  # a sequence of its own length
        return np.asarray(values, dtype=LIST_DTYPES[kind])
    assert spec.shape is not None  # else layout.problem
    if len(values) != math.prod(spec.shape):
        raise BadExample(f"feature {name!r} has {len(values)} values, not {math.prod(spec.shape)} "
                   f"(input.shape {list(spec.shape)})")
    return np.asarray(values, dtype=LIST_DTYPES[kind]).reshape(spec.shape)


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
    shape = [] if layout.kind == "bytes_list" else list(spec.shape or ())
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
    elif layout.kind in LIST_DTYPES and spec.shape is not None:
        rows = [v for v, why in zip(values, reasons, strict=True) if why is None]
        tensors = np.array(rows, dtype=LIST_DTYPES[layout.kind])
        tensors = tensors.reshape((len(rows), *spec.shape))
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
