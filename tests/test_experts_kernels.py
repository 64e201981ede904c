"""The routed-experts layer on the kernels (fp8lab/training/experts_kernels.py: router, permutation, grouped FP8
GEMMs, SwiGLU, the shared expert) against its NumPy spec (training.experts.ExpertLayer) in fp8-deepseek: the same
experts chosen, y, dx and every parameter's gradient within a normwise 1e-3 (the two quantize the same values, so
they agree to float32 rounding unless a value lands on an E4M3 rounding boundary). Routing margins are kept away from
ties so that float32 rounding cannot change a token's experts."""

from __future__ import annotations

import numpy as np
import pytest

import dataclasses

from fp8lab.comm.moe_reference import route
from fp8lab.device.runtime import cuda
from fp8lab.numerics import recipes
from fp8lab.training import experts as X
from fp8lab.training import experts_kernels as XK

T, D, F, E, K, FS = 16, 16, 8, 3, 2, 8


def _inputs(rng):
    p = X.init_params(rng, D, F, E, shared=FS)
    p["wr"] *= 100
    bias = (rng.standard_normal(E) * 0.05).astype(np.float32)
    for _ in range(20):  # a draw whose k-th and (k + 1)-th selection scores are apart for every token
        x = rng.standard_normal((T, D)).astype(np.float32)
        sel = np.sort(1 / (1 + np.exp(-(x @ p["wr"].T).astype(np.float64))) + bias, axis=1)[:, ::-1]
        if (sel[:, K - 1] - sel[:, K] > 1e-3).all():
            return p, bias, x
    raise AssertionError("no draw with clear routing margins")


@pytest.mark.slow
def test_kernel_layer_matches_the_numpy_spec(rng):
    p, bias, x = _inputs(rng)
    dy = rng.standard_normal((T, D)).astype(np.float32)
    ref = X.ExpertLayer("fp8-deepseek", E, K)
    y0 = ref.forward(x, p, bias)
    dx0, g0 = ref.backward(dy)
    dev = XK.DeviceExpertLayer("fp8-deepseek", E, K)
    y1 = dev.forward(cuda.to_device(x), {k: cuda.to_device(v) for k, v in p.items()}, cuda.to_device(bias))
    dx1, g1 = dev.backward(cuda.to_device(dy))
    assert np.array_equal(dev.ids.copy_to_host(), ref.ids) and np.array_equal(dev.loads, ref.loads)
    assert np.array_equal(dev.ids.copy_to_host(), route(x @ p["wr"].T, K, bias=bias)[0])

    def rel(a, b):
        a = a.copy_to_host()
        assert not np.isnan(a).any()
        return np.linalg.norm(a - b) / np.linalg.norm(b)

    assert rel(y1, y0) < 1e-3 and rel(dx1, dx0) < 1e-3
    assert set(g1) == set(g0) == {"wr", "w1", "w2", "ws1", "ws2"}
    for name in g0:
        assert rel(g1[name], g0[name]) < 1e-3, name


def test_kernel_layer_refuses_recipes_its_grouped_gemms_cannot_run():
    with pytest.raises(ValueError, match=r"^recipe must run the experts' GEMMs in FP8 with 1 x 128 tiles"):
        XK.DeviceExpertLayer("fp8-tensor", E, K)
    with pytest.raises(ValueError, match=r"^top_k must be at most experts \(3\)"):
        XK.DeviceExpertLayer("fp8-deepseek", E, 4)
    p = X.init_params(np.random.default_rng(0), D, F, E)
    with pytest.raises(ValueError, match=r"^params\['wr'\] must have shape \(3, 12\)"):
        XK.DeviceExpertLayer("fp8-deepseek", E, K).forward(cuda.to_device(np.zeros((4, 12), np.float32)), p)


def test_shared_expert_without_retiling(rng):
    """A recipe whose Wgrad quantizes x^T afresh (wgrad_x_from_fprop off) runs the shared expert's backward too, and
    its W1 gradient follows the NumPy spec's."""
    r = dataclasses.replace(recipes.get("fp8-deepseek"), name="test-fresh-xt", wgrad_x_from_fprop=False)
    x = rng.standard_normal((16, 16)).astype(np.float32)
    w1 = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    w2 = (rng.standard_normal((16, 8)) / 3).astype(np.float32)
    dy = rng.standard_normal((16, 16)).astype(np.float32)
    mlp = XK._DeviceMLP(r)
    mlp.forward(cuda.to_device(x), cuda.to_device(w1), cuda.to_device(w2))
    _, dw1, _ = mlp.backward(cuda.to_device(dy))
    ref = X._MLP(r)
    ref.forward(x, w1, w2)
    _, rw1, _ = ref.backward(dy)
    got = dw1.copy_to_host()
    assert np.linalg.norm(got - rw1) <= 1e-3 * np.linalg.norm(rw1)
