"""Version 3: persistent blocks stream rows through a shared-memory ring (cp.async), b and g kept beside it.

Each thread holds one tile set of a row in version 2's layout (layout.py) and copies exactly the float4s it later
reads, so the ring needs cp.async.wait_group, not a barrier; the block reduction uses two slot buffers, one barrier
per row. docs/notes/norm_quant.md says why the ring holds what it holds.
"""

from __future__ import annotations

import math

import numpy as np

from ...device import ptx, runtime
from ...device.runtime import WARP_SIZE, cuda
from ..common import warp_sum
from .layout import (EPS, LANES, MAX_THREADS, ONE, SET_VALUES, TILE, TILES_PER_SET, ZERO, normalize_set,
                     pack_set, sum_squares)

STAGES3 = 3  # version 3: rows a block's ring holds (stages - 1 in flight while one is used)
STAGES3_BIAS = 2  # with a bias: a ring of 2 rows, then b and g kept in shared memory (4 rows' room in all)
L2_AHEAD3 = 2  # version 3 with a bias: rows past the ring's that a block asks L2 for (none without a bias)
MAX_SHARED3 = 227 * 1024  # dynamic shared memory a block may have on sm_90; a larger ring runs version 2
SIM_RESIDENT = 2  # version 3 under the simulator: 2 blocks, so that each takes several rows around its ring
_F32T = runtime.numba_type("float32")  # dynamic shared arrays take numba's type on both backends
CP_ASYNC = runtime.Capability("cp.async, which needs compute capability 8.0 or newer", (8, 0))
"""What version 3 needs of the GPU (its `needs`); with a bias it needs L2_PREFETCH too (host.needs3)."""
L2_PREFETCH = runtime.Capability("cp.async.bulk.prefetch.L2 (rows with a bias), which needs compute capability 9.0 "
                                 "or newer", (9, 0))
"""What version 3 needs of the GPU on rows with a bias: its L2 prefetch (sm_90)."""


def forward_warps3(N: int) -> tuple[int, int]:
    """Version 3's (warps, sets) for rows of N elements: one tile set per thread up to 32 warps (N = 16384), more
    sets each beyond."""
    nsets = -(-(-(-N // TILE)) // TILES_PER_SET)
    warps = min(MAX_THREADS // WARP_SIZE, nsets)
    return warps, -(-nsets // warps)


def ring3(has_bias: bool) -> tuple[int, int]:
    """Version 3's (rows in the ring, rows' worth of b and g kept after it): (3, 0) without a bias, (2, 2) with."""
    return (STAGES3_BIAS, 2) if has_bias else (STAGES3, 0)


def make_forward_kernel3(warps: int, sets: int, has_bias: bool, write_z: bool, exact: int):
    """Version 3 for blocks of `warps` warps, each thread holding up to `sets` tile sets of a row (version 2's
    layout); rows 16-byte aligned with N % 4 == 0 (cp.async copies 16 aligned bytes). exact: the layout covers the
    row exactly (N = warps * sets * 512), so no access needs a bound: each one base address plus a constant."""
    nvals = sets * SET_VALUES
    nbias = nvals if has_bias else 1
    set_stride = warps * TILES_PER_SET * TILE  # elements between a thread's sets
    set_words = set_stride // 4
    span = sets * set_stride  # floats of one ring stage (the block's layout of a row)
    load_bg = ptx.ld_global_nc_v4_f32  # volatile: loaded per row, not hoisted out of the row loop into registers
    stages = ring3(has_bias)[0]
    bo = stages * span  # with a bias: where b is kept, then g
    go = bo + span
    wait = ptx.cp_async_wait_group(stages - 1)
    ld_smem = ptx.ld_shared_v4_f32_1d
    cp16 = ptx.cp_async_16
    commit = ptx.cp_async_commit
    prefetch = ptx.prefetch_l2_bulk
    ahead = L2_AHEAD3 if has_bias else 0  # without a bias the prefetches cost more than they bring (notes)
    q_step = LANES * 4  # elements between a lane's float4s in a tile

    @cuda.jit(device=True)
    def load_row(a, c, N, inside):
        """a[0, c:c+4] through the read-only path, zeros past N (load4_row's clamp and select)."""
        if inside:
            return load_bg(a, 0, c)
        ok = c < N
        v0, v1, v2, v3 = load_bg(a, 0, c if ok else N - 4)
        return (v0 if ok else ZERO), (v1 if ok else ZERO), (v2 if ok else ZERO), (v3 if ok else ZERO)

    @cuda.jit
    def norm_quant_kernel3(x, xb, b, g, codes4, scales, rstd, z):
        """x (M, N), xb the same as bytes (for cp.async); b, g (1, N) views; codes4 codes as uint32 (M, N/4).
        Block k takes rows k, k + grid, k + 2 grid, ..."""
        y = cuda.local.array(nvals, np.float32)  # registers: constant indices once loops are unrolled
        bv = cuda.local.array(nbias, np.float32)
        gv = cuda.local.array(SET_VALUES, np.float32)
        slots = cuda.shared.array((2, 32), np.float32)  # two buffers: one barrier per row
        ring = cuda.shared.array(0, _F32T)  # stages x span floats, then b and g with a bias
        M, N = x.shape
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        warp = cuda.threadIdx.x // WARP_SIZE
        sub = lane // LANES
        gl = lane % LANES
        tile0 = warp * TILES_PER_SET + sub
        first = tile0 * TILE + gl * 4  # the thread's first element: then + s * set_stride + q * q_step
        fw = tile0 * (TILE // 4) + gl  # the same as a word of codes4: then + s * set_words + q * LANES
        grid = cuda.gridDim.x
        m = cuda.blockIdx.x
        if ahead > 0 and cuda.threadIdx.x == 0:
            for p in range(stages - 1, stages - 1 + ahead):  # the rows after the ring's first ones
                pr = m + p * grid
                if pr < M:
                    prefetch(x, pr, 0, N * 4)
        for p in range(stages - 1):  # prologue: the first stages - 1 rows in flight
            pr = m + p * grid
            for s in range(sets):
                for q in range(4):
                    c = first + s * set_stride + q * q_step
                    ok = exact or c < N  # else zero-filled: zeros past N, as version 2's registers
                    cp16(ring, (p * span + c) * 4, xb, pr if pr < M else 0, (c if ok else 0) * 4,
                         16 if ok and pr < M else 0)
            commit()
        if has_bias:  # each thread keeps the float4s of b and g it reads: its own, so no barrier
            for s in range(sets):
                for q in range(4):
                    k = first + s * set_stride + q * q_step
                    ring[bo + k], ring[bo + k + 1], ring[bo + k + 2], ring[bo + k + 3] = load_row(
                        b, k, N, exact or s < sets - 1)
                    ring[go + k], ring[go + k + 1], ring[go + k + 2], ring[go + k + 3] = load_row(
                        g, k, N, exact or s < sets - 1)
        stage = 0
        par = 0
        while m < M:  # block-uniform: every thread reaches every barrier and shuffle
            if ahead > 0 and cuda.threadIdx.x == 0:
                pr = m + (stages - 1 + ahead) * grid
                if pr < M:
                    prefetch(x, pr, 0, N * 4)
            pr = m + (stages - 1) * grid  # the row stages - 1 ahead, into the stage read last time
            pst = stage - 1 if stage > 0 else stages - 1
            for s in range(sets):
                for q in range(4):
                    c = first + s * set_stride + q * q_step
                    ok = exact or c < N
                    cp16(ring, (pst * span + c) * 4, xb, pr if pr < M else 0, (c if ok else 0) * 4,
                         16 if ok and pr < M else 0)
            commit()
            wait()  # this thread's copies of row m have landed (it reads only what it copied: no barrier)
            for s in range(sets):
                for q in range(4):
                    i = s * SET_VALUES + 4 * q
                    k = first + s * set_stride + q * q_step
                    y[i], y[i + 1], y[i + 2], y[i + 3] = ld_smem(ring, stage * span + k)
                    if has_bias:
                        bv[i], bv[i + 1], bv[i + 2], bv[i + 3] = ld_smem(ring, bo + k)
            # rstd: block_sum's order (warp_sum, then the warps' sums by warp_sum)
            ss = warp_sum(sum_squares(y, bv, nvals, has_bias))
            if warps > 1:
                if lane == 0:
                    slots[par, warp] = ss
                cuda.syncthreads()
                ss = warp_sum(slots[par, lane] if lane < warps else ZERO)
                par ^= 1
            r = np.float32(ONE / math.sqrt(ss / np.float32(N) + EPS))
            if cuda.threadIdx.x == 0:
                rstd[m] = r
            for s in range(sets):
                ts = warp + s * warps
                if exact or ts * TILES_PER_SET < ntiles:  # warp-uniform
                    tk = ts * TILES_PER_SET + sub
                    c0 = first + s * set_stride
                    for q in range(4):
                        if has_bias:
                            gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = ld_smem(ring, go + c0 + q * q_step)
                        else:
                            gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = load_row(
                                g, c0 + q * q_step, N, exact or s < sets - 1)
                    scale, inv = normalize_set(y, s * SET_VALUES, r, gv)
                    i0 = s * SET_VALUES
                    w0, w1, w2, w3 = pack_set(y, i0, inv)
                    mu = np.uint64(m)  # unsigned indices: no negative-index wrap-around code
                    if exact or tk < ntiles:
                        for q in range(4):
                            c = c0 + q * q_step
                            i = i0 + 4 * q
                            if exact or c < N:
                                word = w0 if q == 0 else w1 if q == 1 else w2 if q == 2 else w3
                                codes4[mu, np.uint64(fw + s * set_words + q * LANES)] = word
                                if write_z:
                                    for e in range(4):
                                        z[mu, np.uint64(c + e)] = y[i + e]
                        if gl == 0:
                            scales[mu, np.uint64(tk)] = scale
            m += grid
            stage = stage + 1 if stage < stages - 1 else 0

    return norm_quant_kernel3
