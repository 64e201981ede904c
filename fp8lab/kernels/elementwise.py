"""Small kernels of the Linear layer: transpose (versioned), bias add, column sums, bfloat16 rounding.

version 1: transpose, out[j, i] = a[i, j] straight from global memory (the writes are strided: uncoalesced).
version 2: transpose through a 32x33 shared tile, so both the read and the write are coalesced; the 33rd
           column keeps the column reads of the tile free of bank conflicts.
bias_add: y[m, n] += b[n], a grid-stride loop over the flat index (n fastest: coalesced).
colsum: out[n] = sum_m a[m, n]: a block per 32 columns, its COLSUM_WARPS warps each walking every
        COLSUM_WARPS-th row with 4 loads in flight (a warp reads 32 neighbouring floats: coalesced), then the warps'
        partial sums added in a fixed order: deterministic, no atomics. (One thread per column walking down all
        rows keeps only one load in flight per column.)
add: out = a + b elementwise (the residual connection x + f(x), and gradients meeting at a branch); out may be a
     or b itself.
scale_cols: out[m, n] = a[m, n] * d[n] (the outlier channels of the capstone's controlled experiment: a power of
        two d scales exactly); out may be a itself.
round_bf16: out = x rounded to the nearest bfloat16 (ties to even), kept as float32: what the bf16 recipe does
        to a GEMM's inputs. Integer arithmetic on the float32 bits (kernels.common.round_bf16), bit for bit
        formats.round_bf16; a grid-stride loop over the flat index.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from .. import bench
from ..numerics import formats
from ..device import runtime
from ..bench import timing
from ..device.runtime import cuda
from .common import round_bf16 as round_bf16_value
from .versions import Version

TILE = 32
TILE_PAD = TILE + 1  # shared-array shapes must be compile-time constants
ROWS = 8  # a 32x8 block moves a 32x32 tile, 4 elements per thread
COLSUM_WARPS = 32  # colsum: warps per block, each a share of the rows (enough loads in flight for HBM)


@cuda.jit
def bias_add_kernel(y, b):
    i = cuda.grid(1)
    N = y.shape[1]
    while i < y.size:  # grid-stride over the flat index, n fastest: coalesced
        y[i // N, i % N] += b[i % N]
        i += cuda.gridsize(1)


@cuda.jit
def add_kernel(a, b, out):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = a[i] + b[i]
        i += cuda.gridsize(1)


@cuda.jit
def scale_cols_kernel(a, d, out):
    i = cuda.grid(1)
    N = a.shape[1]
    while i < a.size:  # n fastest: coalesced
        out[i // N, i % N] = a[i // N, i % N] * d[i % N]
        i += cuda.gridsize(1)


@cuda.jit
def colsum_kernel(a, out):
    part = cuda.shared.array((COLSUM_WARPS, TILE), np.float32)
    tx, ty, ny = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.y
    n, rows = cuda.blockIdx.x * TILE + tx, a.shape[0]
    s0 = s1 = s2 = s3 = np.float32(0)
    if n < a.shape[1]:
        m = ty
        while m + 3 * ny < rows:  # four independent sums: four loads in flight
            s0 += a[m, n]
            s1 += a[m + ny, n]
            s2 += a[m + 2 * ny, n]
            s3 += a[m + 3 * ny, n]
            m += 4 * ny
        while m < rows:
            s0 += a[m, n]
            m += ny
    part[ty, tx] = (s0 + s1) + (s2 + s3)
    cuda.syncthreads()
    if ty == 0 and n < a.shape[1]:
        s = part[0, tx]
        for r in range(1, ny):
            s += part[r, tx]
        out[n] = s


@cuda.jit
def round_bf16_kernel(x, out):
    i = cuda.grid(1)
    while i < x.size:  # flat 1-D views: any shape, coalesced
        out[i] = round_bf16_value(x[i])
        i += cuda.gridsize(1)


@cuda.jit
def transpose_kernel1(a, out):
    j, i = cuda.grid(2)
    if i < a.shape[0] and j < a.shape[1]:
        out[j, i] = a[i, j]


@cuda.jit
def transpose_kernel2(a, out):
    tile = cuda.shared.array((TILE, TILE_PAD), np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i0 = cuda.blockIdx.y * TILE
    j0 = cuda.blockIdx.x * TILE
    for r in range(ty, TILE, ROWS):
        if i0 + r < a.shape[0] and j0 + tx < a.shape[1]:
            tile[r, tx] = a[i0 + r, j0 + tx]
    cuda.syncthreads()
    for r in range(ty, TILE, ROWS):
        if j0 + r < a.shape[1] and i0 + tx < a.shape[0]:
            out[j0 + r, i0 + tx] = tile[tx, r]


VERSIONS = {
    1: Version("transpose, naive: coalesced reads, strided writes", transpose_kernel1),
    2: Version("transpose, 32x33 shared tile: coalesced reads and writes, no bank conflicts", transpose_kernel2),
}
BEST = 2
BLOCK_ROWS = {1: ROWS, 2: TILE}
"""Rows of `a` that one (TILE, ROWS) block of a transpose version covers: version 1 moves an element a thread,
version 2 a TILE x TILE tile."""


def bias_add(y, b) -> None:
    bias_add_kernel[runtime.grid_1d(y.size, runtime.block_threads(256), runtime.MAX_BLOCKS)](y, b)


def add(a, b, out) -> None:
    """out = a + b for C-contiguous float32 device arrays of one shape (out may be a or b)."""
    n = out.size
    add_kernel[runtime.grid_1d(n, runtime.block_threads(256), runtime.MAX_BLOCKS)](a.reshape(n), b.reshape(n),
                                                                                   out.reshape(n))


def scale_cols(a, d, out) -> None:
    """out = a * d[None, :] for float32 device arrays a, out (M, N) and d (N,) (out may be a)."""
    scale_cols_kernel[runtime.grid_1d(a.size, runtime.block_threads(256), runtime.MAX_BLOCKS)](a, d, out)


def colsum(a, out, warps: int | None = None) -> None:
    """out[n] = sum over rows of a[:, n], for float32 device arrays a (M, N) and out (N,); deterministic.
    warps: 1 to COLSUM_WARPS per block (None: COLSUM_WARPS on a GPU, one under the simulator)."""
    if warps is None:
        warps = runtime.block_threads(COLSUM_WARPS * TILE) // TILE
    elif (isinstance(warps, (bool, np.bool_)) or not isinstance(warps, (int, np.integer))
          or not 1 <= warps <= COLSUM_WARPS):
        raise ValueError(f"warps must be None or an int in 1..{COLSUM_WARPS} (the kernel's shared partial sums hold "
                         f"that many), got {warps!r}")
    colsum_kernel[(a.shape[1] + TILE - 1) // TILE, (TILE, warps)](a, out)


def round_bf16(x, out=None):
    """x (any shape, float32, NumPy or C-contiguous device array) rounded to the nearest bfloat16, ties to even,
    as float32: bit for bit formats.round_bf16 (NaN stays NaN, values past bfloat16's range become +-Inf).

    out: a float32 device array of x's shape to write (returned; it may be x itself), or None: a new array, NumPy
    when x is NumPy.
    """
    x = V.array("x", x, dtype=np.float32)
    if V.is_device_array(x) and not x.is_c_contiguous():
        raise ValueError(f"x must be C-contiguous when it is a device array, got {V.describe(x)}")
    if out is not None:
        out = V.array("out", out, dtype=np.float32, shape=tuple(x.shape), writable=True)
        if not V.is_device_array(out) or not out.is_c_contiguous():
            raise TypeError(f"out must be a C-contiguous CUDA device array (written in place on the device; leave "
                            f"it None to get a new array), got {V.describe(out)}")
    dx = runtime.to_device(x)
    dout = cuda.device_array(x.shape, np.float32) if out is None else out
    n = x.size
    round_bf16_kernel[runtime.grid_1d(n, runtime.block_threads(256), runtime.MAX_BLOCKS)](dx.reshape(n),
                                                                                          dout.reshape(n))
    if out is None and not V.is_device_array(x):
        return dout.copy_to_host()
    return dout


def transpose(a, out, version: int = BEST) -> None:
    """out (N, M) = a.T for float32 device arrays a (M, N) and out (N, M) (no checks)."""
    rows, cols = a.shape
    grid = ((cols + TILE - 1) // TILE, (rows + BLOCK_ROWS[version] - 1) // BLOCK_ROWS[version])
    VERSIONS[version].kernel[grid, (TILE, ROWS)](a, out)


def reference(a) -> np.ndarray:
    """The spec of the versioned op: a.T."""
    return np.ascontiguousarray(np.asarray(a).T)


def reference_bias_add(y, b) -> np.ndarray:
    return np.asarray(y, np.float32) + np.asarray(b, np.float32)


def reference_add(a, b) -> np.ndarray:
    return (np.asarray(a, np.float32) + np.asarray(b, np.float32)).astype(np.float32)


def reference_scale_cols(a, d) -> np.ndarray:
    return (np.asarray(a, np.float32) * np.asarray(d, np.float32)).astype(np.float32)


def reference_colsum(a) -> np.ndarray:
    return np.asarray(a, np.float64).sum(axis=0)


reference_round_bf16 = formats.round_bf16
"""The spec of round_bf16: formats.round_bf16 (NumPy integer arithmetic on the float32 bits)."""


def bf16_check_values(rng, n: int) -> np.ndarray:
    """n float32 for round_bf16's checks: every kind of rounding case, then random bit patterns. Exact ties (low
    16 bits 0x8000) above odd and even kept bits and their neighbours (0x7FFF, 0x8001), values that round into the
    next binade (0x3FFF8000) and past the largest bfloat16 to Inf (0x7F7F8000), the largest float32, subnormals,
    +-0.0, +-Inf, NaNs with payloads in the low and high half; both signs. Shuffled."""
    highs = rng.integers(0, 0x7F80, 64, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    crafted = np.concatenate([(highs[:, None] | lows).ravel(), np.array(
        [0x3FFF8000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x00000000,
         0x7F800000, 0x7F800001, 0x7FC00000, 0x7FBFFFFF, 0x7FFF8000], np.uint32)])
    crafted = np.concatenate([crafted, crafted | np.uint32(0x80000000)])[:n]
    bits = np.concatenate([crafted, rng.integers(0, 2**32, n - crafted.size, dtype=np.uint32)])
    return bits[rng.permutation(n)].view(np.float32)


def checks(rng, only=None) -> list:
    """only: the versions (transpose) and ops ("bias_add", "add", "scale_cols", "colsum", "round_bf16") to check
    (bench.selected); None: all."""
    M, N = (37, 45) if runtime.IS_SIM else (4099, 2053)
    a = rng.standard_normal((M, N), dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    out = []
    for v in (v for v in VERSIONS if bench.selected(only, v)):
        t = bench.poisoned((N, M), np.float32)
        transpose(da, t, v)
        bench.assert_close(f"transpose v{v}", t.copy_to_host(), reference(a), atol=0, rtol=0)
        out.append((f"transpose v{v}, {M}x{N}", "exact"))
    if bench.selected(only, "bias_add"):
        y = cuda.to_device(a)
        bias_add(y, db)
        bench.assert_close("bias_add", y.copy_to_host(), reference_bias_add(a, b), atol=0, rtol=0)
        out.append((f"bias_add, {M}x{N}", "exact"))
    if bench.selected(only, "add"):
        c = rng.standard_normal((M, N), dtype=np.float32)
        r = bench.poisoned((M, N), np.float32)
        add(da, cuda.to_device(c), r)
        bench.assert_close("add", r.copy_to_host(), reference_add(a, c), atol=0, rtol=0)
        out.append((f"add, {M}x{N}", "exact"))
    if bench.selected(only, "scale_cols"):
        d = rng.standard_normal(N, dtype=np.float32)
        r = bench.poisoned((M, N), np.float32)
        scale_cols(da, cuda.to_device(d), r)
        bench.assert_close("scale_cols", r.copy_to_host(), reference_scale_cols(a, d), atol=0, rtol=0)
        out.append((f"scale_cols, {M}x{N}", "exact"))
    if bench.selected(only, "colsum"):
        s = bench.poisoned(N, np.float32)
        colsum(da, s)
        bench.assert_close("colsum", s.copy_to_host(), reference_colsum(a), atol=1e-4 * np.sqrt(M), rtol=1e-5)
        out.append((f"colsum, {M}x{N}", "within tolerance of float64"))
    if bench.selected(only, "round_bf16"):
        x = bf16_check_values(rng, M * N).reshape(M, N)
        r = bench.poisoned((M, N), np.float32)
        round_bf16(cuda.to_device(x), r)
        # compared as bits: NaN payloads, -0.0 and every rounding must match
        bench.assert_codes_equal("round_bf16", r.copy_to_host().view(np.uint32),
                                 reference_round_bf16(x).view(np.uint32))
        out.append((f"round_bf16, {M}x{N} (ties, overflow, subnormals, NaN payloads)", "bit for bit"))
    return out


def timings(rng, args) -> list:
    """Every version and op (those in args.only) on 8192 x 8192 float32."""
    only = getattr(args, "only", None)
    M = N = 8192
    a = rng.standard_normal((M, N), dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(rng.standard_normal(N, dtype=np.float32))
    t, y, s = cuda.device_array((N, M), np.float32), cuda.to_device(a), cuda.device_array(N, np.float32)
    rows = [bench.Row(f"v{v}: {desc}", timing.time_ms(lambda v=v: transpose(da, t, v)), 2 * a.nbytes)
            for v, desc in VERSIONS.items() if bench.selected(only, v)]
    ops = [("bias_add", "bias_add", lambda: bias_add(y, db), 2 * a.nbytes),
           ("colsum", "colsum", lambda: colsum(da, s), a.nbytes),
           ("add", "add (out = a + a)", lambda: add(da, da, y), 3 * a.nbytes),
           ("scale_cols", "scale_cols", lambda: scale_cols(da, db, y), 2 * a.nbytes),
           ("round_bf16", "round_bf16", lambda: round_bf16(da, t), 2 * a.nbytes)]
    rows += [bench.Row(label, timing.time_ms(fn), nbytes) for op, label, fn, nbytes in ops if bench.selected(only, op)]
    return [bench.Table(f"elementwise {M}x{N} float32; bytes = read + written", "GB/s", rows,
                        ceiling=bench.copy_ceiling_gbs(a.nbytes))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
