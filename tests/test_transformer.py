"""DeepSeek-V3 in miniature, the NumPy spec (fp8lab/training/transformer.py): the whole model's backward against
central finite differences of its loss (fp32 recipe: no rounding in the way; steps that change a token's experts
skipped), the float32 attention ops against the kernels' float64 reference, the BF16/FP8 recipes close to float32,
the balancing bias moving against the loads, and bad sizes named."""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.kernels import attention as A
from fp8lab.numerics import ops
from fp8lab.training import transformer as TR

CFG = TR.TransformerConfig(vocab=11, context=5, width=8, heads=2, blocks=2, experts=3, top_k=2, hidden=6, shared=4)


def _batch(rng, B=3):
    ids = rng.integers(0, CFG.vocab, (B, CFG.context))
    return ids, rng.integers(0, CFG.vocab, (B, CFG.context))


def test_attention_ops_match_the_kernels_reference(rng):
    q, k, v, do = A.make_inputs(rng, (2, 2, 9, 16))
    o, p = ops.attention(q, k, v)
    ro, _ = A.reference(q, k, v)
    np.testing.assert_allclose(o, ro, atol=1e-5)
    for got, want in zip(ops.attention_backward(do, q, k, v, o, p), A.reference_backward(q, k, v, do, True, o)):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_backward_matches_finite_differences(rng):
    params = TR.init_params(CFG, seed=int(rng.integers(1 << 30)))
    ids, tgt = _batch(rng)
    model = TR.TransformerModel(CFG, "fp32")
    loss, g = model.loss(params, ids, tgt)
    routes = [r.copy() for r in model.routes]
    assert set(g) == set(params) and np.isfinite(loss)

    def f(name, idx, h):
        q = {k: v.copy() for k, v in params.items()}
        q[name][idx] += h
        m = TR.TransformerModel(CFG, "fp32")
        val = m.loss(q, ids, tgt, grads=False)[0]
        return val, all(np.array_equal(a, b) for a, b in zip(m.routes, routes))

    checked = 0
    for name in sorted(params):
        for flat in rng.choice(params[name].size, min(3, params[name].size), replace=False):
            idx = np.unravel_index(flat, params[name].shape)
            (lp, ok_p), (lm, ok_m) = f(name, idx, 1e-2), f(name, idx, -1e-2)
            if not (ok_p and ok_m):
                continue
            fd = (lp - lm) / 2e-2
            assert abs(fd - g[name][idx]) <= 3e-2 * max(0.05, abs(fd)), (name, idx, fd, g[name][idx])
            checked += 1
    assert checked >= 40


def test_low_precision_recipes_stay_close_and_the_bias_moves(rng):
    params = TR.init_params(CFG, seed=1)
    ids, tgt = _batch(rng, B=4)
    base = TR.TransformerModel(CFG, "fp32").loss(params, ids, tgt, grads=False)[0]
    for recipe in ("bf16", "fp8-deepseek"):
        m = TR.TransformerModel(CFG, recipe)
        assert m.bf16 and abs(m.loss(params, ids, tgt)[0] - base) < 0.02 * base
    m.update_biases(0.01)
    for bias, loads in zip(m.biases, m.loads):
        assert ((bias < 0) == (loads > loads.mean())).all() and ((bias > 0) == (loads < loads.mean())).all()


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match=r"^width must be a multiple of heads \(3\)"):
        TR.TransformerConfig(11, 5, 8, 3, 1, 3, 2, 6)
    with pytest.raises(ValueError, match=r"^top_k must be at most experts \(3\)"):
        TR.TransformerConfig(11, 5, 8, 2, 1, 3, 4, 6)
    with pytest.raises(ValueError, match=r"^update_biases needs the loads of a forward"):
        TR.TransformerModel(CFG, "fp32").update_biases(0.01)
    with pytest.raises(ValueError, match=r"^gamma must be a finite number >= 0"):
        TR.X.update_bias(np.zeros(3, np.float32), np.ones(3), float("nan"))
    with pytest.raises(ValueError, match=r"^ids and targets must be \(B, 5\)"):
        TR.TransformerModel(CFG, "fp32").loss(TR.init_params(CFG), np.zeros((2, 4), int), np.zeros((2, 4), int))
