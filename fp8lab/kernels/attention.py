"""Scaled dot-product attention, o = softmax(q k^T / sqrt(D) + mask) v, from q, k, v rounded to bfloat16, in float32.

q, k, v, o: (B, H, T, D) float32, D at most MAX_D (128); causal=True masks the keys after each query (key j > query
i), as a decoder does. DeepSeek-V3 keeps attention in BF16 while its Linears run in FP8 (arXiv 2412.19437, section
3.3): the kernels read q, k and v rounded to bfloat16 (round to nearest even, common.round_bf16) and compute in
float32. The forward also gives lse = m + log(l) per query (its row's max score and softmax denominator), which the
backward uses to recompute the probabilities instead of storing them.

version 1: naive: a thread per score writes S = q k^T / sqrt(D) (masked scores -inf) for every (query, key), a
           warp per row turns S into P = softmax(S) in place, a thread per output sums P v: (B, H, T, T) floats in
           memory, read and written three times.
version 2: tiled online softmax (the flash-attention forward, Dao et al., arXiv 2205.14135): a warp per query,
           the block's keys and values staged in shared memory 32 at a time (a lane per key), a running max m,
           sum l and D-wide accumulator per query rescaled as each tile arrives: no T x T matrix in memory.

backward (one implementation, naive): from q, k, v, o, do and lse: P recomputed from lse, dS = P (dP - rowsum(do o))
with dP = do v^T, then dq = dS k / sqrt(D), dk = dS^T q / sqrt(D), dv = P^T do, a thread per output; P and dS
(B, H, T, T) in memory.

Tensor cores (BF16 mma) and a fused backward are the next steps. `fp8lab bench attention [--markdown]` checks the
versions against `reference` (float64 of the rounded inputs) and on a GPU times them against PyTorch's
scaled_dot_product_attention in the same run.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..device import runtime
from ..device.runtime import WARP_SIZE, cuda
from ..numerics import formats
from .common import round_bf16, warp_max, warp_sum
from .versions import Version

MAX_D = 128  # the widest head: version 2's shared tiles are sized for it
MAX_D_PAD = MAX_D + 1  # a key tile's padded row (shared-array shapes must be constants, not arithmetic in a kernel)
KEYS = WARP_SIZE  # version 2: keys per tile, a lane each
QUERIES = runtime.block_threads(256) // WARP_SIZE  # version 2: queries per block, a warp each (one simulated)
PER_LANE = MAX_D // WARP_SIZE  # version 2: accumulator columns a lane owns (d = lane + 32 t)
ROW_WARPS = runtime.block_threads(128) // WARP_SIZE  # version 1's softmax: rows per block, a warp each
_F32 = np.float32
_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


# ----------------------------------------------------------------------------------------------------------------
# Version 1: scores, softmax, P v, each a kernel
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def scores_kernel(q, k, s, scale, causal):
    """s[bh, i, j] = scale * q[bh, i] . k[bh, j] (bfloat16-rounded operands, float32 sum), -inf where masked."""
    j, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    T, D = q.shape[1], q.shape[2]
    if i < T and j < T:
        if causal and j > i:
            s[bh, i, j] = _NEG_INF
        else:
            acc = _ZERO
            for d in range(D):
                acc += round_bf16(q[bh, i, d]) * round_bf16(k[bh, j, d])
            s[bh, i, j] = acc * scale


@cuda.jit
def softmax_rows_kernel(s, lse):
    """A warp per row of s (rows bh * T + i, grid-stride): s becomes exp(s - m) / l, lse[bh, i] = m + log(l)."""
    BH, T = s.shape[0], s.shape[1]
    lane = cuda.threadIdx.x % WARP_SIZE
    row = cuda.blockIdx.x * (cuda.blockDim.x // WARP_SIZE) + cuda.threadIdx.x // WARP_SIZE
    while row < BH * T:  # the same for every lane of a warp: its shuffles see the whole warp
        bh, i = row // T, row % T
        m = _NEG_INF
        for j in range(lane, T, WARP_SIZE):
            m = max(m, s[bh, i, j])
        m = warp_max(m)  # a row always has its own key unmasked: m is finite for finite inputs
        l = _ZERO
        for j in range(lane, T, WARP_SIZE):
            l += math.exp(s[bh, i, j] - m)
        l = warp_sum(l)
        for j in range(lane, T, WARP_SIZE):
            s[bh, i, j] = math.exp(s[bh, i, j] - m) / l
        if lane == 0:
            lse[bh, i] = m + math.log(l)
        row += cuda.gridDim.x * (cuda.blockDim.x // WARP_SIZE)


@cuda.jit
def pv_kernel(p, v, o):
    """o[bh, i, d] = sum_j p[bh, i, j] * v[bh, j, d] (masked p are 0), in key order."""
    d, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    T, D = v.shape[1], v.shape[2]
    if i < T and d < D:
        acc = _ZERO
        for j in range(T):
            acc += p[bh, i, j] * round_bf16(v[bh, j, d])
        o[bh, i, d] = acc


def _grid_td(cols: int, T: int, BH: int):
    return (math.ceil(cols / 32), math.ceil(T / 8), BH), (32, 8)


def launch1(q, k, v, o, lse, causal: bool, scratch=None) -> None:
    """Version 1 on (BH, T, D) device arrays; scratch: a float32 (BH, T, T) device array for S (None: allocated)."""
    BH, T, D = q.shape
    s = scratch if scratch is not None else cuda.device_array((BH, T, T), _F32)
    scale = _F32(1 / math.sqrt(D))
    grid, block = _grid_td(T, T, BH)
    scores_kernel[grid, block](q, k, s, scale, int(causal))
    blocks = min(runtime.MAX_BLOCKS, math.ceil(BH * T / ROW_WARPS))
    softmax_rows_kernel[blocks, ROW_WARPS * WARP_SIZE](s, lse)
    grid, block = _grid_td(D, T, BH)
    pv_kernel[grid, block](s, v, o)


# ----------------------------------------------------------------------------------------------------------------
# Version 2: online softmax over key tiles in shared memory
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def flash_kernel(q, k, v, o, lse, scale, causal):
    """Warp w of block (x, bh) takes query i = x * warps + w. For each tile of KEYS keys (up to the block's last
    query when causal): lane j scores key j0 + j, the warp's max and sum of exp by shuffles, the running (m, l, acc)
    rescaled by exp(m - m_new), and acc[d] += sum_j p_j v[j, d] with the tile's p in shared memory."""
    kt = cuda.shared.array((KEYS, MAX_D_PAD), np.float32)  # padded: lane j reads row j without bank conflicts
    vt = cuda.shared.array((KEYS, MAX_D), np.float32)
    qs = cuda.shared.array((QUERIES, MAX_D), np.float32)
    ps = cuda.shared.array((QUERIES, KEYS), np.float32)
    acc = cuda.local.array(PER_LANE, np.float32)
    T, D = q.shape[1], q.shape[2]
    bh = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    lane, w, warps = tid % WARP_SIZE, tid // WARP_SIZE, cuda.blockDim.x // WARP_SIZE
    i0 = cuda.blockIdx.x * warps
    i = i0 + w
    live = i < T
    for d in range(lane, D, WARP_SIZE):
        qs[w, d] = round_bf16(q[bh, i, d]) if live else _ZERO
    for t in range(PER_LANE):
        acc[t] = _ZERO
    m = _NEG_INF
    l = _ZERO
    last = min(T, i0 + warps) if causal else T  # keys the block's queries see
    for j0 in range(0, last, KEYS):  # the same trips for every thread: the barriers below are block-wide
        for e in range(tid, KEYS * D, cuda.blockDim.x):
            jj, d = e // D, e % D
            inside = j0 + jj < T
            kt[jj, d] = round_bf16(k[bh, j0 + jj, d]) if inside else _ZERO
            vt[jj, d] = round_bf16(v[bh, j0 + jj, d]) if inside else _ZERO
        cuda.syncthreads()
        j = j0 + lane
        masked = not live or j >= T or (causal and j > i)
        sc = _NEG_INF
        if not masked:
            sc = _ZERO
            for d in range(D):
                sc += qs[w, d] * kt[lane, d]
            sc *= scale
        m_new = max(m, warp_max(sc))
        p = _ZERO if masked else math.exp(sc - m_new)
        corr = _ONE if m_new == _NEG_INF else math.exp(m - m_new)  # exp(-inf) = 0 on the first unmasked tile
        l = l * corr + warp_sum(p)
        ps[w, lane] = p
        cuda.syncthreads()
        for t in range(PER_LANE):
            d = lane + WARP_SIZE * t
            if d < D:
                a = acc[t] * corr
                for jj in range(KEYS):
                    a += ps[w, jj] * vt[jj, d]
                acc[t] = a
        m = m_new
        cuda.syncthreads()  # every warp is done with this tile before the next one is loaded
    if live:
        for t in range(PER_LANE):
            d = lane + WARP_SIZE * t
            if d < D:
                o[bh, i, d] = acc[t] / l
        if lane == 0:
            lse[bh, i] = m + math.log(l)


def launch2(q, k, v, o, lse, causal: bool, scratch=None) -> None:
    """Version 2 on (BH, T, D) device arrays (scratch unused)."""
    BH, T, D = q.shape
    flash_kernel[(math.ceil(T / QUERIES), BH), QUERIES * WARP_SIZE](q, k, v, o, lse, _F32(1 / math.sqrt(D)),
                                                                     int(causal))


VERSIONS = {
    1: Version("naive: scores, row softmax and P v as three kernels, (T, T) scores per head in memory", launch1),
    2: Version("tiled online softmax: a warp per query, 32 keys a tile in shared memory, no (T, T) in memory",
               launch2),
}
BEST = 2


# ----------------------------------------------------------------------------------------------------------------
# Backward (naive)
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def dsum_kernel(do, o, dsum):
    """dsum[bh, i] = sum_d do[bh, i, d] * o[bh, i, d]: the row's sum of P * dP (a thread per query)."""
    i, bh = cuda.grid(2)
    if i < do.shape[1] and bh < do.shape[0]:
        acc = _ZERO
        for d in range(do.shape[2]):
            acc += do[bh, i, d] * o[bh, i, d]
        dsum[bh, i] = acc


@cuda.jit
def backward_scores_kernel(q, k, v, do, lse, dsum, p, ds, scale, causal):
    """p = exp(s - lse) (the forward's probabilities, recomputed), ds = p * (do . v - dsum); 0 where masked."""
    j, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    T, D = q.shape[1], q.shape[2]
    if i < T and j < T:
        if causal and j > i:
            p[bh, i, j] = _ZERO
            ds[bh, i, j] = _ZERO
        else:
            sc = _ZERO
            dp = _ZERO
            for d in range(D):
                sc += round_bf16(q[bh, i, d]) * round_bf16(k[bh, j, d])
                dp += do[bh, i, d] * round_bf16(v[bh, j, d])
            pij = math.exp(sc * scale - lse[bh, i])
            p[bh, i, j] = pij
            ds[bh, i, j] = pij * (dp - dsum[bh, i])


@cuda.jit
def dq_kernel(ds, k, dq, scale):
    """dq[bh, i, d] = scale * sum_j ds[bh, i, j] * k[bh, j, d]."""
    d, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    T, D = k.shape[1], k.shape[2]
    if i < T and d < D:
        acc = _ZERO
        for j in range(T):
            acc += ds[bh, i, j] * round_bf16(k[bh, j, d])
        dq[bh, i, d] = acc * scale


@cuda.jit
def dkv_kernel(ds, p, q, do, dk, dv, scale):
    """dk[bh, j, d] = scale * sum_i ds[bh, i, j] * q[bh, i, d], dv[bh, j, d] = sum_i p[bh, i, j] * do[bh, i, d]."""
    d, j = cuda.grid(2)
    bh = cuda.blockIdx.z
    T, D = q.shape[1], q.shape[2]
    if j < T and d < D:
        ak = _ZERO
        av = _ZERO
        for i in range(T):
            ak += ds[bh, i, j] * round_bf16(q[bh, i, d])
            av += p[bh, i, j] * do[bh, i, d]
        dk[bh, j, d] = ak * scale
        dv[bh, j, d] = av


def launch_backward(q, k, v, o, do, lse, dq, dk, dv, causal: bool) -> None:
    """The backward on (BH, T, D) device arrays (lse (BH, T)); allocates dsum, P and dS."""
    BH, T, D = q.shape
    scale = _F32(1 / math.sqrt(D))
    dsum = cuda.device_array((BH, T), _F32)
    p, ds = cuda.device_array((BH, T, T), _F32), cuda.device_array((BH, T, T), _F32)
    dsum_kernel[(math.ceil(T / 32), BH), (32, 1)](do, o, dsum)
    grid, block = _grid_td(T, T, BH)
    backward_scores_kernel[grid, block](q, k, v, do, lse, dsum, p, ds, scale, int(causal))
    grid, block = _grid_td(D, T, BH)
    dq_kernel[grid, block](ds, k, dq, scale)
    dkv_kernel[grid, block](ds, p, q, do, dk, dv, scale)


# ----------------------------------------------------------------------------------------------------------------
# Public ops: NumPy or device arrays
# ----------------------------------------------------------------------------------------------------------------


def _qkv(q, k, v):
    q = V.array("q", q, dtype=np.float32, ndim=4)
    if not 1 <= q.shape[3] <= MAX_D or 0 in q.shape:
        raise ValueError(f"q must be (B, H, T, D) with B, H, T >= 1 and 1 <= D <= {MAX_D} (the head width), got "
                         f"{V.describe(q)}")
    k = V.array("k", k, dtype=np.float32, shape=tuple(q.shape))
    v = V.array("v", v, dtype=np.float32, shape=tuple(q.shape))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if V.is_device_array(a) and not a.is_c_contiguous():
            raise ValueError(f"{name} must be C-contiguous when it is a device array, got {V.describe(a)}")
    return q, k, v


def _flat(a):
    """A (B, H, T, D) or (B, H, T) array as a (B * H, T, ...) device array."""
    a = runtime.to_device(a)
    return a.reshape((a.shape[0] * a.shape[1],) + tuple(a.shape[2:]))


def attention(q, k, v, causal: bool = True, version: int | None = None, return_lse: bool = False):
    """o = softmax(q k^T / sqrt(D) + mask) v for q, k, v (B, H, T, D) float32 (rounded to bfloat16 as read), NumPy
    or C-contiguous device arrays; causal: mask the keys after each query. Returns o (B, H, T, D) float32 (NumPy
    when q, k and v are), and with return_lse=True (o, lse), lse (B, H, T) = log sum_j exp(s_ij), which
    attention_backward takes. version None: BEST."""
    q, k, v = _qkv(q, k, v)
    causal = V.boolean("causal", causal)
    version = V.version("version", version, VERSIONS, default=BEST)
    B, H, T, D = q.shape
    o = cuda.device_array((B * H, T, D), _F32)
    lse = cuda.device_array((B * H, T), _F32)
    VERSIONS[version].kernel(_flat(q), _flat(k), _flat(v), o, lse, causal)
    o, lse = o.reshape((B, H, T, D)), lse.reshape((B, H, T))
    if not any(V.is_device_array(a) for a in (q, k, v)):
        o, lse = o.copy_to_host(), lse.copy_to_host()
    return (o, lse) if return_lse else o


def attention_backward(q, k, v, o, do, lse, causal: bool = True):
    """(dq, dk, dv), each (B, H, T, D) float32, of a loss whose gradient at o = attention(q, k, v, causal) is do:
    q, k, v as attention takes them, o and lse (B, H, T) from attention(..., return_lse=True), do (B, H, T, D)
    float32. NumPy when every input is NumPy, else device arrays."""
    q, k, v = _qkv(q, k, v)
    causal = V.boolean("causal", causal)
    o = V.array("o", o, dtype=np.float32, shape=tuple(q.shape))
    do = V.array("do", do, dtype=np.float32, shape=tuple(q.shape))
    lse = V.array("lse", lse, dtype=np.float32, shape=tuple(q.shape[:3]))
    B, H, T, D = q.shape
    grads = [cuda.device_array((B * H, T, D), _F32) for _ in range(3)]
    launch_backward(_flat(q), _flat(k), _flat(v), _flat(o), _flat(do), _flat(lse), *grads, causal)
    grads = [g.reshape((B, H, T, D)) for g in grads]
    if not any(V.is_device_array(a) for a in (q, k, v, o, do, lse)):
        grads = [g.copy_to_host() for g in grads]
    return tuple(grads)


# ----------------------------------------------------------------------------------------------------------------
# References (NumPy, float64 of the bfloat16-rounded inputs)
# ----------------------------------------------------------------------------------------------------------------


def _rounded(*xs):
    return [formats.round_bf16(x).astype(np.float64) for x in xs]


def _probs(qb, kb, causal: bool):
    """(P, lse, s): softmax probabilities, log-sum-exp per query and the scaled, masked scores, float64."""
    T, D = qb.shape[-2], qb.shape[-1]
    s = qb @ np.swapaxes(kb, -1, -2) / math.sqrt(D)
    if causal:
        s = np.where(np.tri(T, dtype=bool), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    lse = (m + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]
    return e / e.sum(axis=-1, keepdims=True), lse, s


def reference(q, k, v, causal: bool = True):
    """(o, lse) in float64: softmax(q k^T / sqrt(D) + mask) v and log sum_j exp(s_ij), from q, k, v rounded to
    bfloat16."""
    qb, kb, vb = _rounded(q, k, v)
    p, lse, _ = _probs(qb, kb, causal)
    return p @ vb, lse


def reference_backward(q, k, v, do, causal: bool = True, o=None):
    """(dq, dk, dv) in float64 for the gradient do at o (o None: the reference forward's o; pass the kernel's o to
    get what the kernels compute from it: dsum = rowsum(do o) uses it)."""
    qb, kb, vb = _rounded(q, k, v)
    do = np.asarray(do, np.float64)
    p, _, _ = _probs(qb, kb, causal)
    o = p @ vb if o is None else np.asarray(o, np.float64)
    scale = 1 / math.sqrt(qb.shape[-1])
    ds = p * (do @ np.swapaxes(vb, -1, -2) - (do * o).sum(axis=-1, keepdims=True))
    return ds @ kb * scale, np.swapaxes(ds, -1, -2) @ qb * scale, np.swapaxes(p, -1, -2) @ do


def tolerance(q, k, v, do=None, causal: bool = True) -> dict:
    """Elementwise absolute tolerances of the float32 kernels against the float64 references: {"o", "lse"} and,
    with do, {"dq", "dk", "dv"}. A score s_ij carries at most D + 1 roundings of u = 2^-24, relative to
    sum_d |q_id k_jd| / sqrt(D) (row i's largest: delta_i); exp, the softmax's sums and the products with v add at
    most T + D + 8 more (Higham, Accuracy and Stability, 3.1), so each row's probabilities are good to
    r_i = 2 delta_i + (T + D + 8) u relative, and every output to r_i (or, for dk and dv, the rows' r) times the sum
    of the absolute values of its terms; a factor of 4 to spare."""
    qb, kb, vb = _rounded(q, k, v)
    D, T = qb.shape[-1], qb.shape[-2]
    u, scale = 2.0**-24, 1 / math.sqrt(D)
    p, lse, _ = _probs(qb, kb, causal)
    a = np.abs(qb) @ np.swapaxes(np.abs(kb), -1, -2) * scale
    r = 2 * (D + 1) * u * a.max(axis=-1, keepdims=True) + (T + D + 8) * u  # (B, H, T, 1)
    out = {"o": 4 * r * (p @ np.abs(vb)), "lse": 4 * r[..., 0] * (1 + np.abs(lse))}
    if do is not None:
        dob = np.abs(np.asarray(do, np.float64))
        o_abs = p @ np.abs(vb)
        ds_abs = p * (dob @ np.swapaxes(np.abs(vb), -1, -2) + (dob * o_abs).sum(axis=-1, keepdims=True))
        rd = r + (T + D + 4) * u
        out["dq"] = 4 * scale * (rd * ds_abs) @ np.abs(kb)
        out["dk"] = 4 * scale * np.swapaxes(rd * ds_abs, -1, -2) @ np.abs(qb)
        out["dv"] = 4 * np.swapaxes(rd * p, -1, -2) @ dob
    return out


# ----------------------------------------------------------------------------------------------------------------
# Check, then time (bench.main)
# ----------------------------------------------------------------------------------------------------------------


CHECK_SHAPES = {"sim": ((1, 2, 13, 32), (1, 1, 35, 40)), "gpu": ((2, 3, 257, 64), (1, 2, 1025, 128))}
"""(B, H, T, D) of the checks: T not a multiple of the 32-key tiles (and over one tile), one D not a multiple of 32."""
BENCH_SHAPE = (4, 16, 2048, 64)
"""(B, H, T, D) of the timings: 16 heads of 64 (width 1024) over 2048 tokens, 4 sequences."""


def make_inputs(rng, shape):
    """q, k, v, do: standard-normal float32 (q scaled by 2: sharper rows, whose softmax is not near uniform)."""
    q, k, v, do = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    return q * _F32(2), k, v, do


def checks(rng, only=None) -> list:
    """Every version's forward, causal and not, and the backward, on poisoned outputs; only: versions and
    "backward" (bench.selected)."""
    out = []
    for shape in CHECK_SHAPES["sim" if runtime.IS_SIM else "gpu"]:
        q, k, v, do = make_inputs(rng, shape)
        B, H, T, D = shape
        dq_, dk_, dv_ = (_flat(a) for a in (q, k, v))
        for causal in (True, False):
            tol = tolerance(q, k, v, do, causal)
            ref_o, ref_lse = reference(q, k, v, causal)
            for ver in (v_ for v_ in VERSIONS if bench.selected(only, v_)):
                o = bench.poisoned((B * H, T, D), _F32)
                lse = bench.poisoned((B * H, T), _F32)
                VERSIONS[ver].kernel(dq_, dk_, dv_, o, lse, causal)
                bench.assert_close(f"v{ver} o {shape} causal={causal}", o.copy_to_host().reshape(shape), ref_o,
                                   atol=tol["o"], rtol=0)
                bench.assert_close(f"v{ver} lse {shape} causal={causal}", lse.copy_to_host().reshape(shape[:3]),
                                   ref_lse, atol=tol["lse"], rtol=0)
                out.append((f"v{ver}: o, lse {shape}, causal={causal}", "within the float32 bound"))
            if bench.selected(only, "backward"):
                o, lse = attention(q, k, v, causal, return_lse=True)
                got = attention_backward(q, k, v, o, do, lse, causal)
                for name, g, r in zip(("dq", "dk", "dv"), got, reference_backward(q, k, v, do, causal, o)):
                    bench.assert_close(f"backward {name} {shape} causal={causal}", g, r, atol=tol[name], rtol=0)
                out.append((f"backward: dq, dk, dv {shape}, causal={causal}", "within the float32 bound"))
    return out


def timings(rng, args) -> list:
    """Every version's causal forward and the backward at BENCH_SHAPE against torch's scaled_dot_product_attention
    (bfloat16, causal) in the same run; FLOP/s count the unmasked half of q k^T and P v (2 T^2 D per head)."""
    only = getattr(args, "only", None)
    shape = BENCH_SHAPE
    B, H, T, D = shape
    q, k, v, do = (cuda.to_device(a) for a in make_inputs(rng, shape))
    flops = 2.0 * B * H * T * T * D  # two (T x T x D) products, half of each masked
    rows = []
    for ver in (v_ for v_ in VERSIONS if bench.selected(only, v_)):
        rows.append(bench.Row(f"v{ver} forward: {VERSIONS[ver]}",
                              timing.time_ms(lambda ver=ver: attention(q, k, v, True, ver), warmup=1, repeat=3),
                              flops))
    if bench.selected(only, "backward"):
        o, lse = attention(q, k, v, True, return_lse=True)
        rows.append(bench.Row("backward (naive)", timing.time_ms(lambda: attention_backward(q, k, v, o, do, lse),
                                                                 warmup=1, repeat=3), 2.5 * flops))
    torch = bench.torch_cuda()
    ceiling = None
    if torch is not None and only is None:
        F = torch.nn.functional
        tq, tk, tv = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        base = bench.Row("torch scaled_dot_product_attention, bfloat16, causal",
                         timing.torch_time_ms(torch, lambda: F.scaled_dot_product_attention(tq, tk, tv,
                                                                                            is_causal=True)), flops)
        rows.append(base)
        ceiling = bench.rate(flops, base.ms, "TFLOP/s")
    return [bench.Table(f"attention (B, H, T, D) = {shape}, causal, q k v rounded to bfloat16, float32 math",
                        "TFLOP/s", rows, ceiling=ceiling, ceiling_label="torch SDPA", peak_kind="bf16")]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
