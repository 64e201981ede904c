"""Fine-grained FP8 quantization: one scale per row, per 1x128 tile, per 128x128 block, per MX group of 32.

x is float32 (M, K), C-contiguous. A "group" is the set of elements that share one scale:

| granularity | group                 | scale shape                 | used by                                |
|-------------|-----------------------|-----------------------------|----------------------------------------|
| row         | 1 x K                 | (M, 1)                      | torchao ROWWISE, per-token activations |
| tile        | 1 x block (along K)   | (M, ceil(K/block))          | DeepSeek-V3 activations (block = 128)  |
| block       | block x block         | (ceil(M/block), ceil(K/block)) | DeepSeek-V3 weights (block = 128)   |
| mx          | 1 x 32 (along K)      | (M, ceil(K/32)), E8M0 codes | OCP MX (MXFP8)                         |

version 1: tile, two passes: a warp per tile writes scale and inv_scale to global memory, then a cast kernel
           reads x again.
version 2: tile, fused: one warp per 1x128 tile, 4 elements a lane in registers, warp_max, cast, codes and scale
           written (x read once).
version 3: tile, fused and vectorized: 8 lanes per tile, 16-byte loads, the hardware cvt, 4-byte stores; where it
           does not apply (`vector_ok`: K % 4 != 0, misaligned rows, a group not a multiple of 32 up to 512)
           quantize_tile runs version 2, the same codes bit for bit. BEST.
The other kernels (one version each): row (a block per row), block (a block per block x block tile), mx (the tile
kernel with groups of 32 and E8M0 scales), dequantize (any granularity), requantize_tile_to_col (1 x block tiles
of x -> 1 x block tiles of x.T, from the codes and scales).

Scales and policies (scale modes "amax", "pow2", "mx_floor", "mx_ceil"; partial, all-zero and NaN/Inf groups)
are those of fp8lab/numerics/spec.py, whose NumPy functions are the reference every kernel here matches bit for bit;
`make_group_scale` is the same rule as a device function. A NaN that was in a tile poisons every 128 x 1 column
group of requantize it reaches.

Run `python -m fp8lab.kernels.quantize_fine` to check every kernel against the reference and time it. How each
kernel moves its bytes, and why: docs/notes/quantize_fine.md.
TIP: a kernel that fails only on the GPU: run it under the simulator (FP8LAB_BACKEND=sim), where `print` and
pdb work inside kernels; keep the shape small.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .. import bench
from ..device import runtime
from ..numerics import spec
from ..bench import timing
from ..device.runtime import FULL_MASK, MAX_BLOCKS, WARP_SIZE, cuda, shfl_xor_sync
from ..numerics.spec import AMAX_FLOOR, E8M0_NAN, EMAX_ELEM, FP8_MAX, MODES, MX_GROUP, POISON_CODE
from ..device.ptx import ld_global_v4_f32
from .common import CVT_X2, DECODE, ENCODE_SAT, block_max, nanmax, vec_ok, warp_max
from .versions import Version

THREADS = runtime.block_threads(256)  # row / block kernels: threads per block (one warp under the simulator)
WARPS_PER_BLOCK = 4 if not runtime.IS_SIM else 1  # tile / mx kernels: one warp per tile
ELEMENTWISE_THREADS = runtime.block_threads(256)
if runtime.IS_SIM:  # version 3's NaN/Inf flag (x * 0) on NumPy scalars: the NaN is the point, not a problem
    warnings.filterwarnings("ignore", message="invalid value encountered in scalar multiply",
                            category=RuntimeWarning, module=__name__)
LANES3 = 8  # version 3: lanes per group (tile or MX group)
GROUPS3 = WARP_SIZE // LANES3  # version 3: groups per warp
MAX_GROUP3 = 512  # version 3: largest group (16 float4 per lane, kept in registers)
WARPS3 = 4  # version 3: warps per block

_F32_MAX = np.float32(np.finfo(np.float32).max)
_F32_NAN = np.float32(np.nan)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_ZERO = np.float32(0.0)


def make_group_scale(fmt: str, mode: str):
    """The scale rule of one group (spec.group_scale) as a device function, one per (fmt, mode)."""
    fp8_max = FP8_MAX[fmt]
    emax = EMAX_ELEM[fmt]
    mx_mul = np.float32(2.0 ** -(1 + emax))  # 2^e (from frexp) * 2^-(1+emax) = 2^(floor(log2 amax) - emax)
    mode_id = MODES.index(mode)

    @cuda.jit(device=True)
    def group_scale(amax):
        """(scale, inv_scale, e8m0_code) of a group from its amax; NaN scales for a NaN/Inf amax
        (spec.group_scale, the same rule in NumPy)."""
        if not amax <= _F32_MAX:  # NaN compares false; +Inf is above the largest float32
            return _F32_NAN, _F32_NAN, E8M0_NAN
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        if mode_id == 0:  # amax / FP8_MAX
            return safe / fp8_max, fp8_max / safe, 0
        if mode_id == 2:  # OCP: 2^(floor(log2 amax) - emax_elem)
            m, e = math.frexp(safe)  # safe = m * 2^e, 0.5 <= m < 1, so floor(log2 safe) = e - 1
            s = (safe / m) * mx_mul  # safe / m == 2^e exactly
            return s, _ONE / s, int(e) + (126 - emax)
        t = safe / fp8_max  # modes 1 and 3: round t up to a power of two
        m, e = math.frexp(t)
        if m == _HALF:  # t is already a power of two, 2^(e-1)
            return t, _ONE / t, int(e) + 126
        s = t / m  # 2^e exactly
        return s, _ONE / s, int(e) + 127

    return group_scale


# ----------------------------------------------------------------------------------------------------------------
# Kernels (built per (fmt, group size, mode): the group size sizes local and shared arrays, so it is a constant)
# ----------------------------------------------------------------------------------------------------------------


def make_tile_kernels(fmt: str, gk: int, mode: str):
    encode = ENCODE_SAT[fmt]
    group_scale = make_group_scale(fmt, mode)
    per_lane = (gk + WARP_SIZE - 1) // WARP_SIZE  # 4 for 1x128 tiles, 1 for MX groups of 32
    write_codes = mode in ("mx_floor", "mx_ceil")

    @cuda.jit
    def tile_amax_kernel1(x, scale, inv_scale, scale_codes):
        """v1 pass 1: one warp per 1 x gk tile, amax -> scale and inv_scale in global memory."""
        K = x.shape[1]
        ntk = scale.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        w = cuda.grid(1) // WARP_SIZE
        while w < scale.size:  # warp-uniform loop: every lane reaches every shuffle
            r = w // ntk
            t = w % ntk
            k0 = t * gk
            m = _ZERO
            for j in range(per_lane):
                c = k0 + lane + WARP_SIZE * j  # lanes read consecutive addresses: coalesced
                if lane + WARP_SIZE * j < gk and c < K:
                    m = nanmax(m, abs(x[r, c]))
            m = warp_max(m)
            s, inv, code = group_scale(m)
            if lane == 0:
                scale[r, t] = s
                inv_scale[r, t] = inv
                if write_codes:
                    scale_codes[r, t] = code
            w += cuda.gridsize(1) // WARP_SIZE

    @cuda.jit
    def tile_cast_kernel1(x, inv_scale, codes):
        """v1 pass 2: elementwise; reads x a second time and its tile's inv_scale from global memory."""
        K = x.shape[1]
        i = cuda.grid(1)
        while i < x.size:
            r = i // K
            c = i % K
            inv = inv_scale[r, c // gk]
            codes[r, c] = POISON_CODE if inv != inv else encode(x[r, c] * inv)
            i += cuda.gridsize(1)

    @cuda.jit
    def tile_fused_kernel2(x, codes, scale, scale_codes):
        """v2: one warp per tile, x read once into registers, amax by shuffles, cast, write codes and scale."""
        vals = cuda.local.array(per_lane, np.float32)
        K = x.shape[1]
        ntk = scale.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        w = cuda.grid(1) // WARP_SIZE
        while w < scale.size:
            r = w // ntk
            t = w % ntk
            k0 = t * gk
            m = _ZERO
            for j in range(per_lane):
                c = k0 + lane + WARP_SIZE * j
                v = _ZERO
                if lane + WARP_SIZE * j < gk and c < K:
                    v = x[r, c]
                vals[j] = v  # out-of-range slots hold 0: they leave the amax alone
                m = nanmax(m, abs(v))
            m = warp_max(m)
            s, inv, code = group_scale(m)
            for j in range(per_lane):
                c = k0 + lane + WARP_SIZE * j
                if lane + WARP_SIZE * j < gk and c < K:
                    codes[r, c] = POISON_CODE if inv != inv else encode(vals[j] * inv)
            if lane == 0:
                scale[r, t] = s
                if write_codes:
                    scale_codes[r, t] = code
            w += cuda.gridsize(1) // WARP_SIZE

    return tile_amax_kernel1, tile_cast_kernel1, tile_fused_kernel2


def make_tile_kernel3(fmt: str, gk: int, mode: str):
    cvt_x2 = CVT_X2[fmt]
    group_scale = make_group_scale(fmt, mode)
    vpl = gk // (4 * LANES3)  # float4 loads per lane per group (4 for a 1 x 128 tile, 1 for an MX group of 32)
    nvals = vpl * 4
    poison4 = np.uint32(POISON_CODE * 0x01010101)
    write_codes = mode in ("mx_floor", "mx_ceil")

    def tile_fused_kernel3(x, codes4, scale, scale_codes):
        """v3: LANES3 = 8 lanes per group, 16-byte loads, the hardware cvt, 4-byte stores.

        A warp takes GROUPS3 = 4 neighbouring groups of one row, 8 lanes each; lane l of a group owns its float4s
        l, l + 8, l + 16, ..., all loaded before the first shuffle. codes4 is codes viewed as uint32 (M, K/4).
        One unsigned 32-bit division per step finds the row (docs/notes/quantize_fine.md).
        """
        vals = cuda.local.array(nvals, np.float32)
        M, K = x.shape
        ntk = scale.shape[1]
        nsets = np.uint32((ntk + GROUPS3 - 1) // GROUPS3)  # sets of 4 groups per row
        lane = cuda.threadIdx.x % WARP_SIZE
        sub = lane // LANES3  # which of the warp's 4 groups
        gl = lane % LANES3  # lane within the group
        w = np.uint32(cuda.grid(1) // WARP_SIZE)
        nw = np.uint32(cuda.gridsize(1) // WARP_SIZE)
        total = np.uint32(M) * nsets
        while w < total:  # warp-uniform loop: every lane reaches every shuffle
            r = w // nsets
            tk = (w - r * nsets) * GROUPS3 + sub
            k0 = tk * gk
            for q in range(vpl):
                c = k0 + (q * LANES3 + gl) * 4
                v0 = _ZERO
                v1 = _ZERO
                v2 = _ZERO
                v3 = _ZERO
                if tk < ntk and c < K:  # K % 4 == 0: all four elements exist
                    v0, v1, v2, v3 = ld_global_v4_f32(x, r, c)
                vals[4 * q] = v0
                vals[4 * q + 1] = v1
                vals[4 * q + 2] = v2
                vals[4 * q + 3] = v3
            m = _ZERO
            z = _ZERO  # stays 0 unless an element is NaN or +-Inf: then NaN (x * 0), which poisons the group
            for j in range(nvals):
                m = max(m, abs(vals[j]))  # a plain max (2 instructions per element instead of nanmax's 6)
                z += vals[j] * _ZERO
            m += z
            off = LANES3 // 2
            while off > 0:  # xor partners stay inside the lane's group of 8
                m = nanmax(m, shfl_xor_sync(FULL_MASK, m, off))
                off //= 2
            s, inv, code = group_scale(m)
            if tk < ntk:
                for q in range(vpl):
                    c = k0 + (q * LANES3 + gl) * 4
                    if c < K:
                        word = poison4
                        if inv == inv:
                            lo = cvt_x2(vals[4 * q + 1] * inv, vals[4 * q] * inv)  # element c in the low byte
                            hi = cvt_x2(vals[4 * q + 3] * inv, vals[4 * q + 2] * inv)
                            word = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))
                        codes4[r, c // 4] = word  # little-endian: byte c % 4 of the word is element c
                if gl == 0:
                    scale[r, tk] = s
                    if write_codes:
                        scale_codes[r, tk] = code
            w += nw

    return cuda.jit(tile_fused_kernel3)


def make_row_kernel(fmt: str, mode: str):
    encode = ENCODE_SAT[fmt]
    group_scale = make_group_scale(fmt, mode)

    @cuda.jit
    def row_kernel(x, codes, scale):
        """One block per row (grid-stride): block_max over the row, then cast it."""
        slots = cuda.shared.array(32, np.float32)
        M, K = x.shape
        r = cuda.blockIdx.x
        while r < M:
            m = _ZERO
            c = cuda.threadIdx.x
            while c < K:
                m = nanmax(m, abs(x[r, c]))
                c += cuda.blockDim.x
            m = block_max(m, slots)  # every thread gets the row's amax
            s, inv, _ = group_scale(m)
            if cuda.threadIdx.x == 0:
                scale[r, 0] = s
            c = cuda.threadIdx.x
            while c < K:
                codes[r, c] = POISON_CODE if inv != inv else encode(x[r, c] * inv)
                c += cuda.blockDim.x
            r += cuda.gridDim.x

    return row_kernel


def make_block_kernel(fmt: str, g: int, mode: str):
    encode = ENCODE_SAT[fmt]
    group_scale = make_group_scale(fmt, mode)

    @cuda.jit
    def block_kernel(x, codes, scale):
        """One thread block per g x g tile: warp w takes rows w, w + nwarps, ...; lanes take columns."""
        slots = cuda.shared.array(32, np.float32)
        M, K = x.shape
        nbk = scale.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        warp = cuda.threadIdx.x // WARP_SIZE
        nwarps = cuda.blockDim.x // WARP_SIZE
        b = cuda.blockIdx.x
        while b < scale.size:
            r0 = (b // nbk) * g
            c0 = (b % nbk) * g
            r1 = min(r0 + g, M)
            c1 = min(c0 + g, K)
            m = _ZERO
            r = r0 + warp
            while r < r1:
                c = c0 + lane
                while c < c1:
                    m = nanmax(m, abs(x[r, c]))
                    c += WARP_SIZE
                r += nwarps
            m = block_max(m, slots)
            s, inv, _ = group_scale(m)
            if cuda.threadIdx.x == 0:
                scale[b // nbk, b % nbk] = s
            r = r0 + warp
            while r < r1:
                c = c0 + lane
                while c < c1:
                    codes[r, c] = POISON_CODE if inv != inv else encode(x[r, c] * inv)
                    c += WARP_SIZE
                r += nwarps
            b += cuda.gridDim.x

    return block_kernel


def make_dequantize_kernel(fmt: str):
    decode = DECODE[fmt]

    @cuda.jit
    def dequantize_kernel(codes, scale, gm, gk, out):
        """out[r, c] = decode(codes[r, c]) * scale[r // gm, c // gk] (float32), any granularity."""
        K = codes.shape[1]
        i = cuda.grid(1)
        while i < codes.size:
            r = i // K
            c = i % K
            out[r, c] = decode(codes[r, c]) * scale[r // gm, c // gk]
            i += cuda.gridsize(1)

    return dequantize_kernel


def make_requantize_kernel(fmt: str, g: int, mode: str):
    encode = ENCODE_SAT[fmt]
    decode = DECODE[fmt]
    group_scale = make_group_scale(fmt, mode)
    pitch = g + 4  # one padding word per row of the shared tile: lanes write different banks (see below)

    @cuda.jit
    def requantize_kernel(codes, scale, codes_t, scale_t):
        """Block of 32 threads = 32 columns k0..k0+31 x g rows m0..m0+g-1 of the (M, K) codes. Thread `lane`
        decodes column k0 + lane in registers (reading the bytes twice rather than keeping float32), finds their
        amax, re-encodes them into a shared tile [32][g+4] (row = column of x), which the block writes to codes_t
        row by row: reads and writes coalesced. The padding keeps tile[lane, i] off a single bank."""
        tile = cuda.shared.array((32, pitch), np.uint8)
        M, K = codes.shape
        ntm = scale_t.shape[1]
        nkb = (K + 31) // 32
        lane = cuda.threadIdx.x
        b = cuda.blockIdx.x
        while b < nkb * ntm:
            k0 = (b % nkb) * 32
            mt = b // nkb
            m0 = mt * g
            m1 = min(m0 + g, M)
            k = k0 + lane
            if k < K:
                kt = k // g
                m = _ZERO
                for r in range(m0, m1):  # lanes read consecutive bytes of row r: coalesced
                    m = nanmax(m, abs(decode(codes[r, k]) * scale[r, kt]))
                s, inv, _ = group_scale(m)
                scale_t[k, mt] = s
                for r in range(m0, m1):
                    v = decode(codes[r, k]) * scale[r, kt]
                    tile[lane, r - m0] = POISON_CODE if inv != inv else encode(v * inv)
            cuda.syncthreads()
            for kk in range(32):  # row kk of the tile -> codes_t[k0 + kk, m0:m1]
                if k0 + kk < K:
                    i = lane
                    while m0 + i < m1:
                        codes_t[k0 + kk, m0 + i] = tile[kk, i]
                        i += 32
            cuda.syncthreads()  # the tile is reused by the next iteration
            b += cuda.gridDim.x

    return requantize_kernel


def tile_kernels(fmt: str, gk: int, mode: str):
    """(tile_amax_kernel1, tile_cast_kernel1, tile_fused_kernel2) for (fmt, gk, mode), built once (runtime.cached)."""
    return runtime.cached(("quantize_fine.tile", fmt, gk, mode), lambda: make_tile_kernels(fmt, gk, mode))


# ----------------------------------------------------------------------------------------------------------------
# Launchers: device arrays in, device arrays out (the caller allocates; quant.py does it for the public API)
# ----------------------------------------------------------------------------------------------------------------


def _warp_grid(ngroups: int) -> tuple[int, int]:
    threads = WARPS_PER_BLOCK * WARP_SIZE
    return min(MAX_BLOCKS, -(-ngroups // WARPS_PER_BLOCK)), threads


def vector_ok(x, codes, block: int) -> bool:
    """Can version 3 run: block a multiple of 32 up to 512, rows of x readable as aligned float4 and rows of codes
    writable as aligned uint32 (both C-contiguous, K a multiple of 4, x 16-byte and codes 4-byte aligned)."""
    if block % (4 * LANES3) or block > MAX_GROUP3:
        return False
    return bool(vec_ok(x, 16) and vec_ok(codes, 4))


def launch_tile1(x, codes, scale, fmt, block, mode, scale_codes, inv_scale) -> None:
    """Version 1: the amax kernel writes scale and inv_scale (scratch, allocated when None), the cast reads x again."""
    amax_k, cast_k, _ = tile_kernels(fmt, block, mode)
    if inv_scale is None:
        inv_scale = cuda.device_array(scale.shape, np.float32)
    amax_k[_warp_grid(scale.size)](x, scale, inv_scale, scale_codes)
    cast_k[runtime.grid_1d(x.size, ELEMENTWISE_THREADS, MAX_BLOCKS)](x, inv_scale, codes)


def launch_tile2(x, codes, scale, fmt, block, mode, scale_codes, inv_scale) -> None:
    """Version 2: one warp per group (inv_scale unused)."""
    tile_kernels(fmt, block, mode)[2][_warp_grid(scale.size)](x, codes, scale, scale_codes)


def launch_tile3(x, codes, scale, fmt, block, mode, scale_codes, inv_scale) -> None:
    """Version 3 where `vector_ok` (inv_scale unused): 4 groups a warp, grid-stride over the (row, 4 groups) sets."""
    kernel = runtime.cached(("quantize_fine.tile3", fmt, block, mode), lambda: make_tile_kernel3(fmt, block, mode))
    warps = WARPS3 if not runtime.IS_SIM else 1
    sets = scale.shape[0] * -(-scale.shape[1] // GROUPS3)
    if sets >= 2**32 - MAX_BLOCKS * warps:  # w + nw must not wrap around in uint32
        raise ValueError(f"x has too many groups for quantize_tile version 3 ({sets} sets); use version=2")
    kernel[min(MAX_BLOCKS, -(-sets // warps)), warps * WARP_SIZE](x, codes.view(np.uint32), scale, scale_codes)


VERSIONS = {
    1: Version("tile: two passes (amax kernel -> global scales, cast kernel)", launch_tile1),
    2: Version("tile: fused, one warp per 1x128 tile", launch_tile2),
    3: Version("tile: fused, 8 lanes per tile, 16-byte loads, hardware cvt, 4-byte stores", launch_tile3),
}
BEST = 3
"""quantize_tile's default; it falls back to version 2 where version 3 does not apply (`vector_ok`)."""


def quantize_tile(x, codes, scale, *, fmt="e4m3", block=128, mode="amax", version=BEST, inv_scale=None,
                  scale_codes=None):
    """x (M, K) float32 -> codes (M, K) uint8 and scale (M, ceil(K/block)) float32 (device arrays).

    version 1 needs `inv_scale` (scratch, shape of scale) or allocates one. Version 3 runs where `vector_ok`
    says it can, else version 2 (same codes, bit for bit). scale_codes: (shape of scale) uint8, written for MX
    modes only.
    """
    if version == 3 and not vector_ok(x, codes, block):
        version = 2
    if version not in tuple(VERSIONS):  # compared, not hashed, as a chain of == would
        raise ValueError(f"version must be one of {tuple(VERSIONS)}, got {version!r}")
    if scale_codes is None:
        scale_codes = runtime.unused_array(np.uint8)  # unused unless an MX mode
    VERSIONS[version].kernel(x, codes, scale, fmt, block, mode, scale_codes, inv_scale)


def quantize_mx(x, codes, scale, scale_codes, *, fmt="e4m3", rule="floor"):
    """x (M, K) -> codes, scale (M, ceil(K/32)) float32 powers of two, scale_codes (same shape) E8M0."""
    quantize_tile(x, codes, scale, fmt=fmt, block=MX_GROUP, mode="mx_" + rule, version=BEST,
                  scale_codes=scale_codes)


def quantize_row(x, codes, scale, *, fmt="e4m3", mode="amax"):
    """x (M, K) -> codes (M, K), scale (M, 1)."""
    kernel = runtime.cached(("quantize_fine.row", fmt, mode), lambda: make_row_kernel(fmt, mode))
    kernel[min(MAX_BLOCKS, x.shape[0]), THREADS](x, codes, scale)


def quantize_block(x, codes, scale, *, fmt="e4m3", block=128, mode="amax"):
    """x (M, K) -> codes (M, K), scale (ceil(M/block), ceil(K/block))."""
    kernel = runtime.cached(("quantize_fine.block", fmt, block, mode), lambda: make_block_kernel(fmt, block, mode))
    kernel[min(MAX_BLOCKS, scale.size), THREADS](x, codes, scale)


def dequantize(codes, scale, gm: int, gk: int, out, *, fmt="e4m3") -> None:
    """out (M, K) float32 = decode(codes) * scale[r // gm, c // gk] (device arrays)."""
    kernel = runtime.cached(("quantize_fine.dequantize", fmt), lambda: make_dequantize_kernel(fmt))
    kernel[runtime.grid_1d(codes.size, ELEMENTWISE_THREADS, MAX_BLOCKS)](codes, scale, gm, gk, out)


def requantize_tile_to_col(codes, scale, codes_t, scale_t, *, fmt="e4m3", block=128, mode="amax") -> None:
    """1 x block tiles of x (M, K) -> block x 1 tiles, stored as x.T (K, M) with 1 x block tiles.

    codes (M, K) uint8 and scale (M, ceil(K/block)): a tile-quantized x. Writes codes_t (K, M) uint8, the codes
    of x.T, row-major, and scale_t (K, ceil(M/block)): scale_t[k, j] is the scale of x[j*block:(j+1)*block, k],
    i.e. codes_t and scale_t ARE a tile-quantized x.T (granularity "tile"), the K-major layout a Wgrad GEMM
    (dW = dY.T @ X) needs for its reduction over tokens. The dequantized values live only in registers; no
    float32 copy of x is ever written to global memory.
    """
    kernel = runtime.cached(("quantize_fine.requantize", fmt, block, mode),
                            lambda: make_requantize_kernel(fmt, block, mode))
    M, K = codes.shape
    nblocks = -(-K // 32) * -(-M // block)
    kernel[min(MAX_BLOCKS, nblocks), 32](codes, scale, codes_t, scale_t)


reference = spec.quantize
"""The spec: (codes, scale, scale_codes) of x for a granularity, bit for bit what the kernels write."""


# ----------------------------------------------------------------------------------------------------------------
# Check, then time (bench.main)
# ----------------------------------------------------------------------------------------------------------------


CHECK_SHAPE = {"sim": (6, 300), "gpu": (1027, 7172)}
"""x for the bit-exact checks: no side a multiple of 128, K a multiple of 4 (so version 3 runs)."""
BENCH_SHAPE = (40960, 7168)
"""x for the timings on a GPU: 40960 tokens x DeepSeek-V3's hidden size 7168, float32 = 1.09 GiB."""


def torch_tile_quantize(torch, tx):
    """PyTorch's 1x128 tile quantize (DeepGEMM's per_token_cast_to_fp8, with our AMAX_FLOOR): (codes, scale). Both
    divisions by 448 go through a 0-dim tensor on the GPU, as real divisions (docs/notes/quantize_fine.md says why).
    """
    M, K = tx.shape
    xv = tx.view(M, K // 128, 128)
    amax = xv.abs().amax(dim=2, keepdim=True).clamp(min=float(AMAX_FLOOR))
    fp8_max = torch.full((), FP8_MAX["e4m3"], device=tx.device)
    codes = (xv * (fp8_max / amax)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn).view(M, K)
    return codes, (amax / fp8_max).view(M, K // 128)


def _activation(rng, shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    x[rng.random(shape) < 0.01] *= 50  # a few outliers, like LLM activations
    return x


def _outs(granularity, shape, mx=False):
    sh = spec.scale_shape(granularity, shape)
    return (cuda.device_array(shape, np.uint8), cuda.device_array(sh, np.float32),
            cuda.device_array(sh, np.uint8) if mx else None)


def _kernels(only=None):
    """(label, granularity, mode, launch(dx, outs)) of every kernel the module checks and times: the versions and
    the ops "row", "block", "mx" (both rules), "pow2" that are in `only` (bench.selected; None: all)."""
    ks = [(v, f"v{v}: {desc}", "tile", "amax", lambda dx, o, v=v: quantize_tile(dx, o[0], o[1], version=v))
          for v, desc in VERSIONS.items()]
    ks += [("row", "row: block per row, fused", "row", "amax", lambda dx, o: quantize_row(dx, o[0], o[1])),
           ("block", "block 128x128: block per tile, fused", "block", "amax",
            lambda dx, o: quantize_block(dx, o[0], o[1]))]
    ks += [("mx", f"mx ({rule}): E8M0 scales", "mx", f"mx_{rule}",
            lambda dx, o, rule=rule: quantize_mx(dx, o[0], o[1], o[2], rule=rule)) for rule in ("floor", "ceil")]
    ks += [("pow2", f"tile, pow2 scales (v{BEST})", "tile", "pow2",
            lambda dx, o: quantize_tile(dx, o[0], o[1], mode="pow2"))]
    return [k[1:] for k in ks if bench.selected(only, k[0])]


def checks(rng, only=None) -> list:
    """Every kernel bit for bit against the spec on CHECK_SHAPE, outputs poisoned. only: the versions and ops
    (those of `_kernels`, "dequantize", "requantize") to check (bench.selected); None: all."""
    M, K = CHECK_SHAPE["sim" if runtime.IS_SIM else "gpu"]
    x = _activation(rng, (M, K))
    dx = cuda.to_device(x)
    out = []
    for label, granularity, mode, launch in _kernels(only):
        o = _outs(granularity, x.shape, mx=granularity == "mx")
        o[0].copy_to_device(np.full(x.shape, 0xA5, np.uint8))
        o[1].copy_to_device(np.full(o[1].shape, np.nan, np.float32))
        launch(dx, o)
        ref_codes, ref_scale, ref_scodes = reference(x, granularity, mode=mode)
        bench.assert_codes_equal(label, o[0].copy_to_host(), ref_codes)
        assert (o[1].copy_to_host() == ref_scale).all(), f"{label}: scales differ"
        if o[2] is not None:
            bench.assert_codes_equal(f"{label} E8M0", o[2].copy_to_host(), ref_scodes)
        out.append((f"{label}, x ({M}, {K})", "bit-exact"))
    codes, scale, _ = reference(x, "tile")
    dcodes, dscale = cuda.to_device(codes), cuda.to_device(scale)
    if bench.selected(only, "dequantize"):
        got = bench.poisoned(x.shape, np.float32)
        dequantize(dcodes, dscale, 1, 128, got)
        assert np.array_equal(got.copy_to_host(), spec.dequantize(codes, scale, 1, 128), equal_nan=True), \
            "dequantize differs"
        out.append(("dequantize (tile)", "bit-exact"))
    if bench.selected(only, "requantize"):
        ct = cuda.to_device(np.full((K, M), 0xA5, np.uint8))
        st = bench.poisoned((K, -(-M // 128)), np.float32)
        requantize_tile_to_col(dcodes, dscale, ct, st)
        ref_ct, ref_st = spec.requantize_tile_to_col(codes, scale)
        bench.assert_codes_equal("requantize", ct.copy_to_host(), ref_ct)
        assert (st.copy_to_host() == ref_st).all(), "requantize: scales differ"
        out.append(("requantize 1x128 -> 128x1", "bit-exact"))
    return out


def timings(rng, args) -> list:
    """Every kernel on a 1.09 GiB activation; bytes = x read + codes written + scales written (+ a second read of
    x and the scale round trip for the two-pass version 1). With args.only, only those versions and ops."""
    only = getattr(args, "only", None)
    M, K = BENCH_SHAPE
    x = _activation(rng, (M, K))
    dx = cuda.to_device(x)
    rows = []
    for label, granularity, mode, launch in _kernels(only):
        o = _outs(granularity, x.shape, mx=granularity == "mx")
        nbytes = x.nbytes + x.size + o[1].nbytes + (o[2].nbytes if o[2] is not None else 0)
        if label.startswith("v1:"):
            nbytes += x.nbytes + 3 * o[1].nbytes  # x again; inv_scale written, then read back
        rows.append(bench.time_row(label, lambda launch=launch, o=o: launch(dx, o), nbytes, launch=True))
    codes, scale, _ = reference(x[:8], "tile")  # dequantize / requantize inputs: any valid codes will do
    dcodes = cuda.to_device(np.resize(codes, x.shape))
    dscale = cuda.to_device(np.resize(scale, (M, K // 128)))
    out = cuda.device_array(x.shape, np.float32)
    if bench.selected(only, "dequantize"):
        rows.append(bench.time_row("dequantize (tile)", lambda: dequantize(dcodes, dscale, 1, 128, out),
                                   x.size + dscale.nbytes + x.nbytes, launch=True))
    ct = cuda.device_array((K, M), np.uint8)
    st = cuda.device_array((K, -(-M // 128)), np.float32)
    if bench.selected(only, "requantize"):
        rows.append(bench.time_row("requantize 1x128 -> 128x1 (x.T)",
                                   lambda: requantize_tile_to_col(dcodes, dscale, ct, st),
                                   2 * x.size + dscale.nbytes + st.nbytes, launch=True))
    torch = bench.torch_cuda()
    if torch is not None and only is None:
        tx = torch.from_numpy(x).cuda()
        tcodes, tscale = torch_tile_quantize(torch, tx)
        o = _outs("tile", x.shape)
        quantize_tile(dx, o[0], o[1])
        ncodes = int((tcodes.view(torch.uint8).cpu().numpy() != o[0].copy_to_host()).sum())
        nscales = int((tscale.cpu().numpy() != o[1].copy_to_host()).sum())
        same = "bit-exact" if ncodes == nscales == 0 else f"{ncodes} codes, {nscales} scales DIFFER"
        rows.append(bench.time_row(f"torch: amax, scale, .to(float8_e4m3fn) ({same})",
                                   lambda: torch_tile_quantize(torch, tx), x.nbytes + x.size + o[1].nbytes,
                                   timer=lambda fn: timing.torch_time_ms(torch, fn), launch=True))
    return [bench.Table(f"fine-grained E4M3 quantize, x ({M}, {K}) float32 = {x.nbytes / 2**30:.2f} GiB; bytes = "
                        "read + written, scales included", "GB/s", rows, ceiling=bench.copy_ceiling_gbs(x.nbytes))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
