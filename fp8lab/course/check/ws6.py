"""ws6: limited-precision accumulation: Hopper's FP8 tensor-core accumulator as fp8lab.numerics.accum models it (13
mantissa bits, truncation, alignment per group of 32), DeepSeek-V3's promotion to FP32 every N_C = 128 elements of K
(arXiv 2412.19437, sections 3.3.2 and 3.5.2), and the error of both at K = 4096, checked against
fp8lab.numerics.accum.dot_limited.

The wrong-answer models below only choose a hint; right or wrong is always decided by fp8lab.numerics.accum."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import numpy as np

from ...numerics import accum, formats, spec
from ._core import NotAttempted, call_answer, fail, not_attempted_message, question, still_a_placeholder

__all__ = ["accumulate_limited", "promoted_dot", "promotion_errors"]

GROUP = accum.GROUP  # 32 products aligned together
BITS = 13  # FP22's mantissa bits (Hopper's FP8 wgmma, measured in lecture 07)
_WHY = "C"  # the letter of why_error_grows' right answer (the options A-D are in the worksheet)
_REFERENCE_NAMES = {"dot_limited", "limited_step", "error_vs_k", "fp8_gemm"}


# ------------------------------------------------------------------------------------------------------- helpers


def _call(q, fn, call, args, hint):
    """fn(*args), a learner's exception turned into a failure naming the call."""
    return call_answer(q, fn, args, hint, call)


def _calls_reference(fn) -> str | None:
    """The fp8lab.numerics.accum / fp8_gemm function the answer's own source calls, if any (that would check itself)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in _REFERENCE_NAMES:
            return name
    return None


def _require_own_code(q, fn, instead):
    used = _calls_reference(fn)
    if used:
        fail(q, [f"{getattr(fn, '__name__', 'your function')} calls {used}: that is what the check compares with"],
             f"write the arithmetic yourself ({instead}); fp8lab.numerics.accum is the reference, not part of the "
             "answer")


def _as_number(q, got, call, hint):
    try:
        arr = np.asarray(got)
        if arr.size != 1 or arr.dtype.kind not in "fiu":
            raise TypeError
        return float(arr.reshape(()))
    except (TypeError, ValueError):
        fail(q, [f"{call} returned {got!r}: expected one number"], hint)


def _show(x: float) -> str:
    """A value with its bits: 2049.75 (0x1.0038000000000p+11)."""
    return f"{x!r} ({float(x).hex()})" if math.isfinite(x) else repr(x)


def _fp8_values(rng, n, positive=False):
    """n random finite E4M3 values (float32, decoded codes), both signs unless positive."""
    codes = rng.integers(1, 0x7F, n).astype(np.uint8)  # 0x01..0x7E: nonzero, finite
    if not positive:
        codes |= (rng.integers(0, 2, n) << 7).astype(np.uint8)
    return formats.decode(codes)


def _uniform_e4m3(rng, k):
    """U[0, 1) quantized to E4M3 per 1 x 128 tile, decoded (DeepSeek's experiment; the scales do not change
    relative errors)."""
    codes = spec.quantize(rng.random((1, k), dtype=np.float32), "tile")[0]
    return formats.decode(codes)[0]


# --------------------------------------------------------------------------- Q1: the limited accumulator by hand


def _reference_sum(p, bits):
    return float(accum.dot_limited(p, np.ones_like(p), bits)[0, 0])  # a product with 1 is exact


def _round_bits(x, kept, rnd):
    m, e = math.frexp(x)
    return math.ldexp(float(rnd(math.ldexp(m, kept + 1))), e - kept - 1)


def _max_exp(terms, zeros_count):
    exps = [math.frexp(float(t))[1] for t in terms if t != 0 or zeros_count]
    return max(exps) if exps else None


def _model(p, bits, *, group=GROUP, rnd_terms=np.trunc, rnd_final=np.trunc, extra=0, acc_aligned=True,
           zeros_count=False, final=True, align=True, drop_tail=False):
    """The limited sum with one rule changed (the keywords name the usual mistakes); the defaults are the model."""
    p = [float(v) for v in p]
    kept = bits + extra
    group = (len(p) or 1) if group is None else group
    end = len(p) - len(p) % group if drop_tail else len(p)
    acc = 0.0
    for k0 in range(0, end, group):
        terms = p[k0:k0 + group] + ([acc] if acc_aligned else [])
        E = _max_exp(terms, zeros_count)
        if E is None:
            continue
        if align:
            ulp = math.ldexp(1.0, E - kept - 1)
            s = math.fsum(float(rnd_terms(t / ulp)) * ulp for t in terms)
        else:  # each term cut to kept bits on its own, then added exactly
            s = math.fsum(_round_bits(t, kept, rnd_terms) for t in terms)
        if not acc_aligned:
            s = acc + (_round_bits(s, kept, rnd_final) if final else s)
        acc = _round_bits(s, kept, rnd_final) if final else s
    return acc


def _q1_variants(bits):
    """(label, function of products, hint): the mistakes the check recognizes, in the order they are tried."""
    trunc = ("truncate toward zero: np.trunc (or int()) of term / ulp, and of the mantissa when you normalize "
             "the sum. Hopper's accumulator drops the bits below its last kept bit; it never rounds up (lecture "
             "06: 1.875 next to 2^11 adds 1.75, not 2)")
    floor = ("truncate toward zero (np.trunc), not down (np.floor, or // on a negative number): -1.5 next to "
             "2^13 adds -1, not -2; for negative terms floor moves away from zero")
    bits_hint = (f"bits = {bits} counts the mantissa bits after the leading 1, so bits + 1 significant bits are "
                 "kept: with np.frexp's exponent E of the largest term (x = m * 2^E, 0.5 <= |m| < 1), the last "
                 "kept bit is ulp = 2^(E - bits - 1)")
    return [
        ("round", lambda p: _model(p, bits, rnd_terms=np.rint, rnd_final=np.rint), trunc),
        ("round terms", lambda p: _model(p, bits, rnd_terms=np.rint), trunc),
        ("round sum", lambda p: _model(p, bits, rnd_final=np.rint), trunc),
        ("floor", lambda p: _model(p, bits, rnd_terms=np.floor, rnd_final=np.floor), floor),
        ("floor terms", lambda p: _model(p, bits, rnd_terms=np.floor), floor),
        ("floor sum", lambda p: _model(p, bits, rnd_final=np.floor), floor),
        ("zeros count", lambda p: _model(p, bits, zeros_count=True),
         "zero terms take no part in choosing E (np.frexp(0) says exponent 0, which would win over every term "
         "below 0.5): that includes the accumulator before the first group"),
        ("no final truncation", lambda p: _model(p, bits, final=False),
         "after adding the aligned terms, normalize and truncate the sum to bits mantissa bits again: a carry "
         "(1.0001 + 1.0001 + 1.0001 = 3.0003) adds a bit in front, so one bit more falls off at the end"),
        ("one bit more", lambda p: _model(p, bits, extra=1), "one bit too many: " + bits_hint),
        ("two bits more", lambda p: _model(p, bits, extra=2), "two bits too many: " + bits_hint),
        ("one bit less", lambda p: _model(p, bits, extra=-1),
         "one bit too few (np.frexp's mantissa is in [0.5, 1): scale it by 2^(bits + 1), not 2^bits): " + bits_hint),
        ("exact", lambda p: math.fsum(float(v) for v in p),
         "this is the exact sum: the limited accumulator keeps only bits + 1 significant bits and truncates the "
         "rest, at two places: each term below the group's last kept bit, and the normalized sum"),
        ("float32 k order", lambda p: float(np.cumsum(np.asarray(p, np.float32), dtype=np.float32)[-1])
         if len(p) else 0.0, "this is a float32 (FP32) sum: the limited accumulator keeps only bits + 1 "
         "significant bits and truncates"),
        ("float32 sum", lambda p: float(np.sum(np.asarray(p, np.float32), dtype=np.float32)),
         "this is a float32 (FP32) sum: the limited accumulator keeps only bits + 1 significant bits and "
         "truncates"),
        ("bits 13", lambda p: _model(p, BITS), f"use the `bits` argument ({bits} here), not a fixed 13"),
        ("not aligned", lambda p: _model(p, bits, align=False),
         "align every term of a group to the group's LARGEST exponent: a small term loses every bit below the "
         "largest term's last kept bit (ulp = 2^(E - bits - 1)), not just the bits beyond its own bits + 1. "
         "Lecture 07: next to 2^8, fifteen products of 2^-6 all vanish"),
        ("accumulator apart", lambda p: _model(p, bits, acc_aligned=False),
         "the running accumulator is one more addend of each group: choose E over the 32 products AND the "
         "accumulator, truncate all 33 terms to that ulp, add them, then normalize and truncate once"),
        ("one term at a time", lambda p: _model(p, bits, group=1),
         f"the accumulator works on groups of {GROUP} products (fp8lab.numerics.accum.GROUP): all {GROUP} are "
         "aligned to the largest of them and the accumulator together, not added one at a time"),
        ("one group", lambda p: _model(p, bits, group=None),
         f"align groups of {GROUP} consecutive products, one group at a time (the running sum carried from "
         "group to group), not the whole array at once"),
        ("groups of 16", lambda p: _model(p, bits, group=16), f"groups of {GROUP}, not 16"),
        ("groups of 64", lambda p: _model(p, bits, group=64), f"groups of {GROUP}, not 64"),
        ("tail dropped", lambda p: _model(p, bits, drop_tail=True),
         f"the last group may be short (len(products) need not be a multiple of {GROUP}): add it too"),
    ]


def _q1_cases(rng):
    """(label, float32 products, bits): crafted cases (lecture 07's probes among them) first, then random."""
    f = np.float32

    def arr(*vals):
        return np.array(vals, f)

    cases = [
        ("1 next to 2^14 vanishes", arr(2.0**14, 1.0), BITS),
        ("1.875 next to 2^11 adds 1.75", arr(2.0**11, 1.875), BITS),
        ("-1.5 next to 2^13 adds -1", arr(2.0**13, -1.5), BITS),
        ("a negative sum", arr(-(2.0**13), -1.5, -0.75), BITS),
        ("fifteen 2^-6 next to 2^8 vanish", arr(2.0**8, *[2.0**-6] * 15), BITS),
        ("the last kept bit", arr(1.0, 2.0**-13), BITS),
        ("just below the last kept bit", arr(1.0, 2.0**-14), BITS),
        ("a carry", arr(1 + 2.0**-13, 1 + 2.0**-13, 1 + 2.0**-13), BITS),
        ("carries", arr(*[1 + 2.0**-13] * 31), BITS),
        ("small products first", arr(*[2.0**-14] * 31, 1.0), BITS),
        ("a full group, then a large product", arr(*[1.0] * 32, 2.0**14), BITS),
        ("the accumulator in the next group", arr(2.0**14, *[0.0] * 31, *[1.0] * 32), BITS),
        ("all products below 2^-3", (rng.uniform(2.0**-10, 2.0**-4, 40) * 1.0001).astype(f), BITS),
        ("7 bits", arr(1.0, 2.0**-7, 2.0**-8, 2.0**-8), 7),
        ("a cancellation", arr(3.0, -3.0 + 2.0**-20, 2.0**-22), BITS),
    ]
    with_zeros = _fp8_values(rng, 70) * _fp8_values(rng, 70)
    with_zeros[rng.random(70) < 0.3] = 0
    cases.append(("products with zeros", with_zeros, BITS))
    for n in (45, 97, *rng.integers(1, 400, 5)):
        cases.append(("random E4M3 products", _fp8_values(rng, int(n)) * _fp8_values(rng, int(n)), BITS))
    for n in rng.integers(300, 700, 3):
        a, b = _uniform_e4m3(rng, int(n)), _uniform_e4m3(rng, int(n))
        cases.append(("positive products (U[0,1) in E4M3)", a * b, BITS))
    for n in rng.integers(50, 300, 3):
        cases.append(("random float32 values", rng.standard_normal(int(n), dtype=f), BITS))
    for n, bits in zip(rng.integers(20, 300, 4), rng.integers(3, 24, 4)):
        cases.append((f"{bits} bits", _fp8_values(rng, int(n)) * _fp8_values(rng, int(n)), int(bits)))
    return [(lab, np.ascontiguousarray(p, f), b) for lab, p, b in cases]


def _describe(p):
    if len(p) <= 6:
        return "[" + ", ".join(repr(float(v)) for v in p) + "]"
    return f"{len(p)} products"


def _best_hint(explained):
    """explained: per wrong result, the list of (matches, hint) of every known mistake; the hint of the mistake
    that explains the most of them, or of every mistake tied for the most (two models can agree on every case a
    draw gives), None if none explains any."""
    counts = {}
    for row in explained:
        for j, (match, hint) in enumerate(row):
            counts.setdefault(j, [0, hint])[0] += bool(match)
    most = max((c[0] for c in counts.values()), default=0)
    if not most:
        return None
    return " Or: ".join(dict.fromkeys(h for n, h in counts.values() if n == most))


@question
def accumulate_limited(fn, rng=None):
    """Check `fn(products, bits) -> float`: the limited accumulator's sum of a 1-D float32 array, bit for bit
    equal to fp8lab.numerics.accum.dot_limited(products, ones, bits) on crafted and random inputs."""
    q = "accumulate_limited"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    _require_own_code(q, fn, "np.frexp, np.ldexp and np.trunc, a group of 32 at a time")
    rng = np.random.default_rng() if rng is None else rng
    cases = _q1_cases(rng)
    hint = "return the accumulator's value, one float"
    gots, wants = [], []
    for label, p, bits in cases:
        call = f"accumulate_limited({_describe(p)}, bits={bits})"
        gots.append(_as_number(q, _call(q, fn, call, (p.copy(), bits), hint), call, hint))
        wants.append(_reference_sum(p, bits))
    bad = [i for i, (g, w) in enumerate(zip(gots, wants)) if g != w]  # NaN is never equal
    if bad:
        explained = [[(_safe(f, cases[i][1]) == gots[i], h) for _, f, h in _q1_variants(cases[i][2])] for i in bad]
        h = _best_hint(explained)
        lines = [f"{len(bad)} of {len(cases)} sums differ from fp8lab.numerics.accum's, e.g."]
        for i in bad[:3]:
            label, p, bits = cases[i]
            lines.append(f"  accumulate_limited({_describe(p)}, bits={bits}) [{label}]: returned {_show(gots[i])}, "
                         f"expected {_show(wants[i])}")
        fail(q, lines, h or "follow the model step by step on the first case above: terms = the group's products + "
                             "acc; E = max frexp exponent of the nonzero terms; ulp = 2^(E - bits - 1); t = sum of "
                             "trunc(term / ulp); acc = t * ulp truncated to bits mantissa bits")
    return (f"{len(cases)} sums (lecture 07's probes, carries, zeros, negative, positive and random products, "
            "bits 3..23) equal fp8lab.numerics.accum's, bit for bit")


def _safe(f, *args):
    try:
        return float(f(*args))
    except Exception:  # a variant that cannot run on this input explains nothing
        return None


# ------------------------------------------------------------------------------ Q2: promotion every promote_every


def _chunked(a, b, bits, bounds, *, fp64=False, reset=True, assign=False):
    """FP32 total of dot_limited over the chunks between `bounds` (a mistake model when bounds or flags are off)."""
    total = 0.0 if fp64 else np.float32(0)
    start = 0
    for stop in bounds:
        part = accum.dot_limited(a[start if reset else 0:stop], b[start if reset else 0:stop], bits)[0, 0]
        if assign:
            total = part
        elif fp64:
            total = total + float(part)
        else:
            total = np.float32(total + part)
        start = stop
    return float(np.float32(total))


def _bounds(K, first, step, tail=True):
    """Chunk ends first, first + step, ... below K, then K (when tail)."""
    out = list(range(first, K, step)) if first < K else []
    if tail:
        out.append(K)
    return out


def _q2_variants(a, b, bits, P):
    K = len(a)
    if P is None:
        return [("bits 13", _safe(lambda: _chunked(a, b, BITS, [K])), f"use the `bits` argument ({bits} here)"),
                ("FP32", _safe(lambda: float(accum.dot_limited(a, b, None)[0, 0])),
                 "promote_every=None means no promotion: the whole dot product in the limited accumulator, "
                 "your accumulate_limited(a * b, bits)")]
    reset_hint = ("reset the limited accumulator to 0 after each promotion: otherwise every partial sum is added "
                  "to the FP32 total again at every later promotion")
    return [
        ("no promotion", _safe(lambda: _chunked(a, b, bits, [K])),
         f"promote_every={P} was ignored: after every {P} elements of K, add the limited sum to the FP32 total "
         "and restart the limited accumulator from 0"),
        ("every group", _safe(lambda: _chunked(a, b, bits, _bounds(K, GROUP, GROUP))),
         f"promote after every promote_every = {P} elements of K, not after every group of {GROUP}"),
        ("every P groups", _safe(lambda: _chunked(a, b, bits, _bounds(K, P * GROUP, P * GROUP))),
         f"promote_every counts elements of K, not groups of {GROUP}: N_C = 128 is 4 groups (4 WGMMAs)"),
        ("one group late", _safe(lambda: _chunked(a, b, bits, _bounds(K, P + GROUP, P))),
         f"the first promotion comes after elements 0 .. {P - 1}: promote when (k0 + {GROUP}) % promote_every == 0 "
         "AFTER adding the group that starts at k0 (or cut a * b into chunks a[i:i + promote_every])"),
        ("one group early", _safe(lambda: _chunked(a, b, bits, _bounds(K, GROUP, P))),
         f"the first promotion comes after elements 0 .. {P - 1}, not after the first group: test k0 % "
         "promote_every == 0 BEFORE adding the group at k0, or (k0 + 32) % promote_every == 0 after it"),
        ("promoted early", _safe(lambda: _chunked(a, b, bits, _bounds(K, P - GROUP, P))),
         f"promote after the group that ends at element {P - 1}, i.e. when (k0 + {GROUP}) % promote_every == 0"),
        ("no reset", _safe(lambda: _chunked(a, b, bits, _bounds(K, P, P), reset=False)), reset_hint),
        ("no reset, the end twice", _safe(lambda: _chunked(a, b, bits, list(range(P, K + 1, P)) + [K], reset=False)),
         reset_hint),
        ("assigned", _safe(lambda: _chunked(a, b, bits, _bounds(K, P, P), assign=True)),
         "ADD each promoted partial sum to the FP32 total (total += partial): assigning keeps only the last one"),
        ("tail dropped", _safe(lambda: _chunked(a, b, bits, _bounds(K, P, P, tail=K % P == 0))),
         f"promote the last, partial chunk too: K = {K} is not a multiple of promote_every = {P}"),
        ("float64 total", _safe(lambda: _chunked(a, b, bits, _bounds(K, P, P), fp64=True)),
         "add the partial sums in float32, as the CUDA cores' FP32 registers do: total = np.float32(total + "
         "np.float32(partial)); a float64 total rounds differently"),
        ("bits 13", _safe(lambda: _chunked(a, b, BITS, _bounds(K, P, P))), f"use the `bits` argument ({bits} here)"),
        ("FP32", _safe(lambda: float(accum.dot_limited(a, b, None)[0, 0])),
         "this is an FP32 dot product: inside each chunk of promote_every the sum is the limited one "
         "(your accumulate_limited); only the chunks' sums are added in FP32"),
    ]


def _q2_cases(rng):
    """(label, a, b, bits, promote_every)."""
    f = np.float32
    cases = [
        ("positive, K = 256", *(_uniform_e4m3(rng, 256) for _ in range(2)), BITS, 128),
        ("positive, K = 300 (a partial last chunk)", *(_uniform_e4m3(rng, 300) for _ in range(2)), BITS, 128),
        ("positive, K = 1000, promote every 32", *(_uniform_e4m3(rng, 1000) for _ in range(2)), BITS, 32),
        ("positive, K = 777, promote every 64", *(_uniform_e4m3(rng, 777) for _ in range(2)), BITS, 64),
        ("positive, K = 600, promote every 96", *(_uniform_e4m3(rng, 600) for _ in range(2)), BITS, 96),
        ("positive, K = 1100, promote every 256", *(_uniform_e4m3(rng, 1100) for _ in range(2)), BITS, 256),
        ("no promotion, K = 500", *(_uniform_e4m3(rng, 500) for _ in range(2)), BITS, None),
        ("mixed signs, K = 1000", _fp8_values(rng, 1000), _fp8_values(rng, 1000), BITS, 64),
        ("10 bits, K = 517", *(_uniform_e4m3(rng, 517) for _ in range(2)), 10, 128),
    ]
    big = _uniform_e4m3(rng, 32 + 640) * f(2.0**-12), _uniform_e4m3(rng, 32 + 640) * f(2.0**-12)
    for v in big:  # a first chunk of about 2^22.6, then chunks below half its float32 ulp (0.5): each vanishes
        v[:32] = spec.FP8_MAX["e4m3"]  # E4M3's largest value
    cases.append(("a large first chunk", *big, BITS, 32))
    cases.append(("positive, K = 2100, promote every 32", *(_uniform_e4m3(rng, 2100) for _ in range(2)), BITS, 32))
    for K, P in zip(rng.integers(33, 1500, 6), rng.choice([32, 64, 96, 128, 256, 0], 6)):
        a, b = (_fp8_values(rng, int(K), positive=True) for _ in range(2)) if rng.random() < 0.5 else \
            (_uniform_e4m3(rng, int(K)) for _ in range(2))
        cases.append((f"random, K = {K}", a, b, BITS, None if P == 0 else int(P)))
    return [(lab, np.ascontiguousarray(a, f), np.ascontiguousarray(b, f), bits, P) for lab, a, b, bits, P in cases]


@question
def promoted_dot(fn, rng=None):
    """Check `fn(a, b, bits, promote_every) -> float`: the dot product of two 1-D arrays of E4M3 values, limited
    accumulation inside each chunk of promote_every elements (None: one chunk), float32 across chunks; bit for
    bit equal to fp8lab.numerics.accum.dot_limited(a, b, bits, promote_every=promote_every)."""
    q = "promoted_dot"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    _require_own_code(q, fn, "your accumulate_limited on each chunk of a * b, and a float32 total")
    rng = np.random.default_rng() if rng is None else rng
    cases = _q2_cases(rng)
    hint = "return the FP32 total, one float"
    gots, wants = [], []
    for label, a, b, bits, P in cases:
        call = f"promoted_dot(a, b, bits={bits}, promote_every={P}) with K = {len(a)} [{label}]"
        try:
            got = fn(a.copy(), b.copy(), bits, P)
        except NotImplementedError as e:  # the answer is written, but calls one that is not (Q1's)
            raise NotAttempted(f"not attempted yet: {call} called a function that still raises "
                               f"NotImplementedError ({e}): answer question 1 first, run its cell, then this "
                               "check again") from None
        except Exception as e:
            fail(q, [f"{call} raised {type(e).__name__}: {e}"[:600]], hint)
        gots.append(_as_number(q, got, call, hint))
        wants.append(float(accum.dot_limited(a, b, bits, promote_every=P)[0, 0]))
    bad = [i for i, (g, w) in enumerate(zip(gots, wants)) if g != w]  # NaN is never equal
    if bad:
        explained = [[(v == gots[i], h) for _, v, h in _q2_variants(*cases[i][1:])] for i in bad]
        lines = [f"{len(bad)} of {len(cases)} dot products differ from fp8lab.numerics.accum.dot_limited's, e.g."]
        for i in bad[:3]:
            label, a, b, bits, P = cases[i]
            lines.append(f"  promoted_dot(a, b, bits={bits}, promote_every={P}) with K = {len(a)} [{label}]: "
                         f"returned {_show(gots[i])}, expected {_show(wants[i])} "
                         f"(exact {math.fsum(a.astype(np.float64) * b):.9g})")
        fail(q, lines, _best_hint(explained) or
             "cut a * b into chunks of promote_every elements (the last may be shorter), sum each with "
             "accumulate_limited (a fresh accumulator per chunk), and add the chunks' sums in float32")
    return (f"{len(cases)} dot products (K up to 2100, promote_every 32..256 and None, partial last chunks) equal "
            "fp8lab.numerics.accum.dot_limited's, bit for bit")


# ------------------------------------------------------------------------------------ Q3: the error at K = 4096


_WHY_HINTS = {
    "A": "a product of two E4M3 values has at most 4 x 4 = 8 significant bits: it is exact in FP32 and in FP22's "
         "14 bits (your promoted_dot formed the products exactly). Bits are lost when a product is added to a "
         "larger sum",
    "B": "FP22 has FP32's 8 exponent bits: it reaches about 3.4e38, and 4096 products of at most 448 x 448 sum to "
         "under 1e9. Range is not the problem, precision is",
    "D": "truncation is not random: it always moves toward zero, so with positive inputs every product loses a "
         "little in the same direction and the losses add up (your errors: y is below the exact sum each time). "
         "That is why the error grows like K, and why restarting the sum every 128 helps",
}


def _q3_cases(rng):
    return [(k, _uniform_e4m3(rng, k), _uniform_e4m3(rng, k)) for k in (4096, 1000)]


def _q3_variants(a, b, exact, y0, y1):
    e32 = float(np.dot(a, b))  # the "exact" sum in float32

    def rel(y, ex=exact):
        return abs(y - ex) / abs(ex)

    y14 = [float(accum.dot_limited(a, b, 14, promote_every=P)[0, 0]) for P in (None, 128)]
    f32 = float(accum.dot_limited(a, b, None)[0, 0])
    return [
        ((rel(y1), rel(y0)), "the order is (error without promotion, error with promotion every 128)"),
        ((100 * rel(y0), 100 * rel(y1)), "return fractions (0.01 for 1%), not percentages"),
        ((abs(y0 - exact), abs(y1 - exact)), "the relative error: |y - exact| / |exact|, not |y - exact|"),
        (((y0 - exact) / exact, (y1 - exact) / exact), "take the absolute value: |y - exact| / |exact|"),
        (((y0 - exact) / y0, (y1 - exact) / y1), "divide by |exact|, not by y, and take the absolute value"),
        ((abs(y0 - exact) / abs(y0), abs(y1 - exact) / abs(y1)), "divide by |exact|, not by |y|"),
        ((rel(y0, e32), rel(y1, e32)), "compute the exact sum in float64 (np.dot of float64 arrays, or math.fsum): "
                                       "a float32 sum has errors of its own, comparable to the promoted one's"),
        ((rel(y0, f32), rel(y1, f32)), "compare with the exact sum (float64), not with an FP32 accumulation"),
        ((rel(y14[0]), rel(y14[1])), "FP22 keeps 13 mantissa bits (14 significant bits with the leading 1: "
                                     "DeepSeek's 'about 14 bits'): bits = 13"),
        ((rel(f32), rel(y1)), "without promotion means the limited accumulator over all of K: promote_every=None"),
        ((rel(y0), rel(float(accum.dot_limited(a, b, BITS, promote_every=32)[0, 0]))),
         "promote every N_C = 128 elements, as DeepSeek-V3 does"),
    ]


@question
def promotion_errors(fn, why, rng=None):
    """Check `fn(a, b) -> (error without promotion, error with promotion every 128)`, the relative errors |y - exact| /
    |exact| of 13-bit limited dot products, recomputed with fp8lab.numerics.accum on fresh U[0, 1) inputs in E4M3 (K =
    4096 and 1000); and `why() -> letter`, why the error grows with K."""
    q = "promotion_errors"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    _require_own_code(q, fn, "call your promoted_dot")
    rng = np.random.default_rng() if rng is None else rng
    shape_hint = "return a pair (err_without_promotion, err_promote_every_128), e.g. (0.08, 0.0005)"
    seen = []
    for K, a, b in _q3_cases(rng):
        call = f"promotion_errors(a, b) with K = {K}"
        try:
            got = fn(a.copy(), b.copy())
        except NotImplementedError as e:
            raise NotAttempted(f"not attempted yet: {call} called a function that still raises "
                               f"NotImplementedError ({e}): answer questions 1 and 2 first, run their cells, then "
                               "this check again") from None
        except Exception as e:
            fail(q, [f"{call} raised {type(e).__name__}: {e}"[:600]], shape_hint)
        try:
            e0, e1 = (float(np.asarray(v).reshape(())) for v in got)
        except (TypeError, ValueError):
            fail(q, [f"{call} returned {got!r}: expected a pair of numbers"], shape_hint)
        exact = math.fsum(a.astype(np.float64) * b.astype(np.float64))  # products of FP8 values are exact
        y0, y1 = (float(accum.dot_limited(a, b, BITS, promote_every=P)[0, 0]) for P in (None, 128))
        w0, w1 = abs(y0 - exact) / abs(exact), abs(y1 - exact) / abs(exact)
        ok = all(math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-15) for g, w in ((e0, w0), (e1, w1)))
        if not ok:
            h = next((h for (v0, v1), h in _q3_variants(a, b, exact, y0, y1)
                      if math.isclose(e0, v0, rel_tol=1e-6) and math.isclose(e1, v1, rel_tol=1e-6)), None)
            fail(q, [f"{call}: returned ({e0:.6g}, {e1:.6g}), expected ({w0:.6g}, {w1:.6g}) (exact dot product "
                     f"{exact:.9g}; FP22 without promotion {y0:.9g}, promoted every 128 {y1:.9g})"],
                 h or "errors = |promoted_dot(a, b, 13, P) - exact| / |exact| for P = None, then 128, with exact "
                      "the float64 dot product; if promoted_dot passed its check, look at exact")
        seen.append((K, w0, w1))
    try:
        letter = _call(q, why, "why_error_grows()", (), "return one letter, e.g. 'A'")
    except NotImplementedError as e:
        raise NotAttempted(not_attempted_message(q, why, str(e))) from None
    letter = letter.strip().upper() if isinstance(letter, str) else letter
    if letter not in ("A", "B", "C", "D"):
        fail(q, [f"why_error_grows() returned {letter!r}: expected one of 'A', 'B', 'C', 'D'"],
             "return the letter of the explanation you choose, as a string")
    if letter != _WHY:
        fail(q, [f"your errors are right; why_error_grows() says {letter!r}, which is not why"], _WHY_HINTS[letter])
    return "; ".join(f"K = {K}: {w0:.2e} without promotion, {w1:.2e} promoted every 128 ({w0 / w1:.0f}x smaller)"
                     for K, w0, w1 in seen) + f"; why: {_WHY}"
