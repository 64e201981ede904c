"""Lecture 05's exercises: cache lines a warp touches, shared-memory bank conflicts, register blocking's loads and a
bigger k-step's occupancy, computed from fp8lab.kernels.gemm's tile sizes and launch table and fp8lab.device.hardware's
occupancy model.

Memory rules (CUDA C++ Best Practices Guide, CUDA C++ Programming Guide, compute capability 9.0): global memory is
read in 32-byte sectors of 128-byte lines; shared memory has 32 banks of 4 bytes, and a warp's 4-byte access takes
as many passes as the most distinct words that fall in one bank."""

from __future__ import annotations

from ...device import hardware, runtime
from ...kernels import gemm as G
from ._lecture import Wrong, as_int, as_tuple, exercise, matching_hint

__all__ = ["ex1", "ex2", "ex3", "ex5", "lines_touched", "conflict_ways"]

W = runtime.WARP_SIZE
LINE, BANKS, BANK_BYTES = 128, 32, 4


def lines_touched(byte_addresses) -> int:
    """128-byte lines that one warp's loads touch."""
    return len({int(a) // LINE for a in byte_addresses})


def conflict_ways(word_addresses) -> int:
    """Passes one warp needs for a 4-byte shared-memory access: the most distinct words in any one bank."""
    banks: dict[int, set] = {}
    for w in {int(a) for a in word_addresses}:
        banks.setdefault(w % BANKS, set()).add(w)
    return max(len(ws) for ws in banks.values())


def _v2_lines(t12: int, K: int = 4096, N: int = 4096) -> tuple[int, int]:
    """(lines of a, lines of b) that warp 0 of version 2's first block reads at one k, with t12 x t12 blocks: thread
    (tx, ty) computes c[ty, tx] and reads a[ty, k], b[k, tx] (row-major float32, K = N = 4096)."""
    k = 0
    lanes = range(W)
    a = [((lane // t12) * K + k) * 4 for lane in lanes]
    b = [(k * N + lane % t12) * 4 for lane in lanes]
    return lines_touched(a), lines_touched(b)


@exercise(5, 1, "with 16 x 16 blocks a warp is threads 0-31: tx = lane % 16, ty = lane // 16; use lines_touched")
def ex1(answer):
    """(128-byte lines of a, of b) that one warp of version 2 reads at one k with T12 = 16 (16 x 16 blocks)."""
    got = as_tuple(answer, 2, "two whole numbers: (lines of a, lines of b)", as_int)
    want = _v2_lines(16)
    if got != want:
        hint = matching_hint(got, [
            (_v2_lines(G.T12), f"that is T12 = {G.T12}'s warp, one row of the block; with 16 x 16 blocks a warp of "
                               "32 threads spans two rows ty, so two different a[m, k]"),
            ((want[0], 2 * want[1]), "both rows of the warp read the same 16 neighbours b[k, n0 : n0 + 16]: 64 bytes, "
                                     "inside one line"),
            ((W, 1), "that is version 1's pattern (threadIdx.x along m); version 2 runs threadIdx.x along n"),
            ((1, 2), "a[m, k] changes with ty (two rows), b[k, n] only with tx"),
        ], rel=0, default="list the byte addresses of a[ty, 0] and b[0, tx] for the 32 lanes, then count lines")
        raise Wrong(f"your answer {got} is not what a warp of 16 x 16 version 2 reads", hint)
    return (f"{want[0]} lines of a and {want[1]} of b: half a line of b is used per load, and a's two rows cost a "
            "second transaction")


@exercise(5, 2, "sbt[tx, kk] at one kk: lane tx reads word tx * row_length + kk; count with conflict_ways")
def ex2(answer):
    """(ways of the conflict of sbt[tx, kk] with rows of T3 = 32 floats, with rows padded to T3 + 1)."""
    got = as_tuple(answer, 2, "two whole numbers: (ways with rows of 32, ways with rows of 33)", as_int)
    kk = 5
    want = tuple(conflict_ways([lane * row + kk for lane in range(W)]) for row in (G.T3, G.T3 + 1))
    if got != want:
        hint = matching_hint(got, [
            ((1, 1), "sbt[tx, kk] walks down a column: the 32 lanes read words 32 apart, all in bank kk"),
            ((want[0], want[0]), "a row of 33 floats shifts each row by one bank: lane tx's word is in bank "
                                 "(tx + kk) mod 32, all different"),
            ((W // 2, 1), "all 32 lanes read different words of one bank: 32 passes, not 16"),
        ], rel=0, default="word w is in bank w mod 32; the passes are the most distinct words in one bank")
        raise Wrong(f"your answer {got} is not the conflict of a transposed tile read", hint)
    return f"{want[0]}-way with rows of {G.T3}, {want[1]}-way with rows of {G.T3 + 1}: one float of padding per row"


def _blocking(tm: int, tn: int) -> tuple[int, float]:
    """(threads per block, shared loads per FMA) of version 5's 128 x 128 block tile with tm x tn per thread."""
    return G.BM5 * G.BN5 // (tm * tn), (tm + tn) / (tm * tn)


@exercise(5, 3, "a thread now computes 4 x 4 outputs of the same 128 x 128 block tile: count threads and loads")
def ex3(answer):
    """(threads per block, shared-memory loads per FMA in a thread) of version 5 with TM = TN = 4."""
    got = as_tuple(answer, 2, "two numbers: (threads per block, shared loads per FMA)")
    want = _blocking(4, 4)
    if got != want:
        v5 = _blocking(G.TM5, G.TN5)
        hint = matching_hint(got, [
            (v5, f"that is version 5's TM = TN = {G.TM5}"),
            ((v5[0], want[1]), f"the block tile stays {G.BM5} x {G.BN5}: with 16 outputs per thread it needs "
                               f"{G.BM5 * G.BN5} / 16 threads"),
            ((want[0], v5[1]), "per kk a thread loads TM values of a and TN of b for TM x TN FMAs: (4 + 4) / 16"),
        ], rel=1e-9, default="threads = (128 * 128) / (TM * TN); loads per FMA = (TM + TN) / (TM * TN)")
        raise Wrong(f"your answer {got} is not version 5 with 4 x 4 outputs per thread", hint)
    return (f"{want[0]} threads (the most a block may have), {want[1]:g} shared loads per FMA: twice version 5's "
            "shared traffic per FMA")


def _v7_bk16() -> dict:
    """Version 7's launch with a k-step of 16, at the registers ptxas reported for version 7 (G.PTXAS_REGS_SM90)."""
    launch = dict(G.LAUNCH[7], smem=G.LAUNCH[7]["smem"] * 16 // G.BK5)
    return hardware.occupancy(launch, G.PTXAS_REGS_SM90[7])


@exercise(5, 5, "double the k-step in G.LAUNCH[7]['smem'], then call hardware.occupancy with 120 registers")
def ex5(answer):
    """(static shared memory per block of version 7 with BK = 16, in bytes; blocks per SM at 120 registers/thread)."""
    got = as_tuple(answer, 2, "two whole numbers: (shared bytes per block, blocks per SM)", as_int)
    occ = _v7_bk16()
    want = (occ["smem"], occ["blocks_per_sm"])
    if got != want:
        if got[0] != want[0]:
            hint = matching_hint(got[0], [
                (G.LAUNCH[7]["smem"], f"that is BK = {G.BK5}: two buffers of (16 x 128 of a + 16 x 128 of b) floats"),
                (2 * want[0], "two buffers (double buffering) of BK x 128 floats of a and of b, 4 bytes each: "
                              "2 x 16 x 256 x 4"),
                (want[0] // 1024, "give bytes, not KiB"),
            ], rel=0, default="version 7 keeps two k-steps of both tiles: 2 * BK * (128 + 128) * 4 bytes")
        else:
            hint = matching_hint(got[1], [
                (occ["by"]["shared memory"], f"shared memory alone allows {occ['by']['shared memory']} blocks, but "
                                             "120 registers x 256 threads allow fewer: the smallest limit binds"),
                (occ["by"]["threads"], "threads allow 8 blocks of 256, registers fewer"),
            ], rel=0, default="hardware.occupancy(dict(G.LAUNCH[7], smem=...), 120)['blocks_per_sm']")
        raise Wrong(f"your answer {got} is not version 7 with BK = 16", hint)
    return (f"{want[0]:,} bytes, {want[1]} blocks per SM (limited by {occ['limited_by']}): the bigger k-step costs no "
            "occupancy; whether fewer barriers per FMA pay is for a GPU to say")
