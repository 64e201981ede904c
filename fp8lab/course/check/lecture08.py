"""Lecture 08's exercises: the shared memory version 5's pipeline needs, and the bank conflicts of an ldmatrix read
with and without version 4's row padding, checked against fp8lab.kernels.fp8_gemm's constants (shared memory: 32
banks of 4 bytes, CUDA C++ Programming Guide)."""

from __future__ import annotations

from ...kernels import fp8_gemm as fg
from ._lecture import Wrong, as_int, as_tuple, close, exercise, matching_hint

__all__ = ["ex2", "ex3", "ldmatrix_ways", "stage_kib"]

BANKS, BANK_BYTES, ROWS_PER_PHASE, ROW_READ = 32, 4, 8, 16


def stage_kib(stages: int) -> float:
    """KiB of shared memory `stages` stages of version 5 hold: per stage one K-group of a and of b (128 rows of 128
    codes each, one byte per code), without the alignment slack."""
    return stages * 2 * fg.TILE5 / 1024  # a stage: a's tile and b's, fg.TILE5 = 128 x 128 bytes each


@exercise(8, 2, "a stage holds a 128 x 128 tile of codes of a and one of b, one byte each (fg.TILE5 bytes per tile)")
def ex2(answer):
    """(KiB of shared memory for version 5's STAGES5 = 4 stages, for 3 stages), without the alignment slack."""
    got = as_tuple(answer, 2, "two numbers: (KiB with 4 stages, KiB with 3 stages)")
    want = (stage_kib(fg.STAGES5), stage_kib(fg.STAGES5 - 1))
    if not all(close(g, w, 1e-9) for g, w in zip(got, want)):
        hint = matching_hint(got, [
            ((want[0] / 2, want[1] / 2), "a stage holds a tile of a AND a tile of b: two 16 KiB tiles"),
            ((want[0] * 4, want[1] * 4), "one byte per FP8 code, not four: the codes stay FP8 in shared memory"),
            ((want[0] + 1, want[1] + 1), "leave out the 1 KiB of alignment slack (SMEM5 adds it)"),
        ], rel=1e-9, default="stages x (a tile + b tile) x 128 x 128 bytes, over 1024")
        raise Wrong(f"your answer {got} is not the shared memory of version 5's stages", hint)
    return f"{want[0]:g} KiB with {fg.STAGES5} stages, {want[1]:g} with {fg.STAGES5 - 1}: beyond 48 KiB, so opt in"


def ldmatrix_ways(row_bytes: int) -> int:
    """Passes of one ldmatrix phase: 16 bytes from each of 8 rows `row_bytes` apart; the most distinct 4-byte words
    that fall in one bank."""
    banks: dict[int, set] = {}
    for r in range(ROWS_PER_PHASE):
        for j in range(ROW_READ // BANK_BYTES):
            word = (r * row_bytes) // BANK_BYTES + j
            banks.setdefault(word % BANKS, set()).add(word)
    return max(len(w) for w in banks.values())


@exercise(8, 3, "row r of the shared tile starts at byte r * ROW4: which banks do its 16 bytes fall in, for r = 0..7?")
def ex3(answer):
    """(ways of an ldmatrix phase's conflict with rows of 128 bytes, with version 4's ROW4 = 144)."""
    got = as_tuple(answer, 2, "two whole numbers: (ways with 128-byte rows, ways with ROW4-byte rows)", as_int)
    unpadded = fg.BK4  # a K-group of 128 one-byte codes per row
    want = (ldmatrix_ways(unpadded), ldmatrix_ways(fg.ROW4))
    if got != want:
        hint = matching_hint(got, [
            ((32, 1), "ldmatrix reads 16 bytes from each of 8 rows per phase: at most 8 rows can share a bank"),
            ((want[0], want[0]), f"{fg.ROW4} bytes = 36 banks: row r starts at bank 4r mod 32, 8 different groups of "
                                 "4 banks"),
            ((4, 1), "all 8 rows start at bank 0 when a row is 128 bytes (32 banks): 8 words per bank"),
            ((1, 1), "with 128-byte rows every row starts at bank 0: the 8 rows' 16 bytes all fall in banks 0-3"),
        ], rel=0, default="the bank of byte offset o is (o // 4) mod 32; count distinct words per bank")
        raise Wrong(f"your answer {got} is not the conflict of an ldmatrix phase", hint)
    return f"{want[0]}-way with 128-byte rows, {want[1]}-way with {fg.ROW4}: 16 bytes of padding per row"
