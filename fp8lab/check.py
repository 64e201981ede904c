"""Instant feedback for the worksheets: each check runs a learner's function or kernel against fp8lab's reference.

    from fp8lab import check
    check.encode_e4m3(encode_e4m3)                 # ws1: float32 -> E4M3 code, by hand
    check.decode_e4m3(decode_e4m3)                 # ws1: E4M3 code -> float
    check.rmsnorm_forward_kernel(kernel)           # ws2: (y, g, z, rstd), one block of RMSNORM_THREADS per row
    check.tiled_gemm_kernel(kernel)                # ws3: (a, b, c), c = a @ b.T, GEMM_TILE x GEMM_TILE blocks
    check.tile_quantize_kernel(kernel)             # ws4: (x, codes, scale), E4M3 with one scale per 1x128 tile

Every check draws fresh random inputs, adds the edge cases that catch the usual mistakes (ties, subnormals,
NaN, overflow, shapes that are not multiples of the block or tile), fills kernel outputs with NaN before the
launch, and treats NaN in an output as a failure. Launch configurations live here, not in the learner's code.

Outcomes:
- pass: prints one line, "passed: <question>: <what was checked>";
- wrong answer: raises `CheckFailed` (an AssertionError) naming the input, the expected and the given value,
  and a hint;
- not attempted (the answer still raises NotImplementedError): raises `NotAttempted` (an AssertionError)
  whose message starts with "not attempted yet".

When the environment variable FP8LAB_CHECK_REPORT names a file, each outcome is also appended to it as one
JSON line: this is how `fp8lab worksheets grade` builds its score table.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import math
import os
import textwrap

import numpy as np

from . import bench, formats, runtime
from .kernels import quantize as _quantize
from .kernels import quantize_fine as _qfine
from .kernels import rmsnorm as _rmsnorm
from .runtime import cuda

__all__ = [
    "CheckFailed",
    "NotAttempted",
    "RMSNORM_THREADS",
    "RMSNORM_EPS",
    "GEMM_TILE",
    "QUANT_TILE",
    "QUANT_WARPS",
    "E4M3_MAX",
    "AMAX_FLOOR",
    "encode_e4m3",
    "decode_e4m3",
    "rmsnorm_forward_kernel",
    "tiled_gemm_kernel",
    "tile_quantize_kernel",
]

REPORT_ENV = "FP8LAB_CHECK_REPORT"

# Launch configurations (the worksheets read these constants; the learner never launches anything).
RMSNORM_THREADS = runtime.block_threads(128)  # threads per block: 128 on a GPU, 32 under the simulator
RMSNORM_EPS = _rmsnorm.EPS  # float32(1e-6), as in fp8lab.kernels.rmsnorm
GEMM_TILE = 16  # GEMM_TILE x GEMM_TILE threads per block, one output element each
QUANT_TILE = 128  # ws4: elements of one row that share a scale (DeepSeek-V3's 1x128 activation tiles)
QUANT_WARPS = 2 if runtime.IS_SIM else 4  # ws4: warps per block, one tile per warp
E4M3_MAX = _quantize.FP8_MAX["e4m3"]  # np.float32(448.0)
AMAX_FLOOR = _quantize.AMAX_FLOOR  # np.float32(1e-12): an all-zero tile gets a finite scale, not 0 / 0
CODE_POISON = 0xFF  # E4M3 -NaN: no finite input encodes to it (saturation), so an unwritten code cannot pass


class CheckFailed(AssertionError):
    """The answer ran but gave a wrong result; the message says where, and hints why."""


class NotAttempted(AssertionError):
    """The answer is still the exercise's `raise NotImplementedError` placeholder."""


# ----------------------------------------------------------------------------------------------------------------
# Reporting
# ----------------------------------------------------------------------------------------------------------------


def _record(question: str, status: str, message: str) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"check": question, "status": status, "message": message}) + "\n")


def _question(body):
    """Wrap a check body: print/record the outcome; NotImplementedError -> NotAttempted."""
    name = body.__name__

    @functools.wraps(body)
    def run(answer, *args, **kwargs):
        try:
            detail = body(answer, *args, **kwargs)
        except NotImplementedError as e:
            msg = _not_attempted_message(name, answer, str(e))
            _record(name, "not attempted", msg)
            raise NotAttempted(msg) from None
        except NotAttempted as e:
            _record(name, "not attempted", str(e))
            raise
        except CheckFailed as e:
            _record(name, "failed", str(e))
            raise
        _record(name, "passed", detail)
        print(f"passed: {name}: {detail}")
        return None

    return run


def _not_attempted_message(question: str, answer, raised: str = "") -> str:
    what = getattr(getattr(answer, "py_func", answer), "__name__", repr(answer))
    msg = f"not attempted yet: {what} still raises NotImplementedError"
    if raised:
        msg += f" ({raised})"
    return msg + ". Write your answer in its cell (replace the `raise` line), run that cell, then this check again."


def _fail(question: str, lines, hint: str | None = None) -> None:
    text = f"{question}: " + "\n".join(lines)
    if hint:
        text += f"\nhint: {hint}"
    raise CheckFailed(text)


def _still_a_placeholder(fn) -> bool:
    """True if the function's source contains `raise NotImplementedError` (kernels: checked before any launch,
    since a GPU kernel cannot raise)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                return True
    return False


def _uses_shared_memory(fn) -> bool | None:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None  # source unknown: give the benefit of the doubt
    return "shared.array" in src


def _require_kernel(question: str, kernel):
    py = getattr(kernel, "py_func", None)
    if py is None or not callable(kernel):
        _fail(question, [f"expected a kernel made with @cuda.jit, got {type(kernel).__name__} {kernel!r}"],
              "put @cuda.jit (from fp8lab.runtime import cuda) on the line above `def`")
    if _still_a_placeholder(py):
        raise NotAttempted(_not_attempted_message(question, kernel))
    return py


def _launch(question: str, case: str, kernel, config, *args) -> None:
    try:
        kernel[config](*args)
        runtime.synchronize()
    except Exception as e:  # the simulator raises what a thread raised, with its thread/block ids
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        _fail(question, [f"case {case}: the kernel raised {type(e).__name__}: {first}"[:600]],
              "an IndexError means a thread read or wrote outside an array: guard every access with the "
              "bounds (if m < M and k < K ...); a TypingError means Numba could not compile a line")


def _first_mismatches(got, ref, *, atol, rtol, limit=3):
    """[(index, got, expected)] of the first elements out of tolerance (NaN in got always counts)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    ok = np.abs(got - ref) <= atol + rtol * np.abs(ref)
    ok &= ~np.isnan(got)
    bad = np.argwhere(~ok)
    return len(bad), [(tuple(int(i) for i in idx), float(got[tuple(idx)]), float(ref[tuple(idx)]))
                      for idx in bad[:limit]]


# ----------------------------------------------------------------------------------------------------------------
# ws1: E4M3 by hand
# ----------------------------------------------------------------------------------------------------------------


def _e4m3_cases(rng) -> list[tuple[str, float]]:
    """(category, float32 value): edge cases first (their hints are the most useful), then random values."""
    f = np.float32
    table = formats.value_table(formats.E4M3).astype(np.float64)
    cases = [
        ("zero", 0.0), ("sign", -0.0), ("normal", 1.0), ("sign", -1.0), ("normal", 0.5), ("normal", 3.0),
        ("max", 448.0), ("sign", -448.0), ("normal", 240.0), ("normal", 0.015625),  # min normal 2^-6
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
    "random": "compare your code with fp8lab.formats.describe_code(expected) to see which field is off",
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


@_question
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
            _fail(q, [f"encode_e4m3(np.float32({v!r})) raised {type(e).__name__}: {e}"],
                  _E4M3_HINTS.get(cat))
        code = _as_code(got)
        if code is None:
            _fail(q, [f"encode_e4m3(np.float32({v!r})) returned {got!r}: expected an int code 0..255, "
                      f"here 0x{int(want):02X}"], "return an int such as 0x38 (the code of 1.0)")
        ok = code == want or (math.isnan(v) and code in (0x7F, 0xFF))
        if not ok:
            wrong.append((cat, v, code, int(want)))
    if wrong:
        lines = [f"{len(wrong)} of {len(cases)} inputs encode wrongly, e.g."]
        for cat, v, code, want in wrong[:3]:
            lines.append(f"  encode_e4m3(np.float32({v!r})) [{cat}]: got 0x{code:02X} "
                         f"({formats.describe_code(code)}), expected 0x{want:02X} ({formats.describe_code(want)})")
        _fail(q, lines, _E4M3_HINTS.get(wrong[0][0]))
    return f"{len(cases)} inputs (zeros, ties, subnormals, overflow, +-Inf, NaN, random) match fp8lab.encode"


@_question
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
            _fail(q, [f"decode_e4m3(0x{c:02X}) raised {type(e).__name__}: {e}"], _decode_hint(c))
        try:
            g = float(np.asarray(got, np.float64).reshape(()))
        except (TypeError, ValueError):
            _fail(q, [f"decode_e4m3(0x{c:02X}) returned {got!r}: expected a float, here {want!r}"],
                  "return a Python float (or a NumPy float scalar)")
        same = (math.isnan(g) and math.isnan(want)) or (g == want and math.copysign(1, g) == math.copysign(1, want))
        if not same:
            wrong.append((c, g, want))
    if wrong:
        wrong.sort()
        lines = [f"{len(wrong)} of 256 codes decode wrongly, e.g."]
        for c, g, want in wrong[:3]:
            lines.append(f"  decode_e4m3(0x{c:02X}) [{formats.describe_code(c)}]: got {g!r}, expected {want!r}")
        _fail(q, lines, _decode_hint(wrong[0][0]))
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


# ----------------------------------------------------------------------------------------------------------------
# ws2: RMSNorm forward kernel
# ----------------------------------------------------------------------------------------------------------------


def _rmsnorm_cases(rng):
    T = RMSNORM_THREADS
    rows = []
    # (name, y, g): a row longer than the block and not a multiple of it; a row shorter than the block;
    # tiny values (where eps matters), large values, and one all-zero row (rstd = 1/sqrt(eps)).
    n1 = T + 13 if runtime.IS_SIM else 4 * T + 77
    y = rng.standard_normal((3, n1)).astype(np.float32) * 3
    y[1] *= 1e-4
    rows.append((f"{y.shape[0]} rows of {n1} (longer than a block of {T} threads, not a multiple of it; "
                 f"row 1 is tiny, ~1e-4, where eps matters)", y))
    n2 = 7 if runtime.IS_SIM else 100
    y = rng.standard_normal((2, n2)).astype(np.float32) * 100
    y[0] = 0
    rows.append((f"2 rows of {n2} (shorter than the block; row 0 is all zeros, row 1 ~ 100)", y))
    if not runtime.IS_SIM:
        y = rng.standard_normal((512, 7168)).astype(np.float32)
        rows.append(("512 rows of 7168", y))
    return [(name, y, rng.uniform(0.5, 1.5, y.shape[1]).astype(np.float32)) for name, y in rows]


@_question
def rmsnorm_forward_kernel(kernel, rng=None):
    """Check a kernel `(y, g, z, rstd)`: z = y * rstd * g, rstd[m] = 1 / sqrt(mean(y[m]^2) + eps), launched
    with one block of RMSNORM_THREADS threads per row (grid = M blocks)."""
    q = "rmsnorm_forward_kernel"
    _require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    T = RMSNORM_THREADS
    for name, y, g in _rmsnorm_cases(rng):
        M, N = y.shape
        z, rstd = bench.poisoned((M, N), np.float32), bench.poisoned(M, np.float32)
        _launch(q, name, kernel, (M, T), cuda.to_device(y), cuda.to_device(g), z, rstd)
        z_ref, r_ref = _rmsnorm.reference_forward(y, g)
        for label, got, ref, atol in (("rstd", rstd.copy_to_host(), r_ref, 0.0),
                                      ("z", z.copy_to_host(), z_ref, 1e-5)):
            n_bad, bad = _first_mismatches(got, ref, atol=atol, rtol=1e-4)
            if n_bad:
                lines = [f"case {name}: {n_bad} of {got.size} values of {label} are wrong, e.g."]
                lines += [f"  {label}{list(i)}: got {gv!r}, expected {rv!r}" for i, gv, rv in bad]
                _fail(q, lines, _rmsnorm_hint(label, bad, got, y, T))
    return f"z and rstd match the float64 reference (rows longer and shorter than {T} threads, tiny, zero rows)"


def _rmsnorm_hint(label, bad, got, y, T):
    idx, gv, rv = bad[0]
    N = y.shape[1]
    if label == "rstd" and np.isnan(got).all():
        return "rstd[m] was never written: have one thread (threadIdx.x == 0) store it for its row"
    if label == "z" and N > T and np.isnan(got[:, T:]).all() and not np.isnan(got[:, :T]).any():
        return (f"columns from blockDim.x ({T}) on are still the NaN poison: each thread must loop over the "
                "row, for n in range(cuda.threadIdx.x, N, cuda.blockDim.x)")
    if np.isnan(gv):
        return "that output is still the NaN poison (never written) or NaN was computed: check every store"
    m = idx[0]
    if np.abs(y[m]).max() < 1e-2:
        return "wrong only on tiny rows? rstd = 1 / sqrt(mean(y^2) + eps), with eps = RMSNORM_EPS inside the sqrt"
    if label == "rstd" and N > T and rv and gv / rv > 1:
        return ("rstd too large: the sum of squares is missing elements or partial sums. Does every thread "
                "loop over the whole row (for n in range(cuda.threadIdx.x, N, cuda.blockDim.x)), and does the "
                "tree add every thread's partial sum before anyone reads the total (after cuda.syncthreads())?")
    return ("divide the sum of squares by N (the row length), not by blockDim.x; the block reduction must "
            "finish (cuda.syncthreads()) before any thread reads the total")


# ----------------------------------------------------------------------------------------------------------------
# ws3: tiled GEMM
# ----------------------------------------------------------------------------------------------------------------


def _gemm_cases(rng):
    t = GEMM_TILE
    shapes = [(t + 5, t + 3, 2 * t + 5), (5, 3, 9)] if runtime.IS_SIM else [(1000, 777, 555), (5, 3, 9)]
    names = ["odd shape, not a multiple of the tile in M, N or K", "smaller than one tile"]
    out = []
    for (M, N, K), name in zip(shapes, names):
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((N, K)).astype(np.float32)
        out.append((f"M={M}, N={N}, K={K} ({name})", a, b))
    return out


@_question
def tiled_gemm_kernel(kernel, rng=None):
    """Check a kernel `(a, b, c)`: c = a @ b.T, a (M, K), b (N, K), c (M, N) float32, launched on a grid of
    (ceil(N / GEMM_TILE), ceil(M / GEMM_TILE)) blocks of (GEMM_TILE, GEMM_TILE) threads;
    threadIdx.x runs along n, threadIdx.y along m. The kernel must stage tiles in shared memory."""
    q = "tiled_gemm_kernel"
    py = _require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    t = GEMM_TILE
    for name, a, b in _gemm_cases(rng):
        (M, K), N = a.shape, b.shape[0]
        c = bench.poisoned((M, N), np.float32)
        grid = ((N + t - 1) // t, (M + t - 1) // t)
        _launch(q, name, kernel, (grid, (t, t)), cuda.to_device(a), cuda.to_device(b), c)
        got = c.copy_to_host()
        ref = a.astype(np.float64) @ b.astype(np.float64).T
        atol = 1e-5 * K * np.abs(a).mean() * np.abs(b).mean()
        n_bad, bad = _first_mismatches(got, ref, atol=atol, rtol=1e-5)
        if n_bad:
            lines = [f"case {name}: {n_bad} of {got.size} elements of c are wrong, e.g."]
            lines += [f"  c{list(i)}: got {gv!r}, expected {rv!r}" for i, gv, rv in bad]
            _fail(q, lines, _gemm_hint(bad, got, a, b, t))
    if _uses_shared_memory(py) is False:
        _fail(q, ["the results are right, but the kernel uses no shared memory (no cuda.shared.array)"],
              "this question asks for the tiled version: load a GEMM_TILE x GEMM_TILE tile of a and of b into "
              "shared arrays, cuda.syncthreads(), accumulate from them, cuda.syncthreads() again, next tile")
    return f"c = a @ b.T matches float64 on odd shapes (tile {t}x{t}, edges not multiples of the tile)"


def _gemm_hint(bad, got, a, b, t):
    (m, n), gv, rv = bad[0]
    if np.isnan(gv):
        return (f"c[{m}, {n}] is still the NaN poison: is every element written? m = blockIdx.y * {t} + "
                f"threadIdx.y, n = blockIdx.x * {t} + threadIdx.x, and the store guarded by m < M and n < N only")
    K = a.shape[1]
    if K % t and abs(gv - float(a[m, : K - K % t].astype(np.float64) @ b[n, : K - K % t])) < 1e-3 * (1 + abs(gv)):
        return "the last, partial tile of K is missing: loop k0 over range(0, K, TILE) and load zeros where k >= K"
    return ("threads must wait for the whole tile (cuda.syncthreads()) after loading it and again before "
            "overwriting it; out-of-range loads must store 0, not be skipped")


# ----------------------------------------------------------------------------------------------------------------
# ws4: the fused 1x128 tile quantize kernel
# ----------------------------------------------------------------------------------------------------------------


def _tie_traps(amax, rng, n: int) -> np.ndarray:
    """Up to n float32 values below amax whose code differs between encode(x * inv) (the package's rule, inv =
    E4M3_MAX / amax) and encode(x / scale) (scale = amax / E4M3_MAX): x * inv lands on or next to an E4M3
    rounding tie, and the two float32 roundings fall on different sides of it."""
    f = np.float32
    inv, scale = f(E4M3_MAX / amax), f(amax / E4M3_MAX)
    table = formats.value_table(formats.E4M3).astype(np.float64)
    mids = (table[0:0x7E] + table[1:0x7F]) / 2  # every tie between neighbouring non-negative codes
    x0 = (mids / np.float64(inv)).astype(np.float32)
    cands = np.concatenate([np.nextafter(x0, f(np.inf)), x0, np.nextafter(x0, f(-np.inf))])
    cands = cands[(cands > 0) & (cands < amax)]
    with np.errstate(over="ignore"):
        by_inv = formats.encode((cands * inv).astype(np.float32), formats.E4M3)
        by_div = formats.encode((cands / scale).astype(np.float32), formats.E4M3)
    traps = cands[by_inv != by_div]
    traps = rng.permutation(traps)[:n]
    return (traps * np.where(rng.random(len(traps)) < 0.5, f(-1), f(1))).astype(np.float32)


def _tile_quantize_cases(rng):
    """(name, x): float32 inputs with outliers, a partial last tile, an all-zero tile, a tile whose amax is
    below AMAX_FLOOR, a tile narrower than a warp, and values placed on E4M3 rounding ties."""
    T = QUANT_TILE
    f = np.float32
    out = []
    M, K = (3, 2 * T + 44) if runtime.IS_SIM else (512, 56 * T + 77)
    x = rng.standard_normal((M, K)) * np.exp2(rng.uniform(-6, 6, (M, 1)))  # rows of different magnitudes
    x = x.astype(np.float32)
    spikes = rng.random((M, K)) < 0.02
    x[spikes] *= rng.uniform(20, 100, int(spikes.sum())).astype(np.float32)  # outliers, like LLM activations
    j = int(rng.integers(T))
    x[0, j] = -1.5 * np.abs(x[0, :T]).max()  # tile (0, 0)'s largest magnitude is negative
    x[1, T:2 * T] = 0  # an all-zero tile, with some -0.0 (code 0x80)
    x[1, T:2 * T:3] = -0.0
    tile = x[2, :T]  # a view: values on rounding ties, where x / scale and x * inv disagree
    top = int(np.argmax(np.abs(tile)))
    for _ in range(100):  # for ~1 amax in 10, inv == 1 / scale so closely that no tie separates them: nudge it
        amax = np.abs(tile[top])
        traps = _tie_traps(amax, rng, 12)
        if len(traps) >= 4:
            break
        tile[top] *= f(rng.uniform(1.01, 1.1))
    where = rng.permutation(np.flatnonzero(np.abs(tile) < amax))[:len(traps)]
    tile[where] = traps[:len(where)]
    n_full = K // T
    out.append((f"x ({M}, {K}): {n_full} full tiles per row and a partial one of {K - n_full * T} columns; "
                f"outliers; tile (1, 1) all zeros", x))
    K2 = 20  # narrower than a warp: lanes 20..31 have no element
    x = (rng.standard_normal((3, K2)) * 4).astype(np.float32)
    x[1] *= f(1e-14)  # 0 < amax < AMAX_FLOOR: the floor applies here too
    x[2, int(rng.integers(K2))] = -600  # an amax above 448: that element encodes to exactly -448 (0xFE)
    out.append((f"x (3, {K2}): one tile per row, narrower than a warp; row 1's amax below AMAX_FLOOR", x))
    return out


@_question
def tile_quantize_kernel(kernel, rng=None):
    """Check a kernel `(x, codes, scale)`: x float32 (M, K) -> codes uint8 (M, K), E4M3 codes, and scale float32
    (M, ceil(K / QUANT_TILE)), one scale per 1 x QUANT_TILE tile of a row; bit-exact with
    `fp8lab.kernels.quantize_fine.reference(x, "tile")`. Launch: blocks of QUANT_WARPS * 32 threads, grid
    ceil(M * ceil(K / QUANT_TILE) / QUANT_WARPS) blocks; warp w = cuda.grid(1) // 32 takes tile
    (w // ntk, w % ntk) with ntk = scale.shape[1]; warps past the last tile do nothing."""
    q = "tile_quantize_kernel"
    _require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    T = QUANT_TILE
    threads = QUANT_WARPS * runtime.WARP_SIZE
    for name, x in _tile_quantize_cases(rng):
        M, K = x.shape
        ntk = -(-K // T)
        codes = cuda.to_device(np.full((M, K), CODE_POISON, np.uint8))
        scale = bench.poisoned((M, ntk), np.float32)
        blocks = -(-(M * ntk) // QUANT_WARPS)
        _launch(q, name, kernel, (blocks, threads), cuda.to_device(x), codes, scale)
        got_c, got_s = codes.copy_to_host(), scale.copy_to_host()
        ref_c, ref_s, _ = _qfine.reference(x, "tile", "e4m3", T, "amax")
        bad_c = np.zeros((M, ntk * T), bool)
        bad_c[:, :K] = got_c != ref_c
        bad_tile = (got_s != ref_s) | bad_c.reshape(M, ntk, T).any(axis=2)  # NaN != anything
        if bad_tile.any():
            r, t = (int(i) for i in np.argwhere(bad_tile)[0])
            c0, c1 = t * T, min(t * T + T, K)
            xs = x[r, c0:c1]
            lines = [f"case {name}:",
                     f"  {int(bad_tile.sum())} of {bad_tile.size} tiles are wrong; the first is tile ({r}, {t}) = "
                     f"x[{r}, {c0}:{c1}] ({c1 - c0} elements, amax {float(np.abs(xs).max())!r})"]
            if got_s[r, t] != ref_s[r, t]:
                lines.append(f"  scale[{r}, {t}]: got {float(got_s[r, t])!r}, expected {float(ref_s[r, t])!r}")
            wrong = np.flatnonzero(got_c[r, c0:c1] != ref_c[r, c0:c1])
            if len(wrong):
                lines.append(f"  {len(wrong)} of {c1 - c0} codes of the tile are wrong, e.g.")
            for i in wrong[:3]:
                g, e = int(got_c[r, c0 + i]), int(ref_c[r, c0 + i])
                lines.append(f"    codes[{r}, {c0 + i}] for x = {float(xs[i])!r}: got 0x{g:02X} "
                             f"({formats.describe_code(g)}), expected 0x{e:02X} ({formats.describe_code(e)})")
            _fail(q, lines, _tile_quantize_hint(xs, got_s[r, t], ref_s[r, t], got_c[r, c0:c1], ref_c[r, c0:c1]))
    return (f"codes and scales are bit-exact with quantize_fine.reference(x, 'tile') (outliers, a partial tile, "
            f"an all-zero tile, amax below AMAX_FLOOR, a tile narrower than a warp, rounding ties)")


def _tile_quantize_hint(xs, got_s, ref_s, got_c, ref_c) -> str:
    f = np.float32
    amax = f(np.abs(xs).max())
    poisoned = got_c == CODE_POISON
    if np.isnan(got_s) and poisoned.all():
        return ("this tile was never processed (its scale and codes still hold the poison): warp w = "
                "cuda.grid(1) // 32 (counting warps over the whole grid, not blocks) takes tile "
                "(w // ntk, w % ntk), with ntk = scale.shape[1] tiles per row")
    if amax <= AMAX_FLOOR and not np.isnan(got_s):
        return (f"this tile's amax is {float(amax)!r}, at most AMAX_FLOOR: floor it first, safe = amax if amax > "
                "AMAX_FLOOR else AMAX_FLOOR (for an all-zero tile 448 / 0 is Inf and 0 * Inf is NaN), then "
                "scale = safe / E4M3_MAX and inv = E4M3_MAX / safe")
    if poisoned.any():
        cols = np.flatnonzero(poisoned)
        return (f"{len(cols)} codes of this tile are 0xFF, the poison (never written?), first at column "
                f"{int(cols[0])} of the tile: lane l writes columns k0 + l + 32 * j for j = 0..3, wherever "
                f"the column is < K")
    if np.isnan(got_s):
        return "scale[r, t] was never written: one lane (lane 0) of the warp stores scale = safe / E4M3_MAX"
    if got_s != ref_s:
        signed = f(np.max(xs))
        if got_s == f(E4M3_MAX / amax):
            return ("you stored 448 / amax: scale is the DEQUANTIZATION factor, scale = amax / E4M3_MAX "
                    "(x ~= decode(code) * scale); the codes use its inverse, inv = E4M3_MAX / amax")
        if signed != amax and got_s == f(signed / E4M3_MAX):
            return ("amax is the largest |x|: take abs() of each element before the max "
                    "(this tile's extreme is negative)")
        if got_s < ref_s:
            return ("scale too small: the amax missed elements. Each lane covers columns k0 + lane + 32 * j for "
                    "j = 0..3, and the warp max takes all 5 shuffle steps (offsets 16, 8, 4, 2, 1)")
        return "scale = max(|x| over the tile's columns) / E4M3_MAX, in float32; a tile is 128 columns of one row"
    bad = got_c != ref_c
    xb = xs[bad]
    with np.errstate(over="ignore", invalid="ignore"):
        by_div = formats.encode((xb / f(ref_s)).astype(np.float32), formats.E4M3)
    if np.array_equal(got_c[bad], by_div):
        return ("the scale is right but these codes sit on E4M3 rounding ties: multiply by inv = E4M3_MAX / safe "
                "(computed once per tile, as the package does), not divide by scale. In float32, x / scale and "
                "x * inv can round differently, and on a tie that changes the code")
    got_v = np.abs(formats.decode(got_c[bad], formats.E4M3))
    ref_v = np.abs(formats.decode(ref_c[bad], formats.E4M3))
    if (got_v >= ref_v).all():
        return ("the scale is right but these codes are too large: some lanes scaled by a smaller amax than the "
                "tile's. After the warp max EVERY lane must hold the tile's amax: shfl_xor_sync with offsets "
                "16, 8, 4, 2, 1 (a butterfly) gives it to every lane; shfl_down_sync leaves it in lane 0 only")
    return ("codes[r, c] = encode_e4m3_sat(x[r, c] * inv), inv = E4M3_MAX / safe in float32 (use the np.float32 "
            "constants: on a GPU, 448.0 / amax is computed in float64)")
