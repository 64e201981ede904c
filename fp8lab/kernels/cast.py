"""Float32 -> E4M3 codes, saturating: the software encoder against the hardware conversion instruction.

codes[i] = encode(x[i]), round to nearest even, overflow and +-Inf clamped to +-448 (formats.encode(...,
saturate=True)); a grid-stride loop over x.

version 1: software: kernels.common.encode_e4m3_sat, exact float arithmetic (frexp, floor, compares).
version 2: hardware: ptx.encode_e4m3_sat_hw, the low byte of one `cvt.rn.satfinite.e4m3x2.f32` (inline PTX;
           under the simulator its twin, the NumPy spec).

NaN: the PTX ISA promises only "NaN" for a NaN input, so checks compare NaN-ness there, not the code.
"""

from __future__ import annotations

import numpy as np

from .. import bench
from ..numerics import formats
from ..device import ptx, runtime
from ..device.runtime import cuda
from .common import encode_e4m3_sat
from .versions import Version

ENCODE_KERNEL_SIGNATURE = "void(float32[::1], uint8[::1])"
"""The signature of the two kernels on contiguous arrays, for ptx.ptx_of."""


@cuda.jit
def encode_e4m3_sat_sw_kernel(x, codes):
    """Version 1: codes[i] = encode_e4m3_sat(x[i]); x float32 (n,), codes uint8 (n,); any grid."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        codes[i] = encode_e4m3_sat(x[i])
        i += step


@cuda.jit
def encode_e4m3_sat_hw_kernel(x, codes):
    """Version 2: codes[i] = ptx.encode_e4m3_sat_hw(x[i]), the hardware conversion."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        codes[i] = ptx.encode_e4m3_sat_hw(x[i])
        i += step


VERSIONS = {
    1: Version("software encoder (exact float arithmetic)", encode_e4m3_sat_sw_kernel),
    2: Version("hardware cvt.rn.satfinite.e4m3x2.f32 (inline PTX)", encode_e4m3_sat_hw_kernel),
}
BEST = 2


def launch(x, codes, version: int = BEST) -> None:
    """codes (uint8, n) = E4M3 codes of x (float32, n): device arrays, no checks."""
    VERSIONS[version].kernel[runtime.grid_1d(x.size, 256, runtime.MAX_BLOCKS)](x, codes)


def reference(x) -> np.ndarray:
    """The spec: formats.encode(x, E4M3, saturate=True)."""
    return formats.encode(np.asarray(x, np.float32), formats.E4M3, saturate=True)


def _inputs(rng, n):
    """Magnitudes from 2^-12 to 2^10 (subnormals, normals, overflow), both signs, and the special values."""
    x = (np.exp2(rng.uniform(-12, 10, n)) * np.where(rng.random(n) < 0.5, -1, 1)).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 464.0]
    return x


def checks(rng, only=None) -> list:
    """only: the versions to check (bench.selected); None: all."""
    n = 3001 if runtime.IS_SIM else (1 << 22) + 3
    x = _inputs(rng, n)
    want = reference(x)
    nan = np.isnan(x)
    out = []
    for v, desc in VERSIONS.items():
        if not bench.selected(only, v):
            continue
        codes = bench.poisoned(n, np.uint8)
        launch(cuda.to_device(x), codes, v)
        got = codes.copy_to_host()
        bench.assert_codes_equal(f"cast v{v}", got[~nan], want[~nan])
        nan_codes = set(int(c) for c in got[nan])
        assert nan_codes <= {0x7F, 0xFF}, f"cast v{v}: NaN gave codes {sorted(nan_codes)}"
        out.append((f"v{v} {desc}, {n:,} values", "bit-exact (NaN as NaN)"))
    return out


def timings(rng, args) -> list:
    n = bench.ELEMENTWISE_N
    x = cuda.to_device(_inputs(rng, n))
    codes = cuda.device_array(n, np.uint8)
    nbytes = 4 * n + n
    rows = [bench.time_row(f"v{v}: {desc}", lambda v=v: launch(x, codes, v), nbytes)
            for v, desc in VERSIONS.items() if bench.selected(getattr(args, "only", None), v)]
    return [bench.Table(f"float32 -> E4M3, n = {n:,}; bytes = x read + codes written", "GB/s", rows,
                        ceiling=bench.copy_ceiling_gbs(4 * n))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
