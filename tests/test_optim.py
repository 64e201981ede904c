"""kernels.optim.AdamW (decoupled weight decay, bfloat16 or FP32 moments) against its NumPy twin reference_adamw,
and reference_adamw against the NumPy engine's AdamW (fp8lab.training.engine_reference), which it must equal bit
for bit.

Sizes are odd (not multiples of the block or of the grid-stride); gradients are fresh each run, never zero, spread
over six decades. Under the simulator every step is bit for bit the twin's; on a GPU (`gpu` marker, realistic
sizes) fused multiply-adds may change last bits, within the tolerance optim.assert_adamw_step derives.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.numerics import formats
from fp8lab.training import engine_reference as numpy_engine
from fp8lab.device import runtime
from fp8lab.bench import assert_codes_equal
from fp8lab.kernels import optim
from fp8lab.device.runtime import cuda


def sizes(small, big):
    return [pytest.param(small, id="small"), pytest.param(big, id="big", marks=pytest.mark.gpu)]


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("masked", [False, True], ids=["decay-everywhere", "decay-mask"])
@pytest.mark.parametrize("moments", optim.MOMENTS)
@pytest.mark.parametrize("n", sizes(517, (1 << 22) + 1))
def test_adamw_matches_the_twin(rng, n, moments, masked):
    """Three steps, each from the device's own state; under the simulator also the twin run on its own."""
    decay = (rng.random(n) < 0.5).astype(np.float32) if masked else None
    p = rng.standard_normal(n, dtype=np.float32)
    opt = optim.AdamW(n, lr=1e-2, weight_decay=0.1, decay=decay, moments=moments)
    dp = cuda.to_device(p)
    ref = [p.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
    for t in range(1, 4):
        g = optim.adamw_gradients(rng, n)
        before = (dp.copy_to_host(), *opt.moments_float32())
        opt.step(dp, cuda.to_device(g))
        after = (dp.copy_to_host(), *opt.moments_float32())
        optim.assert_adamw_step(f"step {t}", opt, before, g, after)
        # every moment was written: none is left at its initial 0 (g never is 0)
        assert (after[1] != 0).all() and (after[2] > 0).all()
        optim.reference_adamw(ref[0], g, ref[1], ref[2], t, lr=1e-2, weight_decay=0.1, decay=decay, moments=moments)
    assert opt.t == 3
    if runtime.IS_SIM:
        for what, got, want in zip("pmv", after, ref):
            assert_codes_equal(f"{what} after 3 steps", bits(got), bits(want))


@pytest.mark.parametrize("n", sizes(333, (1 << 20) + 7))
def test_adamw_moments_really_are_bfloat16(rng, n):
    """bf16: uint16 arrays (half the bytes), every value a bfloat16 and the bfloat16 of the FP32 run's update in
    the first step (both start at 0); fp32: float32 arrays that keep bits bfloat16 would drop."""
    p = rng.standard_normal(n, dtype=np.float32)
    g = optim.adamw_gradients(rng, n)
    runs = {}
    for moments in optim.MOMENTS:
        opt = optim.AdamW(n, moments=moments)
        opt.step(cuda.to_device(p), cuda.to_device(g))
        runs[moments] = (opt, *opt.moments_float32())
    bf, m16, v16 = runs["bf16"]
    fp, m32, v32 = runs["fp32"]
    assert bf.m.dtype == bf.v.dtype == np.uint16 and bf.m.nbytes == bf.v.nbytes == 2 * n
    assert fp.m.dtype == fp.v.dtype == np.float32 and fp.m.nbytes == 4 * n
    for what, a in (("m", m16), ("v", v16)):
        assert_codes_equal(f"round_bf16({what}) == {what}", bits(formats.round_bf16(a)), bits(a))
    if runtime.IS_SIM:  # on a GPU an FMA may move the FP32 value across a bfloat16 midpoint
        assert_codes_equal("m16 == round_bf16(m32)", bits(m16), bits(formats.round_bf16(m32)))
        assert_codes_equal("v16 == round_bf16(v32)", bits(v16), bits(formats.round_bf16(v32)))
    assert (bits(m32) & 0xFFFF).any() and (bits(v32) & 0xFFFF).any()  # FP32 moments are not bfloat16


def test_reference_adamw_is_lm_adamw(rng):
    """reference_adamw on each parameter (weight_decay 0 where the model does not decay) is numpy_engine.AdamW.step bit
    for bit, both moment kinds, over several steps: both are numerics.ops.adamw."""
    shapes = {"emb": (7, 5), "w1_0": (6, 11), "w2_0": (11, 3), "g_0": (11,), "head": (4, 9)}
    for moments in optim.MOMENTS:
        params = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
        ours = {k: v.copy() for k, v in params.items()}
        m = {k: np.zeros_like(v) for k, v in params.items()}
        v = {k: np.zeros_like(a) for k, a in params.items()}
        theirs = numpy_engine.AdamW(params, lr=3e-3, moments=moments)
        for t in range(1, 5):
            grads = {k: optim.adamw_gradients(rng, a.size).reshape(a.shape) for k, a in params.items()}
            theirs.step(params, grads)
            for k in ours:
                wd = 0.1 if k.startswith(("w1_", "w2_", "head")) else 0.0
                optim.reference_adamw(ours[k], grads[k], m[k], v[k], t, lr=3e-3, b1=0.9, b2=0.95, eps=1e-8,
                                      weight_decay=wd, decay=None, moments=moments)
        for k in ours:
            assert_codes_equal(f"{moments} {k}: p", bits(ours[k]), bits(params[k]))
            assert_codes_equal(f"{moments} {k}: m", bits(m[k]), bits(theirs.m[k]))
            assert_codes_equal(f"{moments} {k}: v", bits(v[k]), bits(theirs.v[k]))


def test_adamw_on_the_flat_buffer_is_lm_adamw(rng):
    """The device AdamW on lm's parameters laid end to end, with the decay mask lm's rule gives: the same bits as
    numpy_engine.AdamW (under the simulator; a GPU may differ in last bits, see test_adamw_matches_the_twin)."""
    if not runtime.IS_SIM:
        pytest.skip("bit-for-bit equality with NumPy holds under the simulator; the GPU is checked with tolerance")
    shapes = {"emb": (5, 3), "w1_0": (6, 7), "g_0": (7,), "head": (3, 5)}
    params = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    flat = np.concatenate([a.ravel() for a in params.values()])
    decay = np.concatenate([np.full(a.size, k.startswith(("w1_", "w2_", "head")), np.float32)
                            for k, a in params.items()])
    theirs = numpy_engine.AdamW(params, lr=1e-2, moments="bf16")
    opt = optim.AdamW(flat.size, lr=1e-2, decay=decay, moments="bf16")
    dp = cuda.to_device(flat)
    for _ in range(3):
        grads = {k: optim.adamw_gradients(rng, a.size).reshape(a.shape) for k, a in params.items()}
        theirs.step(params, grads)
        opt.step(dp, cuda.to_device(np.concatenate([a.ravel() for a in grads.values()])))
    want = np.concatenate([a.ravel() for a in params.values()])
    assert_codes_equal("flat p", bits(dp.copy_to_host()), bits(want))
    assert_codes_equal("flat m", bits(opt.moments_float32()[0]),
                       bits(np.concatenate([a.ravel() for a in theirs.m.values()])))


def test_adamw_numpy_p_is_updated_in_place(rng):
    n = 203
    p = rng.standard_normal(n, dtype=np.float32)
    g = optim.adamw_gradients(rng, n)
    host, dev = optim.AdamW(n), optim.AdamW(n)
    q = p.copy()
    host.step(q, g)  # NumPy p and g: copied over and back
    dp = cuda.to_device(p)
    dev.step(dp, cuda.to_device(g))
    assert_codes_equal("NumPy p == device p", bits(q), bits(dp.copy_to_host()))
    assert (q != p).all()  # decayed everywhere: p (1 - 1e-4) moves every normal p


def test_adamw_zero_weight_decay_and_zero_mask_agree(rng):
    """decay all 0 and weight_decay=0 both leave the decay out, to the bit."""
    n = 129
    p = rng.standard_normal(n, dtype=np.float32)
    g = optim.adamw_gradients(rng, n)
    outs = []
    for opt in (optim.AdamW(n, weight_decay=0.0), optim.AdamW(n, decay=np.zeros(n, np.float32))):
        dp = cuda.to_device(p)
        opt.step(dp, cuda.to_device(g))
        outs.append(dp.copy_to_host())
    assert_codes_equal("wd=0 vs zero mask", bits(outs[0]), bits(outs[1]))


def test_adamw_bad_input():
    with pytest.raises(ValueError, match=r"size must be a positive int, got 0"):
        optim.AdamW(0)
    with pytest.raises(ValueError, match=r"moments must be one of \('bf16', 'fp32'\), got 'fp16'"):
        optim.AdamW(8, moments="fp16")
    with pytest.raises(ValueError, match=r"b1 must be a number in \[0, 1\), got 1.0"):
        optim.AdamW(8, b1=1.0)
    with pytest.raises(TypeError, match=r"b2 must be a number in \[0, 1\), got str"):
        optim.AdamW(8, b2="0.9")
    with pytest.raises(ValueError, match=r"lr must be a positive finite number, got -0.1"):
        optim.AdamW(8, lr=-0.1)
    with pytest.raises(ValueError, match=r"weight_decay must be a non-negative finite number, got nan"):
        optim.AdamW(8, weight_decay=float("nan"))
    with pytest.raises(ValueError, match=r"decay must have shape \(8,\).*\(7,\)"):
        optim.AdamW(8, decay=np.ones(7, np.float32))
    with pytest.raises(TypeError, match=r"decay must have dtype float32.*bool"):
        optim.AdamW(8, decay=np.ones(8, bool))
    with pytest.raises(ValueError, match=r"decay must hold only 0 .* and 1 .*, got 1 other value\(s\), the first "
                                         r"\(0.5\) at index 3"):
        optim.AdamW(8, decay=np.array([0, 1, 1, 0.5, 0, 0, 1, 1], np.float32))
    opt = optim.AdamW(8)
    p, g = np.ones(8, np.float32), np.ones(8, np.float32)
    with pytest.raises(ValueError, match=r"p must have shape \(8,\).*\(9,\)"):
        opt.step(np.ones(9, np.float32), g)
    with pytest.raises(TypeError, match=r"g must have dtype float32.*float64"):
        opt.step(p, np.ones(8))
    with pytest.raises(ValueError, match=r"p must be a writeable C-contiguous array"):
        opt.step(np.ones(16, np.float32)[::2], g)
    assert opt.t == 0  # nothing ran
    m, v = np.zeros(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(TypeError, match=r"p must have dtype float32.*float64"):
        optim.reference_adamw(np.ones(8), g, m, v, 1)
    with pytest.raises(ValueError, match=r"moments must be one of"):
        optim.reference_adamw(p, g, m, v, 1, moments="bf8")
    with pytest.raises(ValueError, match=r"t must be a positive int, got 0"):
        optim.reference_adamw(p, g, m, v, 0)
