"""Canonical form of a tensor: the exact bytes and header a fingerprint is taken of.

Why: the same values must give the same digest whatever produced them (numpy,
torch on any device or with any strides, TensorFlow, nested lists). Everything
is converted here to a C-ordered little-endian array whose float bit patterns
are canonical (-0.0 -> +0.0, every NaN -> one quiet NaN); the dtype and shape
go into a header whose hash is XORed into the digest. The rules are specified in
``docs/fingerprint.md``. Heavy frameworks are never imported here: a tensor is
recognised only if its framework is already loaded.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# Stable dtype codes: part of every digest, never renumber.
DTYPE_CODES: dict[str, int] = {
    "bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5,
    "uint8": 6, "uint16": 7, "uint32": 8, "uint64": 9,
    "float16": 10, "bfloat16": 11, "float32": 12, "float64": 13,
    "complex32": 14, "complex64": 15, "complex128": 16,
}


def dtype_named(name: str) -> np.dtype:
    """The numpy dtype of a name, ml_dtypes' (bfloat16) included. ml_dtypes is imported
    only for them: its import took a third of the job's start (0.9 of 2.7 s)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: F401  (registers bfloat16 & co. by name with numpy)

        return np.dtype(name)


# For each float dtype: (unsigned bit-view dtype, sign bit, +inf bits, canonical quiet NaN bits).
FLOAT_BITS: dict[str, tuple[type, int, int, int]] = {
    "float16": (np.uint16, 0x8000, 0x7C00, 0x7E00),
    "bfloat16": (np.uint16, 0x8000, 0x7F80, 0x7FC0),
    "float32": (np.uint32, 0x80000000, 0x7F800000, 0x7FC00000),
    "float64": (np.uint64, 1 << 63, 0x7FF0000000000000, 0x7FF8000000000000),
}
# Complex dtypes are canonicalised component-wise as pairs of these floats.
_COMPONENT = {"complex32": "float16", "complex64": "float32", "complex128": "float64"}


def refuse_meta(t: Any) -> None:
    """TypeError for a torch tensor on the meta device (a shape without values): torch's
    own "Cannot copy out of meta tensor" names no fix."""
    if t.device.type == "meta":
        raise TypeError("a meta tensor holds no values to fingerprint: materialise it first "
                        "(e.g. .to_empty(device='cpu') and load its values)")


def _torch_to_numpy(t: Any) -> tuple[np.ndarray, str]:
    import torch

    refuse_meta(t)
    if t.layout != torch.strided:
        raise TypeError(f"unsupported torch layout {t.layout}: convert with .to_dense() first")
    if t.is_quantized:
        raise TypeError(f"unsupported dtype {t.dtype}: dequantize() the tensor first")
    t = t.detach().resolve_conj().resolve_neg()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype_named("bfloat16")), "bfloat16"
    if t.dtype == torch.complex32:
        return torch.view_as_real(t).numpy(), "complex32"
    try:
        arr = t.numpy()
    except TypeError as e:
        raise TypeError(f"unsupported dtype {t.dtype}: {e}") from None
    return arr, _dtype_name(arr.dtype)


def _tf_to_numpy(t: Any) -> tuple[np.ndarray, str]:
    try:
        arr = t.numpy()
    except (AttributeError, NotImplementedError) as e:
        raise TypeError(
            "symbolic TensorFlow tensor: fingerprints need values; call eagerly or inside "
            f"tf.py_function ({e})"
        ) from None
    arr = np.asarray(arr)
    return arr, _dtype_name(arr.dtype)


def _dtype_name(dtype: np.dtype) -> str:
    name = dtype.name
    if name not in DTYPE_CODES or name == "complex32":
        raise TypeError(
            f"unsupported dtype {dtype!s}: fingerprints take bool, (u)int8..64, float16, "
            "bfloat16, float32, float64 and complex tensors"
        )
    return name


def to_numpy(x: Any) -> tuple[np.ndarray, str]:
    """Return ``(array, dtype name)`` for any supported tensor, without copying where possible.

    Complex32 (torch ``chalf``) comes back as a float16 array with a trailing axis
    of 2 (real, imag); every other dtype keeps its shape. Raises ``TypeError``
    naming the dtype for anything unsupported (object, strings, ragged lists).
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_to_numpy(x)
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(f"unsupported tensor type {type(x).__name__}: convert to dense first")
        if isinstance(x, (tf.Tensor, tf.Variable)):
            return _tf_to_numpy(x)
    if isinstance(x, np.ma.MaskedArray) and np.ma.getmask(x).any():
        raise TypeError("a masked array with masked values: the values under the mask would "
                        "be fingerprinted as if shown; pass .filled(<value>) or the "
                        ".compressed() values")
    try:
        arr = np.asarray(x)
    except ValueError as e:
        raise TypeError(f"unsupported input (ragged nested sequence?): {e}") from None
    return arr, _dtype_name(arr.dtype)


def row_shape(arr: np.ndarray, name: str, batch: bool) -> tuple[int, ...]:
    """Logical shape of one record (complex32 drops its trailing (real, imag) axis)."""
    shape = arr.shape[:-1] if name == "complex32" else arr.shape
    return tuple(int(d) for d in (shape[1:] if batch else shape))


def header(kind: bytes, name: str | None, shape: tuple[int, ...], extra: bytes = b"") -> bytes:
    """``kind`` (4 bytes) | version 1 | dtype code (0 for None) | ndim | dims LE uint64 | extra."""
    if len(shape) > 255:
        raise TypeError(f"tensor rank {len(shape)} > 255 is not supported")
    dims = b"".join(int(d).to_bytes(8, "little") for d in shape)
    return kind + bytes([1, DTYPE_CODES[name] if name else 0, len(shape)]) + dims + extra


def canonical_bits(arr: np.ndarray, name: str) -> np.ndarray:
    """C-contiguous little-endian array whose raw bytes are the canonical encoding.

    Copies only when it must (non-contiguous or big-endian input, -0.0 or NaN present,
    bool bytes other than 0/1).
    """
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)
    if name == "bool":
        u8 = arr.view(np.uint8)
        return (u8 != 0).view(np.uint8) if u8.size and u8.max() > 1 else u8
    fname = _COMPONENT.get(name, name)
    if fname not in FLOAT_BITS:
        return arr
    utype, sign, inf, qnan = FLOAT_BITS[fname]
    bits = arr.view(utype)
    if bits.size == 0:
        return bits
    signed = bits.view(np.dtype(utype).str.replace("u", "i"))
    has_negzero = int(signed.min()) == -sign
    if fname in ("float32", "float64"):
        has_nan = bool(np.isnan(bits.view(np.dtype(fname)).max()))
    else:
        has_nan = int((bits & utype(sign - 1)).max()) > inf
    if not (has_negzero or has_nan):
        return bits
    bits = bits.copy()
    if has_negzero:
        bits[bits == utype(sign)] = 0
    if has_nan:
        bits[(bits & utype(sign - 1)) > utype(inf)] = utype(qnan)
    return bits

