"""Softmax cross-entropy and its gradient in one launch: mean loss (nats) and dlogits from (M, V) logits.

For row m with target t: loss_m = logsumexp(logits[m]) - logits[m, t], computed as (max - logits[m, t]) +
log(sum_c exp(logits[m, c] - max)) so that no exp overflows (a row offset by +100 would overflow float32's exp
and one offset by -120 would underflow to log(0) without the max). The mean loss = sum_m loss_m / M; bits per
character = nats / ln 2 (`nats_to_bits`). dlogits = (softmax(logits[m]) - onehot(t)) / M, the gradient of the
mean. The mean is deterministic without float atomics: each block adds its rows' losses in row order into one
partial per block, and the last block to finish (an integer ticket, the CUDA samples' threadFenceReduction
pattern) adds the partials in block order, in the same launch.

version 1: a block per row, three sweeps over the row: the max, the sum of exp(x - max), the gradient.
version 2: a block per row, online softmax (arXiv:1805.02867): one sweep for (max, sum), one for the gradient.
version 3: a warp per row, 8 logits a lane in registers per chunk of 256 (a row of V <= 256 is read once).
`version=None` runs version 3 for V <= 256 and version 2 above (`default_version`).

Bytes per logit, registers and L2 behind these choices: docs/notes/cross_entropy.md; timings: BENCHMARKS.md.
Run `fp8lab bench cross_entropy` (or `python -m fp8lab.kernels.cross_entropy`) to check every version against the
reference and, on a GPU, time it against PyTorch.

Inputs: logits (M, V) float32 (any strides), targets (M,) int32 in [0, V). Host targets are checked on the host
(integer dtype, shape, range); device targets are not read back: a target outside [0, V) makes its row's loss
and gradient NaN, and so the mean. A NaN logit does the same, +Inf makes its row non-finite, and -Inf is a
probability of 0.
TIP: a kernel that fails only on the GPU: run it under the simulator (FP8LAB_BACKEND=sim), where `print` works
inside kernels; keep M and V small.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate, bench
from ..device import runtime
from ..bench import timing
from ..device.runtime import FULL_MASK, WARP_SIZE, cuda, shfl_xor_sync
from .common import block_sum, nanmax, warp_max
from .versions import Version

CACHE3 = 8
"""Version 3: logits per lane held in registers between the two sweeps (rows of up to 32 * 8 = 256)."""
V3_MAX = WARP_SIZE * CACHE3
WARPS3 = 8
"""Version 3: warps (rows) per block on a GPU."""

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_NEG_INF = np.float32(-np.inf)
_NAN = np.float32(np.nan)


def nats_to_bits(nats: float) -> float:
    """A loss in nats as bits (per character, for a character vocabulary): nats / ln 2."""
    return nats / math.log(2.0)


# ----------------------------------------------------------------------------------------------------------------
# Device helpers: the online normalizer and its merges
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _online_add(m, s, x):
    """Fold logit x into a running (max m, sum s of exp(x_i - m)): one exp per element."""
    if x > m:  # a new max: rescale the sum to it
        return x, s * math.exp(m - x) + _ONE
    if x != _NEG_INF:  # -Inf adds exp(-Inf) = 0 (and -Inf - -Inf would be NaN); NaN passes on into s
        s += math.exp(x - m)
    return m, s


@cuda.jit(device=True)
def _chunk_add(m, s, cm, cache):
    """Fold CACHE3 logits held in registers, whose max is cm, into (m, s): the max first (no exp), then one exp
    per logit, all independent (the online update, element by element, is a chain of dependent exps)."""
    m_new = nanmax(m, cm)
    if m_new == _NEG_INF:  # nothing but -Inf and padding so far
        return m, s
    cs = _ZERO
    for j in range(CACHE3):
        cs += math.exp(cache[j] - m_new)  # padding: exp(-Inf) = 0
    return m_new, s * math.exp(m - m_new) + cs


@cuda.jit(device=True)
def _merge(m_a, s_a, m_b, s_b):
    """(max, sum) of two partial normalizers, with one exp: the larger max's sum plus the other sum rescaled.
    Both lanes of a butterfly evaluate that same expression, so they get the same bits (FMA contraction or not)."""
    if m_a == _NEG_INF and m_b == _NEG_INF:  # both empty: exp(-Inf - -Inf) would be NaN
        return m_a, _ZERO
    if m_a >= m_b:
        return m_a, s_a + s_b * math.exp(m_b - m_a)
    if m_b > m_a:
        return m_b, s_b + s_a * math.exp(m_a - m_b)
    return _NAN, _NAN  # a NaN max: NaN logits upstream


@cuda.jit(device=True)
def _warp_merge(m, s):
    """Butterfly of (max, sum) pairs: after 5 xor steps every lane holds the warp's normalizer."""
    offset = 16
    while offset > 0:
        m_o = shfl_xor_sync(FULL_MASK, m, offset)
        s_o = shfl_xor_sync(FULL_MASK, s, offset)
        m, s = _merge(m, s, m_o, s_o)
        offset //= 2
    return m, s


@cuda.jit(device=True)
def _block_merge(m, s, slot_m, slot_s):
    """The block's (max, sum), returned to every thread; slot_m, slot_s: shared float32 arrays of 32."""
    lane = cuda.threadIdx.x % WARP_SIZE
    warp = cuda.threadIdx.x // WARP_SIZE
    m, s = _warp_merge(m, s)
    nwarps = (cuda.blockDim.x + WARP_SIZE - 1) // WARP_SIZE
    if nwarps == 1:
        return m, s
    if lane == 0:
        slot_m[warp] = m
        slot_s[warp] = s
    cuda.syncthreads()
    m = _NEG_INF
    s = _ZERO
    if lane < nwarps:
        m = slot_m[lane]
        s = slot_s[lane]
    m, s = _warp_merge(m, s)
    cuda.syncthreads()  # the slots may be reused right after
    return m, s


@cuda.jit(device=True)
def _block_max(v, slots):
    """Max over the block of signed values (common.block_max pads with 0, right only for amaxes)."""
    lane = cuda.threadIdx.x % WARP_SIZE
    warp = cuda.threadIdx.x // WARP_SIZE
    v = warp_max(v)
    nwarps = (cuda.blockDim.x + WARP_SIZE - 1) // WARP_SIZE
    if nwarps == 1:
        return v
    if lane == 0:
        slots[warp] = v
    cuda.syncthreads()
    v = slots[lane] if lane < nwarps else _NEG_INF
    v = warp_max(v)
    cuda.syncthreads()
    return v


@cuda.jit(device=True)
def _row_loss(logits, row, t, ok, m, s):
    """(m - logits[row, t]) + log(s): the two large terms cancel first, exactly when they are within 2x."""
    if ok:
        return (m - logits[row, t]) + math.log(s)
    return _NAN


@cuda.jit(device=True)
def _grad(x, c, t, m, inv_s, scale):
    """dlogits of one logit: (exp(x - m) / s - [c == t]) * scale (scale = 1/M, NaN for a bad target)."""
    p = math.exp(x - m) * inv_s
    if c == t:
        p -= _ONE
    return p * scale


@cuda.jit(device=True)
def _finish_mean(block_total, partial, ticket, count, loss, slots, flag):
    """Thread 0 holds the block's total. The last block to take a ticket adds every block's partial in block
    order (fixed, so the mean has the same bits every run) and writes loss[0] = sum / count.

    The integer ticket wraps to 0 after the last block (atomic.inc), ready for the next launch. The fence before
    it publishes this block's partial; the one after it orders the last block's reads behind every partial (the
    example of the CUDA C++ Programming Guide's "Memory Fence Functions" section does the same)."""
    tid = cuda.threadIdx.x
    if tid == 0:
        partial[cuda.blockIdx.x] = block_total
        cuda.threadfence()
        last = np.uint32(cuda.gridDim.x - 1)
        flag[0] = 1 if cuda.atomic.inc(ticket, 0, last) == last else 0
        cuda.threadfence()
    cuda.syncthreads()
    if flag[0] == 1:  # the same for the whole block
        total = _ZERO
        i = tid
        while i < cuda.gridDim.x:
            total += partial[i]
            i += cuda.blockDim.x
        total = block_sum(total, slots)
        if tid == 0:
            loss[0] = total / np.float32(count)


# ----------------------------------------------------------------------------------------------------------------
# Kernels. Arguments: logits (M, V) f32, targets (M,) i32, inv_count = f32(1/M) -> dlogits (M, V) f32,
# row_loss (M,) f32, loss (1,) f32 mean; scratch: partial (>= gridDim.x,) f32, ticket (1,) u32 (0 between launches)
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def cross_entropy_kernel1(logits, targets, inv_count, dlogits, row_loss, loss, partial, ticket):
    slots = cuda.shared.array(32, np.float32)
    flag = cuda.shared.array(1, np.int32)
    M, V = logits.shape
    tid = cuda.threadIdx.x
    acc = _ZERO  # thread 0: this block's rows' losses, in row order
    row = cuda.blockIdx.x
    while row < M:  # block-uniform: every thread reaches every barrier
        m = _NEG_INF
        for c in range(tid, V, cuda.blockDim.x):
            m = nanmax(m, logits[row, c])
        m = _block_max(m, slots)
        s = _ZERO
        for c in range(tid, V, cuda.blockDim.x):
            s += math.exp(logits[row, c] - m)
        s = block_sum(s, slots)
        t = targets[row]
        ok = t >= 0 and t < V
        inv_s = _ONE / s
        scale = inv_count if ok else _NAN
        for c in range(tid, V, cuda.blockDim.x):
            dlogits[row, c] = _grad(logits[row, c], c, t, m, inv_s, scale)
        if tid == 0:
            r = _row_loss(logits, row, t, ok, m, s)
            row_loss[row] = r
            acc += r
        row += cuda.gridDim.x
    _finish_mean(acc, partial, ticket, M, loss, slots, flag)


@cuda.jit
def cross_entropy_kernel2(logits, targets, inv_count, dlogits, row_loss, loss, partial, ticket):
    slot_m = cuda.shared.array(32, np.float32)
    slot_s = cuda.shared.array(32, np.float32)
    flag = cuda.shared.array(1, np.int32)
    M, V = logits.shape
    tid = cuda.threadIdx.x
    acc = _ZERO
    row = cuda.blockIdx.x
    while row < M:
        m = _NEG_INF
        s = _ZERO
        for c in range(tid, V, cuda.blockDim.x):
            m, s = _online_add(m, s, logits[row, c])
        m, s = _block_merge(m, s, slot_m, slot_s)
        t = targets[row]
        ok = t >= 0 and t < V
        inv_s = _ONE / s
        scale = inv_count if ok else _NAN
        for c in range(tid, V, cuda.blockDim.x):
            dlogits[row, c] = _grad(logits[row, c], c, t, m, inv_s, scale)
        if tid == 0:
            r = _row_loss(logits, row, t, ok, m, s)
            row_loss[row] = r
            acc += r
        row += cuda.gridDim.x
    _finish_mean(acc, partial, ticket, M, loss, slot_m, flag)


@cuda.jit
def cross_entropy_kernel3(logits, targets, inv_count, dlogits, row_loss, loss, partial, ticket):
    cache = cuda.local.array(CACHE3, np.float32)  # constant indices after unrolling: registers
    warp_total = cuda.shared.array(32, np.float32)
    slots = cuda.shared.array(32, np.float32)
    flag = cuda.shared.array(1, np.int32)
    M, V = logits.shape
    lane = cuda.threadIdx.x % WARP_SIZE
    warp = cuda.threadIdx.x // WARP_SIZE
    nwarps = cuda.blockDim.x // WARP_SIZE
    acc = _ZERO  # lane 0: this warp's rows' losses, in row order
    row = cuda.blockIdx.x * nwarps + warp
    while row < M:  # warp-uniform: every lane reaches every shuffle
        m = _NEG_INF
        s = _ZERO
        for c0 in range(0, V, V3_MAX):  # chunks of 32 x CACHE3 logits: one for V <= V3_MAX
            cm = _NEG_INF
            for j in range(CACHE3):
                c = c0 + lane + WARP_SIZE * j
                x = _NEG_INF  # past the row: adds nothing
                if c < V:
                    x = logits[row, c]
                cache[j] = x
                cm = nanmax(cm, x)
            m, s = _chunk_add(m, s, cm, cache)
        m, s = _warp_merge(m, s)
        t = targets[row]
        ok = t >= 0 and t < V
        inv_s = _ONE / s
        scale = inv_count if ok else _NAN
        for c0 in range(0, V, V3_MAX):
            for j in range(CACHE3):
                c = c0 + lane + WARP_SIZE * j
                if c < V:
                    x = cache[j] if V <= V3_MAX else logits[row, c]  # a single chunk is still in registers
                    dlogits[row, c] = _grad(x, c, t, m, inv_s, scale)
        if lane == 0:
            r = _row_loss(logits, row, t, ok, m, s)
            row_loss[row] = r
            acc += r
        row += cuda.gridDim.x * nwarps
    if lane == 0:
        warp_total[warp] = acc
    cuda.syncthreads()
    total = _ZERO
    if cuda.threadIdx.x == 0:
        for w in range(nwarps):  # warp order: fixed
            total += warp_total[w]
    _finish_mean(total, partial, ticket, M, loss, slots, flag)


VERSIONS = {
    1: Version("block per row, three sweeps (max, sum of exp, gradient)", cross_entropy_kernel1),
    2: Version("block per row, online softmax: one sweep for (max, sum), one for the gradient", cross_entropy_kernel2),
    3: Version("warp per row, chunks of 8 logits per lane in registers (the whole row for V <= 256)",
               cross_entropy_kernel3),
}
BEST = 3
"""The default for the course's vocabularies (V <= 256); `default_version(V)` is what `version=None` runs."""


# ----------------------------------------------------------------------------------------------------------------
# Launch configuration, input checks, the loss object
# ----------------------------------------------------------------------------------------------------------------


def default_version(V: int) -> int:
    """What `version=None` runs: BEST (3, a warp per row) while a row fits in a warp's registers (V <= V3_MAX =
    256), else 2 (a block per row, the logits read twice); docs/notes/cross_entropy.md says why."""
    return BEST if V <= V3_MAX else 2


def block_threads(version: int, V: int) -> int:
    """Threads per block. Versions 1-2: about 16 logits per thread, 128 to 512 threads (two or more blocks per SM,
    so one block's __syncthreads overlap another's loads). Version 3: WARPS3 warps. One warp under the
    simulator."""
    if runtime.IS_SIM:
        return WARP_SIZE
    if version == 3:
        return WARPS3 * WARP_SIZE
    return min(512, max(128, WARP_SIZE * -(-V // (WARP_SIZE * 16))))


def resident_blocks(kernel, threads: int, args) -> int:
    """How many blocks of `threads` fit on the device at once (the occupancy calculator: registers, shared
    memory), for `kernel` compiled for args' types; runtime.MAX_BLOCKS under the simulator."""
    if runtime.IS_SIM:
        return runtime.MAX_BLOCKS
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    return max(1, compiled.max_cooperative_grid_blocks(threads))


def grid_blocks(version: int, M: int, threads: int, resident: int) -> int:
    """Blocks of a launch: enough for every row (every warp's row with version 3), at most `resident`. Blocks
    loop over rows, so each takes one ticket: a block per row would queue 16384 same-address atomics at one L2
    slice. Blocks beyond the resident ones would run in a second, partly empty wave."""
    need = -(-M // (threads // WARP_SIZE)) if version == 3 else M
    return max(1, min(need, resident))


def host_targets(targets, M: int, V: int) -> np.ndarray:
    """targets as a C-contiguous int32 NumPy array, after checking an integer dtype, shape (M,), every value in
    [0, V); each error names `targets`."""
    t = _validate.array("targets", targets, allow_device=False)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"targets must have an integer dtype (class indices), got {_validate.describe(t)}")
    t = _validate.array("targets", t, shape=(M,), allow_device=False)
    bad = (t < 0) | (t >= V)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"targets must lie in [0, {V}) (V = {V} columns of logits), got {int(bad.sum())} value(s) "
                         f"outside, the first ({int(t[i])}) at index {i}")
    return np.ascontiguousarray(t, dtype=np.int32)


def _device_targets(targets, M: int, V: int):
    if _validate.is_device_array(targets):  # not read back: a bad value shows as a NaN loss (module docstring)
        return _validate.array("targets", targets, dtype=np.int32, shape=(M,))
    return cuda.to_device(host_targets(targets, M, V))


def _device_logits(logits, shape=None):
    x = _validate.array("logits", logits, dtype=np.float32, ndim=2)
    if shape is not None:
        x = _validate.array("logits", x, shape=shape)
    return x if _validate.is_device_array(x) else cuda.to_device(np.ascontiguousarray(x))


class CrossEntropyLoss:
    """Buffers for one (M, V), allocated once, and the launch: call it with logits and targets every step.

    Device arrays written by a call: `dlogits` (M, V) float32 (pass your own buffer to write there instead),
    `row_loss` (M,) float32 per-row losses, `loss` (1,) float32 the mean in nats. `item()` copies the mean to
    the host (a synchronization); bits per character = nats_to_bits(item()). threads: threads per block (a
    multiple of 32 up to 1024) instead of `block_threads`; tests use it to run the cross-warp paths in the
    simulator.
    """

    def __init__(self, M: int, V: int, *, dlogits=None, threads: int | None = None):
        self.M = _validate.positive_int("M", M)
        self.V = _validate.positive_int("V", V)
        if threads is not None:
            threads = _validate.positive_int("threads", threads)
            if threads % WARP_SIZE or threads > 1024:
                raise ValueError(f"threads must be a multiple of {WARP_SIZE} up to 1024, got {threads}")
        self.threads = threads
        if dlogits is None:
            dlogits = cuda.device_array((self.M, self.V), np.float32)
        elif not _validate.is_device_array(dlogits):
            raise TypeError(f"dlogits must be a CUDA device array, got {_validate.describe(dlogits)}")
        self.dlogits = _validate.array("dlogits", dlogits, dtype=np.float32, shape=(self.M, self.V))
        self.row_loss = cuda.device_array(self.M, np.float32)
        self.loss = cuda.device_array(1, np.float32)
        self.partial = cuda.device_array(self.M, np.float32)  # one per block: never more blocks than rows
        self.ticket = cuda.to_device(np.zeros(1, np.uint32))
        self.inv_count = np.float32(1.0 / self.M)
        self._configs: dict = {}

    def config(self, version: int) -> tuple[int, int]:
        """(blocks, threads) of a launch of `version`, found once (the first call compiles the kernel)."""
        if version not in self._configs:
            threads = self.threads or block_threads(version, self.V)
            types_like = (self.dlogits, runtime.unused_array(np.int32, 1), self.inv_count, self.dlogits,
                          self.row_loss, self.loss, self.partial, self.ticket)  # the argument types of a call
            resident = resident_blocks(VERSIONS[version].kernel, threads, types_like)
            self._configs[version] = grid_blocks(version, self.M, threads, resident), threads
        return self._configs[version]

    def __call__(self, logits, targets, *, version: int | None = None):
        """logits (M, V) float32, targets (M,): device arrays (nothing copied, targets int32) or NumPy (checked,
        copied). Writes dlogits, row_loss and loss; returns self."""
        v = _validate.version("version", version, VERSIONS, default=default_version(self.V))
        x = _device_logits(logits, (self.M, self.V))
        t = _device_targets(targets, self.M, self.V)
        VERSIONS[v].kernel[self.config(v)](x, t, self.inv_count, self.dlogits, self.row_loss, self.loss,
                                           self.partial, self.ticket)
        return self

    def item(self) -> float:
        """The mean loss in nats, on the host."""
        return float(self.loss.copy_to_host()[0])


def cross_entropy(logits, targets, *, version: int | None = None) -> tuple[float, np.ndarray]:
    """Convenience on NumPy: (mean loss in nats, dlogits (M, V) float32 NumPy array). Allocates per call: a
    training loop keeps one CrossEntropyLoss instead."""
    x = _device_logits(logits)
    f = CrossEntropyLoss(*x.shape)
    f(x, targets, version=version)
    return f.item(), f.dlogits.copy_to_host()


# ----------------------------------------------------------------------------------------------------------------
# The NumPy spec
# ----------------------------------------------------------------------------------------------------------------


def reference_rows(logits, targets) -> tuple[np.ndarray, np.ndarray]:
    """(per-row losses (M,), dlogits (M, V)), both float64: the exact values the kernels are bounded against
    (numerics.ops.cross_entropy is the NumPy engine's float32 program)."""
    x = np.asarray(logits, np.float64)
    M, V = x.shape
    t = host_targets(targets, M, V)
    mx = x.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf logits give NaN rows, as on the device
        e = np.exp(x - mx)
        s = e.sum(axis=1, keepdims=True)
        rows = np.arange(M)
        loss = (mx[:, 0] - x[rows, t]) + np.log(s[:, 0])
        p = e / s
    p[rows, t] -= 1.0
    return loss, p / M


def reference(logits, targets) -> tuple[float, np.ndarray]:
    """(mean loss in nats, float64; dlogits (M, V) float32, rounded once from float64)."""
    loss, dlogits = reference_rows(logits, targets)
    return float(loss.mean()), dlogits.astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Check, then time (bench.main)
# ----------------------------------------------------------------------------------------------------------------

LOSS_TOL = 1e-5
"""Row and mean losses, relative (and absolute, for losses near 0): exp, log and up to ~150 sequential float32
additions per thread, each a few ulps (2^-24 ~ 6e-8) off (the errors seen: docs/notes/cross_entropy.md)."""
GRAD_ATOL = 4e-6
"""dlogits, in units of 1/M: p = exp(x - m) / s is a few ulps of p <= 1 off, and p - 1 keeps that absolute error."""


def inputs(rng, M: int, V: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits (M, V) float32 with a spread of magnitudes: per-row scales from 0.03 to 30 (rows nearly uniform to
    nearly one-hot, exp underflowing to 0), every 7th row offset by +80, -80, +100 or -120 (float32's exp of the
    raw logits overflows at +100 and underflows to 0 at -120), a third of the targets made the row's likeliest
    class. Targets (M,) int32, uniform in [0, V)."""
    scale = np.exp(rng.uniform(np.log(0.03), np.log(30.0), (M, 1))).astype(np.float32)
    x = rng.standard_normal((M, V), dtype=np.float32) * scale
    t = rng.integers(0, V, M).astype(np.int32)
    sure = np.flatnonzero(rng.random(M) < 1 / 3)
    x[sure, t[sure]] = x[sure].max(axis=1) + rng.uniform(0.0, 5.0, len(sure)).astype(np.float32)
    x[::7] += rng.choice(np.array([80.0, -80.0, 100.0, -120.0], np.float32), size=(len(x[::7]), 1))
    return x, t


def assert_matches(name: str, f: CrossEntropyLoss, logits, targets) -> None:
    """f's outputs (after a call on logits, targets) against the float64 spec; NaN anywhere fails."""
    ref_rows, ref_grad = reference_rows(logits, targets)
    M = logits.shape[0]
    bench.assert_close(f"{name} row_loss", f.row_loss.copy_to_host(), ref_rows, atol=LOSS_TOL, rtol=LOSS_TOL)
    bench.assert_close(f"{name} loss", f.loss.copy_to_host(), [ref_rows.mean()], atol=0, rtol=LOSS_TOL)
    bench.assert_close(f"{name} dlogits", f.dlogits.copy_to_host(), ref_grad, atol=GRAD_ATOL / M, rtol=LOSS_TOL)


CHECK_SHAPES = {"sim": ((7, 65), (5, 300)), "gpu": ((4099, 65), (1027, 257), (257, 32771))}
"""(M, V) for checks(): no V a multiple of 32, V = 300 and 32771 past version 3's registers."""
BENCH_M = 16384
BENCH_V = (65, 256, 32768)


def checks(rng) -> list:
    out = []
    for M, V in CHECK_SHAPES["sim" if runtime.IS_SIM else "gpu"]:
        x, t = inputs(rng, M, V)
        dx, dt = cuda.to_device(x), cuda.to_device(t)
        for v in VERSIONS:
            f = CrossEntropyLoss(M, V, dlogits=bench.poisoned((M, V), np.float32))
            f.row_loss.copy_to_device(np.full(M, np.nan, np.float32))
            f.loss.copy_to_device(np.full(1, np.nan, np.float32))
            f(dx, dt, version=v)
            assert_matches(f"v{v} ({M}, {V})", f, x, t)
            out.append((f"v{v} loss, row losses and dlogits, ({M}, {V})", "within tolerance of float64"))
    return out


def _torch_peer(torch, x, t):
    """F.cross_entropy forward + backward (mean reduction): (step function, its loss on these inputs)."""
    import torch.nn.functional as F

    tx = torch.from_numpy(x).cuda().requires_grad_()
    tt = torch.from_numpy(t.astype(np.int64)).cuda()

    def step():
        loss = F.cross_entropy(tx, tt)
        torch.autograd.grad(loss, tx)
        return loss

    return step, float(step())


def timings(rng, args) -> list:
    """Each version and PyTorch at M = 16384 tokens, V = 65, 256 (character vocabularies) and 32768 (a
    tokenizer's); bytes that must move = logits read once + dlogits written + targets read."""
    torch = bench.torch_cuda()
    tables = []
    for V in BENCH_V:
        M = BENCH_M
        x, t = inputs(rng, M, V)
        dx, dt = cuda.to_device(x), cuda.to_device(t)
        f = CrossEntropyLoss(M, V)
        nbytes = 2 * x.nbytes + t.nbytes
        rows = [bench.time_row(f"v{v}: {desc}", lambda v=v: f(dx, dt, version=v), nbytes, launch=True)
                for v, desc in VERSIONS.items()]
        if torch is not None:
            step, torch_loss = _torch_peer(torch, x, t)
            ours = f(dx, dt).item()
            rows.append(bench.time_row(f"torch: F.cross_entropy forward + backward (loss {torch_loss:.6f}, "
                                       f"ours {ours:.6f})", step, nbytes,
                                       timer=lambda fn: timing.torch_time_ms(torch, fn), launch=True))
        tables.append(bench.Table(f"softmax cross-entropy + gradient, M = {M}, V = {V}, float32 logits of "
                                  f"{x.nbytes / 1e6:,.0f} MB; bytes = logits read once + dlogits written + targets",
                                  "GB/s", rows,
                                  ceiling=bench.copy_ceiling_gbs(x.nbytes)))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
