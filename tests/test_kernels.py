"""Every kernel version against its NumPy reference: fresh random inputs, shapes that are not tile or block
multiples, outputs poisoned with NaN (or 0xA5 codes) before the launch, NaN counted as failure.

Each test runs twice: small shapes everywhere (CI runs them on the simulator) and realistic shapes marked
`gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab import formats, spec
from fp8lab.bench import assert_close, assert_codes_equal, poisoned
from fp8lab.kernels import elementwise, gemm_nt, loss, optim, quantize, rmsnorm
from fp8lab.runtime import cuda


def sizes(small, big):
    return [pytest.param(small, id="small"), pytest.param(big, id="big", marks=pytest.mark.gpu)]


def heavy_tailed(rng, shape):
    """Gaussian with a few large outliers, like LLM activations; never zeros."""
    x = rng.standard_normal(shape, dtype=np.float32)
    mask = rng.random(shape) < 0.01
    x[mask] *= 50
    return x


@pytest.mark.parametrize("version", sorted(quantize.VERSIONS))
@pytest.mark.parametrize("shape", sizes((37, 53), (4099, 8191)))
def test_quantize_tensor_bit_exact(rng, version, shape):
    x = heavy_tailed(rng, shape)
    ref_codes, ref_scale, ref_amax = quantize.reference(x)
    q = quantize.TensorQuantizer(shape, transpose=True, version=version)
    q.codes.copy_to_device(np.full(shape, 0xA5, np.uint8))
    q.codes_t.copy_to_device(np.full(shape[::-1], 0xA5, np.uint8))
    q(cuda.to_device(x))
    assert q.amax.copy_to_host()[0] == ref_amax
    assert q.scale.copy_to_host()[0] == ref_scale
    assert_codes_equal("codes", q.codes.copy_to_host(), ref_codes)
    assert_codes_equal("codes_t", q.codes_t.copy_to_host(), ref_codes.T)
    # the largest |x| encodes to exactly +-448
    assert np.abs(formats.decode(ref_codes)).max() == 448


def test_quantize_all_zero_tensor_gives_zero_codes_and_finite_scale():
    q = quantize.TensorQuantizer((5, 7))
    q(cuda.to_device(np.zeros((5, 7), np.float32)))
    assert (q.codes.copy_to_host() == 0).all()
    scale = q.scale.copy_to_host()[0]
    assert np.isfinite(scale) and scale > 0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_nonfinite_input_poisons_the_tensor(rng, bad, transpose):
    """NaN or +-Inf: scale NaN and every code 0x7F (an Inf amax would otherwise zero every finite element)."""
    x = rng.standard_normal((6, 9), dtype=np.float32)
    x[2, 3] = bad
    q = quantize.TensorQuantizer(x.shape, transpose=transpose)
    q.codes.copy_to_device(np.full(x.shape, 0xA5, np.uint8))
    q(cuda.to_device(x))
    amax = q.amax.copy_to_host()[0]
    assert (np.isnan(amax) if np.isnan(bad) else amax == np.inf) and np.isnan(q.scale.copy_to_host()[0])
    assert (q.codes.copy_to_host() == spec.POISON_CODE).all()
    if transpose:
        assert (q.codes_t.copy_to_host() == spec.POISON_CODE).all()
    ref_codes, ref_scale, _ = quantize.reference(x)
    assert_codes_equal("codes", q.codes.copy_to_host(), ref_codes)
    assert np.isnan(ref_scale)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("n", sizes(301, 1 << 24))
def test_dequantize(rng, fmt, n):
    codes = rng.integers(0, 256, n, dtype=np.uint8)
    scale = np.array([rng.uniform(0.01, 3)], np.float32)
    out = poisoned(n, np.float32)
    quantize.dequantize(cuda.to_device(codes), cuda.to_device(scale), out, fmt)
    ref = formats.decode(codes, formats.get_format(fmt)) * scale[0]
    got = out.copy_to_host()
    nan = np.isnan(ref)
    assert (np.isnan(got) == nan).all()
    assert (got[~nan] == ref[~nan]).all()


@pytest.mark.parametrize("version", sorted(gemm_nt.VERSIONS))
@pytest.mark.parametrize("kind", ["float32", "e4m3"])
@pytest.mark.parametrize("mnk", sizes((13, 19, 37), (2051, 2053, 2055)))
def test_gemm_nt(rng, kind, version, mnk):
    M, N, K = mnk
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((N, K), dtype=np.float32)
    if kind == "e4m3":
        a, sa, _ = quantize.reference(a)
        b, sb, _ = quantize.reference(b)
    else:
        sa = sb = np.float32(1)
    ref = gemm_nt.reference(a, b, sa, sb, fp8=kind == "e4m3")
    out = poisoned((M, N), np.float32)
    gemm_nt.launch(cuda.to_device(a), cuda.to_device(np.array([sa], np.float32)), cuda.to_device(b),
                   cuda.to_device(np.array([sb], np.float32)), out, version)
    # FP32 accumulation of K products in k order (fused or not): |error| <= K * 2^-23 * sum_k |a_k b_k|.
    absprod = (np.abs(formats.decode(a) if kind == "e4m3" else a).astype(np.float64)
               @ np.abs(formats.decode(b) if kind == "e4m3" else b).astype(np.float64).T) * float(sa) * float(sb)
    bound = K * 2.0**-23 * absprod + 1e-30
    got = out.copy_to_host()
    assert not np.isnan(got).any(), "NaN in output (unwritten element?)"
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"max error {err.max():.3g} above bound at {np.unravel_index(np.argmax(err - bound), err.shape)}"


@pytest.mark.parametrize("version", sorted(rmsnorm.VERSIONS))
@pytest.mark.parametrize("shape", sizes((9, 45), (4097, 7000)))
def test_rmsnorm_forward_backward(rng, version, shape):
    M, N = shape
    y = (rng.standard_normal(shape, dtype=np.float32) * 3).astype(np.float32)
    g = rng.uniform(0.5, 1.5, N).astype(np.float32)
    dz = rng.standard_normal(shape, dtype=np.float32)
    ref_z, ref_r = rmsnorm.reference_forward(y, g)
    ref_dy, ref_dg = rmsnorm.reference_backward(dz, y, g)
    z, r = poisoned(shape, np.float32), poisoned(M, np.float32)
    dy, gy, dg = poisoned(shape, np.float32), poisoned(shape, np.float32), poisoned(N, np.float32)
    dy_, dg_ = cuda.to_device(y), cuda.to_device(g)
    rmsnorm.forward(dy_, dg_, z, r, version)
    rmsnorm.backward(cuda.to_device(dz), dy_, dg_, r, dy, gy, version)
    elementwise.colsum(gy, dg)
    assert_close("rstd", r.copy_to_host(), ref_r, atol=0, rtol=1e-5)
    assert_close("z", z.copy_to_host(), ref_z, atol=1e-6, rtol=1e-5)
    assert_close("dy", dy.copy_to_host(), ref_dy, atol=1e-5, rtol=1e-4)
    assert_close("dg", dg.copy_to_host(), ref_dg, atol=1e-5 * np.sqrt(M), rtol=1e-4)


@pytest.mark.parametrize("shape", sizes((11, 29), (4096, 4099)))
def test_mse_loss_and_grad(rng, shape):
    z = rng.standard_normal(shape, dtype=np.float32)
    t = rng.standard_normal(shape, dtype=np.float32)
    ref_loss, ref_dz = loss.reference(z, t)
    L = loss.MSELoss(shape)
    L.dz.copy_to_device(np.full(shape, np.nan, np.float32))
    L.loss.copy_to_device(np.full(1, np.nan, np.float32))
    L(cuda.to_device(z), cuda.to_device(t))
    assert_close("loss", L.loss.copy_to_host(), [ref_loss], atol=0, rtol=1e-5)
    assert_close("dz", L.dz.copy_to_host(), ref_dz, atol=0, rtol=1e-6)
    # deterministic: the same inputs give the same bits
    first = L.loss.copy_to_host()[0]
    L(cuda.to_device(z), cuda.to_device(t))
    assert L.loss.copy_to_host()[0] == first


@pytest.mark.parametrize("shape", sizes((13, 70), (4099, 8191)))
def test_bias_add_and_colsum(rng, shape):
    y = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    dy = cuda.to_device(y)
    elementwise.bias_add(dy, cuda.to_device(b))
    assert_close("bias_add", dy.copy_to_host(), y + b, atol=0, rtol=0)
    s = poisoned(shape[1], np.float32)
    elementwise.colsum(cuda.to_device(y), s)
    assert_close("colsum", s.copy_to_host(), y.astype(np.float64).sum(0), atol=1e-5 * shape[0], rtol=1e-5)


@pytest.mark.parametrize("version", sorted(elementwise.VERSIONS))
@pytest.mark.parametrize("shape", sizes((37, 45), (4099, 8191)))
def test_transpose(rng, version, shape):
    a = rng.standard_normal(shape, dtype=np.float32)
    out = poisoned(shape[::-1], np.float32)
    elementwise.transpose(cuda.to_device(a), out, version)
    assert_close("transpose", out.copy_to_host(), a.T, atol=0, rtol=0)


@pytest.mark.parametrize("n", sizes(517, 1 << 22))
def test_adam_and_sgd(rng, n):
    p = rng.standard_normal(n, dtype=np.float32)
    opt = optim.Adam(n, lr=1e-2)
    dp = cuda.to_device(p)
    ref_p, m, v = p.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for t in range(1, 4):
        g = rng.standard_normal(n, dtype=np.float32)
        opt.step(dp, cuda.to_device(g))
        optim.reference_adam(ref_p, g, m, v, t, lr=1e-2)
    assert_close("adam", dp.copy_to_host(), ref_p, atol=1e-6, rtol=1e-5)
    assert_close("adam m", opt.m.copy_to_host(), m, atol=1e-7, rtol=1e-5)
    g = rng.standard_normal(n, dtype=np.float32)
    sgd = optim.SGD(n, lr=0.1)
    dp = cuda.to_device(p)
    sgd.step(dp, cuda.to_device(g))
    assert_close("sgd", dp.copy_to_host(), p - np.float32(0.1) * g, atol=1e-7, rtol=1e-6)
