"""Float32 GEMM on CUDA cores, the SIMT ladder: c (M, N) = a (M, K) @ b (K, N), all row-major float32.

The classic climb from a naive kernel toward cuBLAS SGEMM (Simon Boehm, "How to Optimize a CUDA Matmul Kernel
for cuBLAS-like Performance", 2022; his RTX A6000 percentages are `plotting.BOEHM_A6000`). Every version
accumulates in FP32 and handles
M, N and K that are not multiples of its tiles: loads outside the matrices give 0, stores outside are skipped.

version 1: naive: one thread per output, threadIdx.x along M (a warp reads 32 rows of a: uncoalesced).
version 2: coalesced: one thread per output, threadIdx.x along N (a warp reads 32 neighbours of a row of b).
version 3: shared memory: 32 x 32 tiles of a and b staged in shared memory, each element read once per tile.
version 4: 1-D register blocking: 64 x 64 block tile, BK = 8, each thread computes a column of TM = 8 outputs.
version 5: 2-D register blocking: 128 x 128 block tile, BK = 8, each thread computes TM x TN = 8 x 8 outputs.
version 6: wider loads: version 5 with float4 global loads (inline PTX ld.global.v4.f32) and the a tile
           stored transposed in shared memory, so each thread reads its TM values of a from one row.
version 7: version 6 with float4 shared loads (ld.shared.v4.f32 through an addrspacecast, no inline assembly),
           each thread's 8 x 8 outputs split into 2 x 2 groups of 4 x 4, 64 rows / columns apart, so that a
           quarter-warp's 16-byte reads hit distinct banks, and two shared buffers (the next k-step is loaded
           from global memory during this one's FMAs; one barrier per k-step).

Inline PTX (fp8lab.device.ptx): `ld_global_v4_f32(x, i, j)` returns x[i, j:j+4] as four float32 from one 16-byte
`ld.global.v4.f32`; the address must be 16-byte aligned, so versions 6 and 7 use it (through common.load4) only
where `common.vec_ok` says the rows allow it, and four scalar loads elsewhere and at the matrix edges. Under the
simulator the same name is a software twin. Versions 5-7 have the register-tiled core's geometry
(kernels/common.py: TILE_M x TILE_N = 128 x 128, TILE_K = 8, 8 x 8 outputs per thread); version 7's compute
step and epilogue are common.sgemm_fma_step and common.sgemm_store, which fp8_gemm version 3 shares.
Checked without a GPU (PTX for sm_90 from numba-cuda 0.30.4, ptxas 13.0): version 6 has its two
`ld.global.v4.f32`, but its shared-memory reads stay scalar `ld.shared.f32`, as in version 5 (Boehm's CUDA C++
got 128-bit shared loads there); version 7's inner loop is four `ld.shared.v4.f32` and 64 `fma.rn.f32` per k;
no version spills to local memory.

Launch configurations (threads per block, static shared memory) are in `LAUNCH`; `occupancy(version)` turns them
into blocks per SM (fp8lab.device.hardware's model). `python -m fp8lab.kernels.gemm [--plot PATH]` checks every version,
then times it at 4096^3 against cuBLAS SGEMM measured in the same run.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..device import hardware, runtime
from ..bench import timing
from ..device.ptx import st_shared_v4_f32
from ..device.runtime import cuda
from . import common as C
from .common import load4, sgemm_fma_step, sgemm_store, vec_ok
from .versions import Version

__all__ = ["VERSIONS", "BEST", "LAUNCH", "gemm", "launch", "atb_launch", "atb_splits", "reference", "error_bound",
           "occupancy", "PTXAS_REGS_SM90", "checks", "timings", "main"]

# ------------------------------------------------------------------------------------------------------------------
# Tile sizes. Shared- and local-array shapes must be compile-time constants: every size a kernel uses is a
# module-level int (arithmetic like `TILE + 1` inside a kernel does not type on the GPU).
# ------------------------------------------------------------------------------------------------------------------

T12 = 32  # versions 1, 2: 32 x 32 threads per block, one output each
T3 = 32  # version 3: 32 x 32 tiles, 32 x 32 threads

BM4, BN4, BK4, TM4 = 64, 64, 8, 8  # version 4: block tile BM4 x BN4, k-step BK4, TM4 outputs per thread
THREADS4 = BM4 * BN4 // TM4  # 512

BM5, BN5, BK5, TM5, TN5 = C.TILE_M, C.TILE_N, C.TILE_K, C.THREAD_M, C.THREAD_N  # versions 5-7: the shared core
THREADS5 = C.TILE_THREADS  # 256
STRIDE_A5 = THREADS5 // BK5  # 32: rows of the a tile loaded per pass (4 passes)
STRIDE_B5 = THREADS5 // BN5  # 2: rows of the b tile loaded per pass (4 passes)
COLS5 = C.TILE_COLS  # 16 threads across a block tile's columns
VEC_A6 = BK5 // 4  # 2 float4 per row of the a tile: 128 rows x 2 = 256 loads, one per thread
VEC_B6 = BN5 // 4  # 32 float4 per row of the b tile: 8 rows x 32 = 256 loads, one per thread
BUF_ROWS7 = C.TILE_BUF_ROWS  # version 7: two k-step buffers stacked in one shared array


# ------------------------------------------------------------------------------------------------------------------
# The kernels
# ------------------------------------------------------------------------------------------------------------------


@cuda.jit
def gemm_kernel1(a, b, c):
    """Naive. Block (32, 32), grid (ceil(M/32), ceil(N/32)); thread (x, y) computes c[m, n] with m along x."""
    M, K = a.shape
    N = b.shape[1]
    m = cuda.blockIdx.x * T12 + cuda.threadIdx.x  # consecutive threads of a warp: consecutive ROWS of a and c
    n = cuda.blockIdx.y * T12 + cuda.threadIdx.y  # the same n in the whole warp: b[k, n] is one broadcast read
    if m < M and n < N:
        acc = np.float32(0)
        for k in range(K):
            acc += a[m, k] * b[k, n]  # a warp touches 32 rows of a, K * 4 bytes apart: 32 memory transactions
        c[m, n] = acc


@cuda.jit
def gemm_kernel2(a, b, c):
    """Coalesced. Block (32, 32), grid (ceil(N/32), ceil(M/32)); thread (x, y) computes c[m, n] with n along x."""
    M, K = a.shape
    N = b.shape[1]
    n = cuda.blockIdx.x * T12 + cuda.threadIdx.x  # consecutive threads: consecutive columns of b and c
    m = cuda.blockIdx.y * T12 + cuda.threadIdx.y  # the same m in the whole warp: a[m, k] is one broadcast read
    if m < M and n < N:
        acc = np.float32(0)
        for k in range(K):
            acc += a[m, k] * b[k, n]  # a warp reads 32 neighbours b[k, n0:n0+32]: one 128-byte transaction
        c[m, n] = acc


@cuda.jit
def gemm_kernel3(a, b, c):
    """Shared-memory tiles. Block (32, 32), grid (ceil(N/32), ceil(M/32)); one output per thread."""
    # one declaration a line: the simulator aliases two shared arrays declared on one line
    sa = cuda.shared.array((T3, T3), np.float32)  # a[m0:m0+32, k0:k0+32]
    sb = cuda.shared.array((T3, T3), np.float32)  # b[k0:k0+32, n0:n0+32]
    M, K = a.shape
    N = b.shape[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m = cuda.blockIdx.y * T3 + ty
    n = cuda.blockIdx.x * T3 + tx
    acc = np.float32(0)
    for k0 in range(0, K, T3):
        # every thread loads one element of each tile, coalesced along tx; outside the matrices: 0
        va = np.float32(0)
        vb = np.float32(0)
        if m < M and k0 + tx < K:
            va = a[m, k0 + tx]
        if k0 + ty < K and n < N:
            vb = b[k0 + ty, n]
        sa[ty, tx] = va
        sb[ty, tx] = vb
        cuda.syncthreads()  # the tiles are complete before anyone reads them
        for kk in range(T3):
            acc += sa[ty, kk] * sb[kk, tx]  # sa: one address per warp (broadcast); sb: 32 banks, no conflict
        cuda.syncthreads()  # everyone is done with the tiles before they are overwritten
    if m < M and n < N:
        c[m, n] = acc


@cuda.jit
def gemm_kernel4(a, b, c):
    """1-D register blocking. Block THREADS4 = 512 (1-D), grid (ceil(N/64), ceil(M/64)); TM4 = 8 outputs each."""
    sa = cuda.shared.array((BM4, BK4), np.float32)
    sb = cuda.shared.array((BK4, BN4), np.float32)
    acc = cuda.local.array(TM4, np.float32)  # per-thread registers (the compiler keeps them out of memory
    #                                           when every index is known after unrolling)
    M, K = a.shape
    N = b.shape[1]
    tid = cuda.threadIdx.x
    m0 = cuda.blockIdx.y * BM4
    n0 = cuda.blockIdx.x * BN4
    row_a = tid // BK4  # this thread loads sa[row_a, col_a] (512 = 64 x 8 elements, one each)
    col_a = tid % BK4
    row_b = tid // BN4  # and sb[row_b, col_b] (512 = 8 x 64 elements, one each)
    col_b = tid % BN4
    t_col = tid % BN4  # it computes c[m0 + t_row*TM4 + i, n0 + t_col] for i < TM4
    t_row = tid // BN4
    for i in range(TM4):
        acc[i] = np.float32(0)
    for k0 in range(0, K, BK4):
        va = np.float32(0)
        vb = np.float32(0)
        if m0 + row_a < M and k0 + col_a < K:
            va = a[m0 + row_a, k0 + col_a]
        if k0 + row_b < K and n0 + col_b < N:
            vb = b[k0 + row_b, n0 + col_b]
        sa[row_a, col_a] = va
        sb[row_b, col_b] = vb
        cuda.syncthreads()
        for kk in range(BK4):
            bval = sb[kk, t_col]  # one shared-memory read, reused TM4 times from a register
            for i in range(TM4):
                acc[i] += sa[t_row * TM4 + i, kk] * bval
        cuda.syncthreads()
    n = n0 + t_col
    for i in range(TM4):
        m = m0 + t_row * TM4 + i
        if m < M and n < N:
            c[m, n] = acc[i]


@cuda.jit
def gemm_kernel5(a, b, c):
    """2-D register blocking. Block THREADS5 = 256 (1-D), grid (ceil(N/128), ceil(M/128)); 8 x 8 outputs each."""
    sa = cuda.shared.array((BM5, BK5), np.float32)
    sb = cuda.shared.array((BK5, BN5), np.float32)
    acc = cuda.local.array((TM5, TN5), np.float32)  # 64 accumulators in registers
    reg_m = cuda.local.array(TM5, np.float32)  # a column of the a tile, in registers
    reg_n = cuda.local.array(TN5, np.float32)  # a row of the b tile, in registers
    M, K = a.shape
    N = b.shape[1]
    tid = cuda.threadIdx.x
    m0 = cuda.blockIdx.y * BM5
    n0 = cuda.blockIdx.x * BN5
    row_a = tid // BK5  # loads sa[row_a + 32p, col_a], p = 0..3
    col_a = tid % BK5
    row_b = tid // BN5  # loads sb[row_b + 2p, col_b], p = 0..3
    col_b = tid % BN5
    t_row = tid // COLS5  # computes c[m0 + t_row*TM5 + i, n0 + t_col*TN5 + j]
    t_col = tid % COLS5
    for i in range(TM5):
        for j in range(TN5):
            acc[i, j] = np.float32(0)
    for k0 in range(0, K, BK5):
        for r in range(0, BM5, STRIDE_A5):
            v = np.float32(0)
            if m0 + row_a + r < M and k0 + col_a < K:
                v = a[m0 + row_a + r, k0 + col_a]
            sa[row_a + r, col_a] = v
        for r in range(0, BK5, STRIDE_B5):
            v = np.float32(0)
            if k0 + row_b + r < K and n0 + col_b < N:
                v = b[k0 + row_b + r, n0 + col_b]
            sb[row_b + r, col_b] = v
        cuda.syncthreads()
        for kk in range(BK5):
            for i in range(TM5):
                reg_m[i] = sa[t_row * TM5 + i, kk]
            for j in range(TN5):
                reg_n[j] = sb[kk, t_col * TN5 + j]
            for i in range(TM5):  # TM5 * TN5 = 64 FMAs for 16 shared-memory reads
                for j in range(TN5):
                    acc[i, j] += reg_m[i] * reg_n[j]
        cuda.syncthreads()
    for i in range(TM5):
        m = m0 + t_row * TM5 + i
        for j in range(TN5):
            n = n0 + t_col * TN5 + j
            if m < M and n < N:
                c[m, n] = acc[i, j]


@cuda.jit
def gemm_kernel6(a, b, c, vec_a, vec_b):
    """Version 5 with float4 global loads and a transposed a tile. Launch as version 5.

    vec_a, vec_b: 1 when a (resp. b) may be read with 16-byte loads (contiguous rows, row length a multiple of 4,
    16-byte aligned base), else 0: then, and at the edges of the matrices, four scalar loads replace each one.
    """
    sat = cuda.shared.array((BK5, BM5), np.float32)  # the a tile TRANSPOSED: sat[k, m] = a[m0 + m, k0 + k]
    sb = cuda.shared.array((BK5, BN5), np.float32)
    acc = cuda.local.array((TM5, TN5), np.float32)
    reg_m = cuda.local.array(TM5, np.float32)
    reg_n = cuda.local.array(TN5, np.float32)
    M, K = a.shape
    N = b.shape[1]
    tid = cuda.threadIdx.x
    m0 = cuda.blockIdx.y * BM5
    n0 = cuda.blockIdx.x * BN5
    row_a = tid // VEC_A6  # this thread loads a[m0 + row_a, k0 + col_a : +4] (128 rows x 2 float4)
    col_a = (tid % VEC_A6) * 4
    row_b = tid // VEC_B6  # and b[k0 + row_b, n0 + col_b : +4] (8 rows x 32 float4)
    col_b = (tid % VEC_B6) * 4
    t_row = tid // COLS5
    t_col = tid % COLS5
    for i in range(TM5):
        for j in range(TN5):
            acc[i, j] = np.float32(0)
    for k0 in range(0, K, BK5):
        x0, x1, x2, x3 = load4(a, m0 + row_a, k0 + col_a, M, K, vec_a)  # one 16-byte load instead of four
        sat[col_a, row_a] = x0  # stored transposed: the compute loop below reads a row of sat
        sat[col_a + 1, row_a] = x1
        sat[col_a + 2, row_a] = x2
        sat[col_a + 3, row_a] = x3
        y0, y1, y2, y3 = load4(b, k0 + row_b, n0 + col_b, K, N, vec_b)
        sb[row_b, col_b] = y0
        sb[row_b, col_b + 1] = y1
        sb[row_b, col_b + 2] = y2
        sb[row_b, col_b + 3] = y3
        cuda.syncthreads()
        for kk in range(BK5):
            for i in range(TM5):
                reg_m[i] = sat[kk, t_row * TM5 + i]  # 8 consecutive floats of one row (sa[., kk]: a column)
            for j in range(TN5):
                reg_n[j] = sb[kk, t_col * TN5 + j]
            for i in range(TM5):
                for j in range(TN5):
                    acc[i, j] += reg_m[i] * reg_n[j]
        cuda.syncthreads()
    for i in range(TM5):
        m = m0 + t_row * TM5 + i
        for j in range(TN5):
            n = n0 + t_col * TN5 + j
            if m < M and n < N:
                c[m, n] = acc[i, j]


@cuda.jit
def gemm_kernel7(a, b, c, vec_a, vec_b):
    """Version 6 + 128-bit shared loads, a conflict-free thread layout and double buffering. Launch as version 5.

    Each thread computes 8 x 8 outputs as 2 x 2 groups of 4 x 4: rows t_row*4 + {0..3} and 64 + t_row*4 + {0..3},
    columns likewise with t_col. Per k, a thread reads its 8 values of a and 8 of b with four ld.shared.v4.f32;
    the 16 threads of a half-warp read 16 consecutive float4 of b (256 bytes: no bank conflict) and 2 float4 of a
    (a broadcast). Two shared buffers: the next k-step's tiles are loaded from global memory into registers
    before this step's 512 FMAs and stored into the other buffer after them, so one barrier per k-step suffices
    and the global-memory latency hides behind arithmetic.
    """
    sat = cuda.shared.array((BUF_ROWS7, BM5), np.float32)  # rows buf*BK5 + k: a tile transposed, two buffers
    sb = cuda.shared.array((BUF_ROWS7, BN5), np.float32)  # rows buf*BK5 + k: b tile, two buffers
    acc = cuda.local.array((TM5, TN5), np.float32)
    reg_m = cuda.local.array(TM5, np.float32)
    reg_n = cuda.local.array(TN5, np.float32)
    M, K = a.shape
    N = b.shape[1]
    tid = cuda.threadIdx.x
    m0 = cuda.blockIdx.y * BM5
    n0 = cuda.blockIdx.x * BN5
    row_a = tid // VEC_A6  # loads a[m0 + row_a, k0 + col_a : +4]
    col_a = (tid % VEC_A6) * 4
    row_b = tid // VEC_B6  # loads b[k0 + row_b, n0 + col_b : +4]
    col_b = (tid % VEC_B6) * 4
    t_row = tid // COLS5
    t_col = tid % COLS5
    for i in range(TM5):
        for j in range(TN5):
            acc[i, j] = np.float32(0)
    x0, x1, x2, x3 = load4(a, m0 + row_a, col_a, M, K, vec_a)  # k-step 0 into buffer 0
    y0, y1, y2, y3 = load4(b, row_b, n0 + col_b, K, N, vec_b)
    sat[col_a, row_a] = x0
    sat[col_a + 1, row_a] = x1
    sat[col_a + 2, row_a] = x2
    sat[col_a + 3, row_a] = x3
    st_shared_v4_f32(sb, row_b, col_b, y0, y1, y2, y3)
    cuda.syncthreads()
    buf = 0
    for k0 in range(0, K, BK5):
        nxt = k0 + BK5
        if nxt < K:  # issue the next k-step's global loads now; they complete while we compute
            x0, x1, x2, x3 = load4(a, m0 + row_a, nxt + col_a, M, K, vec_a)
            y0, y1, y2, y3 = load4(b, nxt + row_b, n0 + col_b, K, N, vec_b)
        base = buf * BK5
        for kk in range(BK5):
            sgemm_fma_step(sat, sb, base + kk, t_row, t_col, reg_m, reg_n, acc)
        if nxt < K:  # the other buffer: everyone finished reading it before the last barrier
            other = (1 - buf) * BK5
            sat[other + col_a, row_a] = x0
            sat[other + col_a + 1, row_a] = x1
            sat[other + col_a + 2, row_a] = x2
            sat[other + col_a + 3, row_a] = x3
            st_shared_v4_f32(sb, other + row_b, col_b, y0, y1, y2, y3)
        cuda.syncthreads()
        buf = 1 - buf
    sgemm_store(c, acc, m0, n0, t_row, t_col, M, N)


def _cost(a, b, c, tm, tn, tk):  # seconds under the simulator, dims rounded up to the tile (docs/notes/simulator.md)
    return runtime.SimCost(a, b, c, tile=(tm, tn, tk), names="M x N x K = ")


VERSIONS = {
    1: Version("naive: one thread per output, threadIdx.x along M (uncoalesced)", gemm_kernel1,
               sim_cost=_cost(0, 1.5e-6, 2.9e-4, 32, 32, 1)),
    2: Version("coalesced: one thread per output, threadIdx.x along N", gemm_kernel2,
               sim_cost=_cost(0.1, 1.6e-6, 2.8e-4, 32, 32, 1)),
    3: Version("shared memory: 32 x 32 tiles of a and b", gemm_kernel3, sim_cost=_cost(0.3, 1.1e-5, 3.0e-4, 32, 32, 32)),
    4: Version("1-D register blocking: 64 x 64 tile, BK 8, a column of TM 8 outputs per thread", gemm_kernel4,
               sim_cost=_cost(0.3, 3.9e-6, 0, 64, 64, 8)),
    5: Version("2-D register blocking: 128 x 128 tile, BK 8, TM x TN = 8 x 8 outputs per thread", gemm_kernel5,
               sim_cost=_cost(0.3, 1.0e-6, 0, 128, 128, 8)),
    6: Version("wider loads: version 5 + float4 global loads (ld.global.v4.f32) + transposed a tile", gemm_kernel6,
               sim_cost=_cost(0.2, 1.2e-6, 0, 128, 128, 8)),
    7: Version("version 6 + float4 shared loads (ld.shared.v4.f32), conflict-free layout, double buffering",
               gemm_kernel7, sim_cost=_cost(0, 2.0e-6, 0, 128, 128, 8)),
}
BEST = 7
"""The fastest version on an H200 (BENCHMARKS.md)."""

# Launch configuration of each version: threads per block, static shared memory per block (bytes), outputs per
# block (tile_m x tile_n), and a lower bound on registers per thread (the accumulators and register fragments
# alone; the compiler needs more for addresses and loop counters).
LAUNCH = {
    1: dict(threads=T12 * T12, smem=0, tile=(T12, T12), min_regs=1),
    2: dict(threads=T12 * T12, smem=0, tile=(T12, T12), min_regs=1),
    3: dict(threads=T3 * T3, smem=2 * T3 * T3 * 4, tile=(T3, T3), min_regs=1),
    4: dict(threads=THREADS4, smem=(BM4 * BK4 + BK4 * BN4) * 4, tile=(BM4, BN4), min_regs=TM4 + 1),
    5: dict(threads=THREADS5, smem=(BM5 * BK5 + BK5 * BN5) * 4, tile=(BM5, BN5), min_regs=TM5 * TN5 + TM5 + TN5),
    6: dict(threads=THREADS5, smem=(BK5 * BM5 + BK5 * BN5) * 4, tile=(BM5, BN5), min_regs=TM5 * TN5 + TM5 + TN5),
    7: dict(threads=THREADS5, smem=(BUF_ROWS7 * BM5 + BUF_ROWS7 * BN5) * 4, tile=(BM5, BN5),
            min_regs=TM5 * TN5 + TM5 + TN5 + 8),
}

# Registers per thread that ptxas (CUDA 13.0, -arch=sm_90) reported for the PTX numba-cuda 0.30.4 emits for
# these kernels (C-contiguous float32 operands), recorded here without a GPU: a stand-in for the simulator. On a
# GPU use the compiled kernel's own count, `VERSIONS[v].kernel.get_regs_per_thread()`, which may differ.
PTXAS_REGS_SM90 = {1: 31, 2: 31, 3: 32, 4: 46, 5: 126, 6: 126, 7: 120}

def occupancy(version: int, regs_per_thread: int | None = None) -> dict:
    """Resident blocks and warps per SM of `version` on a compute-capability-9.0 SM (hardware.occupancy on
    LAUNCH[version]); regs_per_thread None uses LAUNCH's lower bound."""
    return dict(version=version, **hardware.occupancy(LAUNCH[version], regs_per_thread))


def grid(version: int, M: int, N: int):
    """(grid, block) of `version` for an M x N output."""
    tm, tn = LAUNCH[version]["tile"]
    if version == 1:
        return (math.ceil(M / tm), math.ceil(N / tn)), (T12, T12)
    if version in (2, 3):
        return (math.ceil(N / tn), math.ceil(M / tm)), (tn, tm)
    return (math.ceil(N / tn), math.ceil(M / tm)), LAUNCH[version]["threads"]


def launch(a, b, out, version: int = BEST) -> None:
    """out (M, N) = a (M, K) @ b (K, N) on float32 device arrays (no checks: `gemm` is the checked entry point)."""
    M, N = out.shape
    blocks, block = grid(version, M, N)
    if version in (6, 7):  # the float4 global loads take an aligned-or-not flag per operand
        VERSIONS[version].kernel[blocks, block](a, b, out, vec_ok(a), vec_ok(b))
    else:
        VERSIONS[version].kernel[blocks, block](a, b, out)


def gemm(a, b, version: int | None = None, out=None):
    """c = a @ b in float32 with the SIMT kernel `version` (None: BEST), FP32 accumulation.

    a: (M, K) and b: (K, N) float32, NumPy or CUDA device arrays. Returns a NumPy array when both inputs are NumPy
    arrays, else a device array; with `out` (a float32 (M, N) NumPy or device array) the result is written there
    and `out` is returned. NaN and Inf in a or b are not checked: they reach the outputs that use them, as in any
    float32 GEMM.
    """
    a = V.array("a", a, dtype=np.float32, ndim=2)
    b = V.array("b", b, dtype=np.float32, ndim=2)
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"a and b must have equal inner dimensions (a is (M, K), b is (K, N)): got a {V.describe(a)},"
                         f" b {V.describe(b)}")
    version = V.version("version", version, VERSIONS, default=BEST)
    if out is not None:
        out = V.array("out", out, dtype=np.float32, shape=(M, N), writable=True)
    runtime.sim_check("fl.gemm", (M, N, K), VERSIONS[version].sim_cost)  # warns once if the simulator takes minutes
    on_device = V.is_device_array(a) or V.is_device_array(b)
    if out is not None and V.is_device_array(out):
        c = out
    else:
        c = cuda.device_array((M, N), np.float32)
    launch(runtime.to_device(a), runtime.to_device(b), c, version)
    if out is not None and not V.is_device_array(out):
        out[...] = c.copy_to_host()
        return out
    if out is not None:
        return out
    return c if on_device else c.copy_to_host()


# ------------------------------------------------------------------------------------------------------------------
# c = a^T b for tall a (K, M) and b (K, N), K >> M, N: the output head's weight gradient (dlogits^T z over the
# tokens). One block per 64 x 32 tile of c has few tiles to share (65 x 512: 2 x 16), so K is split over gridDim.z
# too, each split's sum written to partial[s], then the splits added in order: deterministic, no atomics.
# ------------------------------------------------------------------------------------------------------------------

ATB_N = 32  # columns of c per block (threadIdx.x)
ATB_ROWS = runtime.per_backend({"sim": 2, "gpu": 8})  # threadIdx.y; each thread ATB_M / ATB_ROWS rows of c
ATB_M = 64  # rows of c per block
ATB_PER = ATB_M // ATB_ROWS  # accumulators per thread
ATB_K = 32  # rows of a and b staged in shared memory per step
ATB_BLOCKS = 264  # blocks to aim for (2 per SM of an H200): what sets the number of splits


@cuda.jit
def atb_kernel(a, b, partial):
    """partial[s, i, j] = sum of a[k, i] * b[k, j] over split s's rows k, in k order (FP32)."""
    sa = cuda.shared.array((ATB_K, ATB_M), np.float32)
    sb = cuda.shared.array((ATB_K, ATB_N), np.float32)
    acc = cuda.local.array(ATB_PER, np.float32)
    K, M = a.shape
    N = b.shape[1]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    t, nt = ty * ATB_N + tx, ATB_N * cuda.blockDim.y
    i0, j0 = cuda.blockIdx.y * ATB_M, cuda.blockIdx.x * ATB_N
    per = (K + cuda.gridDim.z - 1) // cuda.gridDim.z
    lo = cuda.blockIdx.z * per
    hi = min(K, lo + per)
    for r in range(ATB_PER):
        acc[r] = np.float32(0)
    for k0 in range(lo, hi, ATB_K):
        for e in range(t, ATB_K * ATB_M, nt):  # zeros past the edges add nothing
            kk, ii = e // ATB_M, e % ATB_M
            sa[kk, ii] = a[k0 + kk, i0 + ii] if k0 + kk < hi and i0 + ii < M else np.float32(0)
        for e in range(t, ATB_K * ATB_N, nt):
            kk, jj = e // ATB_N, e % ATB_N
            sb[kk, jj] = b[k0 + kk, j0 + jj] if k0 + kk < hi and j0 + jj < N else np.float32(0)
        cuda.syncthreads()
        for kk in range(ATB_K):
            bv = sb[kk, tx]
            for r in range(ATB_PER):
                acc[r] += sa[kk, ty + r * ATB_ROWS] * bv
        cuda.syncthreads()
    for r in range(ATB_PER):
        i = i0 + ty + r * ATB_ROWS
        if i < M and j0 + tx < N:
            partial[cuda.blockIdx.z, i, j0 + tx] = acc[r]


@cuda.jit
def atb_reduce_kernel(partial, c):
    """c[i, j] = the splits' sums added in order, from the first."""
    M, N = c.shape
    e = cuda.grid(1)
    while e < M * N:
        i, j = e // N, e % N
        v = partial[0, i, j]
        for s in range(1, partial.shape[0]):
            v += partial[s, i, j]
        c[i, j] = v
        e += cuda.gridsize(1)


def atb_splits(K: int, M: int, N: int) -> int:
    """How many splits of K atb_launch makes for c (M, N): enough blocks for the GPU, at least ATB_K rows each (2
    under the simulator, where K allows)."""
    tiles = math.ceil(M / ATB_M) * math.ceil(N / ATB_N)
    wanted = 2 if runtime.IS_SIM else math.ceil(ATB_BLOCKS / tiles)
    return max(1, min(wanted, math.ceil(K / ATB_K)))


def atb_launch(a, b, c, partial) -> None:
    """c (M, N) = a^T b for float32 device arrays a (K, M), b (K, N); partial: a float32 device array of at least
    (atb_splits(K, M, N), M, N), made once by the caller (a captured CUDA graph cannot allocate)."""
    (K, M), N = a.shape, b.shape[1]
    S = atb_splits(K, M, N)
    if partial.shape[0] < S or partial.shape[1:] != (M, N):
        raise ValueError(f"partial must have shape (>= {S}, {M}, {N}), got {partial.shape}")
    atb_kernel[(math.ceil(N / ATB_N), math.ceil(M / ATB_M), S), (ATB_N, ATB_ROWS)](a, b, partial[:S])
    atb_reduce_kernel[runtime.grid_1d(M * N, runtime.block_threads(256), runtime.MAX_BLOCKS)](partial[:S], c)


def reference(a, b):
    """The spec: a @ b in float64 (NumPy)."""
    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def error_bound(a, b):
    """Elementwise bound on |float32 kernel - reference| for any summation order, fused or not.

    Each of the K - 1 additions (and each product) rounds with relative error at most u = 2^-24, so the classic
    bound is |err| <= gamma_K * sum_k |a_mk| |b_kn| with gamma_K = K u / (1 - K u) (Higham, Accuracy and Stability,
    3.1); K * 2^-23 covers it with a factor of 2 to spare. The float64 reference's own error is negligible.
    """
    K = np.shape(a)[1]
    return K * 2.0**-23 * (np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b, np.float64))) + 1e-30


def check(version: int, M: int, N: int, K: int, rng=None) -> float:
    """Run `version` once on fresh random (M, K) @ (K, N), output poisoned with NaN; raise on any error above
    error_bound (NaN fails). Returns the largest error relative to the bound (<= 1)."""
    rng = np.random.default_rng() if rng is None else rng
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    out = bench.poisoned((M, N), np.float32)
    launch(cuda.to_device(a), cuda.to_device(b), out, version)
    got = out.copy_to_host()
    err = np.abs(got - reference(a, b))
    bound = error_bound(a, b)
    if np.isnan(got).any() or not (err <= bound).all():
        bad = np.argwhere(~(err <= bound))
        where = ", ".join(str(tuple(int(i) for i in idx)) for idx in bad[:3])
        raise AssertionError(f"gemm v{version} {M}x{N}x{K}: {len(bad)} of {got.size} outputs beyond the error bound "
                             f"(NaN counts), first at {where}")
    return float((err / bound).max())


# Shapes for a check on this backend: under the simulator every thread is a Python thread, so they are tiny but
# never tile multiples; v5/v6 get one shape that spans 2 x 2 block tiles with a partial k-step.
SIM_CHECK = {1: (37, 45, 33), 2: (37, 45, 33), 3: (20, 45, 50), 4: (37, 70, 33), 5: (130, 129, 17),
             6: (130, 129, 17), 7: (130, 129, 17)}
GPU_CHECK = (1027, 2049, 515)


def check_shape(version: int) -> tuple[int, int, int]:
    return SIM_CHECK[version] if runtime.IS_SIM else GPU_CHECK


OPTIONS = {"--plot": dict(metavar="PATH", help="also save a bar chart of the ladder there (PNG)")}
BENCH_SIZE = 4096


def check_atb(K: int, M: int, N: int, rng=None) -> float:
    """atb_launch once on fresh random a (K, M), b (K, N), c poisoned with NaN, against reference(a.T, b) within
    error_bound (NaN fails); returns the largest error relative to the bound."""
    rng = np.random.default_rng() if rng is None else rng
    a = rng.standard_normal((K, M), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = bench.poisoned((M, N), np.float32)
    partial = bench.poisoned((atb_splits(K, M, N), M, N), np.float32)
    atb_launch(cuda.to_device(a), cuda.to_device(b), c, partial)
    got = c.copy_to_host()
    err, bound = np.abs(got - reference(a.T, b)), error_bound(a.T, b)
    if np.isnan(got).any() or not (err <= bound).all():
        raise AssertionError(f"atb {K}x{M}x{N}: {int((~(err <= bound)).sum())} of {got.size} outputs beyond the error "
                             "bound (NaN counts)")
    return float((err / bound).max())


ATB_CHECK = {"sim": (70, 67, 33), "gpu": (16387, 65, 515)}
"""(K, M, N) of atb's check: the capstone's head (65 characters) with odd sizes, K split several times."""


def checks(rng, only=None) -> list:
    """only: the versions to check (bench.selected); None: all (and atb_launch)."""
    out = []
    for v in (v for v in VERSIONS if bench.selected(only, v)):
        M, N, K = check_shape(v)
        worst = check(v, M, N, K, rng)
        out.append((f"v{v} {M}x{N}x{K}", f"within the FP32 bound ({worst:.1e} of it)"))
    if only is None:
        K, M, N = ATB_CHECK["sim" if runtime.IS_SIM else "gpu"]
        worst = check_atb(K, M, N, rng)
        out.append((f"atb: a^T b, a ({K}, {M}), b ({K}, {N}), K in {atb_splits(K, M, N)} splits",
                    f"within the FP32 bound ({worst:.1e} of it)"))
    return out


def timings(rng, args) -> list:
    """Every version at 4096^3 against cuBLAS SGEMM (torch, TF32 off) measured in the same run; with args.only, only
    those versions."""
    only = getattr(args, "only", None)
    S = BENCH_SIZE
    flops = 2.0 * S**3
    a = cuda.to_device(rng.standard_normal((S, S), dtype=np.float32))
    b = cuda.to_device(rng.standard_normal((S, S), dtype=np.float32))
    out = cuda.device_array((S, S), np.float32)
    rows = [bench.Row(f"v{v}: {desc}", timing.time_ms(lambda v=v: launch(a, b, out, v), warmup=1, repeat=5), flops)
            for v, desc in VERSIONS.items() if bench.selected(only, v)]
    ceiling = None
    torch = bench.torch_cuda()
    if torch is not None and only is None:
        torch.backends.cuda.matmul.allow_tf32 = False
        ta, tb = torch.randn(S, S, device="cuda"), torch.randn(S, S, device="cuda")
        base = bench.Row("torch float32 a @ b (cuBLAS SGEMM, TF32 off)", timing.torch_time_ms(torch, lambda: ta @ tb),
                         flops)
        rows.append(base)
        ceiling = bench.rate(flops, base.ms, "TFLOP/s")
    if args is not None and getattr(args, "plot", None) and only is None:
        from ..course.plotting import plot_ladder

        plot_ladder({v: bench.rate(flops, r.ms, "TFLOP/s") for v, r in zip(VERSIONS, rows)}, ceiling, path=args.plot)
        print(f"plot saved to {args.plot}")
    return [bench.Table(f"SGEMM {S}x{S}x{S}, float32", "TFLOP/s", rows, ceiling=ceiling, ceiling_label="cuBLAS",
                        peak_kind="fp32")]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
