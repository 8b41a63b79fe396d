"""A fixed set of tensors whose digests are committed in golden_digests.json.

Regenerate the JSON only for a deliberate, documented scheme change:
``python -m tests.golden_cases > tests/golden_digests.json``.
"""

import json

import ml_dtypes
import numpy as np


def cases() -> dict[str, np.ndarray]:
    return {
        "f32_arange_6": np.arange(6, dtype=np.float32),
        "f32_arange_2x3": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i32_arange_6": np.arange(6, dtype=np.int32),
        "f64_specials": np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-310]),
        "f16_linspace": np.linspace(-2, 2, 9, dtype=np.float16),
        "bf16_values": np.array([1.5, -3.0, 0.0078125], dtype=ml_dtypes.bfloat16),
        "bool_2x2": np.array([[True, False], [False, True]]),
        "u8_empty_0x3": np.zeros((0, 3), dtype=np.uint8),
        "i64_scalar": np.array(-7, dtype=np.int64),
        "u64_max": np.array([2**64 - 1, 0], dtype=np.uint64),
        "i8_range": np.arange(-128, 128, dtype=np.int8),
        "c64_values": np.array([1 + 2j, -0.0 - 0j], dtype=np.complex64),
        "c128_values": np.array([3.5 - 1j], dtype=np.complex128),
        "u16_3d": np.arange(24, dtype=np.uint16).reshape(2, 3, 4),
        "f32_long_1000": np.sin(np.arange(1000, dtype=np.float32)),
        "f64_stream_300k": np.cos(np.arange(300_000, dtype=np.float64)),
    }


if __name__ == "__main__":
    from transforms.digests import SCHEME
    from transforms.fingerprint import fingerprint, quantized_fingerprint

    out = {"scheme": SCHEME,
           "exact": {k: fingerprint(v).hex() for k, v in cases().items()},
           "quantized_step_0.25": {k: quantized_fingerprint(v, 0.25).hex()
                                   for k, v in cases().items()},
           "quantized_step_0.01_normalized": {
               k: quantized_fingerprint(v, 0.01, normalize=True).hex()
               for k, v in cases().items()}}
    print(json.dumps(out, indent=1))
