"""A NumPy port of DeepGEMM's reference FP8 casts, the oracle of fl.quantize(convention="deepgemm").

deepseek-ai/DeepGEMM, deep_gemm/utils/math.py (commit 54e2261): `per_token_cast_to_fp8`, `per_block_cast_to_fp8`
and `ceil_to_ue8m0`. The port reproduces what PyTorch computes on CUDA, not the exact math:

- `x.abs().float().amax(...)`: exact (x is BF16, the max of absolute values rounds nothing); zero padding to a
  multiple of gran_k cannot change it.
- `.clamp(1e-4)`: the float32 1e-4.
- `x_amax / 448.0`: a CUDA tensor divided by a Python number (a CPU scalar) is multiplied by the float32
  reciprocal of the number (div_true_kernel_cuda in aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu): two
  roundings, amax * fl32(1/448), not the correctly rounded amax / 448.
- `1.0 / sf`: Tensor.__rtruediv__ is `sf.reciprocal() * 1.0`, one IEEE float32 division.
- `x_view * inv`: BF16 times float32 promotes to float32, one rounding.
- `.to(torch.float8_e4m3fn)`: round to nearest even; |v| above 464 becomes NaN (c10's fp8e4m3fn_from_fp32_value);
  ml_dtypes' cast does the same. Here |v| never exceeds 448 by more than a rounding.
- `ceil_to_ue8m0` (this commit's): the float32's exponent, plus one when its mantissa is not zero, clamped to
  [1, 254]: the exact ceiling to a power of two. DeepGEMM at commit 0f5f266 and older computed
  `torch.pow(2.0, torch.ceil(torch.log2(x.abs())))`, where log2 of a float32 just above a power of two can round
  to that integer; this port follows the current code.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ceil_to_ue8m0(x: np.ndarray) -> np.ndarray:
    bits = np.abs(x).astype(F32).view(np.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).astype(np.int32)
    return (np.clip(exp, 1, 254).astype(np.int32) << 23).view(F32)


def _scale(x_amax: np.ndarray, use_ue8m0: bool) -> np.ndarray:
    x_amax = np.maximum(x_amax, F32(1e-4))                   # .clamp(1e-4)
    sf = (x_amax * (F32(1.0) / F32(448.0))).astype(F32)     # x_amax / 448.0 on CUDA
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def _cast(x_view: np.ndarray, sf: np.ndarray) -> np.ndarray:
    inv = (F32(1.0) / sf).astype(F32)                        # 1.0 / sf
    v = (x_view.astype(F32) * inv).astype(F32)               # bf16 * float32 -> float32
    return v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # .to(torch.float8_e4m3fn)


def _bf16(x) -> np.ndarray:
    x = np.asarray(x, F32)
    assert np.array_equal(x.astype(ml_dtypes.bfloat16).astype(F32), x), "x must hold BF16 values"
    return x


def per_token_cast_to_fp8(x, use_ue8m0: bool, gran_k: int = 128):
    """(codes (m, n) uint8, sf (m, ceil(n / gran_k)) float32) of BF16 values x (m, n)."""
    x = _bf16(x)
    m, n = x.shape
    padded_n = _ceil_div(n, gran_k) * gran_k
    x_padded = np.zeros((m, padded_n), F32)
    x_padded[:, :n] = x
    x_view = x_padded.reshape(m, padded_n // gran_k, gran_k)
    sf = _scale(np.abs(x_view).max(axis=2), use_ue8m0)
    codes = _cast(x_view, sf[:, :, None]).reshape(m, padded_n)[:, :n]
    return np.ascontiguousarray(codes), sf


def per_block_cast_to_fp8(x, use_ue8m0: bool, gran_k: int = 128):
    """(codes (m, n) uint8, sf (ceil(m / gran_k), ceil(n / gran_k)) float32) of BF16 values x (m, n)."""
    x = _bf16(x)
    m, n = x.shape
    x_padded = np.zeros((_ceil_div(m, gran_k) * gran_k, _ceil_div(n, gran_k) * gran_k), F32)
    x_padded[:m, :n] = x
    x_view = x_padded.reshape(-1, gran_k, x_padded.shape[1] // gran_k, gran_k)
    sf = _scale(np.abs(x_view).max(axis=(1, 3), keepdims=True), use_ue8m0)
    codes = _cast(x_view, sf).reshape(x_padded.shape)[:m, :n]
    return np.ascontiguousarray(codes), sf.reshape(x_view.shape[0], x_view.shape[2])


def bf16_inputs(rng, shape, gran_k: int = 128) -> np.ndarray:
    """Random BF16 values (float32 arrays) with what stresses the casts: a few outliers, a group of zeros (the
    1e-4 clamp), rows scaled to huge (2^100) and tiny (2^-120, below the clamp, some float32 subnormals)."""
    x = rng.standard_normal(shape, dtype=F32)
    x[rng.random(shape) < 0.01] *= 50
    x[0, :min(gran_k, shape[1])] = 0                           # an all-zero group (tile and, with it, nothing else)
    if shape[0] > 2:
        x[1] *= F32(2.0 ** 100)
        x[2] *= F32(2.0 ** -120)
    return x.astype(ml_dtypes.bfloat16).astype(F32)
