"""Fine-grained quantization (row, 1x128 tile, 128x128 block, MX), dequantize, requantize and delayed scaling.

Every kernel against the NumPy spec (fp8lab/numerics/spec.py), codes and scales bit for bit: fresh random
inputs, shapes that are not multiples of the group size, outputs poisoned before the launch. Small shapes run
everywhere (the simulator: few blocks, ~1e4 threads per launch at most); realistic shapes are marked `gpu`.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

import fp8lab as fl
from fp8lab.numerics import formats, spec
from fp8lab import quant
from fp8lab.bench import assert_codes_equal, poisoned
from fp8lab.kernels import quantize_fine as qf
from fp8lab.device.runtime import cuda
from fp8lab.numerics.scaling import DelayedScaling, lagging_experiment

BIG = (4096, 7168 + 5)


def sizes(small, big=BIG):
    return [pytest.param(small, id="small"), pytest.param(big, id="big", marks=pytest.mark.gpu)]


def heavy_tailed(rng, shape):
    """Gaussian with a few large outliers, like LLM activations; never zeros."""
    x = rng.standard_normal(shape, dtype=np.float32)
    x[rng.random(shape) < 0.01] *= 50
    return x


def launch(granularity, x, *, version=qf.BEST, block=128, mode="amax", fmt="e4m3"):
    """Run the kernel for `granularity` on poisoned outputs; returns host (codes, scale, scale_codes)."""
    sh = spec.scale_shape(granularity, x.shape, block)
    codes, scale, scodes = poisoned(x.shape, np.uint8), poisoned(sh, np.float32), poisoned(sh, np.uint8)
    dx = cuda.to_device(x)
    if granularity == "tile":
        qf.quantize_tile(dx, codes, scale, fmt=fmt, block=block, mode=mode, version=version)
    elif granularity == "row":
        qf.quantize_row(dx, codes, scale, fmt=fmt, mode=mode)
    elif granularity == "block":
        qf.quantize_block(dx, codes, scale, fmt=fmt, block=block, mode=mode)
    else:
        qf.quantize_mx(dx, codes, scale, scodes, fmt=fmt, rule=mode.removeprefix("mx_"))
    return codes.copy_to_host(), scale.copy_to_host(), scodes.copy_to_host()


def check(granularity, x, got, *, block=128, mode="amax", fmt="e4m3"):
    codes, scale, scodes = got
    ref_codes, ref_scale, ref_scodes = spec.quantize(x, granularity, fmt, block, mode)
    assert_codes_equal("codes", codes, ref_codes)
    assert scale.shape == ref_scale.shape and np.array_equal(scale, ref_scale, equal_nan=True), "scales differ"
    if granularity == "mx":
        assert_codes_equal("E8M0 scale codes", scodes, ref_scodes)
    return ref_codes, ref_scale


def group_max_decoded(codes, granularity, block=128, fmt="e4m3"):
    gm, gk = spec.group_shape(granularity, codes.shape, block)
    return spec.group_amax(formats.decode(codes, formats.get_format(fmt)), gm, gk)


# ------------------------------------------------------------------------------------------------ kernels vs reference


@pytest.mark.parametrize("version", sorted(qf.VERSIONS))
@pytest.mark.parametrize("shape", sizes((5, 300)) + [pytest.param((4096, 7168 + 4), id="big-vec", marks=pytest.mark.gpu)])
def test_tile_bit_exact_and_largest_is_448(rng, version, shape):
    x = heavy_tailed(rng, shape)
    codes, scale = check("tile", x, launch("tile", x, version=version))
    assert scale.shape == (shape[0], -(-shape[1] // 128))
    # every 1x128 tile (the partial last one too) has its largest |x| at exactly +-448
    assert (group_max_decoded(codes, "tile") == 448).all()


def test_tile_v3_runs_only_where_it_applies(rng):
    """Version 3 needs K % 4 == 0 (16-byte loads, 4-byte code stores) and a block that is a multiple of 128;
    elsewhere quantize_tile falls back to version 2 with the same codes. The (5, 300) shape of the test above
    is one where version 3 really runs."""
    ok = cuda.to_device(heavy_tailed(rng, (5, 300)))
    assert qf.vector_ok(ok, cuda.device_array((5, 300), np.uint8), 128)
    assert not qf.vector_ok(ok, cuda.device_array((5, 300), np.uint8), 48)
    odd = heavy_tailed(rng, (3, 301))
    assert not qf.vector_ok(cuda.to_device(odd), cuda.device_array((3, 301), np.uint8), 128)
    check("tile", odd, launch("tile", odd, version=3))
    x = heavy_tailed(rng, (2, 512))
    check("tile", x, launch("tile", x, version=3, block=256), block=256)
    check("tile", x, launch("tile", x, version=3, fmt="e5m2"), fmt="e5m2")


def test_tile_e5m2_and_odd_block(rng):
    x = heavy_tailed(rng, (3, 100))
    codes, _ = check("tile", x, launch("tile", x, block=48, fmt="e5m2"), block=48, fmt="e5m2")
    assert (group_max_decoded(codes, "tile", 48, "e5m2") == 57344).all()


@pytest.mark.parametrize("shape", sizes((5, 300)))
def test_row_bit_exact(rng, shape):
    x = heavy_tailed(rng, shape)
    codes, scale = check("row", x, launch("row", x))
    assert scale.shape == (shape[0], 1)
    assert (group_max_decoded(codes, "row") == 448).all()


@pytest.mark.parametrize("shape", sizes((130, 257)))
def test_block_bit_exact(rng, shape):
    x = heavy_tailed(rng, shape)
    codes, scale = check("block", x, launch("block", x))
    assert scale.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    assert (group_max_decoded(codes, "block") == 448).all()


@pytest.mark.parametrize("rule", ["floor", "ceil"])
@pytest.mark.parametrize("shape", sizes((3, 150)) + [pytest.param((3, 164), id="small-vec")])  # v2 / v3 paths
def test_mx_bit_exact(rng, rule, shape):
    x = heavy_tailed(rng, shape)
    _, scale = check("mx", x, launch("mx", x, mode="mx_" + rule), mode="mx_" + rule)
    assert scale.shape == (shape[0], -(-shape[1] // 32))
    # the E8M0 codes decode to the scales (independent oracle: ml_dtypes)
    _, _, scodes = spec.quantize(x, "mx", mode="mx_" + rule)
    assert (scodes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32) == scale).all()


@pytest.mark.parametrize("granularity", ["row", "tile", "block"])
def test_pow2_scales_round_up(rng, granularity):
    shape = (130, 200) if granularity == "block" else (4, 200)
    x = heavy_tailed(rng, shape)
    codes, scale = check(granularity, x, launch(granularity, x, mode="pow2"), mode="pow2")
    m, _ = np.frexp(scale)
    assert (m == 0.5).all(), "scales must be powers of two"
    amax = spec.group_amax(x, *spec.group_shape(granularity, shape))
    assert (scale >= amax / 448).all() and (scale < 2 * amax / 448).all()  # rounded up, by less than 2x
    assert (group_max_decoded(codes, granularity) <= 448).all()
    # rounding the scale up means no element is clamped: |x| / scale <= 448 exactly
    gm, gk = spec.group_shape(granularity, shape)
    assert (np.abs(x) / spec.expand(scale, gm, gk, shape) <= 448).all()


def test_mx_floor_saturates_and_ceil_does_not():
    # one group of 32 whose amax is 480 = 1.875 * 2^8: OCP floor gives 2^(8-8) = 1, so 480 saturates to 448;
    # the ceil rule gives 2^ceil(log2(480/448)) = 2 and keeps 480 exactly (240 * 2).
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    x[0, 5] = 480.0
    fl_codes, fl_scale, fl_sc = launch("mx", x, mode="mx_floor")
    ce_codes, ce_scale, ce_sc = launch("mx", x, mode="mx_ceil")
    check("mx", x, (fl_codes, fl_scale, fl_sc), mode="mx_floor")
    check("mx", x, (ce_codes, ce_scale, ce_sc), mode="mx_ceil")
    assert fl_scale[0, 0] == 1.0 and fl_sc[0, 0] == 127
    assert ce_scale[0, 0] == 2.0 and ce_sc[0, 0] == 128
    assert formats.decode(fl_codes[0, 5]) == 448  # clamped: 480 is lost
    assert formats.decode(ce_codes[0, 5]) * ce_scale[0, 0] == 480
    # the second group (amax 1.0 = 2^0): floor 2^-8, ceil 2^ceil(log2(1/448)) = 2^-8 as well
    assert fl_scale[0, 1] == ce_scale[0, 1] == 2.0**-8

    # on random data: floor puts amax / scale in [256, 512), ceil in (224, 448]
    x = heavy_tailed(np.random.default_rng(0), (3, 96)) * 10
    amax = spec.group_amax(x, 1, 32)
    ratio_floor = amax / fl.quantize(x, granularity="mx", mx_rule="floor").scale
    q = fl.quantize(x, granularity="mx", mx_rule="ceil")
    ratio_ceil = amax / q.scale
    assert ((256 <= ratio_floor) & (ratio_floor < 512)).all()
    assert ((224 < ratio_ceil) & (ratio_ceil <= 448)).all()
    assert q.block == 32 and q.scale_codes.shape == q.scale.shape


@pytest.mark.parametrize("granularity", ["row", "tile", "block", "mx"])
def test_public_api_round_trip(rng, granularity):
    shape = (130, 131) if granularity == "block" else (5, 300)
    x = heavy_tailed(rng, shape)
    q = fl.quantize(x, granularity=granularity)
    mode = "mx_floor" if granularity == "mx" else "amax"
    ref_codes, ref_scale, ref_scodes = spec.quantize(x, granularity, mode=mode)
    assert isinstance(q.data, np.ndarray) and q.data.shape == shape and q.granularity == granularity
    assert_codes_equal("codes", q.data, ref_codes)
    assert (q.scale == ref_scale).all() and q.nonfinite_groups == 0
    assert q.block == {"row": None, "tile": 128, "block": 128, "mx": 32}[granularity]
    if granularity == "mx":
        assert_codes_equal("scale_codes", q.scale_codes, ref_scodes)
    else:
        assert q.scale_codes is None
    y = fl.dequantize(q)
    gm, gk = spec.group_shape(granularity, shape)
    assert y.dtype == np.float32 and np.array_equal(y, spec.dequantize(ref_codes, ref_scale, gm, gk))
    # 3 mantissa bits: relative error at most 2^-4 above the subnormal range (MX floor: saturation aside)
    big = np.abs(x) > 2**-6 * spec.expand(q.scale, gm, gk, shape)
    ok = np.abs(y - x) <= np.abs(x) * 2**-4 + 1e-7
    if granularity == "mx":
        ok |= np.abs(x) / spec.expand(q.scale, gm, gk, shape) > 448
    assert ok[big].all()


def test_device_in_device_out(rng):
    x = heavy_tailed(rng, (4, 200))
    q = fl.quantize(cuda.to_device(x), granularity="tile", block=64, pow2_scale=True)
    assert hasattr(q.data, "copy_to_host") and q.nonfinite_groups is None
    ref_codes, ref_scale, _ = spec.quantize(x, "tile", block=64, mode="pow2")
    assert_codes_equal("codes", q.data.copy_to_host(), ref_codes)
    assert (q.scale.copy_to_host() == ref_scale).all()
    y = fl.dequantize(q)
    assert hasattr(y, "copy_to_host") and y.shape == x.shape


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_dequantize_kernel_every_code(rng, fmt):
    codes = rng.integers(0, 256, (7, 100), dtype=np.uint8)  # NaN and Inf codes included
    scale = rng.uniform(0.01, 3, (4, 4)).astype(np.float32)
    out = poisoned(codes.shape, np.float32)
    qf.dequantize(cuda.to_device(codes), cuda.to_device(scale), 2, 32, out, fmt=fmt)
    ref = spec.dequantize(codes, scale, 2, 32, fmt)
    assert np.array_equal(out.copy_to_host(), ref, equal_nan=True)


@pytest.mark.parametrize("shape", sizes((130, 257)))
def test_requantize_tile_to_col(rng, shape):
    x = heavy_tailed(rng, shape)
    codes, scale, _ = spec.quantize(x, "tile")
    M, K = shape
    ct, st = poisoned((K, M), np.uint8), poisoned((K, -(-M // 128)), np.float32)
    qf.requantize_tile_to_col(cuda.to_device(codes), cuda.to_device(scale), ct, st)
    ref_ct, ref_st = spec.requantize_tile_to_col(codes, scale)
    assert_codes_equal("codes_t", ct.copy_to_host(), ref_ct)
    assert (st.copy_to_host() == ref_st).all()
    # every 128x1 column group of x has its largest element at +-448 again
    assert (group_max_decoded(ref_ct, "tile") == 448).all()


def dual(x, fmt="e4m3", mode="amax"):
    """quantize_tile_dual on poisoned outputs: host (codes, scale, codes_t, scale_t)."""
    M, N = x.shape
    outs = [poisoned((M, N), np.uint8), poisoned((M, -(-N // 128)), np.float32), poisoned((N, M), np.uint8),
            poisoned((N, -(-M // 128)), np.float32)]
    qf.quantize_tile_dual(cuda.to_device(x), *outs, fmt=fmt, mode=mode)
    return [o.copy_to_host() for o in outs]


@pytest.mark.parametrize("shape", sizes((133, 300), (4100, 7170)) + [pytest.param((128, 256), id="tile-multiples")])
@pytest.mark.parametrize("fmt, mode", [("e4m3", "amax"), ("e5m2", "pow2")])
def test_dual_equals_tile_of_x_and_of_its_transpose(rng, shape, fmt, mode):
    x = heavy_tailed(rng, shape)
    x[5, :40] = 0.0  # a row tile that is almost all zeros, and a column group partly so
    codes, scale, codes_t, scale_t = dual(x, fmt, mode)
    for what, got_codes, got_scale, src in (("x", codes, scale, x), ("x.T", codes_t, scale_t, x.T)):
        want = spec.quantize(np.ascontiguousarray(src), "tile", fmt=fmt, mode=mode)
        assert_codes_equal(f"dual {what}", got_codes, want[0])
        assert np.array_equal(got_scale, want[1]), f"dual {what}: scales differ"


def test_dual_nonfinite_poisons_its_row_tile_and_column_group(rng):
    x = heavy_tailed(rng, (200, 260))
    x[130, 140] = np.inf
    codes, scale, codes_t, scale_t = dual(x)
    assert np.isnan(scale[130, 1]) and np.isnan(scale_t[140, 1])
    assert np.isfinite(np.delete(scale, 130, axis=0)).all() and np.isfinite(np.delete(scale_t, 140, axis=0)).all()
    assert (codes[130, 128:256] == spec.POISON_CODE).all() and (codes_t[140, 128:] == spec.POISON_CODE).all()
    want = spec.quantize(np.ascontiguousarray(x.T), "tile")
    assert_codes_equal("dual x.T", codes_t, want[0])


def test_dual_rejects_other_modes(rng):
    x = cuda.to_device(heavy_tailed(rng, (4, 8)))
    with pytest.raises(ValueError, match="mode must be one of"):
        qf.quantize_tile_dual(x, *[None] * 4, mode="mx_floor")


def test_the_deepseek_linear_quantizes_dy_once(rng):
    """fp8-deepseek's backward takes dy's tiles and dy^T's from quantize_tile_dual, with no transpose of dy."""
    from fp8lab.training import engine_kernels

    lin = engine_kernels.DeviceLinear("fp8-deepseek", 130, 140, 150)
    assert lin.dual and not hasattr(lin, "dyt")
    assert not engine_kernels.DeviceLinear("fp8-tensor", 130, 140, 150).dual  # per tensor: an exact transpose


def test_requantize_public_api(rng):
    x = heavy_tailed(rng, (130, 40))
    q = fl.quantize(x, granularity="tile")
    qt = quant.requantize_tile_to_col(q)
    assert qt.granularity == "tile" and qt.block == 128 and qt.shape == (40, 130) and qt.scale.shape == (40, 2)
    ref_ct, ref_st = spec.requantize_tile_to_col(q.data, q.scale)
    assert_codes_equal("codes_t", qt.data, ref_ct)
    assert (qt.scale == ref_st).all()
    # two roundings: within twice the FP8 step of x.T where x is normal under both scales (e4m3's smallest
    # normal is 2**-6; an outlier in the same 1x128 or 128x1 tile makes its neighbours subnormal there)
    y = fl.dequantize(qt)
    normal_t = np.abs(x.T) > 2**-6 * spec.expand(qt.scale, 1, 128, (40, 130)) * 2
    normal = np.abs(x) > 2**-6 * spec.expand(q.scale, 1, 128, (130, 40)) * 2
    big = normal_t & normal.T
    assert big.mean() > 0.5
    # each rounding is within half a step, 2**-4 relative: together (1 + 2**-4)**2 - 1
    assert (np.abs(y - x.T)[big] <= np.abs(x.T)[big] * ((1 + 2**-4) ** 2 - 1) + 1e-7).all()
    with pytest.raises(ValueError, match="q must have granularity 'tile'"):
        quant.requantize_tile_to_col(fl.quantize(x, granularity="row"))
    with pytest.raises(TypeError, match="q must be a QuantizedTensor"):
        quant.requantize_tile_to_col(x)


# ------------------------------------------------------------------------------------------------ edge cases


def test_all_zero_group_gives_zero_codes_and_finite_scale(rng):
    x = heavy_tailed(rng, (3, 200))
    x[1, :128] = 0.0  # one full tile
    x[2, 128:] = -0.0  # the partial last tile, negative zeros
    q = fl.quantize(x, granularity="tile")
    assert (q.data[1, :128] == 0).all() and (q.data[2, 128:] == 0x80).all()
    floor_scale = np.float32(spec.AMAX_FLOOR) / np.float32(448)
    assert q.scale[1, 0] == floor_scale and q.scale[2, 1] == floor_scale
    assert np.isfinite(q.scale).all() and q.nonfinite_groups == 0
    assert (fl.dequantize(q)[1, :128] == 0).all()


def test_partial_group_amax_is_over_existing_elements(rng):
    x = rng.uniform(-1, 1, (2, 130)).astype(np.float32)  # the last tile holds 2 elements
    x[:, 128:] = [[0.5, -0.25], [3e-3, 1e-3]]
    q = fl.quantize(x, granularity="tile")
    assert q.scale[0, 1] == np.float32(0.5) / np.float32(448) and q.scale[1, 1] == np.float32(3e-3) / np.float32(448)
    assert formats.decode(q.data[0, 128]) == 448 and formats.decode(q.data[1, 128]) == 448


# the simulator's NumPy scalars warn about version 3's x * 0 flag; pytest.warns below re-emits what it does not match
@pytest.mark.filterwarnings("ignore:invalid value encountered in scalar multiply:RuntimeWarning")
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("granularity", ["tile", "mx"])
def test_nonfinite_poisons_its_group_only(rng, bad, granularity):
    x = heavy_tailed(rng, (3, 200))
    x[1, 140] = bad  # tile (1, 1); mx group (1, 4)
    with pytest.warns(RuntimeWarning, match="NaN/Inf in 1 of"):
        q = fl.quantize(x, granularity=granularity)
    g = 1 if granularity == "tile" else 4
    gk = 128 if granularity == "tile" else 32
    assert q.nonfinite_groups == 1
    assert np.isnan(q.scale[1, g]) and np.isfinite(np.delete(q.scale.ravel(), 1 * q.scale.shape[1] + g)).all()
    group = q.data[1, g * gk:(g + 1) * gk]
    assert (group == spec.POISON_CODE).all()
    if granularity == "mx":
        assert q.scale_codes[1, g] == 0xFF
    # every other code is what a clean quantization gives
    clean = x.copy()
    clean[1, 140] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        qc = fl.quantize(clean, granularity=granularity)
    mask = np.ones(x.shape, bool)
    mask[1, g * gk:(g + 1) * gk] = False
    assert (q.data[mask] == qc.data[mask]).all()
    y = fl.dequantize(q)
    assert np.isnan(y[~mask]).all() and not np.isnan(y[mask]).any()
    # the kernel agrees with the reference bit for bit, poisoned group included
    check(granularity, x, launch(granularity, x, mode="amax" if granularity == "tile" else "mx_floor"),
          mode="amax" if granularity == "tile" else "mx_floor")


def test_nonfinite_in_block_and_row(rng):
    x = heavy_tailed(rng, (130, 140))
    x[129, 139] = np.nan
    check("block", x, launch("block", x))
    rows = np.ascontiguousarray(x[126:130])
    check("row", rows, launch("row", rows))


def test_non_contiguous_numpy_input_is_made_contiguous(rng):
    base = heavy_tailed(rng, (300, 10))
    xt = base.T  # (10, 300), a transposed view
    xs = heavy_tailed(rng, (5, 600))[:, ::2]  # strided columns
    for x in (xt, xs):
        assert not x.flags.c_contiguous
        q = fl.quantize(x, granularity="tile")
        assert_codes_equal("codes", q.data, spec.quantize(np.ascontiguousarray(x), "tile")[0])


def test_float64_and_float16_are_converted(rng):
    x = heavy_tailed(rng, (3, 70))
    ref = spec.quantize(x, "row")[0]
    assert_codes_equal("float64", fl.quantize(x.astype(np.float64), granularity="row").data, ref)
    x16 = x.astype(np.float16)
    assert_codes_equal("float16", fl.quantize(x16, granularity="row").data,
                       spec.quantize(x16.astype(np.float32), "row")[0])


@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        ((np.zeros((0, 5), np.float32),), dict(granularity="tile"), ValueError, "x must not be empty"),
        ((np.ones((2, 3, 4), np.float32),), dict(granularity="tile"), ValueError,
         r"x of shape \(M, K\), got .*\(2, 3, 4\)"),
        ((np.ones(8, np.float32),), dict(granularity="row"), ValueError, "needs x of shape"),
        ((np.ones((2, 4), np.int32),), dict(granularity="tile"), TypeError, "x must have dtype"),
        (([["a"]],), dict(granularity="tile"), TypeError, "x must have dtype"),
        ((np.ones((2, 4), np.float32),), dict(granularity="tiles"), ValueError, "granularity must be one of"),
        ((np.ones((2, 4), np.float32),), dict(granularity="mx", mx_rule="round"), ValueError, "mx_rule must be one of"),
        ((np.ones((2, 4), np.float32),), dict(granularity="tile", pow2_scale=1), TypeError,
         "pow2_scale must be a bool"),
        ((np.ones((2, 4), np.float32),), dict(pow2_scale=True), ValueError, "pow2_scale=True needs a fine granularity"),
        ((np.ones((2, 4), np.float32),), dict(granularity="tile", block=2048), ValueError, "block must be at most"),
        ((np.ones((2, 4), np.float32),), dict(granularity="block", block=-1), ValueError, "block must be a positive"),
    ],
)
def test_quantize_bad_inputs(args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.quantize(*args, **kwargs)


def test_dequantize_checks_scale_shape(rng):
    q = fl.quantize(heavy_tailed(rng, (3, 200)), granularity="tile")
    q.scale = q.scale[:, :1]
    with pytest.raises(ValueError, match=r"q.scale must have shape \(3, 2\)"):
        fl.dequantize(q)


def test_tensor_granularity_unchanged(rng):
    x = heavy_tailed(rng, (7, 33))
    q = fl.quantize(x)
    codes, scale, _ = spec.quantize_tensor(x)
    assert q.granularity == "tensor" and q.scale.shape == (1,) and q.scale[0] == scale
    assert (q.data == codes).all() and q.block is None and q.scale_codes is None


# ------------------------------------------------------------------------------------------------ delayed scaling


def test_delayed_scaling_history_algos_and_margin():
    ds = DelayedScaling(history_len=3, algo="max")
    assert ds.scale == 1.0 and ds.history_amax() is None  # TE's initial scale
    assert ds.scale_for(np.array([2.0, -448.0], np.float32)) == 1.0  # from the (empty) history
    assert ds.scale == np.float32(1.0)  # 448 / 448
    for a in (896.0, 44.8, 4.48):
        ds.update(a)
    assert ds.history_amax() == 896.0 and ds.scale == np.float32(2.0)
    ds.update(4.48)  # 896 falls out of the 3-long window
    assert ds.history_amax() == 44.8 and ds.scale == np.float32(0.1)

    recent = DelayedScaling(algo="most_recent", margin=2)
    for a in (100.0, 448.0):
        recent.update(a)
    assert recent.scale == np.float32(4.0)  # 448 * 2^2 / 448

    keep = DelayedScaling()
    keep.update(224.0)
    assert keep.scale == np.float32(0.5)
    keep = DelayedScaling(algo="most_recent")
    keep.update(224.0)
    assert keep.scale == np.float32(0.5)
    keep.update(0.0)  # zero or non-finite amax: the previous scale stays (as in TE)
    assert keep.scale == np.float32(0.5)
    keep.update(float("nan"))
    assert keep.scale == np.float32(0.5)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(history_len=0), ValueError, "history_len must be a positive int"),
        (dict(history_len=2.5), TypeError, "history_len must be a positive int"),
        (dict(algo="mean"), ValueError, "algo must be one of"),
        (dict(margin=-1), ValueError, "margin must be >= 0"),
        (dict(margin=0.5), TypeError, "margin must be an int"),
        (dict(fmt="e8m0"), ValueError, "fmt must be one of"),
    ],
)
def test_delayed_scaling_bad_arguments(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        DelayedScaling(**kwargs)


def test_delayed_scaling_bad_updates():
    ds = DelayedScaling()
    with pytest.raises(ValueError, match="amax must be >= 0"):
        ds.update(-1.0)
    with pytest.raises(TypeError, match="amax must be a number"):
        ds.update("1")
    with pytest.raises(ValueError, match="x must not be empty"):
        ds.scale_for(np.zeros(0, np.float32))
    with pytest.raises(TypeError, match="x must have dtype"):
        ds.scale_for(np.arange(3))


def test_lagging_experiment_shows_the_lag():
    r = lagging_experiment(steps=30, growth=1.2, n=2048)
    assert set(r) == {"amax", "delayed_amax", "saturated"} and all(len(v) == 30 for v in r.values())
    # algo "max": the delayed scale stands for the largest amax of the steps before (float32 rounding aside)
    np.testing.assert_allclose(r["delayed_amax"][1:], np.maximum.accumulate(r["amax"])[:-1], rtol=1e-6)
    assert (r["delayed_amax"][1:] < r["amax"][1:]).mean() > 0.5  # it lags behind most steps
    assert r["saturated"][1:].max() > 0 and r["saturated"][0] == 0
    # a shrinking tensor never saturates (the history max only over-estimates)
    assert (lagging_experiment(steps=20, growth=0.9, n=1024)["saturated"] == 0).all()
    # margin 1 gives one binade of headroom: growth 1.2 no longer saturates
    assert (lagging_experiment(steps=30, growth=1.2, n=2048, margin=1)["saturated"] == 0).all()
    with pytest.raises(ValueError, match="growth must be a positive finite number"):
        lagging_experiment(growth=0)
    with pytest.raises(TypeError, match="steps must be a positive int"):
        lagging_experiment(steps=1.5)
