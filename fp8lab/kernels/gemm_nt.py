"""GEMM in the Linear-layer "NT" layout: c[m, n] = sa * sb * sum_k a[m, k] * b[n, k], FP32 accumulation.

a is (M, K) and b is (N, K), both row-major with K contiguous: the layout of activations and of a Linear
weight stored (out, in), and DeepGEMM's "NT". Operands are float32 (the FP32 recipe; scales are 1) or E4M3
codes (uint8) with per-tensor scales. Codes are decoded through a 256-entry table, and the two per-tensor
scales multiply each finished sum: matrices are never dequantized into global memory first (the original
CUDA program did that, and allocated and freed the buffers in every call).

version 1: one thread per output, reading a and b from global memory (every operand read N or M times).
version 2: TILE x TILE shared-memory tiles; each element is read from global memory once per tile and decoded
           once on load; the b tile is padded to TILE + 1 columns so the inner loop has no bank conflicts.

Both add the products in k order, so they round identically; a GPU may fuse multiply-add (one rounding
per step), which NumPy's reference does not: compare with a tolerance, not bit for bit.
"""

from __future__ import annotations

import numpy as np

from .. import bench
from ..numerics import formats, spec
from ..device import runtime
from ..bench import timing
from ..device.runtime import cuda
from .versions import Version

TILE = runtime.per_backend({"sim": 8, "gpu": 16})  # 64 Python threads a block under the simulator
TILE_PAD = TILE + 1  # shared-array shapes must be compile-time constants: no arithmetic inside the kernel


def _make_kernel1(fp8: bool):
    @cuda.jit
    def gemm_nt_kernel1(a, sa, b, sb, lut, c):
        n, m = cuda.grid(2)
        if m < c.shape[0] and n < c.shape[1]:
            acc = np.float32(0)
            for k in range(a.shape[1]):
                if fp8:
                    acc += lut[a[m, k]] * lut[b[n, k]]
                else:
                    acc += a[m, k] * b[n, k]
            c[m, n] = acc * sa[0] * sb[0]

    return gemm_nt_kernel1


def _make_kernel2(fp8: bool):
    @cuda.jit
    def gemm_nt_kernel2(a, sa, b, sb, lut, c):
        ta = cuda.shared.array((TILE, TILE), np.float32)
        tb = cuda.shared.array((TILE, TILE_PAD), np.float32)  # +1: column reads hit TILE different banks
        table = cuda.shared.array(256, np.float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        m = cuda.blockIdx.y * TILE + ty
        n = cuda.blockIdx.x * TILE + tx
        n_load = cuda.blockIdx.x * TILE + ty  # b rows are loaded with k along threadIdx.x: coalesced
        if fp8:
            for i in range(ty * TILE + tx, 256, TILE * TILE):
                table[i] = lut[i]
            cuda.syncthreads()
        M, K = a.shape
        N = b.shape[0]
        acc = np.float32(0)
        for k0 in range(0, K, TILE):
            k = k0 + tx
            va = np.float32(0)
            vb = np.float32(0)
            if m < M and k < K:
                va = table[a[m, k]] if fp8 else a[m, k]
            if n_load < N and k < K:
                vb = table[b[n_load, k]] if fp8 else b[n_load, k]
            ta[ty, tx] = va
            tb[ty, tx] = vb
            cuda.syncthreads()
            for kk in range(TILE):
                acc += ta[ty, kk] * tb[tx, kk]
            cuda.syncthreads()
        if m < M and n < N:
            c[m, n] = acc * sa[0] * sb[0]

    return gemm_nt_kernel2


def _kinds(make):
    """{operand kind: the kernel `make` builds for it}: float32 operands, or E4M3 codes decoded through a table."""
    return {"float32": make(False), "e4m3": make(True)}


VERSIONS = {  # kernel: {"float32": kernel, "e4m3": kernel}, by operand kind
    1: Version("naive: one thread per output, operands from global memory", _kinds(_make_kernel1)),
    2: Version("TILE x TILE shared-memory tiles, decode on load, padded b tile", _kinds(_make_kernel2)),
}
BEST = 2

def _const(name):
    """Device-resident constants made once per process: the E4M3 decode table ("lut") and a unit scale ("one")."""
    make = {"lut": lambda: formats.value_table(formats.E4M3), "one": lambda: np.ones(1, np.float32)}[name]
    return runtime.cached(("gemm_nt", name), lambda: cuda.to_device(make()))


def launch(a, sa, b, sb, out, version: int = BEST) -> None:
    """out (M, N) = sa * sb * a @ b.T on device arrays; a, b float32 or uint8 E4M3 codes (same kind)."""
    kind = "e4m3" if np.dtype(a.dtype) == np.uint8 else "float32"
    if kind == "float32":
        sa = sb = _const("one")
    M, N = out.shape
    grid = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE)
    VERSIONS[version].kernel[kind][grid, (TILE, TILE)](a, sa, b, sb, _const("lut"), out)


def reference(a, b, sa=1.0, sb=1.0, fp8=False):
    """float64 NumPy spec of the same product (codes decoded exactly when fp8)."""
    if fp8:
        a = formats.decode(a, formats.E4M3)
        b = formats.decode(b, formats.E4M3)
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64).T) * float(sa) * float(sb)


def _operands(rng, M, N, K):
    """{kind: (a, b, sa, sb)}: float32 operands, and their per-tensor E4M3 codes and scales (spec)."""
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((N, K), dtype=np.float32)
    qa, sa, _ = spec.quantize_tensor(a)
    qb, sb, _ = spec.quantize_tensor(b)
    return {"float32": (a, b, 1, 1), "e4m3": (qa, qb, sa, sb)}


def checks(rng) -> list:
    M, N, K = (20, 24, 40) if runtime.IS_SIM else (2051, 2053, 2055)
    out = []
    for kind, (ha, hb, s1, s2) in _operands(rng, M, N, K).items():
        ref = reference(ha, hb, s1, s2, fp8=kind == "e4m3")
        da, db = cuda.to_device(ha), cuda.to_device(hb)
        dsa, dsb = cuda.to_device(np.array([s1], np.float32)), cuda.to_device(np.array([s2], np.float32))
        # FP32 sums of K products: the error grows like sqrt(K) * eps * sum |a * b|
        scale = np.abs(ha if kind == "float32" else formats.decode(ha)).mean() * np.abs(
            hb if kind == "float32" else formats.decode(hb)).mean() * float(s1) * float(s2)
        for v in VERSIONS:
            got = bench.poisoned((M, N), np.float32)
            launch(da, dsa, db, dsb, got, v)
            bench.assert_close(f"{kind} v{v}", got.copy_to_host(), ref, atol=1e-5 * K * scale, rtol=1e-5)
            out.append((f"{kind} v{v} {M}x{N}x{K}", "within tolerance of float64"))
    return out


def timings(rng, args) -> list:
    """Both versions at 4096^3, float32 and E4M3, against torch in the same dtype (cuBLAS) in the same run."""
    M = N = K = 4096
    flops = 2.0 * M * N * K
    torch = bench.torch_cuda()
    tables = []
    for kind, (ha, hb, s1, s2) in _operands(rng, M, N, K).items():
        da, db = cuda.to_device(ha), cuda.to_device(hb)
        dsa, dsb = cuda.to_device(np.array([s1], np.float32)), cuda.to_device(np.array([s2], np.float32))
        out = cuda.device_array((M, N), np.float32)
        rows = [bench.Row(f"{kind} v{v}: {desc}",
                          timing.time_ms(lambda v=v: launch(da, dsa, db, dsb, out, v), repeat=5), flops)
                for v, desc in VERSIONS.items()]
        ceiling, label = None, "cuBLAS"
        if torch is not None:
            if kind == "float32":
                torch.backends.cuda.matmul.allow_tf32 = False
                ta, tb = torch.from_numpy(ha).cuda(), torch.from_numpy(hb).cuda()
                label = "torch float32 a @ b.T (cuBLAS SGEMM, TF32 off)"
                ms = timing.torch_time_ms(torch, lambda: ta @ tb.T)
            else:
                a8 = torch.from_numpy(ha).cuda().view(torch.float8_e4m3fn)
                b8 = torch.from_numpy(hb).cuda().view(torch.float8_e4m3fn)
                one = torch.ones((), device="cuda")
                label = "torch._scaled_mm e4m3 (cuBLAS, FP8 tensor cores)"
                ms = timing.torch_time_ms(torch, lambda: torch._scaled_mm(a8, b8.t(), one, one,
                                                                          out_dtype=torch.float32))
            rows.append(bench.Row(label, ms, flops))
            ceiling = bench.rate(flops, ms, "TFLOP/s")
        tables.append(bench.Table(f"NT GEMM {M}x{N}x{K}, {kind} operands", "TFLOP/s", rows, ceiling=ceiling,
                                  ceiling_label=f"torch {kind}", peak_kind="fp32" if kind == "float32" else "fp8"))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
