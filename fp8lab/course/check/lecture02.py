"""Lecture 02's exercises: when an int8 grid with one global scale loses half the values of (d)'s tensor
(recomputed as the cell of (d) does), and Adam's first step for a gradient as small as eps (fp8lab.kernels.optim's
NumPy twin of the Adam kernel)."""

from __future__ import annotations

import functools
import inspect

import numpy as np

from ...kernels import optim
from ._lecture import Wrong, as_number, close, exercise, matching_hint

__all__ = ["ex2", "ex5", "int8_flushed", "adam_first_step"]


def int8_flushed(factor) -> float:
    """Share of (d)'s tensor (seed 0: 2^14 Gaussian values, 16 of them multiplied by `factor`) that the int8 grid
    with scale amax / 127 flushes to 0, computed as the cell of (d) does."""
    rng_d = np.random.default_rng(0)
    data = rng_d.standard_normal(1 << 14).astype(np.float32)
    data[rng_d.choice(data.size, 16, replace=False)] *= factor
    s8 = np.abs(data).max() / np.float32(127)
    back = np.clip(np.rint(data / s8), -127, 127) * s8
    return float(np.mean(back == 0))


@functools.lru_cache(maxsize=None)
def _first_half(limit: int = 100_000) -> int:
    f = 1
    while int8_flushed(f) < 0.5:
        f += 1
        if f > limit:  # cannot happen with (d)'s data; a guard, not a result
            raise RuntimeError("int8 never flushed half of the values")
    return f


@exercise(2, 2, "in (d), replace the 50 by a factor f and print np.mean(int8_back == 0) for a few f")
def ex2(answer):
    """The smallest whole factor of (d)'s outliers at which the int8 grid flushes at least half the values to 0."""
    got = as_number(answer, "one whole number, the outliers' factor")
    want = _first_half()
    if got != want:
        if 0 < got < 1:
            hint = "give the outliers' factor (the 50 of the cell), not a share of values"
        elif got != int(got) or got < 1:
            hint = "the factor is a whole number >= 1 (the cell multiplies 16 values by it)"
        elif got < want:
            hint = f"at {got:g} int8 flushes only {int8_flushed(got):.1%} of the values: not yet half"
        else:
            hint = (f"at {got - 1:g} int8 already flushes {int8_flushed(got - 1):.1%} of the values: the first such "
                    "factor is smaller")
        raise Wrong(f"your answer {answer!r} is not the first factor where int8 loses half the values", hint)
    return (f"factor {want}: int8 flushes {int8_flushed(want):.1%} (at {want - 1}: {int8_flushed(want - 1):.1%}), "
            "every value under half a step, amax / 254")


def adam_first_step(g: float, lr: float = 1e-3) -> float:
    """How much Adam's first step (zero moments, optim's defaults) decreases a parameter whose gradient is g."""
    p = np.zeros(1, np.float32)
    m, v = np.zeros(1, np.float32), np.zeros(1, np.float32)
    optim.reference_adam(p, np.array([g], np.float32), m, v, 1, lr=lr)
    return float(-p[0])


@exercise(2, 5, "write Adam's update for t = 1 from zero moments, or run optim.reference_adam on one parameter")
def ex5(answer):
    """p_before - p_after in Adam's first step for a gradient of 1e-8, lr = 1e-3 (optim.Adam's defaults)."""
    got = as_number(answer, "one number, p_before - p_after")
    g, lr = 1e-8, 1e-3
    defaults = {k: p.default for k, p in inspect.signature(optim.reference_adam).parameters.items()}
    b1, b2, eps = defaults["b1"], defaults["b2"], defaults["eps"]
    want = adam_first_step(g, lr)
    if not close(got, want, rel=1e-4):
        no_bias = lr * ((1 - b1) * g) / (np.sqrt((1 - b2) * g * g) + eps)
        hint = matching_hint(got, [
            (-want, "Adam moves p against the gradient: with g > 0 p decreases; give p_before - p_after (positive)"),
            (lr, "far from eps the first step is about lr; here |g| equals eps, which weighs as much as sqrt(v) "
                 "in the denominator"),
            (lr * g, "that is plain SGD, lr * g: Adam divides by sqrt(v) + eps"),
            (no_bias, "bias correction: at t = 1, m / (1 - b1) and v / (1 - b2) give back g and g * g"),
        ], rel=1e-3, default="p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), with m and v updated first")
        raise Wrong(f"your answer {got:g} is not how far Adam's first step moves this parameter", hint)
    return f"{want:.6g}: half of lr, because |g| = eps (the first step is lr * g / (|g| + eps))"
