"""Small kernels of the Linear layer: transpose (versioned), bias add, column sums (bias and gain gradients).

version 1: transpose, out[j, i] = a[i, j] straight from global memory (the writes are strided: uncoalesced).
version 2: transpose through a 32x33 shared tile, so both the read and the write are coalesced; the 33rd
           column keeps the column reads of the tile free of bank conflicts.
bias_add: y[m, n] += b[n], a grid-stride loop over the flat index (n fastest: coalesced).
colsum: out[n] = sum_m a[m, n], one thread per column walking down the rows: neighbouring threads read
        neighbouring addresses (coalesced) and the sum order is fixed, so it is deterministic (no atomics).
"""

from __future__ import annotations

import numpy as np

from .. import bench, runtime, timing
from ..runtime import cuda

TILE = 32
TILE_PAD = TILE + 1  # shared-array shapes must be compile-time constants
ROWS = 8  # a 32x8 block moves a 32x32 tile, 4 elements per thread


@cuda.jit
def bias_add_kernel(y, b):
    i = cuda.grid(1)
    N = y.shape[1]
    while i < y.size:  # grid-stride over the flat index, n fastest: coalesced
        y[i // N, i % N] += b[i % N]
        i += cuda.gridsize(1)


@cuda.jit
def colsum_kernel(a, out):
    n = cuda.grid(1)
    if n < a.shape[1]:
        s = np.float32(0)
        for m in range(a.shape[0]):
            s += a[m, n]
        out[n] = s


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
    1: "transpose, naive: coalesced reads, strided writes",
    2: "transpose, 32x33 shared tile: coalesced reads and writes, no bank conflicts",
}
BEST = 2


def _grid2(rows, cols, bx=32, by=8):
    return ((cols + bx - 1) // bx, (rows + by - 1) // by), (bx, by)


def bias_add(y, b) -> None:
    bias_add_kernel[runtime.grid_1d(y.size, runtime.block_threads(256), runtime.MAX_BLOCKS)](y, b)


def colsum(a, out) -> None:
    colsum_kernel[runtime.grid_1d(a.shape[1], runtime.block_threads(128))](a, out)


def transpose(a, out, version: int = BEST) -> None:
    rows, cols = a.shape
    if version == 1:
        grid, block = _grid2(rows, cols, 32, 8)
        transpose_kernel1[grid, block](a, out)
    else:
        grid = ((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE)
        transpose_kernel2[grid, (TILE, ROWS)](a, out)


def reference(a) -> np.ndarray:
    """The spec of the versioned op: a.T."""
    return np.ascontiguousarray(np.asarray(a).T)


def reference_bias_add(y, b) -> np.ndarray:
    return np.asarray(y, np.float32) + np.asarray(b, np.float32)


def reference_colsum(a) -> np.ndarray:
    return np.asarray(a, np.float64).sum(axis=0)


def checks(rng) -> list:
    M, N = (37, 45) if runtime.IS_SIM else (4099, 2053)
    a = rng.standard_normal((M, N), dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    out = []
    for v in VERSIONS:
        t = bench.poisoned((N, M), np.float32)
        transpose(da, t, v)
        bench.assert_close(f"transpose v{v}", t.copy_to_host(), reference(a), atol=0, rtol=0)
        out.append((f"transpose v{v}, {M}x{N}", "exact"))
    y = cuda.to_device(a)
    bias_add(y, db)
    bench.assert_close("bias_add", y.copy_to_host(), reference_bias_add(a, b), atol=0, rtol=0)
    s = bench.poisoned(N, np.float32)
    colsum(da, s)
    bench.assert_close("colsum", s.copy_to_host(), reference_colsum(a), atol=1e-4 * np.sqrt(M), rtol=1e-5)
    return out + [(f"bias_add, {M}x{N}", "exact"), (f"colsum, {M}x{N}", "within tolerance of float64")]


def timings(rng, args) -> list:
    M = N = 8192
    a = rng.standard_normal((M, N), dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(rng.standard_normal(N, dtype=np.float32))
    t, y, s = cuda.device_array((N, M), np.float32), cuda.to_device(a), cuda.device_array(N, np.float32)
    rows = [bench.Row(f"v{v}: {desc}", timing.time_ms(lambda v=v: transpose(da, t, v)), 2 * a.nbytes)
            for v, desc in VERSIONS.items()]
    rows.append(bench.Row("bias_add", timing.time_ms(lambda: bias_add(y, db)), 2 * a.nbytes))
    rows.append(bench.Row("colsum", timing.time_ms(lambda: colsum(da, s)), a.nbytes))
    return [bench.Table(f"elementwise {M}x{N} float32; bytes = read + written", "GB/s", rows,
                        ceiling=bench.copy_ceiling_gbs(a.nbytes))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
