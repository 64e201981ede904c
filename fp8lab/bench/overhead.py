"""The public API's cost over its kernels: fl.quantize, fl.dequantize and fl.fp8_gemm on device arrays against the same kernels writing into preallocated outputs.

The public functions validate their arguments and allocate their outputs on every call; the allocations come
from fp8lab's caching pool (fp8lab/device/pool.py), so in steady state the GPU does what the kernel alone does. The
"time" column is one call from Python until the GPU is done (what a loop that waits for each result pays;
the ceiling is the preallocated kernel timed the same way in the same run), where Python's own work per call
(argument checks, new device arrays typed for the launch) adds to the kernel's; "GPU time" is calls queued
back to back, as in every other table, where Python's work overlaps the GPU's.

`fp8lab bench overhead` runs it (the same check-then-time harness as the kernel modules).
"""

from __future__ import annotations

import numpy as np

from .. import bench, quant
from ..device import runtime
from ..numerics import spec
from . import timing
from ..kernels import fp8_gemm as fp8_gemm_module
from ..kernels import quantize_fine

cuda = runtime.cuda


def checks(rng) -> list[tuple[str, str]]:
    """The public calls on device arrays give what the kernels with preallocated outputs give, bit for bit."""
    M, K, N = (20, 200, 8) if runtime.IS_SIM else (1000, 1300, 700)
    x = rng.standard_normal((M, K), dtype=np.float32)
    dx = cuda.to_device(x)
    q = quant.quantize(dx, granularity="tile")
    codes, scale = bench.poisoned((M, K), np.uint8), bench.poisoned(spec.scale_shape("tile", (M, K)), np.float32)
    quantize_fine.quantize_tile(dx, codes, scale)
    bench.assert_codes_equal("fl.quantize codes", q.data.copy_to_host(), codes.copy_to_host())
    bench.assert_close("fl.quantize scales", q.scale.copy_to_host(), scale.copy_to_host(), rtol=0, atol=0)
    y = quant.dequantize(q).copy_to_host()
    bench.assert_close("fl.dequantize", y, spec.dequantize(codes.copy_to_host(), scale.copy_to_host(), 1, 128),
                       rtol=0, atol=0)
    qa, qb = fp8_gemm_module.random_operands(rng, M, N, K, on_device=True)
    out = bench.poisoned((M, N), np.float32)
    fp8_gemm_module.fp8_gemm(qa, qb, out=out)
    bench.assert_close("fl.fp8_gemm", fp8_gemm_module.fp8_gemm(qa, qb).copy_to_host(), out.copy_to_host(),
                       rtol=0, atol=0)
    return [(f"fl.quantize / fl.dequantize (tile) {M}x{K}, fl.fp8_gemm {M}x{N}x{K} on device arrays",
             "equal to the kernels with preallocated outputs")]


def _pair(title, unit, work, kernel, api, kernel_label, api_label) -> bench.Table:
    """Two rows timed per call from Python until the GPU is done (ceiling: the preallocated kernel), with the GPU
    time of calls queued back to back (as in the other tables) beside them."""
    rows = []
    for label, fn in ((kernel_label, kernel), (api_label, api)):
        rows.append(bench.Row(label, timing.launch_ms(fn), work, {"GPU time": timing.fmt_ms(timing.time_ms(fn))}))
    ceiling = bench.rate(work, rows[0].ms, unit)
    return bench.Table(title + "; per call from Python until the GPU is done", unit, rows, ceiling=ceiling,
                       ceiling_label="preallocated kernel", peak_kind="fp8" if unit == "TFLOP/s" else "fp32")


def _quantize_tables(rng) -> list[bench.Table]:
    M, K = quantize_fine.BENCH_SHAPE
    x = rng.standard_normal((M, K), dtype=np.float32)
    dx = cuda.to_device(x)
    codes = cuda.device_array((M, K), np.uint8)
    scale = cuda.device_array(spec.scale_shape("tile", (M, K)), np.float32)
    q = quant.quantize(dx, granularity="tile")
    y = cuda.device_array((M, K), np.float32)
    return [_pair(f"tile quantize, x ({M}, {K}) float32", "GB/s", x.nbytes + x.size + scale.nbytes,
                  lambda: quantize_fine.quantize_tile(dx, codes, scale), lambda: quant.quantize(dx, granularity="tile"),
                  "quantize_tile(x, codes, scale): outputs preallocated", "fl.quantize(x, granularity='tile')"),
            _pair(f"tile dequantize to ({M}, {K}) float32", "GB/s", x.size + scale.nbytes + x.nbytes,
                  lambda: quantize_fine.dequantize(q.data, q.scale, 1, 128, y), lambda: quant.dequantize(q),
                  "dequantize(codes, scale, 1, 128, out): preallocated", "fl.dequantize(q)")]


def timings(rng, args) -> list[bench.Table]:
    """fl.quantize / fl.dequantize on quantize_fine's 1.09 GiB activation, fl.fp8_gemm at 4096^3."""
    tables = _quantize_tables(rng)  # its arrays are freed (back to the pool) on return
    n = 4096
    qa, qb = fp8_gemm_module.random_operands(rng, n, n, n, on_device=True)
    out = cuda.device_array((n, n), np.float32)
    tables.append(_pair(f"FP8 GEMM {n}x{n}x{n}, A 1x128 tiles, B 128x128 blocks", "TFLOP/s", 2.0 * n**3,
                        lambda: fp8_gemm_module.fp8_gemm(qa, qb, out=out), lambda: fp8_gemm_module.fp8_gemm(qa, qb),
                        "fp8_gemm(qa, qb, out=y): preallocated", "fl.fp8_gemm(qa, qb)"))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
