"""One scale per row (torchao ROWWISE, per-token activations) and per block x block tile (DeepSeek-V3's weights):
one kernel each, built per (fmt, mode[, block]), and their launchers `quantize_row` and `quantize_block`."""

from __future__ import annotations

import numpy as np

from ...device import runtime
from ...device.runtime import MAX_BLOCKS, WARP_SIZE, cuda
from ...numerics.spec import POISON_CODE
from ..common import ENCODE_SAT, block_max, nanmax
from .rule import ZERO, make_group_scale

THREADS = runtime.block_threads(256)  # threads per block (one warp under the simulator)


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
            m = ZERO
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
            m = ZERO
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


def quantize_row(x, codes, scale, *, fmt="e4m3", mode="amax"):
    """x (M, K) -> codes (M, K), scale (M, 1)."""
    kernel = runtime.cached(("quantize_fine.row", fmt, mode), lambda: make_row_kernel(fmt, mode))
    kernel[min(MAX_BLOCKS, x.shape[0]), THREADS](x, codes, scale)


def quantize_block(x, codes, scale, *, fmt="e4m3", block=128, mode="amax"):
    """x (M, K) -> codes (M, K), scale (ceil(M/block), ceil(K/block))."""
    kernel = runtime.cached(("quantize_fine.block", fmt, block, mode), lambda: make_block_kernel(fmt, block, mode))
    kernel[min(MAX_BLOCKS, scale.size), THREADS](x, codes, scale)
