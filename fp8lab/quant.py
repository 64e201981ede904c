"""Public quantization API: `quantize`, `dequantize`, `QuantizedTensor`, and `fp8_gemm` on them.

Granularity "tensor" (one current scale per tensor) is implemented by the kernels in
kernels/quantize.py; the fine-grained ones (row, 1x128 tile, 128x128 block, MX) come with the formats and
quantization lesson.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _validate as V
from . import formats, runtime
from .kernels import gemm_nt
from .kernels import quantize as qk

FMTS = ("e4m3", "e5m2")
GRANULARITIES = ("tensor",)


@dataclasses.dataclass
class QuantizedTensor:
    """FP8 codes plus dequantization scales: x ~= decode(data, fmt) * scale.

    data: uint8 codes, the shape of x. scale: float32, shape (1,) for granularity "tensor".
    Both are NumPy arrays when quantize() was given a NumPy array, device arrays when given a device array.
    """

    data: object
    scale: object
    fmt: str
    granularity: str
    block: int | None = None

    @property
    def shape(self):
        return tuple(self.data.shape)


def _fmt_name(fmt) -> str:
    name = formats.get_format(fmt).name
    if name not in FMTS:
        raise ValueError(f"fmt must be one of {FMTS} for quantization, got {fmt!r}")
    return name


def quantize(x, fmt="e4m3", granularity: str = "tensor", block: int = 128) -> QuantizedTensor:
    """Quantize float32 `x` (NumPy or device array, any shape) to FP8 codes with one scale per tensor.

    scale = amax / FP8_MAX (448 for E4M3), so the largest |x| encodes to exactly +-FP8_MAX; rounding is to
    nearest even, saturating. NaN in x makes every code NaN (the scale is NaN). NumPy inputs of other float
    dtypes are converted to float32 first; device arrays must already be float32.
    """
    name = _fmt_name(fmt)
    V.choice("granularity", granularity, GRANULARITIES)
    V.positive_int("block", block)
    on_device = V.is_device_array(x)
    if on_device:
        arr = V.array("x", x, dtype=np.float32)
    else:
        arr = V.array("x", x, dtype=(np.float16, np.float32, np.float64))
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    q = qk.TensorQuantizer(arr.shape, fmt=name)
    q(V.to_device(arr))
    if on_device:
        return QuantizedTensor(q.codes, q.scale, name, granularity)
    return QuantizedTensor(q.codes.copy_to_host(), q.scale.copy_to_host(), name, granularity)


def dequantize(q: QuantizedTensor):
    """float32 array: decode(q.data) * q.scale (NumPy in, NumPy out; device in, device out)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q must be a QuantizedTensor (from fp8lab.quantize), got {V.describe(q)}")
    on_device = V.is_device_array(q.data)
    codes = V.array("q.data", q.data, dtype=np.uint8)
    scale = V.array("q.scale", q.scale, dtype=np.float32, shape=(1,))
    out = runtime.cuda.device_array(codes.shape, np.float32)
    qk.dequantize(V.to_device(codes), V.to_device(scale), out, q.fmt)
    return out if on_device else out.copy_to_host()


def fp8_gemm(qa: QuantizedTensor, qb: QuantizedTensor, out=None, version: int | None = None):
    """y = dequant(qa) @ dequant(qb).T in float32: qa (M, K), qb (N, K), the Linear-layer "NT" layout.

    The scales are applied to each FP32 sum inside the kernel (matrices are never dequantized in global
    memory). Per-tensor E4M3 inputs for now. `out`: optional float32 (M, N) device array to write into.
    """
    for name, q in (("qa", qa), ("qb", qb)):
        if not isinstance(q, QuantizedTensor):
            raise TypeError(f"{name} must be a QuantizedTensor (from fp8lab.quantize), got {V.describe(q)}")
        if q.fmt != "e4m3" or q.granularity != "tensor":
            raise ValueError(f"{name} must be E4M3 with granularity 'tensor', got {q.fmt!r}/{q.granularity!r}")
        V.array(f"{name}.data", q.data, dtype=np.uint8, ndim=2)
    (M, K), (N, K2) = qa.shape, qb.shape
    if K != K2:
        raise ValueError(f"qa and qb must share K (the second dimension): got qa {qa.shape}, qb {qb.shape}")
    version = gemm_nt.BEST if version is None else version
    V.choice("version", str(version), tuple(str(v) for v in gemm_nt.VERSIONS))
    on_device = V.is_device_array(qa.data)
    if out is None:
        y = runtime.cuda.device_array((M, N), np.float32)
    else:
        y = V.array("out", out, dtype=np.float32, shape=(M, N))
        if not V.is_device_array(y):
            raise TypeError(f"out must be a device array, got {V.describe(out)}")
    gemm_nt.launch(V.to_device(qa.data), V.to_device(qa.scale), V.to_device(qb.data), V.to_device(qb.scale),
                   y, version)
    return y if (on_device or out is not None) else y.copy_to_host()
