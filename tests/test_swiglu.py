"""SwiGLU (fp8lab/kernels/swiglu.py): the 1x128 tile E4M3 quantization of h = silu(a) * b (versions 1 and 2, codes
and scales bit for bit against spec.quantize of the reference h), the float32 forward, the backward and its fusion
with the dual tile quantization of du, gates large enough to overflow a float32 exp, NaN/Inf poisoning, and bad
input.

Fresh random inputs (the `rng` fixture), F not a multiple of 128 (partial last tiles) and odd M, outputs poisoned
before the launch. Small shapes run everywhere (the simulator); realistic ones are marked `gpu`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fp8lab.numerics import formats, spec
from fp8lab.bench import assert_close, assert_codes_equal, poisoned
from fp8lab.kernels import swiglu
from fp8lab.device.runtime import cuda

SMALL = [(5, 200), (3, 129), (4, 300), (1, 100)]
BIG = [(16384, 2816), (4099, 2821)]
E4M3_MAX = float(spec.FP8_MAX["e4m3"])


def shapes():
    return ([pytest.param(s, id=f"{s[0]}x{s[1]}") for s in SMALL]
            + [pytest.param(s, id=f"big-{s[0]}x{s[1]}", marks=pytest.mark.gpu) for s in BIG])


@pytest.fixture
def float_warnings_fail():
    """NumPy's floating-point RuntimeWarnings (overflow in exp, Inf * 0) fail the test."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", r"(invalid value|overflow|divide by zero) encountered", RuntimeWarning)
        yield


def run_quantize(u, version, with_h):
    """forward_quantize on poisoned device outputs; host (codes, scale, h or None)."""
    M, F = u.shape[0], u.shape[1] // 2
    codes = poisoned((M, F), np.uint8)
    scale = poisoned(spec.scale_shape("tile", (M, F)), np.float32)
    h = poisoned((M, F), np.float32) if with_h else None
    q = swiglu.forward_quantize(cuda.to_device(u), codes, scale, h, version=version)
    assert q.data is codes and q.scale is scale and (q.fmt, q.granularity, q.block) == ("e4m3", "tile", 128)
    return codes.copy_to_host(), scale.copy_to_host(), None if h is None else h.copy_to_host()


def assert_matches_reference(u, got):
    codes, scale, h = got
    ref_codes, ref_scale = swiglu.reference(u)
    assert_codes_equal("codes", codes, ref_codes)
    assert scale.shape == ref_scale.shape and np.array_equal(scale, ref_scale, equal_nan=True), "scales differ"
    if h is not None:
        # h is float64 silu(a) * b rounded once: within half an ulp of the exact value (swiglu.H_RTOL says more)
        assert_close("h", h, swiglu.reference_h64(u), atol=swiglu.H_ATOL, rtol=swiglu.H_RTOL)


# ---------------------------------------------------------------------------------------- the versioned op


@pytest.mark.parametrize("with_h", [False, True], ids=["codes", "codes+h"])
@pytest.mark.parametrize("version", sorted(swiglu.VERSIONS))
@pytest.mark.parametrize("shape", shapes())
def test_forward_quantize_bit_exact(rng, shape, version, with_h):
    M, F = shape
    u, _ = swiglu.make_inputs(rng, M, F)
    got = run_quantize(u, version, with_h)
    assert_matches_reference(u, got)
    codes, scale, _ = got
    assert scale.shape == (M, -(-F // 128))
    # every tile, the partial last one too, has its largest |h| at exactly +-448, unless its amax is under the
    # floor (spec.AMAX_FLOOR: a one-element tile whose gate is very negative has h ~ 1e-40)
    amax = spec.group_amax(swiglu.reference_forward(u), 1, 128)
    top = spec.group_amax(formats.decode(codes, formats.E4M3), 1, 128)
    assert (top[amax >= spec.AMAX_FLOOR] == E4M3_MAX).all()


def test_reference_h_is_the_correctly_rounded_silu_times_b(rng):
    """reference_forward (the kernels' float64 operations) against the textbook a * b / (1 + exp(-a)) written with
    log-sum-exp: within half a float32 ulp, i.e. the float32 nearest the exact value."""
    u, _ = swiglu.make_inputs(rng, 64, 300)
    h = swiglu.reference_forward(u)
    assert h.dtype == np.float32 and h.shape == (64, 300)
    assert_close("reference_forward", h, swiglu.reference_h64(u), atol=swiglu.H_ATOL, rtol=swiglu.H_RTOL)


# ---------------------------------------------------------------------------------------- the plain ops


@pytest.mark.parametrize("shape", shapes())
def test_forward(rng, shape):
    u, _ = swiglu.make_inputs(rng, *shape)
    h = poisoned(shape, np.float32)
    assert swiglu.forward(cuda.to_device(u), h) is h
    assert_close("h", h.copy_to_host(), swiglu.reference_h64(u), atol=swiglu.H_ATOL, rtol=swiglu.H_RTOL)


@pytest.mark.parametrize("shape", shapes())
def test_backward(rng, shape):
    M, F = shape
    u, dh = swiglu.make_inputs(rng, M, F)
    du = poisoned((M, 2 * F), np.float32)
    assert swiglu.backward(cuda.to_device(u), cuda.to_device(dh), du) is du
    atol, rtol = swiglu.backward_tolerance(u, dh)  # one float32 rounding of a float64 value; its docstring says more
    assert_close("du", du.copy_to_host(), swiglu.reference_backward(u, dh), atol=atol, rtol=rtol)


def run_backward_dual(u, dh, fmt="e4m3", mode="amax"):
    """launch_backward_quantize_dual on poisoned device outputs; host (codes, scale, codes_t, scale_t)."""
    M, N = u.shape
    outs = (poisoned((M, N), np.uint8), poisoned(spec.scale_shape("tile", (M, N)), np.float32),
            poisoned((N, M), np.uint8), poisoned(spec.scale_shape("tile", (N, M)), np.float32))
    swiglu.launch_backward_quantize_dual(cuda.to_device(u), cuda.to_device(dh), *outs, fmt, mode)
    return [o.copy_to_host() for o in outs]


def assert_dual_matches(got, du, fmt, mode):
    """got: (codes, scale, codes_t, scale_t) against spec.quantize's tiles of du and of du^T, bit for bit."""
    for name, (codes, scale), x in (("du", got[:2], du), ("du^T", got[2:], np.ascontiguousarray(du.T))):
        ref_codes, ref_scale, _ = spec.quantize(x, "tile", fmt=fmt, mode=mode)
        assert_codes_equal(f"{name} codes", codes, ref_codes)
        assert np.array_equal(scale, ref_scale, equal_nan=True), f"{name}: scales differ"


@pytest.mark.parametrize("fmt, mode", [("e4m3", "amax"), ("e4m3", "pow2"), ("e5m2", "amax")])
@pytest.mark.parametrize("shape", shapes())
def test_backward_quantize_dual_is_the_tiles_of_du_and_du_t(rng, shape, fmt, mode):
    """The fused backward writes du's 1x128 tiles and du^T's, bit for bit spec.quantize of the du that `backward`
    writes in float32 (which the fused kernel never does) and of its transpose."""
    M, F = shape
    u, dh = swiglu.make_inputs(rng, M, F)
    du = swiglu.backward(cuda.to_device(u), cuda.to_device(dh)).copy_to_host()
    assert_dual_matches(run_backward_dual(u, dh, fmt, mode), du, fmt, mode)


def test_backward_quantize_dual_public_op_and_poisoning(rng):
    """NumPy in, NumPy QuantizedTensors out (du's and du^T's); a NaN in u poisons the tiles of du it reaches in both
    layouts: da and db of its row (one tile each along du's row, one along each of those columns of du^T)."""
    M, F = 3, 200
    u, dh = swiglu.make_inputs(rng, M, F)
    u[1, 7] = np.nan  # the gate of column 7: da[1, 7] and db[1, 7] (du column F + 7) are NaN
    q, qt = swiglu.backward_quantize_dual(u, dh, mode="pow2")
    assert isinstance(q.data, np.ndarray) and (q.granularity, q.block, qt.data.shape) == ("tile", 128, (2 * F, M))
    du = swiglu.backward(u, dh)
    assert_dual_matches((q.data, q.scale, qt.data, qt.scale), du, "e4m3", "pow2")
    bad = np.isnan(q.scale)
    assert bad[1, 0] and bad[1, (F + 7) // 128] and bad.sum() == 2
    assert np.isnan(qt.scale[7, 0]) and np.isnan(qt.scale[F + 7, 0]) and np.isnan(qt.scale).sum() == 2


def test_reference_backward_is_the_derivative(rng):
    """da and db against central differences of dh . h(u) in float64: step 1e-5, so truncation (~step^2) and
    cancellation (~1e-16 |h dh| / step) errors stay below 1e-9 on these magnitudes."""
    M, F = 4, 50
    u = rng.standard_normal((M, 2 * F)) * 3
    u[0, :4] = [-30.0, -9.0, 9.0, 30.0]
    dh = rng.standard_normal((M, F))

    def h64(v):
        a, b = v[:, :F], v[:, F:]
        return a * b / (1.0 + np.exp(-a))

    step = 1e-5
    numeric = np.empty_like(u)
    for j in range(2 * F):
        e = np.zeros_like(u)
        e[:, j] = step
        numeric[:, j] = ((h64(u + e) - h64(u - e)) * dh).sum(axis=1) / (2 * step)
    assert_close("du", swiglu.reference_backward(u, dh), numeric, atol=1e-7, rtol=1e-6)


def test_numpy_in_numpy_out(rng):
    M, F = 3, 140
    u, dh = swiglu.make_inputs(rng, M, F)
    q = swiglu.forward_quantize(u, version=1)
    ref_codes, ref_scale = swiglu.reference(u)
    assert isinstance(q.data, np.ndarray) and isinstance(q.scale, np.ndarray) and q.nonfinite_groups == 0
    assert_codes_equal("codes", q.data, ref_codes)
    assert np.array_equal(q.scale, ref_scale)
    # the dequantized codes are h to E4M3's precision: 3 mantissa bits, 2^-4 relative, or subnormal spacing
    h = swiglu.forward(u)
    assert isinstance(h, np.ndarray) and h.dtype == np.float32
    s = spec.expand(q.scale, 1, 128, h.shape)
    assert (np.abs(spec.dequantize(q.data, q.scale, 1, 128) - h) <= np.abs(h) * 2.0**-4 + s * 2.0**-10).all()
    du = swiglu.backward(u, dh)
    assert isinstance(du, np.ndarray) and du.shape == (M, 2 * F)
    atol, rtol = swiglu.backward_tolerance(u, dh)
    assert_close("du", du, swiglu.reference_backward(u, dh), atol=atol, rtol=rtol)
    # device in, device out
    assert hasattr(swiglu.forward(cuda.to_device(u)), "copy_to_host")


# ---------------------------------------------------------------------------------------- large gates, NaN, Inf


LARGE_GATES = np.array([88.5, 89.0, 90.0, 100.0, 104.0, 150.0, 800.0, 1e4, 1e30], np.float32)
"""Beyond about 88.7 a float32 exp(a) overflows (exp(-a) for the negative ones); beyond 745 even float64's."""


def large_gate_input(rng, M=3, F=150):
    u, dh = swiglu.make_inputs(rng, M, F)
    n = 2 * len(LARGE_GATES)
    u[0, :n] = np.concatenate([LARGE_GATES, -LARGE_GATES])
    u[2, F - n:F] = np.concatenate([-LARGE_GATES, LARGE_GATES])  # in the partial last tile
    return u, dh, n


def test_large_gates_reference(rng, float_warnings_fail):
    u, dh, n = large_gate_input(rng)
    F = u.shape[1] // 2
    h = swiglu.reference_forward(u)
    du = swiglu.reference_backward(u, dh)
    assert np.isfinite(h).all() and np.isfinite(du).all()
    a, b, g = u[0, :n], u[0, F:F + n], dh[0, :n]
    pos = slice(0, len(LARGE_GATES))
    neg = slice(len(LARGE_GATES), n)
    # a >= 88.5: sigmoid(a) is 1 to float64's precision, so h = a * b and da = dh * b (rounded once), db = dh * a
    assert np.array_equal(h[0, pos], (a[pos].astype(np.float64) * b[pos]).astype(np.float32))
    assert np.array_equal(du[0, pos].astype(np.float32), g[pos] * b[pos])
    # a <= -88.5: h = a * b * e^a, tiny (subnormal in float32 below about -88) or 0, never NaN
    expected = a[neg].astype(np.float64) * b[neg] * np.exp(a[neg].astype(np.float64))
    assert_close("h, negative gates", h[0, neg], expected, atol=swiglu.H_ATOL, rtol=swiglu.H_RTOL)
    codes, scale = swiglu.reference(u)
    assert not (codes == spec.POISON_CODE).any() and np.isfinite(scale).all()


@pytest.mark.parametrize("version", sorted(swiglu.VERSIONS))
def test_large_gates_kernels(rng, version):
    u, dh, _ = large_gate_input(rng)
    got = run_quantize(u, version, with_h=True)
    assert np.isfinite(got[2]).all() and not (got[0] == spec.POISON_CODE).any()
    assert_matches_reference(u, got)
    if version == swiglu.BEST:
        du = swiglu.backward(cuda.to_device(u), cuda.to_device(dh), poisoned(u.shape, np.float32)).copy_to_host()
        assert np.isfinite(du).all()
        atol, rtol = swiglu.backward_tolerance(u, dh)
        assert_close("du", du, swiglu.reference_backward(u, dh), atol=atol, rtol=rtol)


@pytest.mark.parametrize("version", sorted(swiglu.VERSIONS))
def test_nonfinite_input_poisons_its_tile(rng, version):
    """NaN or Inf in u poisons the tiles of h it reaches (spec.quantize's rule): NaN scale, every code 0x7F; the
    other tiles are untouched."""
    M, F = 3, 300
    u, _ = swiglu.make_inputs(rng, M, F)
    u[0, 5] = np.nan  # gate: tile (0, 0)
    u[1, 140], u[1, F + 140] = 1.5, np.inf  # value: tile (1, 1)
    u[2, 290] = -np.inf  # gate -Inf: silu = -Inf * 0 = NaN, tile (2, 2), the partial one
    codes, scale, h = run_quantize(u, version, with_h=True)
    assert_matches_reference(u, (codes, scale, None))
    bad = np.zeros(scale.shape, bool)
    bad[0, 0] = bad[1, 1] = bad[2, 2] = True
    assert np.isnan(scale[bad]).all() and np.isfinite(scale[~bad]).all()
    for r, cols in ((0, slice(0, 128)), (1, slice(128, 256)), (2, slice(256, 300))):
        assert (codes[r, cols] == spec.POISON_CODE).all()
    assert np.isnan(h[0, 5]) and h[1, 140] in (np.inf, -np.inf) and np.isnan(h[2, 290])


# ---------------------------------------------------------------------------------------- bad input


def _u(rng, M=3, F=10):
    return rng.standard_normal((M, 2 * F), dtype=np.float32)


def _dev(shape, dtype=np.float32):
    return cuda.device_array(shape, dtype)


fwd, bwd, quant, dual = swiglu.forward, swiglu.backward, swiglu.forward_quantize, swiglu.backward_quantize_dual
BAD = [
    (lambda r: fwd(_u(r).astype(np.float64)), TypeError, r"^u must have dtype float32"),
    (lambda r: fwd([[1.0, 2.0]]), TypeError, r"^u must have dtype float32"),
    (lambda r: fwd(object()), TypeError, r"^u must be a NumPy or CUDA device array"),
    (lambda r: fwd(_u(r)[0]), ValueError, r"^u must be 2-D"),
    (lambda r: fwd(_u(r)[:, :7]), ValueError, r"^u must have an even number of columns"),
    (lambda r: fwd(np.zeros((0, 4), np.float32)), ValueError, r"^u must not be empty"),
    (lambda r: fwd(_u(r), np.zeros((3, 10), np.float32)), TypeError, r"^h must be a CUDA device array"),
    (lambda r: fwd(_u(r), _dev((3, 11))), ValueError, r"^h must have shape \(3, 10\)"),
    (lambda r: bwd(_u(r), _u(r)), ValueError, r"^dh must have shape \(3, 10\)"),
    (lambda r: bwd(_u(r), _u(r)[:, :10].astype(np.float16)), TypeError, r"^dh must have dtype float32"),
    (lambda r: bwd(_u(r), _u(r)[:, :10].copy(), _dev((3, 20), np.float64)), TypeError, r"^du must have dtype float32"),
    (lambda r: quant(_u(r), version=3), ValueError, r"^version must be None or an int in \(1, 2\)"),
    (lambda r: dual(_u(r), _u(r)), ValueError, r"^dh must have shape \(3, 10\)"),
    (lambda r: dual(_u(r), _u(r)[:, :10].copy(), fmt="e8m0"), ValueError,
     r"^fmt must be one of \('e4m3', 'e5m2'\)"),
    (lambda r: dual(_u(r), _u(r)[:, :10].copy(), mode="mx_floor"), ValueError,
     r"^mode must be one of \('amax', 'pow2'\)"),
    (lambda r: quant(_u(r), version="2"), TypeError, r"^version must be None or an int"),
    (lambda r: quant(_u(r), _dev((3, 10), np.uint8)), ValueError, r"^codes and scale must be given together"),
    (lambda r: quant(_u(r), _dev((3, 10)), _dev((3, 1))), TypeError, r"^codes must have dtype uint8"),
    (lambda r: quant(_u(r, F=129), _dev((3, 129), np.uint8), _dev((3, 1))), ValueError,
     r"^scale must have shape \(3, 2\)"),
    (lambda r: quant(_u(r), _dev((3, 10), np.uint8), _dev((3, 1)), _dev((3, 10), np.float16)), TypeError,
     r"^h must have dtype float32"),
    (lambda r: quant(_u(r), np.zeros((3, 10), np.uint8), np.zeros((3, 1), np.float32)), TypeError,
     r"^codes must be a CUDA device array"),
]


@pytest.mark.parametrize("call, error, match", BAD)
def test_bad_input_is_refused_by_name(rng, call, error, match):
    with pytest.raises(error, match=match):
        call(rng)
