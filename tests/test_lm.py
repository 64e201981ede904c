"""The capstone's model in NumPy (fp8lab.training.model, engine_reference): gradients, the recipes' GEMMs, AdamW with bfloat16 moments."""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.training import corpus, model as lm
from fp8lab.training import engine_reference as numpy_engine
from fp8lab.numerics import recipes
from fp8lab.numerics import formats, spec

CFG = lm.Config(vocab=65, context=4, embed=40, hidden=150, blocks=2)  # width 160: partial 1 x 128 tiles


def _batch(rng, M=37):
    return rng.integers(0, CFG.vocab, (M, CFG.context)).astype(np.int32), rng.integers(0, CFG.vocab, M).astype(np.int32)


@pytest.mark.parametrize("name", ["head", "gf", "w2_1", "w1_0", "g0", "emb"])
def test_fp32_gradients_match_finite_differences(rng, name):
    ids, tgt = _batch(rng)
    model, p = numpy_engine.Model(CFG, "fp32"), lm.init_params(CFG, 3)
    _, g = model.loss(p, ids, tgt)
    # Along the gradient plus a random part (so that a wrong gradient cannot hide in a direction it leaves out),
    # scaled to a random direction's length: the derivative is large against the float32 noise of the two
    # losses, which a random direction's small derivative was not (a rare seed failed at 2e-3 before).
    gg, r = g[name].astype(np.float64), rng.standard_normal(p[name].shape)
    u = gg / np.linalg.norm(gg) + 0.5 * r / np.linalg.norm(r)
    d = (np.sqrt(gg.size) * u / np.linalg.norm(u)).astype(np.float32)
    h = 5e-4
    fd = (model.loss({**p, name: p[name] + h * d}, ids, tgt, False)
          - model.loss({**p, name: p[name] - h * d}, ids, tgt, False)) / (2 * h)
    assert fd == pytest.approx(float((g[name].astype(np.float64) * d).sum()), rel=2e-3)


def test_deepseek_linear_uses_tiles_blocks_and_the_cached_fp8_input(rng):
    x = rng.standard_normal((130, 300)).astype(np.float32)
    w = (rng.standard_normal((200, 300)) * 0.05).astype(np.float32)
    dy = rng.standard_normal((130, 200)).astype(np.float32)
    lin = numpy_engine.Linear("fp8-deepseek")
    y = lin.forward(x, w)
    dx, dw = lin.backward(dy)
    G = spec.GROUP_K
    xc, xs, _ = spec.quantize(x, "tile")
    wc, ws, _ = spec.quantize(w, "block")
    assert np.array_equal(y, spec.dequantize(xc, xs, 1, G) @ spec.dequantize(wc, ws, G, G).T)
    dc, ds, _ = spec.quantize(dy, "tile")
    assert np.array_equal(dx, spec.dequantize(dc, ds, 1, G) @ spec.dequantize(wc, ws, G, G))
    xtc, xts = spec.requantize_tile_to_col(xc, xs)
    dtc, dts, _ = spec.quantize(np.ascontiguousarray(dy.T), "tile")
    assert np.array_equal(dw, spec.dequantize(dtc, dts, 1, G) @ spec.dequantize(xtc, xts, 1, G).T)
    # each GEMM lands near the float32 one: E4M3 keeps 3 mantissa bits, so a few percent normwise
    for got, want in ((y, x @ w.T), (dx, dy @ w), (dw, dy.T @ x)):
        assert 0 < np.linalg.norm(got - want) / np.linalg.norm(want) < 0.05


@pytest.mark.parametrize("recipe", recipes.RECIPES)
def test_every_recipe_learns_and_stays_close_to_fp32(rng, recipe):
    c = corpus.load()
    cfg = lm.Config(c.vocab_size, 4, 32, 128, 1)
    losses = {}
    for r in ("fp32", recipe):
        batches = np.random.default_rng(7)
        model, p = numpy_engine.Model(cfg, r), lm.init_params(cfg, 1)
        opt = numpy_engine.AdamW(p, 3e-3)
        first = None
        for _ in range(40):
            loss, g = model.loss(p, *c.batch(batches, "train", 64, cfg.context))
            first = first or loss
            opt.step(p, g)
        losses[r] = (first, loss)
    first, last = losses[recipe]
    assert last < 0.85 * first  # it learns (from about ln 65 = 4.17 nats)
    assert abs(last - losses["fp32"][1]) < 0.05 * losses["fp32"][1]


def test_adamw_stores_bfloat16_moments_unless_asked(rng):
    p = {"w1_0": rng.standard_normal((8, 8)).astype(np.float32), "g0": np.ones(8, np.float32)}
    g = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()}
    for moments in ("bf16", "fp32"):
        opt = numpy_engine.AdamW({k: v.copy() for k, v in p.items()}, 1e-3, moments=moments)
        q = {k: v.copy() for k, v in p.items()}
        opt.step(q, g)
        opt.step(q, g)
        is_bf16 = all(np.array_equal(formats.round_bf16(m), m) for m in list(opt.m.values()) + list(opt.v.values()))
        assert is_bf16 == (moments == "bf16")
    with pytest.raises(ValueError, match="moments"):
        numpy_engine.AdamW(p, 1e-3, moments="fp16")


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(vocab=0), ValueError, "vocab"),
    (dict(context=2.0), TypeError, "context"),
    (dict(blocks=-1), ValueError, "blocks"),
])
def test_config_errors_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        lm.Config(**{**dict(vocab=65, context=4, embed=8, hidden=16, blocks=1), **kwargs})


def test_unknown_recipe():
    with pytest.raises(ValueError, match="recipe"):
        numpy_engine.Model(CFG, "fp16")
