"""Delayed scaling, the Transformer Engine way, to contrast with DeepSeek-V3's current (online) scaling.

`DelayedScaling` keeps a history of per-tensor amaxes and derives the scale for step t from steps < t, so the
quantization of step t needs no amax pass over its own tensor. The catch: when the tensor grows, the scale
lags behind and the largest elements saturate. `lagging_experiment` measures exactly that.

`scale` is the DEQUANTIZATION factor, as everywhere in fp8lab (x ~= decode(code) * scale). Transformer Engine's
`DelayedScaling` computes the quantization factor sf = (FP8_MAX / amax) / 2^margin; here
scale = 1 / sf = amax * 2^margin / FP8_MAX (TE's scale_inv). Like TE (`_default_sf_compute`), the scale is
recomputed after each recorded amax, the previous scale is kept when the history's amax is zero or not finite,
and the first scale, before any amax has been recorded, is 1.0. So the scale is a function of the sequence of
recorded amaxes alone (reading it changes nothing). As in current scaling (fp8lab.numerics.spec), an amax below
AMAX_FLOOR is floored, so the scale is never zero; an amax so large that the scale would overflow float32
counts as not finite.

NumPy only: the amax of a tensor is a reduction that kernels/quantize.py already does on the device; this
module is about the bookkeeping.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from .. import _validate as V
from . import formats
from .spec import AMAX_FLOOR, FP8_MAX, fmt_name

ALGOS = ("max", "most_recent")
MAX_MARGIN = {name: int(math.log2(FP8_MAX[name] / formats.FORMATS[name].min_subnormal)) for name in FP8_MAX}
"""Largest margin: 17 (E4M3), 31 (E5M2). 2^margin stays within the format's range (FP8_MAX / smallest subnormal),
so an element at the history's amax still encodes to a nonzero code."""
_F32_MAX = float(np.finfo(np.float32).max)


class DelayedScaling:
    """Scale from an amax history: TE's `DelayedScaling(amax_history_len, amax_compute_algo, margin)`.

    history_len: how many past amaxes are kept (TE default 1024). algo: "max" (the largest amax in the
    history, TE's default) or "most_recent" (the last one). margin: the scale is multiplied by 2^margin
    (headroom: margin 1 leaves one binade free), an int from 0 to MAX_MARGIN[fmt]. fmt: "e4m3" (FP8_MAX 448) or
    "e5m2" (57344), in any spelling fp8lab.quantize takes ("E4M3", fl.E4M3, ...).

    Typical use, one call per step:  scale = ds.scale_for(x)  # from steps before, then records amax(x)
    """

    def __init__(self, history_len: int = 1024, algo: str = "max", margin: int = 0, fmt: str = "e4m3"):
        self.history_len = V.positive_int("history_len", history_len)
        self.algo = V.choice("algo", algo, ALGOS)
        self.fmt = fmt_name(fmt)
        if isinstance(margin, (bool, np.bool_)) or not isinstance(margin, (int, np.integer)):
            raise TypeError(f"margin must be an int (a power-of-two exponent), got {V.describe(margin)}")
        if not 0 <= margin <= MAX_MARGIN[self.fmt]:
            raise ValueError(f"margin must be >= 0 and <= {MAX_MARGIN[self.fmt]} for fmt {self.fmt!r} (2^margin "
                             f"within the format's range, so the scale stays finite and nonzero), got {margin}")
        self.margin = int(margin)
        self.fp8_max = float(FP8_MAX[self.fmt])
        self.history: collections.deque = collections.deque(maxlen=self.history_len)
        self._scale = 1.0  # TE's initial scale (before any amax was seen)

    def history_amax(self) -> float | None:
        """The amax the next scale is computed from (None while the history is empty)."""
        if not self.history:
            return None
        return max(self.history) if self.algo == "max" else self.history[-1]

    @property
    def scale(self) -> np.float32:
        """The dequantization scale for the next step, as update() last set it (see the module docstring)."""
        return np.float32(self._scale)

    def update(self, amax) -> None:
        """Record one amax (a number >= 0; NaN and +Inf are recorded, and the scale then stays where it was),
        then recompute the scale from the history."""
        if isinstance(amax, (bool, np.bool_)) or not isinstance(amax, (int, float, np.floating, np.integer)):
            raise TypeError(f"amax must be a number, got {V.describe(amax)}")
        if amax < 0:
            raise ValueError(f"amax must be >= 0 (a max of absolute values), got {amax}")
        # with algo "max", a NaN must not be skipped by max(): store it as +Inf (TE sees a non-finite amax too)
        self.history.append(float("inf") if math.isnan(amax) else float(amax))
        a = self.history_amax()
        if a > 0 and math.isfinite(a):
            s = max(a, float(AMAX_FLOOR)) * 2.0**self.margin / self.fp8_max
            if s <= _F32_MAX:
                self._scale = s

    def scale_for(self, x) -> np.float32:
        """The scale to quantize x with: from the history of earlier steps; then amax(x) is recorded."""
        arr = V.array("x", x, dtype=(np.float16, np.float32, np.float64), allow_device=False)
        scale = self.scale
        self.update(float(np.max(np.abs(arr))))
        return scale


def lagging_experiment(steps: int = 50, growth: float = 1.1, n: int = 4096, history_len: int = 1024,
                       algo: str = "max", margin: int = 0, seed: int = 0) -> dict:
    """A tensor whose magnitude grows by `growth` each step, quantized to E4M3 with delayed scaling.

    Step t draws x_t = N(0, 1) * growth^t (n elements), takes the scale from DelayedScaling.scale_for(x_t)
    and counts the elements that saturate: |x_t| / scale > 448. Returns a dict of NumPy arrays, one entry per
    step: "amax" (the current amax of x_t), "delayed_amax" (the amax the delayed scale stands for,
    scale * 448 / 2^margin) and "saturated" (fraction of x_t's elements clamped to +-448). Current scaling
    would use amax itself and saturate nothing. With growth > 1 the delayed amax is (about) the previous
    step's: with n = 2048 and seed 0, on average 0.1% of the elements saturate per step at growth 1.1 and
    0.3% at 1.2 (up to 1%); margin=1 removes that at growth 1.2, at the price of one binade of precision.
    """
    steps = V.positive_int("steps", steps)
    growth = V.positive_float("growth", growth)
    n = V.positive_int("n", n)
    ds = DelayedScaling(history_len, algo, margin)
    rng = np.random.default_rng(seed)
    amax = np.zeros(steps, np.float64)
    delayed = np.zeros(steps, np.float64)
    saturated = np.zeros(steps, np.float64)
    for t in range(steps):
        x = (rng.standard_normal(n) * growth**t).astype(np.float32)
        scale = ds.scale_for(x)
        amax[t] = np.max(np.abs(x))
        delayed[t] = float(scale) * ds.fp8_max / 2.0**ds.margin
        saturated[t] = np.mean(np.abs(x) / scale > ds.fp8_max)  # the cast computes x / scale, then clamps
    return {"amax": amax, "delayed_amax": delayed, "saturated": saturated}
