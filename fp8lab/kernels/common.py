"""Device code shared by several kernels (llm.c's `common.h`): every kernel module imports its helpers from here,
and never from another kernel module.

Sections:
- FP8 codecs: `encode_e4m3_sat`, `encode_e4m3`, `encode_e5m2_sat`, `encode_e5m2`, `decode_e4m3`, `decode_e5m2`,
  software device functions bit-exact with fp8lab.numerics.formats (`ENCODE_SAT`, `DECODE` by format name), and the
  hardware conversions by format name (`CVT_X2`, `DECODE_X2`, from fp8lab.device.ptx);
- reductions: `nanmax`, `warp_sum`, `warp_max`, `block_sum`, `block_max`, `tree_max`;
- vector access: `vec_ok(x, nbytes)` (host: may x be read nbytes at a time?) and `load4` (four float32, one
  16-byte load where allowed);
- the register-tiled SGEMM core: its geometry (`TILE_M`, `TILE_N`, `TILE_K`, `THREAD_M`, `THREAD_N`, ...),
  `sgemm_fma_step` and `sgemm_store`, shared by gemm version 7 and fp8_gemm version 3 (`sgemm_store_add`: its
  epilogue with a residual, c = r + acc);
- a stable counting sort of small integer keys: `tile_count_kernel`, `tile_scan_kernel`, `offsets_scan_kernel`,
  `place_kernel` (the embedding's backward, routed experts' permutation), with `block_exclusive_scan`;
- the scale of a group: `amax_scale` (amax / FP8_MAX) and `make_group_scale(fmt, mode)` (every scale mode of
  spec.group_scale), and `make_dual_tile_kernel` (x and x.T in 1 x 128 tiles from one read: quantize_fine's dual
  quantize, swiglu's backward fused with it);
- wgmma staging, shared by fp8_gemm versions 5-7 and bf16_gemm: `copy16` (16 bytes global -> shared, cp.async
  where aligned), `load_swizzled_tile` (128 rows of 128 bytes, 128-byte swizzle, 256 threads) and
  `make_store_wgmma(n, add)` (a warpgroup's m64nN float32 accumulators to global memory, edges masked; add=True
  adds a residual: c = r + acc).

The FP8 codecs are plain float arithmetic that is exact (math.frexp, multiplication by powers of two,
math.floor, comparisons, a hand-written round-half-even), so they run unchanged on the GPU (numba-cuda lowers
math.frexp / math.floor / math.copysign to libdevice's __nv_frexpf / __nv_floorf / __nv_copysignf, inlined: the
E4M3 encoder compiles to branchy float32 code with no call and no float64 instruction on sm_90) and in the
simulator (Python's math). They take float32 or float64 and round the value they are given directly. Call them
only from kernels compiled without fastmath: fast-math flags let the compiler assume no NaN and drop the NaN
tests. NaN codes carry the input's sign like `formats.encode`.

Reductions: blocks must have a multiple of 32 threads (a full-mask shuffle on a partial warp is undefined on a
GPU); every live lane of a warp must reach every shuffle.
"""

from __future__ import annotations

import math

import numpy as np

from ..numerics import formats
from ..device import ptx, runtime
from ..numerics.spec import AMAX_FLOOR as _AMAX_FLOOR
from ..numerics.spec import (DEEPGEMM_AMAX_FLOOR, DEEPGEMM_INV_MAX, E8M0_NAN, EMAX_ELEM, FP8_MAX, GROUP_K, MODES,
                             POISON_CODE)
from ..device.ptx import ld_global_v4_f32, ld_shared_v4_f32
from ..device.runtime import FULL_MASK, WARP_SIZE, cuda, shfl_xor_sync

__all__ = [
    "encode_e4m3_sat", "encode_e4m3", "encode_e5m2_sat", "encode_e5m2", "decode_e4m3", "decode_e5m2",
    "ENCODE_SAT", "DECODE", "CVT_X2", "DECODE_X2", "nanmax", "warp_sum", "warp_max", "block_sum", "block_max",
    "tree_max", "vec_ok", "load4", "TILE_M", "TILE_N", "TILE_K", "THREAD_M", "THREAD_N", "TILE_THREADS",
    "TILE_COLS", "TILE_BUF_ROWS", "TILE_HALF", "sgemm_fma_step", "sgemm_store", "sgemm_store_add",
    "copy16", "load_swizzled_tile", "make_store_wgmma",
]


# ----------------------------------------------------------------------------------------------------------------
# FP8 codecs
# ----------------------------------------------------------------------------------------------------------------
# Constants. On the GPU they are float32 scalars, which Numba freezes as float32, so a float32 input is rounded
# with float32 instructions only (a bare `a * 512.0` would be exact too, but computed in float64). In the
# simulator the arithmetic is NumPy's, where a NumPy float32 scalar pulls a Python float (what math.frexp returns,
# holding a float64 input exactly) down to float32 (NEP 50 weak scalars): there the constants are Python floats,
# so every operation keeps the input's precision. Either way every operation below is exact for the values it
# sees, so float32 and float64 inputs are both rounded directly.
_K = float if runtime.IS_SIM else np.float32

_ZERO = _K(0.0)
_ONE = _K(1.0)
_HALF = _K(0.5)
_8 = _K(8.0)
_16 = _K(16.0)
_2P9 = _K(2.0**9)
_2P16 = _K(2.0**16)
_E4M3_MAX = _K(formats.E4M3.max_normal)  # 448
_E4M3_OVERFLOW = _K(464.0)  # |x| > 464 overflows (464 itself rounds to 448, the even neighbour)
_E4M3_MIN_NORMAL = _K(2.0**-6)
_E5M2_MAX = _K(formats.E5M2.max_normal)  # 57344
_E5M2_OVERFLOW = _K(61440.0)  # |x| >= 61440 overflows (61440 rounds to the even 2^16)
_E5M2_MIN_NORMAL = _K(2.0**-14)
# decode returns float32 on both backends
_F32_NAN = np.float32(np.nan)
_F32_INF = np.float32(np.inf)
_F32_2M10 = np.float32(2.0**-10)
_F32_2M17 = np.float32(2.0**-17)


@cuda.jit(device=True)
def _round_half_even(s):
    """Nearest integer to s (0 <= s <= 16 here), ties to even. Exact: floor(s) and s - floor(s) are exact."""
    f = math.floor(s)
    d = s - f
    r = int(f)
    if d > _HALF or (d == _HALF and (r & 1) == 1):
        r += 1
    return r


@cuda.jit(device=True)
def _sign_bit(x):
    """0x80 if x has its sign bit set (negative numbers, -0.0, -NaN, -Inf), else 0."""
    return 0x80 if math.copysign(_ONE, x) < _ZERO else 0


@cuda.jit(device=True)
def _e4m3_magnitude(a):
    """E4M3 code (0..0x7E) of a finite a in [0, 464], round to nearest even."""
    if a < _E4M3_MIN_NORMAL:
        return _round_half_even(a * _2P9)  # subnormal: units of 2^-9, 0..8 (8 is min normal, 0x08)
    m, e = math.frexp(a)  # a = m * 2^e, 0.5 <= m < 1
    # biased exponent e - 1 + 7; mantissa steps of 1/8: m * 16 in [8, 16), 16 carries into the exponent.
    return (e + 5) * 8 + _round_half_even(m * _16)


@cuda.jit(device=True)
def _e5m2_magnitude(a):
    """E5M2 code (0..0x7B) of a finite a in [0, 61440), round to nearest even."""
    if a < _E5M2_MIN_NORMAL:
        return _round_half_even(a * _2P16)  # subnormal: units of 2^-16, 0..4
    m, e = math.frexp(a)
    return (e + 13) * 4 + _round_half_even(m * _8)


@cuda.jit(device=True)
def encode_e4m3_sat(x):
    """E4M3 code (int 0..255) of x, saturating (PTX satfinite): overflow, +-Inf -> +-448; NaN -> 0x7F|sign."""
    sign = _sign_bit(x)
    a = abs(x)
    if a != a:
        return 0x7F | sign
    if a >= _E4M3_MAX:
        return 0x7E | sign
    return _e4m3_magnitude(a) | sign


@cuda.jit(device=True)
def encode_e4m3(x):
    """E4M3 code (int 0..255) of x, non-saturating like ml_dtypes: |x| > 464, +-Inf and NaN -> 0x7F|sign."""
    sign = _sign_bit(x)
    a = abs(x)
    if not a <= _E4M3_OVERFLOW:  # NaN compares false
        return 0x7F | sign
    return _e4m3_magnitude(a) | sign


@cuda.jit(device=True)
def encode_e5m2_sat(x):
    """E5M2 code (int 0..255) of x, saturating: overflow and +-Inf -> +-57344; NaN -> 0x7E|sign."""
    sign = _sign_bit(x)
    a = abs(x)
    if a != a:
        return 0x7E | sign
    if a >= _E5M2_MAX:
        return 0x7B | sign
    return _e5m2_magnitude(a) | sign


@cuda.jit(device=True)
def encode_e5m2(x):
    """E5M2 code (int 0..255) of x, non-saturating like ml_dtypes: |x| >= 61440, +-Inf -> +-Inf; NaN -> 0x7E|sign."""
    sign = _sign_bit(x)
    a = abs(x)
    if a != a:
        return 0x7E | sign
    if a >= _E5M2_OVERFLOW:
        return 0x7C | sign
    return _e5m2_magnitude(a) | sign


@cuda.jit(device=True)
def decode_e4m3(code):
    """float32 value of an E4M3 code (0..255); 0x7F/0xFF -> NaN carrying the code's sign, 0x80 -> -0.0."""
    c = int(code)
    ef = (c >> 3) & 0xF
    mf = c & 0x7
    if ef == 0xF and mf == 0x7:
        v = _F32_NAN
    elif ef == 0:
        v = np.float32(mf * 2) * _F32_2M10  # 0.mmm * 2^-6 = (2 * mmm) * 2^-10
    else:
        v = np.float32((8 + mf) << ef) * _F32_2M10  # 1.mmm * 2^(ef - 7) = (8 + mmm) * 2^ef * 2^-10
    return -v if c & 0x80 else v


@cuda.jit(device=True)
def decode_e5m2(code):
    """float32 value of an E5M2 code (0..255); S.11111.00 -> +-Inf, S.11111.{01,10,11} -> NaN, 0x80 -> -0.0."""
    c = int(code)
    ef = (c >> 2) & 0x1F
    mf = c & 0x3
    if ef == 0x1F:
        v = _F32_INF if mf == 0 else _F32_NAN
    elif ef == 0:
        v = np.float32(mf * 2) * _F32_2M17  # 0.mm * 2^-14 = (2 * mm) * 2^-17
    else:
        v = np.float32((4 + mf) << ef) * _F32_2M17  # 1.mm * 2^(ef - 15) = (4 + mm) * 2^ef * 2^-17
    return -v if c & 0x80 else v


ENCODE_SAT = {"e4m3": encode_e4m3_sat, "e5m2": encode_e5m2_sat}
"""Software saturating encoders by format name (the policy of formats.encode(..., saturate=True))."""
DECODE = {"e4m3": decode_e4m3, "e5m2": decode_e5m2}
CVT_X2 = {"e4m3": ptx.cvt_e4m3x2_satfinite, "e5m2": ptx.cvt_e5m2x2_satfinite}
"""Hardware conversions of two float32 to two codes (twins under the simulator), by format name."""
DECODE_X2 = {"e4m3": ptx.decode_e4m3x2, "e5m2": ptx.decode_e5m2x2}


# ----------------------------------------------------------------------------------------------------------------
# Reductions (version 1 of per-tensor quantize uses the shared-memory tree, version 2 the warp shuffles)
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def nanmax(a, b):
    """max that propagates NaN (plain max/`>` silently drops it, hiding a NaN input)."""
    if a != a:
        return a
    if b != b or b > a:
        return b
    return a


@cuda.jit(device=True)
def warp_sum(v):
    """Butterfly sum: after 5 xor-shuffles every lane holds the warp's total."""
    offset = 16
    while offset > 0:
        v += shfl_xor_sync(FULL_MASK, v, offset)
        offset //= 2
    return v


@cuda.jit(device=True)
def warp_max(v):
    offset = 16
    while offset > 0:
        v = nanmax(v, shfl_xor_sync(FULL_MASK, v, offset))
        offset //= 2
    return v


@cuda.jit(device=True)
def block_sum(v, slots):
    """Sum of v over the block, returned to every thread. `slots`: shared float32 array of >= 32."""
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    v = warp_sum(v)
    nwarps = (cuda.blockDim.x + 31) // 32
    if nwarps == 1:  # one warp: done (the same branch for every thread, so no divergence)
        return v
    if lane == 0:
        slots[warp] = v
    cuda.syncthreads()
    v = slots[lane] if lane < nwarps else np.float32(0)
    v = warp_sum(v)  # every warp reduces the slots, so every thread gets the total
    cuda.syncthreads()  # slots may be reused right after
    return v


@cuda.jit(device=True)
def block_max(v, slots):
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    v = warp_max(v)
    nwarps = (cuda.blockDim.x + 31) // 32
    if nwarps == 1:
        return v
    if lane == 0:
        slots[warp] = v
    cuda.syncthreads()
    v = slots[lane] if lane < nwarps else np.float32(0)
    v = warp_max(v)
    cuda.syncthreads()
    return v


@cuda.jit(device=True)
def tree_max(v, smem):
    """Version 1: shared-memory tree. `smem` holds blockDim.x floats; blockDim.x a power of two."""
    tid = cuda.threadIdx.x
    smem[tid] = v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            smem[tid] = nanmax(smem[tid], smem[tid + s])
        cuda.syncthreads()
        s //= 2
    v = smem[0]
    cuda.syncthreads()
    return v


# ----------------------------------------------------------------------------------------------------------------
# Vector access
# ----------------------------------------------------------------------------------------------------------------


def vec_ok(x, nbytes: int = 16) -> int:
    """1 when x[i, j : j + n] (n elements of nbytes) may be read with one aligned nbytes-wide access for every j that
    is a multiple of n: contiguous rows whose length in bytes is a multiple of nbytes, nbytes-aligned base.
    The default, 16, is a float4 of a float32 array; fp8_gemm and quantize_fine also ask for 4 bytes of uint8 codes.
    Pass the result to the kernel: it takes the vector path only where this said 1."""
    rows, cols = x.shape
    item = x.dtype.itemsize
    if (cols * item) % nbytes or tuple(x.strides) != (cols * item, item):
        return 0
    if not runtime.IS_SIM:
        if x.__cuda_array_interface__["data"][0] % nbytes:
            return 0
    return 1


@cuda.jit(device=True)
def load4(x, i, j, rows, cols, vec):
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


# ----------------------------------------------------------------------------------------------------------------
# The register-tiled SGEMM core (gemm versions 5-7 have this geometry; 7 and fp8_gemm 3 share the code)
# ----------------------------------------------------------------------------------------------------------------
# Shared- and local-array shapes must be compile-time constants: every size is a module-level int.

TILE_M, TILE_N, TILE_K = 128, 128, 8  # block tile: TILE_M x TILE_N outputs, k-steps of TILE_K
THREAD_M, THREAD_N = 8, 8  # outputs per thread
TILE_THREADS = (TILE_M // THREAD_M) * (TILE_N // THREAD_N)  # 256
TILE_COLS = TILE_N // THREAD_N  # 16 threads across a block tile's columns
TILE_BUF_ROWS = 2 * TILE_K  # two k-step buffers stacked in one shared array (double buffering)
TILE_HALF = 64  # a thread's second group of 4 rows (and of 4 columns) starts 64 further


@cuda.jit(device=True)
def sgemm_fma_step(sat, sbt, k, t_row, t_col, reg_m, reg_n, acc):
    """One k of the register-tiled SGEMM core: the thread's 8 values of a from row k of sat and its 8 of b from
    row k of sbt (four ld.shared.v4.f32, 4 x 4 groups TILE_HALF apart), then acc += their outer product (64 FMAs).
    Used by gemm version 7 and fp8_gemm version 3."""
    reg_m[0], reg_m[1], reg_m[2], reg_m[3] = ld_shared_v4_f32(sat, k, t_row * 4)
    reg_m[4], reg_m[5], reg_m[6], reg_m[7] = ld_shared_v4_f32(sat, k, TILE_HALF + t_row * 4)
    reg_n[0], reg_n[1], reg_n[2], reg_n[3] = ld_shared_v4_f32(sbt, k, t_col * 4)
    reg_n[4], reg_n[5], reg_n[6], reg_n[7] = ld_shared_v4_f32(sbt, k, TILE_HALF + t_col * 4)
    for i in range(THREAD_M):
        for j in range(THREAD_N):
            acc[i, j] += reg_m[i] * reg_n[j]


@cuda.jit(device=True)
def sgemm_store(c, acc, m0, n0, t_row, t_col, M, N):
    """The core's epilogue: acc's 2 x 2 groups of 4 x 4 to c (M x N), where inside it."""
    for i in range(THREAD_M):
        m = m0 + (i // 4) * TILE_HALF + t_row * 4 + i % 4
        for j in range(THREAD_N):
            n = n0 + (j // 4) * TILE_HALF + t_col * 4 + j % 4
            if m < M and n < N:
                c[m, n] = acc[i, j]


@cuda.jit(device=True)
def sgemm_store_add(c, acc, m0, n0, t_row, t_col, M, N, r):
    """sgemm_store with a residual: c = r + acc where inside c (r may be c itself: c += acc). The add is the last
    float32 operation, after the sum, so c holds bit for bit what a separate add of r and the stored acc gives."""
    for i in range(THREAD_M):
        m = m0 + (i // 4) * TILE_HALF + t_row * 4 + i % 4
        for j in range(THREAD_N):
            n = n0 + (j // 4) * TILE_HALF + t_col * 4 + j % 4
            if m < M and n < N:
                c[m, n] = r[m, n] + acc[i, j]


# ----------------------------------------------------------------------------------------------------------------
# The scale of one group from its amax, spec.group_scale's "amax" rule, for kernels that quantize what they
# compute (swiglu, norm_quant) and must match spec.quantize bit for bit
# ----------------------------------------------------------------------------------------------------------------

_F32_FINITE_MAX = np.float32(np.finfo(np.float32).max)
__all__ += ["amax_scale"]


@cuda.jit(device=True)
def amax_scale(amax, fp8_max):
    """(scale, inv_scale) of a group from its float32 amax: amax floored at spec.AMAX_FLOOR, scale = amax / fp8_max
    and inv_scale = fp8_max / amax, two float32 divisions (spec.group_scale, mode "amax"); NaN and NaN for a NaN or
    +Inf amax, which poisons the group. fp8_max: spec.FP8_MAX[fmt], a float32."""
    if not amax <= _F32_FINITE_MAX:  # NaN compares false; +Inf is above the largest float32
        return _F32_NAN, _F32_NAN
    safe = amax if amax > _AMAX_FLOOR else _AMAX_FLOOR
    return safe / fp8_max, fp8_max / safe


__all__ += ["make_group_scale"]
_ONE32, _HALF32 = np.float32(1.0), np.float32(0.5)


def make_group_scale(fmt: str, mode: str):
    """The scale rule of one group (spec.group_scale) as a device function, one per (fmt, mode)."""
    fp8_max = FP8_MAX[fmt]
    emax = EMAX_ELEM[fmt]
    mx_mul = np.float32(2.0 ** -(1 + emax))  # 2^e (from frexp) * 2^-(1+emax) = 2^(floor(log2 amax) - emax)
    mode_id = MODES.index(mode)
    if mode_id >= 4 and fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' for mode {mode!r} (DeepGEMM's casts divide by 448), got {fmt!r}")
    floor = DEEPGEMM_AMAX_FLOOR if mode_id >= 4 else _AMAX_FLOOR

    @cuda.jit(device=True)
    def group_scale(amax):
        """(scale, inv_scale, e8m0_code) of a group from its amax; NaN scales for a NaN/Inf amax
        (spec.group_scale, the same rule in NumPy)."""
        if not amax <= _F32_FINITE_MAX:  # NaN compares false; +Inf is above the largest float32
            return _F32_NAN, _F32_NAN, E8M0_NAN
        safe = amax if amax > floor else floor
        if mode_id == 0:  # amax / FP8_MAX
            return safe / fp8_max, fp8_max / safe, 0
        if mode_id == 4:  # DeepGEMM as PyTorch computes it: amax * fl32(1/448), then 1 / scale
            s = safe * DEEPGEMM_INV_MAX
            return s, _ONE32 / s, 0
        if mode_id == 2:  # OCP: 2^(floor(log2 amax) - emax_elem)
            m, e = math.frexp(safe)  # safe = m * 2^e, 0.5 <= m < 1, so floor(log2 safe) = e - 1
            s = (safe / m) * mx_mul  # safe / m == 2^e exactly
            return s, _ONE32 / s, int(e) + (126 - emax)
        t = safe * DEEPGEMM_INV_MAX if mode_id == 5 else safe / fp8_max  # modes 1, 3, 5: t rounded up to 2^e
        m, e = math.frexp(t)
        if m == _HALF32:  # t is already a power of two, 2^(e-1)
            return t, _ONE32 / t, int(e) + 126
        s = t / m  # 2^e exactly
        return s, _ONE32 / s, int(e) + 127

    return group_scale


# ----------------------------------------------------------------------------------------------------------------
# x and x.T quantized in 1 x 128 tiles in one pass (DeepSeek-V3 fuses the FP8 cast with the transpose, section
# 3.3.4), from whatever value(a, b, r, c) gives for x[r, c]: x itself (quantize_fine.quantize_tile_dual), or
# a quantity computed there (swiglu's backward: du from u and dh, never written in float32)
# ----------------------------------------------------------------------------------------------------------------

__all__ += ["make_dual_tile_kernel", "DUAL_THREADS", "DUAL_SMEM", "dual_tile_grid"]
DUAL_PAD = GROUP_K + 1  # floats per shared row: a warp reading a column touches 32 different banks
DUAL_SMEM = GROUP_K * DUAL_PAD * 4  # bytes of dynamic shared memory (66,048: over the 48 KiB static limit)
DUAL_THREADS = runtime.block_threads(256)  # 8 warps on a GPU, one under the simulator
_F32_TYPE = runtime.numba_type("float32")
_ZERO32 = np.float32(0.0)


def dual_tile_grid(M: int, N: int) -> tuple[int, int]:
    """The grid of a dual tile kernel for an (M, N) x: a block per 128 x 128 tile."""
    return -(-N // GROUP_K), -(-M // GROUP_K)


def make_dual_tile_kernel(fmt: str, mode: str, value):
    """kernel(a, b, codes, scale, codes_t, scale_t) for one format and scale mode (compiled in): x[r, c] =
    value(a, b, r, c) (a device function) for r < a.shape[0], c < a.shape[1], read once into shared memory (rows
    padded to DUAL_PAD floats), then each row's amax, scale and codes written along the row into codes (M, N) and
    scale (M, ceil(N/128)), and each column's along x.T's row into codes_t (N, M) and scale_t (N, ceil(M/128)),
    all coalesced: spec.quantize of x and of x.T in 1 x 128 tiles, bit for bit. Launch on dual_tile_grid(M, N)
    with DUAL_THREADS threads and DUAL_SMEM bytes of dynamic shared memory."""
    encode = ENCODE_SAT[fmt]
    group_scale = make_group_scale(fmt, mode)
    per_lane = GROUP_K // WARP_SIZE
    PAD = DUAL_PAD
    ZERO = _ZERO32

    @cuda.jit(device=True)
    def line(s, base, step, n, codes, scale, row, col0, scol, lane):
        """One warp quantizes one 1 x 128 line of the shared tile, elements s[base + step * i] (i < 128; past n they
        are the tile's zeros): its amax, scale[row, scol], and codes[row, col0 + i] for i < n."""
        m = ZERO
        for j in range(per_lane):
            m = nanmax(m, abs(s[base + step * (lane + WARP_SIZE * j)]))
        m = warp_max(m)
        sc, inv, _ = group_scale(m)
        for j in range(per_lane):
            i = lane + WARP_SIZE * j
            if i < n:
                codes[row, col0 + i] = POISON_CODE if inv != inv else encode(s[base + step * i] * inv)
        if lane == 0:
            scale[row, scol] = sc

    @cuda.jit
    def dual_kernel(a, b, codes, scale, codes_t, scale_t):
        s = cuda.shared.array(0, _F32_TYPE)
        M, N = a.shape
        r0, c0 = cuda.blockIdx.y * GROUP_K, cuda.blockIdx.x * GROUP_K
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        warps = cuda.blockDim.x // WARP_SIZE
        for r in range(warp, GROUP_K, warps):  # the tile, zeros past the edges (they leave an amax alone)
            for j in range(per_lane):
                c = lane + WARP_SIZE * j
                v = ZERO
                if r0 + r < M and c0 + c < N:
                    v = value(a, b, r0 + r, c0 + c)
                s[r * PAD + c] = v
        cuda.syncthreads()
        for r in range(warp, GROUP_K, warps):  # x's 1 x 128 tiles: a warp per row (warp-uniform test)
            if r0 + r < M:
                line(s, r * PAD, 1, N - c0, codes, scale, r0 + r, c0, cuda.blockIdx.x, lane)
        for c in range(warp, GROUP_K, warps):  # x.T's 1 x 128 tiles: a warp per column of x
            if c0 + c < N:
                line(s, c, PAD, M - r0, codes_t, scale_t, c0 + c, r0, cuda.blockIdx.y, lane)

    return dual_kernel

# ----------------------------------------------------------------------------------------------------------------
# A stable counting sort of small non-negative integer keys on the device (token ids for the embedding's backward,
# expert ids for routed experts' permutation): count the keys per (tile of SORT_TILE keys, key) with integer atomics
# (exact in any order), scan the counts over tiles and then over keys, and place each key's index at its key's start
# + its key's count in earlier tiles + its rank among the earlier keys of its tile: keys in order, and equal keys in
# index order, the same on every run. Launch, with tile_counts zeroed: tile_count_kernel[tiles, SORT_TILE],
# tile_scan_kernel over the keys, offsets_scan_kernel[1, SORT_SCAN_THREADS], place_kernel[tiles, SORT_TILE].
# ----------------------------------------------------------------------------------------------------------------

__all__ += ["SORT_TILE", "SORT_SCAN_THREADS", "tile_count_kernel", "tile_scan_kernel", "block_exclusive_scan",
            "offsets_scan_kernel", "place_kernel", "make_chunk_starts_kernel", "find_run", "zero_rows_kernel"]
SORT_TILE = runtime.block_threads(512)  # keys per counting tile (one thread each)
SORT_SCAN_THREADS = runtime.block_threads(1024)  # the one block that scans the per-key counts


@cuda.jit
def tile_count_kernel(ids, tile_counts):
    """tile_counts[t, v] += 1 for every key of tile t (SORT_TILE keys, one per thread) equal to v."""
    m = cuda.blockIdx.x * SORT_TILE + cuda.threadIdx.x
    if m < ids.size:
        v = ids[m]
        if 0 <= v < tile_counts.shape[1]:
            cuda.atomic.add(tile_counts, (cuda.blockIdx.x, v), 1)  # integer atomics: exact in any order


@cuda.jit
def tile_scan_kernel(tile_counts, offsets):
    """Per id v (one thread each, coalesced across v): tile_counts[:, v] becomes its exclusive scan over tiles (the
    tokens of v in earlier tiles), and offsets[v + 1] the total count of v."""
    v = cuda.grid(1)
    if v < tile_counts.shape[1]:
        run = 0
        for t in range(tile_counts.shape[0]):
            c = tile_counts[t, v]
            tile_counts[t, v] = run
            run += c
        offsets[v + 1] = run


@cuda.jit(device=True)
def block_exclusive_scan(x, buf):
    """Exclusive prefix sum of x over the block (Hillis-Steele in shared memory; buf holds blockDim.x ints)."""
    tid = cuda.threadIdx.x
    buf[tid] = x
    cuda.syncthreads()
    step = 1
    while step < cuda.blockDim.x:
        t = buf[tid - step] if tid >= step else 0
        cuda.syncthreads()  # every read of this step before any write
        buf[tid] += t
        cuda.syncthreads()
        step *= 2
    out = buf[tid] - x
    cuda.syncthreads()  # buf may be reused right after
    return out


@cuda.jit
def zero_rows_kernel(a):
    """a (R, C) set to 0 (any numeric dtype): a block per row, grid-stride, threads along the row."""
    r = cuda.blockIdx.x
    while r < a.shape[0]:
        for c in range(cuda.threadIdx.x, a.shape[1], cuda.blockDim.x):
            a[r, c] = 0
        r += cuda.gridDim.x


@cuda.jit
def offsets_scan_kernel(offsets):
    """One block: offsets[1:] holds the count of each id; it becomes offsets[v] = the first slot of id v in the
    sorted order, offsets[V] = the number of placed tokens. Each thread scans a contiguous segment of ids."""
    buf = cuda.shared.array(SORT_SCAN_THREADS, np.int32)
    vocab = offsets.size - 1
    tid = cuda.threadIdx.x
    seg = (vocab + cuda.blockDim.x - 1) // cuda.blockDim.x
    lo = min(tid * seg, vocab)
    hi = min(lo + seg, vocab)
    s = 0
    for v in range(lo, hi):
        s += offsets[v + 1]
    run = block_exclusive_scan(s, buf)  # its syncthreads order these reads before the writes below
    for v in range(lo, hi):
        run += offsets[v + 1]
        offsets[v + 1] = run
    if tid == 0:
        offsets[0] = 0


def make_chunk_starts_kernel(chunk: int, rows: int):
    """starts_kernel(offsets, starts), one block of SORT_SCAN_THREADS: key v's sorted run offsets[v] ..
    offsets[v + 1] cut into ceil(count / chunk) chunks of `rows` rows each; starts[v] = the first row of key v's
    chunks (an exclusive scan), starts[V] = the rows in all. The embedding's segments (chunk = SEGMENT, rows = 1:
    segment indices) and routed experts' groups (chunk = rows = 128: each expert's tokens padded to 128 rows)."""

    @cuda.jit
    def starts_kernel(offsets, starts):
        buf = cuda.shared.array(SORT_SCAN_THREADS, np.int32)
        keys = offsets.size - 1
        tid = cuda.threadIdx.x
        seg = (keys + cuda.blockDim.x - 1) // cuda.blockDim.x
        lo = min(tid * seg, keys)
        hi = min(lo + seg, keys)
        s = 0
        for v in range(lo, hi):
            s += (offsets[v + 1] - offsets[v] + chunk - 1) // chunk * rows
        run = block_exclusive_scan(s, buf)
        for v in range(lo, hi):
            starts[v] = run
            run += (offsets[v + 1] - offsets[v] + chunk - 1) // chunk * rows
        if tid == cuda.blockDim.x - 1:  # the last thread's running sum ends at the total
            starts[keys] = run

    return starts_kernel


@cuda.jit(device=True)
def find_run(starts, keys, s):
    """The key v whose rows hold row s: starts[v] <= s < starts[v + 1], for nondecreasing starts with starts[0] <=
    s < starts[keys] (keys with no rows are skipped). A binary search; every thread of a block may run it."""
    lo, hi = 0, keys
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= s:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit
def place_kernel(ids, tile_counts, offsets, order):
    """order[slot] = m, with slot = the start of id v + v's tokens in earlier tiles + its rank among the earlier
    tokens of this tile with id v: a stable counting sort (equal ids keep token order)."""
    tile_ids = cuda.shared.array(SORT_TILE, np.int32)
    tid = cuda.threadIdx.x
    m = cuda.blockIdx.x * SORT_TILE + tid
    v = -1
    if m < ids.size:
        v = ids[m]
        if not (0 <= v < tile_counts.shape[1]):
            v = -1  # skipped, and never equal to a real id below
    tile_ids[tid] = v
    cuda.syncthreads()
    if v >= 0:
        rank = 0
        for j in range(tid):  # every thread reads the same address: a broadcast, no bank conflict
            if tile_ids[j] == v:
                rank += 1
        order[offsets[v] + tile_counts[cuda.blockIdx.x, v] + rank] = m


# ----------------------------------------------------------------------------------------------------------------
# bfloat16 (1 sign, 8 exponent, 7 mantissa bits: the top half of a float32), for the bf16 recipe's GEMM inputs and
# AdamW's bfloat16 moments. Integer arithmetic on the float32 bits (ptx.f32_as_u32 / u32_as_f32, mov.b32), exactly
# formats.round_bf16's, so the same bits come out on a GPU, in the simulator and in NumPy; the simulator has no
# bfloat16 type, so arrays of bfloat16 hold the 16-bit patterns as uint16.
# ----------------------------------------------------------------------------------------------------------------

__all__ += ["round_bf16_bits", "round_bf16", "bf16_load", "bf16_store_bits"]

_U32_ABS = np.uint32(0x7FFFFFFF)
_U32_INF = np.uint32(0x7F800000)  # float32 bits above this (sign cleared) are NaNs
_U32_HALF_ULP_DOWN = np.uint32(0x7FFF)  # just under half a bfloat16 ulp, in float32 bits
_U32_HIGH16 = np.uint32(0xFFFF0000)
_U32_1 = np.uint32(1)
_U32_16 = np.uint32(16)
_U32_BF16_QUIET = np.uint32(0x0040)  # a bfloat16 NaN's quiet bit (float32 bit 22)


@cuda.jit(device=True)
def _bf16_round_u32(u):
    """float32 bits u (not a NaN) rounded to the nearest bfloat16, ties to even: add 0x7FFF plus the lowest kept
    bit, drop the low 16 bits. A carry into the exponent is right (the next binade); past the largest bfloat16 it
    gives Inf, as cvt.rn.bf16.f32 does. No uint32 overflow: non-NaN bits are at most 0xFF800000 (-Inf)."""
    return np.uint32((u + _U32_HALF_ULP_DOWN + ((u >> _U32_16) & _U32_1)) & _U32_HIGH16)


@cuda.jit(device=True)
def round_bf16_bits(x):
    """uint32: the float32 bits of x rounded to the nearest bfloat16 (ties to even), bit for bit
    formats.round_bf16(x).view(np.uint32): overflow goes to +-Inf, -0.0 and subnormals round like any value, and
    a NaN comes back as its own bits (it stays NaN; its low 16 bits may be set, see bf16_store_bits)."""
    u = ptx.f32_as_u32(x)
    if (u & _U32_ABS) > _U32_INF:
        return u
    return _bf16_round_u32(u)


@cuda.jit(device=True)
def round_bf16(x):
    """float32 x rounded to the nearest bfloat16, as float32: formats.round_bf16 on the device."""
    return ptx.u32_as_f32(round_bf16_bits(x))


@cuda.jit(device=True)
def bf16_load(bits):
    """float32 value of a bfloat16 held as 16 bits (a uint16 array element): exact, the bits moved up by 16."""
    return ptx.u32_as_f32(np.uint32(bits) << _U32_16)


@cuda.jit(device=True)
def bf16_store_bits(x):
    """uint16: the bfloat16 bits of float32 x rounded to nearest, ties to even (bf16_load of it is round_bf16(x)).
    A NaN keeps its sign and top payload bits with the quiet bit set: its float32 payload may sit in the low 16
    bits alone (0x7F800001), whose top half alone would read as Inf."""
    u = ptx.f32_as_u32(x)
    if (u & _U32_ABS) > _U32_INF:
        return np.uint16((u >> _U32_16) | _U32_BF16_QUIET)
    return np.uint16(_bf16_round_u32(u) >> _U32_16)


# ----------------------------------------------------------------------------------------------------------------
# wgmma staging: the swizzled shared tiles wgmma reads, and its accumulators stored
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def copy16(s, dst, x, r, k, rows, K, vec):
    """Stage the 16 bytes x[r, k:k+16] (x a uint8 matrix, K its row length in bytes) at s[dst:dst+16], zeros past
    the matrix: one cp.async when the rows are 16-byte aligned (vec), else byte loads and stores (then completed at
    once)."""
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
def load_swizzled_tile(s, off, x, r0, k0, rows, K, vec, tid):
    """x[r0 : r0 + 128, k0 : k0 + 128] (bytes) -> a 128-byte-swizzled tile at s[off:] (rows of 128 bytes, the
    16-byte chunk ch of row r stored at chunk ch ^ (r % 8)): 1024 copies of 16 bytes, 4 per thread of 256. Thread
    tid always copies chunk tid % 8 of rows tid // 8 + 32 h (h = 0..3): its shared offsets are the same in every
    stage."""
    r = tid // 8
    ch = tid % 8
    dst = off + r * 128 + (ch ^ (r % 8)) * 16
    for h in range(4):
        copy16(s, dst + h * 32 * 128, x, r0 + r + 32 * h, k0 + ch * 16, rows, K, vec)


def make_store_wgmma(n: int, add: bool = False):
    """A device function store(c, acc, row0, n0, t4, M, N): this thread's n / 2 outputs of an m64nN wgmma tile
    (rows row0 and row0 + 8, registers 4j + 0, 1 and 4j + 2, 3; columns n0 + 8j + 2 t4 + (0, 1): ptx.wgmma_d_layout)
    written to c, edges masked. n is compiled in, so the loops unroll and acc stays in registers.
    add=True: store(c, acc, row0, n0, t4, M, N, r), the epilogue with a residual: c = r + acc, r (M, N) float32
    read at the outputs written and nowhere else (r may be c itself: c += acc). The add comes after the sum, so c
    holds the bits of a separate elementwise add of r and the stored acc."""
    if add:
        @cuda.jit(device=True)
        def store_add(c, acc, row0, n0, t4, M, N, r):
            for j in range(n // 8):
                for i in range(4):
                    row = row0 + 8 * (i // 2)
                    col = n0 + 8 * j + 2 * t4 + i % 2
                    if row < M and col < N:
                        c[row, col] = r[row, col] + acc[4 * j + i]

        return store_add

    @cuda.jit(device=True)
    def store(c, acc, row0, n0, t4, M, N):
        for j in range(n // 8):
            for i in range(4):
                row = row0 + 8 * (i // 2)
                col = n0 + 8 * j + 2 * t4 + i % 2
                if row < M and col < N:
                    c[row, col] = acc[4 * j + i]

    return store
