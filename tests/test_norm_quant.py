"""Fused bias + RMSNorm + 1x128 E4M3 tile quantization (fp8lab/kernels/norm_quant/) and its backward.

Only rstd depends on the order of a kernel's additions, so it is checked against float64 with a tolerance; given the
rstd a kernel wrote, its codes, scales and z are checked bit for bit against the NumPy reference. dx and gy are
checked against float64 with tolerances from float32 error bounds. Fresh random inputs with a spread of magnitudes
(rows over six decades, outliers, gains of both signs), shapes that are not multiples of 128 (nor of 4: the scalar
path), with and without bias, outputs poisoned before every launch. Small shapes run on the simulator; realistic
ones are marked `gpu`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.numerics import formats, spec
from fp8lab.bench import assert_close, assert_codes_equal, poisoned
from fp8lab.kernels import elementwise
from fp8lab.kernels import norm_quant as nq
from fp8lab.kernels.norm_quant import host as nq_host
from fp8lab.device import runtime
from fp8lab.device.runtime import cuda

U = 2.0**-24  # float32's unit roundoff
# (M, N, bias, z asked for): N = 300 takes the 16-byte path, 129 the scalar path, 200 a partial tile of 72
SMALL = [(5, 300, True, True), (4, 129, False, True), (3, 200, True, False)]
BIG = [(4099, 7168, True, True), (1027, 7171, False, True), (16384, 1024, True, False)]


def shapes(small, big):
    return ([pytest.param(s, id="x".join(map(str, s[:2])) + ("-bias" if s[2] else "")) for s in small]
            + [pytest.param(s, id="big-" + "x".join(map(str, s[:2])), marks=pytest.mark.gpu) for s in big])


def to_device(*arrays):
    return tuple(None if a is None else cuda.to_device(a) for a in arrays)


def launch_forward(x, b, g, version, *, with_z=True, threads=None):
    """forward on poisoned outputs: host (codes, scales, rstd, z or None)."""
    M, N = x.shape
    codes, scales = poisoned((M, N), np.uint8), poisoned((M, -(-N // 128)), np.float32)
    rstd = poisoned(M, np.float32)
    z = poisoned((M, N), np.float32) if with_z else None
    nq.forward(*to_device(x, b, g), codes, scales, rstd, z, version=version, threads=threads)
    return codes.copy_to_host(), scales.copy_to_host(), rstd.copy_to_host(), None if z is None else z.copy_to_host()


def check_forward(x, b, g, codes, scales, rstd, z):
    """rstd against float64; codes, scales, z bit for bit against the reference given that rstd; each nonzero tile's
    largest code decodes to +-448."""
    assert_close("rstd", rstd, nq.reference_rstd(x, b), atol=0, rtol=nq.RSTD_RTOL)
    ref_codes, ref_scales, _, ref_z = nq.reference(x, b, g, rstd)
    assert_codes_equal("codes", codes, ref_codes)
    assert scales.shape == ref_scales.shape and np.array_equal(scales, ref_scales, equal_nan=True), "scales differ"
    if z is not None:
        assert np.array_equal(z, ref_z, equal_nan=True), "z differs from (y * rstd) * g in float32"
        # and z is the float64 RMSNorm within rstd's tolerance plus y * rstd * g's two roundings
        y = (x if b is None else x + b).astype(np.float64)  # y = x + b rounded to float32, as the kernels do
        ref64 = y * nq.reference_rstd(x, b)[:, None] * g.astype(np.float64)
        assert_close("z against float64", z, ref64, atol=0, rtol=nq.RSTD_RTOL + 4 * U)
    finite = np.isfinite(scales) & (scales > spec.group_scale(np.float32(0))[0])
    tile_max = spec.group_amax(formats.decode(codes), 1, 128)
    assert (tile_max[finite] == 448).all(), "a tile's largest |z| must encode to 448"


# ------------------------------------------------------------------------------------------------------ forward


@pytest.mark.parametrize("version", sorted(nq.VERSIONS))
@pytest.mark.parametrize("shape", shapes(SMALL, BIG))
def test_forward_bit_exact(rng, version, shape):
    M, N, bias, with_z = shape
    x, b, g, _ = nq.make_inputs(rng, M, N, bias)
    check_forward(x, b, g, *launch_forward(x, b, g, version, with_z=with_z))


@pytest.mark.parametrize("version, threads, bias", [(2, 64, True), (2, 96, False), (1, 64, False), (3, 64, True),
                                                    (3, 96, False), (4, 96, True)])
def test_forward_several_warps(rng, version, threads, bias):
    """Blocks of 2-3 warps (versions 1-3 run one warp a row under the simulator by default): 9 tiles = 3 sets, the last
    set partial and a warp without tiles at 96 threads; the block reduction meets in shared memory. Version 4: 3 rows
    a block, one warp each (the 3 rows fill one block)."""
    x, b, g, _ = nq.make_inputs(rng, 3, 1100, bias)
    check_forward(x, b, g, *launch_forward(x, b, g, version, threads=threads))


@pytest.mark.parametrize("version", sorted(nq.VERSIONS))
def test_zero_tile_and_nan_row(rng, version):
    """A tile of exact zeros gets the amax floor's scale and zero codes; NaN in a row poisons that row only (its
    rstd and every scale NaN, every code 0x7F), as the spec poisons a group."""
    x, b, g, _ = nq.make_inputs(rng, 4, 300, True)
    x[1, 128:256] = -b[128:256]  # y = x + b is exactly +0 on tile 1 of row 1
    x[2, 7] = np.nan
    codes, scales, rstd, z = launch_forward(x, b, g, version)
    check_forward(x, b, g, codes, scales, rstd, z)
    assert ((codes[1, 128:256] & 0x7F) == 0).all()  # +-0: 0x80 where g < 0 (z = +0 * rstd * g = -0)
    assert scales[1, 1] == spec.AMAX_FLOOR / spec.FP8_MAX["e4m3"]
    assert np.isnan(rstd[2]) and np.isnan(scales[2]).all() and (codes[2] == spec.POISON_CODE).all()
    others = [0, 1, 3]
    assert np.isfinite(rstd[others]).all() and np.isfinite(scales[others]).all()


def test_block_sizes():
    """The launch rule: at most 2 tile sets (32 floats) per thread while blocks stay within 512 threads, 256-thread
    blocks beyond; the backward the same with 16 elements per thread."""
    assert nq.forward_warps(7168) == 7 and nq.forward_warps(16384) == 16 and nq.forward_warps(16385) == 8
    assert nq.backward_threads(7168) == 448 and nq.backward_threads(8192) == 512
    assert nq.backward_threads(8193) == 256


# ------------------------------------------------------------------------------------------------------ version 3

V3_SMALL = [(9, 400, True, True), (3, 129, False, True), (5, 1024, True, False), (4, 1552, False, True),
            (3, 512, False, False), (7, 1024, False, True)]
"""(M, N, bias, z asked for): 400 ends in a partial tile, 129 is not a multiple of 4 (version 3 runs version 2),
1024 and 512 rows the layout covers exactly (no bounds code; a NaN in row 1 of the 1024s), 1552 a partial set over
several warps. Under the simulator version 3 runs 2 blocks, so that each takes several rows around its ring (3 rows
without a bias, 2 with; 9 rows: 5 and 4)."""
V3_BIG = [(4099, 7168, True), (1027, 7172, False), (2053, 1024, False), (16384, 7168, False)]


def test_block_sizes3():
    """One tile set per thread up to 32 warps, more sets beyond; N = 7168: 14 warps."""
    assert nq.forward_warps3(1024) == (2, 1) and nq.forward_warps3(7168) == (14, 1)
    assert nq.forward_warps3(16384) == (32, 1) and nq.forward_warps3(16385) == (32, 2)


# ------------------------------------------------------------------------------------------------------ version 4

V4_SMALL = [(9, 1024, False, True), (5, 2048, True, True), (3, 1540, True, True), (7, 400, False, False),
            (3, 2052, True, True), (4, 1030, False, False)]
"""(M, N, bias, z asked for): 1024 and 2048 rows one warp covers exactly (2 and 4 tile sets a lane; a NaN in row 1
of the 1024s), 1540 a partial set and a partial tile, 400 one partial set; M not a multiple of the rows a block
(2 under the simulator, 8 on a GPU), so the last block has warps past the last row. 2052 is over 2048 (version 4
runs version 3) and 1030 is not a multiple of 4 (version 2)."""
# 4096: version 3 with a 48 KiB ring beside its static shared slots (the opt-in beyond 48 KiB counts both)
V4_BIG = [(16387, 1024, False), (16384, 1024, True), (2053, 2048, True), (1029, 1540, False), (1031, 7168, True),
          (1025, 4096, False)]


def _shape_id(s) -> str:
    return "x".join(map(str, s[:2])) + ("-bias" if s[2] else "")


@pytest.mark.parametrize("version, shape", [pytest.param(v, s, id=f"v{v}-{_shape_id(s)}")
                                            for v, small in ((3, V3_SMALL), (4, V4_SMALL)) for s in small])
def test_forward_ring_and_warp_rows(rng, version, shape):
    M, N, bias, with_z = shape
    x, b, g, _ = nq.make_inputs(rng, M, N, bias)
    if N == 1024:
        x[1, 7] = np.nan  # poisons row 1 only
    codes, scales, rstd, z = launch_forward(x, b, g, version, with_z=with_z)
    check_forward(x, b, g, codes, scales, rstd, z)
    if N == 1024:
        assert np.isnan(rstd[1]) and (codes[1] == spec.POISON_CODE).all() and np.isfinite(rstd[[0, 2]]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("version, shape", [pytest.param(v, s, id=f"v{v}-{_shape_id(s)}")
                                            for v, big in ((3, V3_BIG), (4, V4_BIG)) for s in big])
def test_forward_ring_and_warp_rows_gpu(rng, version, shape):
    M, N, bias = shape
    x, b, g, _ = nq.make_inputs(rng, M, N, bias)
    check_forward(x, b, g, *launch_forward(x, b, g, version, with_z=N == 1540))


def test_forward4_staging_pass_past_the_row(rng):
    """3 rows a block (96 threads) stage b and g 384 floats a pass: N = 400 (one set, 512 floats staged) takes a
    second pass where most threads are past the staged span."""
    x, b, g, _ = nq.make_inputs(rng, 5, 400, True)
    check_forward(x, b, g, *launch_forward(x, b, g, 4, threads=96))


def test_forward4_below_its_capability_runs_version2(rng, monkeypatch):
    """Rows over 2048 go to version 3, which needs compute capability 9.0 with a bias (its L2 prefetch): on an
    older GPU the default (version 4) runs version 2 there, while version 3 itself says what it needs."""
    monkeypatch.setattr(runtime, "compute_capability", lambda: (8, 0))
    x, b, g, _ = nq.make_inputs(rng, 2, 2052, True)

    def no_version3(*args):
        raise AssertionError("version 3 was launched")

    with monkeypatch.context() as m:
        m.setattr(nq_host, "_resident_blocks", no_version3)  # every launch of version 3 asks it for its grid
        check_forward(x, b, g, *launch_forward(x, b, g, 4))
    assert nq.needs3(False) is nq.VERSIONS[3].needs and nq.needs3(False).ok((8, 0)) and not nq.needs3(True).ok((8, 0))
    with pytest.raises(ValueError, match=r"version 3 runs cp.async.bulk.prefetch.L2 \(rows with a bias\), which needs "
                                         r"compute capability 9.0 or newer; this device has compute capability 8.0"):
        launch_forward(x, b, g, 3)


def test_forward4_same_rstd_as_version2_at_1024(rng):
    """At N = 1024 version 2's block is one warp in the same layout: both sum in the same order, so the language
    model's rstd (and codes) do not change with the default version."""
    x, b, g, _ = nq.make_inputs(rng, 5, 1024, False)
    out2 = launch_forward(x, b, g, 2, with_z=False)
    out4 = launch_forward(x, b, g, 4, with_z=False)
    for a2, a4 in zip(out2[:3], out4[:3]):
        assert np.array_equal(a2, a4, equal_nan=True)


# ------------------------------------------------------------------------------------------------------ backward


def check_backward(dz, x, b, g, rstd, dx, gy):
    """dx relative to nq.dx_error_scale (a difference of two terms whose float32 error is a few ulps of that scale);
    gy = (dz * y) * rstd: two roundings; the column sums a caller takes with elementwise.colsum: a sequential float32
    sum of M terms, within M ulps of the sum of their magnitudes plus the terms' own errors."""
    ref_dx, ref_gy = nq.reference_backward(dz, x, b, g, rstd)
    scale = nq.dx_error_scale(dz, x, b, g, rstd)
    assert_close("dx (relative to dx_error_scale)", dx / scale, ref_dx / scale, atol=nq.DX_TOL, rtol=0)
    assert_close("gy", gy, ref_gy, atol=0, rtol=nq.GY_RTOL)
    M, N = dx.shape
    dg, db = poisoned(N, np.float32), poisoned(N, np.float32)
    elementwise.colsum(cuda.to_device(gy), dg)
    elementwise.colsum(cuda.to_device(dx), db)
    bound_dg = (M + 8) * U * np.abs(ref_gy).sum(axis=0)
    bound_db = nq.DX_TOL * scale.sum(axis=0) + (M + 1) * U * np.abs(ref_dx).sum(axis=0)
    assert (np.abs(dg.copy_to_host() - ref_gy.sum(axis=0)) <= bound_dg).all(), "dg = colsum(gy) out of bounds"
    assert (np.abs(db.copy_to_host() - ref_dx.sum(axis=0)) <= bound_db).all(), "db = colsum(dx) out of bounds"


@pytest.mark.parametrize("shape", shapes(SMALL, BIG))
def test_backward(rng, shape):
    M, N, bias, _ = shape
    x, b, g, dz = nq.make_inputs(rng, M, N, bias)
    _, _, rstd, _ = launch_forward(x, b, g, nq.BEST, with_z=False)
    dx, gy = poisoned((M, N), np.float32), poisoned((M, N), np.float32)
    nq.backward(*to_device(dz, x, b, g, rstd), dx, gy)
    check_backward(dz, x, b, g, rstd, dx.copy_to_host(), gy.copy_to_host())


@pytest.mark.parametrize("threads, bias", [(64, True), (96, False)])
def test_backward_several_warps(rng, threads, bias):
    x, b, g, dz = nq.make_inputs(rng, 3, 1100, bias)
    rstd = nq.reference_rstd(x, b).astype(np.float32)  # any rstd will do: the backward takes it as given
    dx, gy = poisoned((3, 1100), np.float32), poisoned((3, 1100), np.float32)
    nq.backward(*to_device(dz, x, b, g, rstd), dx, gy, threads=threads)
    check_backward(dz, x, b, g, rstd, dx.copy_to_host(), gy.copy_to_host())


# ------------------------------------------------------------------------------------------------------ convenience


def test_norm_quantize_on_numpy_and_device(rng):
    x, b, g, dz = nq.make_inputs(rng, 3, 200, True)
    codes, scales, rstd, z = nq.norm_quantize(x.astype(np.float64), b, g, return_z=True)  # float64 -> float32
    assert all(isinstance(a, np.ndarray) for a in (codes, scales, rstd, z))
    check_forward(x, b, g, codes, scales, rstd, z)
    dcodes, dscales, drstd = nq.norm_quantize(cuda.to_device(x), None, cuda.to_device(g), version=1)
    assert hasattr(dcodes, "copy_to_host") and not isinstance(dcodes, np.ndarray)
    check_forward(x, None, g, dcodes.copy_to_host(), dscales.copy_to_host(), drstd.copy_to_host(), None)
    dx, gy = nq.norm_quantize_backward(dz, x, b, g, rstd)
    check_backward(dz, x, b, g, rstd, dx, gy)


# ------------------------------------------------------------------------------------------------------ bad input


@pytest.fixture
def outs():
    """Device inputs and outputs for a (5, 300) problem: x, b, g, codes, scales, rstd."""
    x = np.linspace(-1, 1, 5 * 300, dtype=np.float32).reshape(5, 300)
    g = np.ones(300, np.float32)
    return (cuda.to_device(x), cuda.to_device(g), cuda.to_device(g), cuda.device_array((5, 300), np.uint8),
            cuda.device_array((5, 3), np.float32), cuda.device_array(5, np.float32))


def test_bad_input_forward(outs):
    x, b, g, codes, scales, rstd = outs
    with pytest.raises(TypeError, match=r"codes must be a CUDA device array .* got ndarray"):
        nq.forward(x, b, g, np.zeros((5, 300), np.uint8), scales, rstd)
    with pytest.raises(TypeError, match="x must have dtype float32, got device array of shape \\(5, 300\\) and dtype "
                                        "float64"):
        nq.forward(cuda.to_device(np.ones((5, 300))), b, g, codes, scales, rstd)
    with pytest.raises(ValueError, match=r"x must be 2-D"):
        nq.forward(cuda.to_device(np.ones(300, np.float32)), b, g, codes, scales, rstd)
    with pytest.raises(ValueError, match=r"g must have shape \(300,\), got device array of shape \(299,\)"):
        nq.forward(x, b, cuda.to_device(np.ones(299, np.float32)), codes, scales, rstd)
    with pytest.raises(ValueError, match=r"g must be C-contiguous"):
        nq.forward(x, b, cuda.to_device(np.ones(600, np.float32))[::2], codes, scales, rstd)
    with pytest.raises(ValueError, match=r"scales must have shape \(5, 3\)"):
        nq.forward(x, b, g, codes, cuda.device_array((5, 2), np.float32), rstd)
    with pytest.raises(TypeError, match=r"codes must have dtype uint8"):
        nq.forward(x, b, g, cuda.device_array((5, 300), np.int8), scales, rstd)
    with pytest.raises(ValueError, match=r"version must be None or an int in \(1, 2, 3, 4\), got 5"):
        nq.forward(x, b, g, codes, scales, rstd, version=5)
    with pytest.raises(TypeError, match=r"version must be"):
        nq.forward(x, b, g, codes, scales, rstd, version=True)
    with pytest.raises(ValueError, match=r"threads must be None or a multiple of 32 up to 1024, got 48"):
        nq.forward(x, b, g, codes, scales, rstd, threads=48)


def test_bad_input_backward_and_convenience(outs):
    x, b, g, _, _, rstd = outs
    dx = cuda.device_array((5, 300), np.float32)
    with pytest.raises(ValueError, match=r"rstd must have shape \(5,\), got device array of shape \(4,\)"):
        nq.backward(x, x, b, g, cuda.device_array(4, np.float32), dx, dx)
    with pytest.raises(ValueError, match=r"dz must have shape \(5, 300\)"):
        nq.backward(cuda.device_array((5, 301), np.float32), x, b, g, rstd, dx, dx)
    with pytest.raises(ValueError, match=r"x must be 2-D"):
        nq.norm_quantize(np.ones((2, 3, 4)), None, np.ones(4))
    with pytest.raises(ValueError, match=r"b must have shape \(4,\)"):
        nq.norm_quantize(np.ones((2, 4)), np.ones(5), np.ones(4))
    with pytest.raises(TypeError, match=r"g must have dtype float16 or float32 or float64"):
        nq.norm_quantize(np.ones((2, 4)), None, np.ones(4, np.int32))
    with pytest.raises(TypeError, match=r"return_z must be a bool"):
        nq.norm_quantize(np.ones((2, 4)), None, np.ones(4), return_z="yes")
