"""ws2: E4M3 encode and decode by hand, checked on edge cases and random values against fp8lab.numerics.formats."""

from __future__ import annotations

import math

import numpy as np

from ...numerics import formats, spec
from ._core import fail, question

E4M3_MAX = float(spec.FP8_MAX["e4m3"])  # 448

__all__ = ["encode_e4m3", "decode_e4m3"]


def _e4m3_cases(rng) -> list[tuple[str, float]]:
    """(category, float32 value): edge cases first (their hints are the most useful), then random values."""
    f = np.float32
    table = formats.value_table(formats.E4M3).astype(np.float64)
    cases = [
        ("zero", 0.0), ("sign", -0.0), ("normal", 1.0), ("sign", -1.0), ("normal", 0.5), ("normal", 3.0),
        ("max", E4M3_MAX), ("sign", -E4M3_MAX), ("normal", 240.0), ("normal", 0.015625),  # min normal 2^-6
        ("tie", 1.0625), ("tie", 1.1875), ("tie", -1.0625), ("tie", 17.0), ("tie", 19.0),
        ("subnormal", 2.0**-9), ("subnormal", 3 * 2.0**-9), ("subnormal", 0.875 * 2.0**-6),
        ("subnormal tie", 2.0**-10), ("subnormal tie", 3 * 2.0**-10), ("subnormal tie", 5 * 2.0**-10),
        ("subnormal tie", 15 * 2.0**-10),  # halfway between max subnormal and min normal -> min normal
        ("subnormal", 1.2 * 2.0**-9), ("subnormal", 2.0**-12), ("subnormal", -(2.0**-8)),
        ("tiny", 1e-30), ("tiny", float(np.finfo(np.float32).smallest_subnormal)),
        ("overflow", 464.0), ("overflow", 465.0), ("overflow", 480.0), ("overflow", -500.0), ("overflow", 1e6),
        ("overflow", float(np.finfo(np.float32).max)), ("inf", math.inf), ("inf", -math.inf),
        ("nan", math.nan), ("nan", -math.nan),
    ]
    # exact ties between random neighbouring codes (the midpoint of two float32-exact values is float32-exact)
    codes = rng.integers(0, 0x7E, 24)
    for c in codes:
        mid = (table[c] + table[c + 1]) / 2
        cases.append(("tie" if c >= 8 else "subnormal tie", float(mid) * (1 if rng.random() < 0.5 else -1)))
    # random magnitudes from 2^-12 to 2^9, both signs
    mags = np.exp2(rng.uniform(-12, 9, 200)) * np.where(rng.random(200) < 0.5, -1, 1)
    cases += [("random", float(f(v))) for v in mags]
    return [(cat, float(f(v))) for cat, v in cases]


_E4M3_HINTS = {
    "zero": "0.0 is the code 0x00",
    "sign": "the sign is bit 7 (0x80) and is independent of the rest; -0.0 is 0x80",
    "normal": "a normal value is 1.mmm * 2^(eeee - 7): exponent field = unbiased exponent + 7, then the "
              "3 mantissa bits right after the leading 1",
    "max": "448 = 1.75 * 2^8 is S.1111.110 = 0x7E, the largest finite E4M3 value",
    "tie": "round to nearest, ties to even: when the dropped bits are exactly 100..0, round so the last kept "
           "mantissa bit is 0",
    "subnormal": "below 2^-6 the exponent field is 0 and the value is 0.mmm * 2^-6 = mmm * 2^-9: "
                 "round x / 2^-9 to an integer (8 would be the smallest normal, 0x08)",
    "subnormal tie": "subnormals round to nearest-even too: x / 2^-9 = k + 0.5 goes to the even k or k + 1 "
                     "(and 7.5 * 2^-9 rounds up to 8 * 2^-9 = 2^-6, code 0x08)",
    "tiny": "values below 2^-10 (half the smallest subnormal) round to 0: keep the sign (0x00 or 0x80)",
    "overflow": "this worksheet saturates like PTX cvt.satfinite: anything larger than 448 in magnitude "
                "(after rounding) becomes +-448 (0x7E / 0xFE); E4M3 has no infinity",
    "inf": "+-Inf saturates to +-448 (0x7E / 0xFE), as PTX cvt.rn.satfinite does",
    "nan": "NaN encodes to S.1111.111: 0x7F (0xFF with the sign bit)",
    "random": "compare your code with fp8lab.numerics.formats.describe_code(expected) to see which field is off",
}


def _as_code(value):
    """The learner's return value as an int 0..255, or None if it is not one."""
    try:
        v = np.asarray(value)
        if v.size != 1:
            return None
        v = v.reshape(()).item()
        if isinstance(v, float):
            if not math.isfinite(v) or v != int(v):
                return None
        c = int(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return c if 0 <= c <= 255 else None


@question
def encode_e4m3(fn, rng=None):
    """Check `fn(x) -> int`: x a np.float32 scalar, the result its E4M3 code (0..255), saturating, ties to even."""
    q = "encode_e4m3"
    rng = np.random.default_rng() if rng is None else rng
    cases = _e4m3_cases(rng)
    expected = formats.encode(np.array([v for _, v in cases], np.float32), formats.E4M3, saturate=True)
    wrong = []
    for (cat, v), want in zip(cases, expected):
        x = np.float32(v)
        try:
            got = fn(x)
        except NotImplementedError:
            raise
        except Exception as e:
            fail(q, [f"encode_e4m3(np.float32({v!r})) raised {type(e).__name__}: {e}"],
                  _E4M3_HINTS.get(cat))
        code = _as_code(got)
        if code is None:
            fail(q, [f"encode_e4m3(np.float32({v!r})) returned {got!r}: expected an int code 0..255, "
                      f"here 0x{int(want):02X}"], "return an int such as 0x38 (the code of 1.0)")
        ok = code == want or (math.isnan(v) and code in (0x7F, 0xFF))
        if not ok:
            wrong.append((cat, v, code, int(want)))
    if wrong:
        lines = [f"{len(wrong)} of {len(cases)} inputs encode wrongly, e.g."]
        for cat, v, code, want in wrong[:3]:
            lines.append(f"  encode_e4m3(np.float32({v!r})) [{cat}]: got 0x{code:02X} "
                         f"({formats.describe_code(code)}), expected 0x{want:02X} ({formats.describe_code(want)})")
        fail(q, lines, _E4M3_HINTS.get(wrong[0][0]))
    return f"{len(cases)} inputs (zeros, ties, subnormals, overflow, +-Inf, NaN, random) match fp8lab.encode"


@question
def decode_e4m3(fn, rng=None):
    """Check `fn(code) -> float` on all 256 codes (shuffled): exact values, -0.0 for 0x80, NaN for 0x7F / 0xFF."""
    q = "decode_e4m3"
    rng = np.random.default_rng() if rng is None else rng
    table = formats.value_table(formats.E4M3).astype(np.float64)
    wrong = []
    for c in rng.permutation(256):
        c = int(c)
        want = float(table[c])
        try:
            got = fn(c)
        except NotImplementedError:
            raise
        except Exception as e:
            fail(q, [f"decode_e4m3(0x{c:02X}) raised {type(e).__name__}: {e}"], _decode_hint(c))
        try:
            g = float(np.asarray(got, np.float64).reshape(()))
        except (TypeError, ValueError):
            fail(q, [f"decode_e4m3(0x{c:02X}) returned {got!r}: expected a float, here {want!r}"],
                  "return a Python float (or a NumPy float scalar)")
        same = (math.isnan(g) and math.isnan(want)) or (g == want and math.copysign(1, g) == math.copysign(1, want))
        if not same:
            wrong.append((c, g, want))
    if wrong:
        wrong.sort()
        lines = [f"{len(wrong)} of 256 codes decode wrongly, e.g."]
        for c, g, want in wrong[:3]:
            lines.append(f"  decode_e4m3(0x{c:02X}) [{formats.describe_code(c)}]: got {g!r}, expected {want!r}")
        fail(q, lines, _decode_hint(wrong[0][0]))
    return "all 256 codes decode exactly (subnormals, -0.0, NaN included)"


def _decode_hint(c: int) -> str:
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7:
        return "S.1111.111 (0x7F, 0xFF) is NaN; every other code is a finite number (E4M3 has no infinity)"
    if c == 0x80:
        return "0x80 is -0.0: apply the sign bit even to a zero (return -v, or math.copysign(v, -1))"
    if e == 0:
        return "exponent field 0 means subnormal: value = mmm * 2^-9 (no implicit leading 1)"
    if c & 0x80:
        return "bit 7 is the sign: the value of c is minus the value of c & 0x7F"
    return "normal codes: (1 + mmm / 8) * 2^(eeee - 7)"
