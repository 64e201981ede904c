"""From codes back: `dequantize` (codes and scales of any granularity -> float32) and `requantize_tile_to_col`
(a tile-quantized x -> a tile-quantized x.T, the K-major layout a Wgrad GEMM reads), one kernel each."""

from __future__ import annotations

import numpy as np

from ...device import runtime
from ...device.runtime import MAX_BLOCKS, cuda
from ...numerics.spec import POISON_CODE
from ..common import DECODE, ENCODE_SAT, nanmax
from .rule import ELEMENTWISE_THREADS, ZERO, make_group_scale


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
                m = ZERO
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
