"""RMSNorm forward and backward for rows of any length: z = y * rstd * g, rstd = 1 / sqrt(mean(y^2) + eps).

version 1: one thread per row, looping over the row (fine for many short rows, idle SMs otherwise).
version 2: one block per row; threads stride over the row, partial sums meet in a warp-shuffle block
           reduction. Unlike the original CUDA program, the row length need not equal the block size nor
           be a power of two.

Backward, with dot = sum_n dz * g * y over the row:
    dy = rstd * g * dz - rstd^3 * y * dot / N        (per row)
    dg[n] = sum_m dz * y * rstd                        (a column sum over rows: elementwise.colsum)
The backward kernels write `gy = dz * y * rstd` per element so dg needs no atomics.
"""

from __future__ import annotations

import math

import numpy as np

from .. import bench
from ..device import runtime
from ..numerics import spec
from ..bench import timing
from ..device.runtime import cuda
from .common import block_sum
from .versions import Version

EPS = spec.RMSNORM_EPS
THREADS = runtime.block_threads(128)


@cuda.jit
def rmsnorm_forward_kernel1(y, g, z, rstd):
    m = cuda.grid(1)
    if m < y.shape[0]:
        N = y.shape[1]
        ss = np.float32(0)
        for n in range(N):
            ss += y[m, n] * y[m, n]
        r = np.float32(1) / math.sqrt(ss / np.float32(N) + EPS)
        rstd[m] = r
        for n in range(N):
            z[m, n] = y[m, n] * r * g[n]


@cuda.jit
def rmsnorm_forward_kernel2(y, g, z, rstd):
    slots = cuda.shared.array(32, np.float32)
    m = cuda.blockIdx.x
    N = y.shape[1]
    ss = np.float32(0)
    for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
        ss += y[m, n] * y[m, n]
    ss = block_sum(ss, slots)
    r = np.float32(1) / math.sqrt(ss / np.float32(N) + EPS)
    if cuda.threadIdx.x == 0:
        rstd[m] = r
    for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
        z[m, n] = y[m, n] * r * g[n]


@cuda.jit
def rmsnorm_backward_kernel1(dz, y, g, rstd, dy, gy):
    m = cuda.grid(1)
    if m < y.shape[0]:
        N = y.shape[1]
        r = rstd[m]
        dot = np.float32(0)
        for n in range(N):
            dot += dz[m, n] * g[n] * y[m, n]
        c = r * r * r * dot / np.float32(N)
        for n in range(N):
            dy[m, n] = r * g[n] * dz[m, n] - c * y[m, n]
            gy[m, n] = dz[m, n] * y[m, n] * r


@cuda.jit
def rmsnorm_backward_kernel2(dz, y, g, rstd, dy, gy):
    slots = cuda.shared.array(32, np.float32)
    m = cuda.blockIdx.x
    N = y.shape[1]
    r = rstd[m]
    dot = np.float32(0)
    for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
        dot += dz[m, n] * g[n] * y[m, n]
    dot = block_sum(dot, slots)
    c = r * r * r * dot / np.float32(N)
    for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
        dy[m, n] = r * g[n] * dz[m, n] - c * y[m, n]
        gy[m, n] = dz[m, n] * y[m, n] * r


VERSIONS = {  # kernel: (forward, backward)
    1: Version("one thread per row", (rmsnorm_forward_kernel1, rmsnorm_backward_kernel1)),
    2: Version("one block per row, warp-shuffle reduction", (rmsnorm_forward_kernel2, rmsnorm_backward_kernel2)),
}
BEST = 2


def _config(version, rows):
    return (rows, THREADS) if version == 2 else runtime.grid_1d(rows, 64)


def forward(y, g, z, rstd, version: int = BEST) -> None:
    """Device arrays: y (M, N), g (N,) -> z (M, N), rstd (M,)."""
    forward_kernel, _ = VERSIONS[version].kernel
    forward_kernel[_config(version, y.shape[0])](y, g, z, rstd)


def backward(dz, y, g, rstd, dy, gy, version: int = BEST) -> None:
    """Device arrays: dz, y (M, N), g (N,), rstd (M,) -> dy (M, N), gy = dz*y*rstd (M, N)."""
    _, backward_kernel = VERSIONS[version].kernel
    backward_kernel[_config(version, y.shape[0])](dz, y, g, rstd, dy, gy)


def reference_forward(y, g):
    """(z, rstd) in float64: the exact values the kernels' float32 results are bounded against (numerics.ops.rmsnorm
    is the float32 program the NumPy engine runs, a different thing)."""
    y = np.asarray(y, np.float64)
    rstd = 1.0 / np.sqrt((y * y).mean(axis=1) + float(EPS))
    return y * rstd[:, None] * np.asarray(g, np.float64), rstd


def reference_backward(dz, y, g):
    """(dy, dg) in float64, the bound's exact values (numerics.ops.rmsnorm_backward: the NumPy engine's float32)."""
    dz, y, g = (np.asarray(a, np.float64) for a in (dz, y, g))
    _, rstd = reference_forward(y, g)
    dot = (dz * g * y).sum(axis=1)
    dy = rstd[:, None] * g * dz - (rstd**3 * dot / y.shape[1])[:, None] * y
    dg = (dz * y * rstd[:, None]).sum(axis=0)
    return dy, dg


reference = reference_forward


def _inputs(rng, M, N):
    y = rng.standard_normal((M, N), dtype=np.float32) * 3
    g = rng.uniform(0.5, 1.5, N).astype(np.float32)
    dz = rng.standard_normal((M, N), dtype=np.float32)
    return y, g, dz


def checks(rng, only=None) -> list:
    """only: the versions to check (bench.selected); None: all."""
    M, N = (7, 45) if runtime.IS_SIM else (1027, 7171)
    y, g, dz = _inputs(rng, M, N)
    ref_z, ref_r = reference_forward(y, g)
    ref_dy, _ = reference_backward(dz, y, g)
    ref_gy = dz.astype(np.float64) * y * ref_r[:, None]
    dy_, dg_, ddz = cuda.to_device(y), cuda.to_device(g), cuda.to_device(dz)
    out = []
    for v in (v for v in VERSIONS if bench.selected(only, v)):
        z, r = bench.poisoned((M, N), np.float32), bench.poisoned(M, np.float32)
        dyo, gy = bench.poisoned((M, N), np.float32), bench.poisoned((M, N), np.float32)
        forward(dy_, dg_, z, r, v)
        backward(ddz, dy_, dg_, r, dyo, gy, v)
        bench.assert_close(f"forward z v{v}", z.copy_to_host(), ref_z, atol=1e-5, rtol=1e-5)
        bench.assert_close(f"forward rstd v{v}", r.copy_to_host(), ref_r, atol=0, rtol=1e-5)
        bench.assert_close(f"backward dy v{v}", dyo.copy_to_host(), ref_dy, atol=1e-5, rtol=1e-4)
        bench.assert_close(f"backward gy v{v}", gy.copy_to_host(), ref_gy, atol=1e-6, rtol=1e-5)
        out.append((f"v{v} forward and backward, {M}x{N}", "within tolerance of float64"))
    return out


def timings(rng, args) -> list:
    """Every version (those in args.only), forward and backward, on 8192 x 7168 float32."""
    M, N = 8192, 7168
    y, g, dz = _inputs(rng, M, N)
    dy_, dg_, ddz = cuda.to_device(y), cuda.to_device(g), cuda.to_device(dz)
    z, r = cuda.device_array((M, N), np.float32), cuda.device_array(M, np.float32)
    dyo, gy = cuda.device_array((M, N), np.float32), cuda.device_array((M, N), np.float32)
    rows = []
    for v, desc in VERSIONS.items():
        if not bench.selected(getattr(args, "only", None), v):
            continue
        rows.append(bench.Row(f"v{v} forward: {desc}", timing.time_ms(lambda v=v: forward(dy_, dg_, z, r, v)),
                              2 * y.nbytes))  # read y, write z
        rows.append(bench.Row(f"v{v} backward: {desc}",
                              timing.time_ms(lambda v=v: backward(ddz, dy_, dg_, r, dyo, gy, v)),
                              4 * y.nbytes))  # read dz, y; write dy, gy
    return [bench.Table(f"RMSNorm {M}x{N} float32; bytes = rows read + rows written", "GB/s", rows,
                        ceiling=bench.copy_ceiling_gbs(y.nbytes))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
