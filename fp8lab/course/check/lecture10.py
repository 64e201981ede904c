"""Lecture 10's exercises: the link that bounds the MoE dispatch, pipeline bubbles without a separate weight
gradient, and rounds of tiles of a persistent GEMM, checked against fp8lab.comm.moe.comm_cost,
fp8lab.comm.pipeline.simulate
and fp8lab.kernels.fp8_gemm.tiles (DeepSeek-V3 technical report, arXiv 2412.19437, sections 3.2.1 and 3.2.2)."""

from __future__ import annotations

import math

from ...comm import moe, overlap, pipeline
from ...kernels import fp8_gemm as fg
from ._lecture import Wrong, as_int, as_tuple, exercise, matching_hint

__all__ = ["ex2", "ex3", "ex6", "nvlink_bound_nodes", "bubbles_without_w", "SPLITS", "rounds"]

TOKENS = 4096  # (a)'s batch: the bottleneck does not depend on it


def nvlink_bound_nodes(ib_gbs: float = 50) -> int:
    """The largest max_nodes (1..8) for which the dispatch's NVLink time is strictly longer than its IB time."""
    bound = []
    for m in range(1, 9):
        c = moe.comm_cost(TOKENS, max_nodes=m, ib_gbs=ib_gbs)
        if c.dispatch_nvlink_s > c.dispatch_ib_s * (1 + 1e-9):  # a tie (5 nodes at 100 GB/s) is no bottleneck
            bound.append(m)
    return max(bound)


@exercise(10, 2, "loop max_nodes over 1..8 in moe.comm_cost(T, max_nodes=m) and compare dispatch_ib_s with "
                "dispatch_nvlink_s")
def ex2(answer):
    """(the largest max_nodes with NVLink the bottleneck at IB 50 GB/s, the same at IB 100 GB/s)."""
    got = as_tuple(answer, 2, "two whole numbers: (at ib_gbs=50, at ib_gbs=100)", as_int)
    want = (nvlink_bound_nodes(50), nvlink_bound_nodes(100))
    if got != want:
        if got[0] != want[0]:
            hint = matching_hint(got[0], [
                (want[0] + 1, "at 3 nodes IB carries 3 rows at 50 GB/s, longer than NVLink's 8 rows at 160 GB/s: "
                              "NVLink moves 160 / 50 = 3.2 rows per IB row, and 8 / 3.2 = 2.5"),
                (4, "4 is DeepSeek-V3's limit, chosen with IB as the bottleneck"),
                (8, "without a limit every expert's node gets a row over IB: IB dominates"),
            ], rel=0, default="NVLink is the bottleneck while max_nodes / 50 < 8 / 160")
        else:
            hint = matching_hint(got[1], [
                (want[1] + 1, "at 5 nodes both links take the same time (5 / 100 = 8 / 160): NVLink is not strictly "
                              "the bottleneck"),
                (want[0], "with IB twice as fast the crossover moves: 8 / (160 / 100) = 5"),
                (2 * want[0] + 1, "the crossover is 8 / 1.6 = 5: below it, 4 is the largest whole number"),
            ], rel=0, default="NVLink is the bottleneck while max_nodes / 100 < 8 / 160")
        raise Wrong(f"your answer {got} is not where NVLink stops being the bottleneck", hint)
    return (f"{want[0]} at 50 GB/s (crossover 8 / 3.2 = 2.5 nodes), {want[1]} at 100 GB/s (crossover 5): DeepSeek-V3's "
            "4 nodes keep IB the bottleneck")


def bubbles_without_w(stages: int = 8, microbatches: int = 20) -> tuple:
    """(1F1B, ZB1P, DualPipe) simulated bubbles with F = 1, B = 2, W = 0."""
    return tuple(pipeline.simulate(s, stages, microbatches, F=1, B=2, W=0).bubble for s in pipeline.SCHEDULES)


@exercise(10, 3, "run pipeline.compare(8, 20, F=1, B=2, W=0) and read the 'simulated' column")
def ex3(answer):
    """(1F1B, ZB1P, DualPipe) simulated bubbles of 8 stages, 20 micro-batches, F = 1, B = 2, W = 0."""
    got = as_tuple(answer, 3, "three numbers: the simulated bubbles of (1F1B, ZB1P, DualPipe)")
    want = bubbles_without_w()
    if got != tuple(float(w) for w in want):
        table = tuple(pipeline.table2(8, F=1, B=2, W=0)[s]["bubble"] for s in pipeline.SCHEDULES)
        lecture = pipeline.table2(8, F=1, B=2, W=1, FB=2.5)  # (b)'s times
        hint = matching_hint(got, [
            (table, "that is Table 2's formula; with W = 0 DualPipe's conditions (F = B - W) fail, and the simulated "
                    "bubble differs: take the 'simulated' column"),
            (tuple(lecture[s]["bubble"] for s in pipeline.SCHEDULES), "those are the bubbles of (b)'s times, with "
                                                                       "W = 1: set W=0"),
        ], rel=0)
        if hint is None and got[1] != want[1]:
            hint = "with W = 0 there is no weight gradient to defer: ZB1P's schedule is 1F1B's"
        raise Wrong(f"your answer {got} is not the simulated bubbles with W = 0", hint or
                    "run pipeline.simulate(schedule, 8, 20, F=1, B=2, W=0).bubble for each schedule")
    return (f"{want[0]:g}, {want[1]:g}, {want[2]:g}: ZB1P has nothing to move into the bubble, and DualPipe beats "
            "Table 2's formula here")


SPLITS = (132, 124, 116, 112, 108)


def rounds(sms: int) -> int:
    """Rounds of 128 x 128 tiles of (e)'s GEMM output that a persistent GEMM on `sms` SMs needs."""
    M, N, _ = overlap.SIZES["gpu"]["sm_budget"]["gemm"]
    return math.ceil(fg.tiles(M, N) / sms)


@exercise(10, 6, "fg.tiles(4096, 7168) output tiles, shared by sms blocks: every block does the same rounds")
def ex6(answer):
    """Rounds of tiles of the 4096 x 7168 GEMM on 132, 124, 116, 112 and 108 SMs."""
    got = as_tuple(answer, len(SPLITS), f"{len(SPLITS)} whole numbers, one per SM count {SPLITS}", as_int)
    want = tuple(rounds(s) for s in SPLITS)
    if got != want:
        M, N, _ = overlap.SIZES["gpu"]["sm_budget"]["gemm"]
        t = fg.tiles(M, N)
        hint = matching_hint(got, [
            (tuple(t // s for s in SPLITS), "a partly filled last round still takes a whole round: round up"),
            (tuple(round(t / s) for s in SPLITS), "a partly filled last round still takes a whole round: round up"),
            (tuple(math.ceil(M * N / 64**2 / s) for s in SPLITS), "the tiles are 128 x 128"),
        ], rel=0, default=f"the output has ceil(M / 128) * ceil(N / 128) tiles; each of sms blocks takes every "
                          "sms-th one")
        raise Wrong(f"your answer {got} is not the rounds of tiles", hint)
    return (f"rounds {want}: the GEMM's time should follow these steps, not fall smoothly with the SMs (and 20 SMs "
            f"given away cost {1 - rounds(132) / rounds(112):.1%}, not {20 / 132:.1%})")
