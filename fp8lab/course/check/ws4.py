"""ws4: delayed scaling (Transformer Engine's amax history) against current scaling, checked against
fp8lab.numerics.scaling.DelayedScaling: the scale from a history, a sequence of tensors quantized bit for bit, and the
elements a 16x spike clips."""

from __future__ import annotations

import numbers

import numpy as np

from ...numerics import formats, scaling, spec
from ._core import NotAttempted, call_answer, fail, not_attempted_message, question, still_a_placeholder

__all__ = ["scale_from_history", "delayed_quantize_steps", "clipped_at_spike"]

_E4M3_MAX = float(spec.FP8_MAX["e4m3"])  # 448
_FMT_OF_MAX = {float(spec.FP8_MAX[f]): f for f in spec.FMTS}  # 448 -> "e4m3", 57344 -> "e5m2"
_FLOOR = float(spec.AMAX_FLOOR)
_F = np.float32


def _call(q, fn, args, shown, hint):
    """fn(*args), a learner's exception turned into a failure naming the call (`shown`)."""
    return call_answer(q, fn, args, hint, shown)


def _number(q, got, shown, hint):
    """got as a float32 scalar, or a failure: a number (Python, NumPy or a 0-d/1-element array), finite, > 0."""
    ok = not isinstance(got, (bool, np.bool_, str, bytes))
    arr = np.asarray(got) if ok else None
    if arr is None or arr.dtype.kind not in "fiu" or arr.size != 1 or arr.ndim > 1:
        fail(q, [f"{shown} returned {got!r}: expected one number, the scale (np.float32)"], hint)
    value = _F(arr.reshape(()))
    if not np.isfinite(value) or value <= 0:
        fail(q, [f"{shown} returned {value!r}: a scale is finite and > 0"], hint)
    return value


def _near(a, b, rel=1e-6) -> bool:
    return bool(abs(float(a) - float(b)) <= rel * abs(float(b)))


def _ulps(a, b) -> int:
    return abs(int(np.asarray(a, _F).view(np.int32)) - int(np.asarray(b, _F).view(np.int32)))


# ------------------------------------------------------------------------------------ Q1: the scale of a history


def reference_scale(history, fmt="e4m3", margin: int = 0, algo: str = "max") -> np.float32:
    """The scale fp8lab.numerics.scaling.DelayedScaling holds after recording `history` (oldest first) with this algo
    and margin: its own computation, not a copy."""
    ds = scaling.DelayedScaling(history_len=len(history), algo=algo, margin=margin, fmt=fmt)
    for a in history:
        ds.update(float(a))
    return ds.scale


def _history(rng, n, lo=-20.0, hi=12.0):
    """n float32 amaxes from 2^lo to 2^hi, the largest never the most recent (so algo "most_recent" shows)."""
    h = np.exp2(rng.uniform(lo, hi, n)).astype(_F)
    if n > 1 and int(np.argmax(h)) == n - 1:
        j = int(rng.integers(n - 1))
        h[j], h[-1] = h[-1], h[j]
    return h


def _scale_cases(rng):
    """(history float32 (n,), fmt_max, margin): fixed cases first, then random ones."""
    f = lambda *v: np.array(v, _F)  # noqa: E731
    e4, e5 = float(spec.FP8_MAX["e4m3"]), float(spec.FP8_MAX["e5m2"])
    cases = [
        (f(1.0, 3.5, 2.0), e4, 0),
        (f(0.25, 900.0, 12.0, 7.0), e4, 1),
        (f(6.0), e4, 3),
        (f(2.0e3, 5.0e4, 1.0, 3.0e4), e5, 2),
        (f(3e-13, 1e-13, 2e-13), e4, 0),  # every amax below AMAX_FLOOR: the floor sets the scale
    ]
    for _ in range(8):
        cases.append((_history(rng, int(rng.integers(2, 41))), float(rng.choice([e4, e5])),
                      int(rng.integers(0, 5))))
    cases.append((_history(rng, int(rng.integers(2, 9)), -60, -41), e4, int(rng.integers(0, 3))))  # all < floor
    return cases


def _scale_hint(history, fmt_max, margin, got):
    """A hint naming the mistake that gives `got`, if one does."""
    fmt = _FMT_OF_MAX[fmt_max]
    a = float(np.max(history))
    floored = max(a, _FLOOR)
    p = 2.0**margin
    recent = reference_scale(history, fmt, margin, "most_recent")
    if a < _FLOOR and (float(got) == 0 or _near(got, a * p / fmt_max)):
        return (f"every amax of this history is below AMAX_FLOOR = {_FLOOR:g}: like fp8lab's current scaling "
                "(fp8lab.numerics.spec), the amax is floored first, max(amax, 1e-12), so the scale is never (almost) "
                "zero and x / scale never overflows float32")
    if not _near(recent, reference_scale(history, fmt, margin)) and _near(got, recent):
        return ("this is the scale of the most recent amax (algo \"most_recent\"); TE's default algo \"max\" takes "
                "the largest amax in the whole history: np.max(history)")
    if _near(got, fmt_max / (floored * p)) or _near(got, fmt_max / floored):
        return ("this is the inverse: FP8_MAX / amax is what Transformer Engine calls `scale` (the factor the cast "
                "multiplies by); fp8lab's scale is the dequantization factor, amax * 2^margin / FP8_MAX (TE's "
                "scale_inv), so that x ~= decode(code) * scale")
    if margin and _near(got, floored / fmt_max):
        return (f"the margin is missing: margin {margin} multiplies the scale by 2^margin = {p:g} (headroom: the "
                f"history's amax lands on FP8_MAX / 2^margin, leaving {margin} binade(s) free above it)")
    if margin and _near(got, floored / p / fmt_max):
        return ("the margin goes the other way: the scale is multiplied by 2^margin (a larger scale, smaller "
                "scaled values: headroom), not divided")
    if _near(got, float(np.mean(history)) * p / fmt_max) or _near(got, max(float(np.mean(history)), _FLOOR) * p
                                                                   / fmt_max):
        return "algo \"max\" takes the largest amax of the history (np.max), not the mean"
    if _near(got, floored * p / fmt_max, rel=1e-5):
        return ("off in the last bits: compute float(np.max(history)) * 2**margin / fmt_max (a power of two "
                "multiplies exactly; one division, then one rounding to np.float32) and return np.float32 of it")
    return None


@question
def scale_from_history(fn, rng=None):
    """Check `fn(history, fmt_max, margin) -> scale`: the dequantization scale of an amax history, algo "max",
    bit for bit against fp8lab.numerics.scaling.DelayedScaling fed the same amaxes (E4M3 and E5M2, margins 0..4)."""
    q = "scale_from_history"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    cases = _scale_cases(rng)
    for history, fmt_max, margin in cases:
        shown = f"scale_from_history({np.array2string(history, precision=4, threshold=6)}, {fmt_max:g}, {margin})"
        got = _call(q, fn, (history.copy(), fmt_max, margin), shown,
                    "history is a 1-D float32 array of amaxes (most recent last); return one number")
        got = _number(q, got, shown, "return the scale: np.float32(max(history) * 2**margin / fmt_max), floored")
        want = reference_scale(history, _FMT_OF_MAX[fmt_max], margin)
        if got != want:
            fail(q, [f"{shown}: expected {want!r} (largest amax {float(np.max(history)):.6g} * 2^{margin} / "
                     f"{fmt_max:g}), got {got!r} ({_ulps(got, want)} float32 steps apart)"],
                 _scale_hint(history, fmt_max, margin, got))
    return (f"{len(cases)} histories (1 to 40 amaxes, E4M3 and E5M2, margins 0..4, one below AMAX_FLOOR): "
            "bit for bit with fp8lab.numerics.scaling.DelayedScaling")


# --------------------------------------------------------------------------- Q2: a sequence, quantized with delay


def reference_steps(tensors, history_len: int, algo: str = "max"):
    """(codes per step, scales (T,) float32) of delayed scaling driven as the worksheet says: the scale of step t
    from DelayedScaling.scale_for (steps < t), codes = formats.encode(x / scale) (float32 division, saturating,
    the cast scaling.lagging_experiment counts)."""
    ds = scaling.DelayedScaling(history_len=history_len, algo=algo)
    codes, scales = [], []
    for x in tensors:
        s = ds.scale_for(x)
        codes.append(_cast(x, s))
        scales.append(s)
    return codes, np.array(scales, _F)


def _cast(x, scale):
    with np.errstate(over="ignore"):
        return formats.encode((x / _F(scale)).astype(_F), formats.E4M3)


def _traps(x, scale, rng, n=6):
    """Up to n float32 values below amax(x) in magnitude, each on or next to an E4M3 rounding tie after / scale,
    where the cast's float32 division and two near-misses (x * float32(1 / scale); a float64 division) give
    different codes."""
    s = _F(scale)
    inv = _F(1) / s
    table = formats.value_table(formats.E4M3).astype(np.float64)
    mids = (table[0:0x7E] + table[1:0x7F]) / 2  # every tie between neighbouring non-negative codes
    x0 = (mids * np.float64(s)).astype(_F)
    cands = np.concatenate([np.nextafter(x0, _F(np.inf)), x0, np.nextafter(x0, _F(-np.inf))])
    cands = cands[(cands > 0) & (cands < np.max(np.abs(x)))]
    with np.errstate(over="ignore"):
        good = formats.encode((cands / s).astype(_F))
        by_inv = formats.encode((cands * inv).astype(_F))
        by_f64 = formats.encode(cands.astype(np.float64) / np.float64(s))
    mul, f64 = cands[by_inv != good], cands[by_f64 != good]
    picked = np.concatenate([rng.permutation(mul)[: n // 2], rng.permutation(f64)[: n - min(len(mul), n // 2)]])
    return (picked * np.where(rng.random(len(picked)) < 0.5, _F(-1), _F(1))).astype(_F)


def _place_traps(tensors, history_len, rng):
    """Put trap values into each step t >= 1 (below that step's amax, so no scale changes)."""
    ds = scaling.DelayedScaling(history_len=history_len)
    for t, x in enumerate(tensors):
        if t:
            flat = x.reshape(-1)
            traps = _traps(x, ds.scale, rng)
            top = int(np.argmax(np.abs(flat)))
            where = rng.permutation(np.delete(np.arange(flat.size), top))[: len(traps)]
            flat[where] = traps[: len(where)]
        ds.scale_for(x)
    return tensors


def _steps_cases(rng):
    """(what, tensors, history_len): a window edge, growth, a spike, random magnitudes; odd shapes."""
    f = _F
    shapes = [(37,), (5, 13), (3, 130), (129,), (2, 3, 7)]

    def draw(shape, mag):
        return (rng.standard_normal(shape) * mag).astype(f)

    # first the window edge: its amaxes rise and fall, so current scaling and a history holding the current
    # step differ there (on a growing tensor they coincide), and a window off by one shows at step 5 or 6
    mags = [1.0, 1.5, 30.0, 2.0, 1.0, 1.2, 0.8, 1.1, 0.9]  # step 2 leaves a window of 3 after step 5
    out = [("9 steps, step 2 twenty times larger, history_len 3", [draw((41,), m) for m in mags], 3)]
    g = float(rng.uniform(1.2, 1.4))
    out.append((f"12 steps growing {g:.2f}x per step, history_len 1024",
                [draw(shapes[t % 5], 0.5 * g**t) for t in range(12)], 1024))
    T, spike = int(rng.integers(10, 15)), int(rng.integers(4, 8))
    out.append((f"{T} steps, a 16x spike at step {spike}, history_len 1024",
                [draw((7, 19), 16.0 if t == spike else 1.0) for t in range(T)], 1024))
    hl = int(rng.integers(1, 6))
    out.append((f"15 steps of random magnitudes, history_len {hl}",
                [draw(shapes[int(rng.integers(5))], float(np.exp2(rng.uniform(-8, 8)))) for _ in range(15)], hl))
    return [(what, _place_traps(ts, hl_, rng), hl_) for what, ts, hl_ in out]


def _steps_output(q, got, tensors, shown):
    hint = ("return (codes, scales): codes a list with one uint8 array per tensor (its shape, from formats.encode), "
            "scales a float32 array with one scale per step")
    T = len(tensors)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(q, [f"{shown} returned {type(got).__name__}: expected a pair (codes, scales)"], hint)
    codes, scales = got
    if isinstance(codes, np.ndarray) or not hasattr(codes, "__len__") or len(codes) != T:
        fail(q, [f"{shown}: codes should be a list of {T} arrays, one per step, got {type(codes).__name__}"
                 + (f" of length {len(codes)}" if hasattr(codes, "__len__") else "")], hint)
    for t, (c, x) in enumerate(zip(codes, tensors)):
        if not isinstance(c, np.ndarray) or c.dtype != np.uint8 or c.shape != x.shape:
            what = f"{c.dtype} {c.shape}" if isinstance(c, np.ndarray) else type(c).__name__
            fail(q, [f"{shown}: codes[{t}] is {what}, expected uint8 {x.shape} (the shape of step {t}'s tensor)"],
                 hint)
    try:
        s = np.asarray(scales, dtype=np.float64)
    except (TypeError, ValueError):
        fail(q, [f"{shown}: scales is {type(scales).__name__}, expected {T} numbers"], hint)
    if s.shape != (T,):
        fail(q, [f"{shown}: scales has shape {s.shape}, expected ({T},)"], hint)
    if not np.all(np.isfinite(s) & (s > 0)):
        t = int(np.flatnonzero(~(np.isfinite(s) & (s > 0)))[0])
        fail(q, [f"{shown}: scales[{t}] is {s[t]!r}: every scale is finite and > 0"], hint)
    return codes, s.astype(_F)


def _scales_hint(tensors, history_len, got, want, t):
    amax = [float(np.max(np.abs(x))) for x in tensors]
    current = np.array([spec.group_scale(_F(a))[0] for a in amax], _F)
    inclusive = np.array([reference_scale(amax[max(0, i + 1 - history_len): i + 1]) for i in range(len(amax))], _F)
    if np.array_equal(got[1:], current[1:]):
        return ("these are current scales, amax of this very step / 448: that is current scaling (two passes over "
                "memory: the amax first, then the cast). Delayed scaling quantizes step t with the scale of the "
                "history of steps before t, and records step t's amax only after the cast")
    if np.array_equal(got[1:], inclusive[1:]):
        return ("your history already holds this step's amax when you compute its scale: quantize step t with the "
                "scale of steps < t first, then append amax(x_t); otherwise it is current scaling in disguise")
    for d in (-1, 1, 2):
        if history_len + d >= 1 and np.array_equal(got, reference_steps(tensors, history_len + d)[1]):
            return (f"off by {d:+d} in the history window: the scale of step t comes from the amaxes of steps "
                    f"t-{history_len} .. t-1, the last history_len = {history_len} of them (a "
                    f"collections.deque(maxlen=history_len), or history[-history_len:])")
    if t == 0:
        return ("step 0 has no history yet: Transformer Engine's initial scale is 1.0 (fp8lab.numerics.scaling keeps "
                "it), so step 0 is quantized with scale 1.0")
    if np.array_equal(got, reference_steps(tensors, history_len, "most_recent")[1]):
        return "that is algo \"most_recent\" (the last amax): use the largest amax in the window, algo \"max\""
    if _ulps(got[t], want[t]) <= 4:
        return "off in the last bits: compute the scale as in question 1, rounded once to np.float32"
    return None


def _codes_hint(x, scale, got, want):
    sat = (want & 0x7F) == 0x7E
    if np.any(sat & ((got & 0x7F) == 0x7F)):
        return ("elements beyond E4M3's range came out NaN (0x7F / 0xFF): the cast saturates, like PTX "
                "cvt.rn.satfinite: formats.encode(x / scale) (saturate=True, the default) clamps them to +-448 "
                "(0x7E / 0xFE); ml_dtypes' astype and saturate=False give NaN instead")
    recip = ("you multiplied by 1 / scale (or FP8_MAX / amax, TE's way): that rounds twice, and a value next to "
             "an E4M3 rounding tie can land on the other side; the cast here divides: "
             "formats.encode(x / scale) in float32")
    f64 = ("you divided in float64: keep x and the scale float32 (x / np.float32(scale)), so the quotient is "
           "rounded to float32 first, as a kernel's float32 arithmetic would; formats.encode of a float64 "
           "value rounds it once, directly, and differs next to a rounding tie")
    with np.errstate(over="ignore"):
        found = [h for h, codes in ((recip, formats.encode((x * (_F(1) / _F(scale))).astype(_F))),
                                    (f64, formats.encode(x.astype(np.float64) / np.float64(scale))))
                 if np.array_equal(got, codes)]
    if found:  # on some draws both mistakes give these codes: name both
        return " Or: ".join(found)
    if np.array_equal(got, spec.quantize_tensor(x)[0]):
        return ("these codes use the current scale (this step's own amax); quantize with the delayed scale you "
                "return for this step")
    return None


@question
def delayed_quantize_steps(fn, rng=None):
    """Check `fn(tensors, history_len) -> (codes, scales)`: delayed scaling over a sequence of float32 tensors, E4M3,
    algo "max", margin 0; scales and codes bit for bit against fp8lab.numerics.scaling.DelayedScaling.scale_for and
    formats.encode(x / scale)."""
    q = "delayed_quantize_steps"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    cases = _steps_cases(rng)
    n_sat = 0
    for what, tensors, history_len in cases:
        shown = f"delayed_quantize_steps(<{what}>, {history_len})"
        copies = [x.copy() for x in tensors]
        got = _call(q, fn, (copies, history_len), shown, "tensors is a list of float32 arrays (any shapes)")
        codes, scales = _steps_output(q, got, tensors, shown)
        want_codes, want_scales = reference_steps(tensors, history_len)
        bad = np.flatnonzero(scales.view(np.int32) != want_scales.view(np.int32))
        if len(bad):
            t = int(bad[0])
            amax = [float(np.max(np.abs(x))) for x in tensors]
            fail(q, [f"{shown}: step {t}: scale {scales[t]!r}, expected {want_scales[t]!r}",
                     f"  amax per step {np.array2string(np.array(amax), precision=3, threshold=20)}",
                     f"  scales given  {np.array2string(scales, precision=4, threshold=20)}",
                     f"  scales wanted {np.array2string(want_scales, precision=4, threshold=20)}"],
                 _scales_hint(tensors, history_len, scales, want_scales, t))
        for t, (c, w, x) in enumerate(zip(codes, want_codes, tensors)):
            if not np.array_equal(c, w):
                i = np.unravel_index(int(np.flatnonzero(c.reshape(-1) != w.reshape(-1))[0]), x.shape)
                fail(q, [f"{shown}: step {t} (scale {want_scales[t]!r}): element {tuple(int(v) for v in i)}, "
                         f"x = {float(x[i])!r}, x / scale = {float(_F(x[i]) / want_scales[t])!r}: code "
                         f"0x{int(c[i]):02X}, expected 0x{int(w[i]):02X} "
                         f"({int(np.count_nonzero(c != w))} of {c.size} codes differ)"],
                     _codes_hint(x, want_scales[t], c, w))
            n_sat += int(np.count_nonzero(np.abs(x) / want_scales[t] > _E4M3_MAX))
    return (f"{len(cases)} sequences (a window edge, growth, a 16x spike, random magnitudes; {n_sat} elements "
            "saturated to +-448): scales and codes bit for bit with fp8lab.numerics.scaling.DelayedScaling")


# -------------------------------------------------------------------------------------- Q3: a spike, clipped


def clipped(x, scale) -> int:
    """Elements of x that the cast clips: formats.encode(x / scale) saturates them to +-448 where the
    non-saturating cast (saturate=False) gives NaN, i.e. x / scale is beyond E4M3's range even after rounding."""
    with np.errstate(over="ignore"):
        codes = formats.encode((x / _F(scale)).astype(_F), formats.E4M3, saturate=False)
    return int(np.count_nonzero((codes & 0x7F) == 0x7F))


def _spike_cases(rng):
    """(tensors, spike_step, history_len): N(0, 1) steps of slowly varying size, one step 16x larger; the spike
    step holds a few elements whose x / delayed scale lies in (448, 464), which round to 448 without clipping."""
    out = []
    for hl in (1024, int(rng.integers(2, 6)), int(rng.integers(1, 1025))):
        T = int(rng.integers(8, 17))
        spike = int(rng.integers(3, T - 1))
        shape = [(3001,), (37, 81), (5, 11, 23)][len(out)]
        mags = np.exp(rng.normal(0.0, 0.1, T))
        mags[spike] = 16.0 * mags[spike - 1]
        tensors = [(rng.standard_normal(shape) * m).astype(_F) for m in mags]
        ds = scaling.DelayedScaling(history_len=hl)
        for x in tensors[:spike]:
            ds.scale_for(x)
        s = ds.scale
        band = (rng.uniform(449.0, 463.0, 4) * np.float64(s)).astype(_F) * _F(rng.choice([-1, 1]))
        flat = tensors[spike].reshape(-1)
        top = int(np.argmax(np.abs(flat)))
        where = rng.permutation(np.delete(np.arange(flat.size), top))[:4]
        flat[where] = band
        out.append((tensors, spike, hl))
    return out


def _counts(q, got, shown):
    hint = "return a pair of ints: (clipped under delayed scaling, clipped under current scaling)"
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(q, [f"{shown} returned {got!r}: expected a pair (delayed, current)"], hint)
    out = []
    for v in got:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, np.integer, float, np.floating)):
            fail(q, [f"{shown} returned {got!r}: expected two counts"], hint)
        if float(v) != int(v):
            fail(q, [f"{shown} returned {got!r}: expected two counts (whole numbers of elements)"],
                 "count elements (np.count_nonzero), not a fraction or a mean")
        out.append(int(v))
    return tuple(out)


def _spike_hint(tensors, spike, hl, got, want):
    x = tensors[spike]
    steps = reference_steps(tensors, hl)[1]
    s_del, s_cur = steps[spike], spec.quantize_tensor(x)[1]
    over = lambda s: int(np.count_nonzero(np.abs(x / _F(s)) > _E4M3_MAX))  # noqa: E731
    at448 = lambda s: int(np.count_nonzero((_cast(x, s) & 0x7F) == 0x7E))  # noqa: E731
    if got == want[::-1]:
        return "the order is (delayed, current)"
    if got[0] in (0, clipped(x, s_cur)) or got[0] in (clipped(x, steps[spike + 1]),):
        return ("delayed scaling clips most of the spike: step t is quantized with the scale of steps < t, whose "
                f"largest amax ({float(s_del) * _E4M3_MAX:.3g}) is about 16x below the spike's "
                f"({float(np.max(np.abs(x))):.3g}); every element above that old amax lands beyond 448 and is "
                "clamped. The spike's own amax enters the history only after its cast (and then, with algo "
                "\"max\", keeps the scale high for history_len steps). Take the scale of the spike step from the "
                "steps before it (your delayed_quantize_steps)")
    if got[0] in (clipped(tensors[spike - 1], steps[spike - 1]), clipped(tensors[spike + 1], steps[spike + 1])):
        return f"count at the spike step, tensors[{spike}] (step numbers start at 0)"
    over_hint = ("an element with 448 < x / scale <= 464 rounds to 448 anyway: it is not clipped. Count the elements "
                 "that the non-saturating cast makes NaN: formats.encode(x / scale, saturate=False), codes 0x7F "
                 "and 0xFF")
    at448_hint = ("a code of +-448 is not clipping by itself (under current scaling the amax element lands exactly "
                  "on 448): count the elements that the non-saturating cast makes NaN, formats.encode(x / scale, "
                  "saturate=False) & 0x7F == 0x7F")
    for mine, s in ((0, s_del), (1, s_cur)):  # the first wrong count decides
        if got[mine] != want[mine]:
            if got[mine] == at448(s):
                return at448_hint
            if got[mine] == over(s):
                return over_hint
            break
    if got[1] != 0:
        return ("current scaling takes the scale from the amax of the spike itself (amax / 448), so no element of "
                "it is beyond 448 and nothing clips")
    return None


@question
def clipped_at_spike(fn, rng=None):
    """Check `fn(tensors, spike_step, history_len) -> (clipped delayed, clipped current)` at the spike step: the
    delayed scale from fp8lab.numerics.scaling.DelayedScaling, the current one from
    fp8lab.numerics.spec.quantize_tensor, clipped
    elements counted by the non-saturating cast."""
    q = "clipped_at_spike"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    cases = _spike_cases(rng)
    shares = []
    for tensors, spike, hl in cases:
        x = tensors[spike]
        shown = f"clipped_at_spike(<{len(tensors)} tensors {x.shape}>, spike_step={spike}, history_len={hl})"
        got = _call(q, fn, ([t.copy() for t in tensors], spike, hl), shown,
                    "tensors is a list of float32 arrays; spike_step indexes it")
        got = _counts(q, got, shown)
        s_del = reference_steps(tensors[: spike + 1], hl)[1][spike]
        want = (clipped(x, s_del), clipped(x, spec.quantize_tensor(x)[1]))
        if got != want:
            fail(q, [f"{shown}: returned {got}, expected (delayed, current) = {want} of {x.size} elements"],
                 _spike_hint(tensors, spike, hl, got, want))
        shares.append(want[0] / x.size)
    return (f"{len(cases)} sequences with a 16x spike: delayed scaling clipped {min(shares):.0%} to "
            f"{max(shares):.0%} of the spike's elements, current scaling none")
