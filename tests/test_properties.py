"""Property tests (hypothesis): laws the FP8 formats and the quantization spec must obey for any input, and the
kernels' agreement with the spec on shapes hypothesis picks. The example-based tests next to these pin the
corner cases; these look for the inputs nobody thought of."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fp8lab import bench
from fp8lab.numerics import formats, spec
from fp8lab.device import runtime
from fp8lab.kernels import quantize_fine as qf
from fp8lab.device.runtime import cuda

FMTS = [formats.E4M3, formats.E5M2]
ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@given(x=hnp.arrays(np.float32, st.integers(1, 64), elements=f32))
def test_encode_matches_ml_dtypes_without_saturation(fmt, x):
    got = formats.encode(x, fmt, saturate=False)
    want = x.astype(ML[fmt.name]).view(np.uint8)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(formats.decode(got[nan], fmt)).all()


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@given(x=finite32)
def test_saturating_encode_is_the_nearest_value(fmt, x):
    """The decoded code is a value of the format nearest to x (clamped to +-max), ties to an even mantissa."""
    v = float(formats.decode(formats.encode(np.float32(x), fmt, saturate=True), fmt))
    table = formats.value_table(fmt).astype(np.float64)
    grid = table[np.isfinite(table)]
    target = min(max(x, -fmt.max_normal), fmt.max_normal)
    best = np.min(np.abs(grid - target))
    assert abs(v - target) == best
    if x != 0 and v != 0:
        assert math.copysign(1, v) == math.copysign(1, x)


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@given(a=finite32, b=finite32)
def test_encode_is_monotonic(fmt, a, b):
    lo, hi = sorted((a, b))
    va, vb = formats.decode(formats.encode(np.array([lo, hi], np.float32), fmt), fmt)
    assert va <= vb


@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=300),
                    elements=st.floats(-1e6, 1e6, width=32)),
       granularity=st.sampled_from(["row", "tile", "block", "mx"]), block=st.sampled_from([32, 64, 128]),
       pow2=st.booleans())
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_quantize_spec_error_is_within_half_a_step(x, granularity, block, pow2):
    """Every element dequantizes to within half an E4M3 step of its group's scale grid (no saturation with
    amax or pow2 scales), and each group's largest |x| lands on +-448 exactly with amax scales."""
    mode = "mx_ceil" if granularity == "mx" else ("pow2" if pow2 else "amax")
    codes, scale, _ = spec.quantize(x, granularity, block=block, mode=mode)
    gm, gk = spec.group_shape(granularity, x.shape, block)
    assert scale.shape == spec.scale_shape(granularity, x.shape, block)
    deq = spec.dequantize(codes, scale, gm, gk).astype(np.float64)
    s = spec.expand(scale, gm, gk, x.shape).astype(np.float64)
    v = np.abs(x.astype(np.float64)) / s  # the value encoded, in units of the scale
    # E4M3 spacing at v: 2^(floor(log2 v) - 3), at least the subnormal step 2^-9
    step = np.exp2(np.floor(np.log2(np.maximum(v, 2.0**-6))) - 3)
    err = np.abs(deq - x) / s
    assert (err <= step / 2 * (1 + 1e-6) + 1e-30).all()
    assert (np.abs(formats.decode(codes)) <= 448).all()
    if mode == "amax":
        amax = spec.group_amax(x, gm, gk)
        top = np.abs(formats.decode(codes)).astype(np.float64)
        hit = spec.group_amax(top.astype(np.float32), gm, gk)
        assert np.array_equal(hit[amax > spec.AMAX_FLOOR], np.full((amax > spec.AMAX_FLOOR).sum(), 448.0))


@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 300)), granularity=st.sampled_from(["tile", "block"]),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=6 if runtime.IS_SIM else 40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
def test_quantize_kernels_equal_the_spec(shape, granularity, seed):
    """The fused kernels (tile: version 3 where it applies, else 2; block) give the spec's codes and scales, bit for
    bit, on shapes hypothesis picks."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.uniform(-20, 20))).astype(np.float32)
    codes = cuda.to_device(np.full(shape, 0xA5, np.uint8))
    scale = bench.poisoned(spec.scale_shape(granularity, shape), np.float32)
    launch = qf.quantize_tile if granularity == "tile" else qf.quantize_block
    launch(cuda.to_device(x), codes, scale)
    ref_codes, ref_scale, _ = spec.quantize(x, granularity)
    bench.assert_codes_equal(granularity, codes.copy_to_host(), ref_codes)
    assert np.array_equal(scale.copy_to_host(), ref_scale)
