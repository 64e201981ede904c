"""Instant feedback for the worksheets: each check runs a learner's function or kernel against fp8lab's reference.

    from fp8lab import check
    check.encode_e4m3(encode_e4m3)                 # ws1: float32 -> E4M3 code, by hand
    check.decode_e4m3(decode_e4m3)                 # ws1: E4M3 code -> float
    check.rmsnorm_forward_kernel(kernel)           # ws2: (y, g, z, rstd), one block of RMSNORM_THREADS per row
    check.tiled_gemm_kernel(kernel)                # ws3: (a, b, c), c = a @ b.T, GEMM_TILE x GEMM_TILE blocks
    check.tile_quantize_kernel(kernel)             # ws4: (x, codes, scale), E4M3 with one scale per 1x128 tile
    check.mma_a_fragment(fn)                       # ws5: which A element each lane of an mma.sync holds
    check.cvt_e4m3x2_intrinsic(intrinsic, twin)    # ws5: an inline-PTX @intrinsic and its simulator twin
    check.one_f_one_b(fn)                          # ws6: 1F1B's operation order per stage, timed and verified
    check.table2_bubbles(fn)                       # ws6: DeepSeek-V3 Table 2's bubbles of 1F1B and DualPipe
    check.memory_per_device(fn)                    # ws6: stages held and activation peak per device of a Timeline

Every check draws fresh random inputs, adds the edge cases that catch the usual mistakes (ties, subnormals,
NaN, overflow, shapes that are not multiples of the block or tile), fills kernel outputs with NaN before the
launch, and treats NaN in an output as a failure. Launch configurations live here, not in the learner's code.

Outcomes:
- pass: prints one line, "passed: <question>: <what was checked>";
- wrong answer: raises `CheckFailed` (an AssertionError) naming the input, the expected and the given value,
  and a hint;
- not attempted (the answer still raises NotImplementedError): raises `NotAttempted` (an AssertionError)
  whose message starts with "not attempted yet".

When the environment variable FP8LAB_CHECK_REPORT names a file, each outcome is also appended to it as one
JSON line: this is how `fp8lab worksheets grade` builds its score table.
"""

from ._core import REPORT_ENV, CheckFailed, NotAttempted
from .ws1 import decode_e4m3, encode_e4m3
from .ws2 import RMSNORM_EPS, RMSNORM_THREADS, rmsnorm_forward_kernel
from .ws3 import GEMM_TILE, tiled_gemm_kernel
from .ws4 import AMAX_FLOOR, E4M3_MAX, QUANT_TILE, QUANT_WARPS, tile_quantize_kernel
from .ws5 import cvt_e4m3x2_intrinsic, mma_a_fragment
from .ws6 import memory_per_device, one_f_one_b, table2_bubbles

__all__ = [
    "CheckFailed",
    "NotAttempted",
    "REPORT_ENV",
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
]
