"""Versions 1 and 2 of the forward, and the backward: one block per row.

Version 1 writes z, then quantizes it in a second kernel; version 2 keeps its row in registers in the tile-set layout
(layout.py) and writes the codes directly; the backward keeps y and dz in registers. Every kernel is built per
configuration (bias, block size, ...) by a `make_*` function and cached by the launchers (host.py).
"""

from __future__ import annotations

import math

import numpy as np

from ...device import runtime
from ...device.runtime import WARP_SIZE, cuda
from ...numerics.spec import POISON_CODE
from ..common import CVT_X2, ENCODE_SAT, amax_scale, block_sum, nanmax, warp_max
from .layout import (E4M3_MAX, EPS, LANES, ONE, SET_VALUES, TILE, TILES_PER_SET, ZERO, load4_row, normalize_set,
                     sum_squares)

MIN_WARPS = 1  # warps per row block at least: one warp of 2 sets ran fastest at N = 1024 (docs/notes/norm_quant.md)
FIT_THREADS = 512  # blocks up to this size when a thread holds 2 sets / 16 elements (under 128 registers each)
ANY_THREADS = 256  # blocks of this size launch whatever their register count (256 x 255 < 65536 per SM)
THREADS1 = runtime.block_threads(128)  # version 1's row kernel
QUANT_WARPS1 = 1 if runtime.IS_SIM else 4  # version 1's quantize kernel: warps per block, one tile each
PER_LANE1 = TILE // WARP_SIZE  # version 1's quantize kernel: elements per lane (array sizes must be constants)
SETS_PER_WARP = 2  # version 2: sets a thread holds while warps last (32 floats in registers)
BWD_PER_THREAD = 16  # backward: elements of y (and of dz) a thread holds while threads last


# ----------------------------------------------------------------------------------------------------------------
# Version 1: unfused (row kernel writes z, quantize kernel reads it back)
# ----------------------------------------------------------------------------------------------------------------


def make_forward_kernels1(has_bias: bool):
    """(row kernel, quantize kernel) of version 1; has_bias is compiled in."""
    encode = ENCODE_SAT["e4m3"]

    @cuda.jit
    def rmsnorm_bias_kernel1(x, b, g, z, rstd):
        """One block per row: block_sum of y^2, then z = y * rstd * g (x and b are read twice)."""
        slots = cuda.shared.array(32, np.float32)
        N = x.shape[1]
        m = cuda.blockIdx.x
        ss = ZERO
        for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
            v = x[m, n]
            if has_bias:
                v += b[n]
            ss += v * v
        ss = block_sum(ss, slots)
        r = np.float32(ONE / math.sqrt(ss / np.float32(N) + EPS))
        if cuda.threadIdx.x == 0:
            rstd[m] = r
        for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
            v = x[m, n]
            if has_bias:
                v += b[n]
            z[m, n] = v * r * g[n]

    @cuda.jit
    def tile_quantize_kernel1(z, codes, scales):
        """One warp per 1 x 128 tile of z: 4 elements per lane, warp_max, the software E4M3 encoder."""
        vals = cuda.local.array(PER_LANE1, np.float32)
        N = z.shape[1]
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        w = cuda.grid(1) // WARP_SIZE
        while w < scales.size:  # warp-uniform: every lane reaches every shuffle
            r = w // ntiles
            t = w % ntiles
            amax = ZERO
            for j in range(PER_LANE1):
                c = t * TILE + lane + WARP_SIZE * j  # lanes on consecutive addresses: coalesced
                v = z[r, c] if c < N else ZERO
                vals[j] = v
                amax = nanmax(amax, abs(v))
            amax = warp_max(amax)
            s, inv = amax_scale(amax, E4M3_MAX)
            for j in range(PER_LANE1):
                c = t * TILE + lane + WARP_SIZE * j
                if c < N:
                    codes[r, c] = POISON_CODE if inv != inv else encode(vals[j] * inv)
            if lane == 0:
                scales[r, t] = s
            w += cuda.gridsize(1) // WARP_SIZE

    return rmsnorm_bias_kernel1, tile_quantize_kernel1


# ----------------------------------------------------------------------------------------------------------------
# Version 2: fused, the row in registers (layout.py)
# ----------------------------------------------------------------------------------------------------------------


def make_forward_kernel2(warps: int, sets: int, has_bias: bool, write_z: bool, vec: int):
    """Version 2 for blocks of `warps` warps, each holding up to `sets` tile sets of a row; bias, z output and
    16-byte access compiled in. With the block size a constant, every load's offset from the thread's first
    address is a constant too: one address register per array, not one per load."""
    cvt_x2 = CVT_X2["e4m3"]
    nvals = sets * SET_VALUES
    nbias = nvals if has_bias else 1
    poison4 = np.uint32(POISON_CODE * 0x01010101)

    @cuda.jit
    def norm_quant_kernel2(x, b, g, codes, codes4, scales, rstd, z):
        """b and g are (1, N) views, so that they are read 16 bytes at a time too; codes4 is codes viewed as uint32
        (M, N/4) where vec (else unused).

        Sets s < sets - 1 of every warp are whole sets of whole tiles (sets = ceil(row's sets / warps)), so only
        the last one needs bounds."""
        y = cuda.local.array(nvals, np.float32)  # registers: every index is a constant once loops are unrolled
        bv = cuda.local.array(nbias, np.float32)
        gv = cuda.local.array(SET_VALUES, np.float32)
        slots = cuda.shared.array(32, np.float32)
        N = x.shape[1]
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        warp = cuda.threadIdx.x // WARP_SIZE
        sub = lane // LANES  # which tile of the set
        gl = lane % LANES  # lane within the tile
        m = cuda.blockIdx.x
        first = (warp * TILES_PER_SET + sub) * TILE + gl * 4  # the thread's first element in set 0
        # 1. the row (and b, from L2) into registers: every load issued before any value is used
        for s in range(sets):
            for q in range(4):
                i = s * SET_VALUES + 4 * q
                c = first + s * warps * TILES_PER_SET * TILE + q * LANES * 4
                y[i], y[i + 1], y[i + 2], y[i + 3] = load4_row(x, m, c, N, vec, s < sets - 1)
                if has_bias:
                    bv[i], bv[i + 1], bv[i + 2], bv[i + 3] = load4_row(b, 0, c, N, vec, s < sets - 1)
        # 2. rstd (elements past N are 0)
        ss = block_sum(sum_squares(y, bv, nvals, has_bias), slots)
        r = np.float32(ONE / math.sqrt(ss / np.float32(N) + EPS))
        if cuda.threadIdx.x == 0:
            rstd[m] = r
        # 3. z, tile amax, scale, codes, one set at a time
        for s in range(sets):
            ts = warp + s * warps
            if ts * TILES_PER_SET < ntiles:  # warp-uniform: all 32 lanes reach the shuffles
                tk = ts * TILES_PER_SET + sub
                c0 = first + s * warps * TILES_PER_SET * TILE
                for q in range(4):  # g (L1/L2 hits) for the whole set first
                    gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = load4_row(
                        g, 0, c0 + q * LANES * 4, N, vec, s < sets - 1)
                scale, inv = normalize_set(y, s * SET_VALUES, r, gv)  # z replaces y in the registers
                if tk < ntiles:
                    for q in range(4):
                        c = c0 + q * LANES * 4
                        i = s * SET_VALUES + 4 * q
                        if c < N:
                            word = poison4
                            if inv == inv:
                                lo = cvt_x2(y[i + 1] * inv, y[i] * inv)  # element c in the low byte
                                hi = cvt_x2(y[i + 3] * inv, y[i + 2] * inv)
                                word = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))
                            if vec:
                                codes4[m, c // 4] = word  # little-endian: byte e of the word is element c + e
                            for e in range(4):
                                if not vec and c + e < N:
                                    codes[m, c + e] = np.uint8((word >> np.uint32(8 * e)) & np.uint32(0xFF))
                                if write_z and c + e < N:
                                    z[m, c + e] = y[i + e]
                    if gl == 0:
                        scales[m, tk] = scale

    return norm_quant_kernel2


def forward_warps(N: int) -> int:
    """Version 2's warps per row block for rows of N elements: enough that a thread holds at most SETS_PER_WARP
    sets, up to FIT_THREADS threads (N = 16384); longer rows get ANY_THREADS threads holding more sets each."""
    nsets = -(-(-(-N // TILE)) // TILES_PER_SET)
    warps = max(MIN_WARPS, -(-nsets // SETS_PER_WARP))
    return warps if warps * WARP_SIZE <= FIT_THREADS else ANY_THREADS // WARP_SIZE


# ----------------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------------


def make_backward_kernel(threads: int, per_thread: int, has_bias: bool, add: bool = False):
    """The backward for blocks of `threads` threads, each holding up to `per_thread` elements of a row (element
    n = thread + k * threads); bias compiled in. The block size is a constant, so every load's offset from the
    thread's first address is a constant too, and only the last k can fall past N (per_thread = ceil(N / threads)).
    add (compiled in): dx = res + the gradient (res may be dx: the residual stream's gradient accumulated in place);
    without it res is not read (pass dx)."""

    @cuda.jit
    def norm_quant_backward_kernel(dz, x, b, g, rstd, dx, gy, res):
        ys = cuda.local.array(per_thread, np.float32)  # registers (constant indices once unrolled)
        dzs = cuda.local.array(per_thread, np.float32)
        slots = cuda.shared.array(32, np.float32)
        N = x.shape[1]
        # Unsigned indices: numba adds no negative-index wrap-around, so x[m, tid + k * threads] is one base address
        # plus a constant offset per k.
        tid = np.uint64(cuda.threadIdx.x)
        m = np.uint64(cuda.blockIdx.x)
        nu = np.uint64(N)  # (comparing unsigned with signed integers would go through float64)
        last = tid + np.uint64((per_thread - 1) * threads)
        ok = last < nu
        nl = last if ok else nu - np.uint64(1)  # the last k reads from a clamped index, then selects: no branch
        # all loads issued before any value is used
        for k in range(per_thread - 1):
            ys[k] = x[m, tid + np.uint64(k * threads)]
            dzs[k] = dz[m, tid + np.uint64(k * threads)]
        v = x[m, nl]
        d = dz[m, nl]
        ys[per_thread - 1] = v if ok else ZERO
        dzs[per_thread - 1] = d if ok else ZERO
        if has_bias:
            for k in range(per_thread - 1):
                ys[k] += b[tid + np.uint64(k * threads)]
            bn = b[nl]
            ys[per_thread - 1] += bn if ok else ZERO
        dot = ZERO
        for k in range(per_thread - 1):
            dot += dzs[k] * g[tid + np.uint64(k * threads)] * ys[k]
        gn = g[nl]
        dot += dzs[per_thread - 1] * (gn if ok else ZERO) * ys[per_thread - 1]
        dot = block_sum(dot, slots)
        r = rstd[m]
        c = r * r * r * dot / np.float32(N)
        for k in range(per_thread):
            n = tid + np.uint64(k * threads)
            if k < per_thread - 1 or ok:
                gn = g[n]
                if add:  # added after the gradient is formed: the bits of a separate add
                    dx[m, n] = res[m, n] + (r * gn * dzs[k] - c * ys[k])
                else:
                    dx[m, n] = r * gn * dzs[k] - c * ys[k]
                gy[m, n] = dzs[k] * ys[k] * r

    return norm_quant_backward_kernel


def backward_threads(N: int) -> int:
    """The backward's threads per row block: enough that a thread holds at most BWD_PER_THREAD elements, a
    multiple of 32, up to FIT_THREADS (N = 8192); longer rows get ANY_THREADS threads holding more each."""
    threads = max(MIN_WARPS * WARP_SIZE, -(-N // (BWD_PER_THREAD * WARP_SIZE)) * WARP_SIZE)
    return threads if threads <= FIT_THREADS else ANY_THREADS
