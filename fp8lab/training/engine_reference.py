"""The capstone's reference engine: fp8lab.training.model's model, forward and backward in NumPy float32, each Linear's
three GEMMs in a recipe's precisions (fp8lab.numerics.recipes), the other ops from fp8lab.numerics.ops.

This is the spec the kernel engine (engine_kernels) is checked against step by step (`Recipe.reference_rtol`), and
`fl.train(..., engine="reference")` runs it: fast anywhere, since NumPy runs each op as one call.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from ..numerics import formats, ops, recipes, spec
from ..numerics.spec import GROUP_K
from .model import DECAYED, Config, outlier_scales

F32 = np.float32


def quantized(x, op: recipes.Operand):
    """(the float32 values a GEMM sees for x in precision `op`, the FP8 (codes, scales) or None): float32 x itself,
    bfloat16-rounded x, or x quantized per tensor / in 1 x 128 tiles / in 128 x 128 blocks and dequantized (the
    scales of fine-grained groups by op.scale_mode: "amax" or "pow2")."""
    if op.precision == "fp32":
        return x, None
    if op.precision == "bf16":
        return formats.round_bf16(x), None
    if op.granularity == "tensor":
        codes, scale, _ = spec.quantize_tensor(x, op.precision)
        return formats.decode(codes, op.precision) * scale, (codes, scale)
    codes, scale, _ = spec.quantize(x, op.granularity, op.precision, mode=op.scale_mode)
    gm, gk = spec.group_shape(op.granularity, x.shape)
    return spec.dequantize(codes, scale, gm, gk, op.precision), (codes, scale)


def _t(a):
    return np.ascontiguousarray(a.T)


class Linear:
    """y = x W^T and its backward in one recipe (a Recipe or its name). The forward keeps what the backward needs,
    and only that (`cache`): in DeepSeek-V3's recipe the FP8 codes and scales of x and W.

    Each GEMM runs in the NT layout of fp8lab.numerics.recipes: Fprop x (M, K) @ W (N, K)^T, Dgrad dy (M, N) @
    (W^T (K, N))^T, Wgrad dy^T (N, M) @ (x^T (K, M))^T. An operand scaled per tensor or per 128 x 128 block (or not
    scaled) is quantized once and transposed where another GEMM needs it (exact); tiles are quantized in each GEMM's
    layout, from float32, except x^T re-tiled from Fprop's codes where the recipe says so."""

    def __init__(self, recipe):
        self.recipe = r = recipes.get(recipe)
        self._w_reused = _same(r.dgrad.b, r.fprop.b)
        self._dy_reused = _same(r.wgrad.a, r.dgrad.a)
        self._x_reused = _same(r.wgrad.b, r.fprop.a)

    def forward(self, x, w):
        r = self.recipe
        xa, self.x_fp8 = quantized(x, r.fprop.a)
        wb, self.w_fp8 = quantized(w, r.fprop.b)
        self.saved_w = wb if self._w_reused else w
        self.saved_x = None if r.wgrad_x_from_fprop else xa if self._x_reused else x
        return xa @ wb.T

    @property
    def cache(self) -> tuple:
        """What the last forward kept for the backward: an FP8 recipe's (x codes, x scales, W codes, W scales), else
        the GEMM's inputs (x, W)."""
        if self.recipe.gemm_precision == "fp8":
            return (*self.x_fp8, *self.w_fp8)
        return self.saved_x, self.saved_w

    def backward(self, dy, need_dx: bool = True):
        """(dx, dW) for the output gradient dy; dx is None when need_dx is False (an input that is data)."""
        r = self.recipe
        dya, _ = quantized(dy, r.dgrad.a)  # Dgrad's a; Wgrad's dy^T reuses it where it transposes exactly
        dx = None
        if need_dx:
            wt = self.saved_w.T if self._w_reused else quantized(_t(self.saved_w), r.dgrad.b)[0]
            dx = dya @ wt.T
        dyt = dya.T if self._dy_reused else quantized(_t(dy), r.wgrad.a)[0]
        if r.wgrad_x_from_fprop:  # the cached FP8 x re-quantized from 1 x 128 to 128 x 1 tiles, never from float32
            codes, scale = self.x_fp8
            ct, st = spec.requantize_tile_to_col(codes, scale, r.wgrad.b.precision,
                                                 mode=r.wgrad.b.scale_mode)
            xt = spec.dequantize(ct, st, 1, GROUP_K, r.wgrad.b.precision)
        else:
            xt = self.saved_x.T if self._x_reused else quantized(_t(self.saved_x), r.wgrad.b)[0]
        return dx, dyt @ xt.T


def _same(later: recipes.Operand, earlier: recipes.Operand) -> bool:
    """A later GEMM's operand is the earlier one's values, transposed: the same precision and scaling, and a layout
    that transposes exactly (not scaled, per tensor, or 128 x 128 blocks)."""
    return later == earlier and (not later.fp8 or later.exact_transpose)


class Model:
    """Forward and backward of the whole model in one recipe (NumPy float32)."""

    def __init__(self, cfg: Config, recipe):
        self.cfg, self.recipe = cfg, recipes.get(recipe)
        self.lin1 = [Linear(self.recipe) for _ in range(cfg.blocks)]
        self.lin2 = [Linear(self.recipe) for _ in range(cfg.blocks)]
        self.d = outlier_scales(cfg)

    def _forward(self, p, ids):
        cfg = self.cfg
        M = ids.shape[0]
        x = p["emb"][ids].reshape(M, cfg.width)
        saved = []
        for i in range(cfg.blocks):
            z, rstd = ops.rmsnorm(x, p[f"g{i}"])
            w1 = p[f"w1_{i}"]
            u = self.lin1[i].forward(z, w1) if self.d is None else self.lin1[i].forward(z * self.d, w1 / self.d)
            h = ops.swiglu(u)
            saved.append((x, rstd, u))
            x = (x + self.lin2[i].forward(h, p[f"w2_{i}"])).astype(F32)
        zf, rstdf = ops.rmsnorm(x, p["gf"])
        return x, saved, zf, rstdf, zf @ p["head"].T

    def logits(self, p, ids) -> np.ndarray:
        """float32 (M, V) logits of the next character after each window of ids (M, C), in this recipe."""
        return self._forward(p, np.asarray(ids))[-1]

    def loss(self, p, ids, targets, grads: bool = True):
        """Mean cross-entropy (nats) of predicting targets from ids; with grads=True also {name: gradient}."""
        cfg = self.cfg
        x, saved, zf, rstdf, logits = self._forward(p, ids)
        loss, dlogits = ops.cross_entropy(logits, targets)
        if not grads:
            return loss
        g = {"head": dlogits.T @ zf}
        dx, g["gf"] = ops.rmsnorm_backward(dlogits @ p["head"], x, p["gf"], rstdf)
        for i in reversed(range(cfg.blocks)):
            x_in, rstd, u = saved[i]
            dh, g[f"w2_{i}"] = self.lin2[i].backward(dx)
            dz, g[f"w1_{i}"] = self.lin1[i].backward(ops.swiglu_backward(dh, u))
            if self.d is not None:  # the gradients of z and W1 from those of z * d and W1 / d
                dz, g[f"w1_{i}"] = dz * self.d, g[f"w1_{i}"] / self.d
            dxn, g[f"g{i}"] = ops.rmsnorm_backward(dz, x_in, p[f"g{i}"], rstd)
            dx = (dx + dxn).astype(F32)
        demb = np.zeros_like(p["emb"])
        np.add.at(demb, ids.reshape(-1), dx.reshape(-1, cfg.embed))
        g["emb"] = demb
        return loss, {k: v.astype(F32) for k, v in g.items()}


def generate(model: Model, p: dict, prompt_ids, count: int, rng: np.random.Generator, temperature: float = 0.8):
    """`count` character ids sampled one at a time after prompt_ids (1-D, at least one id), each from the softmax of
    the logits / temperature given the last `context` ids (the prompt left-padded with its first id if shorter)."""
    C = model.cfg.context
    ids = list(int(i) for i in prompt_ids)
    ids = [ids[0]] * max(0, C - len(ids)) + ids
    out = []
    for _ in range(count):
        z = model.logits(p, np.array([ids[-C:]], np.int64))[0].astype(np.float64) / temperature
        w = np.exp(z - z.max())
        nxt = int(rng.choice(len(w), p=w / w.sum()))
        ids.append(nxt)
        out.append(nxt)
    return np.array(out, np.int32)


class AdamW:
    """AdamW (Loshchilov & Hutter) on float32 master weights, weight decay on the Linear weights only (DECAYED),
    one numerics.ops.adamw step per parameter. The moments are stored in bfloat16 (rounded after every update, as
    DeepSeek-V3 stores them) unless moments="fp32"."""

    def __init__(self, params: dict, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, moments="bf16"):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.moments = V.choice("moments", moments, recipes.MOMENTS)
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, params: dict, grads: dict) -> None:
        self.t += 1
        for k, p in params.items():
            ops.adamw(p, grads[k], self.m[k], self.v[k], self.t, self.lr, self.b1, self.b2, self.eps, self.wd,
                      decay=k.startswith(DECAYED), moments=self.moments)
