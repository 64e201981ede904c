"""Lecture 04's exercises: DeepGEMM's calc_diff as a function, how long a delayed-scaling history remembers a spike, and
what MX's floor and ceil rules make of a group's largest value, checked against fp8lab.numerics.spec and
fp8lab.numerics.scaling.

calc_diff is DeepGEMM's accuracy metric (deepseek-ai/DeepGEMM, deep_gemm/testing/numeric.py):
x, y in float64, 1 - 2 sum(x y) / sum(x^2 + y^2)."""

from __future__ import annotations

import numpy as np

from ...numerics import scaling, spec
from ._lecture import Wrong, as_number, as_tuple, close, exercise, matching_hint

__all__ = ["ex3", "ex4", "ex7", "calc_diff", "spike_memory", "mx_roundtrip"]


_ABS = 2.0**-40  # float64 sums in another order differ by far less; float32 ones by far more


def calc_diff(x, y) -> float:
    """DeepGEMM's calc_diff, in float64."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def _calc_diff_cases(rng):
    """(label, x, y): a quantization round trip, exact and opposite tensors, and two near-equal pairs where float32
    sums have errors of their own."""
    x = (rng.standard_normal((64, 300)) * np.exp(rng.normal(0, 0.5, (64, 1)))).astype(np.float32)
    codes, scale, _ = spec.quantize(x, "tile")
    tile = spec.dequantize(codes, scale, 1, spec.GROUP_K)
    near = (x * (1 + 1e-4 * rng.standard_normal(x.shape))).astype(np.float32)
    return [
        ("x and its 1x128 tile round trip (64 x 300)", x, tile),
        ("y = x", x, x.copy()),
        ("y = -x", x, -x),
        ("y = 2x", x, 2 * x),
        ("y = x (1 + 1e-4 noise): a difference of nearly equal sums", x, near),
        ("two unrelated tensors", x, rng.standard_normal(x.shape).astype(np.float32)),
    ]


def _calc_diff_mistakes(x, y):
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    f32 = np.float32
    xy, sq = (x64 * y64).sum(), (x64 * x64 + y64 * y64).sum()
    x32, y32 = np.asarray(x, f32), np.asarray(y, f32)
    return [
        (float(2 * xy / sq), "that is the similarity: DeepGEMM's calc_diff is 1 minus it"),
        (float(1 - xy / sq), "the numerator is 2 sum(x y): with y = x the result must be 0"),
        (float(f32(1) - f32(2) * (x32 * y32).sum(dtype=f32) / (x32 * x32 + y32 * y32).sum(dtype=f32)),
         "compute in float64, as DeepGEMM does (x.double()): 1 - sim is the difference of two nearly equal numbers, "
         "and float32 sums of thousands of terms carry errors larger than it"),
        (float(np.mean((x64 - y64) ** 2) / np.mean(x64 * x64)), "calc_diff is not a relative mean squared error: "
                                                               "1 - 2 sum(x y) / sum(x^2 + y^2)"),
    ]


@exercise(4, 3, "write def calc_diff(x, y): ... with NumPy sums in float64, then set ex3 = calc_diff")
def ex3(answer):
    """A function calc_diff(x, y) -> float, DeepGEMM's 1 - 2 sum(x y) / sum(x^2 + y^2), on NumPy float32 arrays."""
    if not callable(answer):
        raise Wrong(f"your answer is {answer!r}: expected a function calc_diff(x, y) returning a float")
    rng = np.random.default_rng()
    cases = _calc_diff_cases(rng)
    for label, x, y in cases:
        try:
            got = answer(x.copy(), y.copy())
        except NotImplementedError:
            raise
        except Exception as e:
            raise Wrong(f"calc_diff(x, y) [{label}] raised {type(e).__name__}: {e}"[:600],
                        "x and y are NumPy float32 arrays of one shape") from None
        got = as_number(got, "calc_diff(x, y) to return one number")
        want = calc_diff(x, y)
        if not close(got, want, rel=1e-6, abs_tol=_ABS):
            hint = matching_hint(got, _calc_diff_mistakes(x, y), rel=1e-6, abs_tol=_ABS,
                                 default="1 - 2 * (x * y).sum() / (x * x + y * y).sum(), with x and y in float64")
            raise Wrong(f"calc_diff(x, y) [{label}] returned {got:.9g}, not DeepGEMM's value", hint)
    _, x, tile = cases[0]
    return (f"calc_diff agrees with DeepGEMM's formula on {len(cases)} pairs: 0 for y = x, 2 for y = -x, "
            f"{calc_diff(x, tile):.1e} for a 1x128 tile round trip")


def spike_memory(history_len: int, spike_step: int = 20, steps: int = 60, size: float = 10.0) -> int:
    """Steps after a spike whose delayed scale (algo "max") still stands for the spike's amax: amax 1 every step,
    `size` at spike_step, through scaling.DelayedScaling."""
    ds = scaling.DelayedScaling(history_len=history_len, algo="max")
    spiked = []
    for t in range(steps):
        scale = float(ds.scale)  # the scale step t is quantized with: from steps before t
        spiked.append(t > spike_step and scale == float(np.float32(size / ds.fp8_max)))
        ds.update(size if t == spike_step else 1.0)
    return sum(spiked)


@exercise(4, 4, "in (c)'s spike cell, use fl.DelayedScaling(history_len=16, algo='max') and watch sp_delayed")
def ex4(answer):
    """For how many steps after the 10x spike of (c) a history of 16 steps (algo "max") keeps the spike's scale."""
    got = as_number(answer, "one whole number of steps")
    want = spike_memory(16)
    if got != want:
        hint = matching_hint(got, [
            (want - 1, "the scale of step t comes from the amaxes of steps t - 16 .. t - 1: count every step after "
                       "20 whose window still holds step 20"),
            (want + 1, "the spike's own step is quantized with the scale from before it (that is why it saturates): "
                       "count only the steps after it"),
            (1024, "that is the default history; here history_len=16"),
            (spike_memory(1024), "with the default history of 1024 the spike is remembered to the end of the run; "
                                 "with history_len=16 it leaves the window"),
        ], rel=0, default="count the steps t > 20 whose scale * 448 is still the spike's amax")
        raise Wrong(f"your answer {got:g} is not how long the spike stays in a 16-step history", hint)
    return (f"{want} steps: each quantized about log2(10) = 3.3 binades too low (toward the subnormals); "
            "current scaling forgets the spike at once")


def mx_roundtrip(value: float, rule: str) -> float:
    """What `value`, the largest of a 1 x 32 MX group (with a few small values), becomes after quantize -> dequantize
    with the OCP "floor" or NVIDIA "ceil" rule (fp8lab.numerics.spec)."""
    x = np.zeros((1, spec.MX_GROUP), np.float32)
    x[0, :4] = value, 1.0, -0.5, 0.25
    codes, scale, _ = spec.quantize(x, "mx", mode=f"mx_{rule}")
    return float(spec.dequantize(codes, scale, 1, spec.MX_GROUP)[0, 0])


@exercise(4, 7, "quantize a (1, 32) array holding 500 with qf.reference(x, 'mx', mode='mx_floor') and 'mx_ceil'")
def ex7(answer):
    """(what 500, the largest value of an MX group, comes back as under the "floor" rule, under the "ceil" rule)."""
    got = as_tuple(answer, 2, "two numbers: (floor rule, ceil rule)")
    want = (mx_roundtrip(500, "floor"), mx_roundtrip(500, "ceil"))
    if not close(got, want, rel=1e-9):
        if not close(got[0], want[0], rel=1e-9):
            hint = matching_hint(got[0], [
                (500, "floor maps the amax into [256, 512): the scale is 2^(floor(log2 500) - 8) = 1, and 500 is "
                      "beyond 464, where E4M3 saturates"),
                (512, "512 is not an E4M3 value times the floor rule's scale of 1: 500 saturates"),
            ], rel=1e-9, default="scale = 2^(floor(log2 amax) - 8); then encode amax / scale with saturation")
        else:
            hint = matching_hint(got[1], [
                (500, "ceil rounds the scale amax / 448 up to a power of two, 2; 500 / 2 = 250 must still round to "
                      "E4M3's grid, where the step is 16 between 128 and 256"),
                (float(spec.FP8_MAX["e4m3"]), "ceil never saturates: the scale is rounded up to 2, and 500 / 2 = 250 "
                                              "is well inside"),
                (480, "250 is nearer 256 than 240 (E4M3's step is 16 there): 256 * 2"),
            ], rel=1e-9, default="scale = 2^ceil(log2(amax / 448)); then round amax / scale onto E4M3")
        raise Wrong(f"your answer ({got[0]:g}, {got[1]:g}) is not what the two MX rules give for 500", hint)
    return (f"floor: {want[0]:g} (saturated, {1 - want[0] / 500:.1%} off); ceil: {want[1]:g} (rounded, "
            f"{want[1] / 500 - 1:.1%} off, never saturated)")
