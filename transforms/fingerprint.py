"""Exact and quantized value fingerprints of tensors (the kernel every front end uses).

A digest is ``XXH3-128(canonical bytes) XOR XXH3-128(header)`` as 16 bytes in the
canonical big-endian order (``docs/fingerprint.md`` has the full spec). The same
values, dtype and shape give the same digest from numpy, torch (any device,
layout) or TensorFlow, alone or as a row of a batch. ``fingerprint_batch`` is
vectorized: rows of up to ``VECTOR_MAX_ROW_BYTES`` are hashed with array
operations in two threads; longer rows with one C call each on cache-sized
blocks; rows over ``STREAM_SLICE_BYTES`` are streamed slice by slice.
"""

from __future__ import annotations

import functools
import math
import numbers
import sys
from typing import Any

import numpy as np
import xxhash

from transforms.canonical import header, row_shape, to_numpy
from transforms.digests import hash_rows, header_key


def _batch(batch: Any) -> tuple[np.ndarray, str]:
    """``to_numpy`` for a batch: there must be a first axis of records."""
    arr, name = to_numpy(batch)
    if arr.ndim == 0 or (name == "complex32" and arr.ndim == 1):
        raise ValueError("a batch needs a first axis of records; for one tensor use fingerprint()")
    return arr, name


def _is_device_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and x.device.type != "cpu"


def fingerprint_batch(batch: Any, *, backend: str = "auto") -> np.ndarray:
    """Exact digests of the N records of ``batch`` (first axis = records).

    Returns a numpy array of N digests, dtype ``V16`` (``.tobytes()`` / ``bytes(d)``
    gives the 16 bytes; ``fingerprint(batch[i]) == bytes(result[i])``).
    ``backend``: ``"auto"`` (torch kernel on the tensor's device for non-CPU torch
    tensors, numpy otherwise), ``"numpy"`` or ``"torch"`` (the device kernel, also
    on CPU tensors -- used to test it without a GPU).
    """
    if backend not in ("auto", "numpy", "torch"):
        raise ValueError(f"backend must be 'auto', 'numpy' or 'torch', not {backend!r}")
    if backend == "torch" or (backend == "auto" and _is_device_tensor(batch)):
        from transforms.fingerprint_torch import fingerprint_batch_torch

        return fingerprint_batch_torch(batch)
    arr, name = _batch(batch)
    return hash_rows(arr, name, header_key(header(b"TDFP", name, row_shape(arr, name, True))))


def fingerprint_array(arr: np.ndarray, name: str) -> bytes:
    """The exact digest of one tensor already converted by ``to_numpy``."""
    key = header_key(header(b"TDFP", name, row_shape(arr, name, False)))
    return bytes(hash_rows(arr[None], name, key)[0])


@functools.lru_cache(maxsize=256)
def _uint8_key(shape: tuple[int, ...]) -> tuple[int, int]:
    hi, lo = header_key(header(b"TDFP", "uint8", shape))
    return int(hi), int(lo)


def fingerprint_uint8(buf: bytes | memoryview | np.ndarray, shape: tuple[int, ...]) -> bytes:
    """``fingerprint`` of a uint8 tensor of ``shape`` whose C-order bytes are ``buf``,
    without the general path's per-call work (decoded images and stored bytes: a few us
    an image, in the threads that share the interpreter with the decoders). uint8 bytes
    are their own canonical form."""
    hi, lo = _uint8_key(shape)
    h = xxhash.xxh3_128_intdigest(np.ascontiguousarray(buf) if isinstance(buf, np.ndarray)
                                  else buf)
    return ((h >> 64) ^ hi).to_bytes(8, "big") + ((h & ((1 << 64) - 1)) ^ lo).to_bytes(8, "big")


def fingerprint(t: Any) -> bytes:
    """The 16-byte exact digest of one tensor (value, dtype and shape)."""
    if _is_device_tensor(t):
        return bytes(fingerprint_batch(t[None])[0])
    return fingerprint_array(*to_numpy(t))


# --- quantized fingerprint -------------------------------------------------------------

_CELL_LIMIT = 1 << 62
_NAN_CELL, _POS_INF_CELL, _NEG_INF_CELL = -(1 << 63), (1 << 63) - 1, -(1 << 63) + 1


def quantize(arr: np.ndarray, name: str, step: float, normalize: bool) -> np.ndarray:
    """Integer grid cells ``floor(x / step + 0.5)`` (float64) of each record (first axis).

    With ``normalize`` each record is first divided by its L2 norm (all-zero
    records stay zero). Complex values are quantized per (real, imag) component.
    NaN, +inf and -inf map to reserved cells; finite cells are clipped to +-2**62.
    """
    x = arr.view(np.float16).astype(np.float64) if name == "complex32" else arr
    if np.iscomplexobj(x):
        x = x.astype(np.complex128).view(np.float64)
    x = x.astype(np.float64).reshape(arr.shape[0], -1)
    if normalize:
        finite = np.where(np.isfinite(x), x, 0.0)
        norm = np.sqrt(np.sum(finite * finite, axis=1, keepdims=True))
        x = x / np.where(norm > 0, norm, 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        cells = np.floor(x / step + 0.5)
        q = np.clip(cells, -_CELL_LIMIT, _CELL_LIMIT).astype(np.int64)
    q[np.isnan(x)] = _NAN_CELL
    q[np.isposinf(x)] = _POS_INF_CELL
    q[np.isneginf(x)] = _NEG_INF_CELL
    return q


def _check_step(step: float) -> float:
    if isinstance(step, bool) or not isinstance(step, numbers.Real):  # "0.1" is no step
        raise TypeError(f"step must be a number, got {type(step).__name__} {step!r}")
    step = float(step)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"step must be a finite number > 0, got {step}")
    return step


def _quantized_digests(arr: np.ndarray, name: str, step: float, normalize: bool) -> np.ndarray:
    step = _check_step(step)
    extra = np.float64(step).tobytes() + bytes([int(normalize)])
    # dtype code 0: quantized digests compare values, so float16/32/64 copies can match
    key = header_key(header(b"TDFQ", None, row_shape(arr, name, True), extra))
    return hash_rows(quantize(arr, name, step, normalize), "int64", key)


def quantized_fingerprint_batch(batch: Any, step: float, *, normalize: bool = False) -> np.ndarray:
    """Digests of each record after quantization to a grid of ``step`` (see ``quantize``).

    Records whose values fall in the same grid cells get the same digest; a pair
    that straddles a cell boundary does not, however close: use it as a cheap
    pre-pass or streaming key, never as the only near-duplicate test.
    """
    arr, name = _batch(batch)
    return _quantized_digests(arr, name, step, normalize)


def quantized_fingerprint(t: Any, step: float, *, normalize: bool = False) -> bytes:
    """The quantized digest of one tensor (equal to its row in ``quantized_fingerprint_batch``)."""
    arr, name = to_numpy(t)
    return bytes(_quantized_digests(arr[None], name, step, normalize)[0])
