"""Check, then time (bench.main): `checks` runs every version and the backward against the references on small
odd shapes, `timings` times them on a GPU against a copy and PyTorch."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...bench import timing
from ...device import runtime
from ...device.runtime import cuda
from ...numerics import spec
from ...numerics.spec import POISON_CODE
from .host import BEST, VERSIONS, backward, forward
from .layout import E4M3_MAX, EPS, TILE
from .references import dx_error_scale, reference, reference_backward, reference_rstd

RSTD_RTOL = 1e-5
"""rstd against float64. The sum of squares is a float32 sum of positive terms, so its relative error is at most
(terms per thread + reduction levels) units of 2^-24: 64 (3.8e-6) at worst here (version 1, 128 threads, N = 7172),
half of that in rstd (a square root), plus four roundings (mean, eps, sqrt, division)."""
DX_TOL = 2.0**-17
"""dx against float64, relative to `dx_error_scale`: 128 units of 2^-24. For N up to 8192 the backward's dot is a
float32 sum of at most 16 terms per thread and 9 reduction levels (at most 25 units of sum |dz g y|), and each term
of dx adds a few roundings: about 40 units at worst."""
GY_RTOL = 2.0**-22
"""gy = (dz * y) * rstd: two float32 roundings, at most 2 units of 2^-24 relative to float64; 4 allowed."""

CHECK_SHAPES = {"sim": ((5, 300, True), (3, 129, False), (7, 1024, False)),
                "gpu": ((1027, 7172, True), (515, 1029, False), (1031, 7168, False), (2053, 1540, True))}
"""(M, N, bias) for the checks: the first N a multiple of 4 (16-byte path) but not of 128, the second not of 4
(scalar path; versions 3 and 4 run version 2), the third a row version 3's layout covers exactly (no bounds code),
with a NaN in row 1 (which poisons that row only); version 4's warp-per-row kernel runs the rows of N <= 2048 with
N % 4 == 0 (300 and 1024 under the simulator, 1540 on a GPU, where M is not a multiple of its 8 rows a block)."""
BENCH_SHAPES = ((4096, 512), (16384, 1024), (16384, 7168))
"""Timed shapes (M, N): the capstone's default step (4096 windows a step, width 512: 8 MiB of x, so launch and
ramp-up weigh), 16384 rows of width 1024 (issue 13's example of a realistic size) and of width 7168 (DeepSeek-V3's
hidden size)."""


def make_inputs(rng, M: int, N: int, bias: bool = True):
    """(x, b, g, dz) float32 with a spread of magnitudes: rows scaled by 10^[-3, 3], columns by 10^[-1, 1], 1% of
    the elements 50x larger (LLM-like outliers), gains of both signs; never all zero. b is None without bias."""
    row = 10.0 ** rng.uniform(-3, 3, (M, 1))
    col = 10.0 ** rng.uniform(-1, 1, N)
    x = rng.standard_normal((M, N)) * row * col
    x[rng.random((M, N)) < 0.01] *= 50
    b = (0.05 * rng.standard_normal(N)).astype(np.float32) if bias else None
    g = rng.uniform(0.25, 2.0, N) * np.where(rng.random(N) < 0.1, -1, 1)
    dz = rng.standard_normal((M, N)) * 10.0 ** rng.uniform(-2, 2, (M, 1))
    return x.astype(np.float32), b, g.astype(np.float32), dz.astype(np.float32)


def checks(rng) -> list:
    """Every version and the backward on CHECK_SHAPES, outputs poisoned: codes, scales and z bit for bit against
    `reference` given the kernel's rstd, rstd against float64 (a NaN row: NaN rstd and scales, poisoned codes), dx
    and gy against `reference_backward`."""
    out = []
    for k, (M, N, bias) in enumerate(CHECK_SHAPES["sim" if runtime.IS_SIM else "gpu"]):
        x, b, g, dz = make_inputs(rng, M, N, bias)
        nan_row = k == 2
        if nan_row:
            x[1, 7] = np.nan
        x_d, g_d = cuda.to_device(x), cuda.to_device(g)
        b_d = None if b is None else cuda.to_device(b)
        ref_r = reference_rstd(x, b)
        for v in VERSIONS:
            codes, scales = bench.poisoned((M, N), np.uint8), bench.poisoned((M, -(-N // TILE)), np.float32)
            rstd, z = bench.poisoned(M, np.float32), bench.poisoned((M, N), np.float32)
            forward(x_d, b_d, g_d, codes, scales, rstd, z, version=v)
            r = rstd.copy_to_host()
            bench.assert_close(f"v{v} rstd", r, ref_r, atol=0, rtol=RSTD_RTOL)
            ref_codes, ref_scales, _, ref_z = reference(x, b, g, r)
            bench.assert_codes_equal(f"v{v} codes", codes.copy_to_host(), ref_codes)
            assert np.array_equal(scales.copy_to_host(), ref_scales, equal_nan=True), f"v{v}: scales differ"
            assert np.array_equal(z.copy_to_host(), ref_z, equal_nan=True), f"v{v}: z differs"
            if nan_row:
                assert np.isnan(r[1]) and (codes.copy_to_host()[1] == POISON_CODE).all(), f"v{v}: NaN row"
            out.append((f"v{v} forward, {M}x{N}, {'bias' if bias else 'no bias'}{', a NaN row' if nan_row else ''}",
                        "codes, scales, z bit-exact; rstd within tolerance"))
        dx, gy = bench.poisoned((M, N), np.float32), bench.poisoned((M, N), np.float32)
        backward(cuda.to_device(dz), x_d, b_d, g_d, rstd, dx, gy)
        ref_dx, ref_gy = reference_backward(dz, x, b, g, r)
        scale = dx_error_scale(dz, x, b, g, r)
        bench.assert_close("backward dx", dx.copy_to_host() / scale, ref_dx / scale, atol=DX_TOL, rtol=0)
        bench.assert_close("backward gy", gy.copy_to_host(), ref_gy, atol=0, rtol=GY_RTOL)
        out.append((f"backward, {M}x{N}", "dx, gy within tolerance of float64"))
    return out


def torch_norm_quantize(torch, tx, tb, tg):
    """A straightforward PyTorch peer: bias add, RMSNorm, then DeepGEMM-style 1x128 tile quantization (N a multiple
    of 128): (codes as float8_e4m3fn, scales, rstd). Divisions by 448 go through a 0-dim tensor on the GPU
    (quantize_fine.torch_tile_quantize says why)."""
    y = tx + tb
    rstd = torch.rsqrt(y.square().mean(dim=1, keepdim=True) + float(EPS))
    z = y * rstd * tg
    M, N = z.shape
    zv = z.view(M, N // TILE, TILE)
    amax = zv.abs().amax(dim=2, keepdim=True).clamp(min=float(spec.AMAX_FLOOR))
    fp8_max = torch.full((), E4M3_MAX, device=tx.device)
    codes = (zv * (fp8_max / amax)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn).view(M, N)
    return codes, (amax / fp8_max).view(M, N // TILE), rstd


def timings(rng, args) -> list:
    """Every version, versions 2-4 without a bias too, version 2 with z also written, the backward and PyTorch
    on BENCH_SHAPES.
    Bytes that must move: forward x read, b and g read, codes, scales and rstd written (z too where written);
    backward dz and x read, b, g and rstd read, dx and gy written."""
    tables = []
    torch = bench.torch_cuda()
    for M, N in BENCH_SHAPES:
        x = rng.standard_normal((M, N), dtype=np.float32)
        x[rng.random((M, N)) < 0.01] *= 50
        b = (0.05 * rng.standard_normal(N)).astype(np.float32)
        g = rng.uniform(0.5, 1.5, N).astype(np.float32)
        dz = rng.standard_normal((M, N), dtype=np.float32)
        x_d, b_d, g_d, dz_d = (cuda.to_device(a) for a in (x, b, g, dz))
        codes = cuda.device_array((M, N), np.uint8)
        scales = cuda.device_array((M, N // TILE), np.float32)
        rstd, z = cuda.device_array(M, np.float32), cuda.device_array((M, N), np.float32)
        dx, gy = cuda.device_array((M, N), np.float32), cuda.device_array((M, N), np.float32)
        small = b.nbytes + g.nbytes + rstd.nbytes
        fwd_bytes = x.nbytes + codes.size + scales.nbytes + small
        rows = [bench.time_row(f"v1 forward: {VERSIONS[1]}",  # z: version 1's intermediate, allocated once
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, z, version=1), fwd_bytes,
                               launch=True),
                bench.time_row(f"v2 forward: {VERSIONS[2]}",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, version=2), fwd_bytes, launch=True),
                bench.time_row(f"v3 forward: {VERSIONS[3]}",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, version=3), fwd_bytes, launch=True),
                bench.time_row(f"v4 forward: {VERSIONS[4]}",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, version=4), fwd_bytes, launch=True),
                bench.time_row("v2 forward, no bias (bytes without b)",
                               lambda: forward(x_d, None, g_d, codes, scales, rstd, version=2), fwd_bytes - b.nbytes,
                               launch=True),
                bench.time_row("v3 forward, no bias (bytes without b)",
                               lambda: forward(x_d, None, g_d, codes, scales, rstd, version=3), fwd_bytes - b.nbytes,
                               launch=True),
                bench.time_row("v4 forward, no bias (bytes without b)",
                               lambda: forward(x_d, None, g_d, codes, scales, rstd, version=4), fwd_bytes - b.nbytes,
                               launch=True),
                bench.time_row("v2 forward, z also written (bytes include z)",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, z, version=2), fwd_bytes + z.nbytes,
                               launch=True),
                bench.time_row("backward: one block per row, y and dz in registers",
                               lambda: backward(dz_d, x_d, b_d, g_d, rstd, dx, gy), 4 * x.nbytes + small, launch=True)]
        if torch is not None:
            tx, tb, tg = (torch.from_numpy(a).cuda() for a in (x, b, g))
            tcodes, _, _ = torch_norm_quantize(torch, tx, tb, tg)
            forward(x_d, b_d, g_d, codes, scales, rstd, version=BEST)
            same = float((tcodes.view(torch.uint8).cpu().numpy() == codes.copy_to_host()).mean())
            rows.append(bench.time_row(f"torch: y, rsqrt, z, amax, .to(float8_e4m3fn) ({same:.2%} of codes equal)",
                                       lambda: torch_norm_quantize(torch, tx, tb, tg), fwd_bytes,
                                       timer=lambda fn: timing.torch_time_ms(torch, fn), launch=True))
        tables.append(bench.Table(f"bias + RMSNorm + 1x128 E4M3 quantize, x ({M}, {N}) float32; bytes = what must "
                                  "move (read + written)", "GB/s", rows, ceiling=bench.copy_ceiling_gbs(x.nbytes)))
    return tables
