"""Reduction building blocks (device functions) shared by quantize, RMSNorm and the loss.

version 1 (tree): a block reduces through shared memory, halving the active threads each step
             (log2(THREADS) barriers).
version 2 (warp): each warp reduces in registers with 5 butterfly shuffles, one shared slot per warp,
             then every warp reduces those slots the same way (2 barriers in all).

Blocks must have a multiple of 32 threads: a full-mask shuffle on a partial warp is undefined on a GPU.
"""

from __future__ import annotations

import numpy as np

from ..runtime import FULL_MASK, cuda, shfl_xor_sync


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
