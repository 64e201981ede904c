"""Mean-squared-error loss and its gradient in one pass, reduced without per-element atomics.

loss = sum((z - t)^2) / count,   dz = 2 (z - t) / count

version 1: stage 1, a grid-stride loop writes dz and each block reduces its squared errors with warp shuffles
           into one partial sum per block; stage 2, one block adds the partials. The original CUDA program
           issued one atomicAdd per element on a single address: every add waited for the one before it, and
           the float sum changed from run to run. Here the order is fixed, so the loss is deterministic.
"""

from __future__ import annotations

import numpy as np

from .. import bench
from ..device import runtime
from ..bench import timing
from ..device.runtime import cuda
from .common import block_sum
from .versions import Version

THREADS = runtime.block_threads(256)
PARTIALS = 4 if runtime.IS_SIM else 256
"""Blocks of stage 1, so partial sums stage 2 adds (a grid-stride loop covers the rest)."""


@cuda.jit
def mse_partial_kernel(z, t, inv_count, dz, partial):
    slots = cuda.shared.array(32, np.float32)
    acc = np.float32(0)
    i = cuda.grid(1)
    while i < z.size:
        d = z[i] - t[i]
        dz[i] = np.float32(2) * d * inv_count
        acc += d * d
        i += cuda.gridsize(1)
    acc = block_sum(acc, slots)
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = acc


@cuda.jit
def mse_finalize_kernel(partial, nparts, inv_count, loss):
    slots = cuda.shared.array(32, np.float32)
    acc = np.float32(0)
    i = cuda.threadIdx.x
    while i < nparts:
        acc += partial[i]
        i += cuda.blockDim.x
    acc = block_sum(acc, slots)
    if cuda.threadIdx.x == 0:
        loss[0] = acc * inv_count


VERSIONS = {1: Version("fused dz and per-block partial sums (warp shuffles), one-block finalize",
                       (mse_partial_kernel, mse_finalize_kernel))}
BEST = 1


class MSELoss:
    """Buffers for one problem size, allocated once: `loss` (1,) and `dz` (shape) on the device."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.size = int(np.prod(shape))
        self.blocks, _ = runtime.grid_1d(self.size, THREADS, PARTIALS)
        self.partial = cuda.device_array(self.blocks, np.float32)
        self.loss = cuda.device_array(1, np.float32)
        self.dz = cuda.device_array(self.shape, np.float32)
        self.inv_count = np.float32(1.0 / self.size)

    def __call__(self, z, t):
        partial, finalize = VERSIONS[BEST].kernel
        partial[self.blocks, THREADS](
            z.reshape(self.size), t.reshape(self.size), self.inv_count, self.dz.reshape(self.size), self.partial)
        finalize[1, THREADS](self.partial, self.blocks, self.inv_count, self.loss)
        return self


def reference(z, t):
    """(loss, dz) in float64: the bound's exact values (numerics.ops.mse is the teacher task's float32 program)."""
    d = np.asarray(z, np.float64) - np.asarray(t, np.float64)
    return (d * d).mean(), 2 * d / d.size


def checks(rng) -> list:
    shape = (37, 53) if runtime.IS_SIM else (4099, 8191)
    z = rng.standard_normal(shape, dtype=np.float32)
    t = rng.standard_normal(shape, dtype=np.float32)
    f = MSELoss(shape)
    f.dz.copy_to_device(np.full(shape, np.nan, np.float32))
    f.loss.copy_to_device(np.full(1, np.nan, np.float32))
    f(cuda.to_device(z), cuda.to_device(t))
    ref_loss, ref_dz = reference(z, t)
    bench.assert_close("loss", f.loss.copy_to_host(), [ref_loss], atol=0, rtol=1e-5)
    bench.assert_close("dz", f.dz.copy_to_host(), ref_dz, atol=0, rtol=1e-5)
    return [(f"v1 loss and dz, {shape}", "within tolerance of float64")]


def timings(rng, args) -> list:
    shape = (8192, 8192)
    z = cuda.to_device(rng.standard_normal(shape, dtype=np.float32))
    t = cuda.to_device(rng.standard_normal(shape, dtype=np.float32))
    f = MSELoss(shape)
    nbytes = 3 * 4 * f.size  # read z and t, write dz
    return [bench.Table(f"MSE loss and gradient, {shape} float32; bytes = z, t read + dz written", "GB/s",
                        [bench.Row(f"v1: {VERSIONS[1]}", timing.time_ms(lambda: f(z, t)), nbytes)],
                        ceiling=bench.copy_ceiling_gbs(4 * f.size))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
