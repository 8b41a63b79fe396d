"""Identity rules of the exact fingerprint across frameworks, layouts, dtypes and batches."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from transforms.digests import DIGEST_DTYPE
from transforms.fingerprint import fingerprint, fingerprint_batch, quantized_fingerprint

NUMPY_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128]
TORCH_DTYPES = {np.dtype(np.bool_): torch.bool, np.dtype(np.int8): torch.int8,
                np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32,
                np.dtype(np.int64): torch.int64, np.dtype(np.uint8): torch.uint8,
                np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                np.dtype(np.float64): torch.float64, np.dtype(np.complex64): torch.complex64,
                np.dtype(np.complex128): torch.complex128}

shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6)
arrays = st.one_of(*[hnp.arrays(d, shapes) for d in NUMPY_DTYPES])


def _copies(a: np.ndarray) -> list:
    """The same values through other frameworks and memory layouts."""
    out = [np.asfortranarray(a), a.copy(order="C"), np.flip(np.flip(a, 0).copy(), 0),
           tf.constant(a), tf.Variable(a)]
    if a.dtype in TORCH_DTYPES:
        t = torch.from_numpy(a.copy())
        out += [t, t.t().contiguous().t() if t.dim() == 2 else t.clone()]
    return out


@settings(max_examples=150, deadline=None)
@given(arrays)
def test_same_values_same_digest_everywhere(a):
    d = fingerprint(a)
    assert len(d) == 16
    for other in _copies(a):
        assert fingerprint(other) == d, type(other)


@settings(max_examples=100, deadline=None)
@given(arrays)
def test_batch_rows_equal_single_digests(a):
    batch = fingerprint_batch(a)
    assert batch.dtype == DIGEST_DTYPE and batch.shape == (a.shape[0],)
    assert [bytes(d) for d in batch] == [fingerprint(row) for row in a]
    if a.dtype in TORCH_DTYPES:
        torch_batch = fingerprint_batch(torch.from_numpy(a.copy()), backend="torch")
        assert (torch_batch == batch).all()


@pytest.mark.parametrize("rows,width", [(300, 1), (5000, 4), (70000, 4), (600, 33), (3, 300_000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.complex64])
def test_large_batches_all_paths(rows, width, dtype):
    """Vectorized, C-loop and streaming paths agree with single-tensor digests."""
    a = np.random.default_rng(rows).standard_normal((rows, width)).astype(dtype)
    a.reshape(-1)[:: max(1, a.size // 7)] = -0.0
    if np.issubdtype(dtype, np.inexact):
        a.reshape(-1)[1 :: max(1, a.size // 5)] = np.nan
    batch = fingerprint_batch(a)
    for i in sorted({0, 1, rows // 2, rows - 1}):
        assert bytes(batch[i]) == fingerprint(a[i])
    assert (fingerprint_batch(np.asfortranarray(a)) == batch).all()
    assert (fingerprint_batch(torch.from_numpy(a), backend="torch") == batch).all()


def test_views_and_slices():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    view = base[1:5:2, ::3]
    assert fingerprint(view) == fingerprint(view.copy())
    t = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    assert fingerprint(t[1:5:2, ::3]) == fingerprint(view)
    assert (fingerprint_batch(base[:, ::2]) == fingerprint_batch(base[:, ::2].copy())).all()


def test_dtype_and_shape_are_identity():
    a = np.array([1, 2], dtype=np.float32)
    assert fingerprint(a) != fingerprint(a.astype(np.float64))
    assert fingerprint(a) != fingerprint(a.view(np.int32))  # same bits, other dtype
    six = np.arange(6, dtype=np.int32)
    assert fingerprint(six) != fingerprint(six.reshape(2, 3))
    assert fingerprint(six.reshape(2, 3)) != fingerprint(six.reshape(3, 2))
    assert fingerprint(np.zeros((0, 3))) != fingerprint(np.zeros((3, 0)))
    assert fingerprint(np.float32(1)) != fingerprint(np.array([1], np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16,
                                   np.complex64, np.complex128])
def test_negative_zero_and_nan_payloads_are_canonical(dtype):
    zero = np.array([0.0, 1.0], dtype=dtype)
    negzero = np.array([-0.0, 1.0], dtype=dtype)
    assert fingerprint(negzero) == fingerprint(zero)
    nan = np.array([np.nan, 1.0], dtype=dtype)
    bits = nan.view(np.dtype(f"u{nan.itemsize if nan.dtype.kind != 'c' else nan.itemsize // 2}"))
    other = bits.copy()
    other[0] |= 1  # another NaN payload
    other[0] |= np.array(1, other.dtype) << (8 * other.itemsize - 1)  # negative NaN
    assert np.isnan(other.view(dtype)[0])
    assert fingerprint(other.view(dtype)) == fingerprint(nan)
    assert fingerprint(nan) != fingerprint(zero)


def test_torch_negzero_nan_on_device_kernel():
    t = torch.tensor([[-0.0, float("nan")], [0.0, -float("nan")]], dtype=torch.float32)
    d = fingerprint_batch(t, backend="torch")
    assert d[0] == d[1]
    assert bytes(d[0]) == fingerprint(np.array([0.0, np.nan], np.float32))


def test_bfloat16_across_frameworks():
    vals = [1.5, -0.0, 3.25, float("nan")]
    ref = fingerprint(np.array(vals, dtype=ml_dtypes.bfloat16))
    assert fingerprint(torch.tensor(vals, dtype=torch.bfloat16)) == ref
    assert fingerprint(tf.constant(vals, dtype=tf.bfloat16)) == ref
    assert bytes(fingerprint_batch(torch.tensor([vals], dtype=torch.bfloat16),
                                   backend="torch")[0]) == ref


def test_complex32_torch_only_dtype():
    t = torch.tensor([1 + 2j, -0.0 + 0j], dtype=torch.complex32)
    assert fingerprint(t) == fingerprint(torch.tensor([1 + 2j, 0j], dtype=torch.complex32))
    assert fingerprint(t) != fingerprint(t.to(torch.complex64))
    assert bytes(fingerprint_batch(t[None], backend="torch")[0]) == fingerprint(t)


def test_torch_lazy_conj_neg_and_grad():
    c = torch.tensor([1 + 2j, 3 - 1j])
    assert fingerprint(c.conj()) == fingerprint(c.conj().resolve_conj())
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    assert fingerprint(x) == fingerprint(np.array([1.0, 2.0], np.float32))


def test_nested_lists_and_scalars():
    assert fingerprint([[1.0, 2.0], [3.0, 4.0]]) == fingerprint(np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert fingerprint([1, 2]) == fingerprint(np.array([1, 2], dtype=np.int64))
    assert fingerprint(True) == fingerprint(np.bool_(True))


def test_bool_bytes_are_canonical():
    raw = np.array([0, 1, 2, 255], dtype=np.uint8).view(np.bool_)
    assert fingerprint(raw) == fingerprint(np.array([False, True, True, True]))


def test_big_endian_input():
    a = np.arange(5, dtype=">f8")
    assert fingerprint(a) == fingerprint(np.arange(5, dtype="<f8"))


@pytest.mark.parametrize("bad,word", [
    (np.array(["a", "b"]), "<U1"),
    (np.array([object(), 1], dtype=object), "object"),
    ([[1, 2], [3]], "ragged"),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), "datetime64"),
    (np.zeros(2, dtype=np.longdouble), "float128"),
])
def test_unsupported_inputs_raise_type_error_naming_them(bad, word):
    with pytest.raises(TypeError, match=word):
        fingerprint(bad)


def test_tf_string_and_ragged_rejected():
    with pytest.raises(TypeError, match="object"):
        fingerprint(tf.constant(["a"]))
    with pytest.raises(TypeError, match="RaggedTensor"):
        fingerprint(tf.ragged.constant([[1], [2, 3]]))


def test_values_a_digest_cannot_see_are_refused_by_name():
    """A masked array's hidden values, a meta tensor's missing ones and a step given as
    text were fingerprinted (two arrays that show the same values got different digests),
    or failed in torch with no fix named."""
    shown = np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])
    for f in (fingerprint, lambda m: fingerprint_batch(m[None])):
        with pytest.raises(TypeError, match="masked"):
            f(shown)
    assert fingerprint(np.ma.array([1.0, 2.0])) == fingerprint(np.array([1.0, 2.0]))
    assert fingerprint(shown.filled(0.0)) == fingerprint(np.array([1.0, 0.0, 3.0]))
    meta = torch.empty(2, 3, device="meta")
    for f in (lambda: fingerprint(meta[0]), lambda: fingerprint_batch(meta),
              lambda: fingerprint_batch(meta, backend="torch")):
        with pytest.raises(TypeError, match="meta tensor holds no values"):
            f()
    with pytest.raises(TypeError, match="step must be a number, got str"):
        quantized_fingerprint(np.ones(3), "0.1")
    assert quantized_fingerprint(np.ones(3), np.float32(0.5)) == \
        quantized_fingerprint(np.ones(3), 0.5)


def test_batch_needs_a_first_axis():
    with pytest.raises(ValueError):
        fingerprint_batch(np.float32(3))
    assert fingerprint_batch(np.zeros((0, 4))).shape == (0,)


def test_digests_stable_across_processes():
    code = ("import numpy as np; from transforms.fingerprint import fingerprint; "
            "print(fingerprint(np.linspace(-1, 1, 33, dtype=np.float32).reshape(3, 11)).hex())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": str(s), "PATH": ""}).stdout
            for s in (1, 2)}
    assert runs == {fingerprint(np.linspace(-1, 1, 33, dtype=np.float32).reshape(3, 11)).hex()
                    + "\n"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_batch_matches_cpu():
    a = torch.randn(4096, 37, dtype=torch.float32)
    a[0, 0] = -0.0
    a[1, 1] = float("nan")
    for t in (a, a.to(torch.float16), a.to(torch.bfloat16), a > 0, (a * 100).to(torch.int32)):
        cpu = fingerprint_batch(t)
        assert (fingerprint_batch(t.cuda()) == cpu).all()
        assert fingerprint(t.cuda()[5]) == bytes(cpu[5])
    big = torch.randn(3, 100_000, device="cuda")
    assert (fingerprint_batch(big) == fingerprint_batch(big.cpu())).all()


def test_numpy_import_path_loads_no_heavy_framework():
    code = ("import sys, numpy as np; from transforms.fingerprint import fingerprint; "
            "fingerprint(np.zeros(3)); import transforms.keys; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'apache_beam') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("shape", [(0,), (1,), (63, 64, 3), (240, 320, 3), (1, 1200, 1000)])
def test_uint8_fast_path_is_the_fingerprint(shape):
    """Decoded images and stored bytes take ``fingerprint_uint8``: the same digest as the
    general path, over 1 MB rows (hashed there in slices) and views that are not
    contiguous too."""
    from transforms.fingerprint import fingerprint_uint8

    x = np.random.default_rng(len(shape)).integers(0, 256, shape, dtype=np.uint8)
    assert fingerprint_uint8(x, x.shape) == fingerprint(x)
    assert fingerprint_uint8(x.tobytes(), x.shape) == fingerprint(x)
    assert fingerprint_uint8(x, x.shape[::-1]) != fingerprint(x) or x.ndim == 1 or x.size == 0
    if x.ndim == 3 and x.size:
        view = x[:, ::-1]
        assert fingerprint_uint8(view, view.shape) == fingerprint(view)
