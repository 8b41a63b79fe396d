"""Committed digests: any change to the algorithm, canonical form or header fails here.

Also re-derives every exact digest from the written spec (docs/fingerprint.md) with an
independent, element-by-element pure-Python canonicaliser, so the doc stays true.
"""

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from tests.golden_cases import cases
from transforms.digests import SCHEME
from transforms.fingerprint import fingerprint, quantized_fingerprint

GOLDEN = json.loads((Path(__file__).parent / "golden_digests.json").read_text())
CODES = {"bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7,
         "uint32": 8, "uint64": 9, "float16": 10, "bfloat16": 11, "float32": 12,
         "float64": 13, "complex64": 15, "complex128": 16}
INT_FORMATS = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q",
               "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q"}
CANONICAL_NAN = {"float16": b"\x00\x7e", "bfloat16": b"\xc0\x7f", "float32": b"\x00\x00\xc0\x7f",
                 "float64": b"\x00\x00\x00\x00\x00\x00\xf8\x7f"}


def _float_bytes(v: float, name: str) -> bytes:
    if math.isnan(v):
        return CANONICAL_NAN[name]
    v = v + 0.0 if v != 0 else 0.0  # -0.0 -> +0.0
    if name == "bfloat16":
        return struct.pack("<f", v)[2:]  # bfloat16 = upper half of float32 (values are exact)
    return struct.pack("<" + {"float16": "e", "float32": "f", "float64": "d"}[name], v)


def spec_digest(a: np.ndarray) -> bytes:
    name = a.dtype.name
    header = b"TDFP" + bytes([1, CODES[name], a.ndim]) + b"".join(
        struct.pack("<Q", d) for d in a.shape)
    data = bytearray()
    for v in a.reshape(-1).tolist():
        if name in INT_FORMATS:
            data += struct.pack("<" + INT_FORMATS[name], v)
        elif name.startswith("complex"):
            part = "float32" if name == "complex64" else "float64"
            data += _float_bytes(v.real, part) + _float_bytes(v.imag, part)
        else:
            data += _float_bytes(float(v), name)
    value = xxhash.xxh3_128_intdigest(bytes(data)) ^ xxhash.xxh3_128_intdigest(header)
    return value.to_bytes(16, "big")


def test_scheme_unchanged():
    assert GOLDEN["scheme"] == SCHEME


@pytest.mark.parametrize("name", sorted(cases()))
def test_exact_digest_is_golden(name):
    assert fingerprint(cases()[name]).hex() == GOLDEN["exact"][name]


@pytest.mark.parametrize("name", sorted(n for n in cases() if n != "f64_stream_300k"))
def test_spec_reimplementation_agrees(name):
    assert spec_digest(cases()[name]).hex() == GOLDEN["exact"][name]


@pytest.mark.parametrize("name", sorted(cases()))
def test_quantized_digest_is_golden(name):
    a = cases()[name]
    assert quantized_fingerprint(a, 0.25).hex() == GOLDEN["quantized_step_0.25"][name]
    assert (quantized_fingerprint(a, 0.01, normalize=True).hex()
            == GOLDEN["quantized_step_0.01_normalized"][name])
