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
           cvt.rn.f16x2.{e4m3,e5m2}x2 (fp8lab.ptx), each
           multiplied by its K-group's scale, stored as float32 in shared memory. The scales are applied per
           K-group inside the kernel, but to the operands as they are staged, not to partial sums: one more
           float32 rounding per operand than `reference`, so version 3 is checked against float64 within the
           FP32 bound (`error_bound`), not bit for bit. FP32 accumulation only.

accum_bits / promote_every (kernel options, compiled in, versions 1 and 2): emulate the limited-precision tensor-core
accumulator of fp8lab/accum.py instead of FP32: k in groups of 32, each group's products and the running
accumulator aligned to the largest exponent, truncated to accum_bits mantissa bits, added exactly, the sum
truncated to accum_bits; every promote_every elements of K the limited sum is multiplied by the group's scales
and added to the FP32 accumulator (DeepSeek: N_C = 128). Integer and bit manipulation is done with
math.frexp / math.ldexp / math.floor and int64 sums, as in fp8lab/formats.py (no libdevice bit tricks, so it
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
from .. import accum, bench, formats, runtime, spec, timing
from ..runtime import cuda
from ..spec import GROUP_K, QuantizedTensor
from . import common as C
from .common import DECODE_X2, sgemm_fma_step, sgemm_store, vec_ok

ALIGN = accum.GROUP  # products per alignment group of the limited accumulator (32)
BLOCK_K = GROUP_K  # K elements per shared tile of version 2: one scale group
BLOCK_K_PAD = BLOCK_K + 1  # shared b tile row length: column reads by TILE threads hit TILE different banks
TILE = runtime.sizes("gemm_tile")  # outputs per block side: 16 on a GPU, 8 under the simulator
OPERAND_GRANULARITIES = ("tensor", "tile", "block")  # of spec.GRANULARITIES, the ones fp8_gemm takes
_KIND = {"tensor": 0, "tile": 1, "block": 2}
_ZERO_EXP = -(1 << 20)

VERSIONS = {
    1: "one thread per output, K-groups of 128 from global memory",
    2: "TILE x TILE shared-memory tiles, BLOCK_K = 128 steps, scales per tile in shared memory",
    3: "SGEMM v7's 128 x 128 register-blocked core; codes dequantized per K-group while staged in shared memory",
}
BEST = 3
"""The default for FP32 accumulation. The limited-accumulator emulation (accum_bits) exists in versions 1 and 2;
there the default is 2."""
LIMITED_VERSIONS = (1, 2)
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
# Device functions: the limited accumulator (bit-exact with fp8lab.accum)
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


def fp8_gemm(qa, qb, accum_bits=None, promote_every=None, out=None, version=None):
    """y = dequant(qa) @ dequant(qb).T, float32 (M, N), scales applied per K-group of 128 inside the kernel.

    qa: (M, K) codes, granularity "tile" (scale (M, ceil(K/128))) or "tensor" (scale (1,)); qb: (N, K) codes,
    "block" (scale (ceil(N/128), ceil(K/128))) or "tensor" ("block" for qa and "tile" for qb work too). Any
    object with .data (uint8), .scale (float32), .granularity and .fmt ('e4m3' or 'e5m2') will do, e.g.
    fp8lab.QuantizedTensor; NumPy or device arrays.
    accum_bits: None = FP32 accumulation; 1..23 = emulate a tensor-core accumulator with that many mantissa
    bits (13 = Hopper's FP22, see fp8lab.accum). promote_every: multiple of 32; None = 128 with tile/block
    scales, no promotion with per-tensor scales. out: optional float32 (M, N) device array.
    version: 1, 2 or 3 (None: 3 for FP32 accumulation, 2 with accum_bits; 3 has FP32 accumulation only).
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
    version = V.version("version", version, VERSIONS, default=BEST if bits < 0 else max(LIMITED_VERSIONS))
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
           _KIND[qa.granularity], _KIND[qb.granularity], fa, fb, bits, promote, version)
    on_device = V.is_device_array(qa.data)
    return y if (on_device or out is not None) else y.copy_to_host()


def launch(a, sa, b, sb, out, a_kind, b_kind, fmt_a="e4m3", fmt_b="e4m3", bits=-1, promote=0, version=BEST):
    """Launch on device arrays (no checks): a_kind/b_kind 0 tensor, 1 tile, 2 block; bits -1 = FP32."""
    M, N = out.shape
    sa2 = sa.reshape(1, 1) if a_kind == 0 else sa  # per-tensor scales as (1, 1): one indexing scheme
    sb2 = sb.reshape(1, 1) if b_kind == 0 else sb
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
    Limited (accum_bits): the fp8lab.accum model, groups of 32, promotion as in `fp8_gemm`.
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


def _check_all(rng, M, N, K) -> list:
    """Every version, FP32 and limited accumulation, against the references; returns table rows.

    FP32: against reference64 within error_bound, and (simulator) bit for bit against `reference`. Limited
    accumulation: against `reference` (the NumPy model is slow, so on a GPU on a corner of at most 96 x 96:
    the outputs of a GEMM do not depend on each other)."""
    rows = []
    for accum_bits, promote in ((None, None), (13, 128), (13, 32)):
        m, n = (M, N) if (runtime.IS_SIM or accum_bits is None) else (min(M, 96), min(N, 96))
        qa, qb = random_operands(rng, m, n, K)
        da, db = _on_device(qa), _on_device(qb)
        ref64 = reference64(qa, qb)
        ref = reference(qa, qb, accum_bits, promote) if (runtime.IS_SIM or accum_bits is not None) else None
        for v in (VERSIONS if accum_bits is None else LIMITED_VERSIONS):
            out = bench.poisoned((m, n), np.float32)
            fp8_gemm(da, db, accum_bits, promote, out=out, version=v)
            got = out.copy_to_host()
            label = f"v{v} {m}x{n}x{K} accum_bits={accum_bits} promote_every={promote}"
            if np.isnan(got).any():
                raise AssertionError(f"{label}: NaN in the output (an element was not written)")
            if accum_bits is None:
                err = np.abs(got.astype(np.float64) - ref64)
                if not (err <= error_bound(qa, qb)).all():
                    raise AssertionError(f"{label}: error {err.max():.3g} above the FP32 bound")
            in_order = v in LIMITED_VERSIONS  # version 3 scales the operands, not the partial sums: other roundings
            if ref is not None and in_order:
                # simulator: bit-exact; GPU: `acc + partial * s` may be one FMA: ~1 rounding per K-group
                err = np.abs(got.astype(np.float64) - ref)
                if not (err <= fma_tolerance(qa, qb)).all():
                    raise AssertionError(f"{label}: differs from reference by up to {err.max():.3g}")
            if not in_order:
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


def checks(rng) -> list:
    """Every version, FP32 and limited accumulation, against the references (see _check_all)."""
    M, N, K = (5, 9, 300) if runtime.IS_SIM else (1000, 777, 1111)
    return [(f"{label}", f"{how}; rel. err. vs float64 max / median {err}") for label, how, err in
            _check_all(rng, M, N, K)]


def timings(rng, args) -> list:
    """Every version at 4096^3 (and the best at DeepSeek-V3's 4096 x 7168 x 16384 with --deepseek) against
    torch._scaled_mm (cuBLAS FP8 on the tensor cores, per-tensor scales) measured in the same run; then the
    accuracy of _scaled_mm's fast accumulation against the emulator."""
    torch = bench.torch_cuda()
    shapes = [(4096, 4096, 4096)] + ([(4096, 7168, 16384)] if getattr(args, "deepseek", False) else [])
    tables = []
    for M, N, K in shapes:
        big = M * N * K > 4096**3
        flops = 2.0 * M * N * K
        qa, qb = random_operands(rng, M, N, K, on_device=True)
        out = cuda.device_array((M, N), np.float32)
        rows = [bench.Row(f"v{v}: {VERSIONS[v]}",
                          timing.time_ms(lambda v=v: fp8_gemm(qa, qb, out=out, version=v), warmup=0 if big else 1,
                                         repeat=1 if big else 3), flops)
                for v in ([BEST] if big else VERSIONS)]
        ceiling = None
        if torch is not None:  # the tensor-core reference: cuBLAS FP8 with per-tensor scales
            ta = torch.from_numpy(qa.data.copy_to_host()).cuda().view(torch.float8_e4m3fn)
            tb = torch.from_numpy(qb.data.copy_to_host()).cuda().view(torch.float8_e4m3fn)
            one = torch.ones((), device="cuda")
            ms = timing.torch_time_ms(torch, lambda: torch._scaled_mm(ta, tb.t(), one, one, out_dtype=torch.float32))
            rows.append(bench.Row("torch._scaled_mm, tensorwise (cuBLAS, FP8 tensor cores)", ms, flops))
            ceiling = bench.rate(flops, ms, "TFLOP/s")
        tables.append(bench.Table(f"FP8 GEMM {M}x{N}x{K}, A 1x128 tiles, B 128x128 blocks, float32 out", "TFLOP/s",
                                  rows, ceiling=ceiling, ceiling_label="cuBLAS FP8", peak_kind="fp8"))
    if torch is not None:
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
