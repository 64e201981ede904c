"""Fused bias + RMSNorm + 1x128 E4M3 tile quantization (the capstone's pre-norm), and its backward.

For x (M, N) float32 (the residual stream), an optional bias b (N,) and the gain g (N,), all float32:

    y = x + b                              (float32; y = x when there is no bias)
    rstd = 1 / sqrt(mean(y^2) + eps)       per row, eps = spec.RMSNORM_EPS (the same as kernels/rmsnorm.py)
    z = y * rstd * g                       (float32, in this order)

and the outputs codes (M, N) uint8 E4M3 and scales (M, ceil(N/128)) float32, the 1x128 tile quantization of the
float32 z by fp8lab/numerics/spec.py's rule (scale = amax / 448 per tile, the amax floored at AMAX_FLOOR, round to
nearest even, saturating; a tile holding NaN/Inf is poisoned), rstd (M,) for the backward, and z only when asked for.
Only rstd depends on a kernel's order of additions; given the rstd a kernel wrote, its codes, scales and z are bit
for bit those of `reference(x, b, g, rstd)`.

version 1: unfused: a row kernel (one block per row, block reduction) writes z to global memory, then a warp-per-tile
           kernel reads z back and quantizes it.
version 2: fused: one block per row keeps its row in registers, reduces rstd, then computes z tile by tile, finds
           each tile's amax with warp shuffles and writes codes and scales; z reaches memory only when asked for.
version 3: version 2's math in persistent blocks that stream rows through a shared-memory ring (cp.async), b and
           g kept beside it; rows it cannot stream (N % 4 != 0, not 16-byte aligned, too wide) run version 2.
version 4: narrow rows (N <= 2048): one warp per row, 8 rows a block, b and g staged once per block in shared
           memory; wider rows run version 3. BEST.

Backward (`backward`, one version; y = x + b is recomputed, not stored), with dot = sum_n dz * g * y per row:
    dy = rstd * g * dz - rstd^3 * y * dot / N    (dx = dy, since y = x + b; db = column sum of dy)
    gy = dz * y * rstd                            (dg = column sum of gy)
One block per row; the column sums of dx and gy are the caller's (elementwise.colsum).

The package: layout.py (version 2's layout of a row, shared by versions 2-4), simple.py (versions 1 and 2, the
backward kernel), ring.py (version 3), warp_rows.py (version 4), host.py (VERSIONS, the launchers, forward,
backward, norm_quantize), references.py (the NumPy spec), harness.py (checks, timings). What was tried and
measured, and why the versions are built this way: docs/notes/norm_quant.md.

Run `python -m fp8lab.kernels.norm_quant` (or `fp8lab bench norm_quant`) to check every version and the backward
against the references, then (on a GPU) time them against a copy and PyTorch.
TIP: a kernel that fails only on the GPU: run it under the simulator (FP8LAB_BACKEND=sim), where `print` and pdb
work inside kernels; keep the shape small.
"""

from __future__ import annotations

from ... import bench
from .harness import (BENCH_SHAPES, CHECK_SHAPES, DX_TOL, GY_RTOL, RSTD_RTOL, checks, make_inputs,
                      torch_norm_quantize, timings)
from .host import (BEST, VERSIONS, backward, forward, launch1, launch2, launch3, launch4, needs3, norm_quantize,
                   norm_quantize_backward)
from .layout import (EPS, LANES, MAX_THREADS, SET_VALUES, TILE, TILES_PER_SET, load4_row, normalize_set, pack4,
                     pack_set, sum_squares)
from .references import dx_error_scale, reference, reference_backward, reference_rstd
from .ring import (CP_ASYNC, L2_AHEAD3, L2_PREFETCH, MAX_SHARED3, SIM_RESIDENT, STAGES3, STAGES3_BIAS,
                   forward_warps3, make_forward_kernel3, ring3)
from .simple import (ANY_THREADS, BWD_PER_THREAD, FIT_THREADS, MIN_WARPS, PER_LANE1, QUANT_WARPS1, SETS_PER_WARP,
                     THREADS1, backward_threads, forward_warps, make_backward_kernel, make_forward_kernel2,
                     make_forward_kernels1)
from .warp_rows import MAX_SETS4, ROWS4, make_forward_kernel4

__all__ = [
    "VERSIONS", "BEST", "forward", "backward", "norm_quantize", "norm_quantize_backward", "reference",
    "reference_rstd", "reference_backward", "dx_error_scale", "checks", "timings", "main", "make_inputs",
    "torch_norm_quantize", "forward_warps", "forward_warps3", "backward_threads", "needs3", "launch1", "launch2",
    "launch3", "launch4", "make_forward_kernels1", "make_forward_kernel2", "make_forward_kernel3",
    "make_forward_kernel4", "make_backward_kernel", "ring3", "load4_row", "sum_squares", "normalize_set", "pack4",
    "pack_set", "EPS", "TILE", "LANES", "TILES_PER_SET", "SET_VALUES", "MAX_THREADS", "MIN_WARPS", "FIT_THREADS",
    "ANY_THREADS", "THREADS1", "QUANT_WARPS1", "PER_LANE1", "SETS_PER_WARP", "BWD_PER_THREAD", "STAGES3",
    "STAGES3_BIAS", "L2_AHEAD3", "MAX_SHARED3", "SIM_RESIDENT", "CP_ASYNC", "L2_PREFETCH", "ROWS4", "MAX_SETS4",
    "RSTD_RTOL", "DX_TOL", "GY_RTOL", "CHECK_SHAPES", "BENCH_SHAPES",
]


def main(argv=None) -> int:
    return bench.main(__name__, argv)
