"""fp8lab.kernels.fp8_gemm (FP8 NT GEMM with 1x128 / 128x128 scales) and fp8lab.numerics.accum (the accumulator model).

Kernel tests: fresh random inputs, odd shapes (M, N, K not multiples of 8, 32 or 128, so every partial tile
and partial K-group is exercised), outputs poisoned with NaN before the launch, NaN counted as failure.

Why bit-exact: both kernel versions and `fp8_gemm.reference` add the same float32 values in the same order
(products in k order inside each K-group of 128, then acc = acc + partial * (sa * sb) group by group; the
limited accumulator in the same groups of 32). A product of two FP8 values is exact in float32 (at most
4 x 4 significant bits, exponents far inside float32's range), so fusing it with the add (an FMA) changes
nothing; the limited-accumulator steps are exact integer arithmetic. Under the simulator nothing else is
fused, so the results must agree bit for bit. On a GPU the compiler may also fuse `acc + partial * s` (the
scale step, whose product is not exact): one rounding instead of two per K-group, hence a tolerance of a few
float32 roundings per K-group there, and the FP32 error bound against float64 in every case.

Test inputs come from the NumPy spec (fp8lab.numerics.spec.quantize "tile" / "block", mode "amax": inv = 448 / amax,
codes = encode(x * inv), scale = amax / 448, float32), the layouts of fp8lab.quantize's "tile" and "block".
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.numerics import accum, formats, spec
from fp8lab.device import runtime
from fp8lab.bench import poisoned
from fp8lab.kernels import common
from fp8lab.kernels import fp8_gemm as fg
from fp8lab.device.runtime import cuda


class Q:
    """Duck-typed QuantizedTensor."""

    def __init__(self, data, scale, granularity, fmt="e4m3", block=128):
        self.data, self.scale, self.granularity, self.fmt, self.block = data, scale, granularity, fmt, block


def quantize(x, granularity):
    x = np.asarray(x, np.float32)
    if granularity in ("tile", "block"):
        codes, scale = spec.quantize(x, granularity)[:2]
    else:
        amax = np.float32(max(np.abs(x).max(), np.float32(1e-12)))
        codes = formats.encode((x * (np.float32(448) / amax)).astype(np.float32))
        scale = np.array([amax / np.float32(448)], np.float32)
    return Q(codes, scale, granularity)


def operands(rng, M, N, K, ga, gb):
    # heavy-ish tails and a different magnitude per row, so that the scales really differ between groups
    a = rng.standard_normal((M, K), dtype=np.float32) * rng.uniform(0.1, 10, (M, 1)).astype(np.float32)
    b = rng.standard_normal((N, K), dtype=np.float32) * rng.uniform(0.1, 10, (1, K)).astype(np.float32)
    return quantize(a, ga), quantize(b, gb)


def run(qa, qb, version, accum_bits=None, promote_every=None):
    M, N = qa.data.shape[0], qb.data.shape[0]
    out = poisoned((M, N), np.float32)
    da = Q(cuda.to_device(qa.data), cuda.to_device(qa.scale), qa.granularity, qa.fmt)
    db = Q(cuda.to_device(qb.data), cuda.to_device(qb.scale), qb.granularity, qb.fmt)
    ret = fg.fp8_gemm(da, db, accum_bits, promote_every, out=out, version=version)
    assert ret is out
    got = out.copy_to_host()
    assert not np.isnan(got).any(), "NaN in the output (an element was not written)"
    return got


def assert_matches_reference(got, ref, qa, qb):
    if runtime.IS_SIM:  # same values, same order: bit for bit (see the module docstring)
        bad = np.argwhere(got != ref)
        assert not len(bad), f"{len(bad)} elements differ, first at {tuple(bad[0])}: {got[tuple(bad[0])]!r} " \
                             f"vs {ref[tuple(bad[0])]!r}"
    else:  # a GPU may fuse acc + partial * s: at most a few float32 roundings per K-group of 128
        tol = fg.fma_tolerance(qa, qb)  # relative to sum |a b|: partial sums may cancel
        err = np.abs(got.astype(np.float64) - ref)
        assert (err <= tol).all(), f"max error {err.max():.3g}"


GRANS = [("tile", "block"), ("tensor", "tensor"), ("block", "tile"), ("tile", "tensor")]


def sizes(small, big):
    return [pytest.param(small, id="small"), pytest.param(big, id="big", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("version", sorted(set(fg.VERSIONS) - {4, 7}))
@pytest.mark.parametrize("grans", GRANS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("mnk", sizes((5, 9, 300), (2048, 2053, 2055)))
def test_fp32_accumulation(rng, version, grans, mnk):
    check_version(rng, version, grans, mnk)


# version 7 runs version 6's tile code (one device function): under the simulator two scale pairings suffice
@pytest.mark.parametrize("grans", GRANS[:2] if runtime.IS_SIM else GRANS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("mnk", sizes((5, 9, 300), (2048, 2053, 2055)))
def test_fp32_accumulation_v7(rng, grans, mnk):
    check_version(rng, 7, grans, mnk)


# version 4's twin pays a warp barrier per mma under the simulator (~20 s a block): two scale pairings there
@pytest.mark.slow
@pytest.mark.parametrize("grans", [GRANS[0], GRANS[2]] if runtime.IS_SIM else GRANS, ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("mnk", sizes((5, 9, 300), (2048, 2053, 2055)))
def test_fp32_accumulation_v4(rng, grans, mnk):
    check_version(rng, 4, grans, mnk)


def check_version(rng, version, grans, mnk):
    qa, qb = operands(rng, *mnk, *grans)
    assert_correct(run(qa, qb, version), qa, qb, version)


def assert_correct(got, qa, qb, version):
    (M, K), N = qa.data.shape, qb.data.shape[0]
    # against float64: FP32 rounding error only (one rounding per add and per scale step); on a GPU the
    # tensor-core versions add what their accumulator loses inside a K-group
    err = np.abs(got.astype(np.float64) - fg.reference64(qa, qb))
    tc = version in fg.TENSOR_CORE_VERSIONS and not runtime.IS_SIM
    bound = fg.tensor_core_bound(qa, qb) if tc else fg.error_bound(qa, qb)
    assert (err <= bound).all(), f"max error {err.max():.3g}"
    # versions 1 and 2 (and the twins of 4-6) add in the reference's order; version 3 scales the operands
    in_order = version in fg.LIMITED_VERSIONS or (version in fg.TENSOR_CORE_VERSIONS and runtime.IS_SIM)
    if in_order and (runtime.IS_SIM or M * N * K < 1e8):  # slow NumPy at 2048^3
        assert_matches_reference(got, fg.reference(qa, qb), qa, qb)


@pytest.mark.parametrize("version", fg.LIMITED_VERSIONS)
@pytest.mark.parametrize("grans,accum_bits,promote", [
    (("tile", "block"), 13, 128),
    (("tile", "block"), 13, 32),
    (("tile", "block"), 13, None),     # None means 128 with fine-grained scales
    (("tensor", "tensor"), 13, None),  # no promotion at all: one limited sum over K
    (("tensor", "tensor"), 13, 256),
    (("tensor", "tensor"), 5, 64),     # few bits: every truncation path is busy
], ids=str)
@pytest.mark.parametrize("mnk", sizes((5, 9, 300), (200, 300, 4100)))
def test_limited_accumulation(rng, version, grans, accum_bits, promote, mnk):
    M, N, K = mnk
    qa, qb = operands(rng, M, N, K, *grans)
    got = run(qa, qb, version, accum_bits, promote)
    assert_matches_reference(got, fg.reference(qa, qb, accum_bits, promote), qa, qb)


@pytest.mark.parametrize("version", fg.LIMITED_VERSIONS)
@pytest.mark.parametrize("promote", [None, 64])
def test_kernel_equals_accum_model_bit_for_bit(rng, version, promote):
    # unit per-tensor scales: the kernel computes exactly accum.dot_limited (multiplying by 1 is exact, even fused)
    M, N, K = 3, 7, 333
    codes_a = rng.integers(0, 0x7E, (M, K), dtype=np.uint8) | (rng.integers(0, 2, (M, K), dtype=np.uint8) << 7)
    codes_b = rng.integers(0, 0x7E, (N, K), dtype=np.uint8) | (rng.integers(0, 2, (N, K), dtype=np.uint8) << 7)
    one = np.ones(1, np.float32)
    got = run(Q(codes_a, one, "tensor"), Q(codes_b, one, "tensor"), version, 13, promote)
    want = accum.dot_limited(formats.decode(codes_a), formats.decode(codes_b), 13, promote_every=promote)
    assert np.array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("K", [301, 264], ids=["bytes", "uint32"])
def test_v3_several_blocks_and_both_load_paths(rng, K):
    # 130 x 136: 2 x 2 block tiles, partial ones at the edges; K % 4 != 0 reads codes byte by byte, K % 4 == 0
    # as uint32 (the edges still bytewise); 264 and 301 end inside a K-group, so the last group is partial
    qa, qb = operands(rng, 130, 136, K, "tile", "block")
    assert common.vec_ok(cuda.to_device(qa.data), 4) == int(K % 4 == 0)
    got = run(qa, qb, 3)
    err = np.abs(got.astype(np.float64) - fg.reference64(qa, qb))
    assert (err <= fg.error_bound(qa, qb)).all(), f"max error {err.max():.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("version,M,N,K", [
    (5, 130, 136, 272),  # 2 x 2 blocks, K a multiple of 16: cp.async with a partial last K-group
    (5, 130, 136, 301),  # rows not 16-byte aligned: byte loads
    (5, 64, 40, 700),    # 6 K-groups: the 4-stage pipeline wraps around
    (4, 5, 9, 272),
    (4, 20, 7, 520),     # 5 K-groups through 3 stages
    (6, 130, 136, 272),
    (6, 130, 136, 301),
    (6, 64, 40, 700),    # 6 K-groups: both halves of the p0 / p1 loop, the pipeline wraps
], ids=str)
def test_tensor_core_versions_blocks_and_load_paths(rng, version, M, N, K):
    qa, qb = operands(rng, M, N, K, "tile", "block")
    assert common.vec_ok(cuda.to_device(qa.data), 16) == int(K % 16 == 0)
    assert_correct(run(qa, qb, version), qa, qb, version)


@pytest.mark.parametrize("version,words", [(4, "per-tensor"), (5, "per-tensor"), (6, "versions 4 and 5"),
                                           (7, "versions 4 and 5")])
def test_tensor_core_without_promotion_needs_tensor_scales(rng, version, words):
    qa, qb = operands(rng, 5, 9, 300, "tile", "block")
    with pytest.raises(ValueError, match=words):
        fg.launch(cuda.to_device(qa.data), cuda.to_device(qa.scale), cuda.to_device(qb.data),
                  cuda.to_device(qb.scale), cuda.device_array((5, 9), np.float32), 1, 2, version=version,
                  tc_promote=False)


# ---------------------------------------------------------------------------------------------------------------
# version 7: version 6 persistent, a grid of `sms` blocks looping over the output tiles
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("M,N,K,sms", [
    (300, 9, 100, 1),     # 3 tiles, one block computes all of them
    (300, 9, 140, 2),     # 3 tiles on 2 blocks: sms does not divide the tile count; 2 K-groups (p0 and p1)
    (20, 136, 100, 3),    # 1 x 2 tiles on 3 blocks: one block finds no tile; tiles wrap along N
], ids=str)
def test_persistent_version_for_any_sms(rng, M, N, K, sms):
    qa, qb = operands(rng, M, N, K, "tile", "block")
    out = poisoned((M, N), np.float32)
    da = Q(cuda.to_device(qa.data), cuda.to_device(qa.scale), "tile")
    db = Q(cuda.to_device(qb.data), cuda.to_device(qb.scale), "block")
    assert fg.fp8_gemm(da, db, out=out, version=7, sms=sms) is out
    got = out.copy_to_host()
    assert not np.isnan(got).any(), "NaN in the output (a tile was not written)"
    assert_correct(got, qa, qb, 7)  # bit-exact with `reference` under the simulator, like version 6


@pytest.mark.parametrize("sms,exc,words", [
    (0, ValueError, r"^sms must be None or an int in 1\.\.\d+ \(this device's SMs\), got 0$"),
    (10**6, ValueError, r"^sms must be None or an int in 1\.\.\d+"),
    (-3, ValueError, r"^sms must be None or an int in 1\.\."),
    (2.0, TypeError, r"^sms must be None or an int in 1\.\.\d+ \(this device's SMs\), got float"),
    (True, TypeError, r"^sms must be None or an int"),
    ("8", TypeError, r"^sms must be None or an int"),
])
def test_sms_errors_name_the_argument(rng, sms, exc, words):
    qa, qb = _ok(rng)
    with pytest.raises(exc, match=words):
        fg.fp8_gemm(qa, qb, version=7, sms=sms)


@pytest.mark.parametrize("version", [None, 3, 6])
def test_sms_needs_the_persistent_version(rng, version):
    qa, qb = _ok(rng)
    with pytest.raises(ValueError, match=r"^sms \(a persistent grid of that many blocks\) needs version in \(7,\)"):
        fg.fp8_gemm(qa, qb, version=version, sms=4)


def test_sms_limit_is_the_device(monkeypatch):
    assert fg.device_sms() == (fg.SIM_SMS if runtime.IS_SIM else cuda.get_current_device().MULTIPROCESSOR_COUNT)
    assert fg.check_sms(None, 7) == fg.device_sms() and fg.check_sms(1, 7) == 1
    assert fg.check_sms(fg.device_sms(), 7) == fg.device_sms() and fg.check_sms(None, 6) is None
    monkeypatch.setattr(fg.host, "device_sms", lambda: 20)  # where check_sms reads it
    with pytest.raises(ValueError, match=r"1\.\.20 \(this device's SMs\), got 21"):
        fg.check_sms(21, 7)
    assert fg.tiles(129, 128) == 2 and fg.tiles(1, 1) == 1 and fg.tiles(300, 300) == 9


def test_stream_only_for_versions_6_and_7(rng):
    qa, qb = operands(rng, 5, 9, 140, "tile", "block")
    with pytest.raises(ValueError, match="stream is implemented by versions 6 and 7, got version 5"):
        fg.launch(cuda.to_device(qa.data), cuda.to_device(qa.scale), cuda.to_device(qb.data),
                  cuda.to_device(qb.scale), cuda.device_array((5, 9), np.float32), 1, 2, version=5,
                  stream=cuda.stream())


@pytest.mark.parametrize("version", [4, 5])
def test_tensor_core_without_promotion_sums_all_of_k(rng, version):
    # per-tensor scales: one accumulator over K; the twin's FP32 k-order sum over all of K (no group restarts)
    qa, qb = operands(rng, 5, 9, 300, "tensor", "tensor")
    out = poisoned((5, 9), np.float32)
    fg.launch(cuda.to_device(qa.data), cuda.to_device(qa.scale.reshape(1, 1)), cuda.to_device(qb.data),
              cuda.to_device(qb.scale.reshape(1, 1)), out, 0, 0, version=version, tc_promote=False)
    got = out.copy_to_host()
    assert not np.isnan(got).any()
    if runtime.IS_SIM:
        A, B = formats.decode(qa.data).astype(np.float32), formats.decode(qb.data).astype(np.float32)
        acc = np.zeros((5, 9), np.float32)
        for k in range(300):
            acc = acc + np.outer(A[:, k], B[:, k])
        want = acc * (qa.scale[0] * qb.scale[0])
        assert np.array_equal(got, want)
    else:
        err = np.abs(got.astype(np.float64) - fg.reference64(qa, qb))
        assert (err <= 2.0**-7 * fg.abs_product(qa, qb)).all()


@pytest.mark.parametrize("version", [3, *fg.TENSOR_CORE_VERSIONS])
def test_e5m2_operand(rng, version):
    a = rng.standard_normal((7, 140), dtype=np.float32)
    qa = quantize(a, "tile")
    b = rng.standard_normal((10, 140), dtype=np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True).astype(np.float32)
    codes = formats.encode((b * (np.float32(57344) / amax)).astype(np.float32), formats.E5M2)
    scale = np.repeat(amax / np.float32(57344), 2, axis=1).astype(np.float32)
    qb = Q(codes, scale, "tile", fmt="e5m2")
    assert_correct(run(qa, qb, version), qa, qb, version)


def test_accepts_fp8lab_quantized_tensor(rng):
    import fp8lab as fl

    a = rng.standard_normal((6, 130), dtype=np.float32)
    b = rng.standard_normal((10, 130), dtype=np.float32)
    qa, qb = fl.quantize(a), fl.quantize(b)
    y = fg.fp8_gemm(qa, qb, version=1)
    assert isinstance(y, np.ndarray) and y.shape == (6, 10) and y.dtype == np.float32
    # bit for bit under the simulator, within the FMA tolerance on a GPU (assert_matches_reference picks)
    assert_matches_reference(y, fg.reference(qa, qb), qa, qb)
    err = np.abs(y.astype(np.float64) - fg.reference64(qa, qb))
    assert (err <= fg.error_bound(qa, qb)).all(), f"max error {err.max():.3g}"


# ---------------------------------------------------------------------------------------------------------------
# input validation: every error names the argument
# ---------------------------------------------------------------------------------------------------------------


def _ok(rng):
    return operands(rng, 4, 5, 200, "tile", "block")


@pytest.mark.parametrize("mutate,exc,words", [
    (lambda qa, qb: (object(), qb), TypeError, "qa must be a QuantizedTensor"),
    (lambda qa, qb: (Q(qa.data, qa.scale, "mx"), qb), ValueError, "qa.granularity"),
    (lambda qa, qb: (qa, Q(qb.data, qb.scale, "block", fmt="e8m0")), ValueError, "qb.fmt"),
    (lambda qa, qb: (Q(qa.data, qa.scale, "tile", block=64), qb), ValueError, "qa.block"),
    (lambda qa, qb: (Q(qa.data.astype(np.int16), qa.scale, "tile"), qb), TypeError, "qa.data"),
    (lambda qa, qb: (Q(qa.data, qa.scale[:, :1], "tile"), qb), ValueError, "qa.scale"),
    (lambda qa, qb: (qa, Q(qb.data, qb.scale.astype(np.float64), "block")), TypeError, "qb.scale"),
    (lambda qa, qb: (qa, Q(qb.data[:, :100], qb.scale[:, :1], "block")), ValueError, "share K"),
])
def test_errors_name_the_argument(rng, mutate, exc, words):
    qa, qb = mutate(*_ok(rng))
    with pytest.raises(exc, match=words):
        fg.fp8_gemm(qa, qb)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(accum_bits=0), ValueError, "accum_bits"),
    (dict(accum_bits=24), ValueError, "accum_bits"),
    (dict(accum_bits=13.0), TypeError, "accum_bits"),
    (dict(accum_bits=13, promote_every=48), ValueError, "promote_every"),
    (dict(accum_bits=13, promote_every=256), ValueError, "promote_every must divide 128"),
    (dict(promote_every=128), ValueError, "promote_every needs accum_bits"),
    (dict(version=8), ValueError, "version"),
    (dict(version=3, accum_bits=13), ValueError, "version 3 accumulates in FP32 only"),
    (dict(out=np.zeros((4, 5), np.float32)), TypeError, "out must be a device array"),
    (dict(out="x"), TypeError, "out"),
])
def test_option_errors_name_the_argument(rng, kwargs, exc, words):
    qa, qb = _ok(rng)
    with pytest.raises(exc, match=words):
        fg.fp8_gemm(qa, qb, **kwargs)


def test_out_shape_checked(rng):
    qa, qb = _ok(rng)
    with pytest.raises(ValueError, match="out must have shape"):
        fg.fp8_gemm(qa, qb, out=cuda.device_array((5, 4), np.float32))


# ---------------------------------------------------------------------------------------------------------------
# fp8lab.numerics.accum: properties of the model
# ---------------------------------------------------------------------------------------------------------------


def fp8_values(rng, shape, dist="uniform"):
    x = rng.random(shape, dtype=np.float32) if dist == "uniform" else rng.standard_normal(shape, dtype=np.float32)
    return formats.decode(spec.quantize(x, "tile")[0])


def rel_err(y, a, b):
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    return np.abs(y.astype(np.float64) - exact) / np.abs(exact)


def test_accum_none_is_float32_summation(rng):
    a, b = fp8_values(rng, (4, 1000)), fp8_values(rng, (6, 1000))
    y = accum.dot_limited(a, b, accum_bits=None)
    want = np.zeros((4, 6), np.float32)
    for k in range(1000):  # the same float32 sum written plainly
        want = want + (a[:, k:k + 1] * b[:, k])
    assert np.array_equal(y, want)
    assert rel_err(y, a, b).max() < 1000 * 2.0**-24


def test_accum_bits_23_is_close_to_fp32(rng):
    a, b = fp8_values(rng, (8, 2048)), fp8_values(rng, (8, 2048))
    e23 = rel_err(accum.dot_limited(a, b, 23), a, b).max()
    e32 = rel_err(accum.dot_limited(a, b, None), a, b).max()
    # truncation instead of rounding: biased, a few times FP32's error, far below FP22's
    assert e23 < 2048 / 32 * 2.0**-22 and e23 < 50 * max(e32, 2.0**-24)
    assert e23 < rel_err(accum.dot_limited(a, b, 13), a, b).max() / 100


def test_error_grows_with_k_without_promotion_and_promotion_fixes_it(rng):
    a, b = fp8_values(rng, (8, 4096)), fp8_values(rng, (8, 4096))
    errs = [rel_err(accum.dot_limited(a[:, :k], b[:, :k], 13), a[:, :k], b[:, :k]).mean() for k in (256, 1024, 4096)]
    assert errs[0] < errs[1] < errs[2], errs
    assert errs[2] > 10 * errs[0]  # truncation errors pile up: about linearly in K for positive inputs
    promoted = rel_err(accum.dot_limited(a, b, 13, promote_every=128), a, b)
    assert promoted.max() < errs[2] / 20
    assert promoted.max() < 2.0**-13 * 16  # a few FP22 truncations per promoted chunk, whatever K is
    coarser = rel_err(accum.dot_limited(a, b, 13, promote_every=512), a, b)
    assert promoted.mean() < coarser.mean()


def test_limited_step_is_exact_alignment_and_truncation():
    # 1 + 2^-14 + 2^-14: with 13 mantissa bits, 2^-14 is below the last kept bit of 1.0 (2^-13): both vanish
    a = np.array([[1.0, 2.0**-7, 2.0**-7]], np.float32)
    b = np.array([[1.0, 2.0**-7, 2.0**-7]], np.float32)
    assert accum.dot_limited(a, b, 13)[0, 0] == 1.0
    assert accum.dot_limited(a, b, 14)[0, 0] == 1.0 + 2.0**-13
    assert accum.dot_limited(a, b, None)[0, 0] == np.float32(1.0 + 2.0**-13)
    # truncation is toward zero for negative sums too
    assert accum.dot_limited(-a, b, 13)[0, 0] == -1.0
    # zeros take no part in the alignment
    z = np.zeros((1, 64), np.float32)
    z[0, 40] = 0.25
    assert accum.dot_limited(z, z, 3)[0, 0] == 0.0625


def test_accum_errors_name_the_argument():
    a = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="accum_bits"):
        accum.dot_limited(a, a, 30)
    with pytest.raises(ValueError, match="promote_every"):
        accum.dot_limited(a, a, 13, promote_every=100)
    with pytest.raises(ValueError, match="share K"):
        accum.dot_limited(a, a[:, :32])
    with pytest.raises(ValueError, match="ks"):
        accum.error_vs_k(ks=(100,))
    with pytest.raises(ValueError, match="dist"):
        accum.error_vs_k(ks=(64,), dist="cauchy")


def test_error_vs_k_shape_and_ordering(rng):
    r = accum.error_vs_k(ks=(256, 1024), trials=1, size=8, promote_every_list=(32, 128), rng=rng)
    c = r["curves"]
    assert set(c) == {"FP32", "FP22 (no promotion)", "promote every 32", "promote every 128"}
    assert c["FP22 (no promotion)"]["mean"][1] > c["promote every 128"]["mean"][1] > c["FP32"]["mean"][1]
    assert c["promote every 32"]["mean"][1] <= c["promote every 128"]["mean"][1]


# ---------------------------------------------------------------------------------------------------------------
# GPU: realistic shapes (run with a CUDA device; skipped under the simulator)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_deepseek_like_shape_fp32_bound(rng):
    M, N, K = 2048, 7168, 4096
    qa, qb = operands(rng, M, N, K, "tile", "block")
    got = run(qa, qb, fg.BEST)
    err = np.abs(got.astype(np.float64) - fg.reference64(qa, qb))
    bound = fg.tensor_core_bound(qa, qb) if fg.BEST in fg.TENSOR_CORE_VERSIONS else fg.error_bound(qa, qb)
    assert (err <= bound).all(), f"max error {err.max():.3g}"
    err1 = np.abs(run(qa, qb, 1).astype(np.float64) - fg.reference64(qa, qb))
    assert (err1 <= fg.error_bound(qa, qb)).all(), f"v1: max error {err1.max():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("sms", [None, 112, 7])  # every SM, DeepSeek-V3's 132 - 20, and a count dividing nothing
def test_gpu_persistent_equals_version_6_bit_for_bit(rng, sms):
    # the same tile code (one device function, the same float instructions in the PTX): the same bits as version 6,
    # whichever block computes a tile; 34 x 56 tiles, K = 4096 (32 K-groups), edges partial in M and N
    M, N, K = 4300, 7100, 4096
    qa, qb = operands(rng, M, N, K, "tile", "block")
    da = Q(cuda.to_device(qa.data), cuda.to_device(qa.scale), "tile")
    db = Q(cuda.to_device(qb.data), cuda.to_device(qb.scale), "block")
    y6 = poisoned((M, N), np.float32)
    y7 = poisoned((M, N), np.float32)
    fg.fp8_gemm(da, db, out=y6, version=6)
    fg.fp8_gemm(da, db, out=y7, version=7, sms=sms)
    got6, got7 = y6.copy_to_host(), y7.copy_to_host()
    assert not np.isnan(got7).any()
    bad = np.argwhere(got7 != got6)
    assert not len(bad), f"{len(bad)} elements differ from version 6, first at {tuple(bad[0])}"
    if sms is None:  # once against float64 (slow in NumPy at this size)
        err = np.abs(got7.astype(np.float64) - fg.reference64(qa, qb))
        assert (err <= fg.tensor_core_bound(qa, qb)).all(), f"max error {err.max():.3g}"


@pytest.mark.parametrize("cc, best, refused", [
    ((9, 0), 6, ()),          # H100 / H200 / H800: wgmma
    ((8, 9), 4, (5, 6, 7)),      # Ada: FP8 mma.sync, no wgmma
    ((10, 0), 4, (5, 6, 7)),     # Blackwell: no wgmma (sm_90a only)
    ((8, 0), 3, (4, 5, 6, 7)),   # A100: no FP8 tensor-core instruction
], ids=str)
def test_default_version_and_refusals_follow_the_device(monkeypatch, cc, best, refused):
    monkeypatch.setattr(runtime, "compute_capability", lambda: cc)
    assert fg.best_version() == best
    for v in fg.VERSIONS:
        if v in refused:
            with pytest.raises(ValueError, match=rf"^version {v} runs .*compute capability {cc[0]}\.{cc[1]}"):
                fg.check_device(v)
        else:
            fg.check_device(v)
