"""Lecture 01's exercises: warps of a block, the atomics of each reduction, and a float32 sum that loses elements,
checked against fp8lab.kernels.reduce (its thread-id reference, its grid, and its kernels)."""

from __future__ import annotations

import numpy as np

from ...device import runtime
from ...kernels import reduce as R
from ._lecture import Wrong, as_int, as_tuple, close, exercise, matching_hint

__all__ = ["ex1", "ex3", "ex4", "ex4_input"]

W = runtime.WARP_SIZE


@exercise(1, 1, "run R.thread_ids(2, 48) and look at the warp and lane columns of block 0")
def ex1(answer):
    """(the warp of a block that is only half full, warp slots a block of 48 threads occupies, share of their lanes
    that idle) for R.thread_ids(2, 48)."""
    got = as_tuple(answer, 3, "three numbers: (half-full warp, warp slots per block, share of lanes idle)")
    ids = R.reference_thread_ids(2, 48)
    block0 = ids[ids[:, 0] == 0]
    warps, lanes = np.unique(block0[:, 2], return_counts=True)
    half = int(warps[lanes < W][0])
    slots = len(warps)
    idle = (slots * W - len(block0)) / (slots * W)
    want = (half, slots, idle)
    if not close(got, want, rel=1e-3):
        if got[0] != half:
            hint = matching_hint(got[0], [
                (2 * slots - 1, "warps are numbered within their block (threadIdx.x // 32): the half-full one has "
                                "the same number in both blocks"),
                (0, f"warp 0 holds threads 0-{W - 1}: it is full"),
            ], default="threads 0-31 of a block form warp 0, 32-63 warp 1, ...")
        elif got[1] != slots:
            hint = (f"a warp is never split: a block of 48 threads takes whole warp slots of {W}, rounded up"
                    if got[1] < slots else f"a block of 48 threads takes ceil(48 / {W}) warp slots")
        else:
            hint = matching_hint(got[2], [
                (16 / 48, f"the idle lanes are a share of the lanes of the block's warps ({slots} x {W}), not of "
                          "its 48 threads"),
                (0.5, f"only one of the two warps is half idle: 16 idle lanes of the block's {slots * W}"),
                (100 * idle, "give the share as a fraction (0.1 for 10%), not a percentage"),
            ], rel=1e-3, default="count the lanes of block 0's warps that hold no thread")
        raise Wrong(f"your answer {tuple(got)} is not what R.thread_ids(2, 48) shows", hint)
    return (f"warp {half} of each block holds threads 32-47 only; {slots} warp slots, {idle:.0%} of their lanes "
            "idle")


@exercise(1, 3, "count who calls cuda.atomic.add in reduce_kernel1, 2 and 3 (printed in (d)), per grid")
def ex3(answer):
    """Atomics issued by a grid of 1024 blocks of 256 threads: (version 1, version 2, version 3, version 3 with its
    warp sums added through shared memory into one block sum)."""
    got = as_tuple(answer, 4, "four whole numbers: atomics of (version 1, version 2, version 3, the shared-memory "
                              "variant)", as_int)
    blocks, threads = 1024, 256
    per = {"thread": blocks * threads, "block": blocks, "warp": blocks * threads // W}
    want = (per["thread"], per["block"], per["warp"], per["block"])
    if got != want:
        hints = [
            (0, {per["block"], per["warp"]}, "version 1: every thread adds its own partial sum, one atomic each"),
            (1, {per["thread"], per["warp"], threads}, "version 2: the shared-memory tree leaves one sum per block, "
                                                       "added by one atomic"),
            (2, {per["block"], per["thread"], threads // W},
             f"version 3: lane 0 of every warp adds its warp's total: {threads // W} atomics per block"),
            (3, {per["warp"], per["thread"]}, "through shared memory the warps' sums meet in one block sum: one "
                                              "atomic per block, as common.block_sum does"),
        ]
        hint = next((h for i, values, h in hints if got[i] != want[i] and got[i] in values), None)
        raise Wrong(f"your answer {got} is not the number of atomics of each version", hint or
                    "count the threads that reach cuda.atomic.add in each kernel, times the blocks")
    return (f"{want[0]:,} / {want[1]:,} / {want[2]:,} / {want[3]:,} atomics: one per thread, per block, per warp, "
            "per block")


def ex4_input(n: int | None = None) -> np.ndarray:
    """x = ones(n), x[0] = 2^24: n = 2^24 on a GPU, 2^14 under the simulator."""
    n = (1 << 14 if runtime.IS_SIM else 1 << 24) if n is None else n
    x = np.ones(n, np.float32)
    x[0] = np.float32(2.0**24)
    return x


@exercise(1, 4, "predict first; then run R.reduce_sum(x, version=v) for v = 1, 2, 3 and np.cumsum(x)[-1]")
def ex4(answer):
    """(what R.reduce_sum gives, what np.cumsum(x)[-1] gives) for x = ex4_input()."""
    got = as_tuple(answer, 2, "two numbers: (R.reduce_sum(x), np.cumsum(x)[-1])")
    x = ex4_input()
    n = x.size
    want = (R.reduce_sum(x, version=R.BEST), float(np.cumsum(x)[-1]))
    if not close(got, want, rel=0, abs_tol=0.5):
        big, exact = 2.0**24, 2.0**24 + n - 1
        stride = R.grid(n) * R.THREADS
        if not close(got[0], want[0], rel=0, abs_tol=0.5):
            hint = matching_hint(got[0], [
                (exact, "that is the exact sum: float32 holds no odd integer above 2^24, and the thread holding "
                        "x[0] adds its other elements to 2^24 one at a time"),
                (big, "that is the sequential sum; in the kernels each thread first sums only its own elements "
                      "(grid-stride), so only the thread holding x[0] adds its ones to 2^24"),
            ], rel=0, abs_tol=0.5, default=f"the grid decides: {R.grid(n)} blocks of {R.THREADS} threads; the thread "
                                            f"holding x[0] also sums x[{stride}], x[{2 * stride}], ... in float32")
        else:
            hint = matching_hint(got[1], [
                (exact, "sequential float32: once the running sum is 2^24, 2^24 + 1 is a tie and rounds to the even "
                        "2^24, so every later 1 is lost"),
            ], rel=0, abs_tol=0.5, default="np.cumsum adds in order in float32: 2^24 + 1 rounds to 2^24")
        raise Wrong(f"your answer ({got[0]:.10g}, {got[1]:.10g}) is not what the two sums give for n = {n}", hint)
    lost = int(round(2.0**24 + n - 1 - want[0]))
    return (f"reduce_sum {want[0]:.10g}: the {lost:,} other elements of x[0]'s thread are lost; np.cumsum "
            f"{want[1]:.10g}: all {n - 1:,} ones are lost")
