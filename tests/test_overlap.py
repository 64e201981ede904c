"""fp8lab.comm.overlap: the persistent copy kernel, copies and a GEMM on streams, the SM budget of fp8_gemm version 7.

Under the simulator the experiments run at their tiny sizes: they poison every output, run each configuration once
and verify what arrives (the GEMM bit for bit against fp8_gemm.reference, copies byte for byte); nothing is timed,
so every time is None. The structure checks (event order, every op present) are tested on synthetic timings here
and on measured ones in the `gpu` tests. Speed is never asserted. The experiments live in fp8lab.comm.streams and
fp8lab.comm.sm_budget; fp8lab.comm.overlap keeps their public names.
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab import bench
from fp8lab.device import hardware, runtime
from fp8lab.bench import timing
from fp8lab.comm import overlap as ov
from fp8lab.comm import sm_budget as budget_experiment
from fp8lab.comm import streams as streams_experiment
from fp8lab.kernels import fp8_gemm as fg
from fp8lab.device.runtime import cuda

T = ov.TimedOp


@pytest.fixture(scope="module")
def sim_runs(module_rng):
    """Both experiments once at the backend's default sizes (tiny under the simulator)."""
    return ov.streams(repeat=2, rng=module_rng), ov.sm_budget(measure=False, rng=module_rng)


# ---------------------------------------------------------------------------------------------------------------
# the copy kernel
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,blocks,repeats", [
    (2 * (3 * ov.COPY_UNROLL * ov.COPY_THREADS + 37), 1, 1),  # one block: three unrolled trips, then a tail
    (2 * (3 * ov.COPY_THREADS + 5), 3, 2),                     # no unrolled trip, a tail a grid stride long; twice
    (6, 2, 3),                                                 # fewer 8-byte words than threads
], ids=str)
def test_copy_persistent_copies_every_element(rng, n, blocks, repeats):
    x = rng.standard_normal(n, dtype=np.float32)
    src = cuda.to_device(x)
    dst = bench.poisoned(n, np.float32)
    ov.copy_persistent(src, dst, blocks, repeats)
    got = dst.copy_to_host()
    assert not np.isnan(got).any()
    assert np.array_equal(got.view(np.uint32), x.view(np.uint32)) and np.array_equal(src.copy_to_host(), x)


def test_copy_persistent_on_a_stream(rng):
    x = rng.standard_normal(64, dtype=np.float32)
    src, dst, s = cuda.to_device(x), bench.poisoned(64, np.float32), cuda.stream()
    ov.copy_persistent(src, dst, 1, stream=s)
    s.synchronize()
    assert np.array_equal(dst.copy_to_host(), x)


def test_copy_blocks_own_their_sms():
    # the reservation that keeps a copy block alone on its SM: no second copy block, no GEMM block beside it
    smem, reserved = hardware.SM90["smem"], hardware.SM90["smem_reserved"]
    assert 2 * (ov.COPY_SMEM + reserved) > smem and ov.COPY_SMEM + fg.SMEM5 + 2 * reserved > smem
    assert ov.COPY_SMEM <= smem - reserved - 1024  # at most 227 KiB per block on sm_90


def _bad_copy(change):
    args = dict(src=cuda.to_device(np.ones(8, np.float32)), dst=cuda.device_array(8, np.float32), blocks=1,
                repeats=1)
    args.update(change)
    return args


@pytest.mark.parametrize("change,exc,words", [
    (dict(blocks=0), ValueError, r"^blocks must be an int in 1\.\.\d+ \(this device's SMs\), got 0$"),
    (dict(blocks=10**6), ValueError, r"^blocks must be an int in 1\.\.\d+"),
    (dict(blocks=2.0), TypeError, r"^blocks must be an int in 1\.\.\d+ \(this device's SMs\), got float"),
    (dict(blocks=True), TypeError, r"^blocks must be an int"),
    (dict(repeats=0), ValueError, r"^repeats must be a positive int, got 0"),
    (dict(repeats=1.5), TypeError, r"^repeats must be a positive int"),
    (dict(src=np.ones(8, np.float32)), TypeError, r"^src must be a device array"),
    (dict(dst=cuda.device_array(8, np.float64)), TypeError, r"^dst must have dtype float32"),
    (dict(src=cuda.device_array((2, 4), np.float32)), ValueError, r"^src must be 1-D"),
    (dict(dst=cuda.device_array(12, np.float32)), ValueError, r"^src and dst must have the same shape"),
    (dict(src=cuda.device_array(7, np.float32), dst=cuda.device_array(7, np.float32)), ValueError,
     r"^src\.size must be even \(the kernel moves 8-byte words\), got 7"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_copy_persistent_errors_name_the_argument(change, exc, words):
    with pytest.raises(exc, match=words):
        ov.copy_persistent(**_bad_copy(change))


# ---------------------------------------------------------------------------------------------------------------
# experiment 1: streams
# ---------------------------------------------------------------------------------------------------------------


def test_streams_runs_every_op_in_both_modes(sim_runs):
    r = sim_runs[0]
    assert isinstance(r, ov.StreamsResult) and r.gemm == ov.SIZES[runtime.backend]["streams"]["gemm"]
    for mode, streams in (("serialized", [0, 0, 0]), ("overlapped", [0, 1, 2])):
        ops = r.runs[mode]
        assert [op.name for op in ops] == ["H2D", "GEMM", "D2H"] and [op.stream for op in ops] == streams
        assert [op.unit for op in ops] == ["GB/s", "TFLOP/s", "GB/s"]
        assert ops[0].work == r.h2d_bytes and ops[2].work == r.d2h_bytes and ops[1].work == 2.0 * np.prod(r.gemm)
    r.check()
    measured = not runtime.IS_SIM
    assert all((op.start_ms is not None) == measured for ops in r.runs.values() for op in ops)
    assert (r.gain is not None) == measured and (r.total_ms("overlapped") is not None) == measured
    (table,) = r.tables()
    head, body = table.columns(None)
    assert head == ["run", "op", "engine", "stream", "start - end", "rate"] and len(body) == 6 + 3
    if runtime.IS_SIM:  # every time cell says so, no number pretends
        assert [row[4] for row in body] == ["not measured"] * 9 and body[-1][:2] == ["gain", "serialized / overlapped"]


def test_streams_catches_a_gemm_that_writes_nothing(rng, monkeypatch):
    # poisoned outputs: a GEMM that never ran must fail the experiment, not give a table
    monkeypatch.setattr(streams_experiment, "launch_gemm", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError, match="NaN in the GEMM output"):
        ov.streams((5, 9, 100), 64, 64, repeat=1, rng=rng)


def _streams_result(serialized, overlapped=None):
    names = [("H2D", "copy engine (H2D)", "GB/s"), ("GEMM", "SMs", "TFLOP/s"), ("D2H", "copy engine (D2H)", "GB/s")]
    overlapped = overlapped or [(0, 0.0, 1.3), (1, 0.01, 1.4), (2, 0.02, 1.3)]
    runs = {mode: [T(n, e, k, 1e9, u, t0, t1) for (n, e, u), (k, t0, t1) in zip(names, times)]
            for mode, times in (("serialized", serialized), ("overlapped", overlapped))}
    return ov.StreamsResult((4096, 7168, 16384), 64 << 20, 64 << 20, runs)


GOOD = [(0, 0.0, 1.25), (0, 1.26, 2.6), (0, 2.61, 3.8)]


def test_streams_result_totals_and_gain():
    r = _streams_result(GOOD)
    r.check()
    assert r.total_ms("serialized") == 3.8 and r.total_ms("overlapped") == 1.4
    assert r.gain == pytest.approx(3.8 / 1.4)
    body = r.tables()[0].columns("NVIDIA H200")[1]
    assert body[-1][4] == "2.71x" and body[1][4] == "1.260 - 2.600 ms" and body[1][5] == "0.7 TFLOP/s"


@pytest.mark.parametrize("serialized,overlapped,words", [
    ([(0, 0.0, 1.25), (0, 1.0, 2.6), (0, 2.61, 3.8)], None, "serialized GEMM starts at 1.0000 ms, before H2D"),
    ([(0, 0.0, 1.25), (0, 2.7, 2.6), (0, 2.61, 3.8)], None, "serialized GEMM: start 2.7 / end 2.6 out of order"),
    (GOOD, [(0, -0.5, 1.3), (1, 0.01, 1.4), (2, 0.02, 1.3)], "overlapped H2D: start -0.5"),
    (GOOD, [(0, 0.0, 1.3), (1, 0.01, 1.4), (1, 0.02, 1.3)], "overlapped ops must each have their own stream"),
    ([(0, 0.0, 1.25), (1, 1.26, 2.6), (0, 2.61, 3.8)], None, "serialized ops must share one stream"),
    (GOOD, [(0, 0.0, 1.3), (1, None, None), (2, 0.02, 1.3)], "some ops were timed and some were not"),
], ids=str)
def test_streams_result_check_catches_inconsistent_timings(serialized, overlapped, words):
    with pytest.raises(AssertionError, match=words):
        _streams_result(serialized, overlapped).check()


def test_streams_result_check_needs_every_op():
    r = _streams_result(GOOD)
    del r.runs["overlapped"][2]
    with pytest.raises(AssertionError, match="the same ops"):
        r.check()


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(gemm=(0, 9, 100)), ValueError, r"^gemm\[0\] must be a positive int, got 0"),
    (dict(gemm=(5, 9)), TypeError, r"^gemm must be a tuple \(M, N, K\)"),
    (dict(h2d_bytes=100), ValueError, r"^h2d_bytes must be a multiple of 8"),
    (dict(d2h_bytes=-16), ValueError, r"^d2h_bytes must be a positive int"),
    (dict(repeat=0), ValueError, r"^repeat must be a positive int"),
])
def test_streams_errors_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ov.streams(**kwargs)


def _two_streams(copy, gemm):
    a, b = cuda.stream(), cuda.stream()
    copy(a)
    gemm(b)


def _one_stream_gemm_first(copy, gemm):
    s = cuda.stream()
    gemm(s)
    copy(s)


@pytest.mark.parametrize("issue,streams,order", [(_two_streams, 2, ["H2D", "GEMM"]),
                                                 (_one_stream_gemm_first, 1, ["GEMM", "H2D"])],
                         ids=["two streams", "one stream, GEMM first"])  # ids without addresses: xdist's workers agree
def test_try_overlap_runs_your_plan_and_the_one_stream_run(rng, issue, streams, order):
    r = streams_experiment.try_overlap(issue, (5, 9, 100), 64, repeat=2, rng=rng)
    assert r.streams == streams and r.gemm == (5, 9, 100) and r.h2d_bytes == 64
    assert [op.name for op in r.runs["one stream"]] == ["H2D", "GEMM"]
    assert [op.name for op in r.runs["yours"]] == order
    assert [op.stream for op in r.runs["one stream"]] == [0, 0]
    assert sorted({op.stream for op in r.runs["yours"]}) == list(range(streams))
    measured = not runtime.IS_SIM
    assert all((op.start_ms is not None) == measured for ops in r.runs.values() for op in ops)
    assert (r.gain is not None) == measured
    head, body = r.tables()[0].columns(None)
    assert head == ["run", "op", "stream", "start - end", "rate"] and len(body) == 2 * 3 + 1
    if runtime.IS_SIM:
        assert [row[3] for row in body] == ["not measured"] * 7


def test_try_overlap_catches_a_gemm_that_writes_nothing(rng, monkeypatch):
    monkeypatch.setattr(streams_experiment, "launch_gemm", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError, match="NaN in the GEMM output"):
        streams_experiment.try_overlap(_two_streams, (5, 9, 100), 64, repeat=1, rng=rng)


def test_try_overlap_catches_a_copy_that_moves_nothing(rng, monkeypatch):
    real = streams_experiment.timed_on_streams

    def without_copies(calls, repeat):  # the H2D op (issued first here) replaced by nothing: the poison must show
        return real([(fn, s) if i else (lambda s: None, s) for i, (fn, s) in enumerate(calls)], repeat)

    monkeypatch.setattr(streams_experiment, "timed_on_streams", without_copies)
    with pytest.raises(AssertionError, match="the H2D copy did not deliver"):
        streams_experiment.try_overlap(_two_streams, (5, 9, 100), 64, repeat=1, rng=rng)


@pytest.mark.parametrize("issue,exc,words", [
    (None, TypeError, r"^issue must be a function issue\(copy, gemm\)"),
    (lambda copy, gemm: (copy(cuda.stream()), copy(cuda.stream()), gemm(cuda.stream())), ValueError,
     r"^issue must call copy\(stream\) once and gemm\(stream\) once, got copy 2 and gemm 1 times"),
    (lambda copy, gemm: copy(cuda.stream()), ValueError, r"got copy 1 and gemm 0 times"),
    (lambda copy, gemm: (copy(), gemm(cuda.stream())), TypeError, r"^copy\(stream\): stream must be a CUDA stream"),
    (lambda copy, gemm: (copy(cuda.stream()), gemm(3)), TypeError, r"^gemm\(stream\): stream must be a CUDA stream"),
], ids=["not callable", "copy twice", "no gemm", "no stream", "not a stream"])
def test_try_overlap_errors_name_what_issue_did(rng, issue, exc, words):
    with pytest.raises(exc, match=words):
        streams_experiment.try_overlap(issue, (5, 9, 100), 64, repeat=1, rng=rng)


# ---------------------------------------------------------------------------------------------------------------
# experiment 2: the SM budget
# ---------------------------------------------------------------------------------------------------------------


def test_default_splits():
    assert ov.default_splits(132) == (132, 112, 100, 80, 64, 48, 32)
    assert ov.default_splits(114) == (114, 100, 94, 80, 64, 48, 32)
    assert ov.default_splits(20) == (20,) and ov.default_splits(2) == (2,)


def test_sm_budget_runs_every_split(sim_runs):
    b = sim_runs[1]
    size = ov.SIZES[runtime.backend]["sm_budget"]
    total = size["total_sms"] or fg.device_sms()
    assert b.total_sms == total and b.gemm == size["gemm"]
    assert [s.sms for s in b.splits] == list(size["splits"] or ov.default_splits(total))
    assert all(s.copy_sms == total - s.sms for s in b.splits)
    assert all(s.gemm_alone_ms is None and s.copy_beside_ms is None for s in b.splits)  # measure=False
    tables = b.tables()
    assert [t.unit for t in tables] == ["TFLOP/s", "GB/s", None]
    body = tables[0].columns(None)[1]
    assert len(body) == sum(1 + (s.copy_sms > 0) for s in b.splits)  # no v6 row: it is timed only when measuring
    assert {r[1] for r in body} == {timing.fmt_ms(None)} and {r[2] for r in body} == {"-"}
    if runtime.IS_SIM:
        assert [r[0] for r in body] == ["v7 on 2 SMs, alone", "v7 on 1 SM, alone", "v7 on 1 SM, beside the copy on 1"]
    summary = tables[2].columns(None)[1]
    assert summary[0][:2] == [f"{total} + 0", "not measured"] and summary[0][4:] == ["-", "-"]
    assert b.cost() is None


def test_sm_budget_catches_a_copy_that_moves_nothing(rng, monkeypatch):
    monkeypatch.setattr(budget_experiment, "copy_persistent", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError, match="the copy on 1 SM.* did not deliver its buffer"):
        ov.sm_budget((5, 9, 100), 64, total_sms=2, splits=(1,), measure=False, rng=rng)


def _budget():
    S = ov.Split
    return ov.SmBudgetResult((4096, 7168, 16384), 132, 256 << 20, [
        S(132, 0, 1.34), S(112, 20, 1.55, 1.6, 1.0, 0.5, 0.55, 0.9), S(80, 52, 2.1, 2.2, 1.0, 0.2, 0.24, 1.0)],
        v6_ms=1.35, cublas_tflops=1100.0, copy_ceiling_gbs=4300.0)


def test_sm_budget_cost_and_tables_from_measurements():
    b = _budget()
    assert b.cost() == pytest.approx(1 - 1.34 / 1.55) and b.cost(beside=True) == pytest.approx(1 - 1.34 / 1.6)
    assert b.cost(given=52) == pytest.approx(1 - 1.34 / 2.1) and b.cost(given=7) is None
    gemm, copy, summary = b.tables()
    assert "giving 20 SMs away costs the GEMM 13.5% alone, 16.2% beside the copy" in gemm.title
    head, body = gemm.columns("NVIDIA H200")
    assert head[-2:] == ["of v7 on all SMs", "copy running during"]
    assert body[0][0].startswith("v6") and body[3][0] == "v7 on 112 SMs, beside the copy on 20"
    assert body[3][-2:] == ["83.8%", "100%"] and body[1][-2] == "100.0%"
    head, body = copy.columns("NVIDIA H200")
    assert body[1][0] == "copy on 20 SMs, beside v7 on 112" and body[1][2] == "976" and body[1][-1] == "90%"
    assert summary.columns(None)[1][1] == ["112 + 20", "620.7", "601.3", "86.5%", "1,074", "976"]


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(total_sms=0), ValueError, r"^total_sms must be None or an int in 1\.\.\d+"),
    (dict(total_sms=10**6), ValueError, r"^total_sms must be None or an int in 1\.\.\d+"),
    (dict(total_sms=2.0), TypeError, r"^total_sms must be None or an int"),
    (dict(total_sms=2, splits=(2, 3)), ValueError, r"^splits\[1\] must be an int in 1\.\.2 \(SMs for the GEMM\), "
                                                   r"got 3"),
    (dict(total_sms=2, splits=(0,)), ValueError, r"^splits\[0\] must be an int in 1\.\.2"),
    (dict(total_sms=2, splits=()), TypeError, r"^splits must be a non-empty tuple"),
    (dict(total_sms=2, splits=("1",)), TypeError, r"^splits\[0\] must be an int"),
    (dict(copy_bytes=20), ValueError, r"^copy_bytes must be a multiple of 8"),
    (dict(gemm=(5, 9, 0)), ValueError, r"^gemm\[2\] must be a positive int"),
    (dict(measure="no"), TypeError, r"^measure must be a bool"),
    (dict(repeat=-1), ValueError, r"^repeat must be a positive int"),
])
def test_sm_budget_errors_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        ov.sm_budget(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# figures and the command
# ---------------------------------------------------------------------------------------------------------------


def test_figures_measured_and_not(sim_runs, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for fn, result, name in ((ov.plot_timeline, _streams_result(GOOD), "t.png"),
                             (ov.plot_sm_budget, _budget(), "b.png"),
                             (ov.plot_timeline, sim_runs[0], "t_sim.png"),
                             (ov.plot_sm_budget, sim_runs[1], "b_sim.png")):
        fig = fn(result, path=tmp_path / name)
        assert (tmp_path / name).stat().st_size > 1000
        texts = [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]
        if "sim" in name and runtime.IS_SIM:
            assert any("not measured" in t for t in texts)
        elif "sim" not in name:
            assert not any("not measured" in t for t in texts)
        plt.close(fig)
    fig = ov.plot_timeline(_streams_result(GOOD))
    assert "2.71x" in fig.axes[0].get_title() and len(fig.axes[0].get_yticklabels()) == 6
    plt.close(fig)


def test_command_runs_the_checks(sim_runs, monkeypatch, capsys):
    """`python -m fp8lab.comm.overlap` and `fp8lab bench overlap` run the same checks (the experiments themselves are
    the fixture's runs here: they take seconds under the simulator)."""
    from fp8lab import cli

    monkeypatch.setattr(streams_experiment, "streams", lambda **kwargs: sim_runs[0])
    monkeypatch.setattr(budget_experiment, "sm_budget", lambda **kwargs: sim_runs[1])
    assert ov.main(["--check-only"]) == 0
    out = capsys.readouterr().out
    assert "overlap: checks against the reference" in out and "copy_persistent" in out and "sm_budget: GEMM v7" in out
    assert cli.main(["bench", "overlap", "--check-only"]) == 0
    assert "streams: H2D" in capsys.readouterr().out


def test_overlap_keeps_the_public_names_of_both_experiments():
    for name in ("copy_kernel", "copy_persistent", "COPY_UNROLL", "COPY_THREADS", "COPY_SMEM", "Split",
                 "SmBudgetResult", "sm_budget", "plot_sm_budget"):
        assert getattr(ov, name) is getattr(budget_experiment, name), name
    for name in ("TimedOp", "StreamsResult", "streams", "plot_timeline", "OverlapTry", "try_overlap"):
        assert getattr(ov, name) is getattr(streams_experiment, name), name


def test_a_copy_kernel_tried_as_overlaps_is_sent_to_sm_budget(rng):
    """The copy kernel runs from fp8lab.comm.sm_budget: try_kernel on fp8lab.comm.overlap (an older copy of lecture
    09) would swap only overlap's name for it, so the checks refuse instead of checking the library's kernel."""
    from fp8lab.course import notebook

    ns: dict = {}
    exec(notebook.editable_source("fp8lab.comm.sm_budget.copy_kernel"), ns)
    with pytest.raises(ValueError, match=r"try_kernel\(sm_budget, 'copy', copy_kernel\)"):
        notebook.try_kernel(ov, "copy", ns["copy_kernel"], rng=rng)
    assert ov.copy_kernel is budget_experiment.copy_kernel  # put back


# ---------------------------------------------------------------------------------------------------------------
# GPU: realistic sizes (structure and correctness only; the experiments verify their outputs themselves)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_copy_persistent_256_mib_on_20_sms(rng):
    n = 64 << 20
    x = rng.standard_normal(n, dtype=np.float32)
    src, dst = cuda.to_device(x), bench.poisoned(n, np.float32)
    ov.copy_persistent(src, dst, ov.GIVEN_SMS, 3)
    assert np.array_equal(dst.copy_to_host(), x)


@pytest.mark.gpu
def test_gpu_streams_realistic_sizes_are_timed_in_order(rng):
    r = ov.streams(repeat=2, rng=rng)  # 4096 x 7168 x 16384 and 64 MiB each way
    r.check()
    assert all(op.start_ms is not None and op.ms >= 0 for ops in r.runs.values() for op in ops)
    assert r.gain is not None and r.gain > 0


@pytest.mark.gpu
def test_gpu_try_overlap_realistic_sizes_are_timed(rng):
    r = streams_experiment.try_overlap(_two_streams, repeat=2, rng=rng)  # 4096 x 7168 x 16384 and 64 MiB
    assert r.streams == 2 and r.gemm == ov.SIZES["gpu"]["streams"]["gemm"]
    for ops in r.runs.values():
        assert all(op.start_ms is not None and -ov.EVENT_TOLERANCE_MS <= op.start_ms <= op.end_ms for op in ops)
    one = r.runs["one stream"]
    assert one[1].start_ms >= one[0].end_ms - ov.EVENT_TOLERANCE_MS  # one stream: the GEMM waits for the copy
    assert r.gain is not None and r.gain > 0


@pytest.mark.gpu
def test_gpu_sm_budget_realistic_sizes_are_timed(rng):
    total = fg.device_sms()
    b = ov.sm_budget(splits=(total, total - ov.GIVEN_SMS), repeat=2, rng=rng)
    full, part = b.splits
    assert full.copy_sms == 0 and part.copy_sms == ov.GIVEN_SMS
    assert full.gemm_alone_ms > 0 and part.gemm_alone_ms > 0 and part.gemm_beside_ms > 0
    assert part.copy_alone_ms > 0 and part.copy_beside_ms > 0
    assert 0 <= part.gemm_covered <= 1 and 0 <= part.copy_covered <= 1
    assert b.cost() is not None and b.v6_ms > 0 and b.copy_ceiling_gbs > 0


def test_recorded_h200_run_rebuilds_and_round_trips():
    """The H200 run shipped for lecture 10: its results rebuild from JSON, pass their own checks, and draw."""
    meta, st, sb = ov.recorded()
    assert "H200" in meta["device"] and meta["date"] and meta["how"]
    st.check()
    assert st.gain > 1.5 and [op.name for op in st.runs["overlapped"]] == ["H2D", "GEMM", "D2H"]
    assert sb.total_sms == 132 and 0 < sb.cost() < sb.cost(beside=True) < 1
    assert ov.StreamsResult.from_dict(st.to_dict()) == st and ov.SmBudgetResult.from_dict(sb.to_dict()) == sb
    assert st.tables() and sb.tables()
    ov.plot_timeline(st)
    ov.plot_sm_budget(sb)
