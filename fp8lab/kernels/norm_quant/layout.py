"""Version 2's layout of a row, which versions 3 and 4 share: constants and device functions.

A warp takes a "set" of TILES_PER_SET = 4 neighbouring 1x128 tiles, LANES = 8 lanes per tile, and lane l of a tile
holds the float4s l, l + 8, l + 16, l + 24 of it (SET_VALUES = 16 elements): every load instruction of the warp
reads whole 128-byte lines, a tile's amax takes 3 xor-shuffles inside its 8 lanes, and four codes leave in one
4-byte store (docs/notes/norm_quant.md, version 2).
"""

from __future__ import annotations

import numpy as np

from ...device.ptx import ld_global_v4_f32
from ...device.runtime import FULL_MASK, WARP_SIZE, cuda, shfl_xor_sync
from ...numerics import spec
from ...numerics.spec import FP8_MAX, GROUP_K, POISON_CODE
from ..common import CVT_X2, amax_scale, load4, nanmax

EPS = spec.RMSNORM_EPS
TILE = GROUP_K  # 1 x 128 tiles (DeepSeek-V3 activations)
E4M3_MAX = FP8_MAX["e4m3"]
ZERO = np.float32(0.0)
ONE = np.float32(1.0)

MAX_THREADS = 1024  # CUDA's limit per block
LANES = 8  # lanes per tile
TILES_PER_SET = WARP_SIZE // LANES  # a warp's set of neighbouring tiles
SET_VALUES = TILE * TILES_PER_SET // WARP_SIZE  # 16 floats a lane holds per set


@cuda.jit(device=True)
def load4_row(a, i, c, N, vec, inside):
    """a[i, c:c+4] as four float32, zeros past N.

    vec (N % 4 == 0, 16-byte aligned rows): one 16-byte load; where the caller knows the float4 is inside the row
    (`inside`, a constant once loops are unrolled) from a constant offset, else from a clamped address (c past N
    reads the row's last float4 again) followed by a select. No branch either way, so the compiler can issue all of
    a thread's loads back to back. Not vec: common.load4 (scalar loads, bounds checked)."""
    if vec:
        if inside:
            return ld_global_v4_f32(a, i, c)
        ok = c < N
        v0, v1, v2, v3 = ld_global_v4_f32(a, i, c if ok else N - 4)
        return (v0 if ok else ZERO), (v1 if ok else ZERO), (v2 if ok else ZERO), (v3 if ok else ZERO)
    return load4(a, i, c, i + 1, N, 0)


@cuda.jit(device=True)
def sum_squares(y, bv, nvals, has_bias):
    """y += b in this thread's registers (when there is a bias), then the thread's sum of y^2 (versions 2 and 3)."""
    if has_bias:
        for i in range(nvals):
            y[i] += bv[i]
    ss = ZERO
    for i in range(nvals):
        ss += y[i] * y[i]
    return ss


@cuda.jit(device=True)
def normalize_set(y, i0, r, gv):
    """One tile set of a lane (versions 2 and 3): z = y * rstd * g in place of y[i0 : i0 + SET_VALUES], the tile's amax
    over its 8 lanes by xor-shuffles, and its (scale, inv); a NaN or +-Inf z makes the amax NaN (z * 0 is NaN then),
    which poisons the tile."""
    amax = ZERO
    bad = ZERO
    for j in range(SET_VALUES):
        y[i0 + j] = y[i0 + j] * r * gv[j]
        amax = max(amax, abs(y[i0 + j]))  # a plain max: NaN is caught by `bad`
        bad += y[i0 + j] * ZERO
    amax += bad
    off = LANES // 2
    while off > 0:  # xor partners stay inside the tile's 8 lanes
        amax = nanmax(amax, shfl_xor_sync(FULL_MASK, amax, off))
        off //= 2
    return amax_scale(amax, E4M3_MAX)


_CVT_E4M3X2 = CVT_X2["e4m3"]
_POISON4 = np.uint32(POISON_CODE * 0x01010101)


@cuda.jit(device=True)
def pack4(z0, z1, z2, z3):
    """Four E4M3 codes in a little-endian uint32 (z0 in the low byte): two cvt.rn.satfinite.e4m3x2.f32."""
    return np.uint32(_CVT_E4M3X2(z1, z0)) | (np.uint32(_CVT_E4M3X2(z3, z2)) << np.uint32(16))


@cuda.jit(device=True)
def pack_set(y, i0, inv):
    """A lane's 16 codes of a set (z in y[i0 : i0 + 16], times inv) as four uint32 words, or four poisoned words
    when inv is NaN (versions 3 and 4; all four words before any store, which takes fewer registers)."""
    if inv != inv:
        return _POISON4, _POISON4, _POISON4, _POISON4
    return (pack4(y[i0] * inv, y[i0 + 1] * inv, y[i0 + 2] * inv, y[i0 + 3] * inv),
            pack4(y[i0 + 4] * inv, y[i0 + 5] * inv, y[i0 + 6] * inv, y[i0 + 7] * inv),
            pack4(y[i0 + 8] * inv, y[i0 + 9] * inv, y[i0 + 10] * inv, y[i0 + 11] * inv),
            pack4(y[i0 + 12] * inv, y[i0 + 13] * inv, y[i0 + 14] * inv, y[i0 + 15] * inv))
