"""What every quantize_fine kernel shares: the scale rule of one group as a device function (spec.group_scale's,
built per format and scale mode: common.make_group_scale, which the fused kernels of other modules use too), the
float32 constants the kernels compile in, the elementwise kernels' block size and the NumPy reference the kernels
match bit for bit (spec.quantize)."""

from __future__ import annotations

import numpy as np

from ...device import runtime
from ...numerics import spec
from ..common import make_group_scale  # noqa: F401  (re-exported: the rule lives in common, beside its users)

ELEMENTWISE_THREADS = runtime.block_threads(256)  # version 1's cast kernel and dequantize: threads per block

ZERO = np.float32(0.0)


reference = spec.quantize
"""The spec: (codes, scale, scale_codes) of x for a granularity, bit for bit what the kernels write."""
