"""FP8 GEMM with fine-grained scales, NT layout: y[m, n] = sum_k dequant(qa)[m, k] * dequant(qb)[n, k], float32.

qa: (M, K) E4M3/E5M2 codes with 1 x 128 tile scales (M, ceil(K/128)) (DeepSeek-V3's activations) or one
per-tensor scale (1,); qb: (N, K) codes with 128 x 128 block scales (ceil(N/128), ceil(K/128)) (a Linear
weight stored (out, in)) or per-tensor. Either operand may also carry the other fine granularity (tile for
qb, block for qa): the kernel only asks, for a row r and a K-group g, which scale applies (spec.ScaleKind).
`scale` is the dequantization factor: x ~= decode(code) * scale. This is DeepGEMM's `gemm_fp8_fp8_bf16_nt`
contract with a float32 output.

The scales are applied inside the K loop, once per K-group of 128, to the FP32 partial sum of that group:

    acc = 0
    for each K-group g of 128:      partial = sum_{k in g} decode(a[m, k]) * decode(b[n, k])   (k order)
                                    acc += partial * (sa[row(m), g] * sb[row(n), g])
    y[m, n] = acc

The scale changes from one group to the next, so it cannot be pulled out of the K sum (as a per-tensor scale
can); dequantizing whole matrices into global memory first would triple the bytes read. This is also where
DeepSeek's promotion happens: the tensor cores produce each group's partial sum, the CUDA cores scale it and
add it in FP32.

version 1: one thread per output, K-groups of 128 read from global memory, decoded through a table.
version 2: TILE x TILE outputs per block, 128-wide K-steps decoded into shared memory with the group's scales.
version 3: gemm version 7's register-tiled SGEMM core behind an FP8 front end (codes dequantized while staged).
version 4: the tensor cores through mma.sync m16n8k32: cp.async ring, ldmatrix fragments, promotion every 128.
version 5: wgmma m64n128k32 on 128-byte-swizzled shared tiles through descriptors, promotion every 128.
version 6: version 5 overlapped: K-group k + 1 issued before K-group k is promoted.
version 7: version 6 persistent: `sms` blocks loop over the output tiles, the other SMs left free.

Routed experts (grouped.py): `fp8_grouped_gemm`, qa's rows grouped by expert, each group a multiple of 128 rows,
times qb (E, N, K) with 128 x 128 blocks per expert: each group's rows are fp8_gemm of that group, bit for bit;
`fp8_grouped_wgrad`, each expert's weight gradient over its tokens from dy^T and x^T in 1 x 128 tiles along them.

The epilogue with a residual (`residual=`, versions 2-7: RESIDUAL_VERSIONS): y = residual + A B^T, the add after
the whole sum (the bits of a separate add), residual may be `out` itself (out += A B^T); compiled in per flag, so the
default kernels are unchanged. The kernel engine writes its residual stream x + h W2^T this way.

Where each lives: `simt` (versions 1-3, and the emulated limited accumulator of versions 1 and 2: accum_bits,
promote_every), `tensor_cores` (versions 4-7), `table` (VERSIONS: what launches each version, what it needs, its
traits and simulator cost), `host` (`fp8_gemm`, `launch`), `grouped` (`fp8_grouped_gemm`), `reference` (the NumPy
spec and error bounds), `checks` and `timings` (the harness). Run it: `fp8lab bench fp8_gemm [--markdown] [--deepseek]`
(`python -m fp8lab.kernels.fp8_gemm`).
"""

from __future__ import annotations

from ... import bench
from . import checks as _checks
from . import timings as _timings
from .checks import operand_on_device, random_operands
from .grouped import GROUP_ROWS, fp8_grouped_gemm, fp8_grouped_wgrad, reference_grouped, reference_grouped_wgrad
from .host import SIM_SMS, check_device, check_sms, device_sms, fp8_gemm, launch
from .reference import (ALIGN, OPERAND_GRANULARITIES, abs_product, error_bound, fma_tolerance, reference, reference64,
                        tensor_core_bound)
from .simt import TILE, kernels, make_kernel3, make_kernels
from .table import (BEST, LIMITED_VERSIONS, PERSISTENT_VERSIONS, RESIDUAL_VERSIONS, TENSOR_CORE_VERSIONS, VERSIONS,
                    best_version)
from .tensor_cores import (BK4, BM4, BM5, BN4, BN5, ROW4, SMEM4, SMEM5, STAGES4, STAGES5, THREADS4, THREADS5, TILE5,
                           make_kernel4, make_kernel5, make_kernel6, make_kernel7, tiles)
from .timings import OPTIONS, torch_blockwise

checks = _checks.checks
timings = _timings.timings

__all__ = ["VERSIONS", "BEST", "LIMITED_VERSIONS", "TENSOR_CORE_VERSIONS", "PERSISTENT_VERSIONS", "RESIDUAL_VERSIONS",
           "best_version", "fp8_gemm", "fp8_grouped_gemm", "fp8_grouped_wgrad", "reference_grouped",
           "reference_grouped_wgrad", "GROUP_ROWS", "launch", "check_device",
           "check_sms", "device_sms", "SIM_SMS", "tiles",
           "reference", "reference64", "abs_product", "error_bound", "tensor_core_bound", "fma_tolerance",
           "random_operands", "operand_on_device", "torch_blockwise", "kernels", "make_kernels", "make_kernel3",
           "make_kernel4", "make_kernel5", "make_kernel6", "make_kernel7", "ALIGN", "TILE", "OPERAND_GRANULARITIES",
           "BK4", "BM4", "BN4", "ROW4", "SMEM4", "STAGES4", "THREADS4", "BM5", "BN5", "SMEM5", "STAGES5", "THREADS5",
           "TILE5", "OPTIONS", "checks", "timings", "main"]


def main(argv=None) -> int:
    return bench.main(__name__, argv)
