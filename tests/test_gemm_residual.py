"""The epilogues that add a residual: fp8_gemm(..., residual=r) and bf16_gemm(..., residual=r) give
out = r + A B^T, the add after the whole sum (compiled in per flag), which the kernel engine uses to write its
residual stream; norm_quant.backward(..., residual=r) gives dx = r + the gradient, the backward's residual add.

Bit for bit: the epilogue adds the same float32 sum the plain kernel stores, one float32 addition, so the result must
be exactly `r + (the plain kernel's output)`, on a GPU too (the sum is the same code); under the simulator the plain
output is itself bit-exact with the references (k order), so it is also exactly `r + reference`. The residual is
random, not zeros; the output is a view inside a NaN-poisoned buffer: the elements around the matrix must stay NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.bench import poisoned
from fp8lab.device import runtime
from fp8lab.device.runtime import cuda
from fp8lab.kernels import bf16_gemm as bg
from fp8lab.kernels import fp8_gemm as fg

from test_fp8_gemm import Q, operands as fp8_operands


def framed(rng, M, N):
    """(device buffer (M + 3, N + 5) NaN but for a random (M, N) block at rows 1.., columns 2.., that block as a
    device view, its host values)."""
    inner = rng.standard_normal((M, N), dtype=np.float32) * np.float32(4)
    big = np.full((M + 3, N + 5), np.nan, np.float32)
    big[1:M + 1, 2:N + 2] = inner
    dev = cuda.to_device(big)
    return dev, dev[1:M + 1, 2:N + 2], inner


def assert_frame_nan(dev, M, N):
    big = dev.copy_to_host()
    frame = np.ones(big.shape, bool)
    frame[1:M + 1, 2:N + 2] = False
    assert np.isnan(big[frame]).all(), f"{int((~np.isnan(big[frame])).sum())} elements outside the matrix written"


def assert_bits(got, want, label):
    assert not np.isnan(got).any(), f"{label}: NaN in the output"
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert not len(bad), (f"{label}: {len(bad)} outputs differ, first at {tuple(bad[0])}: "
                          f"{got[tuple(bad[0])]!r} vs {want[tuple(bad[0])]!r}")


def assert_residual_epilogues(rng, gemm, plain, label):
    """gemm(out, residual) -> what the public call returns, with `plain` the same GEMM's output without a
    residual: a separate random residual into a poisoned out (returned as is), then in place (residual = out, out +=
    A B^T) into a view inside a NaN frame that must stay untouched; both exactly residual + plain."""
    M, N = plain.shape
    r = rng.standard_normal((M, N), dtype=np.float32)
    out = poisoned((M, N), np.float32)
    assert gemm(out, cuda.to_device(r)) is out
    assert_bits(out.copy_to_host(), r + plain, f"{label} residual")
    dev, view, before = framed(rng, M, N)
    gemm(view, view)
    assert_bits(view.copy_to_host(), before + plain, f"{label} in place")
    assert_frame_nan(dev, M, N)


def on_device(q):
    return Q(cuda.to_device(q.data), cuda.to_device(q.scale), q.granularity, q.fmt)


def fp8_sizes(*small, big):
    return [pytest.param(s, id="x".join(map(str, s))) for s in small] + [
        pytest.param(big, id="big", marks=pytest.mark.gpu)]


def fp8_versions():
    # version 4's twin pays a warp barrier per mma under the simulator (~20 s a block): slow there
    return [pytest.param(v, marks=pytest.mark.slow) if v == 4 and runtime.IS_SIM else v
            for v in fg.RESIDUAL_VERSIONS]


@pytest.mark.parametrize("version", fp8_versions())
@pytest.mark.parametrize("grans", [("tile", "block"), ("tensor", "tensor")], ids=lambda g: f"{g[0]}x{g[1]}")
@pytest.mark.parametrize("mnk", fp8_sizes((5, 9, 300), big=(2048, 2053, 2055)))
def test_fp8_gemm_residual_every_version(rng, version, grans, mnk):
    M, N, K = mnk
    qa, qb = fp8_operands(rng, M, N, K, *grans)
    da, db = on_device(qa), on_device(qb)
    plain = poisoned((M, N), np.float32)
    fg.fp8_gemm(da, db, out=plain, version=version)
    plain = plain.copy_to_host()
    if runtime.IS_SIM and version != 3:  # in k order: the plain output is the reference (version 3 scales operands)
        assert_bits(plain, fg.reference(qa, qb), f"v{version} plain vs reference")
    assert_residual_epilogues(rng, lambda out, r: fg.fp8_gemm(da, db, out=out, version=version, residual=r), plain,
                              f"v{version}")


@pytest.mark.slow
@pytest.mark.parametrize("version,M,N,K", [(2, 37, 140, 300), (3, 130, 136, 301),
                                           (5, 130, 136, 272), (6, 130, 136, 301), (7, 130, 136, 272)], ids=str)
def test_fp8_gemm_residual_several_blocks(rng, version, M, N, K):
    qa, qb = fp8_operands(rng, M, N, K, "tile", "block")
    da, db = on_device(qa), on_device(qb)
    plain = fg.fp8_gemm(da, db, version=version).copy_to_host()
    dev, view, before = framed(rng, M, N)
    fg.fp8_gemm(da, db, out=view, version=version, residual=view)
    assert_bits(view.copy_to_host(), before + plain, f"v{version} in place")
    assert_frame_nan(dev, M, N)


def test_fp8_gemm_residual_numpy_in_numpy_out(rng):
    qa, qb = fp8_operands(rng, 6, 10, 200, "tile", "block")
    r = rng.standard_normal((6, 10), dtype=np.float32)
    got = fg.fp8_gemm(qa, qb, version=2, residual=r)
    assert isinstance(got, np.ndarray)
    assert_bits(got, r + fg.fp8_gemm(qa, qb, version=2), "NumPy residual")


@pytest.mark.parametrize("residual,exc,words", [
    (np.zeros((5, 8), np.float32), ValueError, r"residual must have shape \(5, 9\)"),
    (np.zeros((5, 9), np.float64), TypeError, "residual must have dtype float32"),
    (object(), TypeError, "residual must be a NumPy or CUDA device array"),
])
def test_fp8_gemm_residual_errors_name_it(rng, residual, exc, words):
    qa, qb = fp8_operands(rng, 5, 9, 300, "tile", "block")
    with pytest.raises(exc, match=words):
        fg.fp8_gemm(qa, qb, version=2, residual=residual)


def test_fp8_gemm_residual_refused_by_version_1(rng):
    """Version 1 (lecture 06's editable kernel) has no residual epilogue: a ValueError naming the versions that do,
    from the checked API and from launch."""
    assert 1 not in fg.RESIDUAL_VERSIONS and set(fg.RESIDUAL_VERSIONS) == set(fg.VERSIONS) - {1}
    qa, qb = fp8_operands(rng, 5, 9, 300, "tile", "block")
    r = np.zeros((5, 9), np.float32)
    with pytest.raises(ValueError, match="residual .* versions 2, 3, 4, 5, 6, 7, got version 1"):
        fg.fp8_gemm(qa, qb, version=1, residual=r)
    da, db = on_device(qa), on_device(qb)
    with pytest.raises(ValueError, match="got version 1"):
        fg.launch(da.data, da.scale, db.data, db.scale, cuda.device_array((5, 9), np.float32), 1, 2, version=1,
                  residual=cuda.to_device(r))


# ---------------------------------------------------------------------------------------------------------------
# bf16_gemm
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", list(bg.VERSIONS))
@pytest.mark.parametrize("mnk", fp8_sizes((70, 140, 328), (133, 270, 75), big=(2048, 2053, 2055)))
def test_bf16_gemm_residual_every_version(rng, version, mnk):
    M, N, K = mnk
    a = bg.reference_to_bf16(rng.standard_normal((M, K), dtype=np.float32))
    b = bg.reference_to_bf16(rng.standard_normal((N, K), dtype=np.float32))
    da, db = cuda.to_device(a), cuda.to_device(b)
    plain = poisoned((M, N), np.float32)
    bg.bf16_gemm(da, db, out=plain, version=version)
    plain = plain.copy_to_host()
    if runtime.IS_SIM:
        assert_bits(plain, bg.reference_in_order(a, b), f"v{version} plain vs reference_in_order")
    assert_residual_epilogues(rng, lambda out, r: bg.bf16_gemm(da, db, out=out, version=version, residual=r), plain,
                              f"v{version}")


@pytest.mark.parametrize("residual,exc,words", [
    (np.zeros((4, 5), np.float32), ValueError, r"residual must have shape \(4, 6\)"),
    (np.zeros((4, 6), np.uint16), TypeError, "residual must have dtype float32"),
])
def test_bf16_gemm_residual_errors_name_it(rng, residual, exc, words):
    a = rng.standard_normal((4, 70), dtype=np.float32)
    b = rng.standard_normal((6, 70), dtype=np.float32)
    with pytest.raises(exc, match=words):
        bg.bf16_gemm(a, b, residual=residual)


# ---------------------------------------------------------------------------------------------------------------
# norm_quant.backward(..., residual=): the backward's residual add, dx += the gradient through the norm
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,N,bias,threads", [
    (5, 300, True, None), (4, 129, False, None), (3, 200, False, 64),
    pytest.param(4096, 512, False, None, marks=pytest.mark.gpu, id="gpu-4096x512"),
    pytest.param(1027, 7171, True, None, marks=pytest.mark.gpu, id="gpu-1027x7171")])
def test_norm_backward_residual(rng, M, N, bias, threads):
    from fp8lab.kernels import norm_quant as nq

    x, b, g, dz = nq.make_inputs(rng, M, N, bias)
    rstd = nq.reference_rstd(x, b).astype(np.float32)
    dev = [None if v is None else cuda.to_device(v) for v in (dz, x, b, g, rstd)]
    dx0, gy0 = poisoned((M, N), np.float32), poisoned((M, N), np.float32)
    nq.backward(*dev, dx0, gy0, threads=threads)
    dx0, gy0 = dx0.copy_to_host(), gy0.copy_to_host()
    # a separate residual
    r = rng.standard_normal((M, N), dtype=np.float32)
    dx, gy = poisoned((M, N), np.float32), poisoned((M, N), np.float32)
    nq.backward(*dev, dx, gy, threads=threads, residual=cuda.to_device(r))
    assert_bits(dx.copy_to_host(), r + dx0, "dx = residual + gradient")
    assert_bits(gy.copy_to_host(), gy0, "gy unchanged")
    # in place, dx a view in a NaN frame
    buf, view, before = framed(rng, M, N)
    gy = poisoned((M, N), np.float32)
    nq.backward(*dev, view, gy, threads=threads, residual=view)
    assert_bits(view.copy_to_host(), before + dx0, "dx += gradient")
    assert_frame_nan(buf, M, N)


def test_norm_backward_residual_checked(rng):
    from fp8lab.kernels import norm_quant as nq

    x, b, g, dz = nq.make_inputs(rng, 4, 129, False)
    dev = [cuda.to_device(v) for v in (dz, x, g, nq.reference_rstd(x, None).astype(np.float32))]
    out = [cuda.device_array((4, 129), np.float32) for _ in range(2)]
    with pytest.raises(ValueError, match=r"residual must have shape \(4, 129\)"):
        nq.backward(dev[0], dev[1], None, dev[2], dev[3], *out, residual=cuda.device_array((4, 128), np.float32))
    with pytest.raises(TypeError, match="residual must be a CUDA device array"):
        nq.backward(dev[0], dev[1], None, dev[2], dev[3], *out, residual=np.zeros((4, 129), np.float32))


# ---------------------------------------------------------------------------------------------------------------
# The kernel engine: W2's GEMM writes the residual stream x + h W2^T itself
# ---------------------------------------------------------------------------------------------------------------

ENGINE_RECIPES = ["fp32", "bf16", "bf16 tensor cores", "fp8-tensor", "fp8-deepseek", "fp8-deepseek outliers"]


def _separate_add(forward):
    """DeviceLinear.forward as before the epilogue: the GEMM into a buffer of its own, then elementwise.add."""
    from fp8lab.kernels import elementwise

    def patched(self, x, w, y, quantized=False, residual=None):
        if residual is None:
            return forward(self, x, w, y, quantized)
        xw = cuda.device_array(y.shape, np.float32)
        forward(self, x, w, xw, quantized)
        elementwise.add(residual, xw, y)

    return patched


def _separate_norm_add(backward):
    """norm_quant.backward as the engine ran it before: the gradient into a buffer, then elementwise.add."""
    from fp8lab.kernels import elementwise

    def patched(dz, x, b, g, rstd, dx, gy, *, threads=None, residual=None):
        if residual is None:
            return backward(dz, x, b, g, rstd, dx, gy, threads=threads)
        dxn = cuda.device_array(dx.shape, np.float32)
        backward(dz, x, b, g, rstd, dxn, gy, threads=threads)
        elementwise.add(residual, dxn, dx)

    return patched


def _engine_step(monkeypatch, recipe, ids, targets, cfg):
    from fp8lab.training import engine_kernels, model

    net = engine_kernels.KernelModel(cfg, recipe, ids.shape[0], model.init_params(cfg, 3))
    loss = net.loss(ids, targets)
    return np.float32(loss), net.params.grad.copy_to_host()


@pytest.mark.parametrize("recipe", ENGINE_RECIPES)
def test_engine_losses_and_gradients_unchanged_by_the_epilogue(rng, monkeypatch, recipe):
    """A step of the language model (loss and every gradient) with the residual added in W2's GEMM epilogue and in
    the RMSNorm backward is bit for bit the step with separate elementwise.adds (the engine before the epilogues)."""
    from fp8lab.training import engine_kernels, model

    name, _, variant = recipe.partition(" ")
    if variant == "tensor cores":
        monkeypatch.setattr(engine_kernels, "bf16_tensor_cores", lambda: True)
    cfg = model.Config(vocab=40, context=2, embed=16, hidden=16, blocks=2,
                       outliers=8.0 if variant == "outliers" else 1.0)
    M = 8
    ids = rng.integers(0, cfg.vocab, (M, cfg.context), dtype=np.int32)
    targets = rng.integers(0, cfg.vocab, M, dtype=np.int32)
    fused_calls = []
    for mod in (engine_kernels.fp8_gemm, engine_kernels.bf16_gemm):
        launch = mod.launch

        def spy(*args, _launch=launch, **kw):
            if kw.get("residual") is not None:
                fused_calls.append(1)
            return _launch(*args, **kw)
        monkeypatch.setattr(mod, "launch", spy)
    fused = _engine_step(monkeypatch, name, ids, targets, cfg)
    on_tensor_cores = name.startswith("fp8") or (name == "bf16" and engine_kernels.bf16_tensor_cores())
    assert len(fused_calls) == (cfg.blocks if on_tensor_cores else 0), "W2's GEMM did not take the residual"
    monkeypatch.setattr(engine_kernels.DeviceLinear, "forward", _separate_add(engine_kernels.DeviceLinear.forward))
    monkeypatch.setattr(engine_kernels.norm_quant, "backward", _separate_norm_add(engine_kernels.norm_quant.backward))
    separate = _engine_step(monkeypatch, name, ids, targets, cfg)
    assert np.isfinite(fused[0]) and fused[0].view(np.uint32) == separate[0].view(np.uint32), (fused[0], separate[0])
    assert_bits(fused[1], separate[1], "gradients")


def test_engine_gradients_unchanged_by_the_fused_swiglu_backward(rng, recipe="fp8-deepseek"):
    """Where W1's backward takes du in 1 x 128 tiles for both GEMMs, SwiGLU's backward writes those tiles itself
    (du never in float32): the loss and every gradient of a step are bit for bit those of the step that writes du
    and quantizes it in a second pass."""
    from fp8lab.training import engine_kernels, model

    cfg = model.Config(vocab=40, context=2, embed=16, hidden=72, blocks=1)  # 2F = 144: a partial second tile
    M = 5
    ids = rng.integers(0, cfg.vocab, (M, cfg.context), dtype=np.int32)
    targets = rng.integers(0, cfg.vocab, M, dtype=np.int32)
    out = []
    for fused in (True, False):
        net = engine_kernels.KernelModel(cfg, recipe, M, model.init_params(cfg, 3))
        assert net.du is None  # the recipe's dy is quantized in one pass for Dgrad and Wgrad
        if not fused:
            net.du = cuda.device_array((M, 2 * cfg.hidden), np.float32)
        out.append((np.float32(net.loss(ids, targets)), net.params.grad.copy_to_host()))
    (fl, fg), (sl, sg) = out
    assert np.isfinite(fl) and fl.view(np.uint32) == sl.view(np.uint32), (fl, sl)
    assert_bits(fg, sg, "gradients")
