"""ws12: pipeline schedules: 1F1B's operation order by hand, Table 2's bubbles, and memory per device, all checked
by timing and counting with fp8lab.comm.pipeline (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1)."""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from ...comm import pipeline
from ._core import NotAttempted, fail, not_attempted_message, question, still_a_placeholder, call_answer

__all__ = ["one_f_one_b", "table2_bubbles", "memory_per_device"]


# ---------------------------------------------------------------------------------------------- Q1: 1F1B orders

_SHAPE_HINT = ("return one list per stage, e.g. for 2 stages and 2 micro-batches "
               "[[('F', 0), ('F', 1), ('B', 0), ('B', 1)], [('F', 0), ('B', 0), ('F', 1), ('B', 1)]]")


def _orders(q, got, P, N):
    """The learner's orders as [[(kind, m), ...] per stage], or a failure saying what is malformed."""
    call = f"one_f_one_b({P}, {N})"
    if isinstance(got, (str, bytes)) or not hasattr(got, "__iter__"):
        fail(q, [f"{call} returned {got!r}: expected a list of {P} lists of (kind, microbatch) pairs"], _SHAPE_HINT)
    rows = [list(r) if hasattr(r, "__iter__") and not isinstance(r, (str, bytes)) else r for r in got]
    if len(rows) != P or not all(isinstance(r, list) for r in rows):
        fail(q, [f"{call} returned {len(rows)} items: expected {P} lists, one per stage"], _SHAPE_HINT)
    out = []
    for s, row in enumerate(rows):
        pairs = []
        for i, item in enumerate(row):
            ok = isinstance(item, (tuple, list)) and len(item) == 2 and item[0] in ("F", "B", "W") \
                and isinstance(item[1], (numbers.Integral, np.integer)) and not isinstance(item[1], bool)
            if not ok:
                fail(q, [f"{call}: stage {s}, item {i} is {item!r}: expected a pair such as ('F', 3)"], _SHAPE_HINT)
            if item[0] == "W":
                fail(q, [f"{call}: stage {s} lists {tuple(item)!r}"],
                     "1F1B runs each backward whole (input and weight gradients together): list only ('F', m) "
                     "and ('B', m); the split backward is ZB1P's and DualPipe's trick")
            pairs.append((item[0], int(item[1])))
        out.append(pairs)
    for s, row in enumerate(out):
        for kind in ("F", "B"):
            seen = [m for k, m in row if k == kind]
            if sorted(seen) != list(range(N)):
                twice = sorted({m for m in seen if seen.count(m) > 1})
                lack = sorted(set(range(N)) - set(seen))
                odd = sorted(set(seen) - set(range(N)))
                what = (f"('{kind}', {twice[0]}) twice" if twice else f"no ('{kind}', {lack[0]})" if lack
                        else f"('{kind}', {odd[0]}), outside 0..{N - 1}")
                fail(q, [f"{call}: stage {s} runs {what} ({len(seen)} '{kind}' in all, expected {N})"],
                     f"every stage runs the forward and the backward of each micro-batch 0..{N - 1} exactly once: "
                     "stage s runs w = min(PP-1-s, N) warm-up forwards, then N - w pairs (F, B), then w "
                     "cool-down backwards: N of each")
    return out


def _forwards_first(orders):
    """Per stage: the forwards listed before its first backward (1F1B: PP-1-s warm-ups + 1, at most N)."""
    return [next((i for i, (k, _) in enumerate(row) if k == "B"), len(row)) for row in orders]


def _deadlock_hint(orders, P):
    for s, row in enumerate(orders):
        pos = {op: i for i, op in enumerate(row)}
        early = [m for k, m in row if k == "B" and pos[("B", m)] < pos[("F", m)]]
        if early:
            return (f"stage {s} lists ('B', {early[0]}) before ('F', {early[0]}): a backward needs its own "
                    "forward's activations (and the next stage's backward), so it comes after both")
    first = _forwards_first(orders)
    if first[-1] > first[0]:
        return ("the warm-up counts are reversed: stage 0 needs the most warm-up forwards (PP-1 = "
                f"{P - 1}) and the last stage none, since stage 0's first backward arrives only after "
                "micro-batch 0 went down and back up the whole pipeline; stage s runs PP-1-s")
    return ("a backward of micro-batch m on stage s waits for m's backward on stage s+1, which waits for the "
            "forwards stage s+1 listed before it, which wait for stage s's forwards: stage s must run PP-1-s "
            "warm-up forwards before its first backward, then alternate F and B")


def _one_f_one_b_cases(rng):
    fixed = [(4, 4, 1, 2), (4, 10, 1, 2), (5, 7, 2, 3), (2, 3, 1, 1), (8, 12, 3, 5)]
    rand = [(int(P), int(P + rng.integers(0, P + 4)), int(rng.integers(1, 6)), int(rng.integers(1, 9)))
            for P in rng.integers(3, 10, 4)]
    return fixed + rand


@question
def one_f_one_b(fn, rng=None):
    """Check `fn(stages, microbatches) -> [[(kind, m), ...] per stage]`: 1F1B's operation order. Each answer is
    timed with pipeline.time_orders for random F, B; every dependency must hold (Timeline.check), the bubble must
    be (PP-1)(F+B) and stage s must hold at most PP-s micro-batches' activations."""
    q = "one_f_one_b"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    cases = _one_f_one_b_cases(rng)
    for P, N, F, B in cases:
        call = f"one_f_one_b({P}, {N})"
        orders = _orders(q, call_answer(q, fn, (P, N), _SHAPE_HINT), P, N)
        try:
            tl = pipeline.time_orders(orders, F, B).check()
        except ValueError as e:
            fail(q, [f"{call}: {e}"[:700]], _deadlock_hint(orders, P))
        except AssertionError as e:  # the timing pass broke a dependency: a library bug, reported as such
            fail(q, [f"{call}: the timeline is invalid: {e}"[:700]])
        want = (P - 1) * (F + B)
        first, full = _forwards_first(orders), [min(P - s, N) for s in range(P)]
        if tl.bubble != want:
            short = [s for s in range(P) if first[s] < full[s]]
            hint = (f"too few warm-up forwards: stage {short[0]} runs {first[short[0]]} forwards before its first "
                    f"backward; 1F1B runs PP-1-s = {P - 1 - short[0]} warm-ups, then the steady phase's first "
                    f"forward, so {full[short[0]]}: the pipeline is full when the first backward comes back"
                    if short else
                    "after w = PP-1-s warm-up forwards, run one forward and one backward in turn (F of micro-batch "
                    "w + i, then B of micro-batch i), then the w remaining backwards")
            fail(q, [f"{call} with F={F}, B={B}: the bubble is {tl.bubble}, expected (PP-1)(F+B) = {want} "
                     f"(makespan {tl.makespan}, each stage busy N(F+B) = {N * (F + B)})"], hint)
        peaks = list(tl.peak_activations)
        expect = [min(P - s, N) for s in range(P)]
        if any(p > e for p, e in zip(peaks, expect)):
            s = next(i for i in range(P) if peaks[i] > expect[i])
            if all(f == N for f in first):
                hint = (f"this is GPipe's order (all forwards, then all backwards): the same bubble, but every stage "
                        f"holds all N = {N} micro-batches' activations at once, so memory grows with N; 1F1B "
                        f"starts backwards after PP-1-s warm-ups, so stage s holds at most PP-s, whatever N")
            elif first[s] > full[s]:
                hint = (f"too many warm-up forwards: stage {s} runs {first[s]} forwards before its first backward, "
                        f"1F1B {full[s]} (PP-1-s = {P - 1 - s} warm-ups, then the steady phase's first forward); "
                        "they already fill the pipeline, each extra one only holds more activations")
            else:
                hint = ("after the warm-up, alternate strictly: one forward, then one backward, so the number of "
                        "micro-batches in flight stays at PP-s")
            fail(q, [f"{call}: stage {s} holds up to {peaks[s]} micro-batches' activations, expected at most "
                     f"PP-s = {expect[s]} (peaks per stage {peaks}, 1F1B's {expect})"], hint)
    return (f"{len(cases)} pipelines (PP 2..9, up to {max(n for _, n, _, _ in cases)} micro-batches, random F, B): "
            "every dependency holds, bubble (PP-1)(F+B), stage s holds PP-s micro-batches at most")


# ------------------------------------------------------------------------------------------ Q2: Table 2's bubbles


def _table2_variants(PP, F, B, W, FB):
    """(1F1B, DualPipe) wrong formulas and what each forgets, tried in order for a hint."""
    half = PP / 2 - 1
    one = [
        (PP * (F + B), "1F1B: (PP-1)(F+B), not PP(F+B): the last stage starts after PP-1 forwards and stage 0 "
                       "finishes PP-1 backwards after the last stage"),
        ((PP - 1) * (F + B - 2 * W), "(PP-1)(F+B-2W) is ZB1P's bubble; 1F1B runs each backward whole, so nothing "
                                     "fills its bubble: (PP-1)(F+B)"),
    ]
    dual = [
        ((PP - 1) * (FB + B - 3 * W), "DualPipe: (PP/2-1), not (PP-1): micro-batches enter from both ends, so "
                                      "each direction fills only half the pipeline before the two meet"),
        (PP / 2 * (FB + B - 3 * W), "DualPipe: (PP/2-1), not PP/2"),
        (half * (FB + B), "DualPipe: (PP/2-1)(F&B+B-3W): the -3W is missing (the weight gradients, split off "
                          "their backwards, fill part of the bubble)"),
        (half * (FB + B - 2 * W), "DualPipe: -3W, not -2W"),
        (half * (F + B + B - 3 * W), "DualPipe: F&B is FB (the overlapped forward + backward pair's time), not "
                                     "F + B: the overlap is what shortens it"),
        (half * (F + B - 3 * W), "DualPipe: (PP/2-1)(F&B+B-3W): F&B (the overlapped pair, FB) plus a whole B"),
    ]
    return one, dual


def _table2_cases(rng):
    cases = [(16, 1, 2, 1, 2.5), (8, 1, 2, 1, 3), (4, 3, 5, 2, 6)]
    for _ in range(8):
        PP = int(rng.integers(2, 33)) * 2
        F = float(rng.uniform(0.5, 4.0))
        W = F * float(rng.uniform(0.1, 1.0))
        B = F + W
        cases.append((PP, F, B, W, B + F * float(rng.uniform(0.0, 1.0))))
    return cases


@question
def table2_bubbles(fn, rng=None):
    """Check `fn(PP, F, B, W, FB) -> (bubble of 1F1B, bubble of DualPipe)` by DeepSeek-V3's Table 2 against
    pipeline.table2 (relative tolerance 1e-9), on the DeepSeek-V3-like case PP=16, F=1, B=2, W=1, F&B=2.5 and
    random ones."""
    q = "table2_bubbles"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    first = None
    for PP, F, B, W, FB in _table2_cases(rng):
        args = (PP, F, B, W, FB)
        got = call_answer(q, fn, args, "return a pair of numbers: (1F1B's bubble, DualPipe's bubble)")
        try:
            one, dual = (float(v) for v in got)
        except (TypeError, ValueError):
            fail(q, [f"table2_bubbles{args} returned {got!r}: expected a pair of numbers"],
                 "return a tuple (bubble_1f1b, bubble_dualpipe)")
        t2 = pipeline.table2(PP, F, B, W, FB)
        want1, want2 = t2["1f1b"]["bubble"], t2["dualpipe"]["bubble"]

        def same(a, b):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)  # times are about 1

        if same(one, want2) and same(dual, want1) and not same(want1, want2):
            fail(q, [f"table2_bubbles{args} returned ({one:g}, {dual:g}): expected ({want1:g}, {want2:g})"],
                 "the order is (1F1B, DualPipe)")
        wrong1, wrong2 = _table2_variants(PP, F, B, W, FB)
        for value, want, variants, name in ((one, want1, wrong1, "1F1B"), (dual, want2, wrong2, "DualPipe")):
            if not same(value, want):
                hint = next((h for v, h in variants if same(value, v)),
                            f"Table 2 gives {name} the bubble {pipeline.FORMULAS[name.lower()]}, where F&B is FB")
                fail(q, [f"table2_bubbles{args}: {name}'s bubble is {value:g}, expected {want:g}"], hint)
        if first is None:
            first = (want1, want2)
    return (f"PP=16, F=1, B=2, W=1, F&B=2.5: 1F1B {first[0]:g}, DualPipe {first[1]:g} ({first[1] / first[0]:.0%} "
            "of it), and 10 more cases, equal to Table 2")


# ------------------------------------------------------------------------------------- Q3: memory per device


def _peaks(tl, *, split_frees=False, fb_counts=True, per_direction=False):
    """Per device, the most activations held at once, counted from the events; the flags give known mistakes."""
    out = []
    for evs in tl.events:
        held, peak = {0: 0, 1: 0}, {0: 0, 1: 0}
        for e in evs:
            d = e.direction if per_direction else 0
            b = (e.b_direction if per_direction else 0) if e.kind == "FB" else d
            if e.kind == "F" or (e.kind == "FB" and fb_counts):
                held[d] += 1
                peak[d] = max(peak[d], held[d])
            if e.kind == "W" and not split_frees or e.kind == "FB" and fb_counts \
                    or e.kind == "B" and (split_frees or not e.split):
                held[b] -= 1
        out.append(max(peak.values()))
    return out


def _memory_cases(rng):
    tls = [pipeline.simulate("1f1b", 4, 8, 1, 2, 1), pipeline.simulate("zb1p", 6, 9, 1, 2, 1),
           pipeline.simulate("dualpipe", 8, 20, 1, 2, 1, 2.5), pipeline.simulate("dualpipe", 4, 8, 2, 3, 1, 4)]
    P = int(rng.integers(3, 7))
    N = P + int(rng.integers(0, 4))
    gpipe = [[("F", m) for m in range(N)] + [("B", m) for m in range(N)] for _ in range(P)]
    tls.append(pipeline.time_orders(gpipe, int(rng.integers(1, 4)), int(rng.integers(1, 6))))
    P = 2 * int(rng.integers(2, 6))
    tls.append(pipeline.simulate("dualpipe", P, 2 * P + 2 * int(rng.integers(0, 3)), 2, 3, 1, 4))
    tls.append(pipeline.simulate("zb1p", P, P + int(rng.integers(0, 5)), 2, 3, 1))
    return tls


@question
def memory_per_device(fn, rng=None):
    """Check `fn(timeline) -> [(stages held, peak activations) per device]` against the Timeline's own
    `parameters` and `peak_activations`, on 1F1B, ZB1P, DualPipe and GPipe-order timelines. The timelines passed
    to fn have those summary fields hidden (set to -1): the answer must come from `timeline.events`."""
    q = "memory_per_device"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    tls = _memory_cases(rng)
    for tl in tls:
        P = tl.stages
        hidden = dataclasses.replace(tl, peak_activations=(-1,) * P, activations=-1, parameters=-1)
        what = f"memory_per_device({tl.schedule}, {P} stages, {tl.microbatches} micro-batches)"
        got = call_answer(q, fn, (hidden,), "return one (stages held, peak activations) pair per device")
        try:
            pairs = [tuple(int(v) for v in pair) for pair in got]
            assert len(pairs) == P and all(len(p) == 2 for p in pairs)
        except (TypeError, ValueError, AssertionError):
            fail(q, [f"{what} returned {got!r}: expected {P} pairs (stages held, peak activations)"],
                 "return [(stages, peak) for each device], e.g. [(1, 4), (1, 3), (1, 2), (1, 1)] for 1F1B on 4")
        stages = [p[0] for p in pairs]
        peaks = [p[1] for p in pairs]
        if -1 in stages or -1 in peaks:
            fail(q, [f"{what}: got {pairs}"], "the timeline's summary fields are hidden here (-1): count from "
                 "timeline.events, one list of Events per device")
        want_stages = [tl.parameters] * P
        if stages != want_stages:
            fail(q, [f"{what}: stages held per device {stages}, expected {want_stages}"],
                 "device s runs pipeline stage s for micro-batches that enter at device 0 (direction 0) and stage "
                 "PP-1-s for those entering at the last device (direction 1); count the distinct stages over the "
                 "device's events (an FB's backward half has a direction of its own: e.b_direction). "
                 "Two stages are two sets of weights: DualPipe's 2x parameters" if tl.schedule == "dualpipe" else
                 "a single-direction schedule runs one stage per device: every event's direction is 0")
        want = list(tl.peak_activations)
        if peaks != want:
            s = next(i for i in range(P) if peaks[i] != want[i])
            variants = [
                (_peaks(tl, split_frees=True), "a split backward (e.split, its W listed later) computes only the "
                 "input gradient: the weight gradient W still reads the layer's input activations, so they are "
                 "freed at the end of the W, not of the B"),
                (_peaks(tl, fb_counts=False), "an FB event is a forward and a backward at once: count +1 for its "
                 "forward half before the -1 of its backward half (the new activations are allocated while the old "
                 "are still held): that +1 is DualPipe's PP+1"),
                (_peaks(tl, per_direction=True), "a DualPipe device holds chunks of both directions at once (its "
                 "stages s and PP-1-s): one count per device, not a maximum over directions"),
                ([sum(e.kind in ("F", "FB") for e in evs) for evs in tl.events], "activations are freed when the "
                 "micro-batch's backward on that device ends (its W when split): -1 there"),
            ]
            hint = next((h for v, h in variants if v == peaks), "walk the device's events in order: +1 when a "
                        "forward starts (an F, or an FB's forward half), -1 when a backward ends (a B that is not "
                        "split, a W, or an FB's backward half), and keep the maximum")
            fail(q, [f"{what}: device {s} peaks at {peaks[s]} micro-batches' activations, expected {want[s]} "
                     f"(all devices: {peaks}, expected {want})"], hint)
    return (f"{len(tls)} timelines (1F1B, ZB1P, DualPipe, GPipe order): stages and activation peaks per device "
            "from the events alone, equal to Timeline.parameters and Timeline.peak_activations")
