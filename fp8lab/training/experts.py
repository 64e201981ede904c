"""DeepSeek-V3's feed-forward layer of routed experts, in NumPy: the spec a kernel version of the layer is held to.

y = shared(x) + sum over the token's top-k routed experts e of g_e(x) * expert_e(x), each expert (the shared one too)
a SwiGLU MLP, W2 swiglu(W1 x), whose GEMMs run in a recipe's precisions (engine_reference.Linear: in fp8-deepseek,
E4M3 with 1 x 128 tiles for activations and gradients, 128 x 128 blocks for weights). The router (arXiv 2412.19437,
section 2.1.2): logits = x Wr^T in float32, affinities s = sigmoid(logits), the top-k experts by s + b selected, the
gates g = s / (sum of the selected s); the bias b enters the selection only, and `update_bias` moves it after each
step by gamma against the load (DeepSeek-V3's auxiliary-loss-free balancing). The backward reaches the router through
the gates: the selection itself has no gradient.

Shapes: x (T, D) float32; params "wr" (E, D), "w1" (E, 2F, D), "w2" (E, D, F), and with a shared expert "ws1"
(2Fs, D), "ws2" (D, Fs); the bias (E,) float32 is state, not a parameter. In the kernels the tokens of each expert go
to contiguous rows (kernels.permute) and the expert GEMMs are grouped (fl.fp8_grouped_gemm, fl.fp8_grouped_wgrad);
here each expert's rows are picked out in NumPy, in token order, which gives the same per-expert GEMMs.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from ..comm.moe_reference import route, update_bias  # noqa: F401  (update_bias: the layer's bias step)
from ..numerics import ops, recipes
from .engine_reference import Linear

F32 = np.float32


def init_params(rng, D: int, F: int, E: int, shared: int | None = None) -> dict:
    """Random float32 parameters: the router "wr" (E, D) small (routing starts near uniform), experts "w1" (E, 2F, D)
    and "w2" (E, D, F) scaled by 1 / sqrt(fan-in), and with shared (its hidden width) "ws1", "ws2"."""
    p = {"wr": (rng.standard_normal((E, D)) * 0.01).astype(F32),
         "w1": (rng.standard_normal((E, 2 * F, D)) / np.sqrt(D)).astype(F32),
         "w2": (rng.standard_normal((E, D, F)) / np.sqrt(F)).astype(F32)}
    if shared:
        p["ws1"] = (rng.standard_normal((2 * shared, D)) / np.sqrt(D)).astype(F32)
        p["ws2"] = (rng.standard_normal((D, shared)) / np.sqrt(shared)).astype(F32)
    return p


def gate_backward(logits, ids, gates, dgates) -> np.ndarray:
    """The router logits' gradient (T, E) float32 from the gates' (T, k): gates g_j = s_j / S over the selected
    experts ids, s = sigmoid(logits), so ds_j = (dg_j - sum_k g_k dg_k) / S and dlogit_j = ds_j s_j (1 - s_j); 0
    for the experts not selected (the selection has no gradient)."""
    ids = np.asarray(ids, np.int64)
    s = np.take_along_axis(ops.sigmoid(np.asarray(logits, np.float64)), ids, axis=1)
    ds = (dgates - (gates * dgates).sum(axis=1, keepdims=True)) / s.sum(axis=1, keepdims=True)
    dlogits = np.zeros(np.shape(logits))
    np.put_along_axis(dlogits, ids, ds * s * (1 - s), axis=1)
    return dlogits.astype(F32)


class _MLP:
    """W2 swiglu(W1 x) with both GEMMs in the recipe (its forward keeps what its backward needs)."""

    def __init__(self, recipe):
        self.l1, self.l2 = Linear(recipe), Linear(recipe)

    def forward(self, x, w1, w2):
        self.u = self.l1.forward(x, w1).astype(F32)
        return self.l2.forward(ops.swiglu(self.u), w2).astype(F32)

    def backward(self, dy):
        """(dx, dW1, dW2)."""
        dh, dw2 = self.l2.backward(dy)
        dx, dw1 = self.l1.backward(ops.swiglu_backward(dh.astype(F32), self.u))
        return dx.astype(F32), dw1.astype(F32), dw2.astype(F32)


class ExpertLayer:
    """The layer's forward and backward in one recipe, for `experts` routed experts of which each token takes
    top_k. forward(x, params, bias) -> y; backward(dy) -> (dx, {name: gradient}); loads: the tokens each expert
    got in the last forward."""

    def __init__(self, recipe, experts: int, top_k: int):
        self.recipe = recipes.get(recipe)
        self.experts = V.positive_int("experts", experts)
        self.top_k = V.positive_int("top_k", top_k)
        if self.top_k > self.experts:
            raise ValueError(f"top_k must be at most experts ({self.experts}), got {self.top_k}")

    def forward(self, x, params: dict, bias=None):
        x = np.asarray(x, F32)
        T = x.shape[0]
        E = self.experts
        wr = params["wr"]
        if wr.shape != (E, x.shape[1]):
            raise ValueError(f"params['wr'] must have shape ({E}, {x.shape[1]}), got {wr.shape}")
        self.x, self.params = x, params
        self.logits = (x @ wr.T).astype(F32)
        self.ids, self.gates = route(self.logits, self.top_k, bias=None if bias is None else np.asarray(bias, F32))
        self.loads = np.bincount(self.ids.reshape(-1), minlength=E)
        y = np.zeros_like(x)
        self.mlps, self.rows, self.outs = {}, {}, {}
        for e in range(E):
            tok, j = np.nonzero(self.ids == e)  # token order
            if len(tok) == 0:
                continue
            mlp = _MLP(self.recipe)
            out = mlp.forward(x[tok], params["w1"][e], params["w2"][e])
            self.mlps[e], self.rows[e], self.outs[e] = mlp, (tok, j), out
            y[tok] += self.gates[tok, j][:, None] * out
        if "ws1" in params:
            self.shared = _MLP(self.recipe)
            y += self.shared.forward(x, params["ws1"], params["ws2"])
        return y

    def backward(self, dy):
        dy = np.asarray(dy, F32)
        x, p = self.x, self.params
        dx = np.zeros_like(x)
        g = {"w1": np.zeros_like(p["w1"]), "w2": np.zeros_like(p["w2"])}
        dgates = np.zeros_like(self.gates)
        for e, mlp in self.mlps.items():
            tok, j = self.rows[e]
            dgates[tok, j] = (dy[tok] * self.outs[e]).sum(axis=1)
            dxe, g["w1"][e], g["w2"][e] = mlp.backward((self.gates[tok, j][:, None] * dy[tok]).astype(F32))
            np.add.at(dx, tok, dxe)
        if "ws1" in p:
            dxs, g["ws1"], g["ws2"] = self.shared.backward(dy)
            dx += dxs
        dlogits = gate_backward(self.logits, self.ids, self.gates, dgates)
        g["wr"] = (dlogits.T @ x).astype(F32)
        dx += (dlogits @ p["wr"]).astype(F32)
        return dx, g
