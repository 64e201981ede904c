"""The float32 arithmetic of the model's ops, stated once: what the NumPy engine and the teacher task run.

Every function takes and returns float32 NumPy arrays and rounds where a float32 program rounds, so the NumPy
engine is a spec the kernel engine can be held to step by step. The kernel modules keep their own references in
float64 (`kernels.rmsnorm.reference_forward`, `kernels.swiglu.reference_forward`, ...): those are the exact
values a kernel's error is bounded against, not a program to follow.

- rmsnorm / rmsnorm_backward: z = x * rstd * g, rstd = 1 / sqrt(mean(x^2) + eps)
- swiglu / swiglu_backward: h = silu(a) * b for u = [a | b]
- attention / attention_backward: causal softmax(q k^T / sqrt(D)) v, with q, k, v rounded to bfloat16 or not
- cross_entropy: mean softmax cross-entropy (nats) and its gradient, the row max subtracted first
- mse: mean squared error and its gradient (the teacher task)
- adamw_moments / adamw_params: one AdamW step, decoupled weight decay, moments stored in float32 or bfloat16
"""

from __future__ import annotations

import numpy as np

from . import formats, spec

F32 = np.float32
_ONE = F32(1)
EPS = spec.RMSNORM_EPS


def rmsnorm(x, g, eps=EPS):
    """(z, rstd): z = x * rstd[:, None] * g, rstd (M,) = 1 / sqrt(mean(x * x, axis=1) + eps), float32."""
    rstd = (_ONE / np.sqrt((x * x).mean(axis=1) + F32(eps))).astype(F32)
    return (x * rstd[:, None] * g).astype(F32), rstd


def rmsnorm_backward(dz, x, g, rstd):
    """(dx, dg) of z = x * rstd * g, given the forward's rstd."""
    dot = (dz * g * x).sum(axis=1)
    dx = rstd[:, None] * g * dz - (rstd**3 * dot / F32(x.shape[1]))[:, None] * x
    return dx.astype(F32), (dz * x * rstd[:, None]).sum(axis=0).astype(F32)


def sigmoid(a):
    """0.5 (1 + tanh(a / 2)): no overflow for any finite a."""
    return (F32(0.5) * (_ONE + np.tanh(F32(0.5) * a))).astype(F32)


def swiglu(u):
    """h (M, F) = silu(a) * b of u = [a | b] (M, 2F)."""
    F = u.shape[1] // 2
    a, b = u[:, :F], u[:, F:]
    return (a * sigmoid(a) * b).astype(F32)


def swiglu_backward(dh, u):
    """du = [da | db] (M, 2F) for the output gradient dh (M, F)."""
    F = u.shape[1] // 2
    a, b = u[:, :F], u[:, F:]
    s = sigmoid(a)
    return np.concatenate([dh * b * s * (_ONE + a * (_ONE - s)), dh * a * s], axis=1).astype(F32)


def attention(q, k, v, causal: bool = True, bf16: bool = True):
    """(o, p): o = softmax(q k^T / sqrt(D) + mask) v for q, k, v (..., T, D) float32, the row max subtracted first;
    bf16: q, k and v rounded to bfloat16 first (attention in BF16, as DeepSeek-V3 runs it); p the probabilities."""
    if bf16:
        q, k, v = (formats.round_bf16(a) for a in (q, k, v))
    T = q.shape[-2]
    s = (q @ np.swapaxes(k, -1, -2) * F32(1 / np.sqrt(q.shape[-1]))).astype(F32)
    if causal:
        s = np.where(np.tri(T, dtype=bool), s, F32(-np.inf))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = (e / e.sum(axis=-1, keepdims=True)).astype(F32)
    return (p @ v).astype(F32), p


def attention_backward(do, q, k, v, o, p, bf16: bool = True):
    """(dq, dk, dv) for the output gradient do, from the forward's inputs, o and probabilities p (the bfloat16
    rounding, where the forward made it, passes gradients straight through)."""
    if bf16:
        q, k, v = (formats.round_bf16(a) for a in (q, k, v))
    scale = F32(1 / np.sqrt(q.shape[-1]))
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
    return ((ds @ k) * scale).astype(F32), ((np.swapaxes(ds, -1, -2) @ q) * scale).astype(F32), \
        (np.swapaxes(p, -1, -2) @ do).astype(F32)


def cross_entropy(logits, targets):
    """(mean loss in nats, dlogits) of softmax cross-entropy, the row max subtracted first."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True)
    rows = np.arange(len(targets))
    loss = float((np.log(s[:, 0].astype(np.float64)) - z[rows, targets]).mean())
    d = e / s
    d[rows, targets] -= _ONE
    return loss, (d / F32(len(targets))).astype(F32)


def mse(z, t):
    """(mean squared error as a float64 number, dz = 2 (z - t) / size in float32)."""
    d = z - t
    return float((d.astype(np.float64) ** 2).mean()), (F32(2) * d * F32(1.0 / d.size)).astype(F32)


def adamw_bias_corrections(b1, b2, t: int):
    """(bc1, bc2) = float32(1 - b1^t), float32(1 - b2^t), the power taken in float32 (what kernels.optim uses too)."""
    b1, b2 = F32(b1), F32(b2)
    return F32(1 - b1**t), F32(1 - b2**t)


def adamw_moments(g, m, v, b1, b2, moments: str) -> None:
    """m, v in place: m = store(b1 m + (1 - b1) g), v = store(b2 v + (1 - b2) g g), store rounding to bfloat16
    (nearest even) when moments == "bf16", as DeepSeek-V3 stores them."""
    store = formats.round_bf16 if moments == "bf16" else (lambda a: a)
    b1, b2 = F32(b1), F32(b2)
    m[...] = store(b1 * m + (_ONE - b1) * g)
    v[...] = store(b2 * v + (_ONE - b2) * g * g)


def adamw_params(p, m, v, t: int, lr, b1, b2, eps, weight_decay, decay=None) -> None:
    """p in place from the stored m, v: p *= 1 - lr wd where decayed (decay: None = everywhere, True/False, or a
    0/1 array of p's shape), then p -= lr (m / bc1) / (sqrt(v / bc2) + eps)."""
    lr, eps = F32(lr), F32(eps)
    bc1, bc2 = adamw_bias_corrections(b1, b2, t)
    keep = _ONE - lr * F32(weight_decay)
    if decay is None or decay is True:
        p *= keep
    elif decay is not False:
        p[...] = np.where(np.asarray(decay) == 1, p * keep, p)
    p -= (lr * (m / bc1) / (np.sqrt(v / bc2) + eps)).astype(F32)


def adamw(p, g, m, v, t: int, lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, decay=None, moments="bf16") -> None:
    """One AdamW step (t = 1, 2, ...) of float32 p with gradient g, updating p, m, v in place."""
    adamw_moments(g, m, v, b1, b2, moments)
    adamw_params(p, m, v, t, lr, b1, b2, eps, weight_decay, decay)
