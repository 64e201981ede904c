"""SwiGLU, h = silu(a) * b for u = [a | b] (M, 2F), with the 1x128 tile E4M3 quantization of h for the W2 GEMM.

u is W1's output, float32 (M, 2F): gate a = u[:, :F], value b = u[:, F:], silu(a) = a * sigmoid(a) (Shazeer 2020,
"GLU Variants Improve Transformer", arXiv 2002.05202). The versioned op writes what DeepSeek-V3 feeds the W2 GEMM:
h's E4M3 codes (M, F) and one scale per row per 128 columns (M, ceil(F/128)) (arXiv 2412.19437, section 3.3.2),
bit for bit `spec.quantize(h, "tile")`, optionally h itself.

version 1: unfused: an elementwise kernel writes h (M, F) float32 to global memory, a second kernel reads it back
           and quantizes each 1x128 tile (a warp per tile): 8 + 4 + 4 + 1 bytes move per element of h.
version 2: fused: one warp per 1x128 tile reads a and b, keeps h in registers (stored only when asked for),
           reduces the tile amax by 5 warp shuffles, writes codes and scale: 8 + 1 bytes per element. A partial
           last tile where F is not a multiple of 128.
Plain ops (one kernel each, a thread per element):
forward:  h (M, F) float32, for the FP32 and BF16 recipes.
backward: du = [da | db] (M, 2F) from u and dh (M, F): da = dh * b * s * (1 + a * (1 - s)), db = dh * silu(a),
          s = sigmoid(a) recomputed from u; DeepSeek-V3 too caches SwiGLU's input (in FP8) and recomputes its output
          in the backward pass (arXiv 2412.19437, section 3.3.3).
backward_quantize_dual: du's 1x128 tiles (W1's Dgrad) and du^T's (W1's Wgrad) straight from u and dh, du never
          written in float32 (common.make_dual_tile_kernel on du computed as it is read): bit for bit the tiles of
          backward's du and of its transpose. A block makes one 128 x 128 tile of du, so da's tiles and db's tiles
          each read a, b and dh (and compute both, keeping one): 12 bytes read and 2 written per element of du,
          against 6 + 4 (backward) + 4 + 2 (the dual pass) unfused; the pairs' second read may come from L2.

Numerics. sigmoid comes from t = exp(-|a|) <= 1, which cannot overflow for any a (a float32 exp(-a) overflows below
a = -88.7): with r = 1 / (1 + t), s = r for a >= 0 and t * r below (1 - s is the other one). s and h = a * s * b are
evaluated in float64 and h is rounded once to float32, so h is the float32 nearest silu(a) * b (to float64's
precision), and the same bits on a GPU, in the simulator and in NumPy (`reference_forward` does the same
operations): float32 exps (libdevice's, NumPy's) differ in the last bit often enough to change a tile's amax and so
its scale, while float64 exps that differ in the last bit change the rounded h only about once in 2^28 elements.
That is what lets the codes match spec.quantize of the reference bit for bit. The price is about 40 FP64
instructions per element: an H200 runs FP64 at half its FP32 rate, a GeForce GPU at 1/64, where this op would be
compute-bound.
NaN or Inf in u (or an h beyond float32's range) poisons its tile as spec.quantize says: NaN scale, codes 0x7F.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..device import runtime
from ..numerics import spec
from ..bench import timing
from ..device.runtime import MAX_BLOCKS, WARP_SIZE, cuda
from ..numerics.spec import POISON_CODE
from .common import (DUAL_SMEM, DUAL_THREADS, ENCODE_SAT, amax_scale, dual_tile_grid, make_dual_tile_kernel, nanmax,
                     warp_max)
from .versions import Version

TILE = spec.GROUP_K  # 1x128 activation tiles
PER_LANE = TILE // WARP_SIZE  # elements of a tile per lane (4)
THREADS = runtime.block_threads(256)  # elementwise kernels: threads per block along F (one warp in the simulator)
WARPS_PER_BLOCK = 4 if not runtime.IS_SIM else 1  # tile kernels: one warp per tile
FMT = "e4m3"
FP8_MAX = spec.FP8_MAX[FMT]
encode = ENCODE_SAT[FMT]

_ZERO = np.float32(0.0)
_ONE64 = np.float64(1.0)
_ZERO64 = np.float64(0.0)


# ----------------------------------------------------------------------------------------------------------------
# Device functions
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def sigmoid_parts(a):
    """(s, 1 - s), s = sigmoid(a), of a float64 a, with no overflow for any a: t = exp(-|a|) lies in [0, 1]."""
    t = math.exp(-abs(a))
    r = _ONE64 / (_ONE64 + t)
    tr = t * r
    if a >= _ZERO64:
        return r, tr
    return tr, r  # NaN lands here: NaN, NaN


@cuda.jit(device=True)
def swiglu_value(a, b):
    """float32 h = silu(a) * b of float32 a, b: evaluated in float64, rounded once."""
    a64 = np.float64(a)
    s, _ = sigmoid_parts(a64)
    return np.float32(a64 * s * np.float64(b))


@cuda.jit(device=True)
def swiglu_grads(a, b, g):
    """(da, db) float32 of float32 a, b and g = dh: evaluated in float64, each rounded once."""
    a64, b64, g64 = np.float64(a), np.float64(b), np.float64(g)
    s, sm = sigmoid_parts(a64)
    return np.float32(g64 * b64 * s * (_ONE64 + a64 * sm)), np.float32(g64 * (a64 * s))


@cuda.jit(device=True)
def du_value(u, dh, r, col):
    """du[r, col] of the backward: da for col < F, db past it (common.make_dual_tile_kernel's value)."""
    F = dh.shape[1]
    c = col if col < F else col - F
    da, db = swiglu_grads(u[r, c], u[r, F + c], dh[r, c])
    return da if col < F else db


@cuda.jit(device=True)
def quantize_tile_registers(vals, codes, scale, r, t, lane):
    """Tile t of row r from the lane's PER_LANE values (lane + 32 j; 0 past the row's end): the warp's amax by
    shuffles, then codes[r, tile] and, from lane 0, scale[r, t]. Every lane of the warp must call it."""
    F = codes.shape[1]
    m = _ZERO
    for j in range(PER_LANE):
        m = nanmax(m, abs(vals[j]))
    m = warp_max(m)  # 5 xor-shuffles: every lane gets the tile's amax
    s, inv = amax_scale(m, FP8_MAX)
    for j in range(PER_LANE):
        c = t * TILE + lane + WARP_SIZE * j  # lanes write consecutive bytes
        if c < F:
            codes[r, c] = POISON_CODE if inv != inv else encode(vals[j] * inv)
    if lane == 0:
        scale[r, t] = s


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def swiglu_forward_kernel(u, h):
    """forward, and version 1's first pass: thread (column c, block row) -> h[r, c] for r = blockIdx.y, + gridDim.y,
    ... (a 2-D grid: no division per element to find the row)."""
    M, F = h.shape
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c < F:
        r = cuda.blockIdx.y
        while r < M:
            h[r, c] = swiglu_value(u[r, c], u[r, F + c])  # neighbouring threads, neighbouring addresses
            r += cuda.gridDim.y


@cuda.jit
def swiglu_backward_kernel(u, dh, du):
    """backward: du[r, c] = da, du[r, F + c] = db, the same grid as the forward kernel."""
    M, F = dh.shape
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if c < F:
        r = cuda.blockIdx.y
        while r < M:
            du[r, c], du[r, F + c] = swiglu_grads(u[r, c], u[r, F + c], dh[r, c])
            r += cuda.gridDim.y


@cuda.jit
def tile_quantize_kernel1(h, codes, scale):
    """Version 1's second pass: one warp per 1x128 tile of h (grid-stride), each lane 4 elements."""
    vals = cuda.local.array(PER_LANE, np.float32)
    M, F = h.shape
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % WARP_SIZE
    w = cuda.grid(1) // WARP_SIZE
    while w < M * ntk:  # warp-uniform loop: every lane reaches every shuffle
        r = w // ntk
        t = w % ntk
        for j in range(PER_LANE):
            c = t * TILE + lane + WARP_SIZE * j
            vals[j] = h[r, c] if c < F else _ZERO  # zeros leave the amax alone
        quantize_tile_registers(vals, codes, scale, r, t, lane)
        w += cuda.gridsize(1) // WARP_SIZE


@cuda.jit
def swiglu_quantize_kernel2(u, codes, scale, h, write_h):
    """Version 2: one warp per 1x128 tile (grid-stride); each lane loads its 4 a's and 4 b's before computing (8
    loads in flight), keeps h in registers, and stores it only when write_h."""
    va = cuda.local.array(PER_LANE, np.float32)
    vb = cuda.local.array(PER_LANE, np.float32)
    vals = cuda.local.array(PER_LANE, np.float32)
    M, F = codes.shape
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % WARP_SIZE
    w = cuda.grid(1) // WARP_SIZE
    while w < M * ntk:
        r = w // ntk
        t = w % ntk
        for j in range(PER_LANE):
            c = t * TILE + lane + WARP_SIZE * j
            va[j] = _ZERO
            vb[j] = _ZERO
            if c < F:
                va[j] = u[r, c]
                vb[j] = u[r, F + c]
        for j in range(PER_LANE):
            c = t * TILE + lane + WARP_SIZE * j
            vals[j] = _ZERO
            if c < F:
                vals[j] = swiglu_value(va[j], vb[j])
                if write_h:
                    h[r, c] = vals[j]
        quantize_tile_registers(vals, codes, scale, r, t, lane)
        w += cuda.gridsize(1) // WARP_SIZE


VERSIONS = {
    1: Version("unfused: elementwise kernel writes h, tile kernel reads it back and quantizes",
               (swiglu_forward_kernel, tile_quantize_kernel1)),
    2: Version("fused: one warp per 1x128 tile, h in registers, amax by warp shuffles", swiglu_quantize_kernel2),
}
BEST = 2


# ----------------------------------------------------------------------------------------------------------------
# Launchers: device arrays in, device arrays out (validated by the public functions below)
# ----------------------------------------------------------------------------------------------------------------


def _elementwise_grid(M: int, F: int):
    return ((F + THREADS - 1) // THREADS, min(M, MAX_BLOCKS)), THREADS


def _tile_grid(ntiles: int):
    return min(MAX_BLOCKS, -(-ntiles // WARPS_PER_BLOCK)), WARPS_PER_BLOCK * WARP_SIZE


def launch_forward(u, h) -> None:
    """h (M, F) float32 from u (M, 2F) float32, device arrays."""
    swiglu_forward_kernel[_elementwise_grid(*h.shape)](u, h)


def launch_backward(u, dh, du) -> None:
    """du (M, 2F) float32 from u (M, 2F) and dh (M, F) float32, device arrays."""
    swiglu_backward_kernel[_elementwise_grid(*dh.shape)](u, dh, du)


def launch_backward_quantize_dual(u, dh, codes, scale, codes_t, scale_t, fmt: str = "e4m3",
                                  mode: str = "amax") -> None:
    """du's 1x128 tiles, codes (M, 2F) uint8 and scale (M, ceil(2F/128)) float32, and du^T's, codes_t (2F, M) and
    scale_t (2F, ceil(M/128)), from u (M, 2F) and dh (M, F), device arrays; fmt "e4m3" or "e5m2", mode "amax" or
    "pow2" (spec.group_scale)."""
    M, N = u.shape
    kernel = runtime.cached(("swiglu.backward_dual", fmt, mode), lambda: make_dual_tile_kernel(fmt, mode, du_value))
    runtime.launch_with_shared(kernel, dual_tile_grid(M, N), DUAL_THREADS, DUAL_SMEM, u, dh, codes, scale, codes_t,
                               scale_t)


def launch_forward_quantize(u, codes, scale, h, version: int) -> None:
    """codes (M, F) uint8 and scale (M, ceil(F/128)) float32 from u (M, 2F); h (M, F) float32 to write too, or None
    (version 1 then allocates its intermediate h), device arrays."""
    if version == 1:  # two kernels, h through global memory
        elementwise, tile = VERSIONS[1].kernel
        h = cuda.device_array(codes.shape, np.float32) if h is None else h
        elementwise[_elementwise_grid(*h.shape)](u, h)
        tile[_tile_grid(scale.size)](h, codes, scale)
    else:
        write_h = 0 if h is None else 1
        h = runtime.unused_array(np.float32) if h is None else h
        VERSIONS[version].kernel[_tile_grid(scale.size)](u, codes, scale, h, write_h)


# ----------------------------------------------------------------------------------------------------------------
# Public ops: NumPy or device inputs; outputs passed in (device arrays, written in place) or allocated
# ----------------------------------------------------------------------------------------------------------------


def _check_u(u):
    u = V.array("u", u, dtype=np.float32, ndim=2)
    if u.shape[1] % 2:
        raise ValueError(f"u must have an even number of columns, (M, 2F): gate u[:, :F], value u[:, F:]; got "
                         f"{V.describe(u)}")
    return u, u.shape[0], u.shape[1] // 2


def _check_out(name: str, x, dtype, shape):
    """An output array, which must be a device array of dtype and shape (None: the op allocates one)."""
    if x is None:
        return None
    x = V.array(name, x, dtype=dtype, shape=shape)
    if not V.is_device_array(x):
        raise TypeError(f"{name} must be a CUDA device array (outputs are written in place on the device; leave it "
                        f"None to get a new array), got {V.describe(x)}")
    return x


def forward(u, h=None):
    """h = silu(u[:, :F]) * u[:, F:], float32 (M, F), from u (M, 2F) float32 (NumPy or device array).

    h: a float32 (M, F) device array to write (returned), or None: a new array, NumPy when u is NumPy.
    NaN and Inf in u are not checked: they reach the h they touch.
    """
    u, M, F = _check_u(u)
    out = _check_out("h", h, np.float32, (M, F))
    dev_h = cuda.device_array((M, F), np.float32) if out is None else out
    launch_forward(runtime.to_device(u), dev_h)
    if out is None and not V.is_device_array(u):
        return dev_h.copy_to_host()
    return dev_h


def backward(u, dh, du=None):
    """du = [da | db] (M, 2F) float32 from u (M, 2F) and dh = dL/dh (M, F), float32, NumPy or device arrays:
    da = dh * b * s * (1 + a * (1 - s)), db = dh * silu(a), s = sigmoid(a) recomputed from u.

    du: a float32 (M, 2F) device array to write (returned), or None: a new array, NumPy when u and dh both are.
    """
    u, M, F = _check_u(u)
    dh = V.array("dh", dh, dtype=np.float32, shape=(M, F))
    out = _check_out("du", du, np.float32, (M, 2 * F))
    ddu = cuda.device_array((M, 2 * F), np.float32) if out is None else out
    launch_backward(runtime.to_device(u), runtime.to_device(dh), ddu)
    if out is None and not (V.is_device_array(u) or V.is_device_array(dh)):
        return ddu.copy_to_host()
    return ddu


DUAL_MODES = ("amax", "pow2")
"""backward_quantize_dual's scale modes (spec.group_scale): 1 x 128 tiles."""


def backward_quantize_dual(u, dh, *, fmt="e4m3", mode="amax"):
    """backward's du (M, 2F) and du^T quantized in 1 x 128 tiles, from u (M, 2F) and dh (M, F) float32 (NumPy or
    device arrays) in one pass, du never written in float32: (QuantizedTensor of du, QuantizedTensor of du^T),
    granularity "tile", bit for bit spec.quantize of backward(u, dh) and of its transpose. fmt "e4m3" or "e5m2";
    mode "amax" or "pow2". Device arrays in, device arrays in the results; NumPy in, NumPy out."""
    u, M, F = _check_u(u)
    dh = V.array("dh", dh, dtype=np.float32, shape=(M, F))
    if fmt not in ENCODE_SAT:
        raise ValueError(f"fmt must be one of {tuple(ENCODE_SAT)}, got {fmt!r}")
    if mode not in DUAL_MODES:
        raise ValueError(f"mode must be one of {DUAL_MODES} (1 x 128 tiles), got {mode!r}")
    N = 2 * F
    codes, codes_t = cuda.device_array((M, N), np.uint8), cuda.device_array((N, M), np.uint8)
    scale = cuda.device_array(spec.scale_shape("tile", (M, N), TILE), np.float32)
    scale_t = cuda.device_array(spec.scale_shape("tile", (N, M), TILE), np.float32)
    launch_backward_quantize_dual(runtime.to_device(u), runtime.to_device(dh), codes, scale, codes_t, scale_t, fmt,
                                  mode)
    host = not (V.is_device_array(u) or V.is_device_array(dh))
    out = []
    for c, sc in ((codes, scale), (codes_t, scale_t)):
        c, sc = (c.copy_to_host(), sc.copy_to_host()) if host else (c, sc)
        out.append(spec.QuantizedTensor(c, sc, fmt=fmt, granularity="tile", block=TILE))
    return tuple(out)


def forward_quantize(u, codes=None, scale=None, h=None, *, version=None) -> spec.QuantizedTensor:
    """SwiGLU of u (M, 2F) float32 quantized to E4M3 in 1x128 tiles: a QuantizedTensor (granularity "tile", block
    128) whose data (M, F) uint8 and scale (M, ceil(F/128)) float32 are bit for bit `reference(u)`; it is the
    activation operand `fl.fp8_gemm` takes.

    codes, scale: device arrays to write, both or neither (None: new arrays, NumPy when u is NumPy). h: a float32
    (M, F) device array that also receives h, or None (version 1 then allocates its intermediate h; pass one to
    avoid an allocation per call). version: 1 or 2 (None: BEST). NaN and Inf in u are not refused: they poison
    the tiles they reach (NaN scale, codes 0x7F), counted in nonfinite_groups for NumPy input.
    """
    u, M, F = _check_u(u)
    version = V.version("version", version, VERSIONS, default=BEST)
    sshape = spec.scale_shape("tile", (M, F), TILE)
    if (codes is None) != (scale is None):
        raise ValueError(f"codes and scale must be given together or both left None, got codes {V.describe(codes)}"
                         f" and scale {V.describe(scale)}")
    codes = _check_out("codes", codes, np.uint8, (M, F))
    scale = _check_out("scale", scale, np.float32, sshape)
    h = _check_out("h", h, np.float32, (M, F))
    given = codes is not None
    if not given:
        codes, scale = cuda.device_array((M, F), np.uint8), cuda.device_array(sshape, np.float32)
    launch_forward_quantize(runtime.to_device(u), codes, scale, h, version)
    if given or V.is_device_array(u):
        return spec.QuantizedTensor(codes, scale, FMT, "tile", TILE)
    host_scale = scale.copy_to_host()
    return spec.QuantizedTensor(codes.copy_to_host(), host_scale, FMT, "tile", TILE,
                                nonfinite_groups=int(np.isnan(host_scale).sum()))


# ----------------------------------------------------------------------------------------------------------------
# References (NumPy): the same float64 operations as the kernels
# ----------------------------------------------------------------------------------------------------------------


def reference_sigmoid_parts(a64: np.ndarray):
    """(s, 1 - s) of float64 a: `sigmoid_parts`, elementwise."""
    t = np.exp(-np.abs(a64))
    r = 1.0 / (1.0 + t)
    tr = t * r
    pos = a64 >= 0  # False for NaN, as in the kernel
    return np.where(pos, r, tr), np.where(pos, tr, r)


def _halves(u):
    u = np.asarray(u, np.float32)
    F = u.shape[1] // 2
    return u[:, :F].astype(np.float64), u[:, F:].astype(np.float64)


def reference_forward(u) -> np.ndarray:
    """float32 h (M, F): silu(a) * b evaluated in float64 and rounded once, bit for bit what the kernels compute (the
    NumPy engine runs numerics.ops.swiglu, float32 throughout: its own program, not this spec)."""
    a, b = _halves(u)
    with np.errstate(invalid="ignore", over="ignore"):  # -Inf * 0 is NaN, a huge h is Inf, as on a GPU
        s, _ = reference_sigmoid_parts(a)
        return (a * s * b).astype(np.float32)


def reference(u):
    """The spec of the versioned op: (codes (M, F) uint8, scale (M, ceil(F/128)) float32) = the 1x128 tile E4M3
    quantization (spec.quantize) of reference_forward(u)."""
    codes, scale, _ = spec.quantize(reference_forward(u), "tile", FMT, TILE)
    return codes, scale


def reference_backward(u, dh) -> np.ndarray:
    """du = [da | db] (M, 2F) in float64 from u (M, 2F) and dh (M, F)."""
    a, b = _halves(u)
    g = np.asarray(dh, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s, sm = reference_sigmoid_parts(a)
        return np.concatenate([g * b * s * (1.0 + a * sm), g * (a * s)], axis=1)


def backward_tolerance(u, dh) -> tuple[float, float]:
    """(atol, rtol) for a float32 du against reference_backward. The kernel rounds a float64 value once (half an ulp,
    2^-24 relative; rtol allows 2^-23). That value may differ from the reference's in its last float64 bits (fused
    multiply-adds, a libdevice exp one ulp off), which shows only where 1 + a (1 - s) cancels (a near -1.28): there
    its absolute error is a few 2^-53, times |dh * b * s| <= |dh * b|; atol = 2^-45 max |dh * b| covers that, and
    a float32 subnormal's rounding, with room to spare."""
    _, b = _halves(u)
    return 2.0**-45 * float(np.abs(np.asarray(dh, np.float64) * b).max()), 2.0**-23


H_RTOL = 2.0**-24 + 2.0**-45
"""h against reference_h64: half a float32 ulp (the one rounding), plus reference_h64's own error, below
|a| 2^-53 from its exp of a log-sum-exp (h is subnormal, under H_ATOL's care, beyond |a| = 88)."""
H_ATOL = 2.0**-150
"""Half the smallest float32 subnormal: silu(a) of a gate below -88 is subnormal."""


def reference_h64(u) -> np.ndarray:
    """silu(a) * b in float64, from the textbook form a * b / (1 + exp(-a)) (log-sum-exp keeps it finite): a
    check of reference_forward by different operations."""
    a, b = _halves(u)
    return a * b * np.exp(-np.logaddexp(0.0, -a))


# ----------------------------------------------------------------------------------------------------------------
# Check, then time (bench.main)
# ----------------------------------------------------------------------------------------------------------------


CHECK_SHAPE = {"sim": (5, 300), "gpu": (1027, 2821)}
"""(M, F) for the checks: F not a multiple of 128 (a partial last tile), M odd."""
BENCH_SHAPE = (16384, 2816)
"""(M, F) for the timings: 16384 tokens (the capstone's step), F = 2816, about 8/3 of a width of 1024 rounded up
to 128 (the usual SwiGLU hidden size); u is 369 MB."""


def make_inputs(rng, M: int, F: int):
    """u (M, 2F) and dh (M, F) float32: Gaussians, and 1% of the gates at |a| in [20, 120], where a float32
    exp(-a) over- or underflows."""
    u = rng.standard_normal((M, 2 * F), dtype=np.float32) * np.float32(2)
    big = rng.random((M, F)) < 0.01
    u[:, :F][big] = (rng.uniform(20, 120, int(big.sum())) * rng.choice([-1, 1], int(big.sum()))).astype(np.float32)
    dh = rng.standard_normal((M, F), dtype=np.float32)
    return u, dh


def checks(rng, only=None) -> list:
    """only: the versions and ops ("forward", "backward") to check (bench.selected); None: all."""
    M, F = CHECK_SHAPE["sim" if runtime.IS_SIM else "gpu"]
    u, dh = make_inputs(rng, M, F)
    ref_codes, ref_scale = reference(u)
    ref_h, h64 = reference_forward(u), reference_h64(u)
    bench.assert_close("reference_forward vs a * b / (1 + exp(-a))", ref_h, h64, atol=H_ATOL, rtol=H_RTOL)
    du_ = cuda.to_device(u)
    sshape = ref_scale.shape
    out = []
    for v in (v for v in VERSIONS if bench.selected(only, v)):
        for with_h in (False, True) if v == 2 else (True,):
            codes, scale = bench.poisoned((M, F), np.uint8), bench.poisoned(sshape, np.float32)
            h = bench.poisoned((M, F), np.float32) if with_h else None
            forward_quantize(du_, codes, scale, h, version=v)
            what = f"v{v}{' (h written)' if with_h and v == 2 else ''}"
            bench.assert_codes_equal(f"{what} codes", codes.copy_to_host(), ref_codes)
            assert np.array_equal(scale.copy_to_host(), ref_scale), f"{what}: scales differ"
            if with_h:
                bench.assert_close(f"{what} h", h.copy_to_host(), h64, atol=H_ATOL, rtol=H_RTOL)
            out.append((f"{what}: codes, scales of u ({M}, {2 * F})", "bit-exact"))
    if bench.selected(only, "forward"):
        h = bench.poisoned((M, F), np.float32)
        forward(du_, h)
        bench.assert_close("forward h", h.copy_to_host(), h64, atol=H_ATOL, rtol=H_RTOL)
        out.append((f"forward h ({M}, {F})", "within half an ulp of float64"))
    if bench.selected(only, "backward"):
        ddu = bench.poisoned((M, 2 * F), np.float32)
        backward(du_, cuda.to_device(dh), ddu)
        atol, rtol = backward_tolerance(u, dh)
        du = ddu.copy_to_host()
        bench.assert_close("backward du", du, reference_backward(u, dh), atol=atol, rtol=rtol)
        out.append((f"backward du ({M}, {2 * F})", "within an ulp of float64"))
        for mode in DUAL_MODES:  # fused: du's tiles and du^T's, bit for bit those of the kernel's du
            q, qt = backward_quantize_dual(u, dh, mode=mode)
            for name, got, x in (("du", q, du), ("du^T", qt, np.ascontiguousarray(du.T))):
                codes, scale, _ = spec.quantize(x, "tile", mode=mode)
                bench.assert_codes_equal(f"backward_quantize_dual ({mode}) {name} codes", got.data, codes)
                assert np.array_equal(got.scale, scale), f"backward_quantize_dual ({mode}): {name} scales differ"
            out.append((f"backward_quantize_dual ({mode}): du and du^T tiles ({M}, {2 * F})", "bit-exact"))
    return out


def timings(rng, args) -> list:
    """Every version and op on u (16384, 5632); bytes = what must be read and written: u (8 per element of h),
    codes (1) and scales, h (4) where written, h's round trip (4 + 4) for version 1, dh (4) and du (8) backward.
    With args.only, only those versions and ops, no peers."""
    only = getattr(args, "only", None)
    M, F = BENCH_SHAPE
    u, dh = make_inputs(rng, M, F)
    n = M * F
    du_, ddh = cuda.to_device(u), cuda.to_device(dh)
    sshape = spec.scale_shape("tile", (M, F), TILE)
    codes, scale = cuda.device_array((M, F), np.uint8), cuda.device_array(sshape, np.float32)
    h, ddu = cuda.device_array((M, F), np.float32), cuda.device_array((M, 2 * F), np.float32)
    nscale = scale.size * 4
    dual_out = (cuda.device_array((M, 2 * F), np.uint8), cuda.device_array(spec.scale_shape("tile", (M, 2 * F), TILE),
                np.float32), cuda.device_array((2 * F, M), np.uint8),
                cuda.device_array(spec.scale_shape("tile", (2 * F, M), TILE), np.float32))
    dual_scales = 4 * (dual_out[1].size + dual_out[3].size)
    timed = [
        (1, f"v1: {VERSIONS[1]}", lambda: forward_quantize(du_, codes, scale, h, version=1),
         8 * n + 4 * n + 4 * n + n + nscale),
        (2, f"v2: {VERSIONS[2]}", lambda: forward_quantize(du_, codes, scale, version=2), 8 * n + n + nscale),
        (2, "v2, h written too", lambda: forward_quantize(du_, codes, scale, h, version=2),
         8 * n + 4 * n + n + nscale),
        ("forward", "forward: float32 h", lambda: forward(du_, h), 8 * n + 4 * n),
        ("backward", "backward: du from u and dh", lambda: backward(du_, ddh, ddu), 8 * n + 4 * n + 8 * n),
        ("backward", "backward_quantize_dual: du's and du^T's 1x128 tiles from u and dh",
         lambda: launch_backward_quantize_dual(du_, ddh, *dual_out), 2 * (8 * n + 4 * n) + 4 * n + dual_scales),
    ]
    rows = [bench.time_row(label, fn, nbytes, launch=True) for what, label, fn, nbytes in timed
            if bench.selected(only, what)]
    torch = bench.torch_cuda()
    if torch is not None and only is None:
        tu, tdh = torch.from_numpy(u).cuda(), torch.from_numpy(dh).cuda()
        ta, tb = tu[:, :F], tu[:, F:]
        th, tdu = torch.empty((M, F), device="cuda"), torch.empty((M, 2 * F), device="cuda")

        def torch_forward():
            torch.mul(torch.nn.functional.silu(ta), tb, out=th)

        def torch_backward():
            s = torch.sigmoid(ta)
            torch.mul(tdh * tb * s, 1 + ta * (1 - s), out=tdu[:, :F])
            torch.mul(tdh, ta * s, out=tdu[:, F:])

        torch_forward()
        forward(du_, h)
        differ = int((th.cpu().numpy() != h.copy_to_host()).sum())
        def timer(fn):
            return timing.torch_time_ms(torch, fn)

        rows.append(bench.time_row(f"torch: silu(a) * b, float32 ({differ:,} of {n:,} h differ from forward's)",
                                   torch_forward, 8 * n + 4 * n, timer=timer, launch=True))
        rows.append(bench.time_row("torch: backward from sigmoid(a), elementwise ops", torch_backward,
                                   8 * n + 4 * n + 8 * n, timer=timer, launch=True))
    return [bench.Table(f"SwiGLU, u ({M}, {2 * F}) float32 = {u.nbytes / 2**20:,.0f} MiB -> h / E4M3 1x128 tiles; "
                        "bytes = must be read + written", "GB/s", rows, ceiling=bench.copy_ceiling_gbs(u.nbytes))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
