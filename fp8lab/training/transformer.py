"""DeepSeek-V3 in miniature, in NumPy: a decoder-only Transformer whose feed-forward layers are routed experts, the
spec the kernel engine of `arch="transformer"` is held to.

    ids (B, T) --embedding + learned positions--> x (B T, D)
    L times:   x = x + Wo attention(Wqkv RMSNorm(x))        causal self-attention, H heads of D / H, in BF16
               x = x + experts(RMSNorm(x))                    fp8lab.training.experts.ExpertLayer, the recipe's GEMMs
    logits = Wh RMSNorm(x) (B T, V);  loss = mean softmax cross-entropy against the next character at every position

Attention runs in BF16 as in DeepSeek-V3 (arXiv 2412.19437, section 3.3): its projections Wqkv and Wo as BF16
Linears and q, k, v rounded to bfloat16 (numerics.ops.attention), except in the fp32 recipe, which keeps everything
in float32; the experts' GEMMs run in the recipe (FP8 in fp8-deepseek). The embeddings, norms, softmax, router and
head stay in float32. Each block's balancing bias (E,) is state: `TransformerModel.update_biases(gamma)` moves it
after a step by the loads of that step.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _validate as V
from ..numerics import ops, recipes
from . import experts as X
from .engine_reference import Linear

F32 = np.float32


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """vocab V, context T characters, width D, heads H (D % H == 0), blocks L, routed experts E of which each token
    takes top_k, each a SwiGLU of width hidden; a shared expert of width shared (0: none)."""

    vocab: int
    context: int
    width: int
    heads: int
    blocks: int
    experts: int
    top_k: int
    hidden: int
    shared: int = 0

    def __post_init__(self):
        for name in ("vocab", "context", "width", "heads", "blocks", "experts", "top_k", "hidden"):
            V.positive_int(name, getattr(self, name))
        if self.width % self.heads:
            raise ValueError(f"width must be a multiple of heads ({self.heads}), got {self.width}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k must be at most experts ({self.experts}), got {self.top_k}")
        if self.shared < 0:
            raise ValueError(f"shared must be an int >= 0 (0: no shared expert), got {self.shared}")


def init_params(cfg: TransformerConfig, seed: int = 0) -> dict:
    """float32 parameters by name: "emb" (V, D), "pos" (T, D), per block i "g1_i", "wqkv_i" (3D, D), "wo_i" (D, D),
    "g2_i" and the expert layer's ("wr_i", "w1_i", "w2_i", "ws1_i", "ws2_i"), then "gf" and "head" (V, D)."""
    rng = np.random.default_rng(seed)
    D = cfg.width
    p = {"emb": (rng.standard_normal((cfg.vocab, D)) * 0.5).astype(F32),
         "pos": (rng.standard_normal((cfg.context, D)) * 0.1).astype(F32)}
    for i in range(cfg.blocks):
        p[f"g1_{i}"] = np.ones(D, F32)
        p[f"wqkv_{i}"] = (rng.standard_normal((3 * D, D)) / np.sqrt(D)).astype(F32)
        p[f"wo_{i}"] = (rng.standard_normal((D, D)) / np.sqrt(D * 2 * cfg.blocks)).astype(F32)
        p[f"g2_{i}"] = np.ones(D, F32)
        for name, w in X.init_params(rng, D, cfg.hidden, cfg.experts, cfg.shared or None).items():
            p[f"{name}_{i}"] = w
    p["gf"] = np.ones(D, F32)
    p["head"] = (rng.standard_normal((cfg.vocab, D)) / np.sqrt(D)).astype(F32)
    return p


def _expert_params(p: dict, i: int) -> dict:
    return {name: p[f"{name}_{i}"] for name in ("wr", "w1", "w2", "ws1", "ws2") if f"{name}_{i}" in p}


class TransformerModel:
    """Forward and backward of the whole model in one recipe (NumPy float32): loss(params, ids, targets) -> (mean
    cross-entropy, {name: gradient}); biases: each block's balancing bias; loads: each block's expert loads in the
    last forward."""

    def __init__(self, cfg: TransformerConfig, recipe):
        self.cfg, self.recipe = cfg, recipes.get(recipe)
        self.bf16 = self.recipe.gemm_precision != "fp32"  # attention in BF16 but in the float32 baseline
        self.attn_recipe = "bf16" if self.bf16 else "fp32"
        self.biases = [np.zeros(cfg.experts, F32) for _ in range(cfg.blocks)]
        self.loads = [None] * cfg.blocks
        self.routes = [None] * cfg.blocks  # each block's chosen experts (T tokens, top_k) in the last forward

    def _heads(self, a, B: int):
        """(B T, D) -> (B, H, T, D / H)."""
        c = self.cfg
        return np.ascontiguousarray(a.reshape(B, c.context, c.heads, c.width // c.heads).transpose(0, 2, 1, 3))

    def _merge(self, a):
        """(B, H, T, D / H) -> (B T, D)."""
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).reshape(-1, self.cfg.width)

    def loss(self, params: dict, ids, targets, grads: bool = True):
        c, p = self.cfg, params
        ids = np.asarray(ids)
        B, T = ids.shape
        if T != c.context or np.shape(targets) != (B, T):
            raise ValueError(f"ids and targets must be (B, {c.context}) (context {c.context}), got {ids.shape} and "
                             f"{np.shape(targets)}")
        x = (p["emb"][ids] + p["pos"][None, :T]).reshape(B * T, c.width).astype(F32)
        saved = []
        for i in range(c.blocks):
            z1, r1 = ops.rmsnorm(x, p[f"g1_{i}"])
            lq = Linear(self.attn_recipe)
            qkv = lq.forward(z1, p[f"wqkv_{i}"]).astype(F32)
            q, k, v = (self._heads(qkv[:, j * c.width:(j + 1) * c.width], B) for j in range(3))
            o, prob = ops.attention(q, k, v, True, self.bf16)
            lo = Linear(self.attn_recipe)
            x1 = (x + lo.forward(self._merge(o), p[f"wo_{i}"])).astype(F32)
            z2, r2 = ops.rmsnorm(x1, p[f"g2_{i}"])
            ex = X.ExpertLayer(self.recipe, c.experts, c.top_k)
            x2 = (x1 + ex.forward(z2, _expert_params(p, i), self.biases[i])).astype(F32)
            self.loads[i], self.routes[i] = ex.loads, ex.ids
            saved.append((x, z1, r1, lq, q, k, v, o, prob, lo, x1, z2, r2, ex))
            x = x2
        zf, rf = ops.rmsnorm(x, p["gf"])
        logits = (zf @ p["head"].T).astype(F32)
        loss, dlogits = ops.cross_entropy(logits, np.asarray(targets).reshape(-1))
        if not grads:
            return loss, None
        g = {"head": (dlogits.T @ zf).astype(F32)}
        dx, g["gf"] = ops.rmsnorm_backward((dlogits @ p["head"]).astype(F32), x, p["gf"], rf)
        for i in reversed(range(c.blocks)):
            x0, z1, r1, lq, q, k, v, o, prob, lo, x1, z2, r2, ex = saved[i]
            dz2, ge = ex.backward(dx)
            for name, gw in ge.items():
                g[f"{name}_{i}"] = gw
            d, g[f"g2_{i}"] = ops.rmsnorm_backward(dz2, x1, p[f"g2_{i}"], r2)
            dx = (dx + d).astype(F32)  # x1's gradient: the skip plus the expert branch
            do, g[f"wo_{i}"] = lo.backward(dx)
            dq, dk, dv = ops.attention_backward(self._heads(do.astype(F32), B), q, k, v, o, prob, self.bf16)
            dqkv = np.concatenate([self._merge(a) for a in (dq, dk, dv)], axis=1)
            dz1, g[f"wqkv_{i}"] = lq.backward(dqkv)
            d, g[f"g1_{i}"] = ops.rmsnorm_backward(dz1.astype(F32), x0, p[f"g1_{i}"], r1)
            dx = (dx + d).astype(F32)
        demb = np.zeros_like(p["emb"])
        dx3 = dx.reshape(B, T, c.width)
        np.add.at(demb, ids, dx3)
        g["emb"], g["pos"] = demb, dx3.sum(axis=0).astype(F32)
        return loss, {k: np.asarray(v, F32) for k, v in g.items()}

    def update_biases(self, gamma: float) -> None:
        """Each block's balancing bias, one step of DeepSeek-V3's rule from the last forward's loads."""
        if any(loads is None for loads in self.loads):
            raise ValueError("update_biases needs the loads of a forward: call loss() first")
        self.biases = [X.update_bias(b, loads, gamma) for b, loads in zip(self.biases, self.loads)]
