"""Instant feedback for the worksheets and the lectures' exercises: each check tests a learner's answer against fp8lab.

    from fp8lab import check
    check.rmsnorm_forward_kernel(kernel)           # ws1: (y, g, z, rstd), one block of RMSNORM_THREADS per row
    check.encode_e4m3(encode_e4m3)                 # ws2: float32 -> E4M3 code, by hand
    check.decode_e4m3(decode_e4m3)                 # ws2: E4M3 code -> float
    check.tile_quantize_kernel(kernel)             # ws3: (x, codes, scale), E4M3 with one scale per 1x128 tile
    check.scale_from_history(fn)                   # ws4: a delayed-scaling scale from an amax history, "max"
    check.delayed_quantize_steps(fn)               # ws4: delayed scaling over a sequence, codes bit for bit
    check.clipped_at_spike(fn)                     # ws4: elements a 16x spike clips, delayed vs current scaling
    check.tiled_gemm_kernel(kernel)                # ws5: (a, b, c), c = a @ b.T, GEMM_TILE x GEMM_TILE blocks
    check.accumulate_limited(fn)                   # ws6: the FP22 tensor-core accumulator's sum, bit for bit
    check.promoted_dot(fn)                         # ws6: limited sums promoted to FP32 every promote_every of K
    check.promotion_errors(fn, why)                # ws6: K = 4096 errors without / with promotion, and why
    check.scaled_group_sum(fn)                     # ws7: one K-group's partial sum times sa * sb, bit for bit
    check.fp8_gemm_promoted_kernel(kernel)         # ws7: the FP8 GEMM, scales per K-group, FP32 total, one thread/output
    check.promotion_vs_k(fn)                       # ws7: max relative error vs K, no promotion / every 128 / FP32
    check.mma_a_fragment(fn)                       # ws8: which A element each lane of an mma.sync holds
    check.cvt_e4m3x2_intrinsic(intrinsic, twin)    # ws8: an inline-PTX @intrinsic and its simulator twin
    check.swizzled_offset(fn)                      # ws9: where the 128-byte swizzle stores byte k of row r
    check.wgmma_tile_kernel(kernel)                # ws9: (a, sa, b, sb, c), one warpgroup per 64 x 128 wgmma tile
    check.requantize_tile_to_col(fn)               # ws10: cached 1x128 tiles of x -> 128x1 tiles, bit for bit
    check.fp8_wgrad(fn)                            # ws10: dW = dy^T x from dy and the cached FP8 x, fp8-deepseek
    check.wgrad_errors(fn)                         # ws10: Wgrad's error with the re-tiled cache / x quantized afresh
    check.retile_changes(fn)                       # ws10: values the re-tiling changes, amax / 448 vs pow2 scales
    check.memory_per_parameter(fn)                 # ws11: bytes a parameter keeps between steps, per recipe
    check.which_precision(fn)                      # ws11: FP8, BF16 or FP32 for each op of fp8-deepseek's step
    check.per_tensor_breaks_at(fn)                 # ws11: the outlier magnitude where per-tensor scaling breaks
    check.one_f_one_b(fn)                          # ws12: 1F1B's operation order per stage, timed and verified
    check.table2_bubbles(fn)                       # ws12: DeepSeek-V3 Table 2's bubbles of 1F1B and DualPipe
    check.memory_per_device(fn)                    # ws12: stages held and activation peak per device of a Timeline
    check.issue_overlap(fn)                        # ws13: a copy and the FP8 GEMM on two streams (try_overlap)
    check.pipeline(fn)                             # ws13: double-buffered copies and GEMMs ordered by events, no race
    check.time_ms(fn)                              # ws13: a timer of two CUDA events on the default stream

    check.lecture04.ex7(answer)                    # lecture 04, exercise 7 (every lecture: check.lectureNN.exM)

    check.hint("ws8", 2)                           # the second hint of ws8's question 2: it gives the answer away

Every check draws fresh random inputs, adds the edge cases that catch the usual mistakes (ties, subnormals,
NaN, overflow, shapes that are not multiples of the block or tile), fills kernel outputs with NaN before the
launch, and treats NaN in an output as a failure. Launch configurations live here, not in the learner's code.

Outcomes:
- pass: prints one line, "passed: <question>: <what was checked>";
- wrong answer: raises `CheckFailed` (an AssertionError) naming the input, the expected and the given value,
  and a hint;
  the first failure of a question adds how to ask for its second hint, the one that gives the answer away; the
  second failure of the same question in this process (kernel session) prints that hint once (fp8lab.course.hints);
- not attempted (the answer still raises NotImplementedError): raises `NotAttempted` (an AssertionError)
  whose message starts with "not attempted yet".

When the environment variable FP8LAB_CHECK_REPORT names a file, each outcome is also appended to it as one
JSON line: this is how `fp8lab worksheets grade` builds its score table.

The lectures' checkable exercises (fp8lab.course.check.lecture00 ... lecture10, one function per exercise) take an
answer (a number, a tuple, a list of codes or a small function) from the stub cell after each lecture's list of
exercises. They compute the truth from the library and differ from the worksheets' checks in one way: an answer of
None (the stub) prints "not tried yet: <where to start>" and returns, so a lecture runs top to bottom untouched. A
right answer prints "passed: ..."; a wrong one raises CheckFailed with the hint of the mistake it matches (the message
never states the answer); outcomes are recorded like the worksheets' ("lecture04.ex7", ...).
"""

from ._core import REPORT_ENV, CheckFailed, NotAttempted, hint
from .ws1 import RMSNORM_EPS, RMSNORM_THREADS, rmsnorm_forward_kernel
from .ws2 import decode_e4m3, encode_e4m3
from .ws3 import AMAX_FLOOR, E4M3_MAX, QUANT_TILE, QUANT_WARPS, tile_quantize_kernel
from .ws4 import clipped_at_spike, delayed_quantize_steps, scale_from_history
from .ws5 import GEMM_TILE, tiled_gemm_kernel
from .ws6 import accumulate_limited, promoted_dot, promotion_errors
from .ws7 import FP8_GEMM_BLOCK, fp8_gemm_promoted_kernel, promotion_vs_k, scaled_group_sum
from .ws8 import cvt_e4m3x2_intrinsic, mma_a_fragment
from .ws9 import WGMMA_SMEM, WGMMA_THREADS, WGMMA_TILE_M, WGMMA_TILE_N, swizzled_offset, wgmma_tile_kernel
from .ws10 import fp8_wgrad, requantize_tile_to_col, retile_changes, wgrad_errors
from .ws11 import memory_per_parameter, per_tensor_breaks_at, which_precision
from .ws12 import memory_per_device, one_f_one_b, table2_bubbles
from .ws13 import issue_overlap, pipeline, time_ms
from . import (lecture00, lecture01, lecture02, lecture03, lecture04, lecture05, lecture06, lecture07, lecture08,
    lecture09, lecture10)

__all__ = [
    "CheckFailed",
    "NotAttempted",
    "REPORT_ENV",
    "hint",
    "RMSNORM_THREADS",
    "RMSNORM_EPS",
    "GEMM_TILE",
    "QUANT_TILE",
    "QUANT_WARPS",
    "E4M3_MAX",
    "AMAX_FLOOR",
    "encode_e4m3",
    "decode_e4m3",
    "rmsnorm_forward_kernel",
    "tiled_gemm_kernel",
    "tile_quantize_kernel",
    "mma_a_fragment",
    "cvt_e4m3x2_intrinsic",
    "one_f_one_b",
    "table2_bubbles",
    "memory_per_device",
    "accumulate_limited",
    "promoted_dot",
    "promotion_errors",
    "scale_from_history",
    "delayed_quantize_steps",
    "clipped_at_spike",
    "requantize_tile_to_col",
    "fp8_wgrad",
    "wgrad_errors",
    "retile_changes",
    "memory_per_parameter",
    "which_precision",
    "per_tensor_breaks_at",
    "WGMMA_TILE_M",
    "WGMMA_TILE_N",
    "WGMMA_THREADS",
    "WGMMA_SMEM",
    "swizzled_offset",
    "wgmma_tile_kernel",
    "FP8_GEMM_BLOCK",
    "scaled_group_sum",
    "fp8_gemm_promoted_kernel",
    "promotion_vs_k",
    "issue_overlap",
    "pipeline",
    "time_ms",
    "lecture00",
    "lecture01",
    "lecture02",
    "lecture03",
    "lecture04",
    "lecture05",
    "lecture06",
    "lecture07",
    "lecture08",
    "lecture09",
    "lecture10",
]
