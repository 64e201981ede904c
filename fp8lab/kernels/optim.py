"""Optimizer steps on FP32 master weights kept in one flat buffer (one launch updates every parameter).

sgd:  p -= lr * g
adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)
      with bias corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t. DeepSeek-V3 keeps Adam's moments in BF16;
      this course keeps them in FP32 to isolate the effect of FP8 GEMMs.
"""

from __future__ import annotations

import math

import numpy as np

from .. import runtime
from ..runtime import cuda

THREADS = runtime.block_threads(256)
MAX_BLOCKS = 8 if runtime.IS_SIM else 1024


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
        self.config = runtime.grid_1d(size, THREADS, MAX_BLOCKS)

    def step(self, p, g) -> None:
        self.t += 1
        bc1 = np.float32(1 - float(self.b1) ** self.t)
        bc2 = np.float32(1 - float(self.b2) ** self.t)
        adam_kernel[self.config](p, g, self.m, self.v, self.lr, self.b1, self.b2, self.eps, bc1, bc2)


class SGD:
    def __init__(self, size: int, lr=1e-2):
        self.lr = np.float32(lr)
        self.config = runtime.grid_1d(size, THREADS, MAX_BLOCKS)

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
