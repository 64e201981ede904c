"""Lecture 00's exercises: the roofline of a GEMM on an H200 (peaks from fp8lab.device.hardware: NVIDIA H100 / H200
datasheets)."""

from __future__ import annotations

from ...device import hardware
from ._lecture import Wrong, as_int, as_number, close, exercise, matching_hint

__all__ = ["ex2", "ex4", "intensity", "ridge", "LAYER"]

LAYER = dict(M=64, N=256, K=512)
"""The course's layer: a batch of 64 through Linear(512 -> 256)."""
_COPY_TBS = 4.3  # about the course's H200 copy rate (lecture 00, BENCHMARKS.md): only a mistake model here


def intensity(M, N, K, in_bytes=1, out_bytes=4) -> float:
    """FLOP per byte of a GEMM (M, K) x (K, N) that reads each operand once and writes the output once."""
    return 2 * M * N * K / ((M * K + N * K) * in_bytes + M * N * out_bytes)


def ridge(unit: str = "fp8", hbm_gbs: float | None = None) -> float:
    """FLOP per byte where `unit`'s dense peak meets the H200's HBM bandwidth (datasheets)."""
    peak = {"fp8": hardware.H100_FP8_TFLOPS, "bf16": hardware.H100_BF16_TFLOPS}[unit] * 1e12
    return peak / ((hardware.HBM_GBS["H200"] if hbm_gbs is None else hbm_gbs) * 1e9)


@exercise(0, 2, "in the roofline cell, call gemm_flops and gemm_bytes for the 64x512x256 layer with out_bytes=2")
def ex2(answer):
    """The 64 x 512 -> 256 layer's arithmetic intensity with FP8 operands and a BF16 output (FLOP per byte)."""
    got = as_number(answer, "one number, FLOP per byte")
    want = intensity(**LAYER, out_bytes=2)
    if not close(got, want, rel=0.01):
        hint = matching_hint(got, [
            (intensity(**LAYER), "that is the FP32 output (4 bytes): switch the output to BF16, out_bytes=2"),
            (intensity(**LAYER, in_bytes=2, out_bytes=2), "only the output changes: the operands stay FP8, 1 byte"),
            (intensity(**LAYER, out_bytes=2) / 2, "a GEMM does 2 * M * N * K FLOPs: a multiply and an add per term"),
            (intensity(**LAYER, out_bytes=2) * 2, "a GEMM does 2 * M * N * K FLOPs, not 4"),
        ], rel=0.01, default="FLOPs 2*M*N*K over bytes (M*K + N*K)*in_bytes + M*N*out_bytes, M=64, N=256, K=512")
        raise Wrong(f"your answer {got:g} FLOP/B is not the intensity of the layer with a BF16 output", hint)
    return f"{want:.1f} FLOP/B (FP32 output: {intensity(**LAYER):.1f}); the FP8 ridge is {ridge():.0f}"


def _smallest_square(ridge_value, in_bytes=1, out_bytes=4, flops_per_term=2) -> int:
    """The smallest N with N = K whose intensity, as the batch M grows without bound, is above ridge_value."""
    n = 1
    while flops_per_term * n * n / (n * in_bytes + n * out_bytes) <= ridge_value:
        n += 1
    return n


@exercise(0, 4, "let M grow without bound in intensity(M, N, K): what is left, for N = K? Compare with RIDGE")
def ex4(answer):
    """The smallest N of a square layer (N = K, FP8 operands, FP32 output) that crosses the FP8 ridge at 4.8 TB/s as
    the batch grows without bound."""
    got = as_int(answer, "one whole number, N")
    want = _smallest_square(ridge())
    if got != want:
        hint = matching_hint(got, [
            (want - 1, f"at N = {want - 1} the limit 2N/5 is {2 * (want - 1) / 5:g}, still not above the ridge "
                       f"{ridge():.2f}: the layer must cross it"),
            (_smallest_square(ridge("bf16")), f"that is the BF16 ridge ({hardware.H100_BF16_TFLOPS:g} TFLOP/s): the "
                                              f"question asks for FP8's ({hardware.H100_FP8_TFLOPS:g} TFLOP/s)"),
            (_smallest_square(ridge(hbm_gbs=_COPY_TBS * 1e3)),
             f"the ridge uses the datasheet's {hardware.HBM_GBS['H200'] / 1e3:g} TB/s (RIDGE in the cell), not the "
             f"measured copy's {_COPY_TBS:g}"),
            (_smallest_square(ridge(), flops_per_term=1), "a GEMM does 2 * M * N * K FLOPs (multiply and add)"),
            (_smallest_square(ridge(), in_bytes=2), "the operands are FP8: in_bytes = 1"),
            (_smallest_square(ridge(), out_bytes=2), "the output stays FP32: out_bytes = 4"),
        ], default="as M grows, 2MNK / (MK + NK + 4MN) tends to 2NK / (K + 4N); with N = K that is 2N / 5")
        raise Wrong(f"your answer N = {got} is not the smallest square layer above the FP8 ridge", hint)
    return (f"N = K = {want}: 2N/5 = {2 * want / 5:g} > ridge {ridge():.2f} FLOP/B; a smaller square FP8 "
            "layer stays memory-bound at any batch")
