"""Optimizer steps on FP32 master weights kept in one flat buffer (one launch updates every parameter).

version 1: one grid-stride launch over the flat buffer, for each optimizer:
  adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)
        with bias corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t. DeepSeek-V3 keeps Adam's moments in BF16;
        this course keeps them in FP32 to isolate the effect of FP8 GEMMs.
  sgd:  p -= lr * g
"""

from __future__ import annotations

import math

import numpy as np

from .. import bench, runtime, timing
from ..runtime import cuda

VERSIONS = {1: "one grid-stride launch over the flat FP32 buffer (Adam, SGD)"}
BEST = 1
THREADS = runtime.block_threads(256)


@cuda.jit
def sgd_kernel(p, g, lr):
    i = cuda.grid(1)
    while i < p.size:
        p[i] -= lr * g[i]
        i += cuda.gridsize(1)


@cuda.jit
def adam_kernel(p, g, m, v, lr, b1, b2, eps, bc1, bc2):
    i = cuda.grid(1)
    while i < p.size:
        gi = g[i]
        mi = b1 * m[i] + (np.float32(1) - b1) * gi
        vi = b2 * v[i] + (np.float32(1) - b2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] -= lr * (mi / bc1) / (math.sqrt(vi / bc2) + eps)
        i += cuda.gridsize(1)


class Adam:
    def __init__(self, size: int, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = (np.float32(a) for a in (lr, b1, b2, eps))
        self.m = cuda.to_device(np.zeros(size, np.float32))
        self.v = cuda.to_device(np.zeros(size, np.float32))
        self.t = 0
        self.config = runtime.grid_1d(size, THREADS, runtime.MAX_BLOCKS)

    def step(self, p, g) -> None:
        self.t += 1
        bc1 = np.float32(1 - float(self.b1) ** self.t)
        bc2 = np.float32(1 - float(self.b2) ** self.t)
        adam_kernel[self.config](p, g, self.m, self.v, self.lr, self.b1, self.b2, self.eps, bc1, bc2)


class SGD:
    def __init__(self, size: int, lr=1e-2):
        self.lr = np.float32(lr)
        self.config = runtime.grid_1d(size, THREADS, runtime.MAX_BLOCKS)

    def step(self, p, g) -> None:
        sgd_kernel[self.config](p, g, self.lr)


def reference_adam(p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """NumPy float32 twin of adam_kernel, updating p, m, v in place."""
    f = np.float32
    lr, b1, b2, eps = f(lr), f(b1), f(b2), f(eps)
    bc1, bc2 = f(1 - float(b1) ** t), f(1 - float(b2) ** t)
    m[:] = b1 * m + (f(1) - b1) * g
    v[:] = b2 * v + (f(1) - b2) * g * g
    p -= lr * (m / bc1) / (np.sqrt(v / bc2) + eps)


def reference_sgd(p, g, lr=1e-2):
    """NumPy float32 twin of sgd_kernel, updating p in place."""
    p -= np.float32(lr) * g


reference = reference_adam


def checks(rng) -> list:
    n = 301 if runtime.IS_SIM else (1 << 24) + 3
    p = rng.standard_normal(n, dtype=np.float32)
    g = rng.standard_normal(n, dtype=np.float32)
    out = []
    dp, dg = cuda.to_device(p), cuda.to_device(g)
    opt = Adam(n, lr=1e-2)
    ref_p, m, v = p.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for t in (1, 2, 3):
        opt.step(dp, dg)
        reference_adam(ref_p, g, m, v, t, lr=1e-2)
    bench.assert_close("adam", dp.copy_to_host(), ref_p, atol=1e-7, rtol=1e-6)
    out.append((f"v1 Adam, 3 steps, n = {n:,}", "within float32 tolerance"))
    dp = cuda.to_device(p)
    SGD(n, lr=1e-2).step(dp, dg)
    ref_p = p.copy()
    reference_sgd(ref_p, g, lr=1e-2)
    # a GPU may fuse p - lr * g into one FMA (one rounding, NumPy rounds twice): allow the product's last bit
    bench.assert_close("sgd", dp.copy_to_host(), ref_p, atol=2.0**-23 * 1e-2 * float(np.abs(g).max()), rtol=2.0**-23)
    out.append((f"v1 SGD, n = {n:,}", "within float32 tolerance"))
    return out


def timings(rng, args) -> list:
    n = runtime.sizes("bench")["n"]
    p = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    g = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    adam, sgd = Adam(n), SGD(n, lr=1e-9)
    rows = [bench.Row("v1 Adam", timing.time_ms(lambda: adam.step(p, g)), 4 * n * 7),  # p, g, m, v read; p, m, v written
            bench.Row("v1 SGD", timing.time_ms(lambda: sgd.step(p, g)), 4 * n * 3)]  # p, g read; p written
    return [bench.Table(f"optimizer step, n = {n:,} float32 parameters; bytes = read + written", "GB/s", rows,
                        ceiling=bench.copy_ceiling_gbs(4 * n))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
