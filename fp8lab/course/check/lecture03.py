"""Lecture 03's exercises: E5M2's NaN codes, where overflow starts without saturation, and FP16's range and
precision, checked against fp8lab.numerics.formats and NumPy's float16."""

from __future__ import annotations

import math

import numpy as np

from ...numerics import formats
from ._lecture import Wrong, as_int, as_tuple, close, exercise, matching_hint

__all__ = ["ex1", "ex2", "ex3", "first_overflow"]


@exercise(3, 1, "print formats.describe_code(c, fl.E5M2) for c in range(256) and look for nan")
def ex1(answer):
    """Every E5M2 code that decodes to NaN (any order), as ints 0..255."""
    if isinstance(answer, (str, bytes)) or not hasattr(answer, "__iter__"):
        raise Wrong(f"your answer is {answer!r}: expected a list of codes, e.g. [0x7D, ...]")
    try:
        got = sorted({as_int(c, "codes 0..255") for c in answer})
    except Wrong:
        raise Wrong(f"your answer is {answer!r}: expected a list of int codes 0..255") from None
    table = formats.value_table(formats.E5M2)
    want = np.flatnonzero(np.isnan(table)).tolist()
    if got != want:
        inf = np.flatnonzero(np.isinf(table)).tolist()
        if set(got) & set(inf):
            hint = "S.11111.00 (0x7C, 0xFC) is +-Inf, not NaN: NaN needs a nonzero mantissa"
        elif set(got) == set(np.flatnonzero(np.isnan(formats.value_table(formats.E4M3))).tolist()):
            hint = "those are E4M3's two NaNs (S.1111.111); E5M2 keeps IEEE's habit: exponent 11111, mantissa not 0"
        elif set(got) < set(want):
            hint = ("there are more: the negative ones have bit 7 set" if all(c < 0x80 for c in got) else
                    "every nonzero mantissa under exponent 11111 is NaN")
        else:
            hint = "NaN is S.11111.MM with MM = 01, 10 or 11, for either sign S"
        raise Wrong(f"your codes {[f'0x{c:02X}' for c in got]} are not E5M2's NaN encodings", hint)
    return f"{len(want)} codes: {', '.join(f'0x{c:02X}' for c in want)} (0x7C / 0xFC are +-Inf)"


def first_overflow(fmt) -> np.float32:
    """The smallest float32 above fmt's largest value that encode(..., saturate=False) does not keep finite."""
    fmt = formats.get_format(fmt)
    lo = int(np.float32(fmt.max_normal).view(np.uint32))  # finite
    hi = int(np.float32(np.inf).view(np.uint32))  # not finite
    while hi - lo > 1:  # bisection on float32 bit patterns (ordered like the values, for positive floats)
        mid = (lo + hi) // 2
        x = np.array([mid], np.uint32).view(np.float32)
        if np.isfinite(formats.decode(formats.encode(x, fmt, saturate=False), fmt)[0]):
            lo = mid
        else:
            hi = mid
    return np.array([hi], np.uint32).view(np.float32)[0]


def _f32(x) -> np.float32:
    return np.float32(x)


@exercise(3, 2, "step up from 464 with np.nextafter and encode each value with saturate=False")
def ex2(answer):
    """(the smallest float32 above 464 that encodes to NaN in E4M3, the smallest above E5M2's max that encodes to
    Inf), both with saturate=False."""
    got = as_tuple(answer, 2, "two numbers: (E4M3, E5M2)")
    want = (first_overflow(formats.E4M3), first_overflow(formats.E5M2))
    got32 = (np.float32(got[0]), np.float32(got[1]))
    if got32 != want:
        e4, e5 = formats.E4M3, formats.E5M2
        step4 = 2.0 ** (e4.emax - e4.mbits)  # E4M3's spacing in its top binade
        mid4 = e4.max_normal + step4 / 2  # the tie between the largest value and the missing next one
        if got32[0] != want[0]:
            hint = matching_hint(float(got32[0]), [
                (mid4, "464 is a tie between 448 and 480, and ties go to the even code: 448 (mantissa 110; 480 "
                       "would be S.1111.111, NaN). The next float32 up is not a tie"),
                (465, "465 overflows, but it is not the smallest float32 that does: np.nextafter"),
                (float(e4.max_normal), "448 is E4M3's largest value: it encodes exactly"),
                (e4.max_normal + step4, "every float32 between 464 and 480 already rounds up, to the NaN code"),
            ], rel=0, default="values just above the midpoint of 448 and the next (missing) step round up to NaN")
        else:
            hint = matching_hint(float(got32[1]), [
                (float(np.nextafter(want[1], np.float32(np.inf))),
                 "61440 itself is a tie between 57344 and 2^16 = 65536, and the even one is 2^16, past the largest "
                 "value: it becomes Inf"),
                (float(np.nextafter(np.float32(e5.max_normal), np.float32(np.inf))),
                 "57344 is E5M2's largest value; anything up to the midpoint with the next step rounds back to it"),
                (2.0 ** (e5.emax + 1), "65536 overflows, but values from the midpoint of 57344 and 65536 on do too"),
            ], rel=0, default="E5M2's step at the top is 8192: find where rounding leaves the grid")
        raise Wrong(f"your answer ({got[0]!r}, {got[1]!r}) is not where saturate=False stops giving finite codes",
                    hint)
    return (f"E4M3 from {float(want[0])!r} (just above the tie 464) on gives NaN; E5M2 from {float(want[1])!r} (the "
            "tie itself, rounded to the even 2^16) gives Inf")


@exercise(3, 3, "np.finfo(np.float16) has max, smallest_normal and smallest_subnormal; nmant is its mantissa bits")
def ex3(answer):
    """FP16's (binades from the smallest subnormal to the largest value, as the range table's "binades" column counts
    them: log2(max / min subnormal); largest relative rounding error in its normal range)."""
    try:
        got = as_tuple(answer, 2, "two numbers: (binades, largest relative error)")
    except Wrong as e:
        overflow = hasattr(answer, "__iter__") and any(
            isinstance(v, (float, np.floating)) and not math.isfinite(v) for v in answer)
        raise Wrong(e.said, "float16 arithmetic overflows (65504 / 2^-24 is far beyond 65504): convert to float "
                            "first, float(fi.max) / float(fi.smallest_subnormal)" if overflow else None) from None
    fi = np.finfo(np.float16)
    mx, sub, nrm, bits = float(fi.max), float(fi.smallest_subnormal), float(fi.smallest_normal), int(fi.nmant)
    want = (math.log2(mx / sub), 2.0**-(bits + 1))
    if not (close(got[0], want[0], rel=0, abs_tol=0.05) and close(got[1], want[1], rel=1e-3)):
        if not close(got[0], want[0], rel=0, abs_tol=0.05):
            hint = matching_hint(got[0], [
                (math.log2(mx / nrm), "that is the normal range only: the table counts from the smallest subnormal, "
                                      "2^-24"),
                (math.log10(mx / sub), "binades are powers of two: log2, not log10"),
            ], rel=0, abs_tol=0.05, default="log2(np.finfo(np.float16).max / np.finfo(np.float16).smallest_subnormal)")
        else:
            hint = matching_hint(got[1], [
                (2.0**-bits, f"that is the spacing relative to a power of two, 2^-{bits}; rounding to nearest is off "
                             "by at most half of it"),
                (2.0**-8, "that is BF16's bound (7 mantissa bits); FP16 keeps 10"),
                (2.0**-4, "that is E4M3's bound"),
            ], rel=1e-3, default=f"with {bits} mantissa bits rounding to nearest is off by at most 2^-{bits + 1}")
        raise Wrong(f"your answer ({got[0]:g}, {got[1]:g}) is not FP16's range and precision", hint)
    return (f"FP16 spans {want[0]:.1f} binades with a relative error up to 2^-{bits + 1} in its normal range: 8 times "
            "finer than BF16, in a far narrower range")
