"""Bit-exact FP8 formats: the numerical spec that every kernel of the course is tested against (NumPy only).

What is here:
- `Format` and its three instances `E4M3`, `E5M2` (OCP OFP8 v1.0) and `E8M0` (the OCP MX v1.0 scale format),
  with `FORMATS` and `get_format`;
- `encode(x, fmt, saturate)` -> uint8 codes and `decode(codes, fmt)` -> float32, vectorized NumPy, the host
  reference;
- `value_table(fmt)` (the 256 values, indexed by code) and `describe_code(code, fmt)` for notebooks.

The same rounding as device functions for kernels (`encode_e4m3_sat`, `decode_e4m3`, ...) lives in
fp8lab/kernels/common.py; this module imports no numba, so the spec runs without a GPU or the simulator.

Rounding is to nearest, ties to even, computed exactly from the input's own value: float16/float32/float64
inputs are all rounded directly to FP8 (a float64 is never rounded to float32 first, which could round twice).

Special values (E4M3, E5M2):

| input               | saturate=True (default)          | saturate=False (= ml_dtypes `astype`)     |
|---------------------|----------------------------------|-------------------------------------------|
| finite, overflowing | +-max normal (448 / 57344)       | NaN (E4M3), +-Inf (E5M2)                  |
| +-Inf               | +-max normal                     | NaN (E4M3), +-Inf (E5M2)                  |
| NaN                 | NaN                              | NaN                                       |

- "Overflowing" means rounding to nearest-even would leave the format: |x| > 464 for E4M3 (464, the midpoint
  between 448 and the missing 480, rounds to 448 because 448's mantissa 110 is even) and |x| >= 61440 for E5M2
  (the midpoint between 57344 = 1.11b * 2^15 and 2^16 rounds to the even 2^16, which overflows).
- saturate=True follows PTX `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` (the instruction behind CUDA's
  `__nv_fp8_e4m3`): "if the absolute value of input (ignoring sign) is greater than MAX_NORM of the specified
  destination format, then the result is sign-preserved MAX_NORM" (PTX ISA, cvt, `.satfinite`), and Inf is
  greater than MAX_NORM, so +-Inf -> +-max normal. CUDA's host fallback `__nv_cvt_double_to_fp8` in
  cuda_fp8.hpp does the same.
- saturate=False matches `x.astype(ml_dtypes.float8_e4m3fn / float8_e5m2).view(np.uint8)` bit for bit.
- NaN encodes to the format's quiet NaN with the input's sign bit, as ml_dtypes does: E4M3 0x7F / 0xFF,
  E5M2 0x7E / 0xFE (S.11111.10). The NaN payload is dropped. Signed zeros keep their sign: -0.0 -> 0x80, and
  a negative value that rounds to zero gives 0x80 too.

E8M0 (unsigned, exponent only: code c means 2^(c - 127), 0xFF is the only NaN; no zero, no sign, no
subnormals, no Inf), matching ml_dtypes `float8_e8m0fnu`:
- rounding: write x = s * 2^k with 1 <= s < 2; the result is 2^(k+1) if s >= 1.5, else 2^k. That is round to
  nearest with ties (s == 1.5) rounded up, not to even (ml_dtypes's round-to-nearest-even step sees the
  implicit leading 1 as the last kept bit, so every tie rounds up): 3 -> 4, 6 -> 8, 0.75 -> 1.
- positive values below 2^-127 (including float32 / float64 subnormals) give 0x00 (2^-127), the smallest value.
- zero (either sign), negative numbers, -Inf and NaN give 0xFF (NaN), as in ml_dtypes. A scale must be a
  positive number; NaN makes the mistake visible downstream rather than raising inside a vectorized call.
- overflow (x >= 1.5 * 2^127) and +Inf: 0xFF with saturate=False (ml_dtypes); 0xFE (2^127) with saturate=True.

"ml_dtypes" above means release 0.7 (checked bit for bit in tests/test_formats.py). Release 0.6 differs in two
corners, where it is the one that is off: it rounds float64 through float32 (double rounding: 1 + 2^-4 + 2^-40
gives 1.0 in E4M3, not 1.125), and it sends some E8M0 inputs just above 2^-127 (1.2 * 2^-127) to 2^-126.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validate import describe as _describe

__all__ = [
    "round_bf16",
    "Format",
    "E4M3",
    "E5M2",
    "E8M0",
    "FORMATS",
    "get_format",
    "encode",
    "decode",
    "value_table",
    "describe_code",
]


# ----------------------------------------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """One 8-bit floating-point format: its fields and the numbers that follow from them.

    Values that do not apply are None (E8M0 has no subnormals). `nan` describes the NaN encodings in the spec's
    S.EEEE.MMM notation.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool
    max_normal: float
    min_normal: float
    max_subnormal: float | None
    min_subnormal: float | None
    has_inf: bool
    nan: str
    ml_dtypes_name: str
    spec: str

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal value (-6, -14, -127: codes 0x08, 0x04, 0x00)."""
        return 1 - self.bias if self.mbits else -self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest normal value."""
        return math.frexp(self.max_normal)[1] - 1

    @property
    def max_code(self) -> int:
        """Code of +max normal (0x7E, 0x7B, 0xFE)."""
        return {"e4m3": 0x7E, "e5m2": 0x7B, "e8m0": 0xFE}[self.name]

    @property
    def nan_code(self) -> int:
        """Code that encode() gives for a positive NaN (0x7F, 0x7E, 0xFF)."""
        return {"e4m3": 0x7F, "e5m2": 0x7E, "e8m0": 0xFF}[self.name]

    @property
    def inf_code(self) -> int | None:
        """Code of +Inf, None where the format has no infinity."""
        return 0x7C if self.has_inf else None

    def describe(self) -> str:
        """A short table of the format's numbers."""
        if self.signed:
            layout = f"1 sign, {self.ebits} exponent, {self.mbits} mantissa bits, bias {self.bias}"
        else:
            layout = f"no sign, {self.ebits} exponent bits, no mantissa, bias {self.bias}"

        def coded(v, code):
            if v is None:
                return "none"
            form = describe_code(code, self).split(" = ")[1].lstrip("+")
            return f"{_fmt_number(v)} = {form} (0x{code:02X})"

        rows = [
            ("bits", layout),
            ("max normal", coded(self.max_normal, self.max_code)),
            ("min normal", coded(self.min_normal, 1 << self.mbits if self.mbits else 0)),
            ("max subnormal", coded(self.max_subnormal, (1 << self.mbits) - 1)),
            ("min subnormal", coded(self.min_subnormal, 1)),
            ("infinities", f"S.{'1' * self.ebits}.{'0' * self.mbits} (0x7C, 0xFC)" if self.has_inf else "none"),
            ("NaN", self.nan),
            ("ml_dtypes", self.ml_dtypes_name),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{self.name.upper()} ({self.spec})"]
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


E4M3 = Format(
    name="e4m3",
    ebits=4,
    mbits=3,
    bias=7,
    signed=True,
    max_normal=448.0,  # S.1111.110 = 1.75 * 2^8
    min_normal=2.0**-6,
    max_subnormal=0.875 * 2.0**-6,
    min_subnormal=2.0**-9,
    has_inf=False,
    nan="S.1111.111 only (0x7F, 0xFF)",
    ml_dtypes_name="float8_e4m3fn",
    spec="OCP OFP8 v1.0",
)

E5M2 = Format(
    name="e5m2",
    ebits=5,
    mbits=2,
    bias=15,
    signed=True,
    max_normal=57344.0,  # S.11110.11 = 1.75 * 2^15
    min_normal=2.0**-14,
    max_subnormal=0.75 * 2.0**-14,
    min_subnormal=2.0**-16,
    has_inf=True,
    nan="S.11111.{01,10,11} (0x7D-0x7F, 0xFD-0xFF); quiet NaN 0x7E",
    ml_dtypes_name="float8_e5m2",
    spec="OCP OFP8 v1.0",
)

E8M0 = Format(
    name="e8m0",
    ebits=8,
    mbits=0,
    bias=127,
    signed=False,
    max_normal=2.0**127,  # 0xFE
    min_normal=2.0**-127,  # 0x00
    max_subnormal=None,
    min_subnormal=None,
    has_inf=False,
    nan="11111111 only (0xFF)",
    ml_dtypes_name="float8_e8m0fnu",
    spec="OCP MX v1.0 scale",
)

FORMATS: dict[str, Format] = {f.name: f for f in (E4M3, E5M2, E8M0)}

_ALIASES = {
    "e4m3": E4M3,
    "e4m3fn": E4M3,
    "float8_e4m3fn": E4M3,
    "e5m2": E5M2,
    "float8_e5m2": E5M2,
    "e8m0": E8M0,
    "e8m0fnu": E8M0,
    "float8_e8m0fnu": E8M0,
}


def get_format(fmt, name: str = "fmt") -> Format:
    """A Format from a Format or a name ('e4m3', 'e4m3fn', 'e5m2', 'e8m0', ml_dtypes names; any case).
    name: what errors call the argument."""
    if isinstance(fmt, Format):
        return fmt
    expected = f"a Format or one of {tuple(FORMATS)} (also 'e4m3fn' and the ml_dtypes names)"
    if not isinstance(fmt, str):
        raise TypeError(f"{name} must be {expected}, got {_describe(fmt)}")
    found = _ALIASES.get(fmt.strip().lower())
    if found is None:
        raise ValueError(f"{name} must be {expected}, got {fmt!r}")
    return found


# ----------------------------------------------------------------------------------------------------------------
# NumPy reference: encode, decode, value_table, describe_code
# ----------------------------------------------------------------------------------------------------------------

_CHUNK = 1 << 16  # elements per pass: keeps the float64 temporaries in cache and memory flat for any size


def _as_real_array(x) -> np.ndarray:
    """x as an array whose values float64 holds exactly (or nearly: integers beyond 2^53), else TypeError."""
    try:
        arr = np.asarray(x)
    except Exception:  # ragged nested lists and the like
        raise TypeError(f"x must be a real-valued array-like, got {_describe(x)}") from None
    kind = arr.dtype.kind
    ok = (kind == "f" and arr.dtype.itemsize <= 8) or kind in "iu"
    # ml_dtypes floats (bfloat16, float8_*, ...): NumPy knows them as kind 'V'; each widens exactly to float32.
    ml_float = kind == "V" and arr.dtype.name.startswith(("bfloat16", "float8_", "float6_", "float4_"))
    if not (ok or ml_float):
        raise TypeError(
            "x must be a real-valued array-like (float16/float32/float64, bfloat16 or an integer dtype), "
            f"got {_describe(arr)}"
        )
    if ml_float:
        arr = arr.astype(np.float32)
    return arr


def _encode_chunk(x: np.ndarray, fmt: Format, saturate: bool) -> np.ndarray:
    """Codes (uint8) for a 1-D float64 chunk."""
    neg = np.signbit(x)
    a = np.abs(x)
    nan = np.isnan(a)
    finite = np.isfinite(a)
    af = np.where(finite, a, 0.0)
    m, e = np.frexp(af)  # af = m * 2^e with 0.5 <= m < 1 (m = e = 0 for zero); exact, subnormals included

    if fmt is E8M0:
        # x = (2m) * 2^(e-1) with 1 <= 2m < 2: round 2m to 1 or 2, ties (2m == 1.5) up, as ml_dtypes does.
        code = (e.astype(np.int64) + (fmt.bias - 1)) + (m >= 0.75)
        code = np.maximum(code, 0)  # below 2^-127: the smallest value, 0x00
        big = fmt.max_code if saturate else fmt.nan_code
        code = np.where((code > fmt.max_code) | (x == np.inf), big, code)
        code = np.where((x > 0) & ~nan, code, fmt.nan_code)  # zero, negatives, -Inf, NaN
        return code.astype(np.uint8)

    # Binade of the result: the exponent of the leading bit, or emin below the normal range (subnormals and zero
    # share emin's spacing; frexp's e = 0 for zero must not count).
    big_e = np.where(af < fmt.min_normal, fmt.emin, e - 1)
    # Scale so that one unit in the last place of the result is 1: exact (a power-of-two scaling of an
    # in-range value), then round half to even (np.rint). Normal: q in [2^mbits, 2^(mbits+1)]; subnormal: q in
    # [0, 2^mbits]; a carry (q == 2^(mbits+1)) moves into the exponent field through the sum below.
    q = np.rint(np.ldexp(af, fmt.mbits - big_e))
    code = (big_e.astype(np.int64) + (fmt.bias - 1)) * (1 << fmt.mbits) + q.astype(np.int64)

    if saturate:
        over_code = fmt.max_code
    else:
        over_code = fmt.inf_code if fmt.has_inf else fmt.nan_code
    code = np.where((code > fmt.max_code) | ~finite, over_code, code)
    code = np.where(nan, fmt.nan_code, code)
    code = code | (neg.astype(np.int64) << 7)
    return code.astype(np.uint8)


def encode(x, fmt=E4M3, saturate: bool = True) -> np.ndarray:
    """FP8 codes (uint8, shape of x) of x, rounded to nearest, ties to even.

    x: float16/float32/float64 (or integer, bfloat16) array-like; every value is rounded directly from its
    exact value. fmt: a Format or a name. saturate: True clamps overflow and +-Inf to +-max normal (PTX
    `cvt.rn.satfinite`); False gives NaN (E4M3) / Inf (E5M2) like ml_dtypes. See the module docstring for NaN,
    signed zeros and E8M0. Any shape, 0-d and empty included (an empty x gives an empty result).
    """
    fmt = get_format(fmt)
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError(f"saturate must be a bool, got {_describe(saturate)}")
    arr = _as_real_array(x)
    flat = arr.reshape(-1)
    out = np.empty(flat.shape, np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # signaling NaNs and huge values are handled, not errors
        for start in range(0, flat.size, _CHUNK):
            chunk = flat[start : start + _CHUNK].astype(np.float64)
            out[start : start + _CHUNK] = _encode_chunk(chunk, fmt, bool(saturate))
    return out.reshape(arr.shape)


_TABLES: dict[str, np.ndarray] = {}


def _table(fmt: Format) -> np.ndarray:
    """The cached, read-only value table of fmt (built from the bit fields, not from ml_dtypes)."""
    table = _TABLES.get(fmt.name)
    if table is None:
        c = np.arange(256, dtype=np.int64)
        if fmt is E8M0:
            v = np.ldexp(1.0, c - fmt.bias)
            v[0xFF] = np.nan
        else:
            sign = np.where(c >> 7, -1.0, 1.0)
            ef = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
            mf = c & ((1 << fmt.mbits) - 1)
            mag = np.where(
                ef == 0,
                np.ldexp(mf.astype(np.float64), fmt.emin - fmt.mbits),  # subnormal: 0.mmm * 2^emin
                np.ldexp((mf + (1 << fmt.mbits)).astype(np.float64), ef - fmt.bias - fmt.mbits),  # 1.mmm * 2^e
            )
            top = ef == (1 << fmt.ebits) - 1
            if fmt.has_inf:  # E5M2: IEEE-like top binade
                mag = np.where(top & (mf == 0), np.inf, mag)
                mag = np.where(top & (mf != 0), np.nan, mag)
            else:  # E4M3: only S.1111.111 is NaN
                mag = np.where(top & (mf == (1 << fmt.mbits) - 1), np.nan, mag)
            v = np.copysign(mag, sign)  # -0.0 for 0x80, and NaNs carry the code's sign
        table = v.astype(np.float32)
        table.setflags(write=False)
        _TABLES[fmt.name] = table
    return table


def value_table(fmt=E4M3) -> np.ndarray:
    """The 256 values of fmt (float32, a fresh copy), indexed by code; NaN codes hold NaN with the code's sign."""
    return _table(get_format(fmt)).copy()


def decode(codes, fmt=E4M3) -> np.ndarray:
    """float32 values (shape of codes) of FP8 codes: uint8, or any integer array-like with values in 0..255.
    Any shape, 0-d and empty included."""
    fmt = get_format(fmt)
    try:
        arr = np.asarray(codes)
    except Exception:
        raise TypeError(f"codes must be an integer array-like, got {_describe(codes)}") from None
    if arr.dtype.kind not in "iu":
        raise TypeError(f"codes must be an integer (ideally uint8) array-like, got {_describe(arr)}")
    if arr.dtype != np.uint8 and arr.size and (arr.min() < 0 or arr.max() > 255):
        raise ValueError(
            f"codes must lie in 0..255, got values from {arr.min()} to {arr.max()} in {_describe(arr)}"
        )
    return np.take(_table(fmt), arr)


def _fmt_number(v: float) -> str:
    """Shortest exact-enough text: integers without '.0', others by repr (round-trips)."""
    v = float(v)
    if math.isfinite(v) and v == int(v) and abs(v) < 1e16:
        return str(int(v))
    return repr(v)


def describe_code(code, fmt=E4M3) -> str:
    """The bit fields and value of one code, e.g. describe_code(0x7E) == '0 1111 110 = +1.75 * 2^8 = 448'."""
    fmt = get_format(fmt)
    if isinstance(code, (bool, np.bool_)) or not isinstance(code, (int, np.integer)):
        raise TypeError(f"code must be an int in 0..255, got {_describe(code)}")
    if not 0 <= code <= 255:
        raise ValueError(f"code must be an int in 0..255, got {code}")
    c = int(code)
    bits = f"{c:08b}"
    v = float(_table(fmt)[c])
    if not fmt.signed:  # E8M0: all eight bits are exponent
        return f"{bits} = NaN" if math.isnan(v) else f"{bits} = 2^{c - fmt.bias} = {_fmt_number(v)}"
    fields = f"{bits[0]} {bits[1:1 + fmt.ebits]} {bits[1 + fmt.ebits:]}"
    sign = "-" if c >> 7 else "+"
    if math.isnan(v):
        return f"{fields} = NaN"
    if math.isinf(v):
        return f"{fields} = {sign}Inf"
    if v == 0:
        return f"{fields} = {sign}0"
    ef = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mf = c & ((1 << fmt.mbits) - 1)
    if ef == 0:
        significand, exponent = mf / (1 << fmt.mbits), fmt.emin
    else:
        significand, exponent = 1 + mf / (1 << fmt.mbits), ef - fmt.bias
    return f"{fields} = {sign}{significand!r} * 2^{exponent} = {_fmt_number(v)}"


def round_bf16(x) -> np.ndarray:
    """float32 x rounded to the nearest bfloat16 (ties to even), returned as float32: the top 16 bits of the float32
    kept (1 sign, 8 exponent, 7 mantissa bits). NaN stays NaN; values past bfloat16's largest finite number round to
    Inf, as a conversion instruction does (cvt.rn.bf16.f32)."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)
