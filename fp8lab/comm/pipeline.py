"""Pipeline-parallel schedules, simulated: 1F1B, ZB1P (ZB-H1) and DualPipe, against DeepSeek-V3's Table 2.

simulate() lays a schedule out as a list of operations per device (the official DualPipe `step()`, the ZB-H1
pattern of Qi et al., Megatron's 1F1B), times it with an event-driven pass (each operation starts when its
device is free and its inputs are ready; communication takes no time) and returns a Timeline; time_orders() runs
the same pass on operation orders you write. table2() gives the formulas of the DeepSeek-V3 technical report
(arXiv 2412.19437, section 3.2.1, Table 2), compare() prints simulated against formula, plot_gantt() draws a
timeline in the style of the report's Figure 5.

Times: F = one forward chunk, B = one full backward chunk (input gradient + weight gradient), W = the weight-gradient
part of B (so a split backward runs B - W, then W later), FB = an overlapped forward + backward pair (Table 2's F&B).
Pure Python: times are exact rationals inside (fractions.Fraction), so the formulas come out exactly.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

from .. import _validate as V
from .pipeline_schedules import BUILD, SCHEDULES, Op
from .pipeline_timeline import KINDS, Event, Timeline  # KINDS: also public here

FORMULAS = {"1f1b": "(PP-1)(F+B)", "zb1p": "(PP-1)(F+B-2W)", "dualpipe": "(PP/2-1)(F&B+B-3W)"}
"""Table 2's bubble column, as the report writes it (F&B is FB here)."""

CONDITIONS = {
    "1f1b": "any F, B",
    "zb1p": "W <= F and 2W <= B",
    "dualpipe": "F = B - W, W <= F and B <= FB <= F + B",
}
"""When the simulated bubble equals Table 2's formula exactly (found by simulation over PP = 2..16 and a grid of
times; outside these, the ZB1P bubble is larger and the DualPipe one differs either way)."""


def min_microbatches(schedule: str, stages: int) -> int:
    """The fewest micro-batches for which `schedule` on `stages` devices matches Table 2.

    1f1b, zb1p: stages (fewer never fill the pipeline: the activation peak would be below PP, and the ZB1P bubble
    is larger). dualpipe: 2 * stages, split evenly between the two directions (the official DualPipe `step()`
    asserts num_chunks % 2 == 0 and num_chunks >= 2 * num_ranks).
    """
    schedule = V.choice("schedule", schedule, SCHEDULES)
    stages = _stages(stages, schedule)
    return 2 * stages if schedule == "dualpipe" else stages


# --------------------------------------------------------------------------------------------------- validation


def _stages(stages, schedule=None) -> int:
    if isinstance(stages, bool) or not isinstance(stages, numbers.Integral):
        raise TypeError(f"stages must be an int >= 2, got {V.describe(stages)}")
    if stages < 2:
        raise ValueError(f"stages must be an int >= 2, got {stages}")
    if schedule == "dualpipe" and stages % 2:
        raise ValueError(f"stages must be even for dualpipe (device i holds stages i and PP-1-i), got {stages}")
    return int(stages)


def _times(F, B, W, FB) -> tuple[Fraction, Fraction, Fraction, Fraction, bool]:
    """(F, B, W, FB) as exact Fractions (FB=None: F + B), and whether all were integers."""
    given = {"F": F, "B": B, "W": W, "FB": FB}
    for name, t in given.items():
        if t is None and name == "FB":
            continue
        if isinstance(t, bool) or not isinstance(t, numbers.Real):
            raise TypeError(f"{name} must be a real number (a time), got {V.describe(t)}")
        if not isinstance(t, numbers.Integral) and not math.isfinite(t):  # ints are exact at any size
            raise ValueError(f"{name} must be finite, got {t}")
    for name in ("F", "B") + (("FB",) if FB is not None else ()):
        if given[name] <= 0:
            raise ValueError(f"{name} must be > 0, got {given[name]}")
    if W < 0 or W > B:
        raise ValueError(f"W must lie in [0, B] = [0, {B}] (the weight-gradient part of the backward), got {W}")
    integral = all(isinstance(t, numbers.Integral) for t in given.values() if t is not None)
    f, b, w = Fraction(F), Fraction(B), Fraction(W)
    return f, b, w, (f + b if FB is None else Fraction(FB)), integral


# The simulator's work: one event per operation, stages * microbatches * 3 of them (F, B, W), each about 10 us of
# Python and 1 KB while the timeline is built and checked (docs/notes/pipeline.md). Past MAX_OPS a run is refused,
# past WARN_OPS it warns with its estimate: the bubble formulas hold for any count of micro-batches from the least
# one, so a smaller run shows the same thing.
OP_SECONDS, OP_BYTES = 10e-6, 1000
WARN_OPS, MAX_OPS = 300_000, 3_000_000


def check_size(stages: int, microbatches: int, schedules=1) -> float:
    """Estimated seconds to simulate (and check) `schedules` timelines of stages x microbatches; UserWarning above
    WARN_OPS operations, ValueError naming stages and microbatches above MAX_OPS."""
    import warnings

    ops = 3 * int(stages) * int(microbatches)
    seconds, gib = schedules * ops * OP_SECONDS, schedules * ops * OP_BYTES / 2**30
    what = (f"stages={stages} x microbatches={microbatches} is {ops:,} operations to simulate per schedule (about "
            f"{seconds:,.0f} s and {gib:.1f} GB in all)")
    if ops > MAX_OPS:
        raise ValueError(f"{what}: at most {MAX_OPS:,} (stages x microbatches <= {MAX_OPS // 3:,}); fewer "
                         "micro-batches show the same bubbles")
    if ops > WARN_OPS:
        warnings.warn(what, UserWarning, stacklevel=V.user_stacklevel())
    return seconds


def _fits_a_float(f, b, w, fb, P: int, N: int) -> None:
    """ValueError naming F, B, W, FB when the simulation's times could pass float's range (its results are floats
    unless every time is an int): a makespan is at most (2 N + 2 P) x (F + B + FB)."""
    import sys

    if (2 * N + 2 * P) * (f + b + w + fb) > Fraction(sys.float_info.max):
        over = f"{N} micro-batches and {P} stages" if N else f"{P} stages"
        raise ValueError(f"F, B, W, FB: times this large (F={float(f):g}, B={float(b):g}) overflow a float over "
                         f"{over}: use a smaller unit (the bubbles scale with the times)")


def _number(x: Fraction, integral: bool):
    return int(x) if integral else float(x)


# --------------------------------------------------------------------------------------------------- simulation


def simulate(schedule: str, stages: int, microbatches: int, F, B, W, FB=None) -> Timeline:
    """Lay out `schedule` on `stages` devices for `microbatches` micro-batches and time it.

    schedule: "1f1b", "zb1p" (ZB-H1) or "dualpipe". stages: PP, an int >= 2 (even for dualpipe). microbatches:
    at least min_microbatches(schedule, stages) (PP, or 2 PP and even for dualpipe, half entering at each end).
    F, B, W, FB: times (ints, floats or Fractions; F, B, FB > 0, 0 <= W <= B); FB=None means F + B (no overlap
    gain); FB is used by dualpipe only. Times in the result are ints when all given times are ints, else floats.

    Each device runs its operations in the schedule's order; an operation starts when the device is free and its
    inputs are ready (forward after the previous stage's forward, backward after the next stage's backward and its
    own forward, W after its backward), with no communication time. The bubble equals table2()'s formula exactly
    under CONDITIONS[schedule]. Returns a Timeline (call .check() to verify it).
    """
    schedule = V.choice("schedule", schedule, SCHEDULES)
    P = _stages(stages, schedule)
    if isinstance(microbatches, bool) or not isinstance(microbatches, numbers.Integral):
        raise TypeError(f"microbatches must be an int, got {V.describe(microbatches)}")
    N, least = int(microbatches), min_microbatches(schedule, P)
    if schedule == "dualpipe" and (N < least or N % 2):
        raise ValueError(f"microbatches must be even and >= 2 * stages = {least} for dualpipe (half enter at each "
                         f"end of the pipeline), got {N}")
    if N < least:
        raise ValueError(f"microbatches must be >= stages = {least} for {schedule} (fewer never fill the "
                         f"pipeline), got {N}")
    f, b, w, fb, integral = _times(F, B, W, FB)
    if not integral:
        _fits_a_float(f, b, w, fb, P, N)
    check_size(P, N)
    try:
        return _time(schedule, P, N, BUILD[schedule](P, N), f, b, w, fb, integral)
    except _Deadlock as e:  # a schedule bug, not bad input
        raise RuntimeError(f"{schedule} schedule deadlocks: next operations {[op for _, op, _ in e.waiting][:4]}") \
            from None


class _Deadlock(Exception):
    """Every device that has operations left waits for an input no device will produce."""

    def __init__(self, waiting):
        super().__init__(waiting)
        self.waiting = waiting  # [(device, next Op, [missing inputs (kind, direction, microbatch, stage)])]


def _time(schedule, P, N, ops, f, b, w, fb, integral) -> Timeline:
    """The event-driven pass: ops (per device, in order) -> a Timeline; raises _Deadlock."""

    def pstage(r, d):
        return r if d == 0 else P - 1 - r

    def inputs(r, kind, m, d):
        k = pstage(r, d)
        if kind == "F":
            return [("F", d, m, k - 1)] if k > 0 else []
        if kind == "B":
            return [("F", d, m, k)] + ([("B", d, m, k + 1)] if k < P - 1 else [])
        return [("B", d, m, k)]

    dur = {"F": f, "W": w, "FB": fb}
    done: dict[tuple, Fraction] = {}
    free, nxt = [Fraction(0)] * P, [0] * P
    timed: list[list[tuple[Op, Fraction, Fraction]]] = [[] for _ in range(P)]
    left = sum(map(len, ops))
    while left:
        moved = False
        for r in range(P):  # run every device as far as its inputs allow
            while nxt[r] < len(ops[r]):
                op = ops[r][nxt[r]]
                halves = [("F", op.mb, op.direction), ("B", op.b_mb, op.b_direction)] if op.kind == "FB" \
                    else [(op.kind, op.mb, op.direction)]
                need = [x for kind, m, d in halves for x in inputs(r, kind, m, d)]
                if any(x not in done for x in need):
                    break
                start = max([free[r]] + [done[x] for x in need])
                end = start + (dur[op.kind] if op.kind != "B" else (b - w if op.split else b))
                for kind, m, d in halves:
                    done[(kind, d, m, pstage(r, d))] = end  # a split B's gradient leaves before its W
                free[r] = end
                timed[r].append((op, start, end))
                nxt[r] += 1
                left -= 1
                moved = True
        if not moved:
            waiting = []
            for r in range(P):
                if nxt[r] < len(ops[r]):
                    op = ops[r][nxt[r]]
                    halves = [("F", op.mb, op.direction), ("B", op.b_mb, op.b_direction)] if op.kind == "FB" \
                        else [(op.kind, op.mb, op.direction)]
                    waiting.append((r, op, [x for kind, m, d in halves for x in inputs(r, kind, m, d)
                                            if x not in done]))
            raise _Deadlock(waiting)

    makespan = max(free)
    busy = [sum(e - s for _, s, e in t) for t in timed]
    peaks = []
    for r in range(P):  # in operation order (the same as time order on a device)
        held = peak = 0
        for op in ops[r]:
            held += op.kind in ("F", "FB")
            peak = max(peak, held)
            held -= op.kind in ("FB", "W") or (op.kind == "B" and not op.split)
        peaks.append(peak)

    def num(x):
        return _number(x, integral)

    events = tuple(tuple(Event(r, op.kind, op.mb, op.direction, num(s), num(e), op.b_mb, op.b_direction,
                               op.split) for op, s, e in timed[r]) for r in range(P))
    bubbles = [makespan - x for x in busy]
    return Timeline(schedule, P, N, num(f), num(b), num(w), num(fb), events, num(makespan),
                    tuple(map(num, busy)), tuple(map(num, bubbles)), num(max(bubbles)), tuple(peaks), max(peaks),
                    2 if schedule == "dualpipe" else 1)


def time_orders(orders, F, B, W=0) -> Timeline:
    """Time your own single-direction schedule with simulate()'s event-driven pass.

    orders: one list per stage (device), PP >= 2 of them, each that stage's operations in execution order as
    (kind, microbatch) pairs: ("F", m) forward, ("B", m) backward, ("W", m) the weight gradient of m, run apart
    (its ("B", m) then takes B - W: the input gradient only). Micro-batches are 0..N-1, N = the largest + 1; every
    stage runs ("F", m) and ("B", m) of each exactly once, ("W", m) at most once. F, B, W: times as in simulate()
    (W matters only where W's are listed). Returns a Timeline whose schedule is "custom" (call .check() on it).
    Raises ValueError when the orders deadlock (every device waits for an input no device will produce: e.g. a
    backward listed before its own forward, or before the forward that the next stage waits for).
    """
    if not isinstance(orders, (list, tuple)) or not all(isinstance(o, (list, tuple)) for o in orders):
        raise TypeError(f"orders must be a list of per-stage lists of (kind, microbatch) pairs, got "
                        f"{V.describe(orders)}")
    if len(orders) < 2:
        raise ValueError(f"orders must have a list for each of at least 2 stages, got {len(orders)}")
    P, pairs = len(orders), []
    for s, order in enumerate(orders):
        row = []
        for i, item in enumerate(order):
            ok = isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in ("F", "B", "W") \
                and isinstance(item[1], numbers.Integral) and not isinstance(item[1], bool) and item[1] >= 0
            if not ok:
                raise ValueError(f"orders[{s}][{i}] must be a pair (kind, microbatch) with kind 'F', 'B' or 'W' "
                                 f"and microbatch an int >= 0, got {V.describe(item)}")
            row.append((item[0], int(item[1])))
        pairs.append(row)
    N = 1 + max((m for row in pairs for _, m in row), default=-1)
    if N == 0:
        raise ValueError("orders must list some operations, got only empty stages")
    for s, row in enumerate(pairs):
        for kind in ("F", "B", "W"):
            seen = [m for k, m in row if k == kind]
            extra = sorted({m for m in seen if seen.count(m) > 1})
            lack = sorted(set(range(N)) - set(seen)) if kind != "W" else []
            if extra or lack:
                raise ValueError(f"orders[{s}] must run ('{kind}', m) {'at most' if kind == 'W' else 'exactly'} "
                                 f"once for each micro-batch m in 0..{N - 1}, got "
                                 + (f"('{kind}', {extra[0]}) {seen.count(extra[0])} times" if extra
                                    else f"no ('{kind}', {lack[0]})"))
    f, b, w, fb, integral = _times(F, B, W, None)
    ops = [[Op(k, m, 0, split=(k == "B" and ("W", m) in row)) for k, m in row] for row in pairs]
    try:
        return _time("custom", P, N, ops, f, b, w, fb, integral)
    except _Deadlock as e:
        what = {"F": "forward", "B": "backward"}
        waits = "; ".join(f"stage {r} waits at ('{op.kind}', {op.mb}) for "
                          + " and ".join(f"the {what.get(k, 'backward')} of micro-batch {m} on stage {k2}"
                                         for k, _, m, k2 in missing)
                          for r, op, missing in e.waiting[:4])
        raise ValueError(f"orders deadlock: {waits}") from None


# ------------------------------------------------------------------------------------------ Table 2 and compare


def table2(stages: int, F, B, W, FB=None) -> dict:
    """DeepSeek-V3's Table 2 evaluated: {schedule: {"bubble", "parameters", "activations", "formula"}}.

    stages: PP (an int >= 2); F, B, W, FB as in simulate() (FB=None: F + B). bubble: 1f1b (PP-1)(F+B), zb1p
    (PP-1)(F+B-2W), dualpipe (PP/2-1)(FB+B-3W), computed exactly and returned as in simulate(); parameters: copies
    per device (1, 1, 2); activations: PP, PP, PP+1 (simulate()'s units). The dualpipe row is present only for
    even stages.
    """
    P = _stages(stages)
    f, b, w, fb, integral = _times(F, B, W, FB)
    if not integral:
        _fits_a_float(f, b, w, fb, P, 0)
    rows = {"1f1b": ((P - 1) * (f + b), 1, P), "zb1p": ((P - 1) * (f + b - 2 * w), 1, P)}
    if P % 2 == 0:
        rows["dualpipe"] = ((Fraction(P, 2) - 1) * (fb + b - 3 * w), 2, P + 1)
    return {k: {"bubble": _number(v[0], integral), "parameters": v[1], "activations": v[2], "formula": FORMULAS[k]}
            for k, v in rows.items()}


def formula_holds(schedule: str, F, B, W, FB=None) -> bool:
    """Whether CONDITIONS[schedule] hold for these times (to within float rounding), i.e. whether simulate()'s
    bubble must equal table2()'s exactly."""
    schedule = V.choice("schedule", schedule, SCHEDULES)
    f, b, w, fb, _ = _times(F, B, W, FB)
    tol = Fraction(max(f, b, fb)) * Fraction(1, 10**12)
    if schedule == "1f1b":
        return True
    if schedule == "zb1p":
        return w <= f + tol and 2 * w <= b + tol
    return abs(f - (b - w)) <= tol and w <= f + tol and b <= fb + tol and fb <= f + b + tol


def _fmt(x) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.6g}"


def compare(stages: int = 8, microbatches: int = 20, F=1, B=2, W=1, FB=None, schedules=SCHEDULES,
            show: bool = True) -> list[dict]:
    """Simulate each schedule and set it beside Table 2: bubble, parameter copies, activations (peak micro-batches).

    Every timeline is verified (Timeline.check) first. Returns one dict per schedule (keys: schedule, timeline,
    simulated, table2, exact: the conditions hold, match); show=True also prints the table.
    """
    import warnings

    if isinstance(schedules, str):
        schedules = (schedules,)
    if isinstance(stages, numbers.Integral) and isinstance(microbatches, numbers.Integral):
        check_size(stages, microbatches, len(schedules))  # one warning (or refusal) for all of them
    rows = []
    for s in schedules:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "stages=", UserWarning)  # said once above
            tl = simulate(s, stages, microbatches, F, B, W, FB).check()
        t2 = table2(stages, F, B, W, FB)[s]
        sim = {"bubble": tl.bubble, "parameters": tl.parameters, "activations": tl.activations}
        match = (sim["parameters"] == t2["parameters"] and sim["activations"] == t2["activations"]
                 and math.isclose(sim["bubble"], t2["bubble"], rel_tol=1e-9, abs_tol=1e-9 * tl.makespan))
        rows.append({"schedule": s, "timeline": tl, "simulated": sim, "table2": t2,
                     "exact": formula_holds(s, F, B, W, FB), "match": match})
    if show and rows:
        t = rows[0]["timeline"]
        print(f"Pipeline bubbles: {t.stages} stages, {t.microbatches} micro-batches, F={_fmt(t.F)} B={_fmt(t.B)} "
              f"W={_fmt(t.W)} F&B={_fmt(t.FB)} (DeepSeek-V3 Table 2, arXiv 2412.19437)")
        head = ["schedule", "bubble formula", "Table 2", "simulated", "makespan", "params", "activations",
                "conditions", "match"]
        body = [[r["schedule"], r["table2"]["formula"], _fmt(r["table2"]["bubble"]), _fmt(r["simulated"]["bubble"]),
                 _fmt(r["timeline"].makespan), f"{r['simulated']['parameters']}x / {r['table2']['parameters']}x",
                 f"{r['simulated']['activations']} / {r['table2']['activations']}",
                 "met" if r["exact"] else "not met", "yes" if r["match"] else "NO"] for r in rows]
        widths = [max(len(c) for c in col) for col in zip(head, *body)]
        for line in [head, ["-" * n for n in widths], *body]:
            print("  ".join(c.ljust(n) for c, n in zip(line, widths)).rstrip())
        print("params, activations: simulated / Table 2. The bubble matches exactly when " +
              "; ".join(f"{s}: {CONDITIONS[s]}" for s in schedules) + ".")
    return rows


# -------------------------------------------------------------------------------------------------------- plot

_COLORS = {"F": "#f5a962", "B": "#8fcf8a", "W": "#7fb0e0"}  # the report's Figure 5: orange, green, blue


def _shade(color: str, direction: int) -> str:
    """Direction 1 in a lighter shade of the same color."""
    if not direction:
        return color
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c + (255 - c) * 0.55):02x}" for c in rgb)


def plot_gantt(timeline, ax=None, path=None, title=None):
    """Draw a Timeline like Figure 5 of the DeepSeek-V3 report; returns the figure.

    Rows are devices (device 0 on top); boxes are F (orange), B (green; hatched when only the input gradient, its W
    later) and W (blue), labelled with the micro-batch; DualPipe's second direction is a lighter shade; an
    overlapped FB pair is its two halves inside one black border. timeline: a Timeline, or a list of them (one
    panel each, ax must then be None). path: also save the figure there (PNG).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    if isinstance(timeline, (list, tuple)):
        if ax is not None:
            raise ValueError("ax must be None when timeline is a list (one panel per timeline)")
        timelines = list(timeline)
        if not timelines or not all(isinstance(t, Timeline) for t in timelines):
            raise TypeError(f"timeline must be a Timeline or a non-empty list of them, got {V.describe(timeline)}")
        fig, axes = plt.subplots(len(timelines), 1, squeeze=False,
                                 figsize=(12, sum(1 + 0.32 * t.stages for t in timelines)))
        for t, a in zip(timelines, axes[:, 0]):
            plot_gantt(t, ax=a)
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=120)
        return fig
    if not isinstance(timeline, Timeline):
        raise TypeError(f"timeline must be a Timeline or a list of them, got {V.describe(timeline)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 1 + 0.32 * timeline.stages))
    else:
        fig = ax.figure
    span = float(timeline.makespan)
    small = 7 if span / max(float(timeline.F), 1e-300) < 120 else 5
    tl = timeline
    for s, evs in enumerate(tl.events):
        y = tl.stages - 1 - s
        for e in evs:
            x0, x1 = float(e.start), float(e.end)
            if e.kind == "FB":  # the forward half, then the backward half, in proportion F : B
                cut = x0 + (x1 - x0) * float(tl.F) / float(tl.F + tl.B)
                parts = [("F", x0, cut, e.microbatch, e.direction), ("B", cut, x1, e.b_microbatch, e.b_direction)]
            else:
                parts = [(e.kind, x0, x1, e.microbatch, e.direction)]
            for kind, a, b, m, d in parts:
                ax.add_patch(Rectangle((a, y + 0.06), b - a, 0.88, facecolor=_shade(_COLORS[kind], d),
                                       edgecolor="white", lw=0.5, hatch="//" if e.split else None))
                ax.text((a + b) / 2, y + 0.5, str(m), ha="center", va="center", fontsize=small,
                        color="black" if d == 0 else "#404040")
            if e.kind == "FB":
                ax.add_patch(Rectangle((x0, y + 0.06), x1 - x0, 0.88, fill=False, edgecolor="black", lw=1.2))
    ax.set_xlim(0, span)
    ax.set_ylim(0, tl.stages)
    ax.set_yticks([tl.stages - 0.5 - s for s in range(tl.stages)], [f"device {s}" for s in range(tl.stages)],
                  fontsize=8)
    ax.set_xlabel("time")
    handles = [Patch(facecolor=_COLORS["F"], label="forward"), Patch(facecolor=_COLORS["B"], label="backward"),
               Patch(facecolor=_COLORS["B"], hatch="//", label="backward for input"),
               Patch(facecolor=_COLORS["W"], label="backward for weights")]
    if tl.schedule == "dualpipe":
        handles += [Patch(facecolor="white", edgecolor="black", label="overlapped forward & backward"),
                    Patch(facecolor=_shade(_COLORS["F"], 1), label="second direction (lighter)")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or f"{tl.schedule}: {tl.stages} devices, {tl.microbatches} micro-batches, makespan "
                          f"{_fmt(tl.makespan)}, bubble {_fmt(tl.bubble)}", fontsize=9)
    if path is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return fig


__all__ = ["SCHEDULES", "FORMULAS", "CONDITIONS", "Event", "Timeline", "simulate", "time_orders", "table2",
           "formula_holds", "min_microbatches", "compare", "plot_gantt"]
