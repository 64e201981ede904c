"""Per-tensor FP8 quantization ("current scaling"): amax -> scale -> cast, all on the device.

version 1: amax by a shared-memory tree reduction in each block, partial maxima reduced by a one-block
           finalize kernel (no atomics, no host round trip), then the cast.
version 2: the same with warp-shuffle reductions (see kernels/common.py).

scale is the DEQUANTIZATION factor (DeepGEMM/DeepSeek convention): x ~= decode(code) * scale, with
scale = amax / FP8_MAX, so the largest |x| encodes to exactly +-FP8_MAX. Transformer Engine calls this
scale_inv. The cast multiplies by inv_scale = FP8_MAX / amax, computed once in float32 on the device.

amax is floored at spec.AMAX_FLOOR = 1e-12 so an all-zero tensor gives codes 0 and a finite scale instead of
0/0 (fp8lab/numerics/spec.py says why 1e-12). NaN or +-Inf in the input poisons the tensor, as it poisons a group of the
fine granularities: the scale is NaN and every code 0x7F (NaN), so the loss shows it (an Inf amax would
otherwise give an infinite scale and turn every finite element into a zero code). The reference is
spec.quantize_tensor.
"""

from __future__ import annotations

import numpy as np

from .. import bench
from ..device import runtime
from ..numerics import spec
from ..bench import timing
from ..device.runtime import cuda
from .common import DECODE, ENCODE_SAT, block_max, nanmax, tree_max
from .versions import Version

THREADS = runtime.block_threads(256)
PARTIALS = 1024 if not runtime.IS_SIM else 4
"""Blocks of the amax pass, so partial maxima the one-block finalize reduces (a grid-stride loop covers x)."""
AMAX_FLOOR = spec.AMAX_FLOOR
POISON_CODE = spec.POISON_CODE


@cuda.jit
def amax_partial_kernel1(x, partial):
    smem = cuda.shared.array(THREADS, np.float32)  # THREADS: a power of two
    i = cuda.grid(1)
    m = np.float32(0)
    while i < x.size:  # grid-stride loop: any size with a capped grid
        m = nanmax(m, abs(x[i]))
        i += cuda.gridsize(1)
    m = tree_max(m, smem)
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = m


@cuda.jit
def amax_partial_kernel2(x, partial):
    slots = cuda.shared.array(32, np.float32)
    i = cuda.grid(1)
    m = np.float32(0)
    while i < x.size:
        m = nanmax(m, abs(x[i]))
        i += cuda.gridsize(1)
    m = block_max(m, slots)
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = m


def _make_finalize(fp8_max):
    @cuda.jit
    def finalize_kernel(partial, nparts, amax, scale, inv_scale):
        slots = cuda.shared.array(32, np.float32)
        m = np.float32(0)
        i = cuda.threadIdx.x
        while i < nparts:
            m = nanmax(m, partial[i])
            i += cuda.blockDim.x
        m = block_max(m, slots)
        if cuda.threadIdx.x == 0:
            amax[0] = m
            safe = nanmax(m, AMAX_FLOOR)
            if m - m != 0:  # NaN or +-Inf: no usable scale, every code is poisoned (spec.quantize_tensor)
                safe = m - m
            scale[0] = safe / fp8_max
            inv_scale[0] = fp8_max / safe

    return finalize_kernel


def _make_cast(encode):
    @cuda.jit
    def cast_kernel(x, inv_scale, codes):
        s = inv_scale[0]
        i = cuda.grid(1)
        while i < x.size:
            codes[i] = POISON_CODE if s != s else encode(x[i] * s)
            i += cuda.gridsize(1)

    @cuda.jit
    def cast_transposed_kernel(x, inv_scale, codes, codes_t):
        """x (R, C) -> codes (R, C) and codes_t (C, R): the layout a Wgrad GEMM wants, from one read."""
        s = inv_scale[0]
        C = x.shape[1]
        i = cuda.grid(1)
        while i < x.size:
            r = i // C
            c = i % C
            code = POISON_CODE if s != s else encode(x[r, c] * s)
            codes[r, c] = code
            codes_t[c, r] = code  # strided write; a shared-memory tile would coalesce it
            i += cuda.gridsize(1)

    return cast_kernel, cast_transposed_kernel


def kernels(fmt: str):
    """(finalize, cast, cast_transposed) kernels for fmt, compiled once."""
    return runtime.cached(("quantize", fmt), lambda: (_make_finalize(spec.FP8_MAX[fmt]),)
                          + _make_cast(ENCODE_SAT[fmt]))


VERSIONS = {  # the kernel of each version is its amax pass; finalize and cast (`kernels(fmt)`) are shared
    1: Version("shared-memory tree amax, finalize, cast", amax_partial_kernel1),
    2: Version("warp-shuffle amax, finalize, cast", amax_partial_kernel2),
}
BEST = 2


class TensorQuantizer:
    """Quantizes device arrays of one shape per tensor, into buffers allocated once (no allocation per call).

    After `q(x)`: `q.codes` (uint8, shape of x), `q.scale` (1,) dequantization factor, `q.amax` (1,),
    and, with transpose=True (2-D only), `q.codes_t` (the codes of x.T, for the Wgrad GEMM).
    """

    def __init__(self, shape, fmt: str = "e4m3", transpose: bool = False, version: int = BEST):
        self.shape = tuple(shape)
        self.fmt = fmt
        self.transpose = transpose
        self.version = version
        size = int(np.prod(self.shape))
        self.blocks, _ = runtime.grid_1d(size, THREADS, PARTIALS)
        self.partial = cuda.device_array(self.blocks, np.float32)
        self.amax = cuda.device_array(1, np.float32)
        self.scale = cuda.device_array(1, np.float32)
        self.inv_scale = cuda.device_array(1, np.float32)
        self.codes = cuda.device_array(self.shape, np.uint8)
        if transpose:
            if len(self.shape) != 2:
                raise ValueError(f"transpose=True needs a 2-D shape, got shape {self.shape}")
            self.codes_t = cuda.device_array(self.shape[::-1], np.uint8)
        self._finalize, self._cast, self._cast_t = kernels(fmt)
        self._amax_kernel = VERSIONS[version].kernel

    def __call__(self, x):
        flat = x.reshape(x.size)
        self._amax_kernel[self.blocks, THREADS](flat, self.partial)
        self._finalize[1, 32 * min(32, max(1, (self.blocks + 31) // 32))](
            self.partial, self.blocks, self.amax, self.scale, self.inv_scale
        )
        if self.transpose:
            self._cast_t[self.blocks, THREADS](x, self.inv_scale, self.codes, self.codes_t)
        else:
            self._cast[self.blocks, THREADS](flat, self.inv_scale, self.codes.reshape(x.size))
        return self


def _make_dequantize(decode):
    @cuda.jit
    def dequantize_kernel(codes, scale, out):
        s = scale[0]
        i = cuda.grid(1)
        while i < codes.size:
            out[i] = decode(codes[i]) * s
            i += cuda.gridsize(1)

    return dequantize_kernel


def dequantize(codes, scale, out, fmt: str = "e4m3") -> None:
    """Device arrays: out (float32, shape of codes) = decode(codes) * scale[0]."""
    n = codes.size
    kernel = runtime.cached(("quantize.dequantize", fmt), lambda: _make_dequantize(DECODE[fmt]))
    kernel[runtime.grid_1d(n, THREADS, runtime.MAX_BLOCKS)](codes.reshape(n), scale, out.reshape(n))


reference = spec.quantize_tensor
"""The spec: (codes, scale, amax) with float32 arithmetic exactly as the kernels do it."""


def checks(rng) -> list:
    shape = (37, 53) if runtime.IS_SIM else (4099, 8191)
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    x[rng.random(shape) < 0.01] *= 50
    ref_codes, ref_scale, ref_amax = reference(x)
    dx = cuda.to_device(x)
    out = []
    for v, desc in VERSIONS.items():
        q = TensorQuantizer(shape, transpose=True, version=v)
        q.codes.copy_to_device(np.full(shape, 0xA5, np.uint8))
        q.codes_t.copy_to_device(np.full(shape[::-1], 0xA5, np.uint8))
        q(dx)
        bench.assert_codes_equal(f"v{v} codes", q.codes.copy_to_host(), ref_codes)
        bench.assert_codes_equal(f"v{v} codes_t", q.codes_t.copy_to_host(), ref_codes.T)
        assert q.scale.copy_to_host()[0] == ref_scale and q.amax.copy_to_host()[0] == ref_amax, f"v{v}: scale"
        out.append((f"v{v} {desc}, x {shape}", "bit-exact (codes, codes of x.T, scale)"))
    got = bench.poisoned(shape, np.float32)
    dequantize(cuda.to_device(ref_codes), cuda.to_device(np.array([ref_scale])), got)
    assert np.array_equal(got.copy_to_host(), spec.dequantize(ref_codes, np.array([[ref_scale]]), *shape)), \
        "dequantize differs"
    out.append((f"dequantize, {shape}", "bit-exact"))
    return out


def timings(rng, args) -> list:
    n = bench.ELEMENTWISE_N
    x = (rng.standard_normal(n, dtype=np.float32) * 3).astype(np.float32)
    dx = cuda.to_device(x)
    nbytes = 2 * x.nbytes + x.size  # x read twice (amax pass, cast pass) + one byte per code written
    rows = []
    for v, desc in VERSIONS.items():
        q = TensorQuantizer(x.shape, version=v)
        rows.append(bench.time_row(f"v{v}: {desc}", lambda q=q: q(dx), nbytes))
    torch = bench.torch_cuda()
    if torch is not None:  # PyTorch's equivalent: amax, scale, cast (saturating by clamping first)
        tx = torch.from_numpy(x).cuda()
        fp8_max = float(spec.FP8_MAX["e4m3"])

        def torch_quantize():
            inv = fp8_max / tx.abs().amax().clamp(min=float(AMAX_FLOOR))
            return (tx * inv).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)

        same = np.array_equal(torch_quantize().view(torch.uint8).cpu().numpy(), reference(x)[0])
        rows.append(bench.time_row(f"torch: amax, scale, .to(float8_e4m3fn) ({'bit-exact' if same else 'DIFFERS'})",
                                   torch_quantize, nbytes,
                                   timer=lambda fn: timing.torch_time_ms(torch, fn)))
    return [bench.Table(f"per-tensor E4M3 quantize, n = {n:,} float32; bytes = x read twice + codes written",
                        "GB/s", rows, ceiling=bench.copy_ceiling_gbs(x.nbytes))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
