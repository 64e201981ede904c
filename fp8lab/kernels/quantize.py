"""Per-tensor FP8 quantization ("current scaling"): amax -> scale -> cast, all on the device.

version 1: amax by a shared-memory tree reduction in each block, partial maxima reduced by a one-block
           finalize kernel (no atomics, no host round trip), then the cast.
version 2: the same with warp-shuffle reductions (see kernels/reduce.py).

scale is the DEQUANTIZATION factor (DeepGEMM/DeepSeek convention): x ~= decode(code) * scale, with
scale = amax / FP8_MAX, so the largest |x| encodes to exactly +-FP8_MAX. Transformer Engine calls this
scale_inv. The cast multiplies by inv_scale = FP8_MAX / amax, computed once in float32 on the device.

amax is floored at AMAX_FLOOR = 1e-12 so an all-zero tensor gives codes 0 and a finite scale instead of
0/0. DeepGEMM floors at 1e-4, which suits BF16 activations; this course's gradients (amax about 1e-5 for the
mean-squared loss of a 64x256 batch) would then top out near code value 45 instead of 448, still in E4M3's
normal range but no longer using its top. With 1e-12 the largest |x| encodes to exactly +-448 unless the
whole tensor is below 1e-12.

NaN in the input propagates: amax becomes NaN, so every code is NaN and the loss shows it.
"""

from __future__ import annotations

import numpy as np

from .. import formats, runtime
from ..runtime import cuda
from .reduce import block_max, nanmax, tree_max

THREADS = runtime.block_threads(256)
MAX_BLOCKS = 1024 if not runtime.IS_SIM else 4
AMAX_FLOOR = np.float32(1e-12)
FP8_MAX = {"e4m3": np.float32(448.0), "e5m2": np.float32(57344.0)}
ENCODE = {"e4m3": formats.encode_e4m3_sat, "e5m2": formats.encode_e5m2_sat}


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
            scale[0] = safe / fp8_max
            inv_scale[0] = fp8_max / safe

    return finalize_kernel


def _make_cast(encode):
    @cuda.jit
    def cast_kernel(x, inv_scale, codes):
        s = inv_scale[0]
        i = cuda.grid(1)
        while i < x.size:
            codes[i] = encode(x[i] * s)
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
            code = encode(x[r, c] * s)
            codes[r, c] = code
            codes_t[c, r] = code  # strided write; a shared-memory tile would coalesce it
            i += cuda.gridsize(1)

    return cast_kernel, cast_transposed_kernel


_KERNELS: dict = {}


def kernels(fmt: str):
    if fmt not in _KERNELS:
        _KERNELS[fmt] = (_make_finalize(FP8_MAX[fmt]),) + _make_cast(ENCODE[fmt])
    return _KERNELS[fmt]


VERSIONS = {
    1: ("shared-memory tree amax, finalize, cast", amax_partial_kernel1),
    2: ("warp-shuffle amax, finalize, cast", amax_partial_kernel2),
}


class TensorQuantizer:
    """Quantizes device arrays of one shape per tensor, into buffers allocated once (no allocation per call).

    After `q(x)`: `q.codes` (uint8, shape of x), `q.scale` (1,) dequantization factor, `q.amax` (1,),
    and, with transpose=True (2-D only), `q.codes_t` (the codes of x.T, for the Wgrad GEMM).
    """

    def __init__(self, shape, fmt: str = "e4m3", transpose: bool = False, version: int = 2):
        self.shape = tuple(shape)
        self.fmt = fmt
        self.transpose = transpose
        self.version = version
        size = int(np.prod(self.shape))
        self.blocks, _ = runtime.grid_1d(size, THREADS, MAX_BLOCKS)
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
        self._amax_kernel = VERSIONS[version][1]

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


def reference(x: np.ndarray, fmt: str = "e4m3"):
    """NumPy spec: (codes, scale, amax), float32 arithmetic exactly as the kernels do it."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.float32(np.max(np.abs(x))) if not np.isnan(x).any() else np.float32(np.nan)
    safe = np.float32(max(amax, AMAX_FLOOR)) if not np.isnan(amax) else amax
    scale = np.float32(safe / FP8_MAX[fmt])
    inv_scale = np.float32(FP8_MAX[fmt] / safe)
    codes = formats.encode((x * inv_scale).astype(np.float32), fmt=formats.get_format(fmt), saturate=True)
    return codes, scale, amax


def main() -> None:  # python -m fp8lab.kernels.quantize
    from .. import bench

    n = runtime.sizes("bench")["n"]
    rng = np.random.default_rng()
    x = (rng.standard_normal(n, dtype=np.float32) * 3).astype(np.float32)
    ref_codes, ref_scale, _ = reference(x)
    dx = cuda.to_device(x)
    nbytes = 2 * x.nbytes + x.size  # x read twice (amax pass, cast pass) + one byte per code written
    ceiling = bench.copy_ceiling_gbs(x.nbytes)
    rows = []
    for v, (desc, _) in VERSIONS.items():
        q = TensorQuantizer(x.shape, version=v)
        q.codes.copy_to_device(np.full(n, 0xA5, np.uint8))
        q(dx)
        bench.assert_codes_equal(f"version {v}", q.codes.copy_to_host(), ref_codes)
        assert q.scale.copy_to_host()[0] == ref_scale, f"version {v}: scale differs"
        ms = runtime.time_ms(lambda: q(dx))
        rows.append([f"v{v} {desc}", "ok", runtime.fmt_ms(ms), bench.gbs(nbytes, ms), bench.of_ceiling(nbytes, ms, ceiling)])
    torch = bench.torch_cuda()
    if torch is not None:  # PyTorch's equivalent: amax, scale, cast (saturating by clamping first)
        tx = torch.from_numpy(x).cuda()

        def torch_quantize():
            inv = 448.0 / tx.abs().amax().clamp(min=float(AMAX_FLOOR))
            return (tx * inv).clamp(-448, 448).to(torch.float8_e4m3fn)

        ok = "ok" if (torch_quantize().view(torch.uint8).cpu().numpy() == ref_codes).all() else "differs"
        ms = bench.torch_time_ms(torch, torch_quantize)
        rows.append(["torch: amax, scale, .to(float8_e4m3fn)", ok, runtime.fmt_ms(ms), bench.gbs(nbytes, ms),
                     bench.of_ceiling(nbytes, ms, ceiling)])
    bench.print_table(
        f"per-tensor E4M3 quantize, n={n:,} ({runtime.backend}); copy ceiling "
        f"{'-' if ceiling is None else f'{ceiling:,.0f} GB/s'}",
        ["version", "check", "time", "GB/s", "of copy"],
        rows,
    )



def _make_dequantize(decode):
    @cuda.jit
    def dequantize_kernel(codes, scale, out):
        s = scale[0]
        i = cuda.grid(1)
        while i < codes.size:
            out[i] = decode(codes[i]) * s
            i += cuda.gridsize(1)

    return dequantize_kernel


DEQUANTIZE = {"e4m3": _make_dequantize(formats.decode_e4m3), "e5m2": _make_dequantize(formats.decode_e5m2)}


def dequantize(codes, scale, out, fmt: str = "e4m3") -> None:
    """Device arrays: out (float32, shape of codes) = decode(codes) * scale[0]."""
    n = codes.size
    DEQUANTIZE[fmt][runtime.grid_1d(n, THREADS, MAX_BLOCKS)](codes.reshape(n), scale, out.reshape(n))


if __name__ == "__main__":
    main()
