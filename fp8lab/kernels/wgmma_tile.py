"""The simplest FP8 GEMM on Hopper's tensor cores: y = scale * decode(a) @ decode(b).T, one wgmma tile per block.

a (M, K) and b (N, K) are E4M3 codes, K-major (b is a Linear weight stored (out, in)), with per-tensor scales sa and
sb ((1, 1) float32 each: x ~= decode(code) * scale); y (M, N) is float32. Lecture 07 ends with this kernel; lecture
08 feeds the same instruction with fp8_gemm versions 4-7 (cp.async stages, a pipeline, overlap, persistence).

version 1: one warpgroup (128 threads) per 64 x 128 output tile. For each K-group of 128: plain loads copy the
           a and b codes into 128-byte-swizzled shared tiles, a proxy fence and a barrier publish them, four wgmma
           m64n128k32 (one per 32 of K) read them through descriptors, commit, wait; the K-group's partial sum is
           added to an FP32 total on the CUDA cores (DeepSeek-V3's promotion). No pipeline: copies and tensor cores
           take turns.

Under the simulator the wgmma twin (fp8lab.device.ptx) sums each K-group in FP32 in k order, so the kernel is
bit-exact with `reference`. On a GPU the tensor core keeps 13 mantissa bits inside a K-group (kernels/tc_accum.py
measures it): checked against float64 within `error_bound`.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..device import ptx, runtime
from ..device.runtime import cuda
from ..numerics import formats, spec
from ..numerics.spec import GROUP_K
from .common import make_store_wgmma
from .versions import Version, check_device

TILE_M, TILE_N, TILE_K = 64, 128, GROUP_K  # one wgmma m64n128 tile; K staged one K-group (128 bytes) at a time
THREADS = 128  # one warpgroup
REGS = TILE_N // 2  # float32 accumulators per thread of an m64n128 wgmma (ptx.wgmma_d_layout)
A_TILE, B_TILE = TILE_M * TILE_K, TILE_N * TILE_K  # the two swizzled tiles, rows of 128 bytes
SMEM = A_TILE + B_TILE + 1024  # + slack to align the tiles to 1024 bytes (where the swizzle pattern repeats)

U8 = runtime.numba_type("uint8")  # dynamic shared arrays take a numba type (the simulator reads its itemsize)

wgmma = ptx.wgmma_m64k32(TILE_N, "e4m3", "e4m3")  # D (64 x 128) (+)= A (64 x 32) B (32 x 128), E4M3 from shared memory
fence = ptx.wgmma_fence(REGS)  # wgmma.fence: the accumulators, ordered before the wgmma that reads them
wait_all = ptx.wgmma_wait_group(0, REGS)  # wgmma.wait_group 0: every committed wgmma done, accumulators readable
store_tile = make_store_wgmma(TILE_N)  # this thread's 64 outputs of the tile, edges masked


@cuda.jit
def wgmma_tile_kernel(a, sa, b, sb, c):
    """Block THREADS = 128 (one warpgroup), grid (ceil(N / 128), ceil(M / 64)): the 64 x 128 tile of c at rows
    64 blockIdx.y, columns 128 blockIdx.x. Shared memory: a's tile (64 rows of 128 bytes), then b's (128 rows)."""
    smem = cuda.shared.array(0, U8)
    part = cuda.local.array(REGS, np.float32)   # one K-group's sum, written by the tensor core
    total = cuda.local.array(REGS, np.float32)  # the FP32 sum over K-groups, on the CUDA cores
    M, K = a.shape
    N = b.shape[0]
    tid = cuda.threadIdx.x
    m0, n0 = cuda.blockIdx.y * TILE_M, cuda.blockIdx.x * TILE_N
    base = ptx.shared_address(smem)
    pad = (1024 - base % 1024) % 1024
    a_bytes, b_bytes = TILE_M * TILE_K, TILE_N * TILE_K  # the two tiles, rows of 128 bytes
    for o in range(REGS):
        total[o] = 0.0
    # K-major tiles: 8-row atoms of 128-byte rows, 1024 bytes apart (the stride offset); 1 = the 128-byte swizzle
    desc_a = ptx.smem_descriptor(base + pad, 16, 1024, 1)
    desc_b = ptx.smem_descriptor(base + pad + a_bytes, 16, 1024, 1)
    for k0 in range(0, K, TILE_K):
        # byte k of row r goes where the swizzle puts it; zeros (code +0) past the edges of a, b and K
        for i in range(tid, a_bytes, THREADS):
            r, k = i // TILE_K, i % TILE_K
            v = np.uint8(0)
            if m0 + r < M and k0 + k < K:
                v = a[m0 + r, k0 + k]
            smem[pad + ptx.swizzle_128b(i)] = v
        for i in range(tid, b_bytes, THREADS):
            r, k = i // TILE_K, i % TILE_K
            v = np.uint8(0)
            if n0 + r < N and k0 + k < K:
                v = b[n0 + r, k0 + k]
            smem[pad + a_bytes + ptx.swizzle_128b(i)] = v
        ptx.fence_proxy_async()  # the stores above, visible to the tensor core (it reads through the async proxy)
        cuda.syncthreads()       # ... and every thread's stores, not only this one's
        fence(part)
        for kk in range(TILE_K // 32):  # a k-slice of 32 codes starts 32 bytes further: + 2 (32 >> 4) in the descriptor
            wgmma(part, smem, desc_a + 2 * kk, desc_b + 2 * kk, kk)  # scale-d 0 first: part = A B, then +=
        ptx.wgmma_commit_group()
        wait_all(part)
        for o in range(REGS):
            total[o] += part[o]  # promotion: the K-group's partial sum leaves the tensor core
        cuda.syncthreads()  # every wgmma has read the tiles before the next K-group overwrites them
    s = sa[0, 0] * sb[0, 0]
    for o in range(REGS):
        total[o] = total[o] * s
    row0 = m0 + 16 * (tid // 32) + (tid % 32) // 4  # this thread's rows: row0, row0 + 8 (ptx.wgmma_d_layout)
    store_tile(c, total, row0, n0, tid % 4, M, N)


def _launch(a, sa, b, sb, out):
    M, N = out.shape
    grid = ((N + TILE_N - 1) // TILE_N, (M + TILE_M - 1) // TILE_M)
    runtime.launch_with_shared(VERSIONS[1].kernel, grid, THREADS, SMEM, a, sa, b, sb, out)


VERSIONS = {
    1: Version("one warpgroup per 64 x 128 tile: plain loads into swizzled shared tiles, 4 wgmma m64n128k32 per "
               "K-group, no pipeline", wgmma_tile_kernel, needs=ptx.WGMMA, traits={"tensor_cores"},
               sim_cost=runtime.SimCost(0.05, 1.5e-7, 0, tile=(TILE_M, TILE_N, TILE_K), names="M x N x K = ")),
}
BEST = 1


def _scale(name, s):
    s = V.array(name, runtime.to_host(s), dtype=np.float32)
    if s.size != 1:
        raise ValueError(f"{name} must be one per-tensor scale (a float32 array of one element), got shape {s.shape}")
    return s.reshape(1, 1)


def gemm(a_codes, sa, b_codes, sb, out=None, version=None):
    """y (M, N) float32 = sa * sb * decode(a) @ decode(b).T on the tensor cores (wgmma; sm_90 or the simulator).
    a_codes (M, K) and b_codes (N, K): E4M3 codes (uint8, NumPy or device arrays); sa, sb: per-tensor scales (one
    float32 each). out: a device array (M, N) float32 to write, else one is made. Returns out (a device array)."""
    version = V.version("version", version, VERSIONS, default=BEST)
    check_device(VERSIONS, version)
    a = V.array("a_codes", runtime.to_host(a_codes), dtype=np.uint8, ndim=2)
    b = V.array("b_codes", runtime.to_host(b_codes), dtype=np.uint8, ndim=2)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a_codes and b_codes must share K (both K-major: (M, K) and (N, K)), got {a.shape} and "
                         f"{b.shape}")
    shape = (a.shape[0], b.shape[0])
    if out is None:
        out = cuda.device_array(shape, np.float32)
    elif getattr(out, "shape", None) != shape or np.dtype(getattr(out, "dtype", None)) != np.float32:
        raise ValueError(f"out must be a float32 device array of shape {shape}, got {V.describe(out)}")
    _launch(cuda.to_device(np.ascontiguousarray(a)), cuda.to_device(_scale("sa", sa)),
            cuda.to_device(np.ascontiguousarray(b)), cuda.to_device(_scale("sb", sb)), out)
    return out


def reference(a_codes, sa, b_codes, sb) -> np.ndarray:
    """The kernel's arithmetic in its order, float32 (bit-exact with the simulator's twins): per K-group of 128, the
    partial sum of the products in k order; total += partial; y = total * (sa * sb)."""
    A, B = formats.decode(np.asarray(a_codes, np.uint8)), formats.decode(np.asarray(b_codes, np.uint8))
    total = np.zeros((A.shape[0], B.shape[0]), np.float32)
    for k0 in range(0, A.shape[1], TILE_K):
        part = np.zeros_like(total)
        for k in range(k0, min(k0 + TILE_K, A.shape[1])):
            part = part + np.outer(A[:, k], B[:, k])  # products of two E4M3 values are exact in float32
        total = total + part
    return total * (np.float32(np.asarray(sa).reshape(-1)[0]) * np.float32(np.asarray(sb).reshape(-1)[0]))


def error_bound(a_codes, sa, b_codes, sb) -> np.ndarray:
    """|y - float64| allowed on a GPU: FP32 sums ((K + 2) * 2^-23 of sum |a b|) plus 2^-9 of sum |a b| for the
    tensor core's 13-bit truncating accumulator inside each K-group (the bound fp8_gemm's tensor-core versions use;
    a wrong fragment, swizzle or descriptor is off by whole products)."""
    A = np.abs(formats.decode(np.asarray(a_codes, np.uint8)).astype(np.float64))
    B = np.abs(formats.decode(np.asarray(b_codes, np.uint8)).astype(np.float64))
    s = abs(float(np.asarray(sa).reshape(-1)[0]) * float(np.asarray(sb).reshape(-1)[0]))
    return ((A.shape[1] + 2) * 2.0**-23 + 2.0**-9) * (A @ B.T) * s + 1e-30


def random_operands(rng, M, N, K):
    """E4M3 codes of N(0, 1) values quantized with per-tensor scales: (a_codes, sa, b_codes, sb), NumPy arrays."""
    out = []
    for rows in (M, N):
        x = rng.standard_normal((rows, K), dtype=np.float32) * np.float32(rng.uniform(0.5, 4.0))
        codes, scale = spec.quantize_tensor(x)[:2]
        out += [codes, np.asarray(scale, np.float32).reshape(1, 1)]
    return tuple(out)


# ----------------------------------------------------------------------------------------------------------------
# python -m fp8lab.kernels.wgmma_tile
# ----------------------------------------------------------------------------------------------------------------

SHAPES = ((70, 130, 300), (64, 128, 128), (5, 9, 33))
"""Checked shapes: rows and columns past one tile, a partial last K-group; exactly one tile; smaller than a tile."""


def checks(rng, only=None) -> list:
    """Version 1 (when in `only`: bench.selected) on fresh random operands of SHAPES (on a GPU also 1000 x 777 x 1100),
    output poisoned with NaN: under the simulator bit for bit against `reference`, on a GPU within `error_bound` of
    float64."""
    out = []
    shapes = SHAPES if runtime.IS_SIM else SHAPES + ((1000, 777, 1100),)
    for v in (v for v in VERSIONS if bench.selected(only, v)):
        for M, N, K in shapes:
            a, sa, b, sb = random_operands(rng, M, N, K)
            y = bench.poisoned((M, N), np.float32)
            gemm(a, sa, b, sb, out=y, version=v)
            y = y.copy_to_host()
            if np.isnan(y).any():
                raise AssertionError(f"v{v} {M}x{N}x{K}: {int(np.isnan(y).sum())} outputs are NaN (never written)")
            if runtime.IS_SIM:
                ref = reference(a, sa, b, sb)
                n_bad, bad = bench.first_mismatches(y, ref, atol=0, rtol=0, limit=3)
                if n_bad:
                    raise AssertionError(f"v{v} {M}x{N}x{K}: {n_bad} outputs differ from the reference, e.g. {bad}")
                how = "bit-exact with reference"
            else:
                ex = formats.decode(a).astype(np.float64) @ formats.decode(b).astype(np.float64).T
                ex *= float(sa[0, 0]) * float(sb[0, 0])
                err = np.abs(y - ex)
                if not (err <= error_bound(a, sa, b, sb)).all():
                    raise AssertionError(f"v{v} {M}x{N}x{K}: error {err.max():.3g} beyond error_bound")
                how = "within error_bound of float64"
            out.append((f"v{v} {M}x{N}x{K}", how))
    return out


def timings(rng, args) -> list:
    """Version 1 at 4096^3 next to cuBLAS's per-tensor FP8 GEMM (torch._scaled_mm) in the same run, when installed
    (not with args.only)."""
    only = getattr(args, "only", None)
    M = N = K = 4096
    flops = 2.0 * M * N * K
    a, sa, b, sb = random_operands(rng, M, N, K)
    da, db = cuda.to_device(a), cuda.to_device(b)
    dsa, dsb = cuda.to_device(sa), cuda.to_device(sb)
    out = cuda.device_array((M, N), np.float32)
    rows = [bench.Row(f"v{v}: {VERSIONS[v]}", timing.time_ms(lambda: gemm(da, dsa, db, dsb, out=out, version=v)),
                      flops) for v in VERSIONS if bench.selected(only, v)]
    ceiling = None
    torch = bench.torch_cuda()
    if torch is not None and only is None:
        ta = torch.as_tensor(da, device="cuda").view(torch.float8_e4m3fn)
        tb = torch.as_tensor(db, device="cuda").view(torch.float8_e4m3fn)
        ts, tt = torch.as_tensor(dsa, device="cuda").reshape(()), torch.as_tensor(dsb, device="cuda").reshape(())
        ms = timing.torch_time_ms(torch, lambda: torch._scaled_mm(ta, tb.t(), ts, tt, out_dtype=torch.float32))
        rows.append(bench.Row("torch._scaled_mm, tensorwise, float32 out (cuBLAS)", ms, flops))
        ceiling = bench.rate(flops, ms, "TFLOP/s")
    return [bench.Table(f"FP8 GEMM {M}x{N}x{K}, per-tensor scales, float32 out", "TFLOP/s", rows, ceiling=ceiling,
                        ceiling_label="cuBLAS FP8 tensorwise", peak_kind="fp8")]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
