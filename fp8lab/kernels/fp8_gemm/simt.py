"""fp8_gemm versions 1-3, on the CUDA cores: the scales applied per K-group of 128 inside the K loop.

version 1: one thread per output, looping over K-groups, codes read from global memory and decoded through a
           256-entry table.
version 2: TILE x TILE outputs per block; BLOCK_K = 128 steps: the (TILE, 128) slices of a and b are decoded once
           into shared memory (b padded to 129 columns: no bank conflicts), the scales of the group into shared
           memory, then each thread sums its 128 products and applies its two scales.
version 3: the register-tiled SGEMM core of gemm version 7 (kernels/common.py: 128 x 128 block tile, 8 x 8 outputs
           per thread, ld.shared.v4.f32, double buffering) behind an FP8 front end: per k-step of 8, 4 codes of a
           row of a and of b per thread (one 4-byte load each), decoded by cvt.rn.f16x2.{e4m3,e5m2}x2 (fp8lab.ptx),
           each multiplied by its K-group's scale, stored as float32 in shared memory. The scales are applied per
           K-group inside the kernel, but to the operands as they are staged, not to partial sums: one more float32
           rounding per operand than `reference`, so version 3 is checked against float64 within the FP32 bound
           (`error_bound`), not bit for bit. FP32 accumulation only.

The limited accumulator (versions 1 and 2, accum_bits / promote_every, compiled in): emulate the
limited-precision tensor-core accumulator of fp8lab.numerics.accum instead of FP32: k in groups of 32, each group's
products and the running accumulator aligned to the largest exponent, truncated to accum_bits mantissa bits, added
exactly, the sum truncated to accum_bits; every promote_every elements of K the limited sum is multiplied by the
group's scales and added to the FP32 accumulator (DeepSeek: N_C = 128). Integer and bit manipulation is done with
math.frexp / math.ldexp / math.floor and int64 sums, as in fp8lab/numerics/formats.py (no libdevice bit tricks, so
it runs in the simulator). NaN/Inf codes propagate through the FP32 path; the limited-accumulator emulation does
not model them.

Shapes that are not multiples of 128 (or of TILE): the last K-group covers only the existing k (version 2 pads its
shared tiles with zeros, and zero products change neither an FP32 sum nor the limited accumulator: zeros take no
part in choosing the alignment exponent); rows past M or N are neither read nor written.
"""

from __future__ import annotations

import math

import numpy as np

from ...device import runtime
from ...device.runtime import cuda
from ...numerics import accum, formats
from ...numerics.spec import GROUP_K
from .. import common as C
from ..common import DECODE_X2, sgemm_fma_step, sgemm_store, sgemm_store_add, vec_ok

ALIGN = accum.GROUP  # products per alignment group of the limited accumulator (32)
BLOCK_K = GROUP_K  # K elements per shared tile of version 2: one scale group
BLOCK_K_PAD = BLOCK_K + 1  # shared b tile row length: column reads by TILE threads hit TILE different banks
TILE = runtime.per_backend({"sim": 8, "gpu": 16})  # outputs per block side (64 Python threads a block simulated)
_ZERO_EXP = -(1 << 20)
# Version 3 runs the register-tiled SGEMM core (common.sgemm_fma_step, common.sgemm_store), so it has its
# geometry: 128 x 128 block tiles, k-steps of 8, 8 x 8 outputs per thread, 256 threads, 16 across the columns.
BM3, BN3, BK3, TM3, TN3 = C.TILE_M, C.TILE_N, C.TILE_K, C.THREAD_M, C.THREAD_N
COLS3 = C.TILE_COLS
THREADS3 = C.TILE_THREADS
BUF_ROWS3 = C.TILE_BUF_ROWS  # two k-step buffers stacked in one shared array

_F0 = np.float32(0.0)
# math.ldexp's exponent: numba-cuda types it int32 (__nv_ldexpf); Python's math.ldexp (the simulator) wants an int
_EXP_INT = int if runtime.IS_SIM else np.int32


# ----------------------------------------------------------------------------------------------------------------
# Device functions: the limited accumulator (bit-exact with fp8lab.numerics.accum)
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _exponent(x):
    """frexp exponent of x (x = m * 2^e, 0.5 <= |m| < 1); _ZERO_EXP for 0."""
    if x == 0:
        return _ZERO_EXP
    m, e = math.frexp(x)
    return e


@cuda.jit(device=True)
def _aligned(x, sh):
    """trunc(x * 2^sh) toward zero, as an int64 (|x * 2^sh| < 2^24 here: exact)."""
    v = math.ldexp(x, _EXP_INT(sh))
    f = int(math.floor(abs(v)))
    return -f if x < 0 else f


@cuda.jit(device=True)
def _normalize(t, sh, bits):
    """float32 value of t * 2^-sh (t an int64 sum of aligned terms) truncated toward zero to `bits` bits."""
    if t == 0:
        return _F0
    u = -t if t < 0 else t
    m, length = math.frexp(np.float64(u))  # bit length of u (exact: u < 2^30)
    drop = length - (bits + 1)
    if drop > 0:
        u = u >> drop
    else:
        drop = 0
    v = np.float32(math.ldexp(np.float32(u), _EXP_INT(drop - sh)))  # u < 2^24: exact in float32
    return -v if t < 0 else v


@cuda.jit(device=True)
def _limited_group_global(lim, a, m, b, n, luta, lutb, k0, k1, bits):
    """One alignment group k0..k1-1 of the limited accumulator, operands from global memory."""
    E = _exponent(lim)
    for k in range(k0, k1):
        p = luta[a[m, k]] * lutb[b[n, k]]
        if p != 0:
            E = max(E, _exponent(p))
    if E == _ZERO_EXP:
        return lim
    sh = bits + 1 - E
    t = _aligned(lim, sh)
    for k in range(k0, k1):
        t += _aligned(luta[a[m, k]] * lutb[b[n, k]], sh)
    return _normalize(t, sh, bits)


@cuda.jit(device=True)
def _limited_group_shared(lim, ta, i, tb, j, kk0, bits):
    """One alignment group of ALIGN products from the shared tiles ta[i, kk0:], tb[j, kk0:] (zero padded)."""
    E = _exponent(lim)
    for kk in range(kk0, kk0 + ALIGN):
        p = ta[i, kk] * tb[j, kk]
        if p != 0:
            E = max(E, _exponent(p))
    if E == _ZERO_EXP:
        return lim
    sh = bits + 1 - E
    t = _aligned(lim, sh)
    for kk in range(kk0, kk0 + ALIGN):
        t += _aligned(ta[i, kk] * tb[j, kk], sh)
    return _normalize(t, sh, bits)


# ----------------------------------------------------------------------------------------------------------------
# Kernels, compiled per (operand granularities, accum_bits, promote_every): those are compile-time constants
# ----------------------------------------------------------------------------------------------------------------


def make_kernels(a_kind: int, b_kind: int, bits: int, promote: int, add: bool = False):
    """bits < 0: FP32 accumulation; promote 0: never (only with two per-tensor operands). add: version 2's epilogue
    adds the residual res, c = res + acc (res is not read otherwise: pass c). Version 1 has no residual: it is
    lecture 06's editable kernel, kept as plain as it was."""

    @cuda.jit(device=True)
    def group_scale(sa, sb, m, n, g):
        # row(m): 0 per tensor, m for 1 x 128 tiles, m // 128 for 128 x 128 blocks; column g (0 per tensor)
        ra = 0 if a_kind == 0 else (m if a_kind == 1 else m // GROUP_K)
        ca = 0 if a_kind == 0 else g
        rb = 0 if b_kind == 0 else (n if b_kind == 1 else n // GROUP_K)
        cb = 0 if b_kind == 0 else g
        return sa[ra, ca] * sb[rb, cb]

    @cuda.jit
    def fp8_gemm_kernel1(a, sa, b, sb, luta, lutb, c):
        n, m = cuda.grid(2)
        M, K = a.shape
        N = b.shape[0]
        if m < M and n < N:
            acc = _F0
            if bits < 0:
                for k0 in range(0, K, GROUP_K):
                    partial = _F0
                    for k in range(k0, min(k0 + GROUP_K, K)):
                        partial += luta[a[m, k]] * lutb[b[n, k]]
                    acc += partial * group_scale(sa, sb, m, n, k0 // GROUP_K)
            else:
                lim = _F0
                for k0 in range(0, K, ALIGN):
                    lim = _limited_group_global(lim, a, m, b, n, luta, lutb, k0, min(k0 + ALIGN, K), bits)
                    if promote > 0 and (k0 + ALIGN) % promote == 0:  # DeepSeek's promotion to FP32
                        acc += lim * group_scale(sa, sb, m, n, k0 // GROUP_K)
                        lim = _F0
                acc += lim * group_scale(sa, sb, m, n, (K - 1) // GROUP_K)  # the rest (0 if just promoted)
            c[m, n] = acc

    @cuda.jit
    def fp8_gemm_kernel2(a, sa, b, sb, luta, lutb, c, res):
        ta = cuda.shared.array((TILE, BLOCK_K), np.float32)  # decoded a[m0:m0+TILE, k0:k0+128]
        tb = cuda.shared.array((TILE, BLOCK_K_PAD), np.float32)  # decoded b rows, padded: conflict-free
        tla = cuda.shared.array(256, np.float32)  # decode tables
        tlb = cuda.shared.array(256, np.float32)
        ssa = cuda.shared.array(TILE, np.float32)  # this K-group's scales of the block's a rows
        ssb = cuda.shared.array(TILE, np.float32)  # ... and of its b rows
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * TILE + tx
        m0 = cuda.blockIdx.y * TILE
        n0 = cuda.blockIdx.x * TILE
        m = m0 + ty
        n = n0 + tx
        M, K = a.shape
        N = b.shape[0]
        for i in range(tid, 256, TILE * TILE):
            tla[i] = luta[i]
            tlb[i] = lutb[i]
        cuda.syncthreads()
        acc = _F0
        lim = _F0
        for k0 in range(0, K, BLOCK_K):
            g = k0 // GROUP_K
            for i in range(tid, TILE * BLOCK_K, TILE * TILE):  # consecutive threads, consecutive k: coalesced
                r = i // BLOCK_K
                kk = i - r * BLOCK_K
                k = k0 + kk
                va = _F0
                vb = _F0
                if k < K and m0 + r < M:
                    va = tla[a[m0 + r, k]]
                if k < K and n0 + r < N:
                    vb = tlb[b[n0 + r, k]]
                ta[r, kk] = va
                tb[r, kk] = vb
            if ty == 0:  # scales of the group, one per row of the tile (clamped rows are never used)
                r = min(m0 + tx, M - 1)
                ssa[tx] = sa[0 if a_kind == 0 else (r if a_kind == 1 else r // GROUP_K), 0 if a_kind == 0 else g]
            if ty == 1 or TILE == 1:
                r = min(n0 + tx, N - 1)
                ssb[tx] = sb[0 if b_kind == 0 else (r if b_kind == 1 else r // GROUP_K), 0 if b_kind == 0 else g]
            cuda.syncthreads()
            s = ssa[ty] * ssb[tx]
            if bits < 0:
                partial = _F0
                for kk in range(BLOCK_K):
                    partial += ta[ty, kk] * tb[tx, kk]
                acc += partial * s
            else:
                for kk0 in range(0, BLOCK_K, ALIGN):
                    lim = _limited_group_shared(lim, ta, ty, tb, tx, kk0, bits)
                    if promote > 0 and (k0 + kk0 + ALIGN) % promote == 0:
                        acc += lim * s
                        lim = _F0
                if k0 + BLOCK_K >= K:  # the last tile: promote the rest (0 if just promoted)
                    acc += lim * s
            cuda.syncthreads()
        if m < M and n < N:
            if add:  # after the sum: the bits of a separate add of res and the stored acc
                acc = res[m, n] + acc
            c[m, n] = acc

    return {1: fp8_gemm_kernel1, 2: fp8_gemm_kernel2}


def make_kernel3(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, add: bool = False):
    """Version 3 for one pair of scale kinds and formats (compiled in); add: c = r + acc (sgemm_store_add)."""
    dec_a = DECODE_X2[fmt_a]
    dec_b = DECODE_X2[fmt_b]

    @cuda.jit(device=True)
    def fetch(x, x4, s, kind, r, k, rows, K, vec):
        """(codes x[r, k:k+4] packed in a uint32, low byte first; the scale of their group). Codes outside the
        matrix are 0 (+0.0); their scale is that of the nearest existing group (finite, times 0: nothing)."""
        w = np.uint32(0)
        if r < rows:
            if vec != 0 and k + 3 < K:
                w = x4[r, k // 4]  # one 4-byte load
            else:
                for q in range(4):
                    if k + q < K:
                        w |= np.uint32(x[r, k + q]) << np.uint32(8 * q)
        rr = min(r, rows - 1)
        g = min(k, K - 1) // GROUP_K
        sc = s[0, 0] if kind == 0 else (s[rr, g] if kind == 1 else s[rr // GROUP_K, g])
        return w, sc

    @cuda.jit
    def fp8_gemm_kernel3(a, a4, sa, b, b4, sb, c, r, vec_a, vec_b):
        """The register-tiled SGEMM core (kernels/common.py) behind an FP8 front end. Block 256 threads, grid
        (ceil(N/128), ceil(M/128)); each thread computes 8 x 8 outputs.

        Per k-step of 8, thread t fetches 4 codes of a row of a (a[m0 + t//2, k0 + 4(t%2) : +4]) and 4 of a row
        of b with one 4-byte load each (a4, b4: the codes viewed as uint32, when vec_a / vec_b), decodes them
        with two cvt.rn.f16x2.e4m3x2, multiplies each by its group's scale, and stores the dequantized float32
        values transposed into shared memory (k-major, like version 7's a tile). The scales are applied here, per
        K-group, while a 128 x 8 slice is staged, never to whole matrices in global memory. The next k-step's
        codes and scales are fetched before the 512 FMAs of this one (double buffer, one barrier per step).
        """
        sat = cuda.shared.array((BUF_ROWS3, BM3), np.float32)  # rows buf*BK3 + k: dequantized a, transposed
        sbt = cuda.shared.array((BUF_ROWS3, BN3), np.float32)  # rows buf*BK3 + k: dequantized b, transposed
        acc = cuda.local.array((TM3, TN3), np.float32)
        reg_m = cuda.local.array(TM3, np.float32)
        reg_n = cuda.local.array(TN3, np.float32)
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        m0 = cuda.blockIdx.y * BM3
        n0 = cuda.blockIdx.x * BN3
        row = tid // 2  # stages a[m0 + row, k0 + kq : +4] and b[n0 + row, k0 + kq : +4]
        kq = (tid % 2) * 4
        t_row = tid // COLS3
        t_col = tid % COLS3
        for i in range(TM3):
            for j in range(TN3):
                acc[i, j] = _F0
        wa, s_a = fetch(a, a4, sa, a_kind, m0 + row, kq, M, K, vec_a)
        wb, s_b = fetch(b, b4, sb, b_kind, n0 + row, kq, N, K, vec_b)
        buf = 0
        for k0 in range(0, K, BK3):
            base = buf * BK3
            x0, x1 = dec_a(wa & 0xFFFF)
            x2, x3 = dec_a(wa >> 16)
            y0, y1 = dec_b(wb & 0xFFFF)
            y2, y3 = dec_b(wb >> 16)
            sat[base + kq, row] = x0 * s_a
            sat[base + kq + 1, row] = x1 * s_a
            sat[base + kq + 2, row] = x2 * s_a
            sat[base + kq + 3, row] = x3 * s_a
            sbt[base + kq, row] = y0 * s_b
            sbt[base + kq + 1, row] = y1 * s_b
            sbt[base + kq + 2, row] = y2 * s_b
            sbt[base + kq + 3, row] = y3 * s_b
            cuda.syncthreads()  # this buffer is complete; the other one is free (everyone passed this barrier)
            nxt = k0 + BK3
            if nxt < K:  # the next step's codes and scales: in flight during the FMAs below
                wa, s_a = fetch(a, a4, sa, a_kind, m0 + row, nxt + kq, M, K, vec_a)
                wb, s_b = fetch(b, b4, sb, b_kind, n0 + row, nxt + kq, N, K, vec_b)
            for kk in range(BK3):
                sgemm_fma_step(sat, sbt, base + kk, t_row, t_col, reg_m, reg_n, acc)
            buf = 1 - buf
        if add:
            sgemm_store_add(c, acc, m0, n0, t_row, t_col, M, N, r)
        else:
            sgemm_store(c, acc, m0, n0, t_row, t_col, M, N)

    return fp8_gemm_kernel3


def kernels(a_kind: int, b_kind: int, bits: int, promote: int, add: bool = False) -> dict:
    """Versions 1 and 2 compiled for these scale kinds and accumulator options (add: with a residual)."""
    key = (a_kind, b_kind, bits, promote, add)
    return runtime.cached(("fp8_gemm.v12",) + key, lambda: make_kernels(*key))


def _lut(fmt: str):
    """The 256-entry decode table of fmt on the device, made once."""
    return runtime.cached(("fp8_gemm.lut", fmt), lambda: cuda.to_device(formats.value_table(fmt)))


def launch_v12(version, a, sa, b, sb, out, a_kind, b_kind, fmt_a, fmt_b, bits, promote, residual=None, **_):
    """Versions 1 and 2 on device arrays: TILE x TILE threads a block, one per output; version 2: out = residual +
    A B^T when residual is given."""
    k = kernels(a_kind, b_kind, bits, promote, residual is not None)[version]
    grid = ((out.shape[1] + TILE - 1) // TILE, (out.shape[0] + TILE - 1) // TILE)
    if version == 1:  # no residual (the host refuses one)
        k[grid, (TILE, TILE)](a, sa, b, sb, _lut(fmt_a), _lut(fmt_b), out)
    else:
        k[grid, (TILE, TILE)](a, sa, b, sb, _lut(fmt_a), _lut(fmt_b), out, out if residual is None else residual)


def launch_v3(version, a, sa, b, sb, out, a_kind, b_kind, fmt_a, fmt_b, residual=None, **_):
    """Version 3 on device arrays: 256 threads a 128 x 128 tile; rows of codes read as aligned uint32 where they are.
    out = residual + A B^T when residual is given."""
    add = residual is not None
    kernel = runtime.cached(("fp8_gemm.v3", a_kind, b_kind, fmt_a, fmt_b) + (("add",) if add else ()),
                            lambda: make_kernel3(a_kind, b_kind, fmt_a, fmt_b, add))
    M, N = out.shape
    grid = ((N + BN3 - 1) // BN3, (M + BM3 - 1) // BM3)
    va, vb = vec_ok(a, 4), vec_ok(b, 4)
    a4 = a.view(np.uint32) if va else runtime.unused_array(np.uint32)
    b4 = b.view(np.uint32) if vb else runtime.unused_array(np.uint32)
    kernel[grid, THREADS3](a, a4, sa, b, b4, sb, out, out if residual is None else residual, va, vb)
