"""Lecture 09's exercises: where per-tensor scaling pushes typical values into the subnormals and to zero, for E5M2 this
time, and the recorded run's loss in bits per character, checked against fp8lab.numerics.formats, fp8lab.training.corpus
and the recorded H200 run (fp8lab.device.hardware.recorded)."""

from __future__ import annotations

import math

from ...training import corpus
from ...numerics import formats
from ...device import hardware
from ._lecture import Wrong, as_tuple, close, exercise, matching_hint

__all__ = ["ex6", "ex7", "outlier_thresholds"]

AMAX_PER_S = 4  # (f): the tensor's amax is about 4 s, the largest of 512 Gaussian values in the outlier channel


def outlier_thresholds(fmt, amax_per_s: float = AMAX_PER_S, zero_below: str = "half") -> tuple[float, float]:
    """(log2 s where a typical value of 1 reaches fmt's subnormals, log2 s where it rounds to zero) under one scale
    per tensor that maps the amax, about amax_per_s * s, to fmt's largest value."""
    fmt = formats.get_format(fmt)
    top = fmt.max_normal / amax_per_s  # where a value of 1 lands, times s
    smallest = fmt.min_subnormal / 2 if zero_below == "half" else fmt.min_subnormal
    return math.log2(top / fmt.min_normal), math.log2(top / smallest)


@exercise(9, 6, "redo (f)'s reasoning with E5M2's numbers: fl.E5M2.max_normal, min_normal, min_subnormal")
def ex6(answer):
    """(log2 s where the typical values reach E5M2's subnormals, log2 s where they round to zero), with one scale
    per tensor and the amax about 4 s."""
    got = as_tuple(answer, 2, "two numbers: (log2 s at the subnormals, log2 s at zero)")
    want = outlier_thresholds(formats.E5M2)
    if not close(got, want, rel=0, abs_tol=0.05):
        hint = matching_hint(got, [
            (outlier_thresholds(formats.E4M3), "those are E4M3's (the text of (f)); use E5M2's largest value and "
                                               "smallest normal and subnormal"),
            (outlier_thresholds(formats.E5M2, zero_below="smallest"),
             "a value rounds to zero below HALF the smallest subnormal (the tie rounds to the even code, 0)"),
            (outlier_thresholds(formats.E5M2, amax_per_s=1), "the amax is about 4 s, not s: the outlier channel's "
                                                             "largest value over 512 Gaussian rows"),
            (outlier_thresholds(formats.E5M2, amax_per_s=1, zero_below="smallest"),
             "the amax is about 4 s, and zero starts below half the smallest subnormal"),
        ], rel=0, abs_tol=0.05, default="a value of 1 lands at max / (4 s): solve max / (4 s) = min normal, and "
                                        "= half the smallest subnormal")
        raise Wrong(f"your answer ({got[0]:g}, {got[1]:g}) is not where per-tensor E5M2 fails", hint)
    e4 = outlier_thresholds(formats.E4M3)
    return (f"E5M2 holds to s = 2^{want[0]:.1f} and flushes from 2^{want[1]:.1f} (E4M3: 2^{e4[0]:.1f}, "
            f"2^{e4[1]:.1f}): its 15 more binades, paid with one mantissa bit")


@exercise(9, 7, "bits = nats / ln 2; REC['final'] holds the recorded losses; corpus.load().vocab_size the alphabet")
def ex7(answer):
    """(the recorded fp8-deepseek validation loss in bits per character, the bits of a uniform guess among the
    corpus's characters)."""
    got = as_tuple(answer, 2, "two numbers: (recorded fp8-deepseek validation bpc, uniform guess bits)")
    nats = hardware.recorded("h200_capstone")["final"]["fp8-deepseek"]["val"]
    vocab = corpus.load().vocab_size
    want = (nats / math.log(2), math.log2(vocab))
    if not close(got, want, rel=0, abs_tol=0.01):
        if not close(got[0], want[0], rel=0, abs_tol=0.01):
            hint = matching_hint(got[0], [
                (nats, "that is the loss in nats: divide by ln 2 for bits"),
                (nats * math.log(2), "divide by ln 2, don't multiply"),
                (nats / math.log(10), "bits: divide by ln 2, not ln 10"),
            ], rel=0, abs_tol=0.01, default="REC['final']['fp8-deepseek']['val'] is in nats")
        else:
            hint = matching_hint(got[1], [
                (math.log(vocab), "bits: log2, not the natural log"),
                (8.0, f"the corpus has {vocab} distinct characters, not 256"),
                (math.log10(vocab), "bits: log2, not log10"),
            ], rel=0, abs_tol=0.01, default="a uniform guess among V characters costs log2(V) bits")
        raise Wrong(f"your answer ({got[0]:g}, {got[1]:g}) is not the recorded bpc and the uniform guess", hint)
    return (f"{want[0]:.3f} bits per character against {want[1]:.2f} for a uniform guess: the model compresses "
            f"the text {want[1] / want[0]:.1f}x")
