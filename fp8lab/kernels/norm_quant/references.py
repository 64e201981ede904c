"""The NumPy spec of the forward and the backward, and the scale dx's float32 error is measured against."""

from __future__ import annotations

import numpy as np

from ...numerics import spec
from .layout import EPS


def _y(x, b) -> np.ndarray:
    """y = x + b in float32, the kernels' first rounding (x itself without a bias)."""
    x = np.asarray(x, np.float32)
    return x if b is None else x + np.asarray(b, np.float32)


def reference_rstd(x, b) -> np.ndarray:
    """rstd in float64 from the float32 y = x + b."""
    y = _y(x, b).astype(np.float64)
    return 1.0 / np.sqrt((y * y).mean(axis=1) + float(EPS))


def reference(x, b, g, rstd=None):
    """(codes, scales, rstd, z) of the forward: the spec of every version.

    rstd: the (M,) values to normalize with; None computes them in float64 (then rounded to float32). Given a
    kernel's rstd, every output is bit for bit the kernel's: z = (y * rstd) * g in float32 (y = x + b in float32),
    codes and scales = spec.quantize(z, "tile").
    """
    y = _y(x, b)
    rstd = np.asarray(reference_rstd(x, b) if rstd is None else rstd, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # a NaN/Inf row gives NaN z, as on the GPU
        z = (y * rstd[:, None]) * np.asarray(g, np.float32)
    codes, scales, _ = spec.quantize(z, "tile")
    return codes, scales, rstd, z


def reference_backward(dz, x, b, g, rstd=None):
    """(dx, gy) in float64 from the float32 y = x + b: dx = rstd g dz - rstd^3 y dot / N, gy = dz y rstd, with
    dot = sum_n dz g y per row. rstd: the forward's (None: float64 `reference_rstd`)."""
    y = _y(x, b).astype(np.float64)
    r = np.asarray(reference_rstd(x, b) if rstd is None else rstd, np.float64)[:, None]
    dz = np.asarray(dz, np.float64)
    g = np.asarray(g, np.float64)
    dot = (dz * g * y).sum(axis=1, keepdims=True)
    return r * g * dz - r**3 * y * dot / y.shape[1], dz * y * r


def dx_error_scale(dz, x, b, g, rstd) -> np.ndarray:
    """(M, N) float64: |rstd g dz| + rstd^3 |y| sum_n |dz g y| / N, what dx's float32 rounding error is a few ulps
    of. dx is a difference of two terms each at most this large, and its dot is a float32 sum whose error is
    bounded by sum |dz g y| times (terms per thread + reduction levels) ulps; comparing dx against the reference
    relative to this scale keeps the check tight on rows of every magnitude, where cancellation makes dx itself
    small."""
    y = _y(x, b).astype(np.float64)
    r = np.asarray(rstd, np.float64)[:, None]
    dzg = np.abs(np.asarray(dz, np.float64) * np.asarray(g, np.float64))
    return r * dzg + r**3 * np.abs(y) * (dzg * np.abs(y)).sum(axis=1, keepdims=True) / y.shape[1]
