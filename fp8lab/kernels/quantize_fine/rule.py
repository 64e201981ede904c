"""What every quantize_fine kernel shares: the scale rule of one group as a device function (spec.group_scale's,
built per format and scale mode), the float32 constants the kernels compile in, the elementwise kernels' block size
and the NumPy reference the kernels match bit for bit (spec.quantize)."""

from __future__ import annotations

import math

import numpy as np

from ...device import runtime
from ...device.runtime import cuda
from ...numerics import spec
from ...numerics.spec import AMAX_FLOOR, DEEPGEMM_AMAX_FLOOR, DEEPGEMM_INV_MAX, E8M0_NAN, EMAX_ELEM, FP8_MAX, MODES

ELEMENTWISE_THREADS = runtime.block_threads(256)  # version 1's cast kernel and dequantize: threads per block

ZERO = np.float32(0.0)
_F32_MAX = np.float32(np.finfo(np.float32).max)
_F32_NAN = np.float32(np.nan)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)


def make_group_scale(fmt: str, mode: str):
    """The scale rule of one group (spec.group_scale) as a device function, one per (fmt, mode)."""
    fp8_max = FP8_MAX[fmt]
    emax = EMAX_ELEM[fmt]
    mx_mul = np.float32(2.0 ** -(1 + emax))  # 2^e (from frexp) * 2^-(1+emax) = 2^(floor(log2 amax) - emax)
    mode_id = MODES.index(mode)
    if mode_id >= 4 and fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' for mode {mode!r} (DeepGEMM's casts divide by 448), got {fmt!r}")
    floor = DEEPGEMM_AMAX_FLOOR if mode_id >= 4 else AMAX_FLOOR

    @cuda.jit(device=True)
    def group_scale(amax):
        """(scale, inv_scale, e8m0_code) of a group from its amax; NaN scales for a NaN/Inf amax
        (spec.group_scale, the same rule in NumPy)."""
        if not amax <= _F32_MAX:  # NaN compares false; +Inf is above the largest float32
            return _F32_NAN, _F32_NAN, E8M0_NAN
        safe = amax if amax > floor else floor
        if mode_id == 0:  # amax / FP8_MAX
            return safe / fp8_max, fp8_max / safe, 0
        if mode_id == 4:  # DeepGEMM as PyTorch computes it: amax * fl32(1/448), then 1 / scale
            s = safe * DEEPGEMM_INV_MAX
            return s, _ONE / s, 0
        if mode_id == 2:  # OCP: 2^(floor(log2 amax) - emax_elem)
            m, e = math.frexp(safe)  # safe = m * 2^e, 0.5 <= m < 1, so floor(log2 safe) = e - 1
            s = (safe / m) * mx_mul  # safe / m == 2^e exactly
            return s, _ONE / s, int(e) + (126 - emax)
        t = safe * DEEPGEMM_INV_MAX if mode_id == 5 else safe / fp8_max  # modes 1, 3, 5: t rounded up to 2^e
        m, e = math.frexp(t)
        if m == _HALF:  # t is already a power of two, 2^(e-1)
            return t, _ONE / t, int(e) + 126
        s = t / m  # 2^e exactly
        return s, _ONE / s, int(e) + 127

    return group_scale


reference = spec.quantize
"""The spec: (codes, scale, scale_codes) of x for a granularity, bit for bit what the kernels write."""
