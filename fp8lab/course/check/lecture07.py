"""Lecture 07's exercises: which lane of an mma.sync holds an element, and where the 128-byte swizzle stores a chunk,
checked against fp8lab.device.ptx's layouts (PTX ISA: "Matrix Fragments for mma.m16n8k32", "Shared Memory Matrix
Layout")."""

from __future__ import annotations

from ...device import ptx
from ._lecture import Wrong, as_int, as_tuple, exercise, matching_hint

__all__ = ["ex5", "ex6", "mma_owner"]


def mma_owner(operand: str, row: int, col: int) -> tuple[int, int]:
    """(lane, value index) of an m16n8k32 mma.sync that holds element (row, col) of A ("a", 16 x 32) or of C/D
    ("c", 16 x 8)."""
    lay = ptx.mma_m16n8k32_layout()[operand]
    for lane in range(lay.shape[0]):
        for i, (r, c) in enumerate(lay[lane]):
            if int(r) == row and int(c) == col:
                return lane, i
    raise ValueError(f"({row}, {col}) is not an element of operand {operand!r}")


@exercise(7, 5, "ptx.mma_m16n8k32_layout(), or the picture of the lanes: lane // 4 picks rows, lane % 4 columns")
def ex5(answer):
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


@exercise(7, 6, "ptx.swizzle_128b_np(row * 128 + chunk * 16) gives the byte it is stored at; divide its offset by 16")
def ex6(answer):
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
