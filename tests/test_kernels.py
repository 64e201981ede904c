"""Every kernel version against its NumPy reference: fresh random inputs, shapes that are not tile or block
multiples, outputs poisoned with NaN (or 0xA5 codes) before the launch, NaN counted as failure.

Each test runs twice: small shapes everywhere (CI runs them on the simulator) and realistic shapes marked
`gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.numerics import formats, spec
from fp8lab.bench import assert_close, assert_codes_equal, poisoned
from fp8lab.kernels import elementwise, gemm_nt, loss, optim, quantize, rmsnorm
from fp8lab.device.runtime import cuda


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
    for warps in (None, 3):  # 3: rows shared unevenly by the warps of a block (the simulator's default is one)
        s = poisoned(shape[1], np.float32)
        elementwise.colsum(cuda.to_device(y), s, warps)
        assert_close(f"colsum (warps={warps})", s.copy_to_host(), y.astype(np.float64).sum(0),
                     atol=1e-5 * shape[0], rtol=1e-5)
    for bad in (0, elementwise.COLSUM_WARPS + 1, 2.0):  # more warps than its shared partial sums hold: refused
        with pytest.raises(ValueError, match=r"^warps must be None or an int in 1\.\.32"):
            elementwise.colsum(cuda.to_device(y), s, bad)


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


# ---------------------------------------------------------------------------------------------------------------
# bfloat16: elementwise.round_bf16 (the bf16 recipe's GEMM inputs) and kernels.common's bfloat16 device functions
# ---------------------------------------------------------------------------------------------------------------

from fp8lab.kernels import common  # noqa: E402  (this section's own import, kept with it)


def bits_of(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("shape", sizes((37, 45), (4099, 8191)))
def test_round_bf16_bit_exact(rng, shape):
    """Ties above odd and even kept bits, carries into the next binade, overflow to Inf, subnormals, +-0.0,
    +-Inf, NaN payloads, random bit patterns: bit for bit formats.round_bf16."""
    x = elementwise.bf16_check_values(rng, shape[0] * shape[1]).reshape(shape)
    out = poisoned(shape, np.float32)
    assert elementwise.round_bf16(cuda.to_device(x), out) is out
    assert_codes_equal("round_bf16", bits_of(out.copy_to_host()), bits_of(elementwise.reference_round_bf16(x)))


def test_round_bf16_spelled_out(rng):
    """Values whose bfloat16 rounding is written out by hand (not computed by formats.round_bf16)."""
    cases = {  # float32 bits -> bfloat16 result as float32 bits
        0x3F808000: 0x3F800000,  # 1 + 2^-8: a tie, kept bits even -> down to 1.0
        0x3F818000: 0x3F820000,  # 1 + 3 * 2^-8: a tie, kept bits odd -> up to 1 + 2^-6
        0x3F808001: 0x3F810000,  # just above the tie -> up
        0x3FFF8000: 0x40000000,  # 1.99609375 (a tie, odd) -> 2.0, a carry into the exponent
        0x7F7F7FFF: 0x7F7F0000,  # below the midpoint under bfloat16's largest value -> its largest value
        0x7F7F8000: 0x7F800000,  # a tie past bfloat16's largest value -> Inf
        0x7F7FFFFF: 0x7F800000,  # float32's largest -> Inf
        0x00008000: 0x00000000,  # a subnormal tie, even -> +0.0
        0x00018000: 0x00020000,  # a subnormal tie, odd -> up
        0x80000000: 0x80000000,  # -0.0 stays -0.0
        0xFF800000: 0xFF800000,  # -Inf
        0x7F800001: 0x7F800001,  # a NaN stays itself (its payload in the low half would round to Inf)
    }
    x = np.array(list(cases), np.uint32).view(np.float32)
    x2 = np.tile(x, 3)  # several blocks' worth
    got = elementwise.round_bf16(x2)  # NumPy in, NumPy out
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert bits_of(got).tolist() == list(cases.values()) * 3
    # in place on the device
    d = cuda.to_device(x)
    elementwise.round_bf16(d, d)
    assert bits_of(d.copy_to_host()).tolist() == list(cases.values())


@cuda.jit
def bf16_helpers_kernel(x, rounded_bits, stored, loaded):
    i = cuda.grid(1)
    while i < x.size:
        rounded_bits[i] = common.round_bf16_bits(x[i])
        stored[i] = common.bf16_store_bits(x[i])
        loaded[i] = common.bf16_load(stored[i])
        i += cuda.gridsize(1)


def test_bf16_device_helpers(rng):
    """round_bf16_bits is formats.round_bf16's bits; bf16_store_bits is its top half, and bf16_load of that gives
    the rounded value back; a NaN is stored as a quiet NaN of the same sign, even when its payload was in the
    low half only (0x7F800001 would otherwise become Inf)."""
    x = elementwise.bf16_check_values(rng, 1500)
    n = x.size
    rb = cuda.to_device(np.full(n, 0xDEADBEEF, np.uint32))
    st = cuda.to_device(np.full(n, 0xA5A5, np.uint16))  # 0xA5A5 is also a bfloat16 some inputs round to:
    ld = poisoned(n, np.float32)                          # the other two outputs catch an unwritten element
    bf16_helpers_kernel[4, 32](cuda.to_device(x), rb, st, ld)
    rb, st, ld = rb.copy_to_host(), st.copy_to_host(), ld.copy_to_host()
    ref = bits_of(formats.round_bf16(x))
    assert_codes_equal("round_bf16_bits", rb, ref)
    nan = np.isnan(x)
    assert nan.sum() >= 8 and (x.view(np.uint32) == 0x7F800001).any()
    assert_codes_equal("bf16_store_bits", st[~nan], (ref[~nan] >> 16).astype(np.uint16))
    assert_codes_equal("bf16_load(bf16_store_bits(x))", bits_of(ld[~nan]), ref[~nan])
    assert np.isnan(ld[nan]).all() and (np.signbit(ld[nan]) == np.signbit(x[nan])).all()
    assert ((st[nan] & 0x7FC0) == 0x7FC0).all()  # exponent all ones and the quiet bit


def test_round_bf16_bad_input():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError, match=r"x must have dtype float32.*float64"):
        elementwise.round_bf16(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"out must have shape \(3, 4\).*\(4, 3\)"):
        elementwise.round_bf16(x, cuda.device_array((4, 3), np.float32))
    with pytest.raises(TypeError, match=r"out must be a C-contiguous CUDA device array.*ndarray"):
        elementwise.round_bf16(x, np.empty((3, 4), np.float32))
    with pytest.raises(TypeError, match=r"out must have dtype float32.*uint16"):
        elementwise.round_bf16(x, cuda.device_array((3, 4), np.uint16))
    with pytest.raises(ValueError, match=r"x must be C-contiguous"):
        elementwise.round_bf16(cuda.to_device(np.ones((4, 6), np.float32))[:, ::2])
