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
version 3: version 2 on the tensor cores (FlashAttention-2's layout, arXiv 2307.08691): a warp per 16 queries,
           S = q k^T and o += P v as BF16 mma.sync m16n8k16 with FP32 accumulators, P rounded to bfloat16 and
           handed from S's accumulator fragments straight to P v's operand fragments (same layout, no shared
           memory); the row max and sum over the 4 lanes of a row by shuffles.

backward (one implementation, naive): from q, k, v, o, do and lse: P recomputed from lse, dS = P (dP - rowsum(do o))
with dP = do v^T, then dq = dS k / sqrt(D), dk = dS^T q / sqrt(D), dv = P^T do, a thread per output; P and dS
(B, H, T, T) in memory.

A fused backward (and wgmma) are the next steps. `fp8lab bench attention [--markdown]` checks the
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
from ..device.ptx import MMA_BF16, mma_m16n8k16_bf16
from ..device.runtime import FULL_MASK, WARP_SIZE, cuda, shfl_xor_sync
from ..numerics import formats
from .common import bf16_store_bits, round_bf16, warp_max, warp_sum
from .versions import Version, best, check_device

MAX_D = 128  # the widest head: version 2's shared tiles are sized for it
MAX_HEADS = 65535  # B * H at most: the heads go in gridDim.y or gridDim.z (CUDA's limit there)
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
def pv_kernel(p, v, o, scale):
    """o[bh, i, d] = scale * sum_j p[bh, i, j] * v[bh, j, d], v rounded to bfloat16, in key order: version 1's P v
    (scale 1; masked p are 0) and the backward's dq = dS k / sqrt(D)."""
    d, i = cuda.grid(2)
    bh = cuda.blockIdx.z
    T, D = v.shape[1], v.shape[2]
    if i < T and d < D:
        acc = _ZERO
        for j in range(T):
            acc += p[bh, i, j] * round_bf16(v[bh, j, d])
        o[bh, i, d] = acc * scale


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
    pv_kernel[grid, block](s, v, o, _ONE)


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


# ----------------------------------------------------------------------------------------------------------------
# Version 3: version 2's online softmax on the tensor cores (BF16 mma.sync m16n8k16, FlashAttention-2's layout)
# ----------------------------------------------------------------------------------------------------------------

TC_KEYS = 32  # version 3: keys per tile (four n8 column tiles of S, two k16 steps of P v)
TC_QUERIES = 16  # version 3: queries per warp (the m16 of the mma)
TC_WARPS = runtime.block_threads(128) // WARP_SIZE  # version 3: warps per block (one simulated)
TC_SACC = TC_KEYS // 8 * 4  # its scores of one key tile: 4 per n8 tile of keys
_U16 = np.uint16
_U32_16 = np.uint32(16)


@cuda.jit(device=True)
def _pack(lo, hi):
    """Two float32 values as bfloat16 bits in one register (lo in the low half): an mma operand pair."""
    return np.uint32(bf16_store_bits(lo)) | (np.uint32(bf16_store_bits(hi)) << _U32_16)


@cuda.jit(device=True)
def _pair(tile, r, c):
    """The bfloat16 bits tile[r, c] and tile[r, c + 1] (uint16 in shared memory) in one register."""
    return np.uint32(tile[r, c]) | (np.uint32(tile[r, c + 1]) << _U32_16)


@cuda.jit(device=True)
def _quad_max(v):
    """The max over the 4 lanes that share a row of an mma fragment (lanes 4g .. 4g + 3)."""
    v = max(v, shfl_xor_sync(FULL_MASK, v, 1))
    return max(v, shfl_xor_sync(FULL_MASK, v, 2))


@cuda.jit(device=True)
def _quad_sum(v):
    v += shfl_xor_sync(FULL_MASK, v, 1)
    return v + shfl_xor_sync(FULL_MASK, v, 2)


def make_flash_mma_kernel(width: int):
    """Version 3's kernel for heads up to `width` wide (a multiple of 16, at most MAX_D): the fragment loops and
    arrays have that many columns compiled in, so they unroll and the arrays live in registers."""
    kc = width // 16  # k16 chunks of the padded width
    nd = width // 8  # n8 tiles of it
    qregs, oregs = kc * 4, nd * 4

    @cuda.jit
    def flash_mma_kernel(q, k, v, o, lse, scale, causal):
        """Warp w of block (x, bh) takes queries q0 .. q0 + 15, q0 = (x * warps + w) * 16, as the A fragments of an
        m16n8k16 (q rounded to bfloat16, D zero-padded to a multiple of 16). Per tile of TC_KEYS keys in shared memory:
        S = q k^T in four n8 tiles (FP32 accumulators), the running max and (per lane) sum of each of the lane's two
        rows, P = exp(S - m) rounded to bfloat16 and fed straight back as the A fragments of P v (the C fragments of two
        neighbouring n8 tiles are one k16 A fragment), o accumulated in n8 tiles of D. Then o / l, lse = m + log l."""
        ks = cuda.shared.array((TC_KEYS, width), np.uint16)
        vs = cuda.shared.array((TC_KEYS, width), np.uint16)
        qf = cuda.local.array(qregs, np.uint32)
        oacc = cuda.local.array(oregs, np.float32)
        sacc = cuda.local.array(TC_SACC, np.float32)
        T, D = q.shape[1], q.shape[2]
        bh = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        lane, w, warps = tid % WARP_SIZE, tid // WARP_SIZE, cuda.blockDim.x // WARP_SIZE
        g, t4 = lane >> 2, lane & 3
        q0 = (cuda.blockIdx.x * warps + w) * TC_QUERIES
        r0, r1 = q0 + g, q0 + g + 8  # this lane's two query rows
        for c in range(kc):  # q's A fragments: rows g, g + 8; columns 2t, 2t + 1 and 2t + 8, 2t + 9 of the chunk
            for h in range(2):
                d = c * 16 + 2 * t4 + 8 * h
                a0 = q[bh, r0, d] if r0 < T and d < D else _ZERO
                a1 = q[bh, r0, d + 1] if r0 < T and d + 1 < D else _ZERO
                b0 = q[bh, r1, d] if r1 < T and d < D else _ZERO
                b1 = q[bh, r1, d + 1] if r1 < T and d + 1 < D else _ZERO
                qf[c * 4 + 2 * h] = _pack(a0, a1)
                qf[c * 4 + 2 * h + 1] = _pack(b0, b1)
        for i in range(oregs):
            oacc[i] = _ZERO
        m0 = _NEG_INF
        m1 = _NEG_INF
        l0 = _ZERO
        l1 = _ZERO
        block_last = min(T, (cuda.blockIdx.x + 1) * warps * TC_QUERIES)
        last = block_last if causal else T
        for j0 in range(0, last, TC_KEYS):  # block-uniform trips: the barriers below see every thread
            for e in range(tid, TC_KEYS * width, cuda.blockDim.x):  # the key and value tiles, bfloat16, zero-padded
                jj, d = e // width, e % width
                inside = j0 + jj < T and d < D
                ks[jj, d] = bf16_store_bits(k[bh, j0 + jj, d]) if inside else _U16(0)
                vs[jj, d] = bf16_store_bits(v[bh, j0 + jj, d]) if inside else _U16(0)
            cuda.syncthreads()
            for nt in range(TC_KEYS // 8):  # S = q k^T, n8 tile nt: keys j0 + 8 nt + g are B's columns
                c0 = c1 = c2 = c3 = _ZERO
                for c in range(kc):
                    kb0 = _pair(ks, 8 * nt + g, c * 16 + 2 * t4)
                    kb1 = _pair(ks, 8 * nt + g, c * 16 + 2 * t4 + 8)
                    c0, c1, c2, c3 = mma_m16n8k16_bf16(qf[c * 4], qf[c * 4 + 1], qf[c * 4 + 2], qf[c * 4 + 3], kb0, kb1,
                                                       c0, c1, c2, c3)
                sacc[nt * 4] = c0
                sacc[nt * 4 + 1] = c1
                sacc[nt * 4 + 2] = c2
                sacc[nt * 4 + 3] = c3
            mt0 = _NEG_INF
            mt1 = _NEG_INF
            for nt in range(TC_KEYS // 8):  # scale, mask: value i is row g + 8 (i >> 1), key j0 + 8 nt + 2t + (i & 1)
                for i in range(4):
                    j = j0 + 8 * nt + 2 * t4 + (i & 1)
                    row = r0 if i < 2 else r1
                    x = sacc[nt * 4 + i] * scale
                    if row >= T or j >= T or (causal and j > row):
                        x = _NEG_INF
                    sacc[nt * 4 + i] = x
                    if i < 2:
                        mt0 = max(mt0, x)
                    else:
                        mt1 = max(mt1, x)
            mn0 = max(m0, _quad_max(mt0))
            mn1 = max(m1, _quad_max(mt1))
            f0 = _ONE if mn0 == _NEG_INF else math.exp(m0 - mn0)
            f1 = _ONE if mn1 == _NEG_INF else math.exp(m1 - mn1)
            ps0 = _ZERO
            ps1 = _ZERO
            for nt in range(TC_KEYS // 8):  # P = exp(S - m): 0 where masked
                for i in range(4):
                    mn = mn0 if i < 2 else mn1
                    x = sacc[nt * 4 + i]
                    p = _ZERO if x == _NEG_INF else math.exp(x - mn)
                    sacc[nt * 4 + i] = p
                    if i < 2:
                        ps0 += p
                    else:
                        ps1 += p
            l0 = l0 * f0 + ps0  # this lane's share of each row's sum (the quad adds them at the end)
            l1 = l1 * f1 + ps1
            m0, m1 = mn0, mn1
            for dt in range(nd):
                oacc[dt * 4] *= f0
                oacc[dt * 4 + 1] *= f0
                oacc[dt * 4 + 2] *= f1
                oacc[dt * 4 + 3] *= f1
            for kk in range(TC_KEYS // 16):  # o += P v: P's k16 A fragment from S tiles 2 kk and 2 kk + 1
                a0 = _pack(sacc[8 * kk], sacc[8 * kk + 1])
                a1 = _pack(sacc[8 * kk + 2], sacc[8 * kk + 3])
                a2 = _pack(sacc[8 * kk + 4], sacc[8 * kk + 5])
                a3 = _pack(sacc[8 * kk + 6], sacc[8 * kk + 7])
                for dt in range(nd):  # B[key, dim] = v: keys 16 kk + 2t (+1, +8, +9) of column 8 dt + g
                    dcol = 8 * dt + g
                    kr = 16 * kk + 2 * t4
                    vb0 = np.uint32(vs[kr, dcol]) | (np.uint32(vs[kr + 1, dcol]) << _U32_16)
                    vb1 = np.uint32(vs[kr + 8, dcol]) | (np.uint32(vs[kr + 9, dcol]) << _U32_16)
                    o0, o1, o2, o3 = mma_m16n8k16_bf16(a0, a1, a2, a3, vb0, vb1, oacc[dt * 4], oacc[dt * 4 + 1],
                                                       oacc[dt * 4 + 2], oacc[dt * 4 + 3])
                    oacc[dt * 4] = o0
                    oacc[dt * 4 + 1] = o1
                    oacc[dt * 4 + 2] = o2
                    oacc[dt * 4 + 3] = o3
            cuda.syncthreads()  # every warp is done with the tiles before the next ones are loaded
        l0 = _quad_sum(l0)
        l1 = _quad_sum(l1)
        for dt in range(nd):  # C fragment of tile dt: rows g, g + 8; columns 8 dt + 2t, + 1
            d = 8 * dt + 2 * t4
            for i in range(4):
                row = r0 if i < 2 else r1
                col = d + (i & 1)
                if row < T and col < D:
                    o[bh, row, col] = oacc[dt * 4 + i] / (l0 if i < 2 else l1)
        if t4 == 0:
            if r0 < T:
                lse[bh, r0] = m0 + math.log(l0)
            if r1 < T:
                lse[bh, r1] = m1 + math.log(l1)

    return flash_mma_kernel


def launch3(q, k, v, o, lse, causal: bool, scratch=None) -> None:
    """Version 3 on (BH, T, D) device arrays (scratch unused)."""
    BH, T, D = q.shape
    rows = TC_WARPS * TC_QUERIES
    width = -(-D // 16) * 16
    kernel = runtime.cached(("attention.flash_mma", width), lambda: make_flash_mma_kernel(width))
    kernel[(math.ceil(T / rows), BH), TC_WARPS * WARP_SIZE](q, k, v, o, lse, _F32(1 / math.sqrt(D)), int(causal))


VERSIONS = {
    1: Version("naive: scores, row softmax and P v as three kernels, (T, T) scores per head in memory", launch1),
    2: Version("tiled online softmax: a warp per query, 32 keys a tile in shared memory, no (T, T) in memory",
               launch2),
    3: Version("version 2 on the tensor cores: BF16 mma.sync m16n8k16, 16 queries a warp, P fed back as fragments",
               launch3, needs=MMA_BF16, traits={"tensor_cores"}),
}
BEST = 3


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
    pv_kernel[grid, block](ds, k, dq, scale)  # dq = dS k / sqrt(D): P v's sum
    dkv_kernel[grid, block](ds, p, q, do, dk, dv, scale)


# ----------------------------------------------------------------------------------------------------------------
# Public ops: NumPy or device arrays
# ----------------------------------------------------------------------------------------------------------------


def _qkv(q, k, v):
    q = V.array("q", q, dtype=np.float32, ndim=4)
    if not 1 <= q.shape[3] <= MAX_D or 0 in q.shape:
        raise ValueError(f"q must be (B, H, T, D) with B, H, T >= 1 and 1 <= D <= {MAX_D} (the head width), got "
                         f"{V.describe(q)}")
    if q.shape[0] * q.shape[1] > MAX_HEADS:
        raise ValueError(f"q must have B * H <= {MAX_HEADS} (one grid dimension per head), got {V.describe(q)}")
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
    attention_backward takes. version None: BEST where the GPU runs it (version 3: BF16 mma.sync, sm_80+).
    Versions 1 and 2 compute in float32 throughout; version 3 rounds the probabilities to bfloat16 before P v."""
    q, k, v = _qkv(q, k, v)
    causal = V.boolean("causal", causal)
    version = V.version("version", version, VERSIONS, default=best(VERSIONS, BEST))
    check_device(VERSIONS, version)
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
    for name, a in (("o", o), ("do", do), ("lse", lse)):
        if V.is_device_array(a) and not a.is_c_contiguous():
            raise ValueError(f"{name} must be C-contiguous when it is a device array, got {V.describe(a)}")
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


def tolerance(q, k, v, do=None, causal: bool = True, p_bf16: bool = False) -> dict:
    """Elementwise absolute tolerances of the float32 kernels against the float64 references: {"o", "lse"} and,
    with do, {"dq", "dk", "dv"}. A score s_ij carries at most D + 1 roundings of u = 2^-24, relative to
    sum_d |q_id k_jd| / sqrt(D) (row i's largest: delta_i); exp, the softmax's sums and the products with v add at
    most T + D + 8 more (Higham, Accuracy and Stability, 3.1), so each row's probabilities are good to
    r_i = 2 delta_i + (T + D + 8) u relative, and every output to r_i (or, for dk and dv, the rows' r) times the sum
    of the absolute values of its terms; a factor of 4 to spare. p_bf16 (the tensor-core version, which rounds P
    to bfloat16 before P v, as FlashAttention does): each p off by up to 2^-9 of itself, so o by up to
    2^-9 (P |v|); the bound adds 4 * 2^-8 (P |v|), twice that with the factor of 4."""
    qb, kb, vb = _rounded(q, k, v)
    D, T = qb.shape[-1], qb.shape[-2]
    u, scale = 2.0**-24, 1 / math.sqrt(D)
    p, lse, _ = _probs(qb, kb, causal)
    a = np.abs(qb) @ np.swapaxes(np.abs(kb), -1, -2) * scale
    r = 2 * (D + 1) * u * a.max(axis=-1, keepdims=True) + (T + D + 8) * u  # (B, H, T, 1)
    pv = p @ np.abs(vb)
    out = {"o": 4 * (r + (2.0**-8 if p_bf16 else 0)) * pv, "lse": 4 * r[..., 0] * (1 + np.abs(lse))}
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
BENCH_SHAPE = (8, 16, 1024, 64)
"""(B, H, T, D) of the timings: 8 sequences of 1024 tokens, 16 heads of 64 (width 1024): the size issue 30 names."""


def make_inputs(rng, shape):
    """q, k, v, do: standard-normal float32 (q scaled by 2: sharper rows, whose softmax is not near uniform)."""
    q, k, v, do = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))
    return q * _F32(2), k, v, do


def checks(rng, only=None) -> list:
    """Every version's forward, causal and not, and the backward, on poisoned outputs; only: versions and
    "backward" (bench.selected)."""
    out = []
    for n, shape in enumerate(CHECK_SHAPES["sim" if runtime.IS_SIM else "gpu"]):
        q, k, v, do = make_inputs(rng, shape)
        B, H, T, D = shape
        dq_, dk_, dv_ = (_flat(a) for a in (q, k, v))
        for causal in (True, False) if n == 0 or not runtime.IS_SIM else (True,):  # the simulator: fewer calls
            tol = tolerance(q, k, v, do, causal)
            tol_tc = tolerance(q, k, v, None, causal, p_bf16=True)
            ref_o, ref_lse = reference(q, k, v, causal)
            for ver in (v_ for v_ in VERSIONS if bench.selected(only, v_)):
                check_device(VERSIONS, ver)
                tol_v = tol_tc if VERSIONS[ver].has("tensor_cores") else tol
                o = bench.poisoned((B * H, T, D), _F32)
                lse = bench.poisoned((B * H, T), _F32)
                VERSIONS[ver].kernel(dq_, dk_, dv_, o, lse, causal)
                bench.assert_close(f"v{ver} o {shape} causal={causal}", o.copy_to_host().reshape(shape), ref_o,
                                   atol=tol_v["o"], rtol=0)
                bench.assert_close(f"v{ver} lse {shape} causal={causal}", lse.copy_to_host().reshape(shape[:3]),
                                   ref_lse, atol=tol_v["lse"], rtol=0)
                out.append((f"v{ver}: o, lse {shape}, causal={causal}", "within the bfloat16-P bound" if
                            VERSIONS[ver].has("tensor_cores") else "within the float32 bound"))
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
