"""The lectures' checkable exercises (fp8lab.course.check.lecture00 ... lecture10): each check passes the right answer,
computed here from the library the way a learner would; takes None (the stub) as "not tried yet" without raising;
and fails the likely wrong answers with their specific hint. Each lecture's stub cell, right after its list of
exercises, calls exactly that lecture's checks with None, and the list marks them."""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fp8lab.numerics import accum, formats, scaling, spec
from fp8lab.course import check
from fp8lab.training import corpus
from fp8lab.device import hardware, ptx, runtime
from fp8lab.comm import moe, pipeline
from fp8lab.course.check import CheckFailed
from fp8lab.kernels import fp8_gemm as fg
from fp8lab.kernels import gemm as G
from fp8lab.kernels import optim
from fp8lab.kernels import quantize_fine as qf
from fp8lab.kernels import reduce as R

ROOT = Path(__file__).resolve().parents[1]
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
W = runtime.WARP_SIZE


def all_checks() -> dict:
    """{"lecture04.ex7": the check} for every lecture module of fp8lab.course.check."""
    out = {}
    for n in range(11):
        mod = getattr(check, f"lecture{n:02d}")
        for name in mod.__all__:
            fn = getattr(mod, name)
            if hasattr(fn, "question"):
                out[fn.question] = fn
    return out


CHECKS = all_checks()


# ------------------------------------------------------------------------------------------ right answers


def intensity(M, N, K, in_bytes=1, out_bytes=4):
    return 2 * M * N * K / ((M * K + N * K) * in_bytes + M * N * out_bytes)


def smallest_square(ridge):
    n = 1
    while 2 * n * n / (n + 4 * n) <= ridge:
        n += 1
    return n


RIDGE_FP8 = hardware.H100_FP8_TFLOPS / (hardware.HBM_GBS["H200"] / 1e3)
RIDGE_BF16 = hardware.H100_BF16_TFLOPS / (hardware.HBM_GBS["H200"] / 1e3)


def warps_48():
    ids = R.thread_ids(2, 48)
    block0 = ids[ids[:, 0] == 0]
    warps, lanes = np.unique(block0[:, 2], return_counts=True)
    slots = len(warps)
    return int(warps[lanes < W][0]), slots, (slots * W - len(block0)) / (slots * W)


@functools.lru_cache(maxsize=None)
def sums_2_24():
    n = 1 << 14 if runtime.IS_SIM else 1 << 24
    x = np.ones(n, np.float32)
    x[0] = 2.0**24
    totals = {R.reduce_sum(x, version=v) for v in R.VERSIONS}
    assert len(totals) == 1, totals  # the grid decides, not the version
    return totals.pop(), float(np.cumsum(x)[-1]), n


def int8_flushed(factor):  # lecture 02 (d)'s cell, with the outliers' factor as a parameter
    rng_d = np.random.default_rng(0)
    data = rng_d.standard_normal(1 << 14).astype(np.float32)
    data[rng_d.choice(data.size, 16, replace=False)] *= factor
    s8 = np.abs(data).max() / np.float32(127)
    int8_back = np.clip(np.rint(data / s8), -127, 127) * s8
    return np.mean(int8_back == 0)


def first_half_factor():
    return next(f for f in range(1, 10_000) if int8_flushed(f) >= 0.5)


def adam_move(g):
    p, m, v = np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32)
    optim.reference_adam(p, np.array([g], np.float32), m, v, 1, lr=1e-3)
    return float(-p[0])


def first_nonfinite(fmt):
    """The smallest float32 above fmt's largest value that saturate=False does not keep finite (a scan)."""
    start = np.array([fmt.max_normal], np.float32).view(np.uint32)[0]
    cand = (start + np.arange(1, 1 << 21, dtype=np.uint32)).view(np.float32)
    back = formats.decode(formats.encode(cand, fmt, saturate=False), fmt)
    return float(cand[np.argmax(~np.isfinite(back))])


FP16 = np.finfo(np.float16)


def fp16_overflowed():  # binades computed in float16 arithmetic: max / smallest subnormal overflows to inf
    with np.errstate(over="ignore"):
        return np.log2(FP16.max / FP16.smallest_subnormal), 2.0**-11


def calc_diff64(x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    return 1 - 2 * (x * y).sum() / (x * x + y * y).sum()


def spike_steps(history_len):  # lecture 04 (c)'s spike, with a DelayedScaling of history_len
    ds = scaling.DelayedScaling(history_len=history_len, algo="max")
    r = np.random.default_rng(1)
    amax, delayed = [], []
    for t in range(60):
        xt = (r.standard_normal(2048) * (10.0 if t == 20 else 1.0)).astype(np.float32)
        delayed.append(float(ds.scale_for(xt)) * ds.fp8_max)
        amax.append(np.abs(xt).max())
    return sum(d >= amax[20] * (1 - 1e-6) for d in delayed[21:])


def mx_500(mode):
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 7] = 500, -3.0
    codes, scale, _ = qf.reference(x, "mx", mode=mode)
    return float(formats.decode(codes[0, 0]) * scale[0, 0])


def lines_touched(byte_addresses, line=128):  # lecture 05 (c)
    return len({int(a) // line for a in byte_addresses})


def conflict_ways(word_addresses):  # lecture 05 (d)
    banks = {}
    for w in set(int(x) for x in word_addresses):
        banks.setdefault(w % 32, set()).add(w)
    return max(len(ws) for ws in banks.values())


def v2_lines_16():
    lanes = np.arange(32)
    tx, ty = lanes % 16, lanes // 16
    K = N = 4096
    return lines_touched((ty * K + 0) * 4), lines_touched((0 * N + tx) * 4)


def ldmatrix_ways(row_bytes):
    words = [(r * row_bytes + j) // 4 for r in range(8) for j in range(0, 16, 4)]
    return conflict_ways(words)


def smallest_exact_bits():
    acc_one = np.array([[1.0] + [2.0**-7] * 32], np.float32)
    fp32 = accum.dot_limited(acc_one, acc_one, None)[0, 0]
    return next(b for b in range(1, 24) if accum.dot_limited(acc_one, acc_one, b)[0, 0] == fp32)


def limited(a, b):
    return float(accum.dot_limited(np.array([[a, b]], np.float32), np.ones((1, 2), np.float32), 13)[0, 0])


def lanes_9():
    lay = ptx.mma_m16n8k32_layout()
    a = next(ln for ln in range(32) if any(tuple(e) == (9, 17) for e in lay["a"][ln].tolist()))
    c = next(ln for ln in range(32) if any(tuple(e) == (9, 5) for e in lay["c"][ln].tolist()))
    return a, c


def e5m2_thresholds(amax_per_s=4, zero=0.5):
    f = formats.E5M2
    top = f.max_normal / amax_per_s
    return math.log2(top / f.min_normal), math.log2(top / (zero * f.min_subnormal))


REC_NATS = hardware.recorded("h200_capstone")["final"]["fp8-deepseek"]["val"]


def nvlink_bound(ib_gbs):
    costs = {m: moe.comm_cost(4096, max_nodes=m, ib_gbs=ib_gbs) for m in range(1, 9)}
    return max(m for m, c in costs.items() if c.dispatch_nvlink_s > c.dispatch_ib_s * (1 + 1e-9))  # ties: no


SPLITS = (132, 124, 116, 112, 108)


def rounds(rnd=math.ceil, tile=128):
    return tuple(rnd(math.ceil(4096 / tile) * math.ceil(7168 / tile) / s) for s in SPLITS)


# name -> (right answer, [(wrong answer, a phrase of its hint)]); callables are evaluated in the test
CASES = {
    "lecture00.ex2": (lambda: intensity(64, 256, 512, out_bytes=2), [
        (intensity(64, 256, 512), "FP32 output"),
        (intensity(64, 256, 512, in_bytes=2, out_bytes=2), "operands stay FP8"),
    ]),
    "lecture00.ex4": (lambda: smallest_square(RIDGE_FP8), [
        (lambda: smallest_square(RIDGE_FP8) - 1, "still not above"),
        (lambda: smallest_square(RIDGE_BF16), "BF16 ridge"),
    ]),
    "lecture01.ex1": (warps_48, [
        ((3, 2, 0.25), "numbered within their block"),
        ((1, 2, 1 / 3), "not of its 48 threads"),
        ((1, 1.5, 0.25), "never split"),
    ]),
    "lecture01.ex3": (lambda: (1024 * 256, 1024, 1024 * 256 // W, 1024), [
        ((1024 * 256, 1024, 1024, 1024), "lane 0 of every warp"),
        ((1024 * 256, 1024, 1024 * 256 // W, 1024 * 256 // W), "one block sum"),
    ]),
    "lecture01.ex4": (lambda: sums_2_24()[:2], [
        (lambda: (2.0**24 + sums_2_24()[2] - 1, sums_2_24()[1]), "the exact sum"),
        (lambda: (sums_2_24()[0], 2.0**24 + sums_2_24()[2] - 1), "is a tie"),
        ((2.0**24, 2.0**24), "the sequential sum"),
    ]),
    "lecture02.ex2": (first_half_factor, [
        (50, "flushes only"),
        (lambda: first_half_factor() + 1, "already flushes"),
        (0.5, "not a share"),
    ]),
    "lecture02.ex5": (lambda: adam_move(1e-8), [
        (1e-3, "equals eps"),
        (1e-11, "plain SGD"),
        (lambda: -adam_move(1e-8), "against the gradient"),
    ]),
    "lecture03.ex1": (lambda: np.flatnonzero(np.isnan(formats.value_table(formats.E5M2))).tolist(), [
        ([0x7C, 0x7D, 0x7E, 0x7F, 0xFC, 0xFD, 0xFE, 0xFF], "Inf"),
        ([0x7D, 0x7E, 0x7F], "negative ones"),
        ([0x7F, 0xFF], "E4M3's"),
    ]),
    "lecture03.ex2": (lambda: (first_nonfinite(formats.E4M3), first_nonfinite(formats.E5M2)), [
        ((464.0, 61440.0), "tie between 448 and 480"),
        (lambda: (first_nonfinite(formats.E4M3), float(np.nextafter(np.float32(61440), np.float32(70000)))),
         "61440 itself is a tie"),
        ((465.0, 61440.0), "not the smallest"),
    ]),
    "lecture03.ex3": (lambda: (math.log2(float(FP16.max) / float(FP16.smallest_subnormal)), 2.0**-(FP16.nmant + 1)), [
        ((math.log2(65504 / 2.0**-14), 2.0**-11), "normal range only"),
        ((40.0, 2.0**-10), "half of it"),
        (fp16_overflowed, "overflows"),
    ]),
    "lecture04.ex3": (lambda: calc_diff64, [
        (lambda x, y: 1 - calc_diff64(x, y), "1 minus it"),
        (lambda x, y: 1 - (x * y).sum() / (x * x + y * y).sum(), "the numerator is 2"),
        (lambda x, y: 1 - 2 * (x * y).sum() / (x * x + y * y).sum(), "compute in float64"),
    ]),
    "lecture04.ex4": (lambda: spike_steps(16), [
        (15, "still holds step 20"),
        (17, "own step"),
        (lambda: spike_steps(1024), "default history"),
    ]),
    "lecture04.ex7": (lambda: (mx_500("mx_floor"), mx_500("mx_ceil")), [
        ((500.0, 512.0), "floor maps the amax"),
        ((448.0, 480.0), "nearer 256"),
        ((448.0, 448.0), "ceil never saturates"),
    ]),
    "lecture05.ex1": (v2_lines_16, [
        ((1, 1), f"T12 = {G.T12}"),
        ((2, 2), "same 16 neighbours"),
    ]),
    "lecture05.ex2": (lambda: tuple(conflict_ways(np.arange(32) * row + 5) for row in (G.T3, G.T3 + 1)), [
        ((1, 1), "walks down a column"),
        ((32, 32), "shifts each row"),
    ]),
    "lecture05.ex3": (lambda: (G.BM5 * G.BN5 // (4 * 4), (4 + 4) / (4 * 4)), [
        ((256, 0.25), "version 5's"),
        ((256, 0.5), "block tile stays"),
        ((1024, 0.25), "(4 + 4) / 16"),
    ]),
    "lecture05.ex5": (lambda: (lambda o: (o["smem"], o["blocks_per_sm"]))(hardware.occupancy(
            dict(G.LAUNCH[7], smem=2 * G.LAUNCH[7]["smem"]), G.PTXAS_REGS_SM90[7])), [
        ((16384, 2), "that is BK = 8"),
        ((32768, 6), "shared memory alone"),
    ]),
    "lecture06.ex1": (smallest_exact_bits, [
        (13, "prints 1.0"),
        (23, "far fewer"),
        (lambda: smallest_exact_bits() + 1, "not the smallest"),
    ]),
    "lecture06.ex6": (lambda: (spec.quantize(np.ones((5, 300), np.float32), "tile")[1].shape,
                               spec.quantize(np.ones((9, 300), np.float32), "block")[1].shape), [
        (((5, 2), (1, 2)), "round up"),
        (((5, 3), (9, 3)), "9 rows of b"),
    ]),
    "lecture06.ex7": (lambda: (limited(2.0**11, 1.875), limited(2.0**13, -1.5)), [
        ((2049.875, 8190.5), "exact (FP32) sum"),
        ((2050.0, 8190.0), "never rounds up"),
        ((2049.75, 8190.0), "toward zero, not down"),
    ]),
    "lecture07.ex5": (lanes_9, [
        ((8, 6), "registers 2 and 3"),
        ((4, 5), "2 columns of D"),
        ((1, 6), "lane // 4 is the row"),
    ]),
    "lecture07.ex6": (lambda: int(ptx.swizzle_128b_np(3 * 128 + 5 * 16)) % 128 // 16, [
        (5, "without the swizzle"),
        (8, "XOR, not addition"),
    ]),
    "lecture08.ex2": (lambda: (fg.STAGES5 * 2 * 128 * 128 / 1024, (fg.STAGES5 - 1) * 2 * 128 * 128 / 1024), [
        ((64, 48), "a tile of a AND a tile of b"),
        ((512, 384), "one byte per FP8 code"),
        ((129, 97), "alignment slack"),
    ]),
    "lecture08.ex3": (lambda: (ldmatrix_ways(fg.BK4), ldmatrix_ways(fg.ROW4)), [
        ((8, 8), "36 banks"),
        ((32, 1), "16 bytes from each of 8 rows"),
    ]),
    "lecture09.ex6": (e5m2_thresholds, [
        ((math.log2(448 / 4 / 2.0**-6), math.log2(448 / 4 / 2.0**-10)), "E4M3's"),
        (lambda: e5m2_thresholds(zero=1), "HALF the smallest subnormal"),
        (lambda: e5m2_thresholds(amax_per_s=1), "about 4 s"),
    ]),
    "lecture09.ex7": (lambda: (REC_NATS / math.log(2), math.log2(corpus.load().vocab_size)), [
        (lambda: (REC_NATS, math.log2(corpus.load().vocab_size)), "in nats"),
        (lambda: (REC_NATS / math.log(2), math.log(corpus.load().vocab_size)), "not the natural log"),
    ]),
    "lecture10.ex2": (lambda: (nvlink_bound(50), nvlink_bound(100)), [
        ((3, 5), "at 3 nodes"),
        ((2, 5), "same time"),
        ((2, 2), "crossover moves"),
    ]),
    "lecture10.ex3": (lambda: tuple(r["simulated"]["bubble"] for r in pipeline.compare(8, 20, F=1, B=2, W=0)), [
        ((21, 21, 15), "Table 2's formula"),
        ((21, 7, 14), "ZB1P's schedule is 1F1B's"),
    ]),
    "lecture10.ex6": (rounds, [
        (lambda: rounds(math.floor), "round up"),
        (lambda: rounds(tile=64), "128 x 128"),
    ]),
}


def value(v):
    """A case's answer: callables without parameters are evaluated; function answers (lecture04.ex3's take x, y)
    are the answer."""
    if callable(v) and all(p.default is not p.empty for p in inspect.signature(v).parameters.values()):
        return v()
    return v


def test_every_check_has_cases():
    assert set(CASES) == set(CHECKS)
    for n in range(11):
        assert any(name.startswith(f"lecture{n:02d}.") for name in CHECKS), f"lecture {n:02d} has no check"
        assert sum(name.startswith(f"lecture{n:02d}.") for name in CHECKS) >= 2, f"lecture {n:02d}: fewer than 2"


@pytest.mark.parametrize("name", sorted(CASES))
def test_right_answer_passes(name, capsys):
    right, _ = CASES[name]
    CHECKS[name](value(right))
    assert f"passed: {name}:" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CASES))
def test_none_is_not_tried_yet(name, capsys):
    assert CHECKS[name](None) is None  # returns, never raises: the lectures run with their stubs untouched
    out = capsys.readouterr().out
    assert out.startswith(f"not tried yet: {name}: ") and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_wrong_answers_get_their_hint(name):
    _, wrong = CASES[name]
    assert len(wrong) >= 2
    for answer, phrase in wrong:
        with pytest.raises(CheckFailed) as e:
            CHECKS[name](value(answer))
        msg = str(e.value)
        assert msg.startswith(f"{name}: ") and "\nhint: " in msg, msg
        assert phrase in msg.split("\nhint: ", 1)[1], f"{name}: {answer!r} -> {msg}"


def test_answers_of_the_wrong_kind_fail_with_the_expected_form():
    with pytest.raises(CheckFailed, match="expected one number"):
        check.lecture00.ex2("85.3")
    with pytest.raises(CheckFailed, match="expected two numbers"):
        check.lecture04.ex7((448,))
    with pytest.raises(CheckFailed, match="expected a function"):
        check.lecture04.ex3(0.001)
    with pytest.raises(CheckFailed, match="whole number"):
        check.lecture07.ex6(6.5)
    with pytest.raises(CheckFailed, match="expected"):
        check.lecture03.ex2((True, 61440.0))


def test_a_function_answer_still_a_placeholder_is_not_tried_yet(capsys):
    def calc_diff(x, y):
        raise NotImplementedError

    check.lecture04.ex3(calc_diff)
    assert capsys.readouterr().out.startswith("not tried yet: lecture04.ex3: ")


def test_outcomes_are_recorded_for_grading(tmp_path, monkeypatch, capsys):
    report = tmp_path / "report.jsonl"
    monkeypatch.setenv(check.REPORT_ENV, str(report))
    check.lecture07.ex6(None)
    check.lecture07.ex6(value(CASES["lecture07.ex6"][0]))
    with pytest.raises(CheckFailed):
        check.lecture07.ex6(5)
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["check"], r["status"]) for r in rows] == [
        ("lecture07.ex6", "not attempted"), ("lecture07.ex6", "passed"), ("lecture07.ex6", "failed")]
    assert "without the swizzle" in rows[2]["message"]


# ------------------------------------------------------------------------------------------ the lectures


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_each_lecture_has_its_stub_cell_after_the_exercises(path):
    n = int(path.stem[:2])
    cells = _cells(path)
    text = ["".join(c["source"]) for c in cells]
    calls = [i for i, (c, t) in enumerate(zip(cells, text)) if c["cell_type"] == "code" and "check.lecture" in t]
    assert len(calls) == 1, f"{path.name}: one stub cell, found {len(calls)}"
    i = calls[0]
    md = text[i - 1]
    assert cells[i - 1]["cell_type"] == "markdown" and re.search(r"^## Exercises", md, re.M), \
        f"{path.name}: the stub cell must follow the exercises cell"
    assert not cells[i]["outputs"] and cells[i]["execution_count"] is None and cells[i]["id"]
    mine = sorted(q for q in CHECKS if q.startswith(f"lecture{n:02d}."))
    called = sorted(f"lecture{a}.ex{b}" for a, b in re.findall(r"check\.lecture(\d\d)\.ex(\d+)\(ex\2\)", text[i]))
    assert called == mine, f"{path.name}: calls {called}, checks {mine}"
    exercises = re.sub(r"[ \t]*\n[ \t]+", " ", md[md.index("## Exercises"):])  # a list item's lines, joined
    for q in mine:
        m = int(q.split(".ex")[1])
        assert re.search(rf"^ex{m} = None  # \S", text[i], re.M), f"{path.name}: ex{m} must start as None"
        assert f"(checked: `check.{q}`" in exercises, f"{path.name}: exercise {m} must be marked checked"
        item = re.search(rf"^{m}\. (.*?)(?=^\d+\. |^- |^\*\*|\Z)", exercises, re.M | re.S)
        assert item and f"check.{q}`" in item.group(1), f"{path.name}: the mark of {q} must be in item {m}"
