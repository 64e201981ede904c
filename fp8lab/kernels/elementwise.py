"""Small kernels of the Linear layer: bias add, column sums (bias and gain gradients), transpose.

bias_add: y[m, n] += b[n], a grid-stride loop over the flat index (n fastest: coalesced).
colsum: out[n] = sum_m a[m, n], one thread per column walking down the rows: neighbouring threads read
        neighbouring addresses (coalesced) and the sum order is fixed, so it is deterministic (no atomics).
transpose version 1: out[j, i] = a[i, j] straight from global memory (the writes are strided: uncoalesced).
transpose version 2: through a 32x33 shared tile, so both the read and the write are coalesced; the 33rd
        column keeps the column reads of the tile free of bank conflicts.
"""

from __future__ import annotations

import numpy as np

from .. import runtime
from ..runtime import cuda

TILE = 32
TILE_PAD = TILE + 1  # shared-array shapes must be compile-time constants
ROWS = 8  # a 32x8 block moves a 32x32 tile, 4 elements per thread
MAX_BLOCKS = 4 if runtime.IS_SIM else 1024


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


TRANSPOSE_VERSIONS = {
    1: "naive: coalesced reads, strided writes",
    2: "32x33 shared tile: coalesced reads and writes, no bank conflicts",
}


def _grid2(rows, cols, bx=32, by=8):
    return ((cols + bx - 1) // bx, (rows + by - 1) // by), (bx, by)


def bias_add(y, b) -> None:
    bias_add_kernel[runtime.grid_1d(y.size, runtime.block_threads(256), MAX_BLOCKS)](y, b)


def colsum(a, out) -> None:
    colsum_kernel[runtime.grid_1d(a.shape[1], runtime.block_threads(128))](a, out)


def transpose(a, out, version: int = 2) -> None:
    rows, cols = a.shape
    if version == 1:
        grid, block = _grid2(rows, cols, 32, 8)
        transpose_kernel1[grid, block](a, out)
    else:
        grid = ((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE)
        transpose_kernel2[grid, (TILE, ROWS)](a, out)


def main() -> None:  # python -m fp8lab.kernels.elementwise
    from .. import bench

    M, N = (37, 45) if runtime.IS_SIM else (8192, 8192)
    rng = np.random.default_rng()
    a = rng.standard_normal((M, N), dtype=np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    ceiling = bench.copy_ceiling_gbs(a.nbytes)
    rows = []
    for v, desc in TRANSPOSE_VERSIONS.items():
        out = bench.poisoned((N, M), np.float32)
        transpose(da, out, v)
        bench.assert_close(f"transpose v{v}", out.copy_to_host(), a.T, atol=0, rtol=0)
        ms = runtime.time_ms(lambda: transpose(da, out, v))
        rows.append([f"transpose v{v}: {desc}", "ok", runtime.fmt_ms(ms), bench.gbs(2 * a.nbytes, ms),
                     bench.of_ceiling(2 * a.nbytes, ms, ceiling)])
    y = cuda.to_device(a)
    bias_add(y, db)
    bench.assert_close("bias_add", y.copy_to_host(), a + b, atol=0, rtol=0)
    t = runtime.time_ms(lambda: bias_add(y, db))
    rows.append(["bias_add", "ok", runtime.fmt_ms(t), bench.gbs(2 * a.nbytes, t), bench.of_ceiling(2 * a.nbytes, t, ceiling)])
    s = bench.poisoned(N, np.float32)
    colsum(da, s)
    bench.assert_close("colsum", s.copy_to_host(), a.astype(np.float64).sum(0), atol=1e-4 * np.sqrt(M), rtol=1e-5)
    t = runtime.time_ms(lambda: colsum(da, s))
    rows.append(["colsum", "ok", runtime.fmt_ms(t), bench.gbs(a.nbytes, t), bench.of_ceiling(a.nbytes, t, ceiling)])
    bench.print_table(
        f"elementwise {M}x{N} ({runtime.backend}); copy ceiling {'-' if ceiling is None else f'{ceiling:,.0f} GB/s'}",
        ["kernel", "check", "time", "GB/s", "of copy"], rows)


if __name__ == "__main__":
    main()
