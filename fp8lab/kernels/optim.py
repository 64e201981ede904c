"""Optimizer steps on FP32 master weights kept in one flat buffer (one launch updates every parameter).

version 1: one grid-stride launch over the flat buffer, for each optimizer:
  adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)
        with bias corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t. DeepSeek-V3 keeps Adam's moments in BF16;
        this Adam keeps them in FP32 to isolate the effect of FP8 GEMMs (AdamW below does either).
  sgd:  p -= lr * g
adamw (a plain op, AdamW with reference_adamw): Adam with decoupled weight decay (Loshchilov & Hutter 2019,
  "Decoupled Weight Decay Regularization", arXiv 1711.05101) where a 0/1 mask says so, and the moments stored as
  bfloat16 (uint16 bit patterns: 2 bytes each instead of 4) as DeepSeek-V3 stores AdamW's moments (arXiv
  2412.19437, section 3.3.3), or in FP32:
        m = store(b1 m + (1 - b1) g);  v = store(b2 v + (1 - b2) g g);  p *= 1 - lr wd (where decayed);
        p -= lr (m / bc1) / (sqrt(v / bc2) + eps)
  store rounds to the nearest bfloat16 (ties to even) or keeps FP32; the update uses the stored moments. Exactly
  fp8lab.numerics.ops.adamw, the float32 statement the NumPy engine runs, operation for operation: reference_adamw
  calls it. A step moves p (read, written), g (read) and m, v (read, written): 20 bytes per parameter with bfloat16
  moments, 28 with FP32 ones.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..numerics import formats, ops
from ..device import runtime
from ..bench import timing
from ..device.runtime import cuda
from .common import bf16_load, bf16_store_bits
from .versions import Version

THREADS = runtime.block_threads(256)
MOMENTS = ("bf16", "fp32")
"""How AdamW stores its moments: bfloat16 bit patterns in uint16 arrays, or float32."""

_F32 = np.float32
_ONE = np.float32(1.0)


@cuda.jit
def sgd_kernel(p, g, lr):
    i = cuda.grid(1)
    while i < p.size:
        p[i] -= lr * g[i]
        i += cuda.gridsize(1)


@cuda.jit
def adam_kernel(p, g, m, v, lr, b1, b2, eps, bc1, bc2):
    i = cuda.grid(1)
    while i < p.size:
        gi = g[i]
        mi = b1 * m[i] + (np.float32(1) - b1) * gi
        vi = b2 * v[i] + (np.float32(1) - b2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] -= lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)
        i += cuda.gridsize(1)


@cuda.jit(device=True)
def adamw_moments(gi, mi, vi, b1, c1, b2, c2):
    """float32 (m, v) before they are stored: b1 m + c1 g and b2 v + c2 g g, c1 = 1 - b1, c2 = 1 - b2 (the order of
    the NumPy engine's AdamW: (c2 g) g)."""
    return b1 * mi + c1 * gi, b2 * vi + c2 * gi * gi


@cuda.jit(device=True)
def adamw_param(pi, mi, vi, decayed, keep, lr, bc1, bc2, eps):
    """The new float32 parameter from the stored moments: decoupled weight decay p * keep (keep = 1 - lr wd) where
    decayed, then p - lr (m / bc1) / (sqrt(v / bc2) + eps)."""
    if decayed:
        pi = pi * keep
    return pi - lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)


@cuda.jit(device=True)
def _decayed(decay, decay_all, i):
    if decay_all != 0:
        return True
    return decay[i] == _ONE


@cuda.jit(device=True)
def _bias_corrections(bc1, bc2, schedule, step):
    """(bc1, bc2): the scalars given, or row step[0] of the device table `schedule` (AdamW.schedule)."""
    if schedule.shape[0] > 1:
        j = step[0]
        return schedule[j, 0], schedule[j, 1]
    return bc1, bc2


@cuda.jit
def next_step_kernel(step):
    """The scheduled AdamW's step index, advanced after its update (one thread)."""
    step[0] += 1


@cuda.jit
def adamw_bf16_kernel(p, g, m, v, decay, decay_all, lr, b1, c1, b2, c2, eps, keep, bc1, bc2, schedule, step):
    """AdamW with bfloat16 moments: m, v are uint16 arrays of bfloat16 bits (grid-stride over the flat buffer)."""
    bc1, bc2 = _bias_corrections(bc1, bc2, schedule, step)
    i = cuda.grid(1)
    while i < p.size:
        mf, vf = adamw_moments(g[i], bf16_load(m[i]), bf16_load(v[i]), b1, c1, b2, c2)
        mq = bf16_store_bits(mf)
        vq = bf16_store_bits(vf)
        m[i] = mq
        v[i] = vq
        # the update reads the moments as stored, rounded to bfloat16
        p[i] = adamw_param(p[i], bf16_load(mq), bf16_load(vq), _decayed(decay, decay_all, i), keep, lr, bc1, bc2,
                           eps)
        i += cuda.gridsize(1)


@cuda.jit
def adamw_fp32_kernel(p, g, m, v, decay, decay_all, lr, b1, c1, b2, c2, eps, keep, bc1, bc2, schedule, step):
    """AdamW with float32 moments."""
    bc1, bc2 = _bias_corrections(bc1, bc2, schedule, step)
    i = cuda.grid(1)
    while i < p.size:
        mf, vf = adamw_moments(g[i], m[i], v[i], b1, c1, b2, c2)
        m[i] = mf
        v[i] = vf
        p[i] = adamw_param(p[i], mf, vf, _decayed(decay, decay_all, i), keep, lr, bc1, bc2, eps)
        i += cuda.gridsize(1)


VERSIONS = {1: Version("one grid-stride launch over the flat FP32 buffer (Adam, SGD)", (adam_kernel, sgd_kernel))}
BEST = 1


class Adam:
    def __init__(self, size: int, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = (np.float32(a) for a in (lr, b1, b2, eps))
        self.m = cuda.to_device(np.zeros(size, np.float32))
        self.v = cuda.to_device(np.zeros(size, np.float32))
        self.t = 0
        self.config = runtime.grid_1d(size, THREADS, runtime.MAX_BLOCKS)

    def step(self, p, g) -> None:
        self.t += 1
        bc1 = np.float32(1 - float(self.b1) ** self.t)
        bc2 = np.float32(1 - float(self.b2) ** self.t)
        adam_kernel[self.config](p, g, self.m, self.v, self.lr, self.b1, self.b2, self.eps, bc1, bc2)


class SGD:
    def __init__(self, size: int, lr=1e-2):
        self.lr = np.float32(lr)
        self.config = runtime.grid_1d(size, THREADS, runtime.MAX_BLOCKS)

    def step(self, p, g) -> None:
        sgd_kernel[self.config](p, g, self.lr)


def _unit_interval(name: str, value) -> float:
    """A beta: a real number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number in [0, 1), got {V.describe(value)}")
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value}")
    return float(value)


def _nonnegative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a non-negative number, got {V.describe(value)}")
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value}")
    return float(value)


def _decay_mask(decay, size: int):
    """decay as a float32 (size,) NumPy array after checking that it holds only 0 and 1; None stays None."""
    if decay is None:
        return None
    decay = runtime.to_host(V.array("decay", decay, dtype=np.float32, shape=(size,)))
    bad = (decay != 0) & (decay != 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"decay must hold only 0 (no weight decay) and 1 (weight decay), got {int(bad.sum())} other "
                         f"value(s), the first ({decay[i]}) at index {i}")
    return decay


adamw_bias_corrections = ops.adamw_bias_corrections  # the kernel's bc1, bc2: the NumPy engine's, bit for bit


class AdamW:
    """AdamW on float32 master weights kept in one flat buffer: p (size,) float32, updated in place by `step`.

    lr, b1, b2, eps, weight_decay: the hyperparameters, kept as float32 (lr may be changed between steps, but not
    after schedule(): a step captured as a CUDA graph keeps the lr it was captured with).
    decay: float32 (size,) of 0 and 1, NumPy or device array: weight decay where 1 (the Linear weights, not the
    gains or the embedding); None decays everywhere. moments: "bf16" keeps m and v as bfloat16 bit patterns in
    uint16 device arrays (`m`, `v`: half the bytes of FP32 moments, as DeepSeek-V3), "fp32" as float32.
    `moments_float32()` returns them as float32 NumPy arrays. Each step is `reference_adamw` bit for bit under the
    simulator; on a GPU fused multiply-adds may change the last bit of m, v or p (see assert_adamw_step).
    """

    def __init__(self, size: int, lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, decay=None,
                 moments="bf16"):
        self.size = V.positive_int("size", size)
        self.lr = _F32(V.positive_float("lr", lr))
        self.b1, self.b2 = _F32(_unit_interval("b1", b1)), _F32(_unit_interval("b2", b2))
        self.eps = _F32(V.positive_float("eps", eps))
        self.weight_decay = _F32(_nonnegative("weight_decay", weight_decay))
        self.moments = V.choice("moments", moments, MOMENTS)
        mask = _decay_mask(decay, self.size)
        self.decay = None if mask is None else cuda.to_device(mask)
        dtype = np.uint16 if self.moments == "bf16" else np.float32
        self.m = cuda.to_device(np.zeros(self.size, dtype))  # bfloat16 0x0000 is +0.0
        self.v = cuda.to_device(np.zeros(self.size, dtype))
        self.t = 0
        self.config = runtime.grid_1d(self.size, THREADS, runtime.MAX_BLOCKS)
        self._kernel = adamw_bf16_kernel if self.moments == "bf16" else adamw_fp32_kernel
        self.scheduled_until = None  # schedule(): the last step t whose bias corrections are on the device
        self._schedule = runtime.unused_array(np.float32, 2)  # (1, 1): no schedule, the scalars are used
        self._step = runtime.unused_array(np.int32, 1)

    def schedule(self, steps: int) -> None:
        """The bias corrections of the next `steps` steps (t + 1 .. t + steps) computed now, in float32 as step()
        computes them, into a device table, and the step index kept on the device: each step() then reads its
        scalars there and advances the index, so a captured step (fp8lab.device.graphs) replays correctly. The
        host's t still counts the steps (a checkpoint saves it); stepping past the table raises."""
        steps = V.positive_int("steps", steps)
        rows = [adamw_bias_corrections(self.b1, self.b2, self.t + k) for k in range(1, steps + 1)]
        rows += [(_ONE, _ONE)] * (2 - len(rows))  # a table of one row would read as "no schedule"
        self._schedule = cuda.to_device(np.array(rows, np.float32))
        self._step = cuda.to_device(np.zeros(1, np.int32))
        self.scheduled_until = self.t + steps

    def step(self, p, g) -> None:
        """One AdamW step: p (size,) float32 updated in place from the gradient g (size,) float32. Device arrays
        in the training loop (nothing is allocated); a NumPy p is copied to the device and back."""
        p = V.array("p", p, dtype=np.float32, shape=(self.size,))
        g = V.array("g", g, dtype=np.float32, shape=(self.size,))
        host = not V.is_device_array(p)
        if host and not (p.flags.c_contiguous and p.flags.writeable):
            raise ValueError(f"p must be a writeable C-contiguous array (it is updated in place), got {V.describe(p)}")
        dp = runtime.to_device(p)
        if self.scheduled_until is not None and self.t >= self.scheduled_until:
            raise RuntimeError(f"AdamW.step: step {self.t + 1} is past the schedule (schedule() computed the bias "
                               f"corrections up to step {self.scheduled_until}): schedule more steps")
        self.t += 1
        # float32 scalars (a Python float would make the kernel compute in float64), as the NumPy engine's AdamW
        # computes them
        lr, b1, b2, eps = _F32(self.lr), _F32(self.b1), _F32(self.b2), _F32(self.eps)
        bc1, bc2 = adamw_bias_corrections(b1, b2, self.t)
        keep = _ONE - lr * _F32(self.weight_decay)
        decay, decay_all = (runtime.unused_array(np.float32, 1), 1) if self.decay is None else (self.decay, 0)
        self._kernel[self.config](dp, runtime.to_device(g), self.m, self.v, decay, decay_all, lr, b1, _ONE - b1, b2,
                                  _ONE - b2, eps, keep, bc1, bc2, self._schedule, self._step)
        if self.scheduled_until is not None:
            next_step_kernel[1, 1](self._step)
        if host:
            dp.copy_to_host(p)

    def moments_float32(self) -> tuple[np.ndarray, np.ndarray]:
        """(m, v) as float32 NumPy arrays (bfloat16 moments widened exactly)."""
        m, v = self.m.copy_to_host(), self.v.copy_to_host()
        if self.moments == "bf16":
            return bf16_bits_to_float32(m), bf16_bits_to_float32(v)
        return m, v


def bf16_bits_to_float32(bits) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16): the bits moved up by 16 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def reference_adam(p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """NumPy float32 twin of adam_kernel, updating p, m, v in place."""
    f = np.float32
    lr, b1, b2, eps = f(lr), f(b1), f(b2), f(eps)
    bc1, bc2 = f(1 - float(b1) ** t), f(1 - float(b2) ** t)
    m[:] = b1 * m + (f(1) - b1) * g
    v[:] = b2 * v + (f(1) - b2) * g * g
    p -= lr * (m / bc1) / (np.sqrt(v / bc2) + eps)


def reference_adamw(p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, decay=None,
                    moments="bf16"):
    """NumPy float32 twin of AdamW.step (one step t = 1, 2, ...), updating p, m, v in place: float32 NumPy arrays
    of one shape (m, v hold the bfloat16-rounded values when moments="bf16"); decay None (everywhere) or a 0/1
    array of p's shape. Operation for operation the NumPy engine's AdamW.step (training.engine_reference) for one
    parameter:
        m = store(b1 m + (1 - b1) g);  v = store(b2 v + (1 - b2) g g)   (store: formats.round_bf16 or nothing)
        p *= 1 - lr wd (where decayed);  p -= lr (m / bc1) / (sqrt(v / bc2) + eps)
    with (bc1, bc2) = adamw_bias_corrections(b1, b2, t): numerics.ops.adamw, after checking the arguments.
    weight_decay=0 leaves p's decay an exact no-op."""
    moments = V.choice("moments", moments, MOMENTS)
    g = V.array("g", g, dtype=np.float32, allow_device=False)
    for name, a in (("p", p), ("m", m), ("v", v)):  # updated in place: float32 NumPy arrays of g's shape
        V.array(name, a, dtype=np.float32, shape=g.shape, allow_device=False)
    t = V.positive_int("t", t)
    ops.adamw(p, g, m, v, t, lr, b1, b2, eps, weight_decay, decay, moments)


def assert_adamw_step(name: str, opt: AdamW, before, g, after) -> str:
    """Check one step of `opt` (its step count opt.t) from `before` to `after`, each (p, m, v) as float32 NumPy
    arrays (m, v as opt.moments_float32() gives them), against reference_adamw from `before`. AssertionError with
    the first mismatches; returns what was checked.

    Simulator: bit for bit. GPU: NVVM may fuse a multiply and the following add into one FMA (one rounding for
    two), which changes the last bit. Per operation that is within 2^-22 of the magnitudes of the two addends:
      m, v: 2^-22 (|b1 m| + |(1 - b1) g|), 2^-22 (|b2 v| + |(1 - b2) g g|); with bfloat16 moments that difference
            may carry the value across a rounding midpoint: plus one bfloat16 ulp, at most 2^-7 of the larger of
            the two values (and 2^-133, bfloat16's subnormal spacing);
      p:    recomputed by the reference from the device's own m, v (so a moment that differs does not propagate),
            then 2^-22 (|p| + |update|) where decayed (p (1 - lr wd) - update is one FMA) and exact elsewhere.
    """
    p0, m0, v0 = (np.array(a, np.float32) for a in before)
    p1, m1, v1 = after
    g = np.asarray(g, np.float32)
    m, v = m0.copy(), v0.copy()
    ops.adamw_moments(g, m, v, opt.b1, opt.b2, opt.moments)
    decay = None if opt.decay is None else opt.decay.copy_to_host()
    if runtime.IS_SIM:
        p = p0.copy()
        ops.adamw_params(p, m, v, opt.t, opt.lr, opt.b1, opt.b2, opt.eps, opt.weight_decay, decay)
        for what, got, ref in (("p", p1, p), ("m", m1, m), ("v", v1, v)):
            bench.assert_codes_equal(f"{name}: {what} bits", np.asarray(got, np.float32).view(np.uint32),
                                     ref.view(np.uint32))
        return "bit for bit"
    bf16 = opt.moments == "bf16"
    for what, got, ref, terms in (
            ("m", m1, m, np.abs(opt.b1 * m0) + np.abs((_ONE - opt.b1) * g)),
            ("v", v1, v, np.abs(opt.b2 * v0) + np.abs((_ONE - opt.b2) * g * g))):
        atol = 2.0**-22 * terms.astype(np.float64)
        if bf16:
            atol += 2.0**-7 * np.maximum(np.abs(got), np.abs(ref)) + 2.0**-133
        bench.assert_close(f"{name}: {what}", got, ref, atol=atol, rtol=0)
    p = p0.copy()
    ops.adamw_params(p, np.asarray(m1, np.float32), np.asarray(v1, np.float32), opt.t, opt.lr, opt.b1, opt.b2,
                            opt.eps, opt.weight_decay, decay)
    bc1, bc2 = adamw_bias_corrections(opt.b1, opt.b2, opt.t)
    update = _F32(opt.lr) * (m1 / bc1) / (np.sqrt(v1 / bc2) + _F32(opt.eps))
    decayed = np.ones(p.shape, bool) if decay is None else decay == 1
    atol = np.where(decayed, 2.0**-22 * (np.abs(p0.astype(np.float64)) + np.abs(update.astype(np.float64))), 0.0)
    bench.assert_close(f"{name}: p", p1, p, atol=atol, rtol=0)
    return "within FMA tolerance (last bits)"


def reference_sgd(p, g, lr=1e-2):
    """NumPy float32 twin of sgd_kernel, updating p in place."""
    p -= np.float32(lr) * g


reference = reference_adam


def checks(rng) -> list:
    n = 301 if runtime.IS_SIM else (1 << 24) + 3
    p = rng.standard_normal(n, dtype=np.float32)
    g = rng.standard_normal(n, dtype=np.float32)
    out = []
    dp, dg = cuda.to_device(p), cuda.to_device(g)
    opt = Adam(n, lr=1e-2)
    ref_p, m, v = p.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for t in (1, 2, 3):
        opt.step(dp, dg)
        reference_adam(ref_p, g, m, v, t, lr=1e-2)
    bench.assert_close("adam", dp.copy_to_host(), ref_p, atol=1e-7, rtol=1e-6)
    out.append((f"v1 Adam, 3 steps, n = {n:,}", "within float32 tolerance"))
    dp = cuda.to_device(p)
    SGD(n, lr=1e-2).step(dp, dg)
    ref_p = p.copy()
    reference_sgd(ref_p, g, lr=1e-2)
    # a GPU may fuse p - lr * g into one FMA (one rounding, NumPy rounds twice): allow the product's last bit
    bench.assert_close("sgd", dp.copy_to_host(), ref_p, atol=2.0**-23 * 1e-2 * float(np.abs(g).max()), rtol=2.0**-23)
    out.append((f"v1 SGD, n = {n:,}", "within float32 tolerance"))
    for moments in MOMENTS:
        for masked in (False, True):
            decay = (rng.random(n) < 0.5).astype(np.float32) if masked else None
            result = check_adamw_steps(rng, n, moments, decay)
            out.append((f"AdamW, {moments} moments, decay {'mask' if masked else 'everywhere'}, 3 steps, "
                        f"n = {n:,}", result))
    return out


def adamw_gradients(rng, n: int) -> np.ndarray:
    """Gradients spread over six decades (1e-5 .. 10), both signs, never zero: every moment and update path."""
    g = rng.standard_normal(n, dtype=np.float32) * (10.0 ** rng.uniform(-5, 1, n)).astype(np.float32)
    g[g == 0] = np.float32(1e-3)
    return g


def check_adamw_steps(rng, n: int, moments: str, decay, steps: int = 3, lr: float = 1e-2,
                      weight_decay: float = 0.1) -> str:
    """`steps` steps of AdamW on the device, each checked by assert_adamw_step from the device's state before it;
    under the simulator also against reference_adamw run on its own from the same start (bit for bit)."""
    p = rng.standard_normal(n, dtype=np.float32)
    opt = AdamW(n, lr=lr, weight_decay=weight_decay, decay=decay, moments=moments)
    dp = cuda.to_device(p)
    ref_p, ref_m, ref_v = p.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    result = ""
    for t in range(1, steps + 1):
        g = adamw_gradients(rng, n)
        before = (dp.copy_to_host(), *opt.moments_float32())
        opt.step(dp, cuda.to_device(g))
        after = (dp.copy_to_host(), *opt.moments_float32())
        result = assert_adamw_step(f"AdamW {moments} step {t}", opt, before, g, after)
        reference_adamw(ref_p, g, ref_m, ref_v, t, lr=lr, weight_decay=weight_decay, decay=decay, moments=moments)
    if runtime.IS_SIM:
        for what, got, ref in zip("pmv", after, (ref_p, ref_m, ref_v)):
            bench.assert_codes_equal(f"AdamW {moments} after {steps} steps: {what} bits", got.view(np.uint32),
                                     ref.view(np.uint32))
    return result


def timings(rng, args) -> list:
    n = bench.ELEMENTWISE_N
    p = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    g = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    adam, sgd = Adam(n), SGD(n, lr=1e-9)
    # Adam: p, g, m, v read and p, m, v written; SGD: p, g read and p written
    rows = [bench.Row("v1 Adam", timing.time_ms(lambda: adam.step(p, g)), 4 * n * 7),
            bench.Row("v1 SGD", timing.time_ms(lambda: sgd.step(p, g)), 4 * n * 3)]
    # AdamW: p read and written (8 bytes), g read (4), m and v read and written (2 x 2 x 2 or 4 bytes); the mask
    # adds 4 bytes read
    mask = (rng.random(n) < 0.5).astype(np.float32)
    adamw = [("AdamW, bf16 moments", AdamW(n), 20), ("AdamW, bf16 moments, decay mask", AdamW(n, decay=mask), 24),
             ("AdamW, fp32 moments", AdamW(n, moments="fp32"), 28)]
    rows += [bench.Row(label, timing.time_ms(lambda o=opt: o.step(p, g)), nbytes * n) for label, opt, nbytes in adamw]
    torch = bench.torch_cuda()
    if torch is not None:
        tp = torch.randn(n, device="cuda")
        tp.grad = torch.randn(n, device="cuda")
        topt = torch.optim.AdamW([tp], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
        rows.append(bench.Row("PyTorch AdamW(fused=True), fp32 moments", timing.torch_time_ms(torch, topt.step),
                              28 * n))
    return [bench.Table(f"optimizer step, n = {n:,} float32 parameters; bytes = read + written", "GB/s", rows,
                        ceiling=bench.copy_ceiling_gbs(4 * n))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
