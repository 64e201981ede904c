"""quantize_fine's harness: `checks` (every kernel bit for bit against the spec) and `timings` (GB/s on a GPU,
against PyTorch's 1x128 tile quantize)."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...bench import timing
from ...device import runtime
from ...device.runtime import cuda
from ...numerics import spec
from ...numerics.spec import AMAX_FLOOR, FP8_MAX
from .dual import quantize_tile_dual
from .requantize import dequantize, requantize_tile_to_col
from .row_block import quantize_block, quantize_row
from .rule import reference
from .tile import BEST, VERSIONS, quantize_mx, quantize_tile


CHECK_SHAPE = {"sim": (6, 300), "gpu": (1027, 7172)}
"""x for the bit-exact checks: no side a multiple of 128, K a multiple of 4 (so version 3 runs)."""
BENCH_SHAPE = (40960, 7168)
"""x for the timings on a GPU: 40960 tokens x DeepSeek-V3's hidden size 7168, float32 = 1.09 GiB."""


def torch_tile_quantize(torch, tx):
    """PyTorch's 1x128 tile quantize (DeepGEMM's per_token_cast_to_fp8, with our AMAX_FLOOR): (codes, scale). Both
    divisions by 448 go through a 0-dim tensor on the GPU, as real divisions (docs/notes/quantize_fine.md says why).
    """
    M, K = tx.shape
    xv = tx.view(M, K // 128, 128)
    amax = xv.abs().amax(dim=2, keepdim=True).clamp(min=float(AMAX_FLOOR))
    fp8_max = torch.full((), FP8_MAX["e4m3"], device=tx.device)
    codes = (xv * (fp8_max / amax)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn).view(M, K)
    return codes, (amax / fp8_max).view(M, K // 128)


def _activation(rng, shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    x[rng.random(shape) < 0.01] *= 50  # a few outliers, like LLM activations
    return x


def _outs(granularity, shape, mx=False):
    sh = spec.scale_shape(granularity, shape)
    return (cuda.device_array(shape, np.uint8), cuda.device_array(sh, np.float32),
            cuda.device_array(sh, np.uint8) if mx else None)


def _kernels(only=None):
    """(label, granularity, mode, launch(dx, outs)) of every kernel the module checks and times: the versions and
    the ops "row", "block", "mx" (both rules), "pow2", "deepgemm", "deepgemm_ue8m0" (DeepGEMM's casts, tile and
    block) that are in `only` (bench.selected; None: all)."""
    ks = [(v, f"v{v}: {desc}", "tile", "amax", lambda dx, o, v=v: quantize_tile(dx, o[0], o[1], version=v))
          for v, desc in VERSIONS.items()]
    ks += [("row", "row: block per row, fused", "row", "amax", lambda dx, o: quantize_row(dx, o[0], o[1])),
           ("block", "block 128x128: block per tile, fused", "block", "amax",
            lambda dx, o: quantize_block(dx, o[0], o[1]))]
    ks += [("mx", f"mx ({rule}): E8M0 scales", "mx", f"mx_{rule}",
            lambda dx, o, rule=rule: quantize_mx(dx, o[0], o[1], o[2], rule=rule)) for rule in ("floor", "ceil")]
    ks += [("pow2", f"tile, pow2 scales (v{BEST})", "tile", "pow2",
            lambda dx, o: quantize_tile(dx, o[0], o[1], mode="pow2"))]
    ks += [(mode, f"{granularity}, DeepGEMM's cast ({mode})", granularity, mode,
            lambda dx, o, mode=mode, g=granularity: (quantize_tile if g == "tile" else quantize_block)(
                dx, o[0], o[1], mode=mode))
           for mode in ("deepgemm", "deepgemm_ue8m0") for granularity in ("tile", "block")]
    return [k[1:] for k in ks if bench.selected(only, k[0])]


def checks(rng, only=None) -> list:
    """Every kernel bit for bit against the spec on CHECK_SHAPE, outputs poisoned. only: the versions and ops
    (those of `_kernels`, "dequantize", "requantize") to check (bench.selected); None: all."""
    M, K = CHECK_SHAPE["sim" if runtime.IS_SIM else "gpu"]
    x = _activation(rng, (M, K))
    dx = cuda.to_device(x)
    out = []
    for label, granularity, mode, launch in _kernels(only):
        o = _outs(granularity, x.shape, mx=granularity == "mx")
        o[0].copy_to_device(np.full(x.shape, 0xA5, np.uint8))
        o[1].copy_to_device(np.full(o[1].shape, np.nan, np.float32))
        launch(dx, o)
        ref_codes, ref_scale, ref_scodes = reference(x, granularity, mode=mode)
        bench.assert_codes_equal(label, o[0].copy_to_host(), ref_codes)
        assert (o[1].copy_to_host() == ref_scale).all(), f"{label}: scales differ"
        if o[2] is not None:
            bench.assert_codes_equal(f"{label} E8M0", o[2].copy_to_host(), ref_scodes)
        out.append((f"{label}, x ({M}, {K})", "bit-exact"))
    codes, scale, _ = reference(x, "tile")
    dcodes, dscale = cuda.to_device(codes), cuda.to_device(scale)
    if bench.selected(only, "dequantize"):
        got = bench.poisoned(x.shape, np.float32)
        dequantize(dcodes, dscale, 1, 128, got)
        assert np.array_equal(got.copy_to_host(), spec.dequantize(codes, scale, 1, 128), equal_nan=True), \
            "dequantize differs"
        out.append(("dequantize (tile)", "bit-exact"))
    if bench.selected(only, "requantize"):
        ct = cuda.to_device(np.full((K, M), 0xA5, np.uint8))
        st = bench.poisoned((K, -(-M // 128)), np.float32)
        requantize_tile_to_col(dcodes, dscale, ct, st)
        ref_ct, ref_st = spec.requantize_tile_to_col(codes, scale)
        bench.assert_codes_equal("requantize", ct.copy_to_host(), ref_ct)
        assert (st.copy_to_host() == ref_st).all(), "requantize: scales differ"
        out.append(("requantize 1x128 -> 128x1", "bit-exact"))
    if bench.selected(only, "dual"):
        got = _dual_outs(M, K)
        for o, fill in zip(got, (0xA5, np.nan, 0xA5, np.nan)):
            o.copy_to_device(np.full(o.shape, fill, o.dtype))
        quantize_tile_dual(dx, *got)
        for label, want, o in (("dual: x", reference(x, "tile"), got[:2]),
                               ("dual: x.T", reference(np.ascontiguousarray(x.T), "tile"), got[2:])):
            bench.assert_codes_equal(label, o[0].copy_to_host(), want[0])
            assert (o[1].copy_to_host() == want[1]).all(), f"{label}: scales differ"
        out.append(("quantize_tile_dual: 1x128 tiles of x and of x.T in one pass", "bit-exact"))
    return out


def _dual_outs(M, K):
    """(codes, scale, codes_t, scale_t) device arrays for quantize_tile_dual of an (M, K) x."""
    return (cuda.device_array((M, K), np.uint8), cuda.device_array((M, -(-K // 128)), np.float32),
            cuda.device_array((K, M), np.uint8), cuda.device_array((K, -(-M // 128)), np.float32))


def timings(rng, args) -> list:
    """Every kernel on a 1.09 GiB activation; bytes = x read + codes written + scales written (+ a second read of
    x and the scale round trip for the two-pass version 1). With args.only, only those versions and ops."""
    only = getattr(args, "only", None)
    M, K = BENCH_SHAPE
    x = _activation(rng, (M, K))
    dx = cuda.to_device(x)
    rows = []
    for label, granularity, mode, launch in _kernels(only):
        o = _outs(granularity, x.shape, mx=granularity == "mx")
        nbytes = x.nbytes + x.size + o[1].nbytes + (o[2].nbytes if o[2] is not None else 0)
        if label.startswith("v1:"):
            nbytes += x.nbytes + 3 * o[1].nbytes  # x again; inv_scale written, then read back
        rows.append(bench.time_row(label, lambda launch=launch, o=o: launch(dx, o), nbytes, launch=True))
    codes, scale, _ = reference(x[:8], "tile")  # dequantize / requantize inputs: any valid codes will do
    dcodes = cuda.to_device(np.resize(codes, x.shape))
    dscale = cuda.to_device(np.resize(scale, (M, K // 128)))
    out = cuda.device_array(x.shape, np.float32)
    if bench.selected(only, "dequantize"):
        rows.append(bench.time_row("dequantize (tile)", lambda: dequantize(dcodes, dscale, 1, 128, out),
                                   x.size + dscale.nbytes + x.nbytes, launch=True))
    ct = cuda.device_array((K, M), np.uint8)
    st = cuda.device_array((K, -(-M // 128)), np.float32)
    if bench.selected(only, "requantize"):
        rows.append(bench.time_row("requantize 1x128 -> 128x1 (x.T)",
                                   lambda: requantize_tile_to_col(dcodes, dscale, ct, st),
                                   2 * x.size + dscale.nbytes + st.nbytes, launch=True))
    if bench.selected(only, "dual"):
        o = _dual_outs(M, K)
        rows.append(bench.time_row("dual: 1x128 tiles of x and of x.T, one pass", lambda: quantize_tile_dual(dx, *o),
                                   x.nbytes + 2 * x.size + o[1].nbytes + o[3].nbytes, launch=True))
    torch = bench.torch_cuda()
    if torch is not None and only is None:
        tx = torch.from_numpy(x).cuda()
        tcodes, tscale = torch_tile_quantize(torch, tx)
        o = _outs("tile", x.shape)
        quantize_tile(dx, o[0], o[1])
        ncodes = int((tcodes.view(torch.uint8).cpu().numpy() != o[0].copy_to_host()).sum())
        nscales = int((tscale.cpu().numpy() != o[1].copy_to_host()).sum())
        same = "bit-exact" if ncodes == nscales == 0 else f"{ncodes} codes, {nscales} scales DIFFER"
        rows.append(bench.time_row(f"torch: amax, scale, .to(float8_e4m3fn) ({same})",
                                   lambda: torch_tile_quantize(torch, tx), x.nbytes + x.size + o[1].nbytes,
                                   timer=lambda fn: timing.torch_time_ms(torch, fn), launch=True))
    return [bench.Table(f"fine-grained E4M3 quantize, x ({M}, {K}) float32 = {x.nbytes / 2**30:.2f} GiB; bytes = "
                        "read + written, scales included", "GB/s", rows, ceiling=bench.copy_ceiling_gbs(x.nbytes))]
