"""The capstone's model: a character-level language model, and its training step in NumPy (the reference engine).

    ids (M, C) --embedding--> x (M, D = C * E)        the last C characters, each embedded in E numbers, side by side
    L times:   x = x + W2 · SwiGLU(W1 · RMSNorm(x))    W1 (2F, D), W2 (D, F): a pre-norm residual MLP block
    logits = Wh · RMSNorm(x)  (M, V);  loss = softmax cross-entropy against the next character

A Bengio-style (2003) fixed-context model rather than a Transformer: every GEMM is a Linear layer as in
DeepSeek-V3's MLPs, and the context lives in the concatenated embeddings, so no attention kernel is needed while
the model still has to use the preceding characters (a single character predicts the next one at about 3.5 bits, the
bigram model of this corpus; a context of 16 gets well below).

Recipes (which precision each GEMM of a Linear runs in: Fprop y = x W^T, Dgrad dx = dy W, Wgrad dW = dy^T x):
  fp32          float32 everywhere.
  bf16          the GEMM inputs rounded to bfloat16 (ties to even), float32 accumulation.
  fp8-tensor    E4M3 with one current scale per tensor for x, W and dy.
  fp8-deepseek  E4M3 as DeepSeek-V3 (arXiv 2412.19437, section 3.3): activations and gradients in 1 x 128 tiles
                along the contraction, weights in 128 x 128 blocks; Wgrad uses the FP8 x cached by Fprop,
                re-quantized from 1 x 128 to 128 x 1 tiles; AdamW moments stored in bfloat16.
In every recipe the embedding, the output head, the norms, SwiGLU and the softmax stay in float32 (DeepSeek-V3
keeps embedding, output head, normalization and attention in BF16/FP32), master weights and gradients are float32,
and an EMA of the weights is kept on the CPU.

Outlier channels (Config.outliers = s, a power of two): W1's GEMMs run on z * d and W1 / d, where d is s on
OUTLIER_CHANNELS fixed channels (inside one 1 x 128 tile of W1's input) and 1 elsewhere. The product is the same in
exact arithmetic, and bit for bit in fp32 and bf16 (scaling by a power of two is exact), so only the FP8 scales see
the change. Large activation channels are what LLMs grow (LLM.int8(), arXiv 2208.07339: outliers concentrated in 6
feature dimensions at 6.7B parameters; "massive activations", arXiv 2402.17762, up to 10^4-10^5 times the median,
on a few tokens); here the weights that read them are made small so that the layer computes the same function.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import _validate as V
from ..numerics import formats, spec

RECIPES = ("fp32", "bf16", "fp8-tensor", "fp8-deepseek")
DECAYED = ("w1_", "w2_", "head")  # AdamW's weight decay: the Linear weights, not the embedding or the norm gains
EPS = spec.RMSNORM_EPS
F32 = np.float32
# LLM.int8() finds about 6 systematic outlier dimensions of 4096 (6.7B parameters); 2 of 512 is denser. They sit in
# one 1 x 128 tile of W1's input, so every other tile of a row is free of them
OUTLIER_CHANNELS = 2
OUTLIER_SEED = 2208
MAX_OUTLIER_LOG2 = 20


@dataclasses.dataclass(frozen=True)
class Config:
    """Model sizes: vocabulary V, context C characters, embedding E per character (width D = C * E), SwiGLU width
    F, and the number of residual blocks."""

    vocab: int
    context: int
    embed: int
    hidden: int
    blocks: int
    outliers: float = 1.0  # the magnitude of the outlier channels of W1's input (1: none); see the module docstring

    def __post_init__(self):
        for name in ("vocab", "context", "embed", "hidden", "blocks"):
            V.positive_int(name, getattr(self, name))
        s = self.outliers
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, float, np.integer, np.floating)):
            raise TypeError(f"outliers must be a power of two from 1 to 2**{MAX_OUTLIER_LOG2}, got {V.describe(s)}")
        if not (1 <= s <= 2**MAX_OUTLIER_LOG2 and math.frexp(s)[0] == 0.5):  # NaN fails too
            raise ValueError(f"outliers must be a power of two from 1 to 2**{MAX_OUTLIER_LOG2} (exact scaling keeps "
                             f"fp32 and bf16 unchanged), got {s!r}")
        object.__setattr__(self, "outliers", float(s))

    @property
    def width(self) -> int:
        return self.context * self.embed


def outlier_scales(cfg: Config) -> np.ndarray | None:
    """float32 (D,): cfg.outliers on OUTLIER_CHANNELS channels of one 1 x 128 tile, drawn once (the same in every
    block and every run), 1 elsewhere; None when cfg.outliers is 1."""
    if cfg.outliers == 1:
        return None
    d = np.ones(cfg.width, F32)
    rng = np.random.default_rng(OUTLIER_SEED)
    lo = spec.GROUP_K * int(rng.integers(-(-cfg.width // spec.GROUP_K)))  # one tile of the row, drawn once
    hi = min(cfg.width, lo + spec.GROUP_K)
    d[lo + rng.choice(hi - lo, min(OUTLIER_CHANNELS, hi - lo), replace=False)] = cfg.outliers
    return d


def param_shapes(cfg: Config) -> dict:
    """{name: shape} of the parameters, in init_params' order (the layout of a flat buffer of them)."""
    D, F = cfg.width, cfg.hidden
    shapes = {"emb": (cfg.vocab, cfg.embed)}
    for i in range(cfg.blocks):
        shapes.update({f"g{i}": (D,), f"w1_{i}": (2 * F, D), f"w2_{i}": (D, F)})
    shapes.update({"gf": (D,), "head": (cfg.vocab, D)})
    return shapes


def init_params(cfg: Config, seed: int) -> dict:
    """float32 parameters: normal embeddings, Linear weights scaled by 1 / sqrt(fan-in) (W2 further by
    1 / sqrt(2 L), so the residual stream does not grow with depth), norm gains 1."""
    rng = np.random.default_rng(seed)
    D, F = cfg.width, cfg.hidden

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(F32)

    p = {"emb": normal((cfg.vocab, cfg.embed), 1.0)}
    for i in range(cfg.blocks):
        p[f"g{i}"] = np.ones(D, F32)
        p[f"w1_{i}"] = normal((2 * F, D), 1 / math.sqrt(D))
        p[f"w2_{i}"] = normal((D, F), 1 / math.sqrt(F * 2 * cfg.blocks))
    p["gf"] = np.ones(D, F32)
    p["head"] = normal((cfg.vocab, D), 1 / math.sqrt(D))
    return p


# ----------------------------------------------------------------------------------------------------------------
# The three GEMMs of a Linear layer in each recipe
# ----------------------------------------------------------------------------------------------------------------


def _deq(codes, scale, gm, gk):
    return spec.dequantize(codes, scale, gm, gk)


def _fp8_tensor(x):
    codes, scale, _ = spec.quantize_tensor(x)
    return formats.decode(codes) * scale


class Linear:
    """y = x W^T and its backward in one recipe. The forward caches what the backward needs (in fp8-deepseek the
    FP8 codes and scales of x, as DeepSeek-V3 caches the FP8 input for Wgrad)."""

    def __init__(self, recipe: str):
        self.recipe = V.choice("recipe", recipe, RECIPES)

    def forward(self, x, w):
        r = self.recipe
        if r == "fp32":
            self.cache = (x, w)
            return x @ w.T
        if r == "bf16":
            xb, wb = formats.round_bf16(x), formats.round_bf16(w)
            self.cache = (xb, wb)
            return xb @ wb.T
        if r == "fp8-tensor":
            xq, wq = _fp8_tensor(x), _fp8_tensor(w)
            self.cache = (xq, wq)
            return xq @ wq.T
        xc, xs, _ = spec.quantize(x, "tile")      # 1 x 128 tiles along K
        wc, ws, _ = spec.quantize(w, "block")     # 128 x 128 blocks
        self.cache = (xc, xs, wc, ws)
        return _deq(xc, xs, 1, spec.GROUP_K) @ _deq(wc, ws, spec.GROUP_K, spec.GROUP_K).T

    def backward(self, dy):
        """(dx, dW) for the output gradient dy."""
        r = self.recipe
        if r in ("fp32", "bf16", "fp8-tensor"):
            x, w = self.cache
            if r == "bf16":
                dy = formats.round_bf16(dy)
            elif r == "fp8-tensor":
                dy = _fp8_tensor(dy)
            return dy @ w, dy.T @ x
        xc, xs, wc, ws = self.cache
        G = spec.GROUP_K
        dc, ds, _ = spec.quantize(dy, "tile")  # Dgrad: dy in 1 x 128 tiles along N, W's blocks as they are
        dx = _deq(dc, ds, 1, G) @ _deq(wc, ws, G, G)
        dtc, dts, _ = spec.quantize(np.ascontiguousarray(dy.T), "tile")  # Wgrad: contraction over the tokens
        xtc, xts = spec.requantize_tile_to_col(xc, xs)                   # the cached FP8 x, re-tiled 128 x 1
        dw = _deq(dtc, dts, 1, G) @ _deq(xtc, xts, 1, G).T
        return dx, dw


# ----------------------------------------------------------------------------------------------------------------
# The other ops, float32
# ----------------------------------------------------------------------------------------------------------------


def rmsnorm(x, g):
    rstd = (F32(1) / np.sqrt((x * x).mean(axis=1) + EPS)).astype(F32)
    return (x * rstd[:, None] * g).astype(F32), rstd


def rmsnorm_backward(dz, x, g, rstd):
    """(dx, dg) of z = x * rstd * g."""
    dot = (dz * g * x).sum(axis=1)
    dx = rstd[:, None] * g * dz - (rstd**3 * dot / F32(x.shape[1]))[:, None] * x
    return dx.astype(F32), (dz * x * rstd[:, None]).sum(axis=0).astype(F32)


def _sigmoid(a):
    return (F32(0.5) * (F32(1) + np.tanh(F32(0.5) * a))).astype(F32)  # no overflow for any finite a


def swiglu(u):
    F = u.shape[1] // 2
    a, b = u[:, :F], u[:, F:]
    return (a * _sigmoid(a) * b).astype(F32)


def swiglu_backward(dh, u):
    F = u.shape[1] // 2
    a, b = u[:, :F], u[:, F:]
    s = _sigmoid(a)
    return np.concatenate([dh * b * s * (F32(1) + a * (F32(1) - s)), dh * a * s], axis=1).astype(F32)


def cross_entropy(logits, targets):
    """(mean loss in nats, dlogits) of softmax cross-entropy, the row max subtracted first."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    rows = np.arange(len(targets))
    loss = float((np.log(s[:, 0].astype(np.float64)) - z[rows, targets]).mean())
    d = e / s
    d[rows, targets] -= F32(1)
    return loss, (d / F32(len(targets))).astype(F32)


# ----------------------------------------------------------------------------------------------------------------
# Forward, backward, optimizer
# ----------------------------------------------------------------------------------------------------------------


class Model:
    """Forward and backward of the whole model in one recipe (NumPy float32)."""

    def __init__(self, cfg: Config, recipe: str):
        self.cfg, self.recipe = cfg, V.choice("recipe", recipe, RECIPES)
        self.lin1 = [Linear(recipe) for _ in range(cfg.blocks)]
        self.lin2 = [Linear(recipe) for _ in range(cfg.blocks)]
        self.d = outlier_scales(cfg)

    def _forward(self, p, ids):
        cfg = self.cfg
        M = ids.shape[0]
        x = p["emb"][ids].reshape(M, cfg.width)
        saved = []
        for i in range(cfg.blocks):
            z, rstd = rmsnorm(x, p[f"g{i}"])
            w1 = p[f"w1_{i}"]
            u = self.lin1[i].forward(z, w1) if self.d is None else self.lin1[i].forward(z * self.d, w1 / self.d)
            h = swiglu(u)
            saved.append((x, rstd, u))
            x = (x + self.lin2[i].forward(h, p[f"w2_{i}"])).astype(F32)
        zf, rstdf = rmsnorm(x, p["gf"])
        return x, saved, zf, rstdf, zf @ p["head"].T

    def logits(self, p, ids) -> np.ndarray:
        """float32 (M, V) logits of the next character after each window of ids (M, C), in this recipe."""
        return self._forward(p, np.asarray(ids))[-1]

    def loss(self, p, ids, targets, grads: bool = True):
        """Mean cross-entropy (nats) of predicting targets from ids; with grads=True also {name: gradient}."""
        cfg = self.cfg
        x, saved, zf, rstdf, logits = self._forward(p, ids)
        loss, dlogits = cross_entropy(logits, targets)
        if not grads:
            return loss
        g = {"head": dlogits.T @ zf}
        dx, g["gf"] = rmsnorm_backward(dlogits @ p["head"], x, p["gf"], rstdf)
        for i in reversed(range(cfg.blocks)):
            x_in, rstd, u = saved[i]
            dh, g[f"w2_{i}"] = self.lin2[i].backward(dx)
            dz, g[f"w1_{i}"] = self.lin1[i].backward(swiglu_backward(dh, u))
            if self.d is not None:  # the gradients of z and W1 from those of z * d and W1 / d
                dz, g[f"w1_{i}"] = dz * self.d, g[f"w1_{i}"] / self.d
            dxn, g[f"g{i}"] = rmsnorm_backward(dz, x_in, p[f"g{i}"], rstd)
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
    """AdamW (Loshchilov & Hutter) on float32 master weights; weight decay on the Linear weights only. The moments
    are stored in bfloat16 (rounded after every update, as DeepSeek-V3 stores them) unless moments="fp32"."""

    def __init__(self, params: dict, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, moments="bf16"):
        self.lr, (self.b1, self.b2), self.eps, self.wd = F32(lr), (F32(betas[0]), F32(betas[1])), F32(eps), \
            F32(weight_decay)
        self.moments = V.choice("moments", moments, ("bf16", "fp32"))
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, params: dict, grads: dict) -> None:
        self.t += 1
        bc1 = F32(1 - self.b1**self.t)
        bc2 = F32(1 - self.b2**self.t)
        store = formats.round_bf16 if self.moments == "bf16" else (lambda a: a)
        for k, p in params.items():
            g = grads[k]
            m = store(self.b1 * self.m[k] + (F32(1) - self.b1) * g)
            v = store(self.b2 * self.v[k] + (F32(1) - self.b2) * g * g)
            self.m[k], self.v[k] = m, v
            if k.startswith(DECAYED):
                p *= F32(1) - self.lr * self.wd
            p -= (self.lr * (m / bc1) / (np.sqrt(v / bc2) + self.eps)).astype(F32)
