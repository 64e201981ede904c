"""The numerical specification of FP8 quantization, in NumPy (no numba): what every quantization kernel must
produce, bit for bit, and the constants they share.

What is here:
- constants: `FMTS`, `GRANULARITIES`, `FP8_MAX`, `EMAX_ELEM`, `AMAX_FLOOR`, `GROUP_K`, `MX_GROUP`, `MAX_GROUP`,
  `POISON_CODE`, `E8M0_NAN`, `MODES`, `CONVENTIONS`, `DEEPGEMM_AMAX_FLOOR`, `DEEPGEMM_INV_MAX`;
- `QuantizedTensor`: FP8 codes plus dequantization scales (what `fp8lab.quantize` returns); `fmt_name` and
  `check_layout` check and normalize its format, granularity and block (also where it is used);
- shapes: `group_shape`, `scale_shape`;
- references: `group_scale` (amax -> scale), `quantize_tensor` (one current scale), `quantize` (row, 1x128
  tile, 128x128 block, MX), `dequantize`, `requantize_tile_to_col`.

`scale` is the DEQUANTIZATION factor (x ~= decode(code) * scale), DeepGEMM's and DeepSeek-V3's convention;
Transformer Engine calls it `scale_inv`.

Scale rules (`mode`), float32 arithmetic exactly as the kernels do it:
- "amax" (default): scale = amax / FP8_MAX, inv = FP8_MAX / amax, two float32 divisions, so each nonzero
  group's largest |x| encodes to exactly +-FP8_MAX (448 for E4M3). Codes are encode(x * inv), saturating.
- "pow2": t = amax / FP8_MAX rounded UP to a power of two, so that no element saturates and the cast is an exact
  scaling by 2^-k; the price is up to one binade of unused range. Transformer Engine's Float8BlockScaling
  rounds its quantization factor (FP8_MAX / amax) down to a power of two: the same scale.
- "mx_floor" (OCP MX v1.0): scale = 2^(floor(log2 amax) - emax_elem), emax_elem = 8 for E4M3, 15 for E5M2;
  amax / scale lies in [256, 512) for E4M3, so elements above 464 saturate to 448.
- "mx_ceil" (NVIDIA / Transformer Engine MXFP8): the "pow2" rule; nothing saturates.
- "deepgemm" (E4M3 only): DeepGEMM's reference casts (`per_token_cast_to_fp8`, `per_block_cast_to_fp8` in
  deepseek-ai/DeepGEMM, deep_gemm/utils/math.py) as PyTorch computes them on CUDA: amax floored at
  DEEPGEMM_AMAX_FLOOR = 1e-4, scale = amax * DEEPGEMM_INV_MAX (PyTorch divides a CUDA tensor by a Python number
  by multiplying with its float32 reciprocal, aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu), inv = 1 / scale
  (`1.0 / sf` is `sf.reciprocal() * 1.0`). "amax" rounds twice less: its scale and inv are each one division.
  So a scale differs from "amax"'s in its last bit for a large share of groups, and a code where x * inv lands on
  the other side of a rounding boundary.
- "deepgemm_ue8m0": the same scale rounded up to a power of two (`use_ue8m0=True`, `ceil_to_ue8m0`).
  E8M0 codes of power-of-two scales: 127 + exponent. With AMAX_FLOOR the exponent stays inside E8M0's range.

Policies:
- Partial groups: when K (or M) is not a multiple of the group size the last group is smaller; its amax is over
  the elements that exist (nothing is padded in memory).
- All-zero group: amax is floored at AMAX_FLOOR = 1e-12, so codes are 0 (0x80 for -0.0) and the scale is finite
  and positive, not 0/0. DeepGEMM's `per_token_cast_to_fp8` floors at 1e-4, which suits BF16 activations; this
  course's gradients (amax about 1e-5 for the mean-squared loss of a 64 x 256 batch) would then top out near
  code value 45 instead of 448. A group with 0 < amax < 1e-12 uses the floor too.
- NaN or +-Inf in a fine-grained group poisons the group: its scale is NaN, every code of the group is
  POISON_CODE (0x7F, a NaN in E4M3 and E5M2) and its E8M0 code 0xFF. Inf is treated like NaN because it leaves
  no usable scale (FP8_MAX / Inf = 0 would silently zero the group's finite elements). Per tensor, NaN makes
  every code NaN (the amax is NaN).
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from .. import _validate as V
from . import formats

__all__ = [
    "FMTS", "GRANULARITIES", "FINE_GRANULARITIES", "MODES", "MX_RULES", "CONVENTIONS", "FP8_MAX", "EMAX_ELEM",
    "AMAX_FLOOR", "DEEPGEMM_AMAX_FLOOR", "DEEPGEMM_INV_MAX", "GROUP_K", "MX_GROUP", "MAX_GROUP", "POISON_CODE",
    "E8M0_NAN", "QuantizedTensor", "fmt_name", "check_layout", "group_shape", "scale_shape", "group_scale",
    "group_amax", "expand", "quantize_tensor", "quantize", "dequantize", "requantize_tile_to_col",
]

FMTS = ("e4m3", "e5m2")
"""The element formats a tensor is quantized to (E8M0 is a scale format only)."""
GRANULARITIES = ("tensor", "row", "tile", "block", "mx")
FINE_GRANULARITIES = GRANULARITIES[1:]
MODES = ("amax", "pow2", "mx_floor", "mx_ceil", "deepgemm", "deepgemm_ue8m0")
MX_RULES = ("floor", "ceil")
CONVENTIONS = ("fp8lab", "deepgemm")
"""Whose arithmetic fl.quantize follows: fp8lab's scale rules, or DeepGEMM's reference casts (modes "deepgemm*")."""

FP8_MAX = {name: np.float32(formats.FORMATS[name].max_normal) for name in FMTS}
"""Largest finite value: 448 (E4M3), 57344 (E5M2), as float32."""
EMAX_ELEM = {name: formats.FORMATS[name].emax for name in FMTS}
"""Unbiased exponent of FP8_MAX (OCP MX v1.0 emax_elem): 8 (E4M3), 15 (E5M2)."""
AMAX_FLOOR = np.float32(1e-12)
"""Smallest amax a scale is computed from (see the module docstring)."""
DEEPGEMM_AMAX_FLOOR = np.float32(1e-4)
"""DeepGEMM's `amax.clamp(1e-4)` (float32): the floor of the "deepgemm" modes."""
DEEPGEMM_INV_MAX = np.float32(1.0) / np.float32(448.0)
"""float32 1/448 rounded to nearest: what PyTorch multiplies by for DeepGEMM's `x_amax / 448.0` on CUDA."""
GROUP_K = 128
"""DeepSeek-V3's group along K: 1 x 128 activation tiles, 128 x 128 weight blocks (arXiv 2412.19437, 3.3)."""
MX_GROUP = 32
"""Elements per OCP MX block (one E8M0 scale each)."""
MAX_GROUP = 1024
"""Largest tile/block size the quantization kernels support (their local and shared arrays are sized by it)."""
POISON_CODE = 0x7F
"""The code of every element of a NaN/Inf group (a NaN in E4M3 and in E5M2)."""
E8M0_NAN = 0xFF
# RMSNorm's eps, rstd = 1 / sqrt(mean(y^2) + eps): kernels.rmsnorm and kernels.norm_quant share it.
RMSNORM_EPS = np.float32(1e-6)



class ScaleKind(enum.IntEnum):
    """Which scale a GEMM operand's element (row r, K-group g) takes, as the FP8 GEMM kernels compile it in: one per
    tensor, one per 1 x 128 tile (row r's group g), one per 128 x 128 block (rows r // 128, group g)."""

    TENSOR = 0
    TILE = 1
    BLOCK = 2

    @classmethod
    def of(cls, granularity: str) -> "ScaleKind":
        """The kind of a granularity the FP8 GEMM takes ("tensor", "tile" or "block")."""
        kinds = {"tensor": cls.TENSOR, "tile": cls.TILE, "block": cls.BLOCK}
        if granularity not in kinds:
            raise ValueError(f"granularity must be one of {tuple(kinds)} for an FP8 GEMM operand, got {granularity!r}")
        return kinds[granularity]


_F32_MAX = np.float32(np.finfo(np.float32).max)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)


@dataclasses.dataclass
class QuantizedTensor:
    """FP8 codes plus dequantization scales: x ~= decode(data, fmt) * scale.

    data: uint8 codes, the shape of x. scale: float32 dequantization factors, one per group:
      "tensor" (1,); for x (M, K): "row" (M, 1), "tile" (M, ceil(K/block)), "block"
      (ceil(M/block), ceil(K/block)), "mx" (M, ceil(K/32)) powers of two.
    fmt: "e4m3" or "e5m2" (any spelling `fmt_name` takes, stored as that name).
    block: the group size along K (tile, block): a positive int up to MAX_GROUP, None giving GROUP_K (128);
      32 for mx (None gives 32); None for tensor and row.
    scale_codes: for "mx", the E8M0 codes (uint8, shape of scale) of the scales; None otherwise.
    nonfinite_groups: for NumPy input, how many groups (1 for "tensor") held NaN/Inf (their scale is NaN and
      their codes are NaN); None where not counted (device input).
    Arrays are NumPy arrays when quantize() was given a NumPy array, device arrays when given a device array.
    The constructor checks and normalizes fmt, granularity and block (`check_layout`); the arrays, and fields
    changed later, are checked where the tensor is used (dequantize, requantize_tile_to_col, fp8_gemm).
    """

    data: object
    scale: object
    fmt: str
    granularity: str
    block: int | None = None
    scale_codes: object = None
    nonfinite_groups: int | None = None

    def __post_init__(self):
        self.fmt, self.granularity, self.block = check_layout(self.fmt, self.granularity, self.block)
        n = self.nonfinite_groups
        if n is not None and (isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer))):
            raise TypeError(f"nonfinite_groups must be None or an int >= 0, got {V.describe(n)}")
        if n is not None and n < 0:
            raise ValueError(f"nonfinite_groups must be None or an int >= 0, got {n}")

    @property
    def shape(self):
        return tuple(self.data.shape)


def fmt_name(fmt, name: str = "fmt") -> str:
    """'e4m3' or 'e5m2' from a Format or a name (any case, ml_dtypes names too); else a clear error."""
    found = formats.get_format(fmt, name).name
    if found not in FMTS:
        raise ValueError(f"{name} must be one of {FMTS} for quantization, got {fmt!r}")
    return found


def check_layout(fmt, granularity, block, prefix: str = "") -> tuple[str, str, int | None]:
    """(fmt, granularity, block) of a QuantizedTensor, checked and normalized (see QuantizedTensor): block is
    None for tensor and row, GROUP_K when None for tile and block, MX_GROUP for mx. prefix names the fields in
    errors (e.g. "q." gives "q.block must be ...")."""
    fmt = fmt_name(fmt, prefix + "fmt")
    granularity = V.choice(prefix + "granularity", granularity, GRANULARITIES)
    name = prefix + "block"
    if granularity in ("tensor", "row"):
        if block is not None:
            raise ValueError(f"{name} must be None for granularity {granularity!r} (no groups along K), got "
                             f"{V.describe(block)}")
    elif granularity == "mx":
        if block is None:
            block = MX_GROUP
        elif isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"{name} must be {MX_GROUP} or None for granularity 'mx', got {V.describe(block)}")
        elif block != MX_GROUP:
            raise ValueError(f"{name} must be {MX_GROUP} or None for granularity 'mx', got {block}")
    elif block is None:
        block = GROUP_K
    else:
        block = V.positive_int(name, block)
        if block > MAX_GROUP:
            raise ValueError(f"{name} must be at most {MAX_GROUP} for granularity {granularity!r}, got {block}")
    return fmt, granularity, None if block is None else int(block)


def group_shape(granularity: str, shape, block: int = GROUP_K) -> tuple[int, int]:
    """(rows, cols) of one group of an (M, K) array: row (1, K), tile (1, block), block (block, block), mx (1, 32)."""
    M, K = shape
    return {"row": (1, K), "tile": (1, block), "block": (block, block), "mx": (1, MX_GROUP)}[granularity]


def scale_shape(granularity: str, shape, block: int = GROUP_K) -> tuple:
    """Shape of the scale array of a tensor of `shape`: (1,) per tensor, else one scale per group (rounded up)."""
    if granularity == "tensor":
        return (1,)
    gm, gk = group_shape(granularity, shape, block)
    return (-(-shape[0] // gm), -(-shape[1] // gk))


def group_scale(amax, fmt: str = "e4m3", mode: str = "amax"):
    """(scale, inv_scale, e8m0_code) arrays from float32 amaxes, the rule of `mode`; NaN scales (code 0xFF) where
    the amax is NaN or +Inf. The kernels' device function `group_scale` computes the same bits."""
    amax = np.asarray(amax, np.float32)
    fp8_max = FP8_MAX[fmt]
    deepgemm = mode.startswith("deepgemm")
    if deepgemm and fmt != "e4m3":
        raise ValueError(f"fmt must be 'e4m3' for mode {mode!r} (DeepGEMM's casts divide by 448), got {fmt!r}")
    poisoned = ~(amax <= _F32_MAX)
    floor = DEEPGEMM_AMAX_FLOOR if deepgemm else AMAX_FLOOR
    safe = np.where(poisoned, _ONE, np.maximum(amax, floor)).astype(np.float32)
    code = np.zeros(amax.shape, np.int64)
    if mode == "amax":
        scale = (safe / fp8_max).astype(np.float32)
        inv = (fp8_max / safe).astype(np.float32)
    elif mode == "deepgemm":
        scale = (safe * DEEPGEMM_INV_MAX).astype(np.float32)
        inv = (_ONE / scale).astype(np.float32)
    else:
        if mode == "mx_floor":
            m, e = np.frexp(safe)  # safe = m * 2^e, 0.5 <= m < 1: floor(log2 safe) = e - 1
            scale = ((safe / m) * np.float32(2.0 ** -(1 + EMAX_ELEM[fmt]))).astype(np.float32)
            code = e.astype(np.int64) + (126 - EMAX_ELEM[fmt])
        else:  # "pow2", "mx_ceil", "deepgemm_ue8m0": t rounded up to a power of two (exact: t / m == 2^e)
            t = (safe * DEEPGEMM_INV_MAX if deepgemm else safe / fp8_max).astype(np.float32)
            m, e = np.frexp(t)
            exact = m == _HALF
            scale = np.where(exact, t, t / m).astype(np.float32)
            code = e.astype(np.int64) + np.where(exact, 126, 127)
        inv = (_ONE / scale).astype(np.float32)
    nan = np.float32(np.nan)
    scale = np.where(poisoned, nan, scale).astype(np.float32)
    inv = np.where(poisoned, nan, inv).astype(np.float32)
    code = np.where(poisoned, E8M0_NAN, code).astype(np.uint8)
    return scale, inv, code


def group_amax(x: np.ndarray, gm: int, gk: int) -> np.ndarray:
    """max |x| over each gm x gk group; partial groups at the edges cover the existing elements only (zero padding
    cannot change a max of absolute values); NaN propagates."""
    M, K = x.shape
    Mp, Kp = -(-M // gm) * gm, -(-K // gk) * gk
    a = np.zeros((Mp, Kp), np.float32)
    a[:M, :K] = np.abs(x)
    return a.reshape(Mp // gm, gm, Kp // gk, gk).max(axis=(1, 3))


def expand(s: np.ndarray, gm: int, gk: int, shape) -> np.ndarray:
    """The per-group array s broadcast to every element of an array of `shape`."""
    return np.repeat(np.repeat(s, gm, axis=0), gk, axis=1)[: shape[0], : shape[1]]


def _encode_scaled(x, inv, fmt):
    with np.errstate(invalid="ignore", over="ignore"):
        return formats.encode((x * inv).astype(np.float32), fmt=formats.get_format(fmt), saturate=True)


def quantize_tensor(x, fmt: str = "e4m3"):
    """One current scale for the whole tensor: (codes, scale, amax), float32 arithmetic as the kernels do it.
    NaN or +-Inf anywhere poisons the tensor as it poisons a group: amax NaN (or Inf), scale NaN, every code
    POISON_CODE."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.float32(np.max(np.abs(x))) if not np.isnan(x).any() else np.float32(np.nan)
    if not np.isfinite(amax):
        return np.full(x.shape, POISON_CODE, np.uint8), np.float32(np.nan), amax
    safe = np.float32(max(amax, AMAX_FLOOR))
    scale = np.float32(safe / FP8_MAX[fmt])
    inv = np.float32(FP8_MAX[fmt] / safe)
    return _encode_scaled(x, inv, fmt), scale, amax


def quantize(x, granularity: str = "tile", fmt: str = "e4m3", block: int = GROUP_K, mode: str = "amax"):
    """(codes, scale, scale_codes) of a 2-D x for granularity "row", "tile", "block" or "mx".

    scale_codes are the E8M0 codes of the scales (formats.encode(scale, E8M0)); meaningful for MX. For "mx",
    `mode` should be "mx_floor" or "mx_ceil" and `block` is ignored (groups of 32).
    """
    x = np.asarray(x, dtype=np.float32)
    gm, gk = group_shape(granularity, x.shape, block)
    scale, inv, _ = group_scale(group_amax(x, gm, gk), fmt, mode)
    inv_full = expand(inv, gm, gk, x.shape)
    codes = _encode_scaled(x, inv_full, fmt)
    codes[np.isnan(inv_full)] = POISON_CODE
    return codes, scale, formats.encode(scale, formats.E8M0)


def dequantize(codes, scale, gm: int, gk: int, fmt: str = "e4m3") -> np.ndarray:
    """float32 decode(codes) * scale[r // gm, c // gk]."""
    return (formats.decode(codes, formats.get_format(fmt)) * expand(scale, gm, gk, codes.shape)).astype(np.float32)


def requantize_tile_to_col(codes, scale, fmt: str = "e4m3", block: int = GROUP_K, mode: str = "amax"):
    """(codes_t (K, M), scale_t (K, ceil(M/block))): 1 x block tiles of x re-quantized as block x 1 tiles, i.e. the
    tile quantization of dequantize(codes).T (DeepSeek-V3's Wgrad input, arXiv 2412.19437, section 3.3)."""
    v = dequantize(codes, scale, 1, block, fmt)
    codes_t, scale_t, _ = quantize(np.ascontiguousarray(v.T), "tile", fmt, block, mode)
    return codes_t, scale_t
