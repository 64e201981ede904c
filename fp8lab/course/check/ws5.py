"""ws5: a shared-memory tiled GEMM kernel, c = a @ b.T, checked on odd shapes against float64."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...device import runtime
from ...device.runtime import cuda
from ._core import fail, launch, question, require_kernel, uses_shared_memory

__all__ = ["GEMM_TILE", "tiled_gemm_kernel"]

GEMM_TILE = 16  # GEMM_TILE x GEMM_TILE threads per block, one output element each


def _gemm_cases(rng):
    t = GEMM_TILE
    shapes = [(t + 5, t + 3, 2 * t + 5), (5, 3, 9)] if runtime.IS_SIM else [(1000, 777, 555), (5, 3, 9)]
    names = ["odd shape, not a multiple of the tile in M, N or K", "smaller than one tile"]
    out = []
    for (M, N, K), name in zip(shapes, names):
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((N, K)).astype(np.float32)
        out.append((f"M={M}, N={N}, K={K} ({name})", a, b))
    return out


@question
def tiled_gemm_kernel(kernel, rng=None):
    """Check a kernel `(a, b, c)`: c = a @ b.T, a (M, K), b (N, K), c (M, N) float32, launched on a grid of
    (ceil(N / GEMM_TILE), ceil(M / GEMM_TILE)) blocks of (GEMM_TILE, GEMM_TILE) threads;
    threadIdx.x runs along n, threadIdx.y along m. The kernel must stage tiles in shared memory."""
    q = "tiled_gemm_kernel"
    py = require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    t = GEMM_TILE
    for name, a, b in _gemm_cases(rng):
        (M, K), N = a.shape, b.shape[0]
        c = bench.poisoned((M, N), np.float32)
        grid = ((N + t - 1) // t, (M + t - 1) // t)
        launch(q, name, kernel, (grid, (t, t)), cuda.to_device(a), cuda.to_device(b), c)
        got = c.copy_to_host()
        ref = a.astype(np.float64) @ b.astype(np.float64).T
        atol = 1e-5 * K * np.abs(a).mean() * np.abs(b).mean()
        n_bad, bad = bench.first_mismatches(got, ref, atol=atol, rtol=1e-5, limit=3)
        if n_bad:
            lines = [f"case {name}: {n_bad} of {got.size} elements of c are wrong, e.g."]
            lines += [f"  c{list(i)}: got {gv!r}, expected {rv!r}" for i, gv, rv in bad]
            fail(q, lines, _gemm_hint(bad, got, a, b, t))
    if uses_shared_memory(py) is False:
        fail(q, ["the results are right, but the kernel uses no shared memory (no cuda.shared.array)"],
              "this question asks for the tiled version: load a GEMM_TILE x GEMM_TILE tile of a and of b into "
              "shared arrays, cuda.syncthreads(), accumulate from them, cuda.syncthreads() again, next tile")
    return f"c = a @ b.T matches float64 on odd shapes (tile {t}x{t}, edges not multiples of the tile)"


def _gemm_hint(bad, got, a, b, t):
    (m, n), gv, rv = bad[0]
    if np.isnan(gv):
        return (f"c[{m}, {n}] is still the NaN poison: is every element written? m = blockIdx.y * {t} + "
                f"threadIdx.y, n = blockIdx.x * {t} + threadIdx.x, and the store guarded by m < M and n < N only")
    K = a.shape[1]
    if K % t and abs(gv - float(a[m, : K - K % t].astype(np.float64) @ b[n, : K - K % t])) < 1e-3 * (1 + abs(gv)):
        return "the last, partial tile of K is missing: loop k0 over range(0, K, TILE) and load zeros where k >= K"
    return ("threads must wait for the whole tile (cuda.syncthreads()) after loading it and again before "
            "overwriting it; out-of-range loads must store 0, not be skipped")
