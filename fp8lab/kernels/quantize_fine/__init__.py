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
of x -> 1 x block tiles of x.T, from the codes and scales), quantize_tile_dual (the 1 x 128 tiles of x and of x.T
in one pass over x: a Linear's dy for Dgrad and Wgrad).

Scales and policies (scale modes "amax", "pow2", "mx_floor", "mx_ceil", and DeepGEMM's reference casts "deepgemm",
"deepgemm_ue8m0" for tiles and blocks; partial, all-zero and NaN/Inf groups)
are those of fp8lab/numerics/spec.py, whose NumPy functions are the reference every kernel here matches bit for bit;
`make_group_scale` is the same rule as a device function. A NaN that was in a tile poisons every 128 x 1 column
group of requantize it reaches.

The package: rule.py (the scale rule as a device function, the float32 constants the kernels share, `reference`),
tile.py (versions 1-3, their launchers and VERSIONS, `quantize_tile`, `quantize_mx`), row_block.py (`quantize_row`,
`quantize_block`), requantize.py (`dequantize`, `requantize_tile_to_col`), dual.py (`quantize_tile_dual`), harness.py (checks,
timings). The
launchers take device arrays the caller allocates (fp8lab/quant.py does it for the public API).

Run `python -m fp8lab.kernels.quantize_fine` (or `fp8lab bench quantize_fine`) to check every kernel against the
reference and time it. How each kernel moves its bytes, and why: docs/notes/quantize_fine.md.
TIP: a kernel that fails only on the GPU: run it under the simulator (FP8LAB_BACKEND=sim), where `print` and
pdb work inside kernels; keep the shape small.
"""

from __future__ import annotations

from ... import bench
from ...numerics.spec import AMAX_FLOOR, E8M0_NAN, FP8_MAX, MODES, MX_GROUP, POISON_CODE
from .dual import DUAL_MODES, make_dual_kernel, quantize_tile_dual
from .harness import BENCH_SHAPE, CHECK_SHAPE, checks, timings, torch_tile_quantize
from .requantize import dequantize, make_dequantize_kernel, make_requantize_kernel, requantize_tile_to_col
from .row_block import THREADS, make_block_kernel, make_row_kernel, quantize_block, quantize_row
from .rule import ELEMENTWISE_THREADS, ZERO, make_group_scale, reference
from .tile import (BEST, GROUPS3, LANES3, MAX_GROUP3, VERSIONS, WARPS3, WARPS_PER_BLOCK, launch_tile1, launch_tile2,
                   launch_tile3, make_tile_kernel3, make_tile_kernels, quantize_mx, quantize_tile, tile_kernels,
                   vector_ok)

__all__ = [
    "VERSIONS", "BEST", "quantize_tile", "quantize_mx", "quantize_row", "quantize_block", "dequantize",
    "requantize_tile_to_col", "quantize_tile_dual", "make_dual_kernel", "DUAL_MODES", "reference", "checks", "timings", "main", "tile_kernels", "vector_ok",
    "launch_tile1", "launch_tile2", "launch_tile3", "make_group_scale", "make_tile_kernels", "make_tile_kernel3",
    "make_row_kernel", "make_block_kernel", "make_dequantize_kernel", "make_requantize_kernel",
    "torch_tile_quantize", "CHECK_SHAPE", "BENCH_SHAPE", "THREADS", "WARPS_PER_BLOCK", "ELEMENTWISE_THREADS",
    "LANES3", "GROUPS3", "MAX_GROUP3", "WARPS3", "ZERO", "AMAX_FLOOR", "E8M0_NAN", "FP8_MAX", "MODES", "MX_GROUP",
    "POISON_CODE",
]


def main(argv=None) -> int:
    return bench.main(__name__, argv)
