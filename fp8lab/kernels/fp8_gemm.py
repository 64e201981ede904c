"""FP8 GEMM with fine-grained scales, NT layout: y[m, n] = sum_k dequant(qa)[m, k] * dequant(qb)[n, k], float32.

qa: (M, K) E4M3/E5M2 codes with 1 x 128 tile scales (M, ceil(K/128)) (DeepSeek-V3's activations) or one
per-tensor scale (1,); qb: (N, K) codes with 128 x 128 block scales (ceil(N/128), ceil(K/128)) (a Linear
weight stored (out, in)) or per-tensor. Either operand may also carry the other fine granularity (tile for
qb, block for qa): the kernel only asks, for a row r and a K-group g, which scale applies. `scale` is the
dequantization factor: x ~= decode(code) * scale. This is DeepGEMM's `gemm_fp8_fp8_bf16_nt` contract with a
float32 output.

The scales are applied inside the K loop, once per K-group of 128, to the FP32 partial sum of that group:

    acc = 0
    for each K-group g of 128:      partial = sum_{k in g} decode(a[m, k]) * decode(b[n, k])   (k order)
                                    acc += partial * (sa[row(m), g] * sb[row(n), g])
    y[m, n] = acc

The scale changes from one group to the next, so it cannot be pulled out of the K sum (as a per-tensor scale
can); dequantizing whole matrices into global memory first would triple the bytes read. This is also where
DeepSeek's promotion happens: the tensor cores produce each group's partial sum, the CUDA cores scale it and
add it in FP32.

version 1: one thread per output, looping over K-groups, codes read from global memory and decoded through
           a 256-entry table.
version 2: TILE x TILE outputs per block; BLOCK_K = 128 steps: the (TILE, 128) slices of a and b are decoded
           once into shared memory (b padded to 129 columns: no bank conflicts), the scales of the group into
           shared memory, then each thread sums its 128 products and applies its two scales.

version 3: the register-tiled SGEMM core of gemm version 7 (kernels/common.py: 128 x 128 block tile, 8 x 8
           outputs per thread, ld.shared.v4.f32, double buffering) behind an FP8 front end: per k-step of 8, 4
           codes of a row of a and of b per thread (one 4-byte load each), decoded by
           cvt.rn.f16x2.{e4m3,e5m2}x2 (fp8lab.device.ptx), each
           multiplied by its K-group's scale, stored as float32 in shared memory. The scales are applied per
           K-group inside the kernel, but to the operands as they are staged, not to partial sums: one more
           float32 rounding per operand than `reference`, so version 3 is checked against float64 within the
           FP32 bound (`error_bound`), not bit for bit. FP32 accumulation only.

version 4: the tensor cores through mma.sync.m16n8k32 (inline PTX, fp8lab.device.ptx): 128 x 128 block tiles, 8 warps of
           64 x 32 outputs; codes copied global -> shared by cp.async, three stages of one K-group in flight, rows
           padded to 144 bytes; fragments loaded by ldmatrix; after each K-group the tensor core's partial sums
           are scaled and added to FP32 registers on the CUDA cores (DeepSeek-V3's promotion). On sm_90 ptxas
           runs FP8 mma.sync as FP16 HMMA, which sums like FP32.
version 5: wgmma.mma_async m64n128k32 for 2 warpgroups (128 x 128 tiles), operands read by the tensor core from
           128-byte-swizzled shared memory through descriptors, four cp.async stages of one K-group each (128 KiB
           of dynamic shared memory), wait and promote after each K-group. The H200's wgmma keeps 13 mantissa
           bits inside a K-group (measured: kernels/tc_accum.py).
version 6: version 5 overlapped: two sets of partial sums alternate, K-group k + 1 is issued before K-group k is
           promoted (wgmma.wait_group 1), one barrier per K-group. Same arithmetic as version 5.
version 7: version 6 persistent: a grid of `sms` blocks, one per SM, each looping over output tiles (block i takes
           tiles i, i + sms, ...: DeepGEMM's num_sms), the same tile code (one device function for both), so the
           GEMM can leave SMs to other work, as DeepSeek-V3 gives 20 of 132 SMs to communication (section 3.2.2).
           Same arithmetic as version 6.

Under the simulator versions 4-7 run their twins (fp8lab.device.ptx), which sum each K-group in FP32 in k order: they
are then bit-exact with `reference`. On a GPU they are checked against float64 within `tensor_core_bound`.

accum_bits / promote_every (kernel options, compiled in, versions 1 and 2): emulate the limited-precision tensor-core
accumulator of fp8lab/numerics/accum.py instead of FP32: k in groups of 32, each group's products and the running
accumulator aligned to the largest exponent, truncated to accum_bits mantissa bits, added exactly, the sum
truncated to accum_bits; every promote_every elements of K the limited sum is multiplied by the group's scales
and added to the FP32 accumulator (DeepSeek: N_C = 128). Integer and bit manipulation is done with
math.frexp / math.ldexp / math.floor and int64 sums, as in fp8lab/numerics/formats.py (no libdevice bit tricks, so it
runs in the simulator). With tile/block scales the partial sum has to be promoted at least at every 128-group
boundary (that is where its scale is applied), so promote_every must divide 128 and None means 128; with two
per-tensor operands promote_every may be None (no promotion: one limited sum over all of K) or any multiple
of 32.

Shapes that are not multiples of 128 (or of TILE): the last K-group covers only the existing k (version 2
pads its shared tiles with zeros, and zero products change neither an FP32 sum nor the limited accumulator:
zeros take no part in choosing the alignment exponent); rows past M or N are neither read nor written.

Exactness. Products of two FP8 values are exact in float32, so a fused multiply-add gives the same bits as a
multiply then an add inside each group, and both versions sum in the same k order: under the simulator both
are bit-exact with `reference`. On a GPU the compiler may contract `acc + partial * s` into one FMA (one
rounding instead of two), so GPU results differ from `reference` by at most about one float32 rounding per
K-group; `reference64` is the float64 value the tests bound the error against.

NaN/Inf codes propagate through the FP32 path; the limited-accumulator emulation does not model them.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from ..numerics import accum, formats, spec
from .. import bench
from ..device import ptx, runtime
from ..bench import timing
from ..device.runtime import cuda
from ..numerics.spec import GROUP_K, QuantizedTensor
from . import common as C
from .common import DECODE_X2, sgemm_fma_step, sgemm_store, vec_ok

ALIGN = accum.GROUP  # products per alignment group of the limited accumulator (32)
BLOCK_K = GROUP_K  # K elements per shared tile of version 2: one scale group
BLOCK_K_PAD = BLOCK_K + 1  # shared b tile row length: column reads by TILE threads hit TILE different banks
TILE = runtime.per_backend({"sim": 8, "gpu": 16})  # outputs per block side (64 Python threads a block simulated)
OPERAND_GRANULARITIES = ("tensor", "tile", "block")  # of spec.GRANULARITIES, the ones fp8_gemm takes
_KIND = {"tensor": 0, "tile": 1, "block": 2}
_ZERO_EXP = -(1 << 20)

VERSIONS = {
    1: "one thread per output, K-groups of 128 from global memory",
    2: "TILE x TILE shared-memory tiles, BLOCK_K = 128 steps, scales per tile in shared memory",
    3: "SGEMM v7's 128 x 128 register-blocked core; codes dequantized per K-group while staged in shared memory",
    4: "tensor cores, mma.sync m16n8k32: 3-buffer cp.async ring, ldmatrix fragments, promotion every 128",
    5: "tensor cores, wgmma m64n128k32: 4-stage cp.async pipeline, swizzled tiles, descriptors, promotion every 128",
    6: "version 5 overlapped: group k+1's wgmma issued before group k is promoted, one barrier per K-group",
    7: "version 6 persistent: `sms` blocks (one per SM) loop over the output tiles, the other SMs left free",
}
BEST = 6
"""The default without accum_bits: wgmma overlapped, the fastest (measured on the H200: BENCHMARKS.md). Inside each
K-group of 128 its sums are the tensor core's (13 mantissa bits, truncated), across groups FP32: DeepSeek-V3's
promotion.
The limited-accumulator emulation (accum_bits) exists in versions 1 and 2; there the default is 2."""
LIMITED_VERSIONS = (1, 2)
TENSOR_CORE_VERSIONS = (4, 5, 6, 7)
"""Versions whose K-group partial sums come from the tensor cores: FP32 sums in k order under the simulator (the
twins), the hardware's own accumulator on a GPU (see `tensor_core_bound`)."""
# Version 3 runs the register-tiled SGEMM core (common.sgemm_fma_step, common.sgemm_store), so it has its
# geometry: 128 x 128 block tiles, k-steps of 8, 8 x 8 outputs per thread, 256 threads, 16 across the columns.
BM3, BN3, BK3, TM3, TN3 = C.TILE_M, C.TILE_N, C.TILE_K, C.THREAD_M, C.THREAD_N
COLS3 = C.TILE_COLS
THREADS3 = C.TILE_THREADS
BUF_ROWS3 = C.TILE_BUF_ROWS  # two k-step buffers stacked in one shared array
# Version 4 (mma.sync): 128 x 128 block tiles, 8 warps of 64 x 32, stages of one K-group (128 bytes of K),
# STAGES4 in flight; each shared row padded to 144 bytes so that the 8 rows an ldmatrix reads fall in 8
# different groups of 4 banks (144 bytes = 36 banks: row r starts at bank 4r mod 32).
BM4, BN4, BK4, THREADS4, STAGES4 = 128, 128, GROUP_K, 256, 3
ROW4 = BK4 + 16
STAGE4 = (BM4 + BN4) * ROW4
COPIES4 = BM4 * BK4 // 16 // THREADS4  # 16-byte copies per thread per operand and stage
SMEM4 = STAGES4 * STAGE4 + 128  # + alignment slack
# Version 5 (wgmma): 128 x 128 block tiles, 2 warpgroups of 64 x 128, stages of one K-group (128 bytes of K),
# STAGES5 in flight, 128-byte-swizzled tiles aligned to 1024 bytes.
BM5, BN5, BK5, THREADS5, STAGES5 = 128, 128, GROUP_K, 256, 4
TILE5 = 128 * BK5
STAGE5 = 2 * TILE5
SMEM5 = STAGES5 * STAGE5 + 1024
REGS5 = BN5 // 2  # float32 accumulators per thread of an m64n128 wgmma
PERSISTENT_VERSIONS = (7,)  # versions that take `sms`
SIM_SMS = 132
"""The SMs the simulator pretends to have (an H100/H200/H800's 132, NVIDIA H100 datasheet), so that `sms` values
written for those GPUs are accepted under the simulator too."""

_F0 = np.float32(0.0)
_U8 = runtime.numba_type("uint8")  # dynamic shared arrays take a numba type (the simulator reads its itemsize)
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


def make_kernels(a_kind: int, b_kind: int, bits: int, promote: int):
    """bits < 0: FP32 accumulation; promote 0: never (only with two per-tensor operands)."""

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
    def fp8_gemm_kernel2(a, sa, b, sb, luta, lutb, c):
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
            c[m, n] = acc

    return {1: fp8_gemm_kernel1, 2: fp8_gemm_kernel2}


def make_kernel3(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str):
    """Version 3 for one pair of scale kinds and formats (compiled in)."""
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
    def fp8_gemm_kernel3(a, a4, sa, b, b4, sb, c, vec_a, vec_b):
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
        sgemm_store(c, acc, m0, n0, t_row, t_col, M, N)

    return fp8_gemm_kernel3


# ----------------------------------------------------------------------------------------------------------------
# Versions 4 and 5: the tensor cores (mma.sync, wgmma), codes staged in shared memory by cp.async
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _scale_at(s, kind, r, g):
    """The scale of row r (clamped by the caller) in K-group g: per tensor, per 1 x 128 tile, per 128 x 128 block."""
    if kind == 0:
        return s[0, 0]
    if kind == 1:
        return s[r, g]
    return s[r // GROUP_K, g]


@cuda.jit(device=True)
def _copy16(s, dst, x, r, k, rows, K, vec):
    """Stage the 16 codes x[r, k:k+16] at s[dst:dst+16], zeros past the matrix: one cp.async when the rows are
    16-byte aligned (vec), else byte loads and stores (then completed at once)."""
    if vec != 0:
        n = 0
        if r < rows and k < K:
            n = min(16, K - k)
        ptx.cp_async_16(s, dst, x, min(r, rows - 1), k if n > 0 else 0, n)
    else:
        for q in range(16):
            v = np.uint8(0)
            if r < rows and k + q < K:
                v = x[r, k + q]
            s[dst + q] = v


@cuda.jit(device=True)
def _ldmatrix_into(frag, at, s, off):
    """frag[at : at + 4] = the four registers ldmatrix.x4 gives this lane for the rows at s[off:] (see version 4)."""
    x0, x1, x2, x3 = ptx.ldmatrix_x4(s, off)
    frag[at] = x0
    frag[at + 1] = x1
    frag[at + 2] = x2
    frag[at + 3] = x3


@cuda.jit(device=True)
def _load_swizzled_tile(s, off, x, r0, k0, rows, K, vec, tid):
    """x[r0 : r0 + 128, k0 : k0 + 128] -> a 128-byte-swizzled tile at s[off:] (rows of 128 bytes, the 16-byte chunk
    ch of row r stored at chunk ch ^ (r % 8)): 1024 copies of 16 bytes, 4 per thread. Thread tid always copies chunk
    tid % 8 of rows tid // 8 + 32 h (h = 0..3): its shared offsets are the same in every stage."""
    r = tid // 8
    ch = tid % 8
    dst = off + r * 128 + (ch ^ (r % 8)) * 16
    for h in range(4):
        _copy16(s, dst + h * 32 * 128, x, r0 + r + 32 * h, k0 + ch * 16, rows, K, vec)


def make_wgmma_issue(fmt_a: str, fmt_b: str):
    """A device function issue(part, s, base, so, wg, scale0): the four wgmma m64n128k32 of one K-group whose a and
    b tiles sit at s[so:] and s[so + TILE5:] (warpgroup wg reads a's rows 64 wg..), committed as one group;
    scale-d = scale0 + kk, so scale0 = 0 starts `part` afresh (part = A B) and scale0 > 0 adds to it."""
    wgmma = ptx.wgmma_m64k32(BN5, fmt_a, fmt_b)
    fence = ptx.wgmma_fence(REGS5)

    @cuda.jit(device=True)
    def issue(part, s, base, so, wg, scale0):
        # K-major 128-byte-swizzled tiles: 8-row atoms of 128-byte rows, 1024 bytes apart (stride offset); the
        # leading offset is unused in this mode. A k-slice of 32 starts 32 bytes further (2 = 32 >> 4).
        desc_a = ptx.smem_descriptor(base + so + wg * 64 * 128, 16, 1024, 1)
        desc_b = ptx.smem_descriptor(base + so + TILE5, 16, 1024, 1)
        fence(part)
        for kk in range(BK5 // 32):
            wgmma(part, s, desc_a + 2 * kk, desc_b + 2 * kk, scale0 + kk)
        ptx.wgmma_commit_group()

    return issue


@cuda.jit(device=True)
def _promote_wgmma(part, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, g):
    """total += part * (sa * sb) for K-group g, in the wgmma m64n128 accumulator layout: this thread's rows row0 and
    row0 + 8 (registers 4j + 0, 1 and 4j + 2, 3), columns n0 + 8j + 2 t4 + (0, 1). With B per tensor or per
    128 x 128 block one scale serves the whole 128-column tile."""
    sr0 = _scale_at(sa, a_kind, min(row0, M - 1), g)
    sr1 = _scale_at(sa, a_kind, min(row0 + 8, M - 1), g)
    sbk = _scale_at(sb, b_kind, min(n0, N - 1), g)
    for j in range(BN5 // 8):
        for i in range(4):
            o = 4 * j + i
            sc = sbk
            if b_kind == 1:
                sc = _scale_at(sb, b_kind, min(n0 + 8 * j + 2 * t4 + i % 2, N - 1), g)
            total[o] += part[o] * ((sr0 if i < 2 else sr1) * sc)


@cuda.jit(device=True)
def _store_wgmma(c, total, row0, n0, t4, M, N):
    """This thread's 64 outputs of an m64n128 tile (the layout of _promote_wgmma), edges masked."""
    for j in range(BN5 // 8):
        for i in range(4):
            row = row0 + 8 * (i // 2)
            col = n0 + 8 * j + 2 * t4 + i % 2
            if row < M and col < N:
                c[row, col] = total[4 * j + i]


def make_kernel4(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, promote: bool = True):
    """Version 4 (mma.sync) for one pair of scale kinds and formats (compiled in). promote=False (per-tensor scales
    only, for the accumulator experiment): the partial sums stay in the tensor core's accumulator for all of K."""
    mma = ptx.mma_m16n8k32(fmt_a, fmt_b)
    wait_copies = ptx.cp_async_wait_group(STAGES4 - 1)

    @cuda.jit(device=True)
    def load_stage(s, off, x, r0, k0, rows, K, vec, tid):
        """x[r0 : r0 + 128, k0 : k0 + BK4] -> rows of ROW4 bytes at s[off:]: copies of 16 bytes, COPIES4 per thread."""
        for h in range(COPIES4):
            c = tid + THREADS4 * h
            r = c // (BK4 // 16)
            col = (c % (BK4 // 16)) * 16
            _copy16(s, off + r * ROW4 + col, x, r0 + r, k0 + col, rows, K, vec)

    @cuda.jit
    def fp8_gemm_kernel4(a, sa, b, sb, c, vec):
        """Block 256 threads = 8 warps, grid (ceil(N/128), ceil(M/128)); warp w computes the 64 x 32 outputs at
        rows 64 (w % 2), columns 32 (w // 2) of the block's 128 x 128 tile as 4 x 4 mma.m16n8k32 tiles.

        Per stage of BK4 = 128 bytes of K (one K-group): every thread issues cp.async copies of 16 bytes (a and b
        slices), STAGES4 - 1 stages ahead; the warp loads its fragments with ldmatrix (4 for a, 2 for b per 32 of
        K) and issues 16 mma.sync. After each stage the partial sums leave the tensor core's accumulator:
        total += part * (sa * sb) on the CUDA cores, part = 0 (DeepSeek's promotion).
        """
        smem = cuda.shared.array(0, _U8)
        part = cuda.local.array(64, np.float32)   # (i * 4 + j) * 4 + r: tile (i, j) of the warp, register r
        total = cuda.local.array(64, np.float32)
        afr = cuda.local.array(16, np.uint32)
        bfr = cuda.local.array(8, np.uint32)
        srow = cuda.local.array(8, np.float32)
        scol = cuda.local.array(8, np.float32)
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t4 = lane // 4, lane % 4
        wm, wn = (warp % 2) * 64, (warp // 2) * 32
        m0, n0 = cuda.blockIdx.y * BM4, cuda.blockIdx.x * BN4
        base = ptx.shared_address(smem)
        pad = (128 - base % 128) % 128
        for o in range(64):
            part[o] = _F0
            total[o] = _F0
        # ldmatrix: lane l gives row l % 8 of matrix l // 8. a: matrices (rows 0-7 | 8-15) x (bytes 0-15 | 16-31)
        # are registers a0..a3 of an m16 x k32 fragment; b: two n8 tiles x (bytes 0-15 | 16-31).
        q, r8 = lane // 8, lane % 8
        a_lane = (wm + r8 + 8 * (q % 2)) * ROW4 + 16 * (q // 2)
        b_lane = (BM4 + wn + r8 + 8 * (q // 2)) * ROW4 + 16 * (q % 2)
        nk = (K + BK4 - 1) // BK4
        for s0 in range(STAGES4 - 1):
            if s0 < nk:
                load_stage(smem, pad + s0 * STAGE4, a, m0, s0 * BK4, M, K, vec, tid)
                load_stage(smem, pad + s0 * STAGE4 + BM4 * ROW4, b, n0, s0 * BK4, N, K, vec, tid)
            ptx.cp_async_commit()  # one group per stage, empty or not: wait_group counts groups
        for kt in range(nk):
            nxt = kt + STAGES4 - 1
            if nxt < nk:  # a later stage's copies, in flight during this stage's mma
                so = pad + (nxt % STAGES4) * STAGE4
                load_stage(smem, so, a, m0, nxt * BK4, M, K, vec, tid)
                load_stage(smem, so + BM4 * ROW4, b, n0, nxt * BK4, N, K, vec, tid)
            ptx.cp_async_commit()
            wait_copies()  # this stage's group is complete; the later ones may still be in flight
            cuda.syncthreads()  # every thread's copies of this stage are visible
            st = pad + (kt % STAGES4) * STAGE4
            for kk in range(BK4 // 32):
                for i in range(4):
                    _ldmatrix_into(afr, 4 * i, smem, st + a_lane + i * 16 * ROW4 + kk * 32)
                for jj in range(2):
                    _ldmatrix_into(bfr, 4 * jj, smem, st + b_lane + jj * 16 * ROW4 + kk * 32)
                for i in range(4):
                    for j in range(4):
                        o = (i * 4 + j) * 4
                        d0, d1, d2, d3 = mma(afr[4 * i], afr[4 * i + 1], afr[4 * i + 2], afr[4 * i + 3], bfr[2 * j],
                                             bfr[2 * j + 1], part[o], part[o + 1], part[o + 2], part[o + 3])
                        part[o] = d0
                        part[o + 1] = d1
                        part[o + 2] = d2
                        part[o + 3] = d3
            if promote and ((kt + 1) * BK4 % GROUP_K == 0 or kt == nk - 1):  # the end of a K-group: promote
                grp = (kt * BK4) // GROUP_K
                for i in range(4):
                    for h in range(2):
                        srow[2 * i + h] = _scale_at(sa, a_kind, min(m0 + wm + 16 * i + g + 8 * h, M - 1), grp)
                for j in range(4):
                    for e in range(2):
                        scol[2 * j + e] = _scale_at(sb, b_kind, min(n0 + wn + 8 * j + 2 * t4 + e, N - 1), grp)
                for i in range(4):
                    for j in range(4):
                        for r in range(4):
                            o = (i * 4 + j) * 4 + r
                            total[o] += part[o] * (srow[2 * i + r // 2] * scol[2 * j + r % 2])
                            part[o] = _F0
            cuda.syncthreads()  # everyone is done with this stage before it is refilled
        if not promote:
            s_all = sa[0, 0] * sb[0, 0]
            for o in range(64):
                total[o] = part[o] * s_all
        for i in range(4):
            for j in range(4):
                for r in range(4):
                    row = m0 + wm + 16 * i + g + 8 * (r // 2)
                    col = n0 + wn + 8 * j + 2 * t4 + r % 2
                    if row < M and col < N:
                        c[row, col] = total[(i * 4 + j) * 4 + r]

    return fp8_gemm_kernel4


def make_kernel5(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, promote: bool = True):
    """Version 5 (wgmma) for one pair of scale kinds and formats (compiled in); promote as in make_kernel4."""
    issue = make_wgmma_issue(fmt_a, fmt_b)
    wait_mma = ptx.wgmma_wait_group(0, REGS5)
    wait_copies = ptx.cp_async_wait_group(STAGES5 - 1)

    @cuda.jit
    def fp8_gemm_kernel5(a, sa, b, sb, c, vec):
        """Block 256 threads = 2 warpgroups, grid (ceil(N/128), ceil(M/128)); warpgroup w computes rows 64w..64w+63
        of the block's 128 x 128 tile with wgmma m64n128k32 (64 float32 accumulators per thread).

        STAGES5 stages of 128 x 128 codes of a and of b (one K-group) in dynamic shared memory, filled by cp.async
        STAGES5 - 1 groups ahead. Per K-group: 4 asynchronous wgmma (k = 32 each) read a and b from shared memory
        through descriptors, the first with scale-d = 0 (D = A B: no zeroing); commit, wait; then the CUDA cores
        promote: total += part * (sa * sb)."""
        smem = cuda.shared.array(0, _U8)
        part = cuda.local.array(REGS5, np.float32)
        total = cuda.local.array(REGS5, np.float32)
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        wg, t = tid // 128, tid % 128
        g, t4 = (t % 32) // 4, t % 4
        row0 = cuda.blockIdx.y * BM5 + 64 * wg + 16 * (t // 32) + g  # this thread's rows: row0, row0 + 8
        m0, n0 = cuda.blockIdx.y * BM5, cuda.blockIdx.x * BN5
        base = ptx.shared_address(smem)
        pad = (1024 - base % 1024) % 1024  # the 128-byte swizzle repeats every 1024 bytes: align the tiles to it
        for o in range(REGS5):
            part[o] = _F0
            total[o] = _F0
        nk = (K + BK5 - 1) // BK5
        for st in range(STAGES5 - 1):
            if st < nk:
                _load_swizzled_tile(smem, pad + st * STAGE5, a, m0, st * BK5, M, K, vec, tid)
                _load_swizzled_tile(smem, pad + st * STAGE5 + TILE5, b, n0, st * BK5, N, K, vec, tid)
            ptx.cp_async_commit()  # one group per stage, empty or not: wait_group counts groups
        for kt in range(nk):
            nxt = kt + STAGES5 - 1
            if nxt < nk:
                so = pad + (nxt % STAGES5) * STAGE5
                _load_swizzled_tile(smem, so, a, m0, nxt * BK5, M, K, vec, tid)
                _load_swizzled_tile(smem, so + TILE5, b, n0, nxt * BK5, N, K, vec, tid)
            ptx.cp_async_commit()
            wait_copies()             # this thread's copies of stage kt have landed
            ptx.fence_proxy_async()   # ... and are visible to wgmma (which reads through the async proxy)
            cuda.syncthreads()        # ... and so are every other thread's
            so = pad + (kt % STAGES5) * STAGE5
            # scale-d 0 (D = A B) at the first k-slice of each K-group, or only of K when not promoting
            issue(part, smem, base, so, wg, 0 if promote else kt * (BK5 // 32))
            wait_mma(part)
            if not promote:
                cuda.syncthreads()
                continue
            _promote_wgmma(part, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt)
            cuda.syncthreads()  # the stage is free for the copies of iteration kt + 1
        if not promote:
            s_all = sa[0, 0] * sb[0, 0]
            for o in range(REGS5):
                total[o] = part[o] * s_all
        _store_wgmma(c, total, row0, n0, t4, M, N)

    return fp8_gemm_kernel5



def make_kernel6(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, vec: int, persistent: bool = False):
    """Version 6 (wgmma, overlapped) for one pair of scale kinds and formats and one load path (compiled in);
    persistent=True gives version 7, the same tile code in a loop over tiles (`make_kernel7`)."""
    issue = make_wgmma_issue(fmt_a, fmt_b)
    wait_one, wait_all = ptx.wgmma_wait_group(1, REGS5), ptx.wgmma_wait_group(0, REGS5)
    first_copies = ptx.cp_async_wait_group(STAGES5 - 2)  # stage 0 of the S - 1 committed in the prologue
    next_copies = ptx.cp_async_wait_group(STAGES5 - 3)   # stage kt + 1, with kt + S - 2 groups committed

    @cuda.jit(device=True)
    def load_stage(s, so, a, b, m0, n0, k0, M, N, K, tid):
        """Both 128 x 128 tiles of a K-group, swizzled (the load path `vec` compiled in)."""
        _load_swizzled_tile(s, so, a, m0, k0, M, K, vec, tid)
        _load_swizzled_tile(s, so + TILE5, b, n0, k0, N, K, vec, tid)

    @cuda.jit(device=True)
    def step(kt, nk, cur, nxt, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4):
        """K-group kt is in flight into `cur` and group kt + 1 exists. Issue kt + 1 into `nxt` (and the copies of
        group kt + S - 1), then wait for kt only and promote it while kt + 1 runs on the tensor cores."""
        next_copies()
        ptx.fence_proxy_async()
        cuda.syncthreads()  # stage kt + 1 landed for all; every thread is done with group kt - 1's stage
        ld = kt + STAGES5 - 1
        if ld < nk:
            load_stage(smem, pad + (ld % STAGES5) * STAGE5, a, b, m0, n0, ld * BK5, M, N, K, tid)
        ptx.cp_async_commit()
        issue(nxt, smem, base, pad + ((kt + 1) % STAGES5) * STAGE5, wg, 0)
        wait_one(cur)  # at most one group pending: group kt is complete
        _promote_wgmma(cur, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt)

    @cuda.jit(device=True)
    def gemm_tile(a, sa, b, sb, c, smem, base, pad, p0, p1, total, m0, n0):
        """The 128 x 128 output tile at rows m0, columns n0: version 5's tiles and pipeline, rearranged so that the
        tensor cores never wait for the CUDA cores: two sets of partial sums alternate (p0, p1), group kt + 1 is
        issued before group kt is promoted, and one barrier per K-group does both jobs (copies visible, previous
        stage free). On return this thread's wgmma are complete; the other warpgroup's may still read the last
        stage."""
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        wg, t = tid // 128, tid % 128
        g, t4 = (t % 32) // 4, t % 4
        row0 = m0 + 64 * wg + 16 * (t // 32) + g  # this thread's rows: row0, row0 + 8
        for o in range(REGS5):
            p0[o] = _F0
            p1[o] = _F0
            total[o] = _F0
        nk = (K + BK5 - 1) // BK5
        for s0 in range(STAGES5 - 1):
            if s0 < nk:
                load_stage(smem, pad + s0 * STAGE5, a, b, m0, n0, s0 * BK5, M, N, K, tid)
            ptx.cp_async_commit()
        first_copies()
        ptx.fence_proxy_async()
        cuda.syncthreads()
        issue(p0, smem, base, pad, wg, 0)
        kt = 0
        # two groups per trip, so that p0 and p1 are fixed registers, never indexed at run time; no branch
        # touches them inside the loop (a merge would copy accumulators while a wgmma writes them)
        while kt + 2 < nk:
            step(kt, nk, p0, p1, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4)
            step(kt + 1, nk, p1, p0, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4)
            kt += 2
        if kt + 1 < nk:  # the last two groups (kt in p0 is in flight)
            step(kt, nk, p0, p1, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4)
            wait_all(p1)
            _promote_wgmma(p1, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt + 1)
        else:  # the last group
            wait_all(p0)
            _promote_wgmma(p0, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt)
        _store_wgmma(c, total, row0, n0, t4, M, N)

    if not persistent:
        @cuda.jit
        def fp8_gemm_kernel6(a, sa, b, sb, c):
            """Block 256 threads = 2 warpgroups, grid (ceil(N/128), ceil(M/128)): one output tile per block."""
            smem = cuda.shared.array(0, _U8)
            p0 = cuda.local.array(REGS5, np.float32)
            p1 = cuda.local.array(REGS5, np.float32)
            total = cuda.local.array(REGS5, np.float32)
            base = ptx.shared_address(smem)
            pad = (1024 - base % 1024) % 1024  # the 128-byte swizzle repeats every 1024 bytes: align the tiles to it
            gemm_tile(a, sa, b, sb, c, smem, base, pad, p0, p1, total, cuda.blockIdx.y * BM5, cuda.blockIdx.x * BN5)

        return fp8_gemm_kernel6

    @cuda.jit
    def fp8_gemm_kernel7(a, sa, b, sb, c):
        """Persistent: a 1-D grid of `sms` blocks (one per SM: a block's registers and shared memory fill an SM),
        block i computing output tiles i, i + gridDim.x, ... in row-major tile order (version 6's block order),
        as DeepGEMM's num_sms does. The SMs left out are free for other work (communication kernels)."""
        smem = cuda.shared.array(0, _U8)
        p0 = cuda.local.array(REGS5, np.float32)
        p1 = cuda.local.array(REGS5, np.float32)
        total = cuda.local.array(REGS5, np.float32)
        base = ptx.shared_address(smem)
        pad = (1024 - base % 1024) % 1024
        tiles_m = (a.shape[0] + BM5 - 1) // BM5
        tiles_n = (b.shape[0] + BN5 - 1) // BN5
        # tile i = tm * tiles_n + tn for i = blockIdx.x, + gridDim.x, ...: (tm, tn) carried forward, not divided
        # (a 64-bit division is a subroutine call in SASS, and any call makes ptxas serialize every wgmma, C7509)
        tm = 0
        tn = cuda.blockIdx.x
        while tn >= tiles_n:
            tn -= tiles_n
            tm += 1
        while tm < tiles_m:
            gemm_tile(a, sa, b, sb, c, smem, base, pad, p0, p1, total, tm * BM5, tn * BN5)
            cuda.syncthreads()  # both warpgroups' wgmma are done with the stages before the next tile refills them
            tn += cuda.gridDim.x
            while tn >= tiles_n:
                tn -= tiles_n
                tm += 1

    return fp8_gemm_kernel7


def make_kernel7(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, vec: int):
    """Version 7 (version 6 persistent) for one pair of scale kinds and formats and one load path (compiled in)."""
    return make_kernel6(a_kind, b_kind, fmt_a, fmt_b, vec, persistent=True)


def kernels(a_kind: int, b_kind: int, bits: int, promote: int) -> dict:
    """Versions 1 and 2 compiled for these scale kinds and accumulator options."""
    key = (a_kind, b_kind, bits, promote)
    return runtime.cached(("fp8_gemm.v12",) + key, lambda: make_kernels(*key))


def _lut(fmt: str):
    """The 256-entry decode table of fmt on the device, made once."""
    return runtime.cached(("fp8_gemm.lut", fmt), lambda: cuda.to_device(formats.value_table(fmt)))


# ----------------------------------------------------------------------------------------------------------------
# Host side: validation, launch, NumPy reference
# ----------------------------------------------------------------------------------------------------------------


def _check_operand(name: str, q):
    for attr in ("data", "scale", "granularity", "fmt"):
        if not hasattr(q, attr):
            raise TypeError(f"{name} must be a QuantizedTensor (attributes data, scale, granularity, fmt), "
                            f"got {V.describe(q)} without .{attr}")
    V.choice(f"{name}.granularity", q.granularity, OPERAND_GRANULARITIES)
    fmt = spec.fmt_name(q.fmt, f"{name}.fmt")
    block = getattr(q, "block", None)
    if q.granularity != "tensor" and block not in (None, GROUP_K):
        raise ValueError(f"{name}.block must be {GROUP_K} for granularity {q.granularity!r} (the kernel's K-group), "
                         f"got {block!r}")
    data = V.array(f"{name}.data", q.data, dtype=np.uint8, ndim=2)
    rows, K = data.shape
    scale = V.array(f"{name}.scale", q.scale, dtype=np.float32, shape=spec.scale_shape(q.granularity, (rows, K)))
    return data, scale, fmt


def _check_options(accum_bits, promote_every, fine: bool):
    bits = accum.check_bits(accum_bits)
    _, promote = accum.check_group_promote(ALIGN, promote_every)
    if bits is None:
        if promote is not None:
            raise ValueError(f"promote_every needs accum_bits (the limited accumulator it promotes), got "
                             f"promote_every={promote} with accum_bits=None")
        return -1, 0
    if fine:
        if promote is None:
            promote = GROUP_K
        if GROUP_K % promote:
            raise ValueError(f"promote_every must divide {GROUP_K} with tile/block scales (each partial sum is "
                             f"scaled per {GROUP_K}-group), got {promote}")
    return bits, 0 if promote is None else promote


def best_version() -> int:
    """BEST where the device can run it: 6 on sm_90 (wgmma), 4 on other GPUs from sm_89 (FP8 mma.sync), else 3;
    BEST under the simulator."""
    cc = runtime.compute_capability()
    if cc is None or cc == ptx.WGMMA_CC:
        return BEST
    return 4 if cc >= ptx.MMA_FP8_CC else 3


def check_device(version: int) -> None:
    """ValueError naming the version when this GPU cannot run it (wgmma: sm_90 only; FP8 mma.sync: sm_89+)."""
    if version in (5, 6, 7):
        ptx.require_wgmma(version)
    elif version == 4:
        ptx.require_mma_fp8(version)


def device_sms() -> int:
    """The SMs of the current GPU (its MULTIPROCESSOR_COUNT; 132 on an H100/H200/H800); SIM_SMS under the
    simulator."""
    if runtime.IS_SIM:
        return SIM_SMS
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def tiles(M: int, N: int) -> int:
    """Output tiles of a persistent version's (M, N) output: ceil(M/128) * ceil(N/128)."""
    return -(-M // BM5) * -(-N // BN5)


def check_sms(sms, version: int) -> int | None:
    """`sms` validated for `version`: an int in 1..device_sms() for a persistent version (None: all SMs); None
    for the others, which take none."""
    if version not in PERSISTENT_VERSIONS:
        if sms is not None:
            raise ValueError(f"sms (a persistent grid of that many blocks) needs version in {PERSISTENT_VERSIONS}, "
                             f"got sms={sms!r} with version {version}")
        return None
    limit = device_sms()
    if sms is None:
        return limit
    if isinstance(sms, (bool, np.bool_)) or not isinstance(sms, (int, np.integer)):
        raise TypeError(f"sms must be None or an int in 1..{limit} (this device's SMs), got {V.describe(sms)}")
    if not 1 <= sms <= limit:
        raise ValueError(f"sms must be None or an int in 1..{limit} (this device's SMs), got {sms}")
    return int(sms)


def fp8_gemm(qa, qb, accum_bits=None, promote_every=None, out=None, version=None, sms=None):
    """y = dequant(qa) @ dequant(qb).T, float32 (M, N), scales applied per K-group of 128 inside the kernel.

    qa: (M, K) codes, granularity "tile" (scale (M, ceil(K/128))) or "tensor" (scale (1,)); qb: (N, K) codes,
    "block" (scale (ceil(N/128), ceil(K/128))) or "tensor" ("block" for qa and "tile" for qb work too). Any
    object with .data (uint8), .scale (float32), .granularity and .fmt ('e4m3' or 'e5m2') will do, e.g.
    fp8lab.QuantizedTensor; NumPy or device arrays.
    accum_bits: None = FP32 accumulation; 1..23 = emulate a tensor-core accumulator with that many mantissa
    bits (13 = Hopper's FP22, see fp8lab.numerics.accum). promote_every: multiple of 32; None = 128 with tile/block
    scales, no promotion with per-tensor scales. out: optional float32 (M, N) device array.
    version: 1..7 (None: `best_version()` without accum_bits (6 on an H100/H200/H800), 2 with; only 1 and 2 emulate
    accum_bits). On a GPU versions 4 (mma.sync, sm_89+), 5, 6 and 7 (wgmma, sm_90) run on the tensor cores; under
    the simulator their twins sum in FP32 in k order.
    sms: version 7 only: the blocks of its persistent grid, one per SM, 1..device_sms() (None: every SM, at most
    one per output tile); the other SMs stay free for concurrent work. sms above the tile count leaves blocks
    idle.
    Returns a NumPy array for NumPy inputs, else the device array. A NaN scale (a group that held NaN/Inf,
    see fp8lab.quantize) or a NaN code makes the outputs that use it NaN; nothing is checked for finiteness.
    """
    da, dsa, fa = _check_operand("qa", qa)
    db, dsb, fb = _check_operand("qb", qb)
    (M, K), (N, K2) = da.shape, db.shape
    if K != K2:
        raise ValueError(f"qa and qb must share K (their second dimension): got qa.data {da.shape}, "
                         f"qb.data {db.shape}")
    fine = qa.granularity != "tensor" or qb.granularity != "tensor"
    bits, promote = _check_options(accum_bits, promote_every, fine)
    version = V.version("version", version, VERSIONS, default=best_version() if bits < 0 else max(LIMITED_VERSIONS))
    grid_sms = check_sms(sms, version)
    if version in PERSISTENT_VERSIONS and sms is None:
        grid_sms = min(grid_sms, tiles(M, N))
    check_device(version)
    if bits >= 0 and version not in LIMITED_VERSIONS:
        raise ValueError(f"version {version} accumulates in FP32 only; accum_bits={accum_bits} needs version in "
                         f"{LIMITED_VERSIONS} (or None)")
    if out is None:
        y = cuda.device_array((M, N), np.float32)
    else:
        y = V.array("out", out, dtype=np.float32, shape=(M, N))
        if not V.is_device_array(y):
            raise TypeError(f"out must be a device array, got {V.describe(out)}")
    runtime.sim_check("fl.fp8_gemm", (M, N, K), (version, bits >= 0))  # warns once if the simulator takes minutes
    launch(runtime.to_device(da), runtime.to_device(dsa), runtime.to_device(db), runtime.to_device(dsb), y,
           _KIND[qa.granularity], _KIND[qb.granularity], fa, fb, bits, promote, version, sms=grid_sms)
    on_device = V.is_device_array(qa.data)
    return y if (on_device or out is not None) else y.copy_to_host()


def launch(a, sa, b, sb, out, a_kind, b_kind, fmt_a="e4m3", fmt_b="e4m3", bits=-1, promote=0, version=BEST,
           tc_promote=True, sms=None, stream=0):
    """Launch on device arrays (no checks): a_kind/b_kind 0 tensor, 1 tile, 2 block; bits -1 = FP32.
    tc_promote=False (versions 4 and 5, per-tensor scales): no promotion, the hardware accumulator spans all of K.
    sms: version 7's grid (None: one block per tile). stream: versions 6 and 7 only (0: the default stream)."""
    M, N = out.shape
    sa2 = sa.reshape(1, 1) if a_kind == 0 else sa  # per-tensor scales as (1, 1): one indexing scheme
    sb2 = sb.reshape(1, 1) if b_kind == 0 else sb
    if stream != 0 and version not in (6, 7):
        raise ValueError(f"stream is implemented by versions 6 and 7, got version {version}")
    if version in (6, 7):
        if not tc_promote:
            raise ValueError(f"tc_promote=False is implemented by versions 4 and 5, got version {version}")
        vec = vec_ok(a, 16) & vec_ok(b, 16)
        make = make_kernel6 if version == 6 else make_kernel7
        kernel = runtime.cached((f"fp8_gemm.v{version}", a_kind, b_kind, fmt_a, fmt_b, vec),
                                lambda: make(a_kind, b_kind, fmt_a, fmt_b, vec))
        grid = ((N + BN5 - 1) // BN5, (M + BM5 - 1) // BM5) if version == 6 else (sms or tiles(M, N))
        runtime.launch_with_shared(kernel, grid, THREADS5, SMEM5, a, sa2, b, sb2, out, stream=stream)
        return
    if version in TENSOR_CORE_VERSIONS:
        make, smem, threads = (make_kernel4, SMEM4, THREADS4) if version == 4 else (make_kernel5, SMEM5, THREADS5)
        if not tc_promote and (a_kind, b_kind) != (0, 0):
            raise ValueError("tc_promote=False needs per-tensor scales on both operands (one scale for all of K)")
        kernel = runtime.cached((f"fp8_gemm.v{version}", a_kind, b_kind, fmt_a, fmt_b, tc_promote),
                                lambda: make(a_kind, b_kind, fmt_a, fmt_b, tc_promote))
        grid = ((N + BN4 - 1) // BN4, (M + BM4 - 1) // BM4)
        runtime.launch_with_shared(kernel, grid, threads, smem, a, sa2, b, sb2, out, vec_ok(a, 16) & vec_ok(b, 16))
        return
    if version == 3:
        kernel = runtime.cached(("fp8_gemm.v3", a_kind, b_kind, fmt_a, fmt_b),
                                lambda: make_kernel3(a_kind, b_kind, fmt_a, fmt_b))
        grid = ((N + BN3 - 1) // BN3, (M + BM3 - 1) // BM3)
        va, vb = vec_ok(a, 4), vec_ok(b, 4)  # rows of codes readable as aligned uint32
        a4 = a.view(np.uint32) if va else runtime.unused_array(np.uint32)
        b4 = b.view(np.uint32) if vb else runtime.unused_array(np.uint32)
        kernel[grid, THREADS3](a, a4, sa2, b, b4, sb2, out, va, vb)
        return
    k = kernels(a_kind, b_kind, bits, promote)[version]
    grid = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE)
    k[grid, (TILE, TILE)](a, sa2, b, sb2, _lut(fmt_a), _lut(fmt_b), out)


def _expanded_scales(q, rows: int, K: int) -> np.ndarray:
    """(rows, ceil(K/128)) float32: the scale of every (row, K-group)."""
    s = np.asarray(runtime.to_host(q.scale), np.float32)
    nk = -(-K // GROUP_K)
    if q.granularity == "tensor":
        return np.full((rows, nk), s.reshape(-1)[0], np.float32)
    if q.granularity == "tile":
        return s
    return np.repeat(s, GROUP_K, axis=0)[:rows]


def _decoded(name, q):
    data, _, fmt = _check_operand(name, q)
    return formats.decode(runtime.to_host(data), fmt)


def reference(qa, qb, accum_bits=None, promote_every=None) -> np.ndarray:
    """NumPy spec, float32 (M, N): the kernels' arithmetic in their order (bit-exact under the simulator).

    FP32: per K-group g, partial = float32 sum of the products in k order; acc = acc + partial * (sa * sb).
    Limited (accum_bits): the fp8lab.numerics.accum model, groups of 32, promotion as in `fp8_gemm`.
    """
    A, B = _decoded("qa", qa), _decoded("qb", qb)
    M, K = A.shape
    N = B.shape[0]
    if B.shape[1] != K:
        raise ValueError(f"qa and qb must share K: got {A.shape} and {B.shape}")
    fine = qa.granularity != "tensor" or qb.granularity != "tensor"
    bits, promote = _check_options(accum_bits, promote_every, fine)
    SA, SB = _expanded_scales(qa, M, K), _expanded_scales(qb, N, K)

    def s(g):
        return np.outer(SA[:, g], SB[:, g])  # float32 sa * sb, one rounding, as in the kernel

    acc = np.zeros((M, N), np.float32)
    if bits < 0:
        for k0 in range(0, K, GROUP_K):
            partial = np.zeros((M, N), np.float32)
            for k in range(k0, min(k0 + GROUP_K, K)):
                partial = partial + np.outer(A[:, k], B[:, k])
            acc = acc + partial * s(k0 // GROUP_K)
        return acc
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    lim = np.zeros((M, N))
    for k0 in range(0, K, ALIGN):
        lim = accum.limited_step(lim, A64[:, None, k0:k0 + ALIGN] * B64[None, :, k0:k0 + ALIGN], bits)
        if promote and (k0 + ALIGN) % promote == 0:
            acc = acc + lim.astype(np.float32) * s(k0 // GROUP_K)
            lim = np.zeros_like(lim)
    return acc + lim.astype(np.float32) * s((K - 1) // GROUP_K)


def _dequantized64(qa, qb):
    """float64 dequant(qa), dequant(qb): each code times its group's scale."""
    A, B = _decoded("qa", qa), _decoded("qb", qb)
    M, K = A.shape
    N = B.shape[0]
    SA = np.repeat(_expanded_scales(qa, M, K), GROUP_K, axis=1)[:, :K].astype(np.float64)
    SB = np.repeat(_expanded_scales(qb, N, K), GROUP_K, axis=1)[:, :K].astype(np.float64)
    return A.astype(np.float64) * SA, B.astype(np.float64) * SB


def reference64(qa, qb) -> np.ndarray:
    """float64 dequant(qa) @ dequant(qb).T: the exact value (up to float64 rounding) the errors are measured from."""
    A, B = _dequantized64(qa, qb)
    return A @ B.T


def abs_product(qa, qb) -> np.ndarray:
    """float64 sum_k |dequant(qa)[m, k] * dequant(qb)[n, k]|: the scale of every rounding error of the sum."""
    A, B = _dequantized64(qa, qb)
    return np.abs(A) @ np.abs(B).T


def error_bound(qa, qb) -> np.ndarray:
    """|y - reference64| bound for FP32 accumulation in any grouping: (K + 2) * 2^-23 * abs_product (at most
    K additions and K/128 scale steps, each one float32 rounding of relative size <= 2^-24 of a partial sum
    bounded by abs_product, doubled for slack)."""
    K = _decoded("qa", qa).shape[1]
    return (K + 2) * 2.0**-23 * abs_product(qa, qb) + 1e-30


def tensor_core_bound(qa, qb) -> np.ndarray:
    """|y - reference64| allowed for versions 4-7 on a GPU: the FP32 bound plus 2^-9 * abs_product for the
    tensor core's own accumulator inside each K-group. wgmma keeps 13 mantissa bits and truncates (measured on
    the H200 with fp8lab.kernels.tc_accum; DeepSeek-V3 reports about 14 bits): each of the 4 instructions of a
    K-group loses less than 2^-12 of its largest term per term, and random signs average most of it out; a
    wrong fragment or descriptor is off by whole products (order 1 of abs_product)."""
    return error_bound(qa, qb) + 2.0**-9 * abs_product(qa, qb)


def fma_tolerance(qa, qb) -> np.ndarray:
    """|y - reference| allowed on a GPU, where `acc + partial * s` may be one FMA: one float32 rounding of a
    value bounded by abs_product per K-group (plus two for slack). 0 under the simulator."""
    if runtime.IS_SIM:
        return np.zeros(1)
    K = _decoded("qa", qa).shape[1]
    return 2.0**-23 * (K // GROUP_K + 2) * abs_product(qa, qb) + 1e-30


# ----------------------------------------------------------------------------------------------------------------
# python -m fp8lab.kernels.fp8_gemm
# ----------------------------------------------------------------------------------------------------------------


def _on_device(q):
    return QuantizedTensor(cuda.to_device(q.data), cuda.to_device(q.scale), q.fmt, q.granularity, q.block)


def random_operands(rng, M, N, K, on_device=False):
    """(qa, qb): fresh N(0, 1) a (M, K) in 1 x 128 tiles and b (N, K) in 128 x 128 blocks, E4M3 (spec.quantize)."""
    qs = []
    for (rows, granularity) in ((M, "tile"), (N, "block")):
        codes, scale, _ = spec.quantize(rng.standard_normal((rows, K), dtype=np.float32), granularity)
        q = QuantizedTensor(codes, scale, "e4m3", granularity, GROUP_K)
        qs.append(_on_device(q) if on_device else q)
    return tuple(qs)


def _check_all(rng, M, N, K, only=None) -> list:
    """Every version (those in `only`: bench.selected), FP32 and limited accumulation, against the references;
    returns table rows.

    FP32: against reference64 within error_bound, and (simulator) bit for bit against `reference`. Limited
    accumulation: against `reference` (the NumPy model is slow, so on a GPU on a corner of at most 96 x 96:
    the outputs of a GEMM do not depend on each other)."""
    rows = []
    for accum_bits, promote in ((None, None), (13, 128), (13, 32)):
        versions = [v for v in (VERSIONS if accum_bits is None else LIMITED_VERSIONS) if bench.selected(only, v)]
        if not versions:
            continue
        m, n = (M, N) if (runtime.IS_SIM or accum_bits is None) else (min(M, 96), min(N, 96))
        qa, qb = random_operands(rng, m, n, K)
        da, db = _on_device(qa), _on_device(qb)
        ref64 = reference64(qa, qb)
        ref = reference(qa, qb, accum_bits, promote) if (runtime.IS_SIM or accum_bits is not None) else None
        for v in versions:
            out = bench.poisoned((m, n), np.float32)
            fp8_gemm(da, db, accum_bits, promote, out=out, version=v)
            got = out.copy_to_host()
            label = f"v{v} {m}x{n}x{K} accum_bits={accum_bits} promote_every={promote}"
            if np.isnan(got).any():
                raise AssertionError(f"{label}: NaN in the output (an element was not written)")
            tc_hw = v in TENSOR_CORE_VERSIONS and not runtime.IS_SIM
            if accum_bits is None:
                err = np.abs(got.astype(np.float64) - ref64)
                bound = tensor_core_bound(qa, qb) if tc_hw else error_bound(qa, qb)
                if not (err <= bound).all():
                    raise AssertionError(f"{label}: error {err.max():.3g} above the "
                                         f"{'tensor-core' if tc_hw else 'FP32'} bound")
            # versions 1, 2 (and the twins of 4, 5) add in the reference's order; version 3 scales the operands
            in_order = v in LIMITED_VERSIONS or (v in TENSOR_CORE_VERSIONS and runtime.IS_SIM)
            if ref is not None and in_order:
                # simulator: bit-exact; GPU: `acc + partial * s` may be one FMA: ~1 rounding per K-group
                err = np.abs(got.astype(np.float64) - ref)
                if not (err <= fma_tolerance(qa, qb)).all():
                    raise AssertionError(f"{label}: differs from reference by up to {err.max():.3g}")
            if tc_hw:
                how = "ok (tensor-core bound)"
            elif not in_order:
                how = "ok (FP32 bound)"
            else:
                how = "bit-exact" if runtime.IS_SIM else ("ok (FP32 bound)" if ref is None else "ok (FMA tolerance)")
            rel = np.abs(got - ref64) / np.abs(ref64)
            rows.append([label, how, f"{rel.max():.2e} / {np.median(rel):.2e}"])
    return rows


def _torch_fast_accum_stats(torch, rng, ks, M=256, N=256):
    """Max/mean relative error of torch._scaled_mm (fast accum on/off) vs float64 on the same FP8 inputs,
    next to the emulator's FP22 model with and without promotion (on a 64 x 64 corner)."""
    rows = []
    for K in ks:
        a = rng.random((M, K), dtype=np.float32)  # positive inputs, as error_vs_k's "uniform"
        b = rng.random((N, K), dtype=np.float32)
        ca = formats.encode(a * spec.FP8_MAX["e4m3"])
        cb = formats.encode(b * spec.FP8_MAX["e4m3"])
        A, B = formats.decode(ca), formats.decode(cb)
        exact = A.astype(np.float64) @ B.astype(np.float64).T
        ta = torch.from_numpy(ca).cuda().view(torch.float8_e4m3fn)
        tb = torch.from_numpy(cb).cuda().view(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        res = {}
        for fast in (True, False):
            y = torch._scaled_mm(ta, tb.t(), one, one, out_dtype=torch.float32, use_fast_accum=fast)
            res[fast] = np.abs(y.cpu().numpy().astype(np.float64) - exact) / np.abs(exact)
        c = slice(0, 64)
        emu = {}
        for lab, p in (("FP22", None), ("FP22+promote128", 128)):
            y = accum.dot_limited(A[c], B[c], 13, promote_every=p)
            emu[lab] = np.abs(y - exact[c, c]) / np.abs(exact[c, c])
        rows.append([K] + [f"{r.max():.2e} / {r.mean():.2e}" for r in (res[True], res[False], emu["FP22"],
                                                                        emu["FP22+promote128"])])
    return rows


OPTIONS = {"--deepseek": dict(action="store_true", help="also time the best version once at M, N, K = 4096, 7168, "
                                                         "16384 (about two minutes of GPU time)")}


def checks(rng, only=None) -> list:
    """Every version (those in `only`; None: all), FP32 and limited accumulation, against the references (see
    _check_all)."""
    M, N, K = (5, 9, 300) if runtime.IS_SIM else (1000, 777, 1111)
    return [(f"{label}", f"{how}; rel. err. vs float64 max / median {err}") for label, how, err in
            _check_all(rng, M, N, K, only)]


def _triton_peer():
    """fp8lab.bench.triton_peer when Triton is installed (a benchmark peer, never a dependency), else None."""
    try:
        from ..bench import triton_peer as _triton_peer
    except ImportError:
        return None
    return _triton_peer


def _torch_reference64(torch, qa, qb):
    """float64 dequant(qa) @ dequant(qb).T on the GPU (NumPy would take minutes at DeepSeek's shape)."""
    A, B = (torch.from_numpy(_decoded(n, q)).cuda().double() for n, q in (("qa", qa), ("qb", qb)))
    (M, K), N = A.shape, B.shape[0]
    for X, q, rows in ((A, qa, M), (B, qb, N)):
        X *= torch.from_numpy(_expanded_scales(q, rows, K)).cuda().double().repeat_interleave(GROUP_K, dim=1)[:, :K]
    return A @ B.T


def torch_blockwise(torch, qa, qb):
    """A callable running cuBLAS's blockwise FP8 GEMM (torch._scaled_mm, bfloat16 out) on device operands qa (1 x 128
    tiles) and qb (128 x 128 blocks), or None when N or K is not a multiple of 128 (cuBLAS's blockwise layout:
    scale_a column-major, scale_b transposed)."""
    (M, K), N = qa.data.shape, qb.data.shape[0]
    if K % GROUP_K or N % GROUP_K:
        return None
    ta = torch.as_tensor(qa.data, device="cuda").view(torch.float8_e4m3fn)
    tb = torch.as_tensor(qb.data, device="cuda").view(torch.float8_e4m3fn)
    sa = torch.as_tensor(qa.scale, device="cuda").t().contiguous().t()
    sb = torch.as_tensor(qb.scale, device="cuda").t()
    return lambda: torch._scaled_mm(ta, tb.t(), sa, sb, out_dtype=torch.bfloat16)


def timings(rng, args) -> list:
    """Every version at 4096^3 (and the tensor-core versions at DeepSeek-V3's 4096 x 7168 x 16384 with --deepseek)
    against torch._scaled_mm (cuBLAS FP8, blockwise and per-tensor scales) and a DeepSeek-style Triton kernel when
    installed, measured in the same run, each with its normwise error against the float64 product of the
    dequantized operands; then the accuracy of _scaled_mm's fast accumulation against the emulator. With args.only:
    only those versions at 4096^3 (and --deepseek's shape), no peers."""
    only = getattr(args, "only", None)
    torch = bench.torch_cuda()
    peer = _triton_peer() if torch is not None else None
    shapes = [(4096, 4096, 4096)] + ([(4096, 7168, 16384)] if getattr(args, "deepseek", False) else [])
    tables = []
    for M, N, K in shapes:
        big = M * N * K > 4096**3
        flops = 2.0 * M * N * K
        qa, qb = random_operands(rng, M, N, K, on_device=True)
        out = cuda.device_array((M, N), np.float32)
        if torch is not None:
            ref = _torch_reference64(torch, qa, qb)
            norm = torch.linalg.norm(ref).item()

            def err(y):
                return f"{torch.linalg.norm(torch.as_tensor(y, device='cuda').double() - ref).item() / norm:.2e}"
        else:
            ref = reference64(qa, qb)

            def err(y):
                y = y.copy_to_host() if hasattr(y, "copy_to_host") else y
                return f"{np.linalg.norm(y - ref) / np.linalg.norm(ref):.2e}"

        def row(label, fn, ms):
            out_ = fn()
            return bench.Row(label, ms, flops, {"normwise error": err(out_)})

        rows = []
        for v in ([4, 5, 6, 7] if big else VERSIONS):
            if not bench.selected(only, v):
                continue

            def run(v=v):
                return fp8_gemm(qa, qb, out=out, version=v)
            rows.append(row(f"v{v}: {VERSIONS[v]}", run, timing.time_ms(run, warmup=0 if big else 1,
                                                                             repeat=1 if big else 3)))
        if not rows:  # args.only has no version timed at this shape
            continue
        ceiling = None
        if torch is not None and only is None:
            ta = torch.as_tensor(qa.data, device="cuda").view(torch.float8_e4m3fn)
            tb = torch.as_tensor(qb.data, device="cuda").view(torch.float8_e4m3fn)
            sa = torch.as_tensor(qa.scale, device="cuda")
            sb = torch.as_tensor(qb.scale, device="cuda")
            if peer is not None:  # a DeepSeek-style Triton kernel: the best of a few tile configurations
                tc = torch.empty((M, N), device="cuda", dtype=torch.float32)
                best = min((timing.torch_time_ms(torch, lambda c=c: peer.fp8_gemm(ta, sa, tb, sb, tc, c)), c)
                           for c in peer.CONFIGS)
                rows.append(row(f"Triton, DeepSeek-V3 inference style (tile {best[1][0]}x{best[1][1]}, "
                                f"{best[1][2]} stages)", lambda: peer.fp8_gemm(ta, sa, tb, sb, tc, best[1]), best[0]))
            blockwise = torch_blockwise(torch, qa, qb)
            if blockwise is not None:
                ms = timing.torch_time_ms(torch, blockwise)
                rows.append(row("torch._scaled_mm, blockwise 1x128 / 128x128, bfloat16 out (cuBLAS)", blockwise, ms))
                ceiling = bench.rate(flops, ms, "TFLOP/s")
            one = torch.ones((), device="cuda")
            ms = timing.torch_time_ms(torch, lambda: torch._scaled_mm(ta, tb.t(), one, one, out_dtype=torch.float32))
            rows.append(bench.Row("torch._scaled_mm, tensorwise (cuBLAS; ignores the scales: speed only)", ms, flops,
                                  {"normwise error": "-"}))
            ceiling = ceiling or bench.rate(flops, ms, "TFLOP/s")
        if torch is not None:
            del ref
            torch.cuda.empty_cache()
        tables.append(bench.Table(f"FP8 GEMM {M}x{N}x{K}, A 1x128 tiles, B 128x128 blocks, float32 out; normwise "
                                  "error = |y - y64| / |y64| (Frobenius) against float64", "TFLOP/s", rows,
                                  ceiling=ceiling, ceiling_label="cuBLAS FP8 blockwise", peak_kind="fp8"))
    if torch is not None and only is None:
        tables.append(bench.Table(
            "torch._scaled_mm vs the emulator: max / mean relative error vs float64, same FP8 inputs (U[0,1) * 448, "
            "per-tensor scale 1)", None, header=["K", "use_fast_accum=True", "use_fast_accum=False", "FP22 model",
                                                 "FP22 + promote 128"],
            cells=_torch_fast_accum_stats(torch, rng, (1024, 2048, 4096, 8192, 16384))))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
