"""The public quantize / dequantize / fp8_gemm API: results, and errors that name the argument."""

from __future__ import annotations

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.numerics import formats, spec
from fp8lab.device.runtime import cuda


def test_quantize_numpy_in_numpy_out(rng):
    x = rng.standard_normal((7, 33)).astype(np.float32)
    q = fl.quantize(x)
    codes, scale, _ = spec.quantize_tensor(x)
    assert isinstance(q.data, np.ndarray) and q.data.dtype == np.uint8 and q.data.shape == x.shape
    assert (q.data == codes).all() and q.scale[0] == scale
    assert q.fmt == "e4m3" and q.granularity == "tensor"
    y = fl.dequantize(q)
    assert y.dtype == np.float32 and y.shape == x.shape
    # per element, E4M3 keeps 3 mantissa bits: relative error at most 2^-4 above the subnormal range
    big = np.abs(x) > 2**-6 * scale
    assert (np.abs(y - x)[big] <= np.abs(x)[big] * 2**-4 + 1e-7).all()


def test_quantize_device_in_device_out_and_e5m2(rng):
    x = rng.standard_normal(100).astype(np.float32) * 1000
    q = fl.quantize(cuda.to_device(x), fmt="e5m2")
    assert hasattr(q.data, "copy_to_host") and hasattr(q.scale, "copy_to_host")
    ref, scale, _ = spec.quantize_tensor(x, "e5m2")
    assert q.fmt == "e5m2" and q.granularity == "tensor"
    assert np.array_equal(q.data.copy_to_host(), ref)  # bit for bit
    assert q.scale.copy_to_host().tolist() == [scale]
    y = fl.dequantize(q)
    assert hasattr(y, "copy_to_host")
    y = y.copy_to_host()
    # decode(code) * scale, exactly (one float32 product), on the E5M2 grid: not E4M3's
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.array_equal(y, formats.decode(ref, "e5m2") * scale)
    assert np.array_equal(y, spec.dequantize(ref.reshape(1, -1), np.array([[scale]]), 1, x.size, "e5m2")[0])
    assert not np.array_equal(y, formats.decode(ref, "e4m3") * scale)
    # the largest |x| lands on +-57344 * scale; 2 mantissa bits: relative error at most 2^-3 above subnormals
    assert np.abs(y).max() == np.float32(57344) * scale
    big = np.abs(x) > 2**-14 * scale
    assert (np.abs(y - x)[big] <= np.abs(x)[big] * 2**-3 + 1e-7).all()


def test_quantize_converts_float64_numpy(rng):
    x = rng.standard_normal(50)
    assert (fl.quantize(x).data == spec.quantize_tensor(x.astype(np.float32))[0]).all()


@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        (("abc",), {}, TypeError, "x must have dtype float16 or float32 or float64, got .* str"),
        ((object(),), {}, TypeError, "x must be a NumPy or CUDA device array, got object"),
        ((np.arange(5),), {}, TypeError, "x must have dtype"),
        ((np.zeros(0, np.float32),), {}, ValueError, "x must not be empty"),
        ((np.ones(4, np.float32),), dict(fmt="e3m4"), ValueError, "fmt"),
        ((np.ones(4, np.float32),), dict(fmt="e8m0"), ValueError, "fmt must be one of"),
        ((np.ones(4, np.float32),), dict(granularity="tiles"), ValueError, "granularity must be one of"),
        ((np.ones(4, np.float32),), dict(granularity="tile"), ValueError, "needs x of shape"),
        ((np.ones((2, 4), np.float32),), dict(granularity="tile", block=0), ValueError,
         "block must be a positive int"),
    ],
)
def test_quantize_bad_inputs(args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.quantize(*args, **kwargs)


def test_dequantize_bad_input():
    with pytest.raises(TypeError, match="q must be a QuantizedTensor"):
        fl.dequantize(np.zeros(3, np.uint8))


def test_fp8_gemm(rng):
    a = rng.standard_normal((9, 45)).astype(np.float32)
    b = rng.standard_normal((11, 45)).astype(np.float32)
    qa, qb = fl.quantize(a), fl.quantize(b)
    y = fl.fp8_gemm(qa, qb)
    ref = (fl.dequantize(qa).astype(np.float64) @ fl.dequantize(qb).astype(np.float64).T)
    assert y.shape == (9, 11) and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    # FP8 inputs: the product is close to the exact one, within FP8 rounding
    rel = np.linalg.norm(y - a @ b.T) / np.linalg.norm(a @ b.T)
    assert rel < 0.06
    out = cuda.device_array((9, 11), np.float32)
    assert fl.fp8_gemm(qa, qb, out=out) is out


def test_fp8_gemm_bad_inputs(rng):
    qa = fl.quantize(rng.standard_normal((4, 8)).astype(np.float32))
    qb = fl.quantize(rng.standard_normal((5, 9)).astype(np.float32))
    with pytest.raises(ValueError, match="qa and qb must share K"):
        fl.fp8_gemm(qa, qb)
    with pytest.raises(TypeError, match="qb must be a QuantizedTensor"):
        fl.fp8_gemm(qa, np.zeros((5, 8)))
    with pytest.raises(ValueError, match="accum_bits"):
        fl.fp8_gemm(qa, fl.quantize(rng.standard_normal((5, 8)).astype(np.float32)), accum_bits=40)
    with pytest.raises(ValueError, match=r"version must be None or an int in \(1, 2, 3, 4, 5, 6, 7\), got 8"):
        fl.fp8_gemm(qa, fl.quantize(rng.standard_normal((5, 8)).astype(np.float32)), version=8)


def test_public_api_matches_its_preallocated_kernels(rng):
    """`fp8lab bench overhead`'s checks: fl.quantize / fl.dequantize / fl.fp8_gemm on device arrays equal the
    kernels writing into preallocated (poisoned) outputs."""
    from fp8lab.bench import overhead

    assert overhead.checks(rng)


@pytest.mark.gpu
def test_public_api_matches_its_preallocated_kernels_gpu(rng):
    from fp8lab.bench import overhead

    assert overhead.checks(rng)


def test_moved_modules_still_import_with_a_warning(tmp_path):
    """A learner's older worksheet copy imports the modules by their names before the package was grouped
    (ARCHITECTURE.md): each still works, with a FutureWarning that names the new import."""
    import subprocess
    import sys

    code = ("import warnings, sys\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    from fp8lab import formats\n"
            "    import fp8lab.runtime as rt\n"
            "    from fp8lab.check import ws2\n"
            "import fp8lab.numerics.formats, fp8lab.device.runtime, fp8lab.course.check.ws2\n"
            "assert formats is fp8lab.numerics.formats and rt is fp8lab.device.runtime, (formats, rt)\n"
            "assert ws2 is fp8lab.course.check.ws2\n"
            "msgs = [str(x.message) for x in w if x.category is FutureWarning]\n"
            "assert any('fp8lab.formats moved to fp8lab.numerics.formats' in m for m in msgs), msgs\n"
            "assert any('from fp8lab.device import runtime' in m for m in msgs), msgs\n"
            "assert any('fp8lab.check moved to fp8lab.course.check' in m for m in msgs), msgs\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fl.nope
