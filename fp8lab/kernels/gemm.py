"""Float32 GEMM on CUDA cores, the SIMT ladder: c (M, N) = a (M, K) @ b (K, N), all row-major float32.

The classic climb from a naive kernel toward cuBLAS SGEMM (Simon Boehm, "How to Optimize a CUDA Matmul Kernel
for cuBLAS-like Performance"; his A6000 numbers are in FACTS.md). Every version accumulates in FP32 and handles
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

Inline PTX: `ld_global_v4_f32(x, i, j)` returns x[i, j:j+4] as four float32 from one 16-byte load. On a GPU it is
an `@intrinsic` emitting `ld.global.v4.f32` (the address must be 16-byte aligned: version 6 uses it only when
the rows of x are contiguous, their length a multiple of 4 and the base pointer aligned, and falls back to four
scalar loads otherwise and at the matrix edges). The simulator cannot run PTX: there the same name is a software
twin that reads the four elements one by one (`HARDWARE` says which you have), so kernel source never forks.
Checked without a GPU (PTX for sm_90 from numba-cuda 0.30.4, ptxas 13.0): version 6 has its two
`ld.global.v4.f32`, but its shared-memory reads stay scalar `ld.shared.f32`, as in version 5 (Boehm's CUDA C++
got 128-bit shared loads there); version 7's inner loop is four `ld.shared.v4.f32` and 64 `fma.rn.f32` per k;
no version spills to local memory.

Launch configurations (threads per block, static shared memory) are in `LAUNCH`; `occupancy()` turns them into
blocks per SM on an H100-class GPU. `python -m fp8lab.kernels.gemm [--plot PATH]` checks every version, then
times it at 4096^3 against cuBLAS SGEMM measured in the same run (tiny shapes and no timing under the simulator).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import runtime
from ..runtime import cuda

__all__ = ["VERSIONS", "BEST", "HARDWARE", "LAUNCH", "KERNELS", "gemm", "launch", "reference", "error_bound",
           "occupancy", "PTXAS_REGS_SM90", "ld_global_v4_f32", "ld_shared_v4_f32", "st_shared_v4_f32",
           "BOEHM_A6000", "H100_FP32_TFLOPS", "plot_ladder", "main"]

HARDWARE = not runtime.IS_SIM
"""True on a GPU (ld_global_v4_f32 is inline PTX); False under the simulator (a software twin)."""

H100_FP32_TFLOPS = 67.0
"""FP32 (CUDA-core) peak of an H100 SXM, dense (FACTS.md): the roofline of every version here."""

BOEHM_A6000 = {1: 1.3, 2: 8.5, 3: 12.8, 4: 36.5, 5: 68.7, 6: 78.4}
"""Boehm's published ladder (RTX A6000, 4092^2, percent of cuBLAS SGEMM, FACTS.md): his numbers, not ours. Version 7
has no counterpart (his kernel 6 already had 128-bit shared loads; double buffering comes later in his list)."""

# ------------------------------------------------------------------------------------------------------------------
# Tile sizes. Shared- and local-array shapes must be compile-time constants: every size a kernel uses is a
# module-level int (arithmetic like `TILE + 1` inside a kernel does not type on the GPU).
# ------------------------------------------------------------------------------------------------------------------

T12 = 32  # versions 1, 2: 32 x 32 threads per block, one output each
T3 = 32  # version 3: 32 x 32 tiles, 32 x 32 threads

BM4, BN4, BK4, TM4 = 64, 64, 8, 8  # version 4: block tile BM4 x BN4, k-step BK4, TM4 outputs per thread
THREADS4 = BM4 * BN4 // TM4  # 512

BM5, BN5, BK5, TM5, TN5 = 128, 128, 8, 8, 8  # versions 5, 6: TM5 x TN5 outputs per thread
THREADS5 = (BM5 // TM5) * (BN5 // TN5)  # 256
STRIDE_A5 = THREADS5 // BK5  # 32: rows of the a tile loaded per pass (4 passes)
STRIDE_B5 = THREADS5 // BN5  # 2: rows of the b tile loaded per pass (4 passes)
COLS5 = BN5 // TN5  # 16 threads across a block tile's columns
VEC_A6 = BK5 // 4  # 2 float4 per row of the a tile: 128 rows x 2 = 256 loads, one per thread
VEC_B6 = BN5 // 4  # 32 float4 per row of the b tile: 8 rows x 32 = 256 loads, one per thread
BUF_ROWS7 = 2 * BK5  # version 7: two k-step buffers stacked in one shared array
HALF7 = 64  # version 7: a thread's second group of 4 rows (and of 4 columns) starts 64 further


# ------------------------------------------------------------------------------------------------------------------
# ld.global.v4.f32: inline PTX on the GPU, a software twin in the simulator
# ------------------------------------------------------------------------------------------------------------------


def _make_ld_global_v4_f32(instruction: str = "ld.global.v4.f32"):
    """An @intrinsic `ld_global_v4_f32(x, i, j) -> (x[i,j], x[i,j+1], x[i,j+2], x[i,j+3])` (GPU only).

    x: a 2-D float32 array in global memory; the address of x[i, j] must be 16-byte aligned (the PTX ISA requires
    vector accesses to be aligned to their full size; a misaligned one faults). No bounds check.
    """
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def ld_global_v4_f32(typingctx, x, i, j):
        if not (isinstance(x, types.Array) and x.ndim == 2 and x.dtype == types.float32
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            return None  # numba then reports a typing error naming the argument types
        sig = types.UniTuple(types.float32, 4)(x, i, j)

        def codegen(context, builder, sig, args):
            xty, ity, jty = sig.args
            ary = context.make_array(xty)(context, builder, value=args[0])
            inds = [context.cast(builder, args[1], ity, types.intp), context.cast(builder, args[2], jty, types.intp)]
            ptr = cgutils.get_item_pointer(context, builder, xty, ary, inds)
            f32 = ir.FloatType()
            # four "=f" outputs (.f32 registers) returned as one struct, "l": the 64-bit address
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [f32.as_pointer()])
            asm = ir.InlineAsm(fnty, instruction + " {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l")
            res = builder.call(asm, [ptr])
            vals = [builder.extract_value(res, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return intrinsic(ld_global_v4_f32)


def _twin_ld_global_v4_f32(x, i, j):
    """Software twin of ld.global.v4.f32: four scalar loads."""
    return x[i, j], x[i, j + 1], x[i, j + 2], x[i, j + 3]


if HARDWARE:
    ld_global_v4_f32 = _make_ld_global_v4_f32()
    # the read-only data path (the "non-coherent" cache): only for data no thread writes during the kernel
    ld_global_nc_v4_f32 = _make_ld_global_v4_f32("ld.global.nc.v4.f32")
else:
    ld_global_v4_f32 = cuda.jit(device=True)(_twin_ld_global_v4_f32)
    ld_global_nc_v4_f32 = ld_global_v4_f32


def _make_shared_v4_f32():
    """@intrinsics `ld_shared_v4_f32(s, i, j)` -> s[i, j:j+4] and `st_shared_v4_f32(s, i, j, x0, x1, x2, x3)`.

    s: a 2-D float32 shared array; the element address must be 16-byte aligned (rows of a multiple of 4 floats,
    j a multiple of 4). Numba hands kernels a generic pointer to a shared array; casting it back to the shared
    address space (addrspacecast to addrspace(3)) and loading a <4 x float> with align 16 lets NVVM emit one
    `ld.shared.v4.f32` (or `st.shared.v4.f32`) instead of four scalar accesses. No bounds check.
    """
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    f32 = ir.FloatType()
    vec = ir.VectorType(f32, 4)

    def _shared_ptr(context, builder, sig, args):
        xty, ity, jty = sig.args[:3]
        ary = context.make_array(xty)(context, builder, value=args[0])
        inds = [context.cast(builder, args[1], ity, types.intp), context.cast(builder, args[2], jty, types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, xty, ary, inds)
        return builder.bitcast(builder.addrspacecast(ptr, f32.as_pointer(3)), vec.as_pointer(3))

    def _ok(x, i, j):
        return (isinstance(x, types.Array) and x.ndim == 2 and x.dtype == types.float32
                and isinstance(i, types.Integer) and isinstance(j, types.Integer))

    def ld_shared_v4_f32(typingctx, x, i, j):
        if not _ok(x, i, j):
            return None
        sig = types.UniTuple(types.float32, 4)(x, i, j)

        def codegen(context, builder, sig, args):
            v = builder.load(_shared_ptr(context, builder, sig, args), align=16)
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    def st_shared_v4_f32(typingctx, x, i, j, x0, x1, x2, x3):
        if not (_ok(x, i, j) and all(isinstance(t, types.Float) for t in (x0, x1, x2, x3))):
            return None
        sig = types.void(x, i, j, x0, x1, x2, x3)

        def codegen(context, builder, sig, args):
            v = ir.Constant(vec, ir.Undefined)
            for k in range(4):
                val = context.cast(builder, args[3 + k], sig.args[3 + k], types.float32)
                v = builder.insert_element(v, val, ir.Constant(ir.IntType(32), k))
            builder.store(v, _shared_ptr(context, builder, sig, args), align=16)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(ld_shared_v4_f32), intrinsic(st_shared_v4_f32)


def _twin_ld_shared_v4_f32(s, i, j):
    """Software twin of ld.shared.v4.f32: four scalar loads."""
    return s[i, j], s[i, j + 1], s[i, j + 2], s[i, j + 3]


def _twin_st_shared_v4_f32(s, i, j, x0, x1, x2, x3):
    """Software twin of st.shared.v4.f32: four scalar stores."""
    s[i, j] = x0
    s[i, j + 1] = x1
    s[i, j + 2] = x2
    s[i, j + 3] = x3


if HARDWARE:
    ld_shared_v4_f32, st_shared_v4_f32 = _make_shared_v4_f32()
else:
    ld_shared_v4_f32 = cuda.jit(device=True)(_twin_ld_shared_v4_f32)
    st_shared_v4_f32 = cuda.jit(device=True)(_twin_st_shared_v4_f32)


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
    sa = cuda.shared.array((T3, T3), np.float32)  # a[m0:m0+32, k0:k0+32]
    sb = cuda.shared.array((T3, T3), np.float32)  # b[k0:k0+32, n0:n0+32] (one declaration per line: see FACTS)
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


@cuda.jit(device=True)
def _load4(x, i, j, rows, cols, vec):
    """x[i, j:j+4] as four float32, 0 outside the matrix; one 16-byte load when vec and all four exist."""
    x0 = np.float32(0)
    x1 = np.float32(0)
    x2 = np.float32(0)
    x3 = np.float32(0)
    if i < rows:
        if vec != 0 and j + 3 < cols:
            x0, x1, x2, x3 = ld_global_v4_f32(x, i, j)
        else:
            if j < cols:
                x0 = x[i, j]
            if j + 1 < cols:
                x1 = x[i, j + 1]
            if j + 2 < cols:
                x2 = x[i, j + 2]
            if j + 3 < cols:
                x3 = x[i, j + 3]
    return x0, x1, x2, x3


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
        x0, x1, x2, x3 = _load4(a, m0 + row_a, k0 + col_a, M, K, vec_a)  # one 16-byte load instead of four
        sat[col_a, row_a] = x0  # stored transposed: the compute loop below reads a row of sat
        sat[col_a + 1, row_a] = x1
        sat[col_a + 2, row_a] = x2
        sat[col_a + 3, row_a] = x3
        y0, y1, y2, y3 = _load4(b, k0 + row_b, n0 + col_b, K, N, vec_b)
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


@cuda.jit(device=True)
def _fma_step7(sat, sbt, k, t_row, t_col, reg_m, reg_n, acc):
    """Version 7's work for one k (also fp8_gemm version 3's): the thread's 8 values of a from row k of sat and
    its 8 of b from row k of sbt (four ld.shared.v4.f32, 4 x 4 groups HALF7 apart), then acc += their outer
    product (64 FMAs)."""
    reg_m[0], reg_m[1], reg_m[2], reg_m[3] = ld_shared_v4_f32(sat, k, t_row * 4)
    reg_m[4], reg_m[5], reg_m[6], reg_m[7] = ld_shared_v4_f32(sat, k, HALF7 + t_row * 4)
    reg_n[0], reg_n[1], reg_n[2], reg_n[3] = ld_shared_v4_f32(sbt, k, t_col * 4)
    reg_n[4], reg_n[5], reg_n[6], reg_n[7] = ld_shared_v4_f32(sbt, k, HALF7 + t_col * 4)
    for i in range(TM5):
        for j in range(TN5):
            acc[i, j] += reg_m[i] * reg_n[j]


@cuda.jit(device=True)
def _store7(c, acc, m0, n0, t_row, t_col, M, N):
    """Version 7's epilogue (also fp8_gemm version 3's): acc's 2 x 2 groups of 4 x 4 to c (M x N), inside it."""
    for i in range(TM5):
        m = m0 + (i // 4) * HALF7 + t_row * 4 + i % 4
        for j in range(TN5):
            n = n0 + (j // 4) * HALF7 + t_col * 4 + j % 4
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
    x0, x1, x2, x3 = _load4(a, m0 + row_a, col_a, M, K, vec_a)  # k-step 0 into buffer 0
    y0, y1, y2, y3 = _load4(b, row_b, n0 + col_b, K, N, vec_b)
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
            x0, x1, x2, x3 = _load4(a, m0 + row_a, nxt + col_a, M, K, vec_a)
            y0, y1, y2, y3 = _load4(b, nxt + row_b, n0 + col_b, K, N, vec_b)
        base = buf * BK5
        for kk in range(BK5):
            _fma_step7(sat, sb, base + kk, t_row, t_col, reg_m, reg_n, acc)
        if nxt < K:  # the other buffer: everyone finished reading it before the last barrier
            other = (1 - buf) * BK5
            sat[other + col_a, row_a] = x0
            sat[other + col_a + 1, row_a] = x1
            sat[other + col_a + 2, row_a] = x2
            sat[other + col_a + 3, row_a] = x3
            st_shared_v4_f32(sb, other + row_b, col_b, y0, y1, y2, y3)
        cuda.syncthreads()
        buf = 1 - buf
    _store7(c, acc, m0, n0, t_row, t_col, M, N)


KERNELS = {1: gemm_kernel1, 2: gemm_kernel2, 3: gemm_kernel3, 4: gemm_kernel4, 5: gemm_kernel5, 6: gemm_kernel6,
           7: gemm_kernel7}
VERSIONS = {
    1: "naive: one thread per output, threadIdx.x along M (uncoalesced)",
    2: "coalesced: one thread per output, threadIdx.x along N",
    3: "shared memory: 32 x 32 tiles of a and b",
    4: "1-D register blocking: 64 x 64 tile, BK 8, a column of TM 8 outputs per thread",
    5: "2-D register blocking: 128 x 128 tile, BK 8, TM x TN = 8 x 8 outputs per thread",
    6: "wider loads: version 5 + float4 global loads (ld.global.v4.f32) + transposed a tile",
    7: "version 6 + float4 shared loads (ld.shared.v4.f32), conflict-free layout, double buffering",
}
BEST = 7
"""The fastest version measured on an H200 (BENCHMARKS.md: 68% of cuBLAS SGEMM at 4096^3)."""

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
# GPU use the compiled kernel's own count, `KERNELS[v].get_regs_per_thread()`, which may differ.
PTXAS_REGS_SM90 = {1: 31, 2: 31, 3: 32, 4: 46, 5: 126, 6: 126, 7: 120}

# H100 (compute capability 9.0) per-SM limits, CUDA C++ Programming Guide, "Compute Capabilities" table.
H100_SM = dict(regs=65536, smem=228 * 1024, threads=2048, blocks=32, reg_alloc_unit=256, smem_reserved=1024)


def occupancy(version: int, regs_per_thread: int | None = None) -> dict:
    """Resident blocks and warps per SM for `version` on an H100-class SM, and which limit binds.

    regs_per_thread: the compiled kernel's register count (on a GPU: `kernel.get_regs_per_thread()`); None uses
    LAUNCH's lower bound, so the register limit is then an upper bound on occupancy. Registers are allocated per
    warp in units of 256; each block also takes 1 KB of shared memory reserved by the system (CUDA guide).
    """
    cfg = LAUNCH[version]
    lim = H100_SM
    threads, smem = cfg["threads"], cfg["smem"]
    regs = cfg["min_regs"] if regs_per_thread is None else int(regs_per_thread)
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(regs * 32 / lim["reg_alloc_unit"]) * lim["reg_alloc_unit"]
    by = {
        "threads": lim["threads"] // threads,
        "registers": lim["regs"] // (regs_per_warp * warps),
        "shared memory": lim["smem"] // (smem + lim["smem_reserved"]),
        "blocks": lim["blocks"],
    }
    blocks = min(by.values())
    return dict(version=version, threads=threads, smem=smem, regs=regs, regs_known=regs_per_thread is not None,
                blocks_per_sm=blocks, limited_by=min(by, key=by.get), by=by,
                occupancy=blocks * warps / (lim["threads"] // 32))


def _vec_ok(x, nbytes: int = 16) -> int:
    """1 when x[i, j : j + n] (n elements of nbytes) may be read with one aligned nbytes-wide access for every j that
    is a multiple of n: contiguous rows whose length in bytes is a multiple of nbytes, nbytes-aligned base.
    The default, 16, is a float4 of a float32 array; fp8_gemm and quantize_fine also ask for 4 bytes of uint8 codes."""
    rows, cols = x.shape
    item = x.dtype.itemsize
    if (cols * item) % nbytes or tuple(x.strides) != (cols * item, item):
        return 0
    if HARDWARE:
        if x.__cuda_array_interface__["data"][0] % nbytes:
            return 0
    return 1


def _grid(version: int, M: int, N: int):
    tm, tn = LAUNCH[version]["tile"]
    if version == 1:
        return (math.ceil(M / tm), math.ceil(N / tn)), (T12, T12)
    if version in (2, 3):
        return (math.ceil(N / tn), math.ceil(M / tm)), (tn, tm)
    return (math.ceil(N / tn), math.ceil(M / tm)), LAUNCH[version]["threads"]


def launch(a, b, out, version: int = BEST) -> None:
    """out (M, N) = a (M, K) @ b (K, N) on float32 device arrays (no checks: `gemm` is the checked entry point)."""
    M, N = out.shape
    grid, block = _grid(version, M, N)
    if version in (6, 7):
        KERNELS[version][grid, block](a, b, out, _vec_ok(a), _vec_ok(b))
    else:
        KERNELS[version][grid, block](a, b, out)


def gemm(a, b, version: int | None = None, out=None):
    """c = a @ b in float32 with the SIMT kernel `version` (None: BEST), FP32 accumulation.

    a: (M, K) and b: (K, N) float32, NumPy or CUDA device arrays. Returns a NumPy array when both inputs are NumPy
    arrays, else a device array; with `out` (a float32 (M, N) NumPy or device array) the result is written there
    and `out` is returned.
    """
    a = V.array("a", a, dtype=np.float32, ndim=2)
    b = V.array("b", b, dtype=np.float32, ndim=2)
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"a and b must have equal inner dimensions (a is (M, K), b is (K, N)): got a {V.describe(a)},"
                         f" b {V.describe(b)}")
    if version is None:
        version = BEST
    elif isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise TypeError(f"version must be None or an int in {tuple(VERSIONS)}, got {V.describe(version)}")
    elif int(version) not in VERSIONS:
        raise ValueError(f"version must be None or an int in {tuple(VERSIONS)}, got {version!r}")
    version = int(version)
    if out is not None:
        out = V.array("out", out, dtype=np.float32, shape=(M, N))
    on_device = V.is_device_array(a) or V.is_device_array(b)
    if out is not None and V.is_device_array(out):
        c = out
    else:
        c = cuda.device_array((M, N), np.float32)
    launch(V.to_device(a), V.to_device(b), c, version)
    if out is not None and not V.is_device_array(out):
        out[...] = c.copy_to_host()
        return out
    if out is not None:
        return out
    return c if on_device else c.copy_to_host()


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
    from .. import bench

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


def plot_ladder(tflops: dict, cublas: float | None = None, path=None, ax=None, title=None):
    """Bar chart of the ladder: TFLOP/s per version (measured) with the cuBLAS and FP32-peak lines; returns the
    figure. When nothing was measured (tflops values all None: the simulator), plots Boehm's A6000 percentages of
    cuBLAS instead, labelled as his numbers."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4))
    else:
        fig = ax.figure
    vs = sorted(VERSIONS)
    labels = [f"v{v}" for v in vs]
    measured = all(tflops.get(v) is not None for v in vs)
    if measured:
        vals = [tflops[v] for v in vs]
        ax.bar(labels, vals, color="tab:blue", label="fp8lab (measured, this run)")
        if cublas is not None:
            ax.axhline(cublas, color="k", ls="--", lw=1, label=f"cuBLAS SGEMM {cublas:.1f} TFLOP/s (this run)")
        ax.axhline(H100_FP32_TFLOPS, color="tab:red", ls=":", lw=1,
                   label=f"H100 FP32 peak ~{H100_FP32_TFLOPS:.0f} TFLOP/s (FACTS.md)")
        ax.set_ylabel("TFLOP/s")
        for x, v in zip(labels, vals):
            ax.annotate(f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=8)
        ax.set_title(title or "SGEMM ladder, measured")
        ax.set_ylim(0, 1.3 * max(vals + [H100_FP32_TFLOPS, cublas or 0]))
    else:
        vs = [v for v in vs if v in BOEHM_A6000]  # the rungs that match his kernels
        labels = [f"v{v}" for v in vs]
        vals = [BOEHM_A6000[v] for v in vs]
        ax.bar(labels, vals, color="tab:gray", label="Boehm's published numbers (RTX A6000, 4092^2), NOT measured here")
        ax.axhline(100, color="k", ls="--", lw=1, label="cuBLAS = 100%")
        ax.set_ylabel("% of cuBLAS SGEMM")
        for x, v in zip(labels, vals):
            ax.annotate(f"{v:g}%", (x, v), ha="center", va="bottom", fontsize=8)
        ax.set_title(title or "SGEMM ladder: Boehm's A6000 percentages (simulator: nothing measured)")
        ax.set_ylim(0, 125)  # room for the legend above the cuBLAS line
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def main(argv=None) -> None:  # python -m fp8lab.kernels.gemm [--plot PATH]
    import argparse
    import time

    from .. import bench

    parser = argparse.ArgumentParser(prog="python -m fp8lab.kernels.gemm", description=__doc__.splitlines()[0])
    parser.add_argument("--plot", metavar="PATH", help="save a bar chart of the ladder there (PNG)")
    args = parser.parse_args(argv)

    rng = np.random.default_rng()
    # 1. check every version against the float64 reference (odd shapes, NaN-poisoned output)
    rows = []
    for v, desc in VERSIONS.items():
        M, N, K = check_shape(v)
        t0 = time.perf_counter()
        worst = check(v, M, N, K, rng)
        rows.append([f"v{v}: {desc}", f"{M}x{N}x{K}", f"ok ({worst:.1e} of bound)", f"{time.perf_counter() - t0:.1f} s"])
    bench.print_table(f"checks ({runtime.backend})", ["version", "M x N x K", "check", "wall"], rows)

    # 2. time every version at 4096^3 against cuBLAS SGEMM measured now (TF32 off: true FP32)
    S = 4096
    if runtime.IS_SIM:
        print("\nsimulator: nothing is timed (CUDA events report -1 and Python threads say nothing about a GPU).")
    flops = 2 * S**3
    base_ms = None
    torch = bench.torch_cuda()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        ta = torch.randn(S, S, device="cuda")
        tb = torch.randn(S, S, device="cuda")
        base_ms = bench.torch_time_ms(torch, lambda: ta @ tb)

    def tf(ms):
        return None if ms is None else flops / (ms * 1e-3) / 1e12

    tflops = {}
    rows = []
    if not runtime.IS_SIM:
        a = cuda.to_device(rng.standard_normal((S, S), dtype=np.float32))
        b = cuda.to_device(rng.standard_normal((S, S), dtype=np.float32))
        out = cuda.device_array((S, S), np.float32)
    for v, desc in VERSIONS.items():
        ms = None if runtime.IS_SIM else runtime.time_ms(lambda: launch(a, b, out, v), warmup=1, repeat=5)
        tflops[v] = tf(ms)
        rows.append([f"v{v}: {desc}", runtime.fmt_ms(ms), "-" if ms is None else f"{tflops[v]:.2f}",
                     "-" if ms is None or base_ms is None else f"{base_ms / ms:.1%}",
                     "-" if ms is None else f"{tflops[v] / H100_FP32_TFLOPS:.1%}"])
    if base_ms is not None:
        rows.append(["torch float32 a @ b (cuBLAS SGEMM, TF32 off)", runtime.fmt_ms(base_ms), f"{tf(base_ms):.2f}",
                     "100%", f"{tf(base_ms) / H100_FP32_TFLOPS:.1%}"])
    bench.print_table(f"SGEMM {S}x{S}x{S} ({runtime.backend}: {runtime.device_info()['name']})",
                      ["version", "time", "TFLOP/s", "of cuBLAS", f"of FP32 peak {H100_FP32_TFLOPS:g}"], rows)
    if args.plot:
        plot_ladder(tflops, tf(base_ms), path=args.plot)
        print(f"\nplot saved to {args.plot}")


if __name__ == "__main__":
    main()
