"""Lecture 07's exercises: the bank conflicts of an ldmatrix read with and without version 4's row padding, which
lane of an mma.sync holds an element, and where the 128-byte swizzle stores a chunk, checked against
fp8lab.kernels.fp8_gemm's row length and fp8lab.device.ptx's layouts (PTX ISA: "Matrix Fragments for mma.m16n8k32",
"Matrix Descriptor Format"; shared memory: 32 banks of 4 bytes, CUDA C++ Programming Guide)."""

from __future__ import annotations

from ...device import ptx
from ...kernels import fp8_gemm as fg
from ._lecture import Wrong, as_int, as_tuple, exercise, matching_hint

__all__ = ["ex5", "ex6", "ex7", "ldmatrix_ways", "mma_owner"]

BANKS, BANK_BYTES, ROWS_PER_PHASE, ROW_READ = 32, 4, 8, 16


def ldmatrix_ways(row_bytes: int) -> int:
    """Passes of one ldmatrix phase: 16 bytes from each of 8 rows `row_bytes` apart; the most distinct 4-byte words
    that fall in one bank."""
    banks: dict[int, set] = {}
    for r in range(ROWS_PER_PHASE):
        for j in range(ROW_READ // BANK_BYTES):
            word = (r * row_bytes) // BANK_BYTES + j
            banks.setdefault(word % BANKS, set()).add(word)
    return max(len(w) for w in banks.values())


@exercise(7, 5, "row r of the shared tile starts at byte r * ROW4: which banks do its 16 bytes fall in, for r = 0..7?")
def ex5(answer):
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


def mma_owner(operand: str, row: int, col: int) -> tuple[int, int]:
    """(lane, value index) of an m16n8k32 mma.sync that holds element (row, col) of A ("a", 16 x 32) or of C/D
    ("c", 16 x 8)."""
    lay = ptx.mma_m16n8k32_layout()[operand]
    for lane in range(lay.shape[0]):
        for i, (r, c) in enumerate(lay[lane]):
            if int(r) == row and int(c) == col:
                return lane, i
    raise ValueError(f"({row}, {col}) is not an element of operand {operand!r}")


@exercise(7, 6, "ptx.mma_m16n8k32_layout(), or the picture of (d): lane // 4 picks rows, lane % 4 columns")
def ex6(answer):
    """(the lane that holds A[9, 17], the lane that holds D[9, 5]) in mma.sync.m16n8k32."""
    got = as_tuple(answer, 2, "two lanes 0..31: (A[9, 17], D[9, 5])", as_int)
    (la, ia), (lc, ic) = mma_owner("a", 9, 17), mma_owner("c", 9, 5)
    want = (la, lc)
    if got != want:
        g, ta, tc = 9 % 8, (17 % 16) // 4, 5 // 2
        if got[0] != want[0]:
            hint = matching_hint(got[0], [
                (4 * g + 17 // 4, "k = 16..31 sit in a lane's registers 2 and 3: k = 16 + 4 (lane % 4) + byte"),
                (8 * ta + g, "lane // 4 is the row (mod 8), lane % 4 the group of 4 k: lane = 4 * (row % 8) + k group"),
                (4 * 9 + ta, "rows 8-15 sit in registers 1 and 3 of the same lanes as rows 0-7: use row % 8"),
            ], rel=0, default="A value i of lane l: row (l // 4) + 8 ((i // 4) % 2), k 4 (l % 4) + i % 4 + 16 (i // 8)")
        else:
            hint = matching_hint(got[1], [
                (4 * g + 5 // 4, "each lane holds 2 columns of D: col = 2 (lane % 4) + j"),
                (8 * tc + g, "lane // 4 is the row (mod 8), lane % 4 the pair of columns: lane = 4 (row % 8) + col "
                             "// 2"),
                (4 * 9 + tc, "rows 8-15 are the values 2 and 3 of the same lanes as rows 0-7: use row % 8"),
            ], rel=0, default="D value i of lane l: row (l // 4) + 8 (i // 2), col 2 (l % 4) + i % 2")
        raise Wrong(f"your answer {got} is not the lanes holding A[9, 17] and D[9, 5]", hint)
    return (f"lane {la} holds A[9, 17] (its register {ia // 4}, byte {ia % 4}), lane {lc} holds D[9, 5] (its value "
            f"{ic})")


@exercise(7, 7, "ptx.swizzle_128b_np(row * 128 + chunk * 16) gives the byte it is stored at; divide its offset by 16")
def ex7(answer):
    """At which 16-byte position of its 128-byte row the 128-byte swizzle stores chunk 5 of row 3 of an 8-row atom."""
    got = as_int(answer, "one whole number, a 16-byte position 0..7")
    row, chunk = 3, 5
    want = int(ptx.swizzle_128b_np(row * 128 + chunk * 16)) % 128 // 16
    if got != want:
        hint = matching_hint(got, [
            (chunk, "that is where it would be without the swizzle: chunk c of row r moves to c XOR (r mod 8)"),
            (chunk + row, "XOR, not addition: 5 ^ 3 = 0b101 ^ 0b011"),
            (chunk - row, "XOR, not subtraction: 5 ^ 3 = 0b101 ^ 0b011"),
            (row, "the row stays; the chunk's position within it changes, to c XOR r"),
        ], rel=0, default="the swizzle XORs bits 4-6 of the byte offset (the chunk) with bits 7-9 (the row mod 8)")
        raise Wrong(f"your answer {got} is not where the swizzle puts chunk {chunk} of row {row}", hint)
    return (f"position {want} = {chunk} ^ {row}: a logical column of chunks lands at 8 different positions, 8 bank "
            "groups")
