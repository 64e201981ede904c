"""The routed-experts layer's NumPy spec (fp8lab/training/experts.py): its backward against central finite
differences of its forward (float32 recipe, routing unchanged by the small steps), the router's gates and loads, an
FP8 recipe within its distance of float32, and the balancing bias step (the same as the device kernel's reference).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.device.runtime import cuda
from fp8lab.kernels import router
from fp8lab.training import experts as X

T, D, F, E, K, FS = 24, 8, 6, 4, 2, 5


def _layer(rng, recipe="fp32"):
    p = X.init_params(rng, D, F, E, shared=FS)
    p["wr"] *= 100  # sharper routing than at initialization: the selection matters
    return X.ExpertLayer(recipe, E, K), p, rng.standard_normal((T, D)).astype(np.float32)


def test_backward_matches_finite_differences(rng):
    layer, p, x = _layer(rng)
    bias = (rng.standard_normal(E) * 0.05).astype(np.float32)
    r = rng.standard_normal((T, D)).astype(np.float32)
    y = layer.forward(x, p, bias)
    ids = layer.ids.copy()
    assert layer.loads.sum() == T * K and np.allclose(layer.gates.sum(axis=1), 1, rtol=1e-6)
    dx, g = layer.backward(r)
    g["x"] = dx

    def loss(name, idx, h):
        q = {k: v.copy() for k, v in p.items()}
        xx = x.copy()
        (xx if name == "x" else q[name])[idx] += h
        out = X.ExpertLayer("fp32", E, K)
        val = float((out.forward(xx, q, bias).astype(np.float64) * r).sum())
        return val, np.array_equal(out.ids, ids)

    checked = 0
    for name in ("x", "wr", "w1", "w2", "ws1", "ws2"):
        arr = x if name == "x" else p[name]
        for flat in rng.choice(arr.size, 6, replace=False):
            idx = np.unravel_index(flat, arr.shape)
            (lp, same_p), (lm, same_m) = loss(name, idx, 1e-2), loss(name, idx, -1e-2)
            if not (same_p and same_m):
                continue  # the step changed a token's experts: no derivative there
            fd = (lp - lm) / 2e-2
            assert abs(fd - g[name][idx]) <= 2e-2 * max(1.0, abs(fd)), (name, idx, fd, g[name][idx])
            checked += 1
    assert checked >= 30 and y.shape == x.shape


def test_fp8_recipe_is_close_to_float32(rng):
    layer, p, x = _layer(rng)
    want = layer.forward(x, p)
    got = X.ExpertLayer("fp8-deepseek", E, K).forward(x, p)
    assert not np.array_equal(got, want)  # the expert GEMMs ran in E4M3
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_bias_step_matches_the_device_kernel(rng):
    loads = np.array([9, 3, 6, 6])
    bias = rng.standard_normal(4).astype(np.float32)
    d = cuda.to_device(bias)
    router.update_bias(d, cuda.to_device(np.concatenate([[0], np.cumsum(loads)]).astype(np.int32)), 1e-3)
    assert np.array_equal(X.update_bias(bias, loads, 1e-3), d.copy_to_host())


def test_bad_input():
    with pytest.raises(ValueError, match=r"^top_k must be at most experts \(4\)"):
        X.ExpertLayer("fp32", 4, 5)
    layer, p, x = _layer(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^params\['wr'\] must have shape \(4, 7\)"):
        layer.forward(x[:, :7], p)
