"""The schedules as operation orders: for each device, its operations in the order it runs them (`Op`), built by
`ops_1f1b` (Megatron's 1F1B), `ops_zb1p` (ZB-H1) and `ops_dualpipe` (the official DualPipe `step()`); `BUILD` maps a
schedule name to its builder. `fp8lab.comm.pipeline.simulate` times these orders.
"""

from __future__ import annotations

from typing import NamedTuple

SCHEDULES = ("1f1b", "zb1p", "dualpipe")


class Op(NamedTuple):
    """One operation in a device's order; a "B" with split=True leaves its W to a later "W" of the same micro-batch,
    an "FB" runs the forward of (mb, direction) overlapped with the backward of (b_mb, b_direction)."""

    kind: str                 # "F", "B", "W", "FB"
    mb: int
    direction: int
    split: bool = False       # B: input gradient only, its W later
    b_mb: int | None = None   # FB: the backward half
    b_direction: int | None = None


def ops_1f1b(P: int, N: int) -> list[list[Op]]:
    """Megatron's 1F1B: device s runs P-1-s warm-up forwards, then forward/backward pairs, then the rest."""
    out = []
    for s in range(P):
        warm = min(P - 1 - s, N)
        ops = [Op("F", m, 0) for m in range(warm)]
        for i in range(N - warm):
            ops += [Op("F", warm + i, 0), Op("B", i, 0)]
        out.append(ops + [Op("B", N - warm + i, 0) for i in range(warm)])
    return out


def ops_zb1p(P: int, N: int) -> list[list[Op]]:
    """ZB-H1 (Qi et al. 2023, arXiv 2401.10241, Figure 3): every backward split; device s runs triples
    (F x, B x-(P-1-s), W x-(P-1)), so B leaves at once for the previous stage and each W lags its forward by P-1:
    the deferred W's fill the cool-down bubbles while at most P micro-batches are in flight, as in 1F1B."""
    out = []
    for s in range(P):
        ops = []
        for x in range(N + P - 1):
            if x < N:
                ops.append(Op("F", x, 0))
            if 0 <= x - (P - 1 - s) < N:
                ops.append(Op("B", x - (P - 1 - s), 0, split=True))
            if 0 <= x - (P - 1) < N:
                ops.append(Op("W", x - (P - 1), 0))
        out.append(ops)
    return out


def ops_dualpipe(P: int, N: int) -> list[list[Op]]:
    """The official DualPipe `step()` (github.com/deepseek-ai/DualPipe, dualpipe/dualpipe.py), phase by phase.

    Device r holds stage r of direction 0 and stage P-1-r of direction 1. As in the code, "phase 0" is the
    direction whose first stage is on this half of the pipeline, and split backwards queue their W's first in,
    first out (WeightGradStore).
    """
    half, per_dir = P // 2, N // 2
    out = []
    for r in range(P):
        h = min(r, P - 1 - r)
        flip = int(r >= half)
        middle = h == half - 1
        nf, nb, wq, ops = [0, 0], [0, 0], [], []

        def f(phase):
            d = phase ^ flip
            nf[d] += 1
            return Op("F", nf[d] - 1, d)

        def b(phase, zb=False):
            d = phase ^ flip
            nb[d] += 1
            if zb:
                wq.append((nb[d] - 1, d))
            return Op("B", nb[d] - 1, d, split=zb)

        def w():
            m, d = wq.pop(0)
            return Op("W", m, d)

        def fb(phase0, phase1):
            x, y = f(phase0), b(phase1)
            return Op("FB", x.mb, x.direction, b_mb=y.mb, b_direction=y.direction)

        ops += [f(0) for _ in range((half - h - 1) * 2)]                    # 1: nF0
        for _ in range(h + 1):                                               # 2: nF0F1
            ops += [f(0), f(1)]
        for _ in range(half - h - 1):                                        # 3: nB1W1F1 (zero bubble)
            ops += [b(1, zb=True), w(), f(1)]
        for i in range(per_dir - P + h + 1):                                 # 4: nF0B1F1B0 (main)
            if i == 0 and middle:  # the code does not overlap these two, to shrink the bubble
                ops += [f(0), b(1)]
            else:
                ops.append(fb(0, 1))
            ops.append(fb(1, 0))
        for _ in range(half - h - 1):                                        # 5: nB1F1B0
            ops += [b(1), fb(1, 0)]
        zb = False
        for i in range(h + 1):                                               # 6: nB1B0, second half split
            if i == (h + 1) // 2 and h % 2 == 1:
                zb = True
            ops.append(b(1, zb))
            if i == (h + 1) // 2 and h % 2 == 0:
                zb = True
            ops.append(b(0, zb))
        for _ in range(half - h - 1):                                        # 7: nWB0 (zero bubble)
            ops += [w(), b(0, zb=True)]
        ops += [w() for _ in range(h + 1)]                                   # 8: nW
        assert not wq and nf == nb == [per_dir, per_dir], (r, nf, nb, wq)
        out.append(ops)
    return out


BUILD = {"1f1b": ops_1f1b, "zb1p": ops_zb1p, "dualpipe": ops_dualpipe}
