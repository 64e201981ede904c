"""fp8_gemm's timings (GPU only): every version against cuBLAS's FP8 GEMMs (torch._scaled_mm) and a DeepSeek-style
Triton kernel where installed, measured in the same run, each with its normwise error against float64; and the
accuracy of _scaled_mm's fast accumulation against the emulated FP22 accumulator."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...bench import timing
from ...device.runtime import cuda
from ...numerics import accum, formats, spec
from ...numerics.spec import GROUP_K
from .checks import random_operands
from .host import fp8_gemm
from .reference import decoded, expanded_scales, reference64
from .table import TENSOR_CORE_VERSIONS, VERSIONS

OPTIONS = {"--deepseek": dict(action="store_true", help="also time the best version once at M, N, K = 4096, 7168, "
                                                         "16384 (about two minutes of GPU time)")}


def _torch_fast_accum_stats(torch, rng, ks, M=256, N=256):
    """Max/mean relative error of torch._scaled_mm (fast accum on/off) vs float64 on the same FP8 inputs,
    next to the emulator's FP22 model with and without promotion (on a 64 x 64 corner)."""
    rows = []
    for K in ks:
        a = rng.random((M, K), dtype=np.float32)  # positive inputs, as error_vs_k's "uniform"
        b = rng.random((N, K), dtype=np.float32)
        ca = formats.encode(a * spec.FP8_MAX["e4m3"])
        cb = formats.encode(b * spec.FP8_MAX["e4m3"])
        A, B = formats.decode(ca), formats.decode(cb)
        exact = A.astype(np.float64) @ B.astype(np.float64).T
        ta = torch.from_numpy(ca).cuda().view(torch.float8_e4m3fn)
        tb = torch.from_numpy(cb).cuda().view(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        res = {}
        for fast in (True, False):
            y = torch._scaled_mm(ta, tb.t(), one, one, out_dtype=torch.float32, use_fast_accum=fast)
            res[fast] = np.abs(y.cpu().numpy().astype(np.float64) - exact) / np.abs(exact)
        c = slice(0, 64)
        emu = {}
        for lab, p in (("FP22", None), ("FP22+promote128", 128)):
            y = accum.dot_limited(A[c], B[c], 13, promote_every=p)
            emu[lab] = np.abs(y - exact[c, c]) / np.abs(exact[c, c])
        rows.append([K] + [f"{r.max():.2e} / {r.mean():.2e}" for r in (res[True], res[False], emu["FP22"],
                                                                        emu["FP22+promote128"])])
    return rows


def _triton_peer():
    """fp8lab.bench.triton_peer when Triton is installed (a benchmark peer, never a dependency), else None."""
    try:
        from ...bench import triton_peer
    except ImportError:
        return None
    return triton_peer


def _torch_reference64(torch, qa, qb):
    """float64 dequant(qa) @ dequant(qb).T on the GPU (NumPy would take minutes at DeepSeek's shape)."""
    A, B = (torch.from_numpy(decoded(n, q)).cuda().double() for n, q in (("qa", qa), ("qb", qb)))
    (M, K), N = A.shape, B.shape[0]
    for X, q, rows in ((A, qa, M), (B, qb, N)):
        X *= torch.from_numpy(expanded_scales(q, rows, K)).cuda().double().repeat_interleave(GROUP_K, dim=1)[:, :K]
    return A @ B.T


def torch_blockwise(torch, qa, qb):
    """A callable running cuBLAS's blockwise FP8 GEMM (torch._scaled_mm, bfloat16 out) on device operands qa (1 x 128
    tiles) and qb (128 x 128 blocks), or None when N or K is not a multiple of 128 (cuBLAS's blockwise layout:
    scale_a column-major, scale_b transposed)."""
    (M, K), N = qa.data.shape, qb.data.shape[0]
    if K % GROUP_K or N % GROUP_K:
        return None
    ta = torch.as_tensor(qa.data, device="cuda").view(torch.float8_e4m3fn)
    tb = torch.as_tensor(qb.data, device="cuda").view(torch.float8_e4m3fn)
    sa = torch.as_tensor(qa.scale, device="cuda").t().contiguous().t()
    sb = torch.as_tensor(qb.scale, device="cuda").t()
    return lambda: torch._scaled_mm(ta, tb.t(), sa, sb, out_dtype=torch.bfloat16)


def timings(rng, args) -> list:
    """Every version at 4096^3 (and the tensor-core versions at DeepSeek-V3's 4096 x 7168 x 16384 with --deepseek)
    against torch._scaled_mm (cuBLAS FP8, blockwise and per-tensor scales) and a DeepSeek-style Triton kernel when
    installed, measured in the same run, each with its normwise error against the float64 product of the
    dequantized operands; then the accuracy of _scaled_mm's fast accumulation against the emulator. With args.only:
    only those versions at 4096^3 (and --deepseek's shape), no peers."""
    only = getattr(args, "only", None)
    torch = bench.torch_cuda()
    peer = _triton_peer() if torch is not None else None
    shapes = [(4096, 4096, 4096)] + ([(4096, 7168, 16384)] if getattr(args, "deepseek", False) else [])
    tables = []
    for M, N, K in shapes:
        big = M * N * K > 4096**3
        flops = 2.0 * M * N * K
        qa, qb = random_operands(rng, M, N, K, on_device=True)
        out = cuda.device_array((M, N), np.float32)
        if torch is not None:
            ref = _torch_reference64(torch, qa, qb)
            norm = torch.linalg.norm(ref).item()

            def err(y):
                return f"{torch.linalg.norm(torch.as_tensor(y, device='cuda').double() - ref).item() / norm:.2e}"
        else:
            ref = reference64(qa, qb)

            def err(y):
                y = y.copy_to_host() if hasattr(y, "copy_to_host") else y
                return f"{np.linalg.norm(y - ref) / np.linalg.norm(ref):.2e}"

        def row(label, fn, ms):
            out_ = fn()
            return bench.Row(label, ms, flops, {"normwise error": err(out_)})

        rows = []
        for v in (TENSOR_CORE_VERSIONS if big else VERSIONS):
            if not bench.selected(only, v):
                continue

            def run(v=v):
                return fp8_gemm(qa, qb, out=out, version=v)
            rows.append(row(f"v{v}: {VERSIONS[v]}", run, timing.time_ms(run, warmup=0 if big else 1,
                                                                             repeat=1 if big else 3)))
        if not rows:  # args.only has no version timed at this shape
            continue
        ceiling = None
        if torch is not None and only is None:
            ta = torch.as_tensor(qa.data, device="cuda").view(torch.float8_e4m3fn)
            tb = torch.as_tensor(qb.data, device="cuda").view(torch.float8_e4m3fn)
            sa = torch.as_tensor(qa.scale, device="cuda")
            sb = torch.as_tensor(qb.scale, device="cuda")
            if peer is not None:  # a DeepSeek-style Triton kernel: the best of a few tile configurations
                tc = torch.empty((M, N), device="cuda", dtype=torch.float32)
                best = min((timing.torch_time_ms(torch, lambda c=c: peer.fp8_gemm(ta, sa, tb, sb, tc, c)), c)
                           for c in peer.CONFIGS)
                rows.append(row(f"Triton, DeepSeek-V3 inference style (tile {best[1][0]}x{best[1][1]}, "
                                f"{best[1][2]} stages)", lambda: peer.fp8_gemm(ta, sa, tb, sb, tc, best[1]), best[0]))
            blockwise = torch_blockwise(torch, qa, qb)
            if blockwise is not None:
                ms = timing.torch_time_ms(torch, blockwise)
                rows.append(row("torch._scaled_mm, blockwise 1x128 / 128x128, bfloat16 out (cuBLAS)", blockwise, ms))
                ceiling = bench.rate(flops, ms, "TFLOP/s")
            one = torch.ones((), device="cuda")
            ms = timing.torch_time_ms(torch, lambda: torch._scaled_mm(ta, tb.t(), one, one, out_dtype=torch.float32))
            rows.append(bench.Row("torch._scaled_mm, tensorwise (cuBLAS; ignores the scales: speed only)", ms, flops,
                                  {"normwise error": "-"}))
            ceiling = ceiling or bench.rate(flops, ms, "TFLOP/s")
        if torch is not None:
            del ref
            torch.cuda.empty_cache()
        tables.append(bench.Table(f"FP8 GEMM {M}x{N}x{K}, A 1x128 tiles, B 128x128 blocks, float32 out; normwise "
                                  "error = |y - y64| / |y64| (Frobenius) against float64", "TFLOP/s", rows,
                                  ceiling=ceiling, ceiling_label="cuBLAS FP8 blockwise", peak_kind="fp8"))
    if torch is not None and only is None:
        tables.append(bench.Table(
            "torch._scaled_mm vs the emulator: max / mean relative error vs float64, same FP8 inputs (U[0,1) * 448, "
            "per-tensor scale 1)", None, header=["K", "use_fast_accum=True", "use_fast_accum=False", "FP22 model",
                                                 "FP22 + promote 128"],
            cells=_torch_fast_accum_stats(torch, rng, (1024, 2048, 4096, 8192, 16384))))
    return tables
