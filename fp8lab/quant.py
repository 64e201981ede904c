"""Public quantization API: `quantize`, `dequantize`, `QuantizedTensor`, `requantize_tile_to_col`.
(`fp8_gemm` on QuantizedTensors lives in kernels/fp8_gemm/.)

Granularity "tensor" (one current scale per tensor) is implemented by the kernels in kernels/quantize.py; the
fine-grained ones (row, 1x128 tile, 128x128 block, MX groups of 32) by kernels/quantize_fine/.
fp8lab/numerics/spec.py states the scale rules and the edge-case policies (partial groups, all-zero groups,
NaN/Inf) and is the NumPy reference of every result here.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import _validate as V
from .device import runtime
from .numerics import spec
from .kernels import quantize as qk
from .kernels import quantize_fine as qf
from .numerics.spec import CONVENTIONS, GRANULARITIES, MX_RULES, QuantizedTensor

__all__ = ["quantize", "dequantize", "requantize_tile_to_col", "QuantizedTensor"]

# Seconds a call takes under the simulator (runtime.SimCost, fitted as docs/notes/simulator.md says), by granularity
SIM_COST = {
    "fl.quantize": {"tensor": runtime.SimCost(0.5, 6.9e-5), "row": runtime.SimCost(0.2, 4.4e-5),
                    "tile": runtime.SimCost(0.2, 5.9e-5), "block": runtime.SimCost(0, 5.1e-5),
                    "mx": runtime.SimCost(0.1, 9.9e-5)},
    "fl.dequantize": {"tensor": runtime.SimCost(0, 4.7e-5), "fine": runtime.SimCost(0, 5.5e-5)},
    "fl.requantize_tile_to_col": runtime.SimCost(0, 2.2e-4),
}


def quantize(x, fmt="e4m3", granularity: str = "tensor", block: int = 128, pow2_scale: bool = False,
             mx_rule: str = "floor", convention: str = "fp8lab") -> QuantizedTensor:
    """Quantize float32 `x` (NumPy or device array) to FP8 codes with one scale per group.

    granularity: "tensor" (any shape but 0-d, one scale), or for a 2-D x (M, K): "row" (1 x K groups), "tile"
    (1 x block along K: DeepSeek-V3 activations), "block" (block x block: DeepSeek-V3 weights), "mx" (1 x 32,
    E8M0 power-of-two scales, OCP MX). "block" also takes a 3-D x (E, N, K), one weight per routed expert: each
    x[e] gets its own blocks, scale (E, ceil(N/block), ceil(K/block)) (the operand fl.fp8_grouped_gemm takes).
    Groups at the right/bottom edge are partial when K (M) is not a multiple of the group size: their amax is over
    the elements that exist. block: a positive int up to MAX_GROUP
    (1024) for "tile" and "block"; ignored, and not checked, for "tensor", "row" and "mx". fmt: "e4m3" or
    "e5m2" in any spelling formats.get_format takes ("E4M3", "float8_e4m3fn", fl.E4M3).

    scale = amax / FP8_MAX (448 for E4M3), so each nonzero group's largest |x| encodes to exactly +-FP8_MAX;
    rounding is to nearest even, saturating. pow2_scale=True rounds each scale UP to a power of two (no
    element saturates; DeepSeek-V3 does so where it re-tiles 1 x 128 tiles to 128 x 1 (arXiv 2412.19437, section
    3.3.3), Transformer Engine's Float8BlockScaling everywhere: its quantization factor FP8_MAX / amax is rounded
    down); not available for "tensor". mx_rule: "floor" (OCP: 2^(floor(log2 amax) - emax_elem); elements above
    FP8_MAX then saturate) or "ceil" (NVIDIA/TE: the scale rounded up, nothing saturates).

    convention: "fp8lab" (the rules above) or "deepgemm": the codes and scales of DeepGEMM's reference casts
    (deepseek-ai/DeepGEMM, deep_gemm/utils/math.py: `per_token_cast_to_fp8` for "tile", `per_block_cast_to_fp8`
    for "block", gran_k = block; pow2_scale=True is their `use_ue8m0=True`) bit for bit, as PyTorch computes them
    on CUDA: amax floored at 1e-4, scale = amax * float32(1/448), codes = encode(x * (1 / scale)). E4M3 only, and
    for "tile" and "block" only. Their scales differ from "fp8lab"'s in the last bit for many groups (two roundings
    instead of one; numerics/spec.py says why), and so do a few codes. NaN/Inf groups are poisoned as below (the
    references assume finite input).

    Edge cases: an all-zero group gets codes 0 and the finite scale AMAX_FLOOR / FP8_MAX (amax is floored at
    1e-12, as for "tensor"; with convention="deepgemm" at 1e-4, so its scale is 1e-4 * float32(1/448)). NaN or +-Inf poisons the group that holds it (for "tensor": the whole tensor):
    scale NaN and every code 0x7F (NaN), so it dequantizes to NaN and the loss shows it; other groups are
    unaffected. For NumPy input `q.nonfinite_groups` counts the poisoned groups and a RuntimeWarning says so
    (device results are not copied back to count them; the kernels apply the same policy).
    NumPy inputs of dtype float16/float64 are converted to float32 (ValueError for finite float64 values beyond
    float32's range, which would become Inf), and non-contiguous ones (slices, transposes) are copied to a
    contiguous array first; device arrays must be float32 and C-contiguous.
    """
    name = spec.fmt_name(fmt)
    V.choice("granularity", granularity, GRANULARITIES)
    if granularity in ("tile", "block"):
        block = V.positive_int("block", block)
        if block > spec.MAX_GROUP:
            raise ValueError(f"block must be at most {spec.MAX_GROUP} for granularity {granularity!r}, got {block}")
    if not isinstance(pow2_scale, (bool, np.bool_)):
        raise TypeError(f"pow2_scale must be a bool, got {V.describe(pow2_scale)}")
    V.choice("mx_rule", mx_rule, MX_RULES)
    V.choice("convention", convention, CONVENTIONS)
    if convention == "deepgemm":
        if granularity not in ("tile", "block"):
            raise ValueError(f"convention 'deepgemm' needs granularity 'tile' (per_token_cast_to_fp8) or 'block' "
                             f"(per_block_cast_to_fp8), got granularity {granularity!r}")
        if name != "e4m3":
            raise ValueError(f"convention 'deepgemm' needs fmt 'e4m3' (DeepGEMM's casts divide by 448), got fmt "
                             f"{name!r}")
    on_device = V.is_device_array(x)
    if on_device:
        arr = V.array("x", x, dtype=np.float32)
    else:
        arr = V.array("x", x, dtype=(np.float16, np.float32, np.float64))
    if arr.ndim == 0:
        raise ValueError(f"x must have at least one dimension (np.atleast_1d makes a scalar 1-D), got "
                         f"{V.describe(arr)}")
    if not on_device:
        arr = V.float32_host("x", arr)
    runtime.sim_check("fl.quantize", arr.shape, SIM_COST["fl.quantize"][granularity])  # warns if it takes minutes
    if granularity == "tensor":
        if pow2_scale:
            raise ValueError("pow2_scale=True needs a fine granularity ('row', 'tile', 'block', 'mx'), "
                             "got granularity 'tensor'")
        q = qk.TensorQuantizer(arr.shape, fmt=name)
        q(runtime.to_device(arr))
        if on_device:
            return QuantizedTensor(q.codes, q.scale, name, granularity)
        return _count_nonfinite(QuantizedTensor(q.codes.copy_to_host(), q.scale.copy_to_host(), name, granularity))
    if convention == "deepgemm":
        mode = "deepgemm_ue8m0" if pow2_scale else "deepgemm"
    else:
        mode = "pow2" if pow2_scale else "amax"
    return _quantize_fine(arr, on_device, name, granularity, block, mode, mx_rule)


def _quantize_fine(arr, on_device, fmt, granularity, block, mode, mx_rule) -> QuantizedTensor:
    if arr.ndim == 3 and granularity == "block":  # (E, N, K): each expert's own blocks
        return _quantize_experts(arr, on_device, fmt, block, mode)
    if arr.ndim != 2:
        raise ValueError(f"granularity must be one of ('tensor',) for x that is not 2-D (or 'block' for a 3-D x, one "
                         f"matrix per expert): {granularity!r} needs x of shape (M, K), got {V.describe(arr)}")
    if on_device and not arr.is_c_contiguous():
        raise ValueError(f"x must be C-contiguous when it is a device array, got {V.describe(arr)}")
    dx = runtime.to_device(arr)
    codes = runtime.cuda.device_array(arr.shape, np.uint8)
    scale = runtime.cuda.device_array(spec.scale_shape(granularity, arr.shape, block), np.float32)
    scale_codes = None
    if granularity == "row":
        qf.quantize_row(dx, codes, scale, fmt=fmt, mode=mode)
        block = None
    elif granularity == "tile":
        qf.quantize_tile(dx, codes, scale, fmt=fmt, block=block, mode=mode)
    elif granularity == "block":
        qf.quantize_block(dx, codes, scale, fmt=fmt, block=block, mode=mode)
    else:  # mx: power-of-two scales whatever pow2_scale says
        scale_codes = runtime.cuda.device_array(scale.shape, np.uint8)
        qf.quantize_mx(dx, codes, scale, scale_codes, fmt=fmt, rule=mx_rule)
        block = spec.MX_GROUP
    if on_device:
        return QuantizedTensor(codes, scale, fmt, granularity, block, scale_codes)
    return _count_nonfinite(QuantizedTensor(codes.copy_to_host(), scale.copy_to_host(), fmt, granularity, block,
                                            None if scale_codes is None else scale_codes.copy_to_host()))


def _quantize_experts(arr, on_device, fmt, block, mode) -> QuantizedTensor:
    """x (E, N, K): block x block groups within each x[e] (a routed expert's weight), scale (E, ceil(N / block),
    ceil(K / block)); the same codes and scales as quantizing each x[e] on its own."""
    if on_device and not arr.is_c_contiguous():
        raise ValueError(f"x must be C-contiguous when it is a device array, got {V.describe(arr)}")
    dx = runtime.to_device(arr)
    E = arr.shape[0]
    codes = runtime.cuda.device_array(arr.shape, np.uint8)
    scale = runtime.cuda.device_array((E,) + spec.scale_shape("block", arr.shape[1:], block), np.float32)
    for e in range(E):
        qf.quantize_block(dx[e], codes[e], scale[e], fmt=fmt, block=block, mode=mode)
    if on_device:
        return QuantizedTensor(codes, scale, fmt, "block", block)
    return _count_nonfinite(QuantizedTensor(codes.copy_to_host(), scale.copy_to_host(), fmt, "block", block))


def _count_nonfinite(q: QuantizedTensor) -> QuantizedTensor:
    """Count the groups poisoned by NaN/Inf (host results only) and say so once."""
    q.nonfinite_groups = int(np.count_nonzero(~np.isfinite(q.scale)))
    if q.nonfinite_groups:
        warnings.warn(f"x has NaN/Inf in {q.nonfinite_groups} of {q.scale.size} {q.granularity} group(s): their "
                      "scales and codes are NaN", RuntimeWarning, stacklevel=V.user_stacklevel())
    return q


def _check_quantized(name: str, q) -> tuple[str, str, int | None]:
    """q's (fmt, granularity, block), checked again here: the fields may have changed since construction."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"{name} must be a QuantizedTensor (from fp8lab.quantize), got {V.describe(q)}")
    return spec.check_layout(q.fmt, q.granularity, q.block, prefix=f"{name}.")


def dequantize(q: QuantizedTensor):
    """float32 array: decode(q.data) * q.scale, each scale broadcast over its group (NumPy in, NumPy out;
    device in, device out). NaN codes (and NaN scales) give NaN, an infinite scale Inf or NaN (a zero code);
    the scales are not checked for finiteness."""
    fmt, granularity, block = _check_quantized("q", q)
    on_device = V.is_device_array(q.data)
    codes = V.array("q.data", q.data, dtype=np.uint8)
    if codes.ndim == 0:
        raise ValueError(f"q.data must have at least one dimension, got {V.describe(codes)}")
    runtime.sim_check("fl.dequantize", codes.shape,
                      SIM_COST["fl.dequantize"]["tensor" if granularity == "tensor" else "fine"])
    out = runtime.cuda.device_array(codes.shape, np.float32)
    if granularity == "tensor":
        scale = V.array("q.scale", q.scale, dtype=np.float32, shape=(1,))
        qk.dequantize(runtime.to_device(codes), runtime.to_device(scale), out, fmt)
    elif codes.ndim == 3 and granularity == "block":  # one matrix per expert, each with its own blocks
        scale = V.array("q.scale", q.scale, dtype=np.float32,
                        shape=(codes.shape[0],) + spec.scale_shape("block", codes.shape[1:], block))
        dcodes, dscale = runtime.to_device(codes), runtime.to_device(scale)
        for e in range(codes.shape[0]):
            qf.dequantize(dcodes[e], dscale[e], block, block, out[e], fmt=fmt)
    else:
        codes = V.array("q.data", codes, dtype=np.uint8, ndim=2)
        scale = V.array("q.scale", q.scale, dtype=np.float32,
                        shape=spec.scale_shape(granularity, codes.shape, block))
        gm, gk = spec.group_shape(granularity, codes.shape, block)
        qf.dequantize(runtime.to_device(codes), runtime.to_device(scale), gm, gk, out, fmt=fmt)
    return out if on_device else out.copy_to_host()


def requantize_tile_to_col(q: QuantizedTensor, pow2_scale: bool = False) -> QuantizedTensor:
    """Re-quantize 1 x block tiles of x (M, K) as block x 1 tiles, on the device, from codes and scales only.

    Returns a QuantizedTensor of x.T with granularity "tile": data (K, M) uint8, the codes of x.T row-major;
    scale (K, ceil(M/block)) float32, where scale[k, j] belongs to the block x 1 group
    x[j*block:(j+1)*block, k] (the last group partial when M is not a multiple of block). This is the layout
    the Wgrad GEMM (dW = dY.T @ X, a reduction over the M tokens) needs (DeepSeek-V3, section 3.3), and
    `dequantize` of the result approximates x.T. Each value is decoded in registers (code * old scale),
    re-scaled by the new group amax and re-encoded: two roundings, no float32 copy of x in global memory.
    A NaN/Inf tile poisons every column group it overlaps.
    """
    fmt, granularity, block = _check_quantized("q", q)
    if granularity != "tile":
        raise ValueError(f"q must have granularity 'tile' (1 x block tiles along K), got {granularity!r}")
    if not isinstance(pow2_scale, (bool, np.bool_)):
        raise TypeError(f"pow2_scale must be a bool, got {V.describe(pow2_scale)}")
    on_device = V.is_device_array(q.data)
    codes = V.array("q.data", q.data, dtype=np.uint8, ndim=2)
    scale = V.array("q.scale", q.scale, dtype=np.float32, shape=spec.scale_shape("tile", codes.shape, block))
    M, K = codes.shape
    runtime.sim_check("fl.requantize_tile_to_col", (M, K), SIM_COST["fl.requantize_tile_to_col"])  # warns if slow
    codes_t = runtime.cuda.device_array((K, M), np.uint8)
    scale_t = runtime.cuda.device_array(spec.scale_shape("tile", (K, M), block), np.float32)
    qf.requantize_tile_to_col(runtime.to_device(codes), runtime.to_device(scale), codes_t, scale_t, fmt=fmt,
                              block=block, mode="pow2" if pow2_scale else "amax")
    if on_device:
        return QuantizedTensor(codes_t, scale_t, fmt, "tile", block)
    return QuantizedTensor(codes_t.copy_to_host(), scale_t.copy_to_host(), fmt, "tile", block)
