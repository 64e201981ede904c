"""Routed experts' FP8 operands and GEMM: fl.quantize of an (E, N, K) weight with granularity "block" (each expert
its own 128 x 128 blocks, bit for bit the 2-D quantization of each expert), fl.dequantize of it, and
fl.fp8_grouped_gemm (qa's rows grouped by expert, 128-row groups, an empty one among them): each group's rows bit
for bit fl.fp8_gemm of that group, within the FP32 bound of the float64 reference, the output poisoned first;
bad input named. Realistic shapes are marked `gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.bench import assert_close, poisoned
from fp8lab.device.runtime import cuda
from fp8lab.kernels import fp8_gemm as fg
from fp8lab.numerics import spec


def _experts(rng, E, N, K):
    return rng.standard_normal((E, N, K), dtype=np.float32) * rng.uniform(0.1, 10, (E, 1, 1)).astype(np.float32)


def test_quantize_experts_is_each_expert_quantized_alone(rng):
    w = _experts(rng, 3, 130, 200)  # partial blocks along both N and K
    w[1, 5, 7] = np.nan  # poisons one block of expert 1 only
    with pytest.warns(RuntimeWarning, match="NaN/Inf in 1 of 12 block group"):
        q = fl.quantize(w, granularity="block")
    assert q.data.shape == (3, 130, 200) and q.scale.shape == (3, 2, 2) and q.nonfinite_groups == 1
    for e in range(3):
        codes, scale, _ = spec.quantize(w[e], "block")
        assert np.array_equal(q.data[e], codes) and np.array_equal(q.scale[e], scale, equal_nan=True)
    d = fl.dequantize(q)
    for e in range(3):
        want = fl.dequantize(fl.QuantizedTensor(q.data[e], q.scale[e], "e4m3", "block"))
        assert np.array_equal(d[e], want, equal_nan=True)
    qd = fl.quantize(cuda.to_device(w[[0, 2]]), granularity="block")  # device in, device out
    assert np.array_equal(qd.data.copy_to_host(), q.data[[0, 2]])


def _grouped(rng, E, N, K, sizes):
    off = np.concatenate([[0], np.cumsum(sizes)])
    x = rng.standard_normal((int(off[-1]), K), dtype=np.float32)
    return fl.quantize(x, granularity="tile"), fl.quantize(_experts(rng, E, N, K), granularity="block"), off


@pytest.mark.parametrize("E, N, K, sizes", [(3, 40, 160, (128, 0, 256)),
                                            pytest.param(8, 512, 1040, (256, 128, 0, 384, 128, 640, 128, 256),
                                                         marks=pytest.mark.gpu)])
def test_each_group_is_fp8_gemm_of_that_group(rng, E, N, K, sizes):
    qa, qb, off = _grouped(rng, E, N, K, sizes)
    out = poisoned((int(off[-1]), N), np.float32)
    assert fl.fp8_grouped_gemm(qa, qb, off, out=out) is out
    y = out.copy_to_host()
    for e in range(E):
        r0, r1 = off[e], off[e + 1]
        if r1 > r0:
            one = fl.fp8_gemm(fl.QuantizedTensor(qa.data[r0:r1], qa.scale[r0:r1], "e4m3", "tile"),
                              fl.QuantizedTensor(qb.data[e], qb.scale[e], "e4m3", "block"))
            assert np.array_equal(y[r0:r1].view(np.uint32), one.view(np.uint32)), f"group {e}"
    ref = fg.reference_grouped(qa, qb, off)
    bound = np.concatenate([fg.tensor_core_bound(fl.QuantizedTensor(qa.data[r0:r1], qa.scale[r0:r1], "e4m3", "tile"),
                                                 fl.QuantizedTensor(qb.data[e], qb.scale[e], "e4m3", "block"))
                            for e, (r0, r1) in enumerate(zip(off[:-1], off[1:])) if r1 > r0])
    assert_close("grouped", y, ref, atol=bound, rtol=0)  # NaN fails: every row was written
    assert isinstance(fl.fp8_grouped_gemm(qa, qb, off.tolist()), np.ndarray)  # NumPy operands: NumPy out


def _bad(rng):
    qa, qb, off = _grouped(rng, 2, 16, 40, (128, 128))
    return qa, qb, off


BAD = [
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, qb, off[:-1]), ValueError, r"^offsets must be 3 integers"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, qb, [0, 100, 256]), ValueError, r"^offsets must start at 0, end at "
     r"M = 256, never decrease, and be multiples of 128"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, qb, [0, 256, 128]), ValueError, r"^offsets must start at 0"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, fl.QuantizedTensor(qb.data[0], qb.scale[0], "e4m3", "block"), off),
     ValueError, r"^qb.data must be 3-D"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qb, qb, off), ValueError, r"^qa must have granularity 'tile'"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, fl.QuantizedTensor(qb.data[:, :, :20], qb.scale, "e4m3", "block"),
                                             off), ValueError, r"^qa and qb must share K"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, qb, off, version=7), ValueError,
     r"^version must not be a persistent one"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, qb, off, out=np.zeros((256, 16), np.float32)), TypeError,
     r"^out must be a device array"),
    (lambda qa, qb, off: fl.fp8_grouped_gemm(qa, qb, np.array([0.0, 128, 256])), ValueError,
     r"^offsets must be 3 integers"),
]


@pytest.mark.parametrize("call, error, match", BAD)
def test_bad_input_is_refused_by_name(rng, call, error, match):
    with pytest.raises(error, match=match):
        call(*_bad(rng))


@pytest.mark.parametrize("E, N, K, sizes", [(3, 40, 72, (128, 0, 256)),
                                            pytest.param(8, 512, 1040, (256, 128, 0, 384, 128, 640, 128, 256),
                                                         marks=pytest.mark.gpu)])
def test_grouped_wgrad_is_each_experts_sum_over_its_tokens(rng, E, N, K, sizes):
    """dW[e] = dy_e^T x_e from dy^T and x^T in 1 x 128 tiles along the tokens: bit for bit fl.fp8_gemm of expert e's
    columns, 0 for the expert without tokens, within the FP32 bound of the float64 reference; out poisoned."""
    off = np.concatenate([[0], np.cumsum(sizes)])
    M = int(off[-1])
    dy = rng.standard_normal((M, N), dtype=np.float32)
    x = rng.standard_normal((M, K), dtype=np.float32)
    qdyt = fl.quantize(np.ascontiguousarray(dy.T), granularity="tile")
    qxt = fl.quantize(np.ascontiguousarray(x.T), granularity="tile")
    out = poisoned((E, N, K), np.float32)
    assert fl.fp8_grouped_wgrad(qdyt, qxt, off, out=out) is out
    dw = out.copy_to_host()
    ref = fg.reference_grouped_wgrad(qdyt, qxt, off)
    for e in range(E):
        r0, r1 = off[e], off[e + 1]
        if r1 == r0:
            assert (dw[e] == 0).all()
            continue
        g = slice(r0 // 128, r1 // 128)
        qa = fl.QuantizedTensor(np.ascontiguousarray(qdyt.data[:, r0:r1]), qdyt.scale[:, g].copy(), "e4m3", "tile")
        qb = fl.QuantizedTensor(np.ascontiguousarray(qxt.data[:, r0:r1]), qxt.scale[:, g].copy(), "e4m3", "tile")
        assert np.array_equal(dw[e].view(np.uint32), fl.fp8_gemm(qa, qb).view(np.uint32)), f"expert {e}"
        assert_close(f"expert {e}", dw[e], ref[e], atol=fg.tensor_core_bound(qa, qb), rtol=0)
    with pytest.raises(ValueError, match=r"^qdyt and qxt must cover the same tokens"):
        fl.fp8_grouped_wgrad(qdyt, fl.quantize(np.ascontiguousarray(x[:128].T), granularity="tile"), off)
    with pytest.raises(ValueError, match=r"^offsets must start at 0"):
        fl.fp8_grouped_wgrad(qdyt, qxt, off[::-1])
