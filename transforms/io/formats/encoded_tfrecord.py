"""Encoded values in TFRecord: a ``bytes_list`` feature of ``tf.train.Example`` holding one
value, such as ``image/encoded`` (TFDS, the object-detection and ImageNet layouts).

Records are framed by the TFRecord reader's own framing (bad records reported, not
fatal) and parsed one at a time by protobuf (``example_proto``: TensorFlow is not
imported); a batch is at most ``rows`` records and ``max_bytes`` bytes, so big images
never pile up in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

import numpy as np

from transforms.io import fs
from transforms.io.formats.base import (
    InputError,
    InvalidRecord,
    TensorSpec,
    Unit,
    Values,
    default_id,
    unreadable_file,
)
from transforms.io.formats.tfrecord import first_examples
from transforms.io.formats.tfrecord_frames import read_frames
from transforms.io.formats.tfrecord_parse import (
    FeatureLayout,
    checked_features,
    parse_examples,
    parse_one,
)


def _take(items: Iterator[bytes | str], rows: int, max_bytes: int) -> list[bytes | str]:
    """The next items, up to ``rows`` of them or ``max_bytes`` bytes (at least one)."""
    out: list[bytes | str] = []
    size = 0
    for item in items:
        out.append(item)
        size += len(item)
        if len(out) >= rows or size >= max_bytes:
            break
    return out


def check(path: str, spec: TensorSpec) -> tuple[bytes, str] | None:
    """(first value, where) after checking the features of the first readable records
    (``checked_features``: one that lacks the feature is invalid, as anywhere else)."""
    examples = first_examples(path, spec)
    if not examples:
        return None
    kind, feats = checked_features(path, spec, examples)
    n = len(getattr(feats[spec.tensor], kind).value)
    if kind != "bytes_list" or n != 1:
        raise InputError(f"{path}: input.decode: feature {spec.tensor!r} is a {kind} of {n} "
                         "values in the first record holding it, not a bytes_list of one "
                         "encoded value: set input.decode: none for numeric features")
    return feats[spec.tensor].bytes_list.value[0], f"feature {spec.tensor!r}"


def _values(file_index: int, path: str, first: int, items: list[bytes | str],
            spec: TensorSpec, layout: FeatureLayout) -> Values:
    invalid = [InvalidRecord(first + i, default_id(path, first + i), item)
               for i, item in enumerate(items) if isinstance(item, str)]
    datas = [item for item in items if isinstance(item, bytes)]
    positions = first + np.array([i for i, item in enumerate(items) if isinstance(item, bytes)],
                                 dtype=np.int64)
    if not layout.ready(spec):
        layout.learn(parse_examples(datas), spec)
    n = len(datas)
    ids, values, ranks = [None] * n, [None] * n, [None] * n
    reasons: list[str | None] = [None] * n
    for i, data in enumerate(datas):  # 2-3 us a record: no TensorFlow needed
        ids[i], values[i], ranks[i], reasons[i] = parse_one(data, spec, layout)
        if reasons[i] is None and not isinstance(values[i], bytes):
            reasons[i] = f"feature {spec.tensor!r} is not a bytes_list of one value"
    ids = [default_id(path, p) if i is None else i
           for p, i in zip(positions.tolist(), ids, strict=True)]
    ok = [i for i, why in enumerate(reasons) if why is None]
    invalid += [InvalidRecord(int(positions[i]), ids[i], why or "")
                for i, why in enumerate(reasons) if why is not None]
    invalid.sort(key=lambda r: r.position)
    rank = None
    if spec.rank is not None:
        rank = np.asarray([ranks[i] for i in ok], dtype=np.float64)
    return Values(file_index, positions[ok], np.array([ids[i] for i in ok], dtype=object),
                  [values[i] for i in ok], rank, invalid)


def read_values(unit: Unit, spec: TensorSpec, rows: int, max_bytes: int) -> Iterator[Values]:
    try:
        f = fs.open_read(unit.path)
    except OSError as e:
        yield Values(unit.file_index, np.empty(0, np.int64), np.empty(0, object), [], None,
                     [unreadable_file(unit.path, f"cannot open file: {e}")])
        return
    layout = FeatureLayout()
    with f:
        items = islice(read_frames(f, spec.compression), unit.start, unit.stop)
        first = unit.start
        while batch := _take(items, rows, max_bytes):
            yield _values(unit.file_index, unit.path, first, batch, spec, layout)
            first += len(batch)


def values_at(path: str, spec: TensorSpec, positions: Iterable[int]) -> dict[int, bytes]:
    """The stored values at ``positions``: TFRecord has no index, so the file is read up to
    the last position wanted, with the job's own reader (positions mean the same)."""
    want = set(int(p) for p in positions)
    if not want:
        return {}
    out: dict[int, bytes] = {}
    for vals in read_values(Unit(0, path, 0, max(want) + 1), spec, 4096, 64 << 20):
        for p, v in zip(vals.positions.tolist(), vals.values, strict=True):
            if p in want:
                out[p] = v
    return out
