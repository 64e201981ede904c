"""The routed-experts layer (fp8lab.training.experts) on the course's kernels, FP8 recipes with 1 x 128 tiles for
activations and gradients and 128 x 128 blocks for weights (fp8-deepseek, fp8-deepseek-pow2).

Forward: router logits x Wr^T (kernels.gemm, float32), kernels.router.route (top-k by sigmoid + bias, gates),
kernels.permute.permute (each expert's tokens in contiguous 128-row groups), the experts' W1 and W2 as grouped FP8
GEMMs (fl.fp8_grouped_gemm, weights quantized per expert in 128 x 128 blocks), SwiGLU between them, and
kernels.permute.unpermute (the k outputs of a token weighted by its gates); the shared expert as two fp8_gemm.
Backward: unpermute_backward (dy to the experts' rows, and the gates' gradients), each grouped GEMM's Dgrad (the
experts' transposed weights) and Wgrad (fl.fp8_grouped_wgrad; x^T re-tiled from Fprop's codes where the recipe says
so), SwiGLU's backward, permute_backward, and the router's gradient through the gates (on the host: (T, k) values).

A first version that favours clarity over speed: quantizations through the public API (a new array per call), the
groups' sizes copied to the host each step. It is checked against the NumPy spec under the simulator.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from .. import quant
from ..device.runtime import cuda
from ..kernels import elementwise, fp8_gemm, gemm, permute, router, swiglu
from ..numerics import recipes
from .experts import gate_backward

F32 = np.float32


def _check_recipe(recipe) -> recipes.Recipe:
    r = recipes.get(recipe)
    acts = (r.fprop.a, r.dgrad.a, r.wgrad.a, r.wgrad.b)
    if not (all(op.fp8 and op.granularity == "tile" for op in acts)
            and all(op.fp8 and op.granularity == "block" for op in (r.fprop.b, r.dgrad.b))):
        raise ValueError(f"recipe must run the experts' GEMMs in FP8 with 1 x 128 tiles for activations and gradients "
                         f"and 128 x 128 blocks for weights (the grouped GEMMs' operands), got {r.name!r}")
    return r


def _q(x, op: recipes.Operand):
    """x (a float32 device array) quantized as operand op (its format, granularity and scale rule)."""
    return quant.quantize(x, op.precision, op.granularity, pow2_scale=op.pow2)


def _t(a):
    """A contiguous transpose of a float32 (M, N) device array."""
    out = cuda.device_array(a.shape[::-1], F32)
    elementwise.transpose(a, out)
    return out


def _t3(w):
    """Each expert's matrix transposed: (E, N, K) -> (E, K, N), float32 device arrays."""
    out = cuda.device_array((w.shape[0], w.shape[2], w.shape[1]), F32)
    for e in range(w.shape[0]):
        elementwise.transpose(w[e], out[e])
    return out


class _DeviceMLP:
    """The shared expert: W2 swiglu(W1 x) on fp8_gemm, its backward."""

    def __init__(self, r: recipes.Recipe):
        self.r = r

    def forward(self, x, w1, w2):
        r = self.r
        self.x, self.qx, self.w1, self.w2 = x, _q(x, r.fprop.a), w1, w2
        self.u = fp8_gemm.fp8_gemm(self.qx, _q(w1, r.fprop.b))
        self.h = swiglu.forward(self.u)
        self.qh = _q(self.h, r.fprop.a)
        return fp8_gemm.fp8_gemm(self.qh, _q(w2, r.fprop.b))

    def backward(self, dy):
        r = self.r
        dh = fp8_gemm.fp8_gemm(_q(dy, r.dgrad.a), _q(_t(self.w2), r.dgrad.b))
        dw2 = fp8_gemm.fp8_gemm(_q(_t(dy), r.wgrad.a), _xt(r, self.qh, self.h))
        du = swiglu.backward(self.u, dh)
        dx = fp8_gemm.fp8_gemm(_q(du, r.dgrad.a), _q(_t(self.w1), r.dgrad.b))
        dw1 = fp8_gemm.fp8_gemm(_q(_t(du), r.wgrad.a), _xt(r, self.qx, self.x))
        return dx, dw1, dw2


def _xt(r: recipes.Recipe, qx, x):
    """Wgrad's x^T: re-tiled from Fprop's FP8 codes of x where the recipe says so, else quantized from float32 x."""
    if r.wgrad_x_from_fprop:
        return quant.requantize_tile_to_col(qx, pow2_scale=r.wgrad.b.pow2)
    return _q(_t(x), r.wgrad.b)


class DeviceExpertLayer:
    """training.experts.ExpertLayer on the kernels: forward(x, params, bias) -> y (device arrays: x (T, D), params
    as ExpertLayer's, bias (E,) float32); backward(dy) -> (dx, {name: gradient}), device arrays; loads: each
    expert's tokens in the last forward (host)."""

    def __init__(self, recipe, experts: int, top_k: int):
        self.r = _check_recipe(recipe)
        self.experts, self.top_k = V.positive_int("experts", experts), V.positive_int("top_k", top_k)
        if self.top_k > self.experts:
            raise ValueError(f"top_k must be at most experts ({self.experts}), got {self.top_k}")

    def forward(self, x, params: dict, bias=None):
        r, E = self.r, self.experts
        x = V.array("x", x, dtype=F32, ndim=2)
        T, D = x.shape
        want = {"wr": (E, D), "w1": (E, None, D), "w2": (E, D, None)}
        for name, shape in want.items():
            got = tuple(params[name].shape)
            if len(got) != len(shape) or any(w is not None and g != w for g, w in zip(got, shape)):
                raise ValueError(f"params[{name!r}] must have shape {shape} (None: any; E = {E} experts, D = {D} "
                                 f"the width of x), got {got}")
        if params["w1"].shape[1] != 2 * params["w2"].shape[2]:
            raise ValueError(f"params['w1'] must be (E, 2F, D) for params['w2'] (E, D, F), got {params['w1'].shape} "
                             f"and {params['w2'].shape}")
        self.x, self.p = x, params
        self.logits = gemm.gemm(x, _t(params["wr"]))
        b = bias if bias is not None else cuda.to_device(np.zeros(E, F32))
        self.ids, self.gates = router.route(self.logits, self.top_k, b)
        self.rows, self.off, self.slots = permute.permute(x, self.ids, E)
        self.loads = np.bincount(self.ids.copy_to_host().reshape(-1), minlength=E)
        self.qx = _q(self.rows, r.fprop.a)
        self.u = fp8_gemm.fp8_grouped_gemm(self.qx, _q(params["w1"], r.fprop.b), self.off)
        self.h = swiglu.forward(self.u)
        self.qh = _q(self.h, r.fprop.a)
        self.yr = fp8_gemm.fp8_grouped_gemm(self.qh, _q(params["w2"], r.fprop.b), self.off)
        y = permute.unpermute(self.yr, self.slots, self.gates)
        if "ws1" in params:
            self.shared = _DeviceMLP(r)
            elementwise.add(y, self.shared.forward(x, params["ws1"], params["ws2"]), y)
        return y

    def backward(self, dy):
        r, p = self.r, self.p
        dyr, dgates = permute.unpermute_backward(dy, self.yr, self.slots, self.gates)
        g = {}
        dh = fp8_gemm.fp8_grouped_gemm(_q(dyr, r.dgrad.a), _q(_t3(p["w2"]), r.dgrad.b), self.off)
        g["w2"] = fp8_gemm.fp8_grouped_wgrad(_q(_t(dyr), r.wgrad.a), _xt(r, self.qh, self.h), self.off)
        du = swiglu.backward(self.u, dh)
        dxr = fp8_gemm.fp8_grouped_gemm(_q(du, r.dgrad.a), _q(_t3(p["w1"]), r.dgrad.b), self.off)
        g["w1"] = fp8_gemm.fp8_grouped_wgrad(_q(_t(du), r.wgrad.a), _xt(r, self.qx, self.rows), self.off)
        dx = permute.permute_backward(dxr, self.slots)
        # the router, through the gates: the spec's arithmetic on the (T, k) values, on the host
        dlogits = cuda.to_device(gate_backward(*(a.copy_to_host() for a in (self.logits, self.ids, self.gates,
                                                                           dgates))))
        g["wr"] = gemm.gemm(_t(dlogits), self.x)
        elementwise.add(dx, gemm.gemm(dlogits, p["wr"]), dx)
        if "ws1" in p:
            dxs, g["ws1"], g["ws2"] = self.shared.backward(dy)
            elementwise.add(dx, dxs, dx)
        return dx, g
