"""The 1 x block tile quantizer (DeepSeek-V3's activations; MX groups of 32 too), versions 1 to 3: the kernels,
one launcher per version, the VERSIONS table, `quantize_tile` and `quantize_mx`. The kernels are built per (fmt,
group size, mode): the group size sizes local arrays, so it is a compile-time constant."""

from __future__ import annotations

import warnings

import numpy as np

from ...device import runtime
from ...device.ptx import ld_global_v4_f32
from ...device.runtime import FULL_MASK, MAX_BLOCKS, WARP_SIZE, cuda, shfl_xor_sync
from ...numerics.spec import MX_GROUP, POISON_CODE
from ..common import CVT_X2, ENCODE_SAT, nanmax, vec_ok, warp_max
from ..versions import Version
from .rule import ELEMENTWISE_THREADS, ZERO, make_group_scale

WARPS_PER_BLOCK = 4 if not runtime.IS_SIM else 1  # versions 1 and 2: one warp per tile
if runtime.IS_SIM:  # version 3's NaN/Inf flag (x * 0) on NumPy scalars: the NaN is the point, not a problem
    warnings.filterwarnings("ignore", message="invalid value encountered in scalar multiply",
                            category=RuntimeWarning, module=__name__)
LANES3 = 8  # version 3: lanes per group (tile or MX group)
GROUPS3 = WARP_SIZE // LANES3  # version 3: groups per warp
MAX_GROUP3 = 512  # version 3: largest group (16 float4 per lane, kept in registers)
WARPS3 = 4  # version 3: warps per block


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
            m = ZERO
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
            m = ZERO
            for j in range(per_lane):
                c = k0 + lane + WARP_SIZE * j
                v = ZERO
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
                v0 = ZERO
                v1 = ZERO
                v2 = ZERO
                v3 = ZERO
                if tk < ntk and c < K:  # K % 4 == 0: all four elements exist
                    v0, v1, v2, v3 = ld_global_v4_f32(x, r, c)
                vals[4 * q] = v0
                vals[4 * q + 1] = v1
                vals[4 * q + 2] = v2
                vals[4 * q + 3] = v3
            m = ZERO
            z = ZERO  # stays 0 unless an element is NaN or +-Inf: then NaN (x * 0), which poisons the group
            for j in range(nvals):
                m = max(m, abs(vals[j]))  # a plain max (2 instructions per element instead of nanmax's 6)
                z += vals[j] * ZERO
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


def tile_kernels(fmt: str, gk: int, mode: str):
    """(tile_amax_kernel1, tile_cast_kernel1, tile_fused_kernel2) for (fmt, gk, mode), built once (runtime.cached)."""
    return runtime.cached(("quantize_fine.tile", fmt, gk, mode), lambda: make_tile_kernels(fmt, gk, mode))


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
