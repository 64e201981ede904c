"""x and x.T quantized in 1 x 128 tiles in one pass (`quantize_tile_dual`): what a Linear's backward needs of its
output gradient dy, in 1 x 128 tiles along N for Dgrad (dy W) and in 1 x 128 tiles along M, transposed, for Wgrad
(dy^T x). DeepSeek-V3 fuses the FP8 cast with the transpose (arXiv 2412.19437, section 3.3.4); done apart, the
two take a quantize of dy, a transpose of dy and a quantize of dy^T: 18 bytes moved per element instead of 6.

One block per 128 x 128 tile of x: the tile read once into shared memory (rows padded to 129 floats, so that a
warp reading a column touches 32 different banks), then each row's amax, scale and codes written along the row,
and each column's written along x.T's row (both coalesced). The scale rule is the tile quantizer's
(common.make_group_scale), so both outputs equal spec.quantize of x and of x.T bit for bit. The kernel is
common.make_dual_tile_kernel reading x itself; swiglu's backward builds it on du computed in place."""

from __future__ import annotations

from ...device import runtime
from ...device.runtime import cuda
from ..common import DUAL_SMEM, DUAL_THREADS, dual_tile_grid, make_dual_tile_kernel

DUAL_MODES = ("amax", "pow2")


@cuda.jit(device=True)
def _x_value(x, unused, r, c):
    return x[r, c]


def make_dual_kernel(fmt: str, mode: str):
    """The one-pass kernel of x itself for one format and scale mode: kernel(x, x, codes, scale, codes_t,
    scale_t) on dual_tile_grid(M, N) (common.make_dual_tile_kernel)."""
    return make_dual_tile_kernel(fmt, mode, _x_value)


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
    runtime.launch_with_shared(kernel, dual_tile_grid(M, N), DUAL_THREADS, DUAL_SMEM, x, x, codes, scale, codes_t,
                               scale_t, stream=stream)
