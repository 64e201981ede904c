"""Worksheet checks ws4, ws6 and ws12 (delayed scaling, the limited accumulator, pipeline schedules; NumPy, no kernels):
right answers pass, wrong answers are rejected with a specific message, placeholders are "not attempted"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8lab.course import check
from fp8lab.numerics import formats


# --------------------------------------------------------------------------- ws12: pipeline schedules (no kernels)


def _ws12_orders(stages, microbatches, warm):
    """1F1B's shape with warm(s) warm-up forwards on stage s (clamped to 0..N)."""
    out = []
    for s in range(stages):
        w = max(0, min(warm(s), microbatches))
        order = [("F", m) for m in range(w)]
        for i in range(microbatches - w):
            order += [("F", w + i), ("B", i)]
        out.append(order + [("B", m) for m in range(microbatches - w, microbatches)])
    return out


def ws12_one_f_one_b(stages, microbatches):
    return _ws12_orders(stages, microbatches, lambda s: stages - 1 - s)


def ws12_gpipe(stages, microbatches):
    return [[("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
            for _ in range(stages)]


def ws12_one_warmup_too_many(stages, microbatches):
    return _ws12_orders(stages, microbatches, lambda s: stages - s)


def ws12_one_warmup_too_few(stages, microbatches):
    return _ws12_orders(stages, microbatches, lambda s: stages - 2 - s)


def ws12_warmups_reversed(stages, microbatches):
    return _ws12_orders(stages, microbatches, lambda s: s)


def ws12_backward_before_forward(stages, microbatches):
    orders = ws12_one_f_one_b(stages, microbatches)
    orders[-1][0], orders[-1][1] = orders[-1][1], orders[-1][0]  # the last stage: ("B", 0) before ("F", 0)
    return orders


def ws12_no_cooldown(stages, microbatches):
    return [o[: len(o) - (stages - 1 - s)] for s, o in enumerate(ws12_one_f_one_b(stages, microbatches))]


def ws12_split_backwards(stages, microbatches):
    return [o + [("W", m) for m in range(microbatches)] for o in ws12_one_f_one_b(stages, microbatches)]


def ws12_table2(PP, F, B, W, FB):
    return (PP - 1) * (F + B), (PP / 2 - 1) * (FB + B - 3 * W)


def ws12_memory(timeline):
    out = []
    for s, events in enumerate(timeline.events):
        stages, held, peak = set(), 0, 0
        for e in events:
            stages |= {s if d == 0 else timeline.stages - 1 - s for d in (e.direction, e.b_direction) if d is not None}
            if e.kind in ("F", "FB"):
                held += 1
                peak = max(peak, held)
            if e.kind in ("W", "FB") or (e.kind == "B" and not e.split):
                held -= 1
        out.append((len(stages), peak))
    return out


def ws12_memory_freed_at_split_b(timeline):
    out = []
    for stages, _ in ws12_memory(timeline):
        held = peak = 0
        for e in timeline.events[len(out)]:
            held += e.kind in ("F", "FB")
            peak = max(peak, held)
            held -= e.kind in ("B", "FB")  # forgets that W still needs them
        out.append((stages, peak))
    return out


def ws12_memory_fb_frees_first(timeline):
    out = []
    for stages, _ in ws12_memory(timeline):
        held = peak = 0
        for e in timeline.events[len(out)]:
            held -= e.kind == "FB" or e.kind == "W" or (e.kind == "B" and not e.split)
            held += e.kind in ("F", "FB")  # an FB's backward freed before its forward counted
            peak = max(peak, held)
        out.append((stages, peak))
    return out


def ws12_memory_per_direction(timeline):
    out = []
    for stages, _ in ws12_memory(timeline):
        held, peak = [0, 0], [0, 0]
        for e in timeline.events[len(out)]:
            if e.kind in ("F", "FB"):
                held[e.direction] += 1
                peak[e.direction] = max(peak[e.direction], held[e.direction])
            if e.kind in ("W", "FB") or (e.kind == "B" and not e.split):
                held[e.b_direction if e.kind == "FB" else e.direction] -= 1
        out.append((stages, max(peak)))
    return out


def ws12_memory_one_stage_each(timeline):
    return [(1, peak) for _, peak in ws12_memory(timeline)]


def ws12_memory_from_summary(timeline):
    return [(timeline.parameters, p) for p in timeline.peak_activations]


def test_ws12_right_answers_pass(rng, capsys):
    check.one_f_one_b(ws12_one_f_one_b, rng=rng)
    check.table2_bubbles(ws12_table2, rng=rng)
    check.memory_per_device(ws12_memory, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS12_WRONG = [
    (check.one_f_one_b, ws12_gpipe, "GPipe's order"),
    (check.one_f_one_b, ws12_one_warmup_too_many, "too many warm-up forwards"),
    (check.one_f_one_b, ws12_one_warmup_too_few, "too few warm-up forwards"),
    (check.one_f_one_b, ws12_warmups_reversed, "warm-up counts are reversed"),
    (check.one_f_one_b, ws12_backward_before_forward, "lists ('B', 0) before ('F', 0)"),
    (check.one_f_one_b, ws12_no_cooldown, "exactly once"),
    (check.one_f_one_b, ws12_split_backwards, "runs each backward whole"),
    (check.one_f_one_b, lambda stages, microbatches: None, "expected a list of"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B), (PP - 1) * (FB + B - 3 * W)),
     "(PP/2-1), not (PP-1)"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B), (PP / 2 - 1) * (FB + B)), "-3W is missing"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B), (PP / 2 - 1) * (F + 2 * B - 3 * W)),
     "not F + B"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B - 2 * W), ws12_table2(PP, F, B, W, FB)[1]),
     "ZB1P's bubble"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ws12_table2(PP, F, B, W, FB)[::-1], "order is (1F1B, DualPipe)"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: PP * (F + B), "expected a pair of numbers"),
    (check.memory_per_device, ws12_memory_freed_at_split_b, "freed at the end of the W"),
    (check.memory_per_device, ws12_memory_fb_frees_first, "DualPipe's PP+1"),
    (check.memory_per_device, ws12_memory_per_direction, "not a maximum over directions"),
    (check.memory_per_device, ws12_memory_one_stage_each, "DualPipe's 2x parameters"),
    (check.memory_per_device, ws12_memory_from_summary, "summary fields are hidden"),
]


@pytest.mark.parametrize("checker, answer, says", WS12_WRONG, ids=[f"ws12-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS12_WRONG)])
def test_ws12_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws12_placeholders_are_not_attempted():
    def one_f_one_b(stages, microbatches):
        raise NotImplementedError("your answer goes here: replace this line")

    def table2_bubbles(PP, F, B, W, FB):
        raise NotImplementedError("your answer goes here: replace this line")

    def memory_per_device(timeline):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.one_f_one_b, one_f_one_b), (check.table2_bubbles, table2_bubbles),
                            (check.memory_per_device, memory_per_device)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


# ------------------------------------------------ ws6: the limited accumulator and promotion (NumPy, no kernels)


def ws6_sum(products, bits, *, rnd=np.trunc, final_rnd=None, extra=0, group=32, with_acc=True, zero_exp=False,
            final=True, own=False, tail=True):
    """A learner's accumulate_limited, one rule changeable (the defaults are right)."""
    final_rnd = rnd if final_rnd is None else final_rnd
    kept = bits + extra
    p = np.asarray(products, np.float64)
    group = group or max(len(p), 1)
    end = len(p) if tail else len(p) - len(p) % group
    acc = 0.0
    for k0 in range(0, end, group):
        terms = list(p[k0:k0 + group]) + ([acc] if with_acc else [])
        exps = [math.frexp(t)[1] for t in terms if t != 0 or zero_exp]
        if not exps:
            continue
        ulp = 2.0 ** (max(exps) - kept - 1)
        if own:  # each term cut to its own kept bits
            s = sum(math.ldexp(float(rnd(math.ldexp(m, kept + 1))), e - kept - 1) for m, e in map(math.frexp, terms))
        else:
            s = sum(float(rnd(t / ulp)) for t in terms) * ulp
        if not with_acc:
            s += acc
        if final:
            m, e = math.frexp(s)
            s = math.ldexp(float(final_rnd(math.ldexp(m, kept + 1))), e - kept - 1)
        acc = s
    return acc


def ws6_promoted(a, b, bits, promote_every, *, first=None, reset=True, fp64=False, add=True):
    """A learner's promoted_dot: chunk ends at first, first + promote_every, ..., and K."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    if promote_every is None:
        return ws6_sum(p, bits)
    bounds = list(range(promote_every if first is None else first, len(p), promote_every)) + [len(p)]
    total, start = (0.0 if fp64 else np.float32(0)), 0
    for stop in bounds:
        part = ws6_sum(p[(start if reset else 0):stop], bits)
        total = (total + part if fp64 else np.float32(total + np.float32(part))) if add else np.float32(part)
        start = stop
    return float(np.float32(total))


def ws6_errors(a, b, *, exact_of=None, bits=13, P=(None, 128), form=lambda y, ex: abs(y - ex) / abs(ex)):
    ex = math.fsum(np.asarray(a, np.float64) * b) if exact_of is None else exact_of(a, b)
    return tuple(form(ws6_promoted(a, b, bits, p), ex) for p in P)


def _ws6_wrong_sum(fixed13=False, **kw):
    return lambda products, bits: ws6_sum(products, 13 if fixed13 else bits, **kw)


def _ws6_wrong_dot(scale=1, late=0, **kw):
    def promoted_dot(a, b, bits, promote_every):
        if promote_every is None:
            return ws6_promoted(a, b, bits, None)
        P = promote_every * scale
        return ws6_promoted(a, b, bits, P, **({"first": P + late} | kw))

    return promoted_dot


def _ws6_wrong_errors(letter="C", **kw):
    return (lambda a, b: ws6_errors(a, b, **kw)), (lambda: letter)


def test_ws6_right_answers_pass(rng, capsys):
    check.accumulate_limited(lambda products, bits: ws6_sum(products, bits), rng=rng)
    check.promoted_dot(ws6_promoted, rng=rng)
    check.promotion_errors(ws6_errors, lambda: " c", rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS6_WRONG = [
    (check.accumulate_limited, _ws6_wrong_sum(rnd=np.rint), "truncate toward zero"),
    (check.accumulate_limited, _ws6_wrong_sum(final_rnd=np.rint), "truncate toward zero"),
    (check.accumulate_limited, _ws6_wrong_sum(rnd=np.floor), "not down (np.floor"),
    (check.accumulate_limited, _ws6_wrong_sum(extra=1), "one bit too many"),
    (check.accumulate_limited, _ws6_wrong_sum(extra=-1), "one bit too few"),
    (check.accumulate_limited, _ws6_wrong_sum(own=True), "LARGEST exponent"),
    (check.accumulate_limited, _ws6_wrong_sum(with_acc=False), "running accumulator is one more addend"),
    (check.accumulate_limited, _ws6_wrong_sum(zero_exp=True), "zero terms take no part"),
    (check.accumulate_limited, _ws6_wrong_sum(final=False), "normalize and truncate the sum"),
    (check.accumulate_limited, _ws6_wrong_sum(group=1), "not added one at a time"),
    (check.accumulate_limited, _ws6_wrong_sum(group=0), "not the whole array at once"),
    (check.accumulate_limited, _ws6_wrong_sum(tail=False), "the last group may be short"),
    (check.accumulate_limited, _ws6_wrong_sum(fixed13=True), "use the `bits` argument"),
    (check.accumulate_limited, lambda products, bits: math.fsum(products), "this is the exact sum"),
    (check.accumulate_limited, lambda products, bits: np.full(2, 1.0), "expected one number"),
    (check.promoted_dot, _ws6_wrong_dot(first=10**9), "was ignored"),
    (check.promoted_dot, lambda a, b, bits, P: ws6_promoted(a, b, bits, P and 32), "not after every group of 32"),
    (check.promoted_dot, _ws6_wrong_dot(first=32), "not after the first group"),  # ends at 32, 32 + P, ...
    (check.promoted_dot, _ws6_wrong_dot(scale=32), "counts elements of K"),
    (check.promoted_dot, _ws6_wrong_dot(late=32), "AFTER adding the group"),
    (check.promoted_dot, _ws6_wrong_dot(reset=False), "reset the limited accumulator"),
    (check.promoted_dot, _ws6_wrong_dot(add=False), "ADD each promoted"),
    (check.promoted_dot, _ws6_wrong_dot(fp64=True), "add the partial sums in float32"),
    (check.promotion_errors, _ws6_wrong_errors(P=(128, None)), "the order is"),
    (check.promotion_errors, _ws6_wrong_errors(form=lambda y, ex: 100 * abs(y - ex) / abs(ex)), "not percentages"),
    (check.promotion_errors, _ws6_wrong_errors(form=lambda y, ex: abs(y - ex)), "not |y - exact|"),
    (check.promotion_errors, _ws6_wrong_errors(form=lambda y, ex: (y - ex) / ex), "take the absolute value"),
    (check.promotion_errors, _ws6_wrong_errors(exact_of=lambda a, b: float(np.dot(a, b))), "sum in float64"),
    (check.promotion_errors, _ws6_wrong_errors(bits=14), "bits = 13"),
    (check.promotion_errors, _ws6_wrong_errors(P=(None, 32)), "every N_C = 128"),
    (check.promotion_errors, _ws6_wrong_errors("A"), "at most 4 x 4 = 8 significant bits"),
    (check.promotion_errors, _ws6_wrong_errors("B"), "Range is not the problem"),
    (check.promotion_errors, _ws6_wrong_errors("D"), "truncation is not random"),
    (check.promotion_errors, _ws6_wrong_errors("E"), "expected one of"),
    (check.promotion_errors, ((lambda a, b: 0.05), lambda: "C"), "expected a pair"),
]


@pytest.mark.parametrize("checker, answer, says", WS6_WRONG, ids=[f"ws6-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS6_WRONG)])
def test_ws6_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(*(answer if isinstance(answer, tuple) else (answer,)), rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws6_reference_calls_are_refused():
    from fp8lab.numerics import accum

    def accumulate_limited(products, bits):
        return float(accum.dot_limited(products, np.ones_like(products), bits)[0, 0])

    def promoted_dot(a, b, bits, promote_every):
        return float(accum.dot_limited(a, b, bits, promote_every=promote_every)[0, 0])

    with pytest.raises(check.CheckFailed, match="calls dot_limited"):
        check.accumulate_limited(accumulate_limited)
    with pytest.raises(check.CheckFailed, match="calls dot_limited"):
        check.promoted_dot(promoted_dot)


def test_ws6_placeholders_are_not_attempted():
    def accumulate_limited(products, bits):
        raise NotImplementedError("your answer goes here: replace this line")

    def promoted_dot(a, b, bits, promote_every):
        raise NotImplementedError("your answer goes here: replace this line")

    def promotion_errors(a, b):
        raise NotImplementedError("your answer goes here: replace this line")

    def why_error_grows():
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, args in ((check.accumulate_limited, (accumulate_limited,)), (check.promoted_dot, (promoted_dot,)),
                          (check.promotion_errors, (promotion_errors, why_error_grows))):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(*args)
    with pytest.raises(check.NotAttempted, match="^not attempted yet: why_error_grows"):
        check.promotion_errors(ws6_errors, why_error_grows)

    def promoted_dot_written(a, b, bits, promote_every):  # question 2 answered, question 1 not
        return accumulate_limited(np.asarray(a, np.float64) * b, bits)

    with pytest.raises(check.NotAttempted, match="^not attempted yet: .*answer question 1 first"):
        check.promoted_dot(promoted_dot_written)


# -------------------------------------------------------------- ws4: delayed scaling (amax history), no kernels


def ws4_scale(history, fmt_max, margin):
    return np.float32(max(float(np.max(history)), 1e-12) * 2.0**margin / fmt_max)


def _ws4_steps(scale_of=None, cast=None, window=0, inclusive=False, first=1.0):
    """delayed_quantize_steps, right by default; each argument puts in one mistake."""
    import collections

    scale_of = scale_of or (lambda history, x: ws4_scale(np.array(history), 448.0, 0))
    cast = cast or (lambda x, s: formats.encode(x / s))

    def steps(tensors, history_len):
        history = collections.deque(maxlen=history_len + window)
        codes, scales = [], []
        for x in tensors:
            if inclusive:
                history.append(float(np.max(np.abs(x))))
            s = scale_of(history, x) if history else np.float32(first)
            codes.append(cast(x, s))
            scales.append(s)
            if not inclusive:
                history.append(float(np.max(np.abs(x))))
        return codes, np.array(scales, np.float32)

    return steps


ws4_steps = _ws4_steps()


def _ws4_clipped(x, s):
    return int(np.count_nonzero((formats.encode(x / np.float32(s), saturate=False) & 0x7F) == 0x7F))


def _ws4_spike_scales(tensors, k, hl):
    x = tensors[k]
    return x, ws4_steps(tensors[: k + 1], hl)[1][k], np.float32(np.max(np.abs(x)) / np.float32(448))


def ws4_spike(tensors, k, hl):
    x, s_del, s_cur = _ws4_spike_scales(tensors, k, hl)
    return _ws4_clipped(x, s_del), _ws4_clipped(x, s_cur)


def ws4_spike_over_448(tensors, k, hl):
    x, s_del, s_cur = _ws4_spike_scales(tensors, k, hl)
    return int(np.sum(np.abs(x / s_del) > 448)), int(np.sum(np.abs(x / s_cur) > 448))


def ws4_spike_codes_at_448(tensors, k, hl):
    x, s_del, s_cur = _ws4_spike_scales(tensors, k, hl)
    return tuple(int(np.sum((formats.encode(x / s) & 0x7F) == 0x7E)) for s in (s_del, s_cur))


def ws4_spike_current_for_both(tensors, k, hl):
    x, _, s_cur = _ws4_spike_scales(tensors, k, hl)
    return _ws4_clipped(x, s_cur), _ws4_clipped(x, s_cur)


def ws4_spike_next_step(tensors, k, hl):
    return _ws4_clipped(tensors[k + 1], ws4_steps(tensors, hl)[1][k + 1]), 0


def _ws4_ml_dtypes_cast(x, s):
    import ml_dtypes

    return (x / s).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # overflow gives NaN


def test_ws4_right_answers_pass(rng, capsys):
    check.scale_from_history(ws4_scale, rng=rng)
    check.delayed_quantize_steps(ws4_steps, rng=rng)
    check.clipped_at_spike(ws4_spike, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS4_WRONG = [
    (check.scale_from_history, lambda h, fm, m: ws4_scale(h[-1:], fm, m), "most recent amax"),
    (check.scale_from_history, lambda h, fm, m: np.float32(1 / ws4_scale(h, fm, m)), "this is the inverse"),
    (check.scale_from_history, lambda h, fm, m: ws4_scale(h, fm, 0), "the margin is missing"),
    (check.scale_from_history, lambda h, fm, m: np.float32(float(np.max(h)) * 2.0**m / fm), "AMAX_FLOOR"),
    (check.scale_from_history, lambda h, fm, m: [ws4_scale(h, fm, m)] * 2, "expected one number"),
    (check.delayed_quantize_steps, _ws4_steps(scale_of=lambda h, x: ws4_scale(np.abs(x), 448.0, 0)),
     "that is current scaling"),
    (check.delayed_quantize_steps, _ws4_steps(inclusive=True), "already holds this step's amax"),
    (check.delayed_quantize_steps, _ws4_steps(window=-1), "off by -1 in the history window"),
    (check.delayed_quantize_steps, _ws4_steps(window=1), "off by +1 in the history window"),
    (check.delayed_quantize_steps, _ws4_steps(first=1 / 448), "initial scale is 1.0"),
    (check.delayed_quantize_steps, _ws4_steps(cast=lambda x, s: formats.encode(x / s, saturate=False)),
     "the cast saturates"),
    (check.delayed_quantize_steps, _ws4_steps(cast=_ws4_ml_dtypes_cast), "the cast saturates"),
    (check.delayed_quantize_steps, _ws4_steps(cast=lambda x, s: formats.encode(x * (np.float32(1) / s))),
     "multiplied by 1 / scale"),
    (check.delayed_quantize_steps, _ws4_steps(cast=lambda x, s: formats.encode(x.astype(np.float64) / float(s))),
     "divided in float64"),
    (check.delayed_quantize_steps, lambda tensors, history_len: ws4_steps(tensors, history_len)[1],
     "expected a pair (codes, scales)"),
    (check.clipped_at_spike, ws4_spike_current_for_both, "delayed scaling clips most of the spike"),
    (check.clipped_at_spike, ws4_spike_next_step, "delayed scaling clips most of the spike"),
    (check.clipped_at_spike, ws4_spike_over_448, "rounds to 448 anyway"),
    (check.clipped_at_spike, ws4_spike_codes_at_448, "not clipping by itself"),
    (check.clipped_at_spike, lambda tensors, k, hl: ws4_spike(tensors, k, hl)[::-1], "the order is (delayed, "),
    (check.clipped_at_spike, lambda tensors, k, hl: (ws4_spike(tensors, k, hl)[0] / tensors[k].size, 0),
     "not a fraction"),
]


@pytest.mark.parametrize("checker, answer, says", WS4_WRONG, ids=[f"ws4-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS4_WRONG)])
def test_ws4_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws4_check_does_not_pass_inputs_it_reuses(rng):
    """An answer that scribbles over its inputs (NaN) changes neither the reference nor the next case."""
    def scribbling_steps(tensors, history_len):
        out = ws4_steps(tensors, history_len)
        for x in tensors:
            x[...] = np.nan
        return out

    check.delayed_quantize_steps(scribbling_steps, rng=rng)


def test_ws4_placeholders_are_not_attempted():
    def scale_from_history(history, fmt_max, margin):
        raise NotImplementedError("your answer goes here: replace this line")

    def delayed_quantize_steps(tensors, history_len):
        raise NotImplementedError("your answer goes here: replace this line")

    def clipped_at_spike(tensors, spike_step, history_len):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.scale_from_history, scale_from_history),
                            (check.delayed_quantize_steps, delayed_quantize_steps),
                            (check.clipped_at_spike, clipped_at_spike)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)
