"""Bad input to every public function of fp8lab.__all__ (issue #11): wrong types, wrong shapes, empty input,
non-finite input and out-of-range options. Each raises TypeError (type) or ValueError (value) with a message that
starts with the argument's name, or has the documented behaviour asserted here. Shapes are tiny (simulator)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.numerics import spec
from fp8lab.device.runtime import cuda
from fp8lab.numerics.scaling import MAX_MARGIN

F32_MAX = float(np.finfo(np.float32).max)
E4M3_MAX = float(spec.FP8_MAX["e4m3"])


def _x(rng, shape=(3, 40), dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _with(x, index, value):
    x = x.copy()
    x[index] = value
    return x


@pytest.fixture
def numpy_warnings_fail():
    """NumPy's floating-point RuntimeWarnings (from our code or the simulator's threads) fail the test."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", r"(invalid value|overflow|divide by zero) encountered", RuntimeWarning)
        yield


# ------------------------------------------------------------------------------------------------------ quantize

QUANTIZE = [
    # wrong types
    (lambda r: "abc", {}, TypeError, r"^x must have dtype"),
    (lambda r: object(), {}, TypeError, r"^x must be a NumPy or CUDA device array"),
    (lambda r: np.arange(6), {}, TypeError, r"^x must have dtype"),
    (lambda r: _x(r).astype(np.complex64), {}, TypeError, r"^x must have dtype"),
    (lambda r: _x(r), dict(fmt=3), TypeError, r"^fmt must be"),
    (lambda r: _x(r), dict(granularity=1), TypeError, r"^granularity must be one of"),
    (lambda r: _x(r), dict(granularity="tile", block="16"), TypeError, r"^block must be a positive int"),
    (lambda r: _x(r), dict(granularity="block", block=16.0), TypeError, r"^block must be a positive int"),
    (lambda r: _x(r), dict(granularity="tile", block=True), TypeError, r"^block must be a positive int"),
    (lambda r: _x(r), dict(granularity="tile", pow2_scale="yes"), TypeError, r"^pow2_scale must be a bool"),
    (lambda r: _x(r), dict(granularity="mx", mx_rule=None), TypeError, r"^mx_rule must be one of"),
    # wrong shapes
    (lambda r: np.float32(r.standard_normal()), {}, ValueError, r"^x must have at least one dimension"),
    (lambda r: float(r.standard_normal()), {}, ValueError, r"^x must have at least one dimension"),
    (lambda r: _x(r, ()), dict(granularity="tile"), ValueError, r"^x must have at least one dimension"),
    (lambda r: _x(r, (40,)), dict(granularity="tile"), ValueError, r"^granularity must be .* x of shape \(M, K\)"),
    (lambda r: _x(r, (2, 3, 4)), dict(granularity="row"), ValueError, r"^granularity must be .*\(2, 3, 4\)"),
    # empty input
    (lambda r: np.zeros(0, np.float32), {}, ValueError, r"^x must not be empty"),
    (lambda r: np.zeros((0, 5), np.float32), dict(granularity="tile"), ValueError, r"^x must not be empty"),
    (lambda r: np.zeros((3, 0)), dict(granularity="mx"), ValueError, r"^x must not be empty"),
    # float64 beyond float32's range (it would become Inf) for every granularity
    (lambda r: _with(_x(r, (5,), np.float64), 3, 1e300), {}, ValueError,
     r"^x must lie within float32's range .* the first \(1e\+300\) at index 3"),
    (lambda r: _with(_x(r, (2, 9), np.float64), (1, 8), -1e39), dict(granularity="tile"), ValueError,
     r"^x must lie within float32's range"),
    # out-of-range options
    (lambda r: _x(r), dict(fmt="e3m4"), ValueError, r"^fmt must be"),
    (lambda r: _x(r), dict(fmt="e8m0"), ValueError, r"^fmt must be one of \('e4m3', 'e5m2'\)"),
    (lambda r: _x(r), dict(granularity="tiles"), ValueError, r"^granularity must be one of"),
    (lambda r: _x(r), dict(granularity="tile", block=0), ValueError, r"^block must be a positive int"),
    (lambda r: _x(r), dict(granularity="block", block=-16), ValueError, r"^block must be a positive int"),
    (lambda r: _x(r), dict(granularity="tile", block=2048), ValueError, r"^block must be at most 1024"),
    (lambda r: _x(r), dict(granularity="mx", mx_rule="round"), ValueError, r"^mx_rule must be one of"),
    (lambda r: _x(r), dict(pow2_scale=True), ValueError, r"^pow2_scale=True needs a fine granularity"),
]


@pytest.mark.parametrize("make_x, kwargs, exc, words", QUANTIZE)
def test_quantize(rng, make_x, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.quantize(make_x(rng), **kwargs)


@pytest.mark.parametrize("granularity", ["tensor", "row", "mx"])
@pytest.mark.parametrize("block", [0, -16, "x", None, 2048])
def test_quantize_ignores_block_where_unused(rng, granularity, block):
    x = _x(rng)
    got, want = fl.quantize(x, granularity=granularity, block=block), fl.quantize(x, granularity=granularity)
    assert np.array_equal(got.data, want.data) and np.array_equal(got.scale, want.scale)
    assert got.block == want.block == (spec.MX_GROUP if granularity == "mx" else None)


def test_quantize_accepts_every_spelling_of_a_format(rng):
    x = _x(rng, (8,))
    want = fl.quantize(x, fmt="e5m2")
    for fmt in ("E5M2", " e5m2 ", "float8_e5m2", fl.E5M2):
        q = fl.quantize(x, fmt=fmt)
        assert q.fmt == "e5m2" and np.array_equal(q.data, want.data)


def test_quantize_float64_at_float32_max_is_in_range(rng):
    x = rng.standard_normal(6)
    x[2] = -F32_MAX  # the largest float32 magnitude: converts exactly
    q = fl.quantize(x)
    assert np.isfinite(q.scale).all() and q.data[2] == 0xFE  # -448


@pytest.mark.parametrize("granularity", ["tensor", "row", "tile", "block", "mx"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_quantize_nonfinite_poisons_its_group_and_warns_once(rng, numpy_warnings_fail, granularity, bad):
    """NaN or +-Inf poisons the group holding it (per tensor: the tensor): scale NaN, codes 0x7F; counted."""
    x = _with(_x(rng), (1, 35), bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = fl.quantize(x, granularity=granularity)
    assert [str(w.message)[:15] for w in caught] == ["x has NaN/Inf i"]  # ours; no NumPy warning
    assert q.nonfinite_groups == 1 and np.isnan(q.scale).sum() == 1
    if granularity == "tensor":
        assert (q.data == spec.POISON_CODE).all()


def test_quantize_device_input_is_not_scanned(rng, numpy_warnings_fail):
    """Documented: device arrays are not copied back to count NaN/Inf; the kernel poisons the tensor the same."""
    for bad in (np.nan, np.inf):
        q = fl.quantize(cuda.to_device(_with(_x(rng, (16,)), 5, bad)))
        assert np.isnan(q.scale.copy_to_host()).all() and (q.data.copy_to_host() == spec.POISON_CODE).all()
        assert q.nonfinite_groups is None


# ------------------------------------------------------------------------------------------------ QuantizedTensor

def _tile(rng):
    codes, scale, _ = spec.quantize(_x(rng, (3, 40)), "tile", block=16)
    return dict(data=codes, scale=scale, fmt="e4m3", granularity="tile", block=16)


CONSTRUCT = [
    (dict(fmt="nope"), ValueError, r"^fmt must be"),
    (dict(fmt=3), TypeError, r"^fmt must be"),
    (dict(fmt="e8m0"), ValueError, r"^fmt must be one of \('e4m3', 'e5m2'\)"),
    (dict(granularity="tiles"), ValueError, r"^granularity must be one of"),
    (dict(granularity=None), TypeError, r"^granularity must be one of"),
    (dict(block=0), ValueError, r"^block must be a positive int"),
    (dict(block=-16), ValueError, r"^block must be a positive int"),
    (dict(block=16.0), TypeError, r"^block must be a positive int"),
    (dict(block=4096), ValueError, r"^block must be at most 1024"),
    (dict(granularity="tensor"), ValueError, r"^block must be None for granularity 'tensor'"),
    (dict(granularity="row"), ValueError, r"^block must be None for granularity 'row'"),
    (dict(granularity="mx"), ValueError, r"^block must be 32 or None for granularity 'mx', got 16"),
    (dict(granularity="mx", block="32"), TypeError, r"^block must be 32 or None"),
    (dict(nonfinite_groups=-1), ValueError, r"^nonfinite_groups must be None or an int >= 0"),
    (dict(nonfinite_groups=1.0), TypeError, r"^nonfinite_groups must be None or an int >= 0"),
]


@pytest.mark.parametrize("change, exc, words", CONSTRUCT)
def test_quantized_tensor_constructor(rng, change, exc, words):
    with pytest.raises(exc, match=words):
        fl.QuantizedTensor(**{**_tile(rng), **change})


def test_quantized_tensor_normalizes_fmt_and_block(rng):
    fields = _tile(rng)
    assert fl.QuantizedTensor(**{**fields, "fmt": "E4M3"}).fmt == "e4m3"
    assert fl.QuantizedTensor(**{**fields, "fmt": fl.E5M2}).fmt == "e5m2"
    assert fl.QuantizedTensor(**{**fields, "block": None}).block == spec.GROUP_K  # None: 128 for tile and block
    assert fl.QuantizedTensor(**{**fields, "granularity": "mx", "block": None}).block == spec.MX_GROUP
    assert fl.QuantizedTensor(**{**fields, "granularity": "row", "block": None}).block is None


# --------------------------------------------------------------------------- dequantize, requantize_tile_to_col

# Fields changed after construction: checked again when the tensor is used.
FIELDS = [
    (dict(fmt="nope"), ValueError, r"^q\.fmt must be"),
    (dict(fmt=3), TypeError, r"^q\.fmt must be"),
    (dict(fmt="e8m0"), ValueError, r"^q\.fmt must be one of"),
    (dict(granularity="x"), ValueError, r"^q\.granularity must be one of"),
    (dict(block=0), ValueError, r"^q\.block must be a positive int, got 0"),
    (dict(block=-16), ValueError, r"^q\.block must be a positive int, got -16"),
    (dict(block=16.0), TypeError, r"^q\.block must be a positive int"),
    (dict(block=2048), ValueError, r"^q\.block must be at most 1024"),
    (dict(block=None), ValueError, r"^q\.scale must have shape \(3, 1\)"),  # None is 128: one tile per row
    (dict(data=np.ones((3, 40), np.float32)), TypeError, r"^q\.data must have dtype uint8"),
    (dict(data=[[1, 2]]), TypeError, r"^q\.data must have dtype uint8"),
    (dict(data=np.ones(40, np.uint8)), ValueError, r"^q\.data must be 2-D"),
    (dict(data=np.zeros((0, 40), np.uint8)), ValueError, r"^q\.data must not be empty"),
    (dict(scale=np.ones((3, 2), np.float32)), ValueError, r"^q\.scale must have shape \(3, 3\)"),
    (dict(scale=np.ones((3, 3))), TypeError, r"^q\.scale must have dtype float32"),
    (dict(data="codes"), TypeError, r"^q\.data must"),
]


def _tile_q(rng, **change):
    q = fl.QuantizedTensor(**_tile(rng))
    for k, v in change.items():
        setattr(q, k, v)
    return q


@pytest.mark.parametrize("change, exc, words", FIELDS)
def test_dequantize_checks_fields(rng, change, exc, words):
    with pytest.raises(exc, match=words):
        fl.dequantize(_tile_q(rng, **change))


@pytest.mark.parametrize("change, exc, words", FIELDS)
def test_requantize_checks_fields(rng, change, exc, words):
    with pytest.raises(exc, match=words):
        fl.requantize_tile_to_col(_tile_q(rng, **change))


@pytest.mark.parametrize(
    "change, exc, words",
    [
        (dict(granularity="tensor", block=None, scale=np.ones(2, np.float32)), ValueError,
         r"^q\.scale must have shape \(1,\)"),
        (dict(granularity="tensor", block=None, data=np.array(0x38, np.uint8), scale=np.ones(1, np.float32)),
         ValueError, r"^q\.data must have at least one dimension"),
        (dict(granularity="tensor"), ValueError, r"^q\.block must be None for granularity 'tensor'"),
        (dict(granularity="mx"), ValueError, r"^q\.block must be 32 or None"),
    ],
)
def test_dequantize_checks_other_granularities(rng, change, exc, words):
    with pytest.raises(exc, match=words):
        fl.dequantize(_tile_q(rng, **change))


@pytest.mark.parametrize("fn", [fl.dequantize, fl.requantize_tile_to_col])
@pytest.mark.parametrize("q", [np.ones((3, 4), np.uint8), None, dict(data=1)])
def test_q_must_be_a_quantized_tensor(fn, q):
    with pytest.raises(TypeError, match=r"^q must be a QuantizedTensor"):
        fn(q)


def test_requantize_options(rng):
    with pytest.raises(ValueError, match=r"^q must have granularity 'tile'"):
        fl.requantize_tile_to_col(fl.quantize(_x(rng), granularity="row"))
    with pytest.raises(TypeError, match=r"^pow2_scale must be a bool"):
        fl.requantize_tile_to_col(_tile_q(rng), pow2_scale="no")


def test_dequantize_and_requantize_nan_scale_poisons_the_group_only(rng, numpy_warnings_fail):
    """Documented: a NaN scale (a group that held NaN/Inf) dequantizes to NaN, the other groups are unaffected;
    re-quantized, it poisons the column groups it overlaps."""
    q = _tile_q(rng)
    want = fl.dequantize(q)
    q.scale = _with(q.scale, (1, 2), np.nan)
    y = fl.dequantize(q)
    nan = np.zeros(y.shape, bool)
    nan[1, 32:] = True
    assert np.isnan(y[nan]).all() and np.array_equal(y[~nan], want[~nan])
    qt = fl.requantize_tile_to_col(q)
    assert qt.data.shape == (40, 3) and np.isnan(qt.scale[32:]).all() and np.isfinite(qt.scale[:32]).all()


# ------------------------------------------------------------------------------------------------ DelayedScaling

@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(history_len=0), ValueError, r"^history_len must be a positive int"),
        (dict(history_len=2.5), TypeError, r"^history_len must be a positive int"),
        (dict(history_len=None), TypeError, r"^history_len must be a positive int"),
        (dict(algo="mean"), ValueError, r"^algo must be one of"),
        (dict(algo=None), TypeError, r"^algo must be one of"),
        (dict(margin=-1), ValueError, r"^margin must be >= 0 and <= 17 for fmt 'e4m3'"),
        (dict(margin=18), ValueError, r"^margin must be >= 0 and <= 17 for fmt 'e4m3'.*got 18"),
        (dict(margin=200), ValueError, r"^margin must be .*got 200"),
        (dict(margin=2000, fmt="e5m2"), ValueError, r"^margin must be >= 0 and <= 31 for fmt 'e5m2'"),
        (dict(margin=0.5), TypeError, r"^margin must be an int"),
        (dict(margin=True), TypeError, r"^margin must be an int"),
        (dict(fmt="e8m0"), ValueError, r"^fmt must be one of \('e4m3', 'e5m2'\)"),
        (dict(fmt="nope"), ValueError, r"^fmt must be"),
        (dict(fmt=3), TypeError, r"^fmt must be"),
    ],
)
def test_delayed_scaling_arguments(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.DelayedScaling(**kwargs)


@pytest.mark.parametrize(
    "method, arg, exc, words",
    [
        ("update", -1.0, ValueError, r"^amax must be >= 0"),
        ("update", "1", TypeError, r"^amax must be a number"),
        ("update", True, TypeError, r"^amax must be a number"),
        ("update", np.ones(2), TypeError, r"^amax must be a number"),
        ("scale_for", np.zeros(0, np.float32), ValueError, r"^x must not be empty"),
        ("scale_for", np.arange(3), TypeError, r"^x must have dtype"),
        ("scale_for", object(), TypeError, r"^x must be a NumPy array"),
        ("scale_for", "device", TypeError, r"^x must be a NumPy array"),
    ],
)
def test_delayed_scaling_inputs(rng, method, arg, exc, words):
    if isinstance(arg, str) and arg == "device":
        arg = cuda.to_device(_x(rng, (4,)))
    with pytest.raises(exc, match=words):
        getattr(fl.DelayedScaling(), method)(arg)


@pytest.mark.parametrize("fmt, want", [("E4M3", "e4m3"), ("float8_e5m2", "e5m2"), (fl.E5M2, "e5m2")])
def test_delayed_scaling_takes_every_spelling_of_a_format(rng, fmt, want):
    ds = fl.DelayedScaling(fmt=fmt)
    amax = float(rng.uniform(1, 100))
    ds.update(amax)
    assert ds.fmt == want and ds.scale == np.float32(amax / float(spec.FP8_MAX[want]))


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_scale_is_a_function_of_the_amaxes_alone(rng, algo):
    amaxes = [float(rng.uniform(1, 100)), 0.0, float("nan"), float(rng.uniform(1, 100)), float("inf"), 0.0, 0.0]
    read = fl.DelayedScaling(history_len=2, algo=algo)
    for n, a in enumerate(amaxes, 1):
        read.update(a)  # read after every update ...
        unread = fl.DelayedScaling(history_len=2, algo=algo)
        for b in amaxes[:n]:  # ... or only at the end: the same scale
            unread.update(b)
        assert read.scale == unread.scale, f"after {amaxes[:n]}"
    # zero and non-finite amaxes keep the scale before: the last finite history amax's
    assert unread.scale == np.float32(amaxes[3 if algo == "most_recent" else 0] / E4M3_MAX)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("amax", [1e-45, 1e-30, 3e38, 1e300])
def test_delayed_scaling_scale_stays_finite_and_nonzero(numpy_warnings_fail, fmt, amax):
    for margin in (0, MAX_MARGIN[fmt]):
        ds = fl.DelayedScaling(margin=margin, fmt=fmt)
        ds.update(amax)
        assert np.isfinite(ds.scale) and ds.scale > 0


def test_delayed_scaling_nonfinite_x_keeps_the_scale(rng):
    """Documented: NaN/Inf in x is recorded (as +Inf), and the scale stays where it was."""
    ds = fl.DelayedScaling(algo="most_recent")
    amax = float(rng.uniform(1, 100))
    ds.update(amax)
    for bad in (np.nan, np.inf):
        assert ds.scale_for(_with(_x(rng, (6,)), 2, bad)) == np.float32(amax / E4M3_MAX)
        assert ds.history[-1] == np.inf and ds.scale == np.float32(amax / E4M3_MAX)


# --------------------------------------------------------------------------------------------------------- gemm

def _ab(rng):
    return _x(rng, (3, 5)), _x(rng, (5, 4))


GEMM = [
    (lambda a, b: ("x", b), {}, TypeError, r"^a must have dtype float32"),
    (lambda a, b: (object(), b), {}, TypeError, r"^a must be a NumPy or CUDA device array"),
    (lambda a, b: (a.astype(np.float64), b), {}, TypeError, r"^a must have dtype float32"),
    (lambda a, b: (a, b.astype(np.int32)), {}, TypeError, r"^b must have dtype float32"),
    (lambda a, b: (a[0], b), {}, ValueError, r"^a must be 2-D"),
    (lambda a, b: (a, b[None]), {}, ValueError, r"^b must be 2-D"),
    (lambda a, b: (a, b[:4]), {}, ValueError, r"^a and b must have equal inner dimensions"),
    (lambda a, b: (a[:0], b), {}, ValueError, r"^a must not be empty"),
    (lambda a, b: (a, b[:, :0]), {}, ValueError, r"^b must not be empty"),
    (lambda a, b: (a, b), dict(out=np.ones((4, 3), np.float32)), ValueError, r"^out must have shape \(3, 4\)"),
    (lambda a, b: (a, b), dict(out=np.ones((3, 4))), TypeError, r"^out must have dtype float32"),
    (lambda a, b: (a, b), dict(version=[3]), TypeError, r"^version must be None or an int in"),
    (lambda a, b: (a, b), dict(version=7.0), TypeError, r"^version must be None or an int in"),
    (lambda a, b: (a, b), dict(version=True), TypeError, r"^version must be None or an int in"),
    (lambda a, b: (a, b), dict(version="1"), TypeError, r"^version must be None or an int in"),
    (lambda a, b: (a, b), dict(version=0), ValueError, r"^version must be None or an int in \(1, .*7\), got 0"),
    (lambda a, b: (a, b), dict(version=8), ValueError, r"^version must be None or an int in"),
]


@pytest.mark.parametrize("make, kwargs, exc, words", GEMM)
def test_gemm(rng, make, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.gemm(*make(*_ab(rng)), **kwargs)


def test_gemm_nonfinite_reaches_only_its_row(rng, numpy_warnings_fail):
    """Documented: NaN/Inf are not checked; they reach the outputs that use them."""
    a, b = _ab(rng)
    for bad in (np.nan, np.inf):
        y = fl.gemm(_with(a, (1, 2), bad), b, version=1)
        assert not np.isfinite(y[1]).any() and np.isfinite(np.delete(y, 1, axis=0)).all()


# ----------------------------------------------------------------------------------------------------- fp8_gemm

def _qq(rng, n=5):
    return fl.quantize(_x(rng, (4, 40))), fl.quantize(_x(rng, (n, 40)))


def _set(q, **change):
    q = dataclasses.replace(q)
    for k, v in change.items():
        setattr(q, k, v)
    return q


FP8_GEMM = [
    (lambda qa, qb: (object(), qb), {}, TypeError, r"^qa must be a QuantizedTensor"),
    (lambda qa, qb: (qa, qb.data), {}, TypeError, r"^qb must be a QuantizedTensor"),
    (lambda qa, qb: (_set(qa, fmt="nope"), qb), {}, ValueError, r"^qa\.fmt must be"),
    (lambda qa, qb: (qa, _set(qb, fmt="e8m0")), {}, ValueError, r"^qb\.fmt must be one of"),
    (lambda qa, qb: (qa, _set(qb, fmt=None)), {}, TypeError, r"^qb\.fmt must be"),
    (lambda qa, qb: (_set(qa, granularity="mx"), qb), {}, ValueError, r"^qa\.granularity must be one of"),
    (lambda qa, qb: (qa, _set(qb, data=qb.data.astype(np.int8))), {}, TypeError, r"^qb\.data must have dtype uint8"),
    (lambda qa, qb: (_set(qa, data=qa.data[0]), qb), {}, ValueError, r"^qa\.data must be 2-D"),
    (lambda qa, qb: (_set(qa, data=qa.data[:0]), qb), {}, ValueError, r"^qa\.data must not be empty"),
    (lambda qa, qb: (_set(qa, scale=np.ones(2, np.float32)), qb), {}, ValueError, r"^qa\.scale must have shape"),
    (lambda qa, qb: (qa, _set(qb, data=qb.data[:, :30])), {}, ValueError, r"^qa and qb must share K"),
    (lambda qa, qb: (qa, qb), dict(version=[3]), TypeError, r"^version must be None or an int in \(1, 2, 3, 4, 5, 6, 7\)"),
    (lambda qa, qb: (qa, qb), dict(version=2.0), TypeError, r"^version must be None or an int in"),
    (lambda qa, qb: (qa, qb), dict(version=True), TypeError, r"^version must be None or an int in"),
    (lambda qa, qb: (qa, qb), dict(version=9), ValueError, r"^version must be None or an int in \(1, 2, 3, 4, 5, 6, 7\), got 9"),
    (lambda qa, qb: (qa, qb), dict(accum_bits="13"), TypeError, r"^accum_bits must be None or an int"),
    (lambda qa, qb: (qa, qb), dict(accum_bits=40), ValueError, r"^accum_bits must be None or an int in 1\.\.23"),
    (lambda qa, qb: (qa, qb), dict(accum_bits=13, promote_every=48), ValueError, r"^promote_every must be"),
    (lambda qa, qb: (qa, qb), dict(promote_every=64), ValueError, r"^promote_every needs accum_bits"),
    (lambda qa, qb: (qa, qb), dict(out=np.ones((4, 5), np.float32)), TypeError, r"^out must be a device array"),
    (lambda qa, qb: (qa, qb), dict(out=cuda.device_array((5, 4), np.float32)), ValueError, r"^out must have shape"),
]


@pytest.mark.parametrize("make, kwargs, exc, words", FP8_GEMM)
def test_fp8_gemm(rng, make, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.fp8_gemm(*make(*_qq(rng)), **kwargs)


def test_fp8_gemm_tile_block_checks(rng):
    qa = fl.quantize(_x(rng, (2, 40)), granularity="tile", block=16)
    qb = fl.quantize(_x(rng, (3, 40)), granularity="block")
    with pytest.raises(ValueError, match=r"^qa\.block must be 128"):
        fl.fp8_gemm(qa, qb)


@pytest.mark.parametrize("version", [1, 3])
def test_fp8_gemm_nan_group_reaches_only_its_row(rng, numpy_warnings_fail, version):
    """Documented: a poisoned group (NaN scale and codes) makes the outputs that use it NaN, nothing else."""
    with pytest.warns(RuntimeWarning, match="NaN/Inf in 1 of"):
        qa = fl.quantize(_with(_x(rng, (2, 40)), (1, 3), np.inf), granularity="tile")
    qb = fl.quantize(_x(rng, (3, 40)), granularity="block")
    y = fl.fp8_gemm(qa, qb, version=version)
    assert np.isnan(y[1]).all() and np.isfinite(y[0]).all()


# ------------------------------------------------------------------------------------------------ encode, decode

@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        ((object(),), {}, TypeError, r"^x must be a real-valued array-like"),
        (("abc",), {}, TypeError, r"^x must be a real-valued array-like"),
        ((np.ones(3, np.complex64),), {}, TypeError, r"^x must be a real-valued array-like"),
        ((np.ones(3, bool),), {}, TypeError, r"^x must be a real-valued array-like"),
        (([[1.0], [2.0, 3.0]],), {}, TypeError, r"^x must be a real-valued array-like"),
        ((np.ones(3),), dict(fmt=3), TypeError, r"^fmt must be"),
        ((np.ones(3),), dict(fmt="e3m4"), ValueError, r"^fmt must be"),
        ((np.ones(3),), dict(saturate="yes"), TypeError, r"^saturate must be a bool"),
        ((np.ones(3),), dict(saturate=None), TypeError, r"^saturate must be a bool"),
    ],
)
def test_encode(args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.encode(*args, **kwargs)


def test_encode_shapes_empty_and_nonfinite(rng):
    """Documented: any shape (0-d and empty too); NaN/Inf and overflow follow the table in fp8lab.numerics.formats."""
    v = float(rng.uniform(1, 2))
    assert fl.encode(v).shape == () and fl.encode(v) == fl.encode([v])[0]
    assert fl.encode(np.zeros((0, 3))).shape == (0, 3) and fl.encode([]).dtype == np.uint8
    x = np.array([np.nan, np.inf, -np.inf, 1e300, -v * 1e5])  # the last overflows E4M3 and E5M2
    assert fl.encode(x).tolist() == [0x7F, 0x7E, 0xFE, 0x7E, 0xFE]  # saturating
    assert fl.encode(x, saturate=False).tolist() == [0x7F, 0x7F, 0xFF, 0x7F, 0xFF]  # E4M3 has no Inf
    assert fl.encode(x, "e5m2", saturate=False).tolist() == [0x7E, 0x7C, 0xFC, 0x7C, 0xFC]


@pytest.mark.parametrize(
    "args, kwargs, exc, words",
    [
        (([1.0, 2.0],), {}, TypeError, r"^codes must be an integer"),
        (("ab",), {}, TypeError, r"^codes must be an integer"),
        ((object(),), {}, TypeError, r"^codes must be an integer"),
        ((np.array([1, 256]),), {}, ValueError, r"^codes must lie in 0\.\.255, got values from 1 to 256"),
        (([-1, 3],), {}, ValueError, r"^codes must lie in 0\.\.255"),
        ((np.arange(3, dtype=np.uint8),), dict(fmt="nope"), ValueError, r"^fmt must be"),
        ((np.arange(3, dtype=np.uint8),), dict(fmt=None), TypeError, r"^fmt must be"),
    ],
)
def test_decode(args, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.decode(*args, **kwargs)


def test_decode_shapes_empty_and_nan_codes(rng):
    """Documented: any shape (0-d and empty too); NaN codes decode to NaN."""
    c = rng.integers(0, 0x7F, 5).astype(np.uint8)
    assert fl.decode(c[0]) == fl.decode(c)[0] and np.shape(fl.decode(c[0])) == ()
    empty = fl.decode(np.zeros((2, 0), np.uint8))
    assert empty.shape == (2, 0) and empty.dtype == np.float32
    assert np.isnan(fl.decode([0x7F, 0xFF])).all() and np.isnan(fl.decode([0x7E], "e5m2")).all()
    assert fl.decode([0x7C], "e5m2")[0] == np.inf
