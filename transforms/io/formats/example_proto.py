"""``tf.train.Example`` without TensorFlow: the message classes built from their schema.

Why: reading an Example needs only its five messages, but TensorFlow's generated
classes live inside the ``tensorflow`` package, and importing it took 2.5-4 s and
about 3 CPU-s per process (with Keras), more than decoding 4,000 photos. The classes
here are made by protobuf itself (the same upb parser TensorFlow's use) from the
schema of ``tensorflow/core/example/{example,feature}.proto``, in a private descriptor
pool, so they never clash with TensorFlow's own when both are loaded.
"""

from __future__ import annotations

import functools
from typing import Any

_BYTES, _FLOAT, _INT64, _STRING, _MESSAGE = 12, 2, 3, 9, 11  # FieldDescriptorProto.Type
_OPTIONAL, _REPEATED = 1, 3


@functools.cache
def example_class() -> Any:
    """The ``tensorflow.Example`` message class (``FromString``, ``features.feature``)."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    f = descriptor_pb2.FileDescriptorProto(name="tensordedup/example.proto",
                                           package="tensorflow", syntax="proto3")

    def message(name: str, fields: list[tuple], into: Any = f.message_type) -> Any:
        m = into.add(name=name)
        for field_name, number, label, kind, type_name, oneof in fields:
            fd = m.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                fd.type_name = type_name
            if oneof is not None:
                fd.oneof_index = oneof
            if label == _REPEATED and kind in (_FLOAT, _INT64):
                fd.options.packed = True
        return m

    message("BytesList", [("value", 1, _REPEATED, _BYTES, None, None)])
    message("FloatList", [("value", 1, _REPEATED, _FLOAT, None, None)])
    message("Int64List", [("value", 1, _REPEATED, _INT64, None, None)])
    feature = message("Feature", [
        ("bytes_list", 1, _OPTIONAL, _MESSAGE, ".tensorflow.BytesList", 0),
        ("float_list", 2, _OPTIONAL, _MESSAGE, ".tensorflow.FloatList", 0),
        ("int64_list", 3, _OPTIONAL, _MESSAGE, ".tensorflow.Int64List", 0)])
    feature.oneof_decl.add(name="kind")
    features = message("Features", [
        ("feature", 1, _REPEATED, _MESSAGE, ".tensorflow.Features.FeatureEntry", None)])
    entry = message("FeatureEntry", [
        ("key", 1, _OPTIONAL, _STRING, None, None),
        ("value", 2, _OPTIONAL, _MESSAGE, ".tensorflow.Feature", None)], features.nested_type)
    entry.options.map_entry = True
    message("Example", [("features", 1, _OPTIONAL, _MESSAGE, ".tensorflow.Features", None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))
