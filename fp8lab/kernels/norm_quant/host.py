"""The host side: the version table, one launcher per version, `forward` and `backward` (device arrays in, device
arrays out; the caller allocates once, and nothing is allocated per call except version 1's scratch z when none is
given), their input checks, and `norm_quantize` / `norm_quantize_backward` (NumPy or device arrays in, fresh arrays
out)."""

from __future__ import annotations

import numpy as np

from ... import _validate as V
from ...device import runtime
from ...device.runtime import MAX_BLOCKS, WARP_SIZE, cuda
from ..common import vec_ok
from ..versions import Version
from .layout import MAX_THREADS, TILE, TILES_PER_SET
from .ring import CP_ASYNC, L2_PREFETCH, MAX_SHARED3, SIM_RESIDENT, forward_warps3, make_forward_kernel3, ring3
from .simple import (QUANT_WARPS1, THREADS1, backward_threads, forward_warps, make_backward_kernel,
                     make_forward_kernel2, make_forward_kernels1)
from .warp_rows import MAX_SETS4, ROWS4, make_forward_kernel4

_RESIDENT: dict = {}


def _resident_blocks(kernel, threads: int, smem: int, args) -> int:
    """Blocks of `kernel` that fit on the GPU at once (the driver's occupancy calculator, with smem bytes of
    dynamic shared memory; asked once per kernel and size); SIM_RESIDENT under the simulator."""
    if runtime.IS_SIM:
        return SIM_RESIDENT
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    key = (id(compiled), threads, smem)
    if key not in _RESIDENT:
        runtime.allow_dynamic_shared(kernel, args, smem)  # above 48 KiB the query needs the opt-in too
        _RESIDENT[key] = max(1, compiled.max_cooperative_grid_blocks(threads, smem))
    return _RESIDENT[key]


# ----------------------------------------------------------------------------------------------------------------
# Launchers (VERSIONS[v].kernel): arrays already checked by `forward`; threads None picks the version's default
# ----------------------------------------------------------------------------------------------------------------


def _views(x, b, g, codes):
    """(b2, g2, vec): b and g as (1, N) views, read 16 bytes at a time (g stands in for a missing b), and 1 where
    every row allows 16-byte loads and 4-byte code stores, else 0."""
    N = x.shape[1]
    b2 = (b if b is not None else g).reshape(1, N)
    g2 = g.reshape(1, N)
    return b2, g2, int(vec_ok(x, 16) and vec_ok(g2, 16) and vec_ok(b2, 16) and vec_ok(codes, 4))


def _z(z):
    return z if z is not None else runtime.unused_array(np.float32)


def _sets(scales, warps: int) -> int:
    """Tile sets a thread holds when `warps` warps share a row."""
    return -(-(-(-scales.shape[1] // TILES_PER_SET)) // warps)


def _run2(x, b2, g2, codes, scales, rstd, z, threads, has_bias: bool, vec: int) -> None:
    warps = threads // WARP_SIZE if threads else forward_warps(x.shape[1])
    sets = _sets(scales, warps)
    write_z = z is not None
    kernel = runtime.cached(("norm_quant.forward2", warps, sets, has_bias, write_z, vec),
                            lambda: make_forward_kernel2(warps, sets, has_bias, write_z, vec))
    codes4 = codes.view(np.uint32) if vec else runtime.unused_array(np.uint32)
    kernel[x.shape[0], warps * WARP_SIZE](x, b2, g2, codes, codes4, scales, rstd, _z(z))  # one block per row


def _run3(x, b2, g2, codes, scales, rstd, z, threads, has_bias: bool) -> bool:
    """Version 3 on 16-byte rows; False (nothing launched) where its ring would pass MAX_SHARED3."""
    M, N = x.shape
    warps, sets = forward_warps3(N)
    if threads:
        warps = threads // WARP_SIZE
        sets = _sets(scales, warps)
    smem = 4 * sum(ring3(has_bias)) * sets * warps * TILES_PER_SET * TILE
    if smem > MAX_SHARED3:
        return False
    write_z = z is not None
    exact = int(warps * sets * TILES_PER_SET * TILE == N)
    kernel = runtime.cached(("norm_quant.forward3", warps, sets, has_bias, write_z, exact),
                            lambda: make_forward_kernel3(warps, sets, has_bias, write_z, exact))
    args = (x, x.view(np.uint8), b2, g2, codes.view(np.uint32), scales, rstd, _z(z))
    blocks = min(M, _resident_blocks(kernel, warps * WARP_SIZE, smem, args))
    runtime.launch_with_shared(kernel, blocks, warps * WARP_SIZE, smem, *args)
    return True


def needs3(has_bias: bool) -> runtime.Capability:
    """What version 3 needs of the GPU: its table entry's `needs` (cp.async), and with a bias its L2 prefetch
    (sm_90). A Version's needs cannot depend on the arguments, so the bias case is this one extra check."""
    return L2_PREFETCH if has_bias else VERSIONS[3].needs


def launch1(x, b, g, codes, scales, rstd, z, threads) -> None:
    """Version 1: the row kernel writes z (a scratch z when none is given), the quantize kernel reads it back."""
    M, N = x.shape
    has_bias = b is not None
    row_k, quant_k = runtime.cached(("norm_quant.forward1", has_bias), lambda: make_forward_kernels1(has_bias))
    if z is None:
        z = cuda.device_array((M, N), np.float32)
    row_k[M, threads or THREADS1](x, b if has_bias else g, g, z, rstd)  # one block per row
    blocks = min(MAX_BLOCKS, -(-scales.size // QUANT_WARPS1))
    quant_k[blocks, QUANT_WARPS1 * WARP_SIZE](z, codes, scales)


def launch2(x, b, g, codes, scales, rstd, z, threads) -> None:
    """Version 2: 16-byte loads where every row allows them, else scalar loads (a flag compiled in)."""
    b2, g2, vec = _views(x, b, g, codes)
    _run2(x, b2, g2, codes, scales, rstd, z, threads, b is not None, vec)


def launch3(x, b, g, codes, scales, rstd, z, threads) -> None:
    """Version 3 where its ring can be used, else version 2: rows not 16-byte aligned or N % 4 != 0 (cp.async copies
    16 aligned bytes), or a ring over MAX_SHARED3. It checks the GPU only where it would run its ring."""
    has_bias = b is not None
    b2, g2, vec = _views(x, b, g, codes)
    if vec:
        runtime.require(needs3(has_bias), 3)
        if _run3(x, b2, g2, codes, scales, rstd, z, threads, has_bias):
            return
    _run2(x, b2, g2, codes, scales, rstd, z, threads, has_bias, vec)


def launch4(x, b, g, codes, scales, rstd, z, threads) -> None:
    """Version 4 on 16-byte rows of up to MAX_SETS4 tile sets (N <= 2048); wider rows run version 3 (which may run
    version 2), and version 2 runs where version 3 would not (rows not 16-byte, or a GPU without needs3)."""
    M, N = x.shape
    has_bias = b is not None
    b2, g2, vec = _views(x, b, g, codes)
    sets = -(-N // (TILES_PER_SET * TILE))
    if vec and sets <= MAX_SETS4:
        rows = threads // WARP_SIZE if threads else ROWS4
        write_z = z is not None
        exact = int(sets * TILES_PER_SET * TILE == N)
        kernel = runtime.cached(("norm_quant.forward4", rows, sets, has_bias, write_z, exact),
                                lambda: make_forward_kernel4(rows, sets, has_bias, write_z, exact))
        kernel[-(-M // rows), rows * WARP_SIZE](x, b2, g2, codes.view(np.uint32), scales, rstd, _z(z))
        return
    if vec and needs3(has_bias).here() and _run3(x, b2, g2, codes, scales, rstd, z, threads, has_bias):
        return
    _run2(x, b2, g2, codes, scales, rstd, z, threads, has_bias, vec)


VERSIONS = {
    1: Version("unfused: row kernel writes z, warp-per-tile kernel reads it back and quantizes", launch1),
    2: Version("fused: one block per row, row in registers, 8 lanes per tile, codes written directly", launch2),
    3: Version("version 2's math in persistent blocks: rows stream through a cp.async shared-memory ring, b and g "
               "beside it", launch3, needs=CP_ASYNC),
    4: Version("narrow rows: one warp per row, 8 rows a block sharing b and g in shared memory; wider rows run "
               "version 3", launch4),
}
BEST = 4  # the fastest at N = 1024 and 2048 (warp per row) and at 7168 with a bias (docs/notes/norm_quant.md)


# ----------------------------------------------------------------------------------------------------------------
# Input checks (cheap: called per launch)
# ----------------------------------------------------------------------------------------------------------------


def _on_device(name: str, a) -> None:
    if not V.is_device_array(a):
        raise TypeError(f"{name} must be a CUDA device array (cuda.to_device, cuda.device_array; norm_quantize takes "
                        f"NumPy arrays), got {V.describe(a)}")


def _device(name: str, a, dtype, shape) -> None:
    """A TypeError/ValueError naming `name` unless a is a device array of dtype and shape."""
    _on_device(name, a)
    if a.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {V.describe(a)}")
    if tuple(a.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {V.describe(a)}")


def _check_x(x, name: str = "x") -> tuple[int, int]:
    _on_device(name, x)
    if x.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {V.describe(x)}")
    if x.ndim != 2 or 0 in x.shape:
        raise ValueError(f"{name} must be 2-D (M, N) with M, N > 0, got {V.describe(x)}")
    return tuple(x.shape)


def _check_threads(threads):
    if threads is None:
        return None
    if isinstance(threads, (bool, np.bool_)) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be None or a multiple of 32 up to {MAX_THREADS}, got {V.describe(threads)}")
    if threads <= 0 or threads % WARP_SIZE or threads > MAX_THREADS:
        raise ValueError(f"threads must be None or a multiple of 32 up to {MAX_THREADS}, got {threads}")
    return int(threads)


def forward(x, b, g, codes, scales, rstd, z=None, *, version: int = BEST, threads: int | None = None) -> None:
    """Device arrays: x (M, N) float32, b (N,) float32 or None, g (N,) float32 (b and g contiguous) -> codes (M, N)
    uint8 E4M3, scales (M, ceil(N/128)) float32 (dequantization factors, 1x128 tiles), rstd (M,) float32, and z
    (M, N) float32 when z is given (version 1 allocates a scratch z when it is not). Nothing else is allocated.

    threads: threads per row block, a multiple of 32 (None: version 2 picks by N with `forward_warps`, version 3
    with `forward_warps3`, version 1 uses THREADS1); version 4: threads per block of rows, one warp each (None:
    ROWS4 rows). Blocks above ANY_THREADS threads may fail to launch when each thread holds many tile sets (too many
    registers for the block). Version 3 runs version 2 where its ring cannot be used: rows not 16-byte aligned or
    N % 4 != 0 (cp.async copies 16 aligned bytes), or a ring over MAX_SHARED3. Version 4 runs version 3 for rows
    over MAX_SETS4 tile sets (N > 2048), and version 2 where version 3 would (and below compute capability 9.0 with
    a bias, 8.0 without, which version 3 needs); `threads` then means that version's.
    """
    version = V.version("version", version, VERSIONS, default=BEST)
    threads = _check_threads(threads)
    M, N = _check_x(x)
    if b is not None:
        _device("b", b, np.float32, (N,))
    _device("g", g, np.float32, (N,))
    _device("codes", codes, np.uint8, (M, N))
    _device("scales", scales, np.float32, (M, -(-N // TILE)))
    _device("rstd", rstd, np.float32, (M,))
    if z is not None:
        _device("z", z, np.float32, (M, N))
    for name, a in (("b", b), ("g", g)):
        if a is not None and not a.is_c_contiguous():  # versions 2-4 read them as (1, N) views
            raise ValueError(f"{name} must be C-contiguous, got a strided {V.describe(a)}")
    VERSIONS[version].kernel(x, b, g, codes, scales, rstd, z, threads)


def backward(dz, x, b, g, rstd, dx, gy, *, threads: int | None = None, residual=None) -> None:
    """Device arrays: dz, x (M, N) float32, b (N,) float32 or None, g (N,), rstd (M,) (the forward's) -> dx (M, N)
    float32 (= dy, the gradient of y = x + b and of x) and gy = dz * y * rstd (M, N) float32. The caller sums
    columns: dg = sum over rows of gy, db = sum over rows of dx (elementwise.colsum).

    residual: None, or a float32 (M, N) device array added to dx as it is written (dx = residual + the gradient,
    one float32 addition after the gradient is formed: the bits of a separate add); it may be dx itself, which then
    accumulates (a residual block's x + f(RMSNorm(x)): the gradient through the skip plus the one through the norm).

    threads: threads per row block, a multiple of 32 (None: `backward_threads(N)`); as for `forward`, blocks above
    ANY_THREADS threads may fail to launch when each thread holds many elements.
    """
    threads = _check_threads(threads)
    M, N = _check_x(x)
    _device("dz", dz, np.float32, (M, N))
    if b is not None:
        _device("b", b, np.float32, (N,))
    _device("g", g, np.float32, (N,))
    _device("rstd", rstd, np.float32, (M,))
    _device("dx", dx, np.float32, (M, N))
    _device("gy", gy, np.float32, (M, N))
    if residual is not None:
        _device("residual", residual, np.float32, (M, N))
    threads = threads or backward_threads(N)
    per_thread = -(-N // threads)
    has_bias = b is not None
    add = residual is not None
    kernel = runtime.cached(("norm_quant.backward", threads, per_thread, has_bias) + (("add",) if add else ()),
                            lambda: make_backward_kernel(threads, per_thread, has_bias, add))
    kernel[M, threads](dz, x, b if has_bias else g, g, rstd, dx, gy, residual if add else dx)


# ----------------------------------------------------------------------------------------------------------------
# Convenience: NumPy (or device) arrays in, fresh arrays out
# ----------------------------------------------------------------------------------------------------------------


def _operand(name: str, a, shape=None, ndim=None):
    """A float32 device array as it is, or a NumPy array (float16/32/64) copied to a float32 device array."""
    if V.is_device_array(a):
        return V.array(name, a, dtype=np.float32, ndim=ndim, shape=shape)
    arr = V.array(name, a, dtype=(np.float16, np.float32, np.float64), ndim=ndim, shape=shape, allow_device=False)
    return cuda.to_device(V.float32_host(name, arr))


def norm_quantize(x, b, g, *, version: int | None = None, return_z: bool = False):
    """(codes, scales, rstd), or (codes, scales, rstd, z) with return_z: `forward` on fresh outputs.

    x (M, N), b (N,) or None, g (N,): NumPy arrays (float16/32/64, converted to float32) or float32 device arrays.
    The results are NumPy arrays when x is a NumPy array, device arrays when it is a device array.
    """
    version = V.version("version", version, VERSIONS, default=BEST)
    return_z = V.boolean("return_z", return_z)
    on_device = V.is_device_array(x)
    x_d = _operand("x", x, ndim=2)
    M, N = x_d.shape
    b_d = None if b is None else _operand("b", b, shape=(N,))
    g_d = _operand("g", g, shape=(N,))
    codes = cuda.device_array((M, N), np.uint8)
    scales = cuda.device_array((M, -(-N // TILE)), np.float32)
    rstd = cuda.device_array(M, np.float32)
    z = cuda.device_array((M, N), np.float32) if return_z else None
    forward(x_d, b_d, g_d, codes, scales, rstd, z, version=version)
    out = (codes, scales, rstd) + ((z,) if return_z else ())
    return out if on_device else tuple(a.copy_to_host() for a in out)


def norm_quantize_backward(dz, x, b, g, rstd):
    """(dx, gy): `backward` on fresh outputs, NumPy arrays for a NumPy dz and device arrays for a device dz (inputs
    as for `norm_quantize`; rstd (M,) the forward's). db = dx.sum(axis=0) and dg = gy.sum(axis=0)."""
    on_device = V.is_device_array(dz)
    dz_d = _operand("dz", dz, ndim=2)
    M, N = dz_d.shape
    x_d = _operand("x", x, shape=(M, N))
    b_d = None if b is None else _operand("b", b, shape=(N,))
    g_d = _operand("g", g, shape=(N,))
    rstd_d = _operand("rstd", rstd, shape=(M,))
    dx = cuda.device_array((M, N), np.float32)
    gy = cuda.device_array((M, N), np.float32)
    backward(dz_d, x_d, b_d, g_d, rstd_d, dx, gy)
    return (dx, gy) if on_device else (dx.copy_to_host(), gy.copy_to_host())
