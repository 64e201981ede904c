"""Worksheet checks ws7 (the FP8 GEMM with scales per K-group, promoted to FP32) and ws13 (two streams, events):
right answers pass, typical wrong answers are rejected with a message naming the mistake, placeholders are "not
attempted"."""

from __future__ import annotations

import numpy as np
import pytest

from fp8lab.course import check
from fp8lab.course.check import ws13
from fp8lab.device.runtime import cuda
from fp8lab.numerics import accum, formats

G = 128


# ------------------------------------------------------------------------------ ws7, question 1: one group


def _group_products(a_codes, b_codes, m, n, g):
    return formats.decode(a_codes[m, g * G:(g + 1) * G]) * formats.decode(b_codes[n, g * G:(g + 1) * G])


def group_sum(a_codes, sa, b_codes, sb, m, n, g):
    partial = np.float32(0)
    for p in _group_products(a_codes, b_codes, m, n, g):
        partial = np.float32(partial + p)
    return np.float32(partial * np.float32(sa[m, g] * sb[n // G, g]))


def group_sum_np_sum(a_codes, sa, b_codes, sb, m, n, g):
    p = _group_products(a_codes, b_codes, m, n, g)
    return np.float32(np.sum(p, dtype=np.float32) * np.float32(sa[m, g] * sb[n // G, g]))


def group_sum_two_roundings(a_codes, sa, b_codes, sb, m, n, g):
    partial = np.cumsum(_group_products(a_codes, b_codes, m, n, g), dtype=np.float32)[-1]
    return np.float32(np.float32(partial * sa[m, g]) * sb[n // G, g])


def group_sum_scaled_products(a_codes, sa, b_codes, sb, m, n, g):
    p = _group_products(a_codes, b_codes, m, n, g) * np.float32(sa[m, g] * sb[n // G, g])
    return np.cumsum(p, dtype=np.float32)[-1]


def group_sum_tile_scales_for_b(a_codes, sa, b_codes, sb, m, n, g):
    partial = np.cumsum(_group_products(a_codes, b_codes, m, n, g), dtype=np.float32)[-1]
    return np.float32(partial * np.float32(sa[m, g] * sb[n, g]))  # sb has one row per 128 rows of b


def group_sum_float64(a_codes, sa, b_codes, sb, m, n, g):
    partial = np.cumsum(_group_products(a_codes, b_codes, m, n, g).astype(np.float64))[-1]
    return partial * float(sa[m, g]) * float(sb[n // G, g])


def group_sum_calls_reference(a_codes, sa, b_codes, sb, m, n, g):
    return accum.dot_limited(a_codes, b_codes)  # never reached: the check reads the source first


# ------------------------------------------------------------------------------ ws7, question 2: the kernel


def _kernel(mistake):
    @cuda.jit
    def kernel(a, sa, b, sb, lut, c):
        n, m = cuda.grid(2)
        M, K = a.shape
        N = b.shape[0]
        if m < M and n < N:
            acc = np.float32(0)
            stop = K - K % G if mistake == "last group" else K
            for k0 in range(0, stop, G):
                g = k0 // G
                partial = np.float32(0)
                for k in range(k0, min(k0 + G, K)):
                    partial += lut[a[m, k]] * lut[b[n, k]]
                if mistake == "group 0":
                    g = 0
                if mistake == "no scales":
                    acc += partial
                else:
                    acc += partial * (sa[m, g] * sb[n // G, g])
            if mistake != "unwritten" or n % 7:
                c[m, n] = acc
    return kernel


# ------------------------------------------------------------------------------ ws7, question 3: error vs K


def _vs_k(a, b, ks, promote=128, metric=np.max, swap=False):
    rows = []
    for k in ks:
        ak, bk = a[:, :k], b[:, :k]
        exact = ak.astype(np.float64) @ bk.astype(np.float64).T
        ys = [accum.dot_limited(ak, bk, 13), accum.dot_limited(ak, bk, 13, promote_every=promote),
              accum.dot_limited(ak, bk, None)]
        if swap:
            ys[0], ys[1] = ys[1], ys[0]
        rows.append([metric(np.abs(y - exact) / np.abs(exact)) for y in ys])
    return np.array(rows)


def vs_k(a, b, ks):
    return _vs_k(a, b, ks)


def test_ws7_right_answers_pass(rng, capsys):
    check.scaled_group_sum(group_sum, rng=rng)
    check.fp8_gemm_promoted_kernel(_kernel(None), rng=rng)
    check.promotion_vs_k(vs_k, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS7_WRONG = [
    (check.scaled_group_sum, group_sum_np_sum, "np.sum and np.dot add in another order"),
    (check.scaled_group_sum, group_sum_two_roundings, "(partial * sa) * sb rounds twice"),
    (check.scaled_group_sum, group_sum_scaled_products, "sum the group's products first"),
    (check.scaled_group_sum, group_sum_tile_scales_for_b, "n // 128"),
    (check.scaled_group_sum, group_sum_float64, "expected float32"),
    (check.scaled_group_sum, group_sum_calls_reference, "calls dot_limited"),
    (check.fp8_gemm_promoted_kernel, _kernel("last group"), "the last K-group may be short"),
    (check.fp8_gemm_promoted_kernel, _kernel("group 0"), "each K-group has its own scales"),
    (check.fp8_gemm_promoted_kernel, _kernel("no scales"), "multiply each group's partial sum by its two scales"),
    (check.fp8_gemm_promoted_kernel, _kernel("unwritten"), "still the NaN poison"),
    (check.promotion_vs_k, lambda a, b, ks: _vs_k(a, b, ks, metric=np.mean), "not the mean"),
    (check.promotion_vs_k, lambda a, b, ks: _vs_k(a, b, ks, promote=32), "not 32"),
    (check.promotion_vs_k, lambda a, b, ks: _vs_k(a, b, ks, swap=True), "the columns are swapped"),
    (check.promotion_vs_k, lambda a, b, ks: _vs_k(a, b, [max(ks)] * len(ks)), "the first k columns"),
    (check.promotion_vs_k, lambda a, b, ks: _vs_k(a, b, ks)[:, :2], "expected ("),
]


@pytest.mark.parametrize("checker, answer, says", WS7_WRONG, ids=[f"{w[0].__name__}-{i}"
                                                                    for i, w in enumerate(WS7_WRONG)])
def test_ws7_wrong_answers_are_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg, msg
    assert "hint:" in msg and "passed" not in capsys.readouterr().out


# ------------------------------------------------------------------------------ ws13


def overlap_right(copy, gemm):
    s1, s2 = cuda.stream(), cuda.stream()
    copy(s1)
    gemm(s2)


def overlap_one_stream(copy, gemm):
    s = cuda.stream()
    copy(s)
    gemm(s)


def overlap_default_stream(copy, gemm):
    copy(0)
    gemm(0)


def _pipeline(raw=True, war=True, one=False, overwait=False, skip_last=False, wait_first=False):
    def plan(n, copy, gemm, event):
        s_copy = cuda.stream()
        s_gemm = s_copy if one else cuda.stream()
        copied = [event() for _ in range(n)]
        done = [event() for _ in range(n)]
        for i in range(n - skip_last):
            if war and i >= 2:
                done[i - 2].wait(s_copy)
            if overwait and i >= 1:
                done[i - 1].wait(s_copy)
            if wait_first:
                copied[i].wait(s_gemm)  # before the record: waits for nothing
            copy(i, s_copy)
            copied[i].record(s_copy)
            if raw and not wait_first:
                copied[i].wait(s_gemm)
            gemm(i, s_gemm)
            done[i].record(s_gemm)
    return plan


def _gemm_first(n, copy, gemm, event):
    s1, s2 = cuda.stream(), cuda.stream()
    for i in range(n):
        gemm(i, s2)  # reads the buffer before its copy was issued
        copy(i, s1)


def time_right(run):
    start, end = cuda.event(), cuda.event()
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_no_sync(run):
    start, end = cuda.event(), cuda.event()
    start.record()
    run()
    end.record()
    return start.elapsed_time(end)


def time_seconds(run):
    return time_right(run) / 1000


def time_reversed(run):
    start, end = cuda.event(), cuda.event()
    start.record()
    run()
    end.record()
    end.synchronize()
    return end.elapsed_time(start)


def time_own_stream(run):
    s = cuda.stream()
    start, end = cuda.event(), cuda.event()
    start.record(s)
    run()
    end.record(s)
    end.synchronize()
    return start.elapsed_time(end)


def time_twice(run):
    run()
    return time_right(run)


def test_ws13_right_answers_pass(rng, capsys):
    check.issue_overlap(overlap_right, rng=rng)
    check.pipeline(_pipeline(), rng=rng)
    check.time_ms(time_right, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS13_WRONG = [
    (check.issue_overlap, overlap_one_stream, "issued on one stream"),
    (check.issue_overlap, overlap_default_stream, "stream must be a CUDA stream"),
    (check.pipeline, _pipeline(raw=False), "gemm(0) may start before copy(0) has finished"),
    (check.pipeline, _pipeline(war=False), "copy(2) may overwrite buffer 0 while gemm(0) still reads it"),
    (check.pipeline, _pipeline(wait_first=True), "waited on before it was recorded"),
    (check.pipeline, _pipeline(one=True), "everything is on one stream"),
    (check.pipeline, _pipeline(overwait=True), "every copy waits for the GEMM before it"),
    (check.pipeline, _pipeline(skip_last=True), "never issued: copy(4), gemm(4)"),
    (check.pipeline, _gemm_first, "a wrong output"),
    (check.time_ms, time_no_sync, "the end event was not waited for"),
    (check.time_ms, time_seconds, "that is the time in seconds"),
    (check.time_ms, time_reversed, "end.elapsed_time(start)"),
    (check.time_ms, time_own_stream, "a stream of your own"),
    (check.time_ms, time_twice, "run() was called 2 times"),
]


@pytest.mark.parametrize("checker, answer, says", WS13_WRONG, ids=[f"{w[0].__name__}-{i}"
                                                                    for i, w in enumerate(WS13_WRONG)])
def test_ws13_wrong_answers_are_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg, msg
    assert "hint:" in msg and "passed" not in capsys.readouterr().out


def test_ws7_ws13_placeholders_are_not_attempted():
    def fn(*args):
        raise NotImplementedError("your answer goes here: replace this line")

    @cuda.jit
    def kernel(a, sa, b, sb, lut, c):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.scaled_group_sum, fn), (check.fp8_gemm_promoted_kernel, kernel),
                            (check.promotion_vs_k, fn), (check.issue_overlap, fn), (check.pipeline, fn),
                            (check.time_ms, fn)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


def test_pipeline_batches_bad_input():
    with pytest.raises(ValueError, match="n must be"):
        ws13.pipeline_batches(n=0)
    with pytest.raises(TypeError, match="gemm must be a tuple"):
        ws13.pipeline_batches(gemm=5)


@pytest.mark.gpu
def test_ws7_ws13_right_answers_pass_on_a_gpu(rng, capsys):
    """On a GPU: the kernel check's realistic shapes (within one FMA rounding per K-group), try_overlap at its check
    sizes, the pipeline verified against NumPy, real event times."""
    check.fp8_gemm_promoted_kernel(_kernel(None), rng=rng)
    check.issue_overlap(overlap_right, rng=rng)
    check.pipeline(_pipeline(), rng=rng)
    check.time_ms(time_right, rng=rng)
    with pytest.raises(check.CheckFailed, match="the end event was not waited for"):
        check.time_ms(time_no_sync, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 4
