"""The one place that knows the backend: numba.cuda, the simulator's gaps closed, problem sizes, launch helpers.

Kernel source imports `cuda`, `shfl_down_sync` and `shfl_xor_sync` from here and never forks by backend:
- on the GPU these are numba's own intrinsics;
- under the simulator (which has no warp shuffles) they are emulated (see _simgaps.py), so reduction
  kernels run unchanged. Every live lane of the warp must call the shuffle, as `0xFFFFFFFF` masks
  require on the GPU too.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from . import select as _backend
from .. import _validate

backend, backend_reason = _backend.select()
IS_SIM = backend == "sim"

from numba import cuda  # noqa: E402  (must follow backend selection)

from . import pool as _pool  # noqa: E402

# Device arrays come from a caching pool (fp8lab/device/pool.py): no cuMemAlloc/cuMemFree per call in steady state.
POOLED = False if IS_SIM else _pool.install()

FULL_MASK = 0xFFFFFFFF
WARP_SIZE = 32

if IS_SIM:
    from . import simgaps as _simgaps

    _simgaps.install()
    shfl_down_sync = _simgaps.shfl_down_sync
    shfl_xor_sync = _simgaps.shfl_xor_sync
else:
    shfl_down_sync = cuda.shfl_down_sync
    shfl_xor_sync = cuda.shfl_xor_sync


# Problem sizes: one place that knows the backend. The simulator runs every thread as a Python thread
# (~1e4 threads/s), so its sizes are tiny; GPU sizes are realistic.
SIZES = {
    "sim": {
        "train": dict(batch=8, d_in=32, d_out=16, steps=20, lr=5e-2, ema_decay=0.9),
        "chars": dict(batch=8, context=2, embed=16, hidden=16, blocks=1, steps=3, lr=3e-3, ema_decay=0.9,
                      eval_every=3, eval_batches=1),
        "bench": dict(n=4096),
        "gemm_tile": 8,
    },
    "gpu": {
        "train": dict(batch=64, d_in=512, d_out=256, steps=600, lr=1e-3, ema_decay=0.99),
        # 4096 windows of 16 characters, width 512, 4 blocks: the validation loss is lowest after about one pass
        # over the 1 MB corpus (250 steps, measured on an H200); wider models or batches memorize it sooner
        "chars": dict(batch=4096, context=16, embed=32, hidden=1024, blocks=4, steps=250, lr=1e-3,
                      ema_decay=0.99, eval_every=50, eval_batches=8),
        "bench": dict(n=1 << 28),
        "gemm_tile": 16,
    },
}


def sizes(name: str) -> dict:
    """Problem sizes for this backend: tiny under the simulator, realistic on a GPU."""
    try:
        value = SIZES[backend][name]
    except KeyError:
        raise ValueError(f"name must be one of {sorted(SIZES[backend])}, got {name!r}") from None
    return dict(value) if isinstance(value, dict) else value


def synchronize() -> None:
    if not IS_SIM:
        cuda.synchronize()


MAX_BLOCKS = 4 if IS_SIM else 65535
"""Cap on the blocks of a grid-stride launch (grid_1d): the loop covers the rest. Under the simulator blocks run
one after another, each as Python threads, so a few blocks that loop are faster than many."""

_KERNELS: dict = {}


def cached(key, build):
    """The one kernel cache: build() once per key, e.g. ("quantize_fine.tile3", fmt, block, mode). Kernels whose
    constants (formats, tile sizes, scale kinds) are compiled in are made by a `make_*` function per key."""
    if key not in _KERNELS:
        _KERNELS[key] = build()
    return _KERNELS[key]


def kernel_cache() -> dict:
    """The dict `cached` fills, itself: fp8lab.course.notebook.try_kernel puts a learner's kernel in place of the
    library's
    in it for a check, and the library's back afterwards."""
    return _KERNELS


_UNUSED: dict = {}


def unused_array(dtype, ndim: int = 2):
    """A (1, ..., 1) device array of dtype to pass where a kernel takes an array it will not touch: allocated
    once and cached, since an allocation per launch costs more than the launch itself."""
    key = (np.dtype(dtype), ndim)
    if key not in _UNUSED:
        _UNUSED[key] = cuda.device_array((1,) * ndim, dtype)
    return _UNUSED[key]


def compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the current device; None under the simulator (which runs every instruction's twin)."""
    if IS_SIM:
        return None
    return tuple(cuda.get_current_device().compute_capability)


def require_capability(what: str, version, ok) -> None:
    """ValueError unless the device can run `what` (ok: a predicate on (major, minor)); nothing under the
    simulator."""
    cc = compute_capability()
    if cc is not None and not ok(cc):
        raise ValueError(f"version {version} runs {what}; this device has compute capability {cc[0]}.{cc[1]}: "
                         f"choose another version (None picks the best this device can run)")


def numba_type(name: str):
    """numba's scalar type `name` (e.g. "uint8"), as cuda.shared.array(0, ...) wants it on both backends."""
    from numba.cuda import types

    return getattr(types, name)


_DYNAMIC_SHARED: dict = {}  # (id of a compiled kernel, device) -> (the dynamic shared memory it may use, the kernel)
STATIC_SHARED_LIMIT = 48 * 1024  # bytes a kernel may use without opting in (CUDA C++ Programming Guide)
_FITS_STATIC: dict = {}  # (id of a kernel, dynamic bytes) -> the kernel, where static + dynamic need no opt-in


def allow_dynamic_shared(kernel, args, nbytes: int) -> None:
    """Let `kernel` (as compiled for `args`) use nbytes of dynamic shared memory. Beyond 48 KiB a kernel must opt in
    (cuFuncSetAttribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; up to 227 KiB per block on sm_90); numba
    has no option for it, so this sets the attribute on the compiled kernel (numba-cuda 0.30 loads kernels as
    CUkernel handles: cuKernelSetAttribute, as numba's own set_shared_memory_carveout does) once per kernel and
    size. The 48 KiB count the kernel's static shared arrays too (48 KiB of dynamic memory beside a static array
    fail to launch without the opt-in). Nothing to do under the simulator or up to 48 KiB in all."""
    if not IS_SIM and nbytes > 0:
        if _FITS_STATIC.get((id(kernel), nbytes)) is kernel:  # a launcher's per-call check, made cheap
            return
        compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
        if nbytes + compiled.shared_mem_per_block <= STATIC_SHARED_LIMIT:
            _FITS_STATIC[(id(kernel), nbytes)] = kernel  # the kernel is kept: its id is never reused
            return
        cufunc = compiled._codelibrary.get_cufunc()
        key = (id(compiled), cufunc.device.id)
        if _DYNAMIC_SHARED.get(key, (0,))[0] < nbytes:
            from numba.cuda.cudadrv.driver import binding, driver

            attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            driver.cuKernelSetAttribute(attr, nbytes, cufunc.handle, cufunc.device.id)
            # the kernel is kept, so that its id is never reused: a lecture's editable copy, compiled anew on every
            # re-run, would otherwise find the attribute of a freed kernel under its id
            _DYNAMIC_SHARED[key] = (nbytes, compiled)


def launch_with_shared(kernel, grid, block, nbytes: int, *args, stream=0) -> None:
    """kernel[grid, block, stream, nbytes](*args) with nbytes of dynamic shared memory (`cuda.shared.array(0, dtype)`),
    opting in beyond 48 KiB (`allow_dynamic_shared`)."""
    allow_dynamic_shared(kernel, args, nbytes)
    kernel[grid, block, stream, nbytes](*args)


def grid_1d(n: int, threads: int = 256, max_blocks: int | None = None) -> tuple[int, int]:
    """(blocks, threads) covering n elements, one thread each; a grid-stride kernel passes a cap (MAX_BLOCKS)."""
    blocks = max(1, math.ceil(n / threads))
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    return blocks, threads


def to_device(x):
    """Host array -> device array (made C-contiguous); device arrays pass through."""
    return x if _validate.is_device_array(x) else cuda.to_device(np.ascontiguousarray(x))


def to_host(x) -> np.ndarray:
    return x.copy_to_host() if _validate.is_device_array(x) else np.asarray(x)


def device_info() -> dict:
    """Name, SM count, compute capability and memory of device 0 (simulator: what it pretends)."""
    if IS_SIM:
        return {"name": "Numba CUDA simulator (CPU threads)", "sms": None, "cc": None, "memory_gib": None,
                "memory_free_gib": None}
    dev = cuda.get_current_device()
    ctx = cuda.current_context()
    free, total = ctx.get_memory_info()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return {
        "name": name,
        "sms": dev.MULTIPROCESSOR_COUNT,
        "cc": "{}.{}".format(*dev.compute_capability),
        "memory_gib": round(total / 2**30, 1),
        "memory_free_gib": round(free / 2**30, 1),
    }


def block_threads(gpu: int) -> int:
    """Threads per block for reduction kernels: `gpu` on a GPU, one warp under the simulator
    (every simulated thread is an OS thread, so fewer threads means a faster lesson)."""
    return 32 if IS_SIM else gpu


# ------------------------------------------------------------------------------------------------------------------
# The simulator's cost model: one warning before a launch that would take minutes
# ------------------------------------------------------------------------------------------------------------------


class SimulatorSlowWarning(UserWarning):
    """Under the simulator, a public call is estimated to run for more than SIM_WARN_S seconds (sim_check)."""


SIM_WARN_S = 60.0  # warn when a call's estimate is above this
SIM_QUICK_S = 2.0  # the warning names sizes whose estimate is below this

# Seconds one public call takes under the simulator: a + b * work + c * threads, per op and key (SIM_COST[op][1]).
#   GEMMs, key the version (fp8_gemm: (version, accum_bits given)), dims (M, N, K) rounded up to the tile
#     (tm, tn, tk) the version's threads cover (idle threads run too): work = M N K, threads = M N;
#   fl.train, per step, dims (batch, d_in, d_out) = (B, K, N): work = B N K (Fprop and Wgrad GEMMs),
#     threads = B N + N K + B K (one per output of those GEMMs; elementwise kernels over these sizes);
#   the rest, key the granularity: work = elements (dims: the shape), c unused.
# Measured 2026-12-03 on a 2-core x86 machine (Python 3.11, numba-cuda 0.30.4) at a load average of 2-5: the wall
# time of one call at each size in the comments, e.g. fl.gemm version 7 at 128x128x128:
#   FP8LAB_BACKEND=sim .venv/bin/python -c "import time, numpy as np, fp8lab as fl; a = np.ones((128, 128),
#   np.float32); t = time.perf_counter(); fl.gemm(a, a, version=7); print(time.perf_counter() - t)"
# then least squares with a, b, c >= 0, unweighted, so the largest sizes (5-15 s) count most. Runs at other loads
# differed by up to 3x (busier was often faster: the simulator's threads contend for the GIL), so this is a
# ballpark; checked at fl.gemm 256x256x256 (34 s, model 34 s) and fl.train's 20 default steps (35 s, model 35 s).
SIM_COST = {
    "fl.gemm": ("M x N x K = ", {  # 32x32x8 64x64x64 64x64x256 (v1, v2); 32x32x32 64x64x{64, 128} (v3);
        #                            64x64x{8, 64, 256} (v4); 128x128x{8, 64, 256} (v5, v6);
        #                            128x128x{8, 64, 128} 256x128x128 256x256x256 (v7)
        1: (0, 1.5e-6, 2.9e-4, 32, 32, 1),
        2: (0.1, 1.6e-6, 2.8e-4, 32, 32, 1),
        3: (0.3, 1.1e-5, 3.0e-4, 32, 32, 32),
        4: (0.3, 3.9e-6, 0, 64, 64, 8),
        5: (0.3, 1.0e-6, 0, 128, 128, 8),
        6: (0.2, 1.2e-6, 0, 128, 128, 8),
        7: (0, 2.0e-6, 0, 128, 128, 8),
    }),
    "fl.fp8_gemm": ("M x N x K = ", {  # tile x block scales; 32x32x{8, 128, 512} (v1), 32x32x{128, 512} 64x64x256
        #                                (v2), 128x128x{8, 64, 128} (v3); accum_bits=13: 32x32x{32, 128, 512} (v1),
        #                                32x32x{128, 512} (v2)
        (1, False): (0.2, 3.7e-6, 0, 8, 8, 1),
        (2, False): (0.2, 1.2e-6, 1.0e-3, 8, 8, 128),
        (3, False): (0.2, 2.0e-6, 0, 128, 128, 8),
        (4, False): (0.2, 1.2e-6, 0, 128, 128, 128),  # (5,9,300) 20 s, (70,130,264) 44 s
        (5, False): (0.2, 3.3e-7, 0, 128, 128, 128),  # (5,9,300) 1.8 s, (70,130,264) 4.2 s
        (6, False): (0.2, 3.3e-7, 0, 128, 128, 128),
        (7, False): (0.2, 3.3e-7, 0, 128, 128, 128),  # version 6's tiles, looped over by fewer blocks
        (1, True): (0.6, 1.7e-5, 0, 8, 8, 32),
        (2, True): (1.1, 1.3e-5, 0, 8, 8, 128),
    }),
    "fl.quantize": ("", {  # 8x32 64x256 128x512 (tensor also 512x512)
        "tensor": (0.5, 6.9e-5, 0), "row": (0.2, 4.4e-5, 0), "tile": (0.2, 5.9e-5, 0), "block": (0, 5.1e-5, 0),
        "mx": (0.1, 9.9e-5, 0),
    }),
    "fl.dequantize": ("", {"tensor": (0, 4.7e-5, 0), "fine": (0, 5.5e-5, 0)}),  # 8x32 64x256 128x512 (tile)
    "fl.requantize_tile_to_col": ("", {None: (0, 2.2e-4, 0)}),  # 8x32 64x256 128x256
    # fl.train, per step, both recipes: 8x32x16 (2 and 20 steps), 64x32x16 8x64x64 8x128x64 32x128x64 (1 step)
    "fl.train": ("batch x d_in x d_out = ", {None: (1.2, 1.5e-5, 5.0e-4)}),
}
_SIM_WARNED: set = set()
_NICE = sorted({2**k for k in range(3, 25)} | {3 * 2**k for k in range(2, 24)})  # 8, 12, 16, 24, 32, 48, ...


def sim_seconds(op: str, dims, key=None) -> float:
    """Estimated seconds of one call of `op` (e.g. "fl.gemm") on `dims` under the simulator (SIM_COST)."""
    a, b, c, *tile = SIM_COST[op][1][key]
    if op == "fl.train":
        B, K, N = dims
        return a + b * B * N * K + c * (B * N + N * K + B * K)
    if tile:
        M, N, K = (-(-d // t) * t for d, t in zip(dims, tile))
        return a + b * M * N * K + c * M * N
    return a + b * math.prod(dims)


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 600:
        return f"{s // 60} min {s % 60} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 >= 60 else f"{s // 3600} h"


def sim_cost_warning(what: str, seconds: float, size: str, quick: str, stacklevel: int = 3) -> bool:
    """Under the simulator, warn once per `what` per process (SimulatorSlowWarning) when `seconds`, the estimate
    for `size`, is above SIM_WARN_S; `quick` says which sizes are fast. Returns whether it warned."""
    if backend != "sim" or seconds <= SIM_WARN_S or what in _SIM_WARNED:
        return False
    _SIM_WARNED.add(what)
    warnings.warn(f"{what} on the simulator: about {_duration(seconds)} for {size} (estimated); {quick}. On a GPU "
                  "each launch takes milliseconds; set FP8LAB_BACKEND=gpu on a machine with one.", SimulatorSlowWarning,
                  stacklevel=stacklevel)
    return True


def sim_check(op: str, dims, key=None, steps: int = 1) -> None:
    """The one line before a public call's launch: under the simulator, warn (once per op) when SIM_COST puts
    `steps` calls on `dims` above SIM_WARN_S, naming the n x n (x n) that it puts under SIM_QUICK_S."""
    if backend != "sim" or op in _SIM_WARNED:
        return
    dims = tuple(int(d) for d in dims)
    seconds = steps * sim_seconds(op, dims, key)
    if seconds > SIM_WARN_S:
        n = max([n for n in _NICE if sim_seconds(op, (n,) * len(dims), key) <= SIM_QUICK_S], default=1)
        size = SIM_COST[op][0] + "x".join(map(str, dims)) + (f", {steps} steps" if steps > 1 else "")
        quick = f"sizes like {'x'.join([str(n)] * len(dims))} take about {SIM_QUICK_S:g} s" + " a step" * (steps > 1)
        sim_cost_warning(op, seconds, size, quick, stacklevel=4)
