"""Tensors as dictionary keys, by value: ``TensorKey`` and ``TensorDict``.

Why: ``{tensor: v}`` fails in TensorFlow and keys by object identity in torch.
A ``TensorKey`` hashes and compares by the exact fingerprint (value, dtype,
shape) and keeps its own read-only copy of the values, so mutating the original
tensor afterwards cannot corrupt a dict. ``TensorDict`` accepts numpy, torch and
TensorFlow tensors interchangeably as keys and adds tolerance lookups that are
exact: candidates are checked elementwise in float64 (64-bit integers subtracted
exactly, as the job does), never rounded or bucketed.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, NamedTuple

import numpy as np

from transforms.canonical import row_shape, to_numpy
from transforms.fingerprint import fingerprint_array
from transforms.near.verify import difference


class TensorKey:
    """Hashable, immutable, value-based key for one tensor."""

    __slots__ = ("_digest", "_array", "_dtype", "_shape")

    def __init__(self, t: Any):
        if isinstance(t, TensorKey):
            self._digest, self._array = t._digest, t._array
            self._dtype, self._shape = t._dtype, t._shape
            return
        arr, name = to_numpy(t)  # converted once: digest and copy come from the same array
        self._digest = fingerprint_array(arr, name)
        self._array = np.array(arr, copy=True)
        self._array.setflags(write=False)
        self._dtype = name
        self._shape = row_shape(arr, name, batch=False)

    @property
    def digest(self) -> bytes:
        return self._digest

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def array(self) -> np.ndarray:
        """A read-only numpy copy of the key's values (complex32 as float16 pairs)."""
        return self._array

    def __hash__(self) -> int:
        return int.from_bytes(self._digest[:8], "little")

    def __eq__(self, other: object) -> bool:
        # False, not NotImplemented: numpy would otherwise answer elementwise
        return isinstance(other, TensorKey) and self._digest == other._digest

    def __repr__(self) -> str:
        digest = self._digest.hex()[:12]
        return f"TensorKey(dtype={self._dtype}, shape={self._shape}, digest={digest})"


class Match(NamedTuple):
    """A tolerance-lookup result: the stored key, its value, and the L2 distance to the query."""

    key: TensorKey
    value: Any
    distance: float


def _flat(key: TensorKey) -> np.ndarray:
    """Values of a key as a flat vector for tolerance comparisons: integers as int64 or
    uint64 (``verify.difference`` subtracts them exactly: float64 drops the low bits of
    values above 2^53), complex as complex128, the rest as float64."""
    arr = key.array
    if key.dtype == "complex32":
        return np.ascontiguousarray(arr.astype(np.float64)).view(np.complex128).reshape(-1)
    if np.iscomplexobj(arr):
        return arr.astype(np.complex128).reshape(-1)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64 if arr.dtype.kind == "i" else np.uint64).reshape(-1)
    return arr.astype(np.float64).reshape(-1)


def _minus(m: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Rows of ``m`` minus ``q``, each difference rounded once."""
    if np.iscomplexobj(m) or np.iscomplexobj(q):
        return m.astype(np.complex128) - q.astype(np.complex128)
    return difference(m, q)


class TensorDict(MutableMapping):
    """A dict keyed by tensor values (numpy, torch and tf keys interchangeably).

    ``d[t] = v`` stores ``v`` under ``TensorKey(t)``; two tensors are the same key
    exactly when they have the same dtype, shape and values (-0.0 equals 0.0, all
    NaNs are equal). ``get_near`` and ``nearest`` search keys of the same shape
    across dtypes, comparing values in float64 (64-bit integers subtracted exactly).
    """

    def __init__(self, items: Any = ()):
        self._data: dict[TensorKey, Any] = {}
        self._by_shape: dict[tuple[int, ...], tuple[list[TensorKey], np.ndarray] | None] = {}
        self.update(items)

    def _key(self, t: Any) -> TensorKey:
        return t if isinstance(t, TensorKey) else TensorKey(t)

    def __getitem__(self, t: Any) -> Any:
        return self._data[self._key(t)]

    def __setitem__(self, t: Any, value: Any) -> None:
        key = self._key(t)
        if key not in self._data:
            self._by_shape[key.shape] = None  # invalidate that shape's search matrix
        self._data[key] = value

    def __delitem__(self, t: Any) -> None:
        key = self._key(t)
        del self._data[key]
        self._by_shape[key.shape] = None

    def __iter__(self) -> Iterator[TensorKey]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"TensorDict({len(self)} keys)"

    def _candidates(self, shape: tuple[int, ...]) -> tuple[list[TensorKey], list[tuple]]:
        """Keys of ``shape`` and their values stacked by kind: (positions, matrix) each."""
        entry = self._by_shape.get(shape)
        if entry is None:
            keys = [k for k in self._data if k.shape == shape]
            by_dtype: dict[np.dtype, list[int]] = {}
            vectors = [_flat(k) for k in keys]
            for i, v in enumerate(vectors):
                by_dtype.setdefault(v.dtype, []).append(i)
            groups = [(np.array(ix), np.stack([vectors[i] for i in ix]))
                      for ix in by_dtype.values()]
            entry = (keys, groups)
            self._by_shape[shape] = entry
        return entry

    def _query(self, t: Any) -> tuple[TensorKey, list[TensorKey], np.ndarray, np.ndarray]:
        """The query's key, the keys of its shape, their differences from it (rows) and
        its values."""
        query = self._key(t)
        keys, groups = self._candidates(query.shape)
        q = _flat(query)
        complex_ = np.iscomplexobj(q) or any(np.iscomplexobj(m) for _, m in groups)
        diff = np.empty((len(keys), q.size), np.complex128 if complex_ else np.float64)
        for ix, m in groups:
            diff[ix] = _minus(m, q)
        return query, keys, diff, q

    def near(self, t: Any, *, atol: float = 1e-8, rtol: float = 1e-5) -> list[Match]:
        """All stored keys ``k`` of ``t``'s shape with ``|k - t| <= atol + rtol * |t|``
        elementwise (numpy ``isclose`` with ``t`` as reference), nearest first.

        An exact match (same digest) is always included with distance 0.0, even with NaNs.
        """
        query, keys, diff, q = self._query(t)
        if not keys:
            return []
        close = np.abs(diff) <= atol + rtol * np.abs(q.astype(diff.dtype))
        hits = np.flatnonzero(close.all(axis=1))
        out = [Match(keys[i], self._data[keys[i]], float(np.linalg.norm(diff[i])))
               for i in hits]
        if query in self._data and all(m.key != query for m in out):
            out.append(Match(query, self._data[query], 0.0))
        return sorted(out, key=lambda m: m.distance)

    def get_near(self, t: Any, default: Any = None, *, atol: float = 1e-8,
                 rtol: float = 1e-5) -> Any:
        """The value of the nearest key within tolerance (see ``near``), else ``default``."""
        if t in self:
            return self[t]
        matches = self.near(t, atol=atol, rtol=rtol)
        return matches[0].value if matches else default

    def nearest(self, t: Any) -> Match:
        """The stored key of ``t``'s shape with the smallest L2 distance (ties: first inserted).

        Raises ``KeyError`` if no key has that shape, ``ValueError`` if ``t`` has NaNs.
        """
        query = self._key(t)
        if query in self._data:  # before the differences from every key of its shape
            return Match(query, self._data[query], 0.0)
        _, keys, diff, q = self._query(query)
        if q.dtype.kind in "fc" and np.isnan(q).any():
            raise ValueError("nearest() needs a query without NaN values")
        if not keys:
            raise KeyError(f"no key with shape {query.shape}")
        dist = np.linalg.norm(diff, axis=1)
        dist = np.where(np.isnan(dist), np.inf, dist)
        i = int(np.argmin(dist))
        return Match(keys[i], self._data[keys[i]], float(dist[i]))
