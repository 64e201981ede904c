"""Version 4: narrow rows (N <= 2048), one warp per row, several rows per block, b and g staged in shared memory.

A row of up to MAX_SETS4 tile sets fits one warp in version 2's layout (layout.py), so its sum of squares is one
warp_sum, no block reduction; the block stages b and g once for its rows while their x loads are in flight
(docs/notes/norm_quant.md). Wider rows run version 3 (host.py decides).
"""

from __future__ import annotations

import math

import numpy as np

from ...device import ptx, runtime
from ...device.runtime import WARP_SIZE, cuda
from ..common import warp_sum
from .layout import (EPS, LANES, ONE, SET_VALUES, TILE, TILES_PER_SET, load4_row, normalize_set, pack_set,
                     sum_squares)

ROWS4 = 2 if runtime.IS_SIM else 8  # version 4: rows (warps) per block (the simulator: fewer Python threads)
MAX_SETS4 = 4  # version 4 takes rows of up to 4 tile sets (N <= 2048: 64 floats a lane); wider rows run version 3


def make_forward_kernel4(rows: int, sets: int, has_bias: bool, write_z: bool, exact: int):
    """Version 4 for blocks of `rows` warps, warp w taking row blockIdx * rows + w whole (up to `sets` tile sets a
    lane, version 2's layout with one warp); rows 16-byte aligned with N % 4 == 0. exact: N = sets * 512, so no
    access needs a bound."""
    nvals = sets * SET_VALUES
    nbias = nvals if has_bias else 1
    set_stride = TILES_PER_SET * TILE  # one warp covers the row: 512 elements between a lane's sets
    span = sets * set_stride
    nsb = span if has_bias else 1
    ld_smem = ptx.ld_shared_v4_f32_1d
    q_step = LANES * 4
    stage_step = rows * WARP_SIZE * 4  # floats of b and g the block stages per pass

    @cuda.jit
    def norm_quant_kernel4(x, b, g, codes4, scales, rstd, z):
        """b, g (1, N) views; codes4 codes as uint32 (M, N/4). The block's warps share b and g in shared memory;
        nothing else is shared, so the one barrier is the staging's."""
        y = cuda.local.array(nvals, np.float32)  # registers (constant indices once loops are unrolled)
        bv = cuda.local.array(nbias, np.float32)
        gv = cuda.local.array(SET_VALUES, np.float32)
        sb = cuda.shared.array(nsb, np.float32)
        sg = cuda.shared.array(span, np.float32)
        M, N = x.shape
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        sub = lane // LANES
        gl = lane % LANES
        first = sub * TILE + gl * 4  # the lane's first element: then + s * set_stride + q * q_step
        fw = sub * (TILE // 4) + gl  # the same as a word of codes4
        m = cuda.blockIdx.x * rows + cuda.threadIdx.x // WARP_SIZE
        mr = m if m < M else M - 1  # a warp past the last row loads one anyway and stores nothing (no branch)
        # 1. the row into registers: every load issued before any value is used
        for s in range(sets):
            for q in range(4):
                i = s * SET_VALUES + 4 * q
                y[i], y[i + 1], y[i + 2], y[i + 3] = load4_row(x, mr, first + s * set_stride + q * q_step, N, 1,
                                                               exact or s < sets - 1)
        # 2. meanwhile the block stages b and g (zeros past N) in shared memory, once for its `rows` rows
        for k0 in range(0, span, stage_step):
            k = k0 + cuda.threadIdx.x * 4
            if k < span:
                if has_bias:
                    sb[k], sb[k + 1], sb[k + 2], sb[k + 3] = load4_row(b, 0, k, N, 1, exact)
                sg[k], sg[k + 1], sg[k + 2], sg[k + 3] = load4_row(g, 0, k, N, 1, exact)
        cuda.syncthreads()
        if m < M:  # warp-uniform
            if has_bias:
                for s in range(sets):
                    for q in range(4):
                        i = s * SET_VALUES + 4 * q
                        bv[i], bv[i + 1], bv[i + 2], bv[i + 3] = ld_smem(sb, first + s * set_stride + q * q_step)
            ss = warp_sum(sum_squares(y, bv, nvals, has_bias))  # the row's sum: one warp, no block reduction
            r = np.float32(ONE / math.sqrt(ss / np.float32(N) + EPS))
            mu = np.uint64(m)  # unsigned indices: no negative-index wrap-around code
            if lane == 0:
                rstd[mu] = r
            for s in range(sets):
                if exact or s * TILES_PER_SET < ntiles:  # warp-uniform
                    c0 = first + s * set_stride
                    for q in range(4):
                        gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = ld_smem(sg, c0 + q * q_step)
                    scale, inv = normalize_set(y, s * SET_VALUES, r, gv)  # z replaces y in the registers
                    i0 = s * SET_VALUES
                    w0, w1, w2, w3 = pack_set(y, i0, inv)
                    tk = s * TILES_PER_SET + sub
                    if exact or tk < ntiles:
                        for q in range(4):
                            c = c0 + q * q_step
                            if exact or c < N:
                                word = w0 if q == 0 else w1 if q == 1 else w2 if q == 2 else w3
                                codes4[mu, np.uint64(fw + s * (set_stride // 4) + q * LANES)] = word
                                if write_z:
                                    for e in range(4):
                                        z[mu, np.uint64(c + e)] = y[i0 + 4 * q + e]
                        if gl == 0:
                            scales[mu, np.uint64(tk)] = scale

    return norm_quant_kernel4
