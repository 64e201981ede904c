"""x and x.T quantized in 1 x 128 tiles in one pass (`quantize_tile_dual`): what a Linear's backward needs of its
output gradient dy, in 1 x 128 tiles along N for Dgrad (dy W) and in 1 x 128 tiles along M, transposed, for Wgrad
(dy^T x). DeepSeek-V3 fuses the FP8 cast with the transpose (arXiv 2412.19437, section 3.3.4); done apart, the
two take a quantize of dy, a transpose of dy and a quantize of dy^T: 18 bytes moved per element instead of 6.

One block per 128 x 128 tile of x: the tile read once into shared memory (rows padded to 129 floats, so that a
warp reading a column touches 32 different banks), then each row's amax, scale and codes written along the row,
and each column's written along x.T's row (both coalesced). The scale rule is the tile quantizer's
(rule.make_group_scale), so both outputs equal spec.quantize of x and of x.T bit for bit."""

from __future__ import annotations

import numpy as np

from ...device import runtime
from ...device.runtime import WARP_SIZE, cuda
from ...numerics.spec import GROUP_K, POISON_CODE
from ..common import ENCODE_SAT, nanmax, warp_max
from .rule import ZERO, make_group_scale

PAD = GROUP_K + 1  # floats per shared row
SMEM_DUAL = GROUP_K * PAD * 4  # bytes of dynamic shared memory (66,048: over the 48 KiB static limit)
THREADS_DUAL = runtime.block_threads(256)  # 8 warps on a GPU, one under the simulator
DUAL_MODES = ("amax", "pow2")
_F32 = runtime.numba_type("float32")


def make_dual_kernel(fmt: str, mode: str):
    """The one-pass kernel for one format and scale mode (compiled in). Grid (ceil(N/128), ceil(M/128))."""
    encode = ENCODE_SAT[fmt]
    group_scale = make_group_scale(fmt, mode)
    per_lane = GROUP_K // WARP_SIZE

    @cuda.jit
    def dual_kernel(x, codes, scale, codes_t, scale_t):
        s = cuda.shared.array(0, _F32)
        M, N = x.shape
        r0, c0 = cuda.blockIdx.y * GROUP_K, cuda.blockIdx.x * GROUP_K
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        warps = cuda.blockDim.x // WARP_SIZE
        for r in range(warp, GROUP_K, warps):  # the tile, zeros past the edges (they leave an amax alone)
            for j in range(per_lane):
                c = lane + WARP_SIZE * j
                v = ZERO
                if r0 + r < M and c0 + c < N:
                    v = x[r0 + r, c0 + c]
                s[r * PAD + c] = v
        cuda.syncthreads()
        for r in range(warp, GROUP_K, warps):  # x's 1 x 128 tiles: a warp per row (warp-uniform test)
            if r0 + r < M:
                m = ZERO
                for j in range(per_lane):
                    m = nanmax(m, abs(s[r * PAD + lane + WARP_SIZE * j]))
                m = warp_max(m)
                sc, inv, _ = group_scale(m)
                for j in range(per_lane):
                    c = lane + WARP_SIZE * j
                    if c0 + c < N:
                        codes[r0 + r, c0 + c] = POISON_CODE if inv != inv else encode(s[r * PAD + c] * inv)
                if lane == 0:
                    scale[r0 + r, cuda.blockIdx.x] = sc
        for c in range(warp, GROUP_K, warps):  # x.T's 1 x 128 tiles: a warp per column of x
            if c0 + c < N:
                m = ZERO
                for j in range(per_lane):
                    m = nanmax(m, abs(s[(lane + WARP_SIZE * j) * PAD + c]))
                m = warp_max(m)
                sc, inv, _ = group_scale(m)
                for j in range(per_lane):
                    r = lane + WARP_SIZE * j
                    if r0 + r < M:
                        codes_t[c0 + c, r0 + r] = POISON_CODE if inv != inv else encode(s[r * PAD + c] * inv)
                if lane == 0:
                    scale_t[c0 + c, cuda.blockIdx.y] = sc

    return dual_kernel


def quantize_tile_dual(x, codes, scale, codes_t, scale_t, *, fmt="e4m3", mode="amax", stream=0):
    """x (M, N) float32 -> its 1 x 128 tiles, codes (M, N) uint8 and scale (M, ceil(N/128)) float32, and those of
    x.T, codes_t (N, M) and scale_t (N, ceil(M/128)), in one pass over x (device arrays the caller allocates; the
    same codes and scales as quantize_tile of x and of a transposed copy of x). mode: "amax" or "pow2"."""
    if mode not in DUAL_MODES:
        raise ValueError(f"mode must be one of {DUAL_MODES} (1 x 128 tiles), got {mode!r}")
    M, N = x.shape
    if M == 0 or N == 0:
        return
    kernel = runtime.cached(("quantize_fine.dual", fmt, mode), lambda: make_dual_kernel(fmt, mode))
    grid = (-(-N // GROUP_K), -(-M // GROUP_K))
    runtime.launch_with_shared(kernel, grid, THREADS_DUAL, SMEM_DUAL, x, codes, scale, codes_t, scale_t,
                               stream=stream)
