"""Lecture 06's exercises: the accumulator bits that keep (c)'s small products, the scale shapes of (b)'s check, and
what the 13-bit accumulator adds next to a large partial sum, checked against fp8lab.numerics.accum and
fp8lab.numerics.spec (the model of Hopper's FP8 tensor-core accumulator: SageAttention2, arXiv 2411.10958; DeepSeek-V3,
arXiv 2412.19437)."""

from __future__ import annotations

import numpy as np

from ...numerics import accum, spec
from ._lecture import Wrong, as_int, as_number, as_tuple, close, exercise, matching_hint

__all__ = ["ex1", "ex6", "ex7", "acc_one", "smallest_exact_bits", "limited_sum"]

BITS = 13  # FP22's mantissa bits, the accumulator lecture 06 models


def acc_one() -> np.ndarray:
    """(c)'s example: 1 * 1 followed by 32 products 2^-7 * 2^-7 = 2^-14 (a and b are the same row)."""
    return np.array([[1.0] + [2.0**-7] * 32], np.float32)


def smallest_exact_bits() -> int:
    """The fewest mantissa bits for which accum.dot_limited sums acc_one exactly (as FP32 does)."""
    a = acc_one()
    exact = accum.dot_limited(a, a, None)[0, 0]
    return next(b for b in range(1, 24) if accum.dot_limited(a, a, b)[0, 0] == exact)


@exercise(6, 1, "run accum.dot_limited(acc_one, acc_one, bits) for bits = 13, 14, 15, ... (the cell of (c))")
def ex1(answer):
    """The smallest accum_bits for which (c)'s 1 + 32 * 2^-14 sums exactly."""
    got = as_number(answer, "one whole number of mantissa bits")
    want = smallest_exact_bits()
    if got != want:
        hint = matching_hint(got, [
            (BITS, "13 bits lose the small products: the cell of (c) prints 1.0"),
            (23, "FP32's 23 bits are enough, but far fewer are"),
            (24, "accum_bits counts the mantissa bits after the leading 1 (FP32 has 23)"),
        ], rel=0, default=("next to an accumulator of 1.0 the last kept bit is 2^-bits: a product of 2^-14 survives "
                           "when 2^-bits <= 2^-14" if got < want else "that is exact too, but not the smallest"))
        raise Wrong(f"your answer {got:g} is not the fewest bits that keep (c)'s products", hint)
    return (f"{want} bits: the last kept bit next to 1.0 is 2^-{want}, the size of each product; DeepSeek's "
            "'about 14 bits' counts the leading one too")


@exercise(6, 6, "spec.scale_shape(granularity, shape) gives it; or count the groups of 128 by hand")
def ex6(answer):
    """(shape of qa.scale, shape of qb.scale) in (b)'s check: a (5, 300) in 1 x 128 tiles, b (9, 300) in 128 x 128
    blocks."""
    what = "two shapes: ((rows, K-groups) of a's scales, (row blocks, K-groups) of b's scales)"
    got = as_tuple(answer, 2, what, lambda v, w: as_tuple(v, 2, w, as_int))
    want = (spec.scale_shape("tile", (5, 300)), spec.scale_shape("block", (9, 300)))
    if got != want:
        if got[0] != want[0]:
            hint = matching_hint(got[0], [
                ((5, 300 // spec.GROUP_K), "round up: 300 = 2 x 128 + 44, and the last 44 elements of K are a group "
                                           "too"),
                ((want[0][1], want[0][0]), "(rows, K-groups): one scale per row and per 128 of K"),
                ((1, want[0][1]), "1 x 128 tiles: every row of a has its own scales"),
            ], rel=0, default="a tile is 1 row x 128 of K: (M, ceil(K / 128))")
        else:
            hint = matching_hint(got[1], [
                ((9, want[1][1]), "128 x 128 blocks: the 9 rows of b fit in one block row"),
                ((want[1][1], want[1][0]), "(row blocks, K-groups)"),
                ((1, 300 // spec.GROUP_K), "round up: the last K-group holds 44 elements"),
            ], rel=0, default="a block is 128 rows x 128 of K: (ceil(N / 128), ceil(K / 128))")
        raise Wrong(f"your answer {got} is not the scale shapes of (b)'s operands", hint)
    return f"qa.scale {want[0]}, qb.scale {want[1]}: the last K-group holds {300 % spec.GROUP_K} elements"


def limited_sum(terms, bits=BITS) -> float:
    """The sum of `terms` (one group of products) in accum's limited accumulator."""
    a = np.array([terms], np.float32)
    return float(accum.dot_limited(a, np.ones_like(a), bits)[0, 0])


@exercise(6, 7, "products with 1 are exact: accum.dot_limited(np.array([[2.0**11, 1.875]]), np.ones((1, 2)), 13)")
def ex7(answer):
    """(2^11 + 1.875, 2^13 - 1.5), each summed in the 13-bit accumulator."""
    got = as_tuple(answer, 2, "two numbers: (2^11 + 1.875, 2^13 - 1.5) in the 13-bit accumulator")
    cases = ([2.0**11, 1.875], [2.0**13, -1.5])
    want = tuple(limited_sum(t) for t in cases)
    if not close(got, want, rel=0):
        def ulp_rule(rnd, t):  # the big term's last kept bit, the small one rounded by rnd to it
            e = np.frexp(t[0])[1]
            u = 2.0 ** (e - BITS - 1)
            return t[0] + float(rnd(t[1] / u)) * u

        models = [
            (tuple(sum(t) for t in cases), "that is the exact (FP32) sum: next to 2^11 the accumulator's last kept "
                                           "bit is 2^-2, next to 2^13 it is 2^0"),
            (tuple(ulp_rule(np.rint, t) for t in cases), "the accumulator truncates: it drops the bits below its "
                                                         "last kept bit, never rounds up"),
            (tuple(ulp_rule(np.floor, t) for t in cases), "truncation goes toward zero, not down: -1.5 next to 2^13 "
                                                          "adds -1, not -2"),
            (tuple(limited_sum(t, BITS - 1) for t in cases), "one bit short: 13 mantissa bits after the leading one"),
        ]
        hint = matching_hint(got, models, rel=0,
                             default="the last kept bit of 2^e is 2^(e - 13); the small product is cut to a multiple "
                                     "of it, toward zero")
        raise Wrong(f"your answer ({got[0]!r}, {got[1]!r}) is not what the 13-bit accumulator gives", hint)
    return (f"{want[0]!r} and {want[1]!r}: 1.875 adds 1.75, -1.5 adds -1 (truncation toward zero); lecture 07 "
            "finds the H200's wgmma doing the same")
