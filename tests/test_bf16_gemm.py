"""fp8lab.kernels.bf16_gemm (BF16 NT GEMM on the tensor cores, FP32 accumulation) and its cast `to_bf16`.

Kernel tests: fresh random inputs, odd shapes (M, N, K not multiples of the 128 x 128 (or 256) tile nor of the
64-value stage), outputs poisoned with NaN before the launch, NaN counted as failure.

Why bit-exact under the simulator: a product of two bfloat16 values is exact in float32 (8 + 8 significant bits),
and the wgmma twin adds a thread's products in k order, one float32 rounding per addition: what
`reference_in_order` computes. On a GPU the tensor core's adder order is its own: the FP32 bound against float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8lab
from fp8lab.bench import poisoned
from fp8lab.device import ptx, runtime
from fp8lab.device.runtime import cuda
from fp8lab.kernels import bf16_gemm as bg
from fp8lab.numerics import formats


def operands(rng, M, N, K):
    """float32 N(0, 1) operands and their bfloat16 bits."""
    a32 = rng.standard_normal((M, K), dtype=np.float32)
    b32 = rng.standard_normal((N, K), dtype=np.float32)
    return a32, b32, bg.reference_to_bf16(a32), bg.reference_to_bf16(b32)


def run(a, b, version, M, N):
    out = poisoned((M, N), np.float32)
    bg.bf16_gemm(runtime.to_device(a), runtime.to_device(b), out=out, version=version)
    got = out.copy_to_host()
    assert not np.isnan(got).any(), "NaN in the output: an element was not written"
    return got


def check(got, a, b):
    err = np.abs(got - bg.reference(a, b))
    assert (err <= bg.error_bound(a, b)).all(), f"max error {err.max():.3g} above the FP32 accumulation bound"
    if runtime.IS_SIM:  # the twins: k order, float32, bit for bit
        bad = np.argwhere(got.view(np.uint32) != bg.reference_in_order(a, b).view(np.uint32))
        assert not len(bad), f"{len(bad)} outputs differ from reference_in_order, first at {tuple(bad[0])}"


def sizes(*small, big):
    return [pytest.param(s, id=f"{s[0]}x{s[1]}x{s[2]}") for s in small] + [
        pytest.param(big, id="big", marks=pytest.mark.gpu)]


# (70, 140, 328): rows 16-byte aligned (cp.async), 6 stages (every stage slot refilled), 2 tiles of 128 columns;
# (133, 270, 75): the byte-by-byte load path, 2 x 3 tiles (2 x 2 of version 3's 256 columns), one partial stage
@pytest.mark.parametrize("version", list(bg.VERSIONS))
@pytest.mark.parametrize("mnk", sizes((70, 140, 328), (133, 270, 75), big=(2048, 2053, 2055)))
def test_every_version_against_the_references(rng, version, mnk):
    M, N, K = mnk
    _, _, a, b = operands(rng, M, N, K)
    check(run(a, b, version, M, N), a, b)


def test_float32_operands_are_rounded_on_the_way_in(rng):
    M, N, K = 37, 45, 70
    a32, b32, a, b = operands(rng, M, N, K)
    a32[0, :3] = [1 + 2.0**-8, 1 + 3 * 2.0**-9, -(1 + 2.0**-9)]  # ties to even (down, up) and a value below a tie
    a = bg.reference_to_bf16(a32)
    got = run(a32, b32, bg.BEST, M, N)
    assert np.array_equal(got.view(np.uint32), run(a, b, bg.BEST, M, N).view(np.uint32))
    check(got, a, b)


def test_numpy_in_numpy_out_device_in_device_out(rng):
    _, _, a, b = operands(rng, 20, 30, 40)
    host = fp8lab.bf16_gemm(a, b)  # the public name
    assert isinstance(host, np.ndarray) and host.dtype == np.float32 and host.shape == (20, 30)
    dev = bg.bf16_gemm(cuda.to_device(a), cuda.to_device(b))
    assert not isinstance(dev, np.ndarray)
    assert np.array_equal(dev.copy_to_host(), host)
    check(host, a, b)


def test_inf_and_nan_reach_the_outputs_that_use_them(rng):
    _, _, a, b = operands(rng, 9, 7, 33)
    a[2, 5] = 0x7FC0  # NaN
    a[4, 0] = 0x7F80  # +Inf
    got = bg.bf16_gemm(a, b)
    assert np.isnan(got[2]).all() and not np.isnan(np.delete(got, [2, 4], axis=0)).any()
    assert np.array_equal(np.isposinf(got[4]), bg.bf16_values(b[:, 0]) > 0)


@pytest.mark.parametrize("shape", [(37, 45), (64, 32), (1, 129)])
@pytest.mark.parametrize("transpose", [False, True])
def test_to_bf16_bit_for_bit(rng, shape, transpose):
    with np.errstate(over="ignore"):  # magnitudes up to past bfloat16's largest finite value (they round to Inf)
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(3e38) ** rng.random(shape, dtype=np.float32)
    x.flat[:6] = [np.nan, np.inf, -np.inf, -0.0, 3.4e38, np.float32(1.17e-39)][: x.size]
    x.flat[-1] = np.uint32(0x7F800001).view(np.float32)  # a NaN whose payload is in the low half only
    out = poisoned(shape[::-1] if transpose else shape, np.uint16)
    bg.to_bf16(cuda.to_device(x), out=out, transpose=transpose)
    got = out.copy_to_host()
    assert np.array_equal(got, bg.reference_to_bf16(x, transpose))
    vals = bg.bf16_values(got.T if transpose else got)
    assert np.isnan(vals.flat[-1]), "a NaN must stay NaN"
    finite = np.isfinite(x)
    assert np.array_equal(vals[finite], formats.round_bf16(x)[finite])
    assert np.array_equal(bg.to_bf16(x, transpose=transpose), got)  # NumPy in, NumPy out


def test_twin_wgmma_bf16_rejects_mixed_formats():
    with pytest.raises(ValueError, match="bf16 and bf16"):
        ptx.wgmma_intrinsic(128, "bf16", "e4m3")
    with pytest.raises(ValueError, match="wgmma_m64k16"):
        ptx.wgmma_m64k32(128, "bf16", "bf16")
    with pytest.raises(ValueError, match="multiple of 8"):
        ptx.wgmma_m64k16(100)


@pytest.mark.parametrize("call, exc, words", [
    (lambda a, b: bg.bf16_gemm(a.astype(np.float64), b), TypeError, ["a must have dtype float32 or uint16",
                                                                      "float64"]),
    (lambda a, b: bg.bf16_gemm(a, b[None]), ValueError, ["b must be 2-D", "(1, 9, 24)"]),
    (lambda a, b: bg.bf16_gemm(a, b[:, :20]), ValueError, ["a and b must share K", "(5, 24)", "(9, 20)"]),
    (lambda a, b: bg.bf16_gemm(a, b, version=4), ValueError, ["version", "4"]),
    (lambda a, b: bg.bf16_gemm(a, b, out=np.zeros((5, 9), np.float32)), TypeError, ["out must be a device array"]),
    (lambda a, b: bg.bf16_gemm(a, b, out=cuda.device_array((9, 5), np.float32)), ValueError, ["out", "(5, 9)"]),
    (lambda a, b: bg.bf16_gemm(cuda.to_device(np.zeros((24, 5), np.uint16)).T, b), ValueError,
     ["a: a device array must be C-contiguous", "(5, 24)"]),
    (lambda a, b: bg.bf16_gemm(a, cuda.to_device(b.T.copy()).T), ValueError, ["b: a device array must be C-contiguous"]),
    (lambda a, b: bg.to_bf16(cuda.to_device(a.T.copy()).T), ValueError, ["x: a device array must be C-contiguous"]),
    (lambda a, b: bg.to_bf16(a.view(np.uint16)), TypeError, ["x must have dtype float32"]),
    (lambda a, b: bg.to_bf16(a, transpose="yes"), TypeError, ["transpose"]),
    (lambda a, b: bg.to_bf16(a, out=cuda.device_array((5, 24), np.uint16), transpose=True), ValueError,
     ["out", "(24, 5)"]),
], ids=["dtype", "ndim", "K", "version", "host out", "out shape", "strided bits", "strided values",
        "strided cast input", "cast dtype", "transpose flag", "cast out shape"])
def test_bad_input_names_the_argument(rng, call, exc, words):
    a, b = rng.standard_normal((5, 24), dtype=np.float32), rng.standard_normal((9, 24), dtype=np.float32)
    with pytest.raises(exc) as e:
        call(a, b)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bf16_linear_on_the_tensor_cores_path(rng, monkeypatch):
    """The kernel engine's bf16 Linear through bf16_gemm (what an sm_90 GPU runs; switched on under the simulator):
    Fprop, Dgrad and Wgrad equal the k-order float32 sums of the operands rounded to bfloat16, bit for bit."""
    from fp8lab.training import engine_kernels

    monkeypatch.setattr(engine_kernels, "bf16_tensor_cores", lambda: True)
    M, N, K = 70, 45, 37
    lin = engine_kernels.DeviceLinear("bf16", M, N, K)
    assert lin.tensor_cores
    x, w, dy = (rng.standard_normal(s, dtype=np.float32) for s in ((M, K), (N, K), (M, N)))
    y, dx, dw = poisoned((M, N), np.float32), poisoned((M, K), np.float32), poisoned((N, K), np.float32)
    dev = [cuda.to_device(v) for v in (x, w, dy)]
    lin.forward(dev[0], dev[1], y)
    lin.backward(dev[2], dx, dw)
    bits = bg.reference_to_bf16
    for name, got, a, b in (("Fprop y = x W^T", y, bits(x), bits(w)), ("Dgrad dx = dy W", dx, bits(dy), bits(w, True)),
                            ("Wgrad dW = dy^T x", dw, bits(dy, True), bits(x, True))):
        want = bg.reference_in_order(a, b)
        assert np.array_equal(got.copy_to_host().view(np.uint32), want.view(np.uint32)), name


@pytest.mark.gpu
def test_gpu_bf16_recipe_runs_on_the_tensor_cores():
    from fp8lab.training import engine_kernels

    lin = engine_kernels.DeviceLinear("bf16", 256, 512, 384)
    # an sm_90 GPU runs the bf16 recipe's GEMMs through bf16_gemm; any other GPU keeps the SIMT GEMMs
    assert lin.tensor_cores == bg.VERSIONS[bg.BEST].runs_here()


@pytest.mark.gpu
@pytest.mark.parametrize("version", list(bg.VERSIONS))
def test_gpu_deepseek_shape_corner(rng, version):
    # 4096 x 7168 x 16384 (the FP8 GEMM's DeepSeek shape) would take minutes in float64 NumPy: its K and N, fewer rows
    M, N, K = 300, 7168, 16384
    _, _, a, b = operands(rng, M, N, K)
    check(run(a, b, version, M, N), a, b)


@pytest.mark.parametrize("shape", [(37, 45), (70, 33), pytest.param((4096, 2048), marks=pytest.mark.gpu, id="gpu")])
def test_to_bf16_both_layouts_from_one_read(rng, shape):
    """to_bf16_both: both layouts bit for bit the reference (NaN, Inf, -0, overflow, ties), outputs poisoned."""
    R, C = shape
    x = rng.standard_normal((R, C), dtype=np.float32) * np.float32(1e30)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    x[1, :2] = [1 + 2.0**-8, 1 + 3 * 2.0**-9]
    out, out_t = poisoned((R, C), np.uint16), poisoned((C, R), np.uint16)
    got = bg.to_bf16_both(cuda.to_device(x), out=out, out_t=out_t)
    assert got[0] is out and got[1] is out_t
    assert np.array_equal(out.copy_to_host(), bg.reference_to_bf16(x))
    assert np.array_equal(out_t.copy_to_host(), bg.reference_to_bf16(x, transpose=True))
    host = bg.to_bf16_both(x[:5, :7])
    assert all(isinstance(h, np.ndarray) for h in host)
    assert np.array_equal(host[1], bg.reference_to_bf16(x[:5, :7], transpose=True))
    with pytest.raises(ValueError, match=r"out_t must have shape \(7, 5\)"):
        bg.to_bf16_both(x[:5, :7], out_t=cuda.device_array((5, 7), np.uint16))
