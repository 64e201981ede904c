"""fp8lab.comm.pipeline: 1F1B, ZB1P and DualPipe simulated, against DeepSeek-V3's Table 2 (arXiv 2412.19437): the bubble
formulas exactly, parameter copies, activation peaks; every timeline verified by Timeline.check; bad input."""

from __future__ import annotations

import dataclasses
import math

import pytest

import fp8lab as fl
from fp8lab import cli
from fp8lab.comm import pipeline, pipeline_schedules

PPS = (2, 4, 6, 8, 16)
INT_TIMES = [(1, 2, 1, None), (3, 5, 2, 6), (4, 4, 0, 5), (5, 7, 2, 7)]  # all meet every schedule's CONDITIONS


def _microbatches(schedule, P):
    least = pipeline.min_microbatches(schedule, P)
    return sorted({least, least + 2, least + P + (P % 2)} if P < 16 else {least, least + 6})


def _random_times(rng):
    """Random floats that meet every schedule's conditions: F = B - W, W <= F, B <= FB <= F + B."""
    F = float(rng.uniform(0.3, 4.0))
    W = F * float(rng.uniform(0.05, 1.0))
    B = F + W
    return F, B, W, B + F * float(rng.uniform(0.0, 1.0))


def _assert_matches_table2(tl, F, B, W, FB, exact):
    t2 = pipeline.table2(tl.stages, F, B, W, FB)[tl.schedule]
    fb = F + B if FB is None else FB
    by_hand = {"1f1b": (tl.stages - 1) * (F + B), "zb1p": (tl.stages - 1) * (F + B - 2 * W),
               "dualpipe": (tl.stages / 2 - 1) * (fb + B - 3 * W)}[tl.schedule]
    if exact:
        assert tl.bubble == t2["bubble"] == by_hand and type(tl.bubble) is int
    else:
        assert math.isclose(tl.bubble, t2["bubble"], rel_tol=1e-9, abs_tol=1e-9 * tl.makespan)
        assert math.isclose(tl.bubble, by_hand, rel_tol=1e-9, abs_tol=1e-9 * tl.makespan)
    assert tl.parameters == t2["parameters"] == (2 if tl.schedule == "dualpipe" else 1)
    assert tl.activations == t2["activations"] == tl.stages + (tl.schedule == "dualpipe")
    # makespan = one device's work + bubble; the work is fixed by the counts
    if tl.schedule != "dualpipe" or FB is None:
        assert len(set(tl.stage_bubbles)) == 1, tl.stage_bubbles  # the same bubble on every stage
        assert math.isclose(tl.makespan, tl.microbatches * (F + B) + tl.bubble, rel_tol=1e-9)


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
@pytest.mark.parametrize("P", PPS)
def test_table2_exactly_with_integer_times(schedule, P):
    for N in _microbatches(schedule, P):
        for F, B, W, FB in INT_TIMES:
            tl = pipeline.simulate(schedule, P, N, F, B, W, FB).check()
            _assert_matches_table2(tl, F, B, W, FB, exact=True)


@pytest.mark.parametrize("schedule", pipeline.SCHEDULES)
@pytest.mark.parametrize("P", PPS)
def test_table2_with_random_float_times(schedule, P, rng):
    for N in _microbatches(schedule, P):
        F, B, W, FB = _random_times(rng)
        if schedule != "dualpipe" and rng.random() < 0.5:  # 1f1b, zb1p need less: W <= F, 2W <= B
            F, B = float(rng.uniform(0.3, 4.0)), float(rng.uniform(0.3, 4.0))
            W = min(F, B / 2) * float(rng.uniform(0.0, 1.0))
        assert pipeline.formula_holds(schedule, F, B, W, FB)
        tl = pipeline.simulate(schedule, P, N, F, B, W, FB).check()
        assert isinstance(tl.bubble, float) and tl.bubble > 0 or P == 2 and schedule == "dualpipe"
        _assert_matches_table2(tl, F, B, W, FB, exact=False)


def test_dyadic_float_times_are_exact():
    """Times are exact rationals inside: floats that add without rounding give the formula to the last bit."""
    F, W, FB = 1.375, 0.625, 2.5  # B = F + W = 2.0 exactly
    for s in pipeline.SCHEDULES:
        tl = pipeline.simulate(s, 8, 20, F, F + W, W, FB).check()
        assert tl.bubble == pipeline.table2(8, F, F + W, W, FB)[s]["bubble"]


def test_dualpipe_overlap_gain_shows_on_the_middle_devices(rng):
    """With FB < F + B, devices near the ends run a few more un-overlapped pairs, so they are busier and idle less;
    Table 2's bubble is the idle time of the middle devices (the Timeline's bubble: the largest)."""
    P, N, F, W = 8, 20, 3, 1
    B = F + W
    for FB in (B, B + 1, F + B - 1):
        tl = pipeline.simulate("dualpipe", P, N, F, B, W, FB).check()
        assert tl.bubble == (P // 2 - 1) * (FB + B - 3 * W)
        assert tl.stage_bubbles[P // 2 - 1] == tl.stage_bubbles[P // 2] == tl.bubble
        assert tl.stage_bubbles[0] == tl.stage_bubbles[-1] < tl.bubble
        n_fb = [sum(e.kind == "FB" for e in evs) for evs in tl.events]
        # busy = N (F + B) minus what each overlapped pair saves
        assert list(tl.busy) == [N * (F + B) - n * (F + B - FB) for n in n_fb]
    F, B, W, FB = _random_times(rng)
    tl = pipeline.simulate("dualpipe", P, N, F, B, W, F + B).check()
    assert max(tl.stage_bubbles) - min(tl.stage_bubbles) <= 1e-9 * tl.makespan  # no overlap gain: all equal


def test_figure5_example_follows_the_official_step():
    """The report's Figure 5: 8 ranks, 20 micro-batches, 10 entering at each end. Per device, the official step()'s
    phase counts: (4-h-1)*2 forwards first, overlapped pairs 2*(10-8+h+1)+(4-h-1) (one fewer on the middle ranks,
    whose first pair is not overlapped), h+1 W's at the very end."""
    tl = pipeline.simulate("dualpipe", 8, 20, 1, 2, 1).check()
    assert tl.bubble == 6 and tl.activations == 9 and tl.parameters == 2
    for r, evs in enumerate(tl.events):
        h = min(r, 7 - r)
        kinds = [e.kind for e in evs]
        first = (4 - h - 1) * 2
        assert kinds[:first] == ["F"] * first and all(e.direction == int(r >= 4) for e in evs[:first])
        assert kinds.count("FB") == 2 * (10 - 8 + h + 1) + (4 - h - 1) - (h == 3)
        assert kinds[-(h + 1):] == ["W"] * (h + 1)
        for d in (0, 1):
            assert sorted(e.microbatch for e in evs if e.kind in ("F", "FB") and e.direction == d) == list(range(10))
    # device 0 starts direction 0 (stage 0) and ends direction 1 (stage 7): its first forward is micro-batch 0, down
    assert (tl.events[0][0].direction, tl.events[0][0].microbatch, tl.events[0][0].start) == (0, 0, 0)


def test_activation_peaks_per_device():
    P = 6
    assert pipeline.simulate("1f1b", P, 12, 1, 2, 1).peak_activations == tuple(range(P, 0, -1))
    assert pipeline.simulate("zb1p", P, 12, 1, 2, 1).peak_activations == (P,) * P  # W lags: held until W
    assert pipeline.simulate("dualpipe", P, 12, 1, 2, 1).peak_activations == (P + 1,) * P


def test_minimum_microbatches():
    for P in (2, 4, 8):
        assert pipeline.min_microbatches("1f1b", P) == pipeline.min_microbatches("zb1p", P) == P
        assert pipeline.min_microbatches("dualpipe", P) == 2 * P
    with pytest.raises(ValueError, match=r"^microbatches must be >= stages = 8 for zb1p .*, got 7$"):
        pipeline.simulate("zb1p", 8, 7, 1, 2, 1)
    with pytest.raises(ValueError, match=r"^microbatches must be >= stages = 4 for 1f1b .*, got 3$"):
        pipeline.simulate("1f1b", 4, 3, 1, 2, 1)
    with pytest.raises(ValueError, match=r"^microbatches must be even and >= 2 \* stages = 16 .*, got 14$"):
        pipeline.simulate("dualpipe", 8, 14, 1, 2, 1)
    with pytest.raises(ValueError, match=r"^microbatches must be even .*, got 17$"):
        pipeline.simulate("dualpipe", 8, 17, 1, 2, 1)


def test_outside_the_conditions_the_formula_is_not_exact():
    """The conditions are real: break one and the simulated bubble leaves the formula (the timeline stays valid)."""
    cases = [("zb1p", 4, 8, (1, 4, 2, None), 6),        # W > F: the cool-down gaps are too short for the W's
             ("zb1p", 4, 8, (2, 3, 2, None), None),      # 2W > B
             ("dualpipe", 4, 8, (2, 2, 1, 4), 4),        # F != B - W
             ("dualpipe", 8, 20, (1, 2, 1, 1), None)]    # FB < B
    for s, P, N, (F, B, W, FB), want in cases:
        assert not pipeline.formula_holds(s, F, B, W, FB)
        tl = pipeline.simulate(s, P, N, F, B, W, FB).check()
        assert tl.bubble != pipeline.table2(P, F, B, W, FB)[s]["bubble"]
        assert want is None or tl.bubble == want
    assert pipeline.formula_holds("1f1b", 1, 9, 9)


def _tampered(tl, stage, index, **change):
    evs = list(tl.events[stage])
    evs[index] = dataclasses.replace(evs[index], **change)
    events = tl.events[:stage] + (tuple(evs),) + tl.events[stage + 1:]
    return dataclasses.replace(tl, events=events)


def test_check_catches_broken_timelines():
    tl = pipeline.simulate("dualpipe", 4, 8, 2, 3, 1).check()
    e = tl.events[1][3]
    cases = [
        (_tampered(tl, 1, 3, start=e.start - 1, end=e.end - 1), "starts before"),
        (_tampered(tl, 1, 3, microbatch=(e.microbatch + 1) % 4), "forward and"),
        (dataclasses.replace(tl, events=tl.events[:2] + (tl.events[2][:-1],) + tl.events[3:]), "W events"),
        (_tampered(tl, 0, 0, end=tl.events[0][0].end + 0.5), "lasts"),
        (dataclasses.replace(tl, peak_activations=(4, 5, 5, 5)), "peak activations"),
        (dataclasses.replace(tl, bubble=tl.bubble + 1), "largest stage bubble"),
        (dataclasses.replace(tl, parameters=1), "parameters"),
    ]
    for bad, words in cases:
        with pytest.raises(AssertionError, match=words):
            bad.check()
    # a dependency broken without any overlap: device 3 (stage 3, last) starts micro-batch 0's forward too early
    z = pipeline.simulate("1f1b", 4, 4, 1, 2, 1).check()
    f0 = z.events[3][0]
    with pytest.raises(AssertionError, match="forward starts before stage 2's forward ends"):
        _tampered(z, 3, 0, start=f0.start - 1, end=f0.end - 1).check()


BAD = [
    (("gpipe", 4, 8, 1, 2, 1), ValueError, r"^schedule must be one of \('1f1b', 'zb1p', 'dualpipe'\), got 'gpipe'"),
    ((3, 4, 8, 1, 2, 1), TypeError, r"^schedule must be one of .* got int 3"),
    (("1f1b", 1, 8, 1, 2, 1), ValueError, r"^stages must be an int >= 2, got 1$"),
    (("1f1b", 4.0, 8, 1, 2, 1), TypeError, r"^stages must be an int >= 2, got float 4.0"),
    (("1f1b", True, 8, 1, 2, 1), TypeError, r"^stages must be an int >= 2, got bool True"),
    (("dualpipe", 5, 10, 1, 2, 1), ValueError, r"^stages must be even for dualpipe .*, got 5$"),
    (("1f1b", 4, 8.0, 1, 2, 1), TypeError, r"^microbatches must be an int, got float 8.0"),
    (("1f1b", 4, True, 1, 2, 1), TypeError, r"^microbatches must be an int, got bool True"),
    (("1f1b", 4, 8, -1, 2, 1), ValueError, r"^F must be > 0, got -1$"),
    (("1f1b", 4, 8, 0, 2, 0), ValueError, r"^F must be > 0, got 0$"),
    (("zb1p", 4, 8, float("nan"), 2, 1), ValueError, r"^F must be finite, got nan$"),
    (("zb1p", 4, 8, 1, float("inf"), 1), ValueError, r"^B must be finite, got inf$"),
    (("zb1p", 4, 8, 1, -2, 1), ValueError, r"^B must be > 0, got -2$"),
    (("zb1p", 4, 8, 1, 2, -0.5), ValueError, r"^W must lie in \[0, B\] = \[0, 2\] .*, got -0.5$"),
    (("zb1p", 4, 8, 1, 2, 3), ValueError, r"^W must lie in \[0, B\] = \[0, 2\] .*, got 3$"),
    (("dualpipe", 4, 8, 1, 2, 1, -3), ValueError, r"^FB must be > 0, got -3$"),
    (("dualpipe", 4, 8, 1, 2, 1, float("-inf")), ValueError, r"^FB must be finite, got -inf$"),
    (("dualpipe", 4, 8, 1, 2, 1, "3"), TypeError, r"^FB must be a real number \(a time\), got str '3'"),
    (("1f1b", 4, 8, True, 2, 1), TypeError, r"^F must be a real number \(a time\), got bool True"),
    (("1f1b", 4, 8, 1, None, 1), TypeError, r"^B must be a real number \(a time\), got NoneType None"),
]


@pytest.mark.parametrize("args, exc, words", BAD)
def test_bad_input(args, exc, words):
    with pytest.raises(exc, match=words):
        pipeline.simulate(*args)


def test_bad_input_elsewhere():
    with pytest.raises(ValueError, match=r"^stages must be an int >= 2, got 0$"):
        pipeline.table2(0, 1, 2, 1)
    with pytest.raises(ValueError, match=r"^W must lie in"):
        pipeline.table2(4, 1, 2, 5)
    assert set(pipeline.table2(5, 1, 2, 1)) == {"1f1b", "zb1p"}  # DualPipe needs an even PP
    with pytest.raises(ValueError, match=r"^schedule must be one of"):
        pipeline.min_microbatches("1F1B", 4)
    with pytest.raises(TypeError, match=r"^timeline must be a Timeline"):
        pipeline.plot_gantt({"events": []})


def test_gantt_writes_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tls = [pipeline.simulate(s, 4, 8, 1, 2, 1, 2) for s in pipeline.SCHEDULES]
    one, many = tmp_path / "dualpipe.png", tmp_path / "all.png"
    fig = pipeline.plot_gantt(tls[2], path=one)
    assert len(fig.axes[0].patches) > sum(map(len, tls[2].events))  # FB pairs: two halves and a border
    fig2 = pipeline.plot_gantt(tls, path=many)
    assert len(fig2.axes) == 3
    for p in (one, many):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    with pytest.raises(ValueError, match="ax must be None"):
        pipeline.plot_gantt(tls, ax=fig.axes[0])
    plt.close("all")


def test_reachable_from_the_package():
    assert "pipeline" in fl.__all__ and "pipeline" in dir(fl)
    tl = fl.pipeline.simulate("zb1p", 4, 4, 1, 2, 1)
    assert tl.bubble == 3 and fl.pipeline is pipeline


def test_compare_and_cli(tmp_path, capsys):
    rows = pipeline.compare(8, 20, 1, 2, 1, show=True)
    out = capsys.readouterr().out
    assert [r["schedule"] for r in rows] == list(pipeline.SCHEDULES) and all(r["match"] and r["exact"] for r in rows)
    assert "(PP/2-1)(F&B+B-3W)" in out and "9 / 9" in out and "NO" not in out
    png = tmp_path / "g.png"
    assert cli.main(["pipeline", "--stages", "4", "--microbatches", "8", "--FB", "2.5",
                     "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "4 stages, 8 micro-batches" in out and "F&B=2.5" in out and f"wrote {png}" in out
    assert out.count(" yes") == 3 and png.stat().st_size > 10_000
    assert cli.main(["pipeline", "--schedule", "zb1p", "--F", "1", "--B", "4", "--W", "2"]) == 0
    out = capsys.readouterr().out
    assert "zb1p" in out and "dualpipe" not in out and "not met" in out and "NO" in out
    assert cli.main(["pipeline", "--schedule", "dualpipe", "--stages", "5"]) == 2
    assert "fp8lab pipeline: error: stages must be even for dualpipe" in capsys.readouterr().err


# ------------------------------------------------------------------------- time_orders: your own orders, timed


def _orders_of(tl):
    return [[(e.kind, e.microbatch) for e in evs] for evs in tl.events]


@pytest.mark.parametrize("schedule", ("1f1b", "zb1p"))
def test_time_orders_reproduces_simulate(schedule, rng):
    """simulate's own operation orders, given back as (kind, microbatch) pairs, time to the same events."""
    for P in (2, 4, 7):
        N = P + int(rng.integers(0, 6))
        F, B, W, _ = _random_times(rng)
        ref = pipeline.simulate(schedule, P, N, F, B, W).check()
        tl = pipeline.time_orders(_orders_of(ref), F, B, W).check()
        assert tl.schedule == "custom" and tl.parameters == 1 and (tl.stages, tl.microbatches) == (P, N)
        assert tl.events == ref.events and tl.bubble == ref.bubble and tl.peak_activations == ref.peak_activations
    ints = pipeline.time_orders(_orders_of(pipeline.simulate(schedule, 5, 8, 3, 5, 2)), 3, 5, 2)
    assert type(ints.bubble) is int and ints.bubble == pipeline.table2(5, 3, 5, 2)[schedule]["bubble"]


def test_time_orders_gpipe_and_deadlocks():
    P, N, F, B = 4, 9, 2, 3
    gpipe = [[("F", m) for m in range(N)] + [("B", m) for m in range(N)] for _ in range(P)]
    tl = pipeline.time_orders(gpipe, F, B).check()
    assert tl.bubble == (P - 1) * (F + B) and tl.peak_activations == (N,) * P  # 1F1B's bubble, N in memory
    # the warm-up counts of 1F1B reversed (s forwards first on stage s): stage 0 waits for a backward that needs
    # its own next forward
    rev = []
    for s in range(P):
        order = [("F", m) for m in range(s)]
        for i in range(N - s):
            order += [("F", s + i), ("B", i)]
        rev.append(order + [("B", m) for m in range(N - s, N)])
    with pytest.raises(ValueError, match=r"^orders deadlock: stage 0 waits at \('B', 0\) for the backward of "
                                         r"micro-batch 0 on stage 1; stage 1 waits at \('F', 1\)"):
        pipeline.time_orders(rev, F, B)
    own = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]
    with pytest.raises(ValueError, match=r"stage 1 waits at \('B', 0\) for the forward of micro-batch 0 on stage 1"):
        pipeline.time_orders(own, F, B)
    w_first = [[("F", 0), ("B", 0), ("W", 0)], [("F", 0), ("W", 0), ("B", 0)]]
    with pytest.raises(ValueError, match=r"stage 1 waits at \('W', 0\) for the backward of micro-batch 0 on stage 1"):
        pipeline.time_orders(w_first, F, B, 1)


def test_simulate_reports_a_deadlocking_schedule(monkeypatch):
    """A schedule bug (not bad input) is a RuntimeError naming the stuck operations."""
    Op = pipeline_schedules.Op
    monkeypatch.setitem(pipeline_schedules.BUILD, "1f1b", lambda P, N: [[Op("B", m, 0) for m in range(N)]
                                                                       + [Op("F", m, 0) for m in range(N)]
                                                                       for _ in range(P)])
    with pytest.raises(RuntimeError, match=r"^1f1b schedule deadlocks: next operations \[Op\(kind='B'"):
        pipeline.simulate("1f1b", 3, 3, 1, 2, 1)


ORDERS_BAD = [
    (({"0": []}, 1, 2), TypeError, r"^orders must be a list of per-stage lists .*, got dict"),
    (([[("F", 0)], "FB"], 1, 2), TypeError, r"^orders must be a list of per-stage lists"),
    (([[("F", 0), ("B", 0)]], 1, 2), ValueError, r"^orders must have a list for each of at least 2 stages, got 1$"),
    (([[], []], 1, 2), ValueError, r"^orders must list some operations"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("X", 0)]], 1, 2), ValueError,
     r"^orders\[1\]\[1\] must be a pair \(kind, microbatch\) .*, got tuple \('X', 0\)"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("B", -1)]], 1, 2), ValueError, r"^orders\[1\]\[1\] must be a pair"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("B", True)]], 1, 2), ValueError, r"^orders\[1\]\[1\] must be a pair"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("B", 0.0)]], 1, 2), ValueError, r"^orders\[1\]\[1\] must be a pair"),
    (([[("F", 0), ("B", 0)], [("F", 0), "B0"]], 1, 2), ValueError, r"^orders\[1\]\[1\] must be a pair"),
    (([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("B", 0), ("B", 1)]], 1, 2), ValueError,
     r"^orders\[1\] must run \('F', m\) exactly once for each micro-batch m in 0..1, got no \('F', 1\)$"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("F", 0), ("B", 0)]], 1, 2), ValueError,
     r"^orders\[1\] must run \('F', m\) exactly once .*, got \('F', 0\) 2 times$"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("B", 0), ("W", 0), ("W", 0)]], 1, 2, 1), ValueError,
     r"^orders\[1\] must run \('W', m\) at most once .*, got \('W', 0\) 2 times$"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]], 1, 2, 3), ValueError, r"^W must lie in \[0, B\] = \[0, 2\]"),
    (([[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]], 0, 2), ValueError, r"^F must be > 0, got 0$"),
]


@pytest.mark.parametrize("args, exc, words", ORDERS_BAD)
def test_time_orders_bad_input(args, exc, words):
    with pytest.raises(exc, match=words):
        pipeline.time_orders(*args)
