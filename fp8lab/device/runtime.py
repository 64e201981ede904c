"""The one place that knows the backend: numba.cuda, the simulator's gaps closed, problem sizes, launch helpers.

Kernel source imports `cuda`, `shfl_down_sync` and `shfl_xor_sync` from here and never forks by backend:
- on the GPU these are numba's own intrinsics;
- under the simulator (which has no warp shuffles) they are emulated (see _simgaps.py), so reduction
  kernels run unchanged. Every live lane of the warp must call the shuffle, as `0xFFFFFFFF` masks
  require on the GPU too.
"""

from __future__ import annotations

import dataclasses
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


def per_backend(table: dict):
    """table["sim"] or table["gpu"], for this backend (a dict is copied): problem sizes are tiny under the simulator,
    which runs every thread as a Python thread (~1e4 threads/s), and realistic on a GPU. The modules that use sizes
    keep their own tables (fp8lab.training.loop's, a kernel module's)."""
    value = table[backend]
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
    library's in it for a check, and the library's back afterwards."""
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


@dataclasses.dataclass(frozen=True)
class Capability:
    """What a kernel needs of the GPU: `what` names it for the error ("wgmma, which needs an sm_90 GPU ..."), and the
    compute capabilities that have it, min_cc to max_cc (None: no upper end)."""

    what: str
    min_cc: tuple[int, int]
    max_cc: tuple[int, int] | None = None

    def ok(self, cc: tuple[int, int]) -> bool:
        return tuple(cc) >= self.min_cc and (self.max_cc is None or tuple(cc) <= self.max_cc)

    def here(self) -> bool:
        """Whether this device has it (always under the simulator, which runs the twins)."""
        cc = compute_capability()
        return cc is None or self.ok(cc)


def require_capability(what: str, version, ok) -> None:
    """ValueError unless the device can run `what` (ok: a predicate on (major, minor)); nothing under the
    simulator."""
    cc = compute_capability()
    if cc is not None and not ok(cc):
        raise ValueError(f"version {version} runs {what}; this device has compute capability {cc[0]}.{cc[1]}: "
                         f"choose another version (None picks the best this device can run)")


def require(needs: Capability, version) -> None:
    """ValueError naming `version` unless this device has `needs`; nothing under the simulator."""
    require_capability(needs.what, version, needs.ok)


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

@dataclasses.dataclass(frozen=True)
class SimCost:
    """Seconds one public call takes under the simulator: a + b * work + c * threads, fitted to timed calls
    (docs/notes/simulator.md says how). The op that launches says what it costs: a kernel version's entry in its
    VERSIONS table, the quantization API's table in fp8lab.quant, the training loop's in fp8lab.training.loop.

    tile (tm, tn, tk), for a GEMM: dims (M, N, K) rounded up to the tile the version's threads cover (idle threads
    run too), work = M N K, threads = M N. step=True, for a training step: dims (B, K, N), work = B N K (Fprop and
    Wgrad), threads = B N + N K + B K (one per output of those GEMMs). Otherwise work = the elements of dims.
    names: how the warning names dims ("M x N x K = ")."""

    a: float
    b: float
    c: float = 0.0
    tile: tuple | None = None
    step: bool = False
    names: str = ""

    def seconds(self, dims) -> float:
        """Estimated seconds of one call on `dims`."""
        if self.step:
            B, K, N = dims
            return self.a + self.b * B * N * K + self.c * (B * N + N * K + B * K)
        if self.tile:
            M, N, K = (-(-d // t) * t for d, t in zip(dims, self.tile))
            return self.a + self.b * M * N * K + self.c * M * N
        return self.a + self.b * math.prod(dims)


_SIM_WARNED: set = set()
_NICE = sorted({2**k for k in range(3, 25)} | {3 * 2**k for k in range(2, 24)})  # 8, 12, 16, 24, 32, 48, ...


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 600:
        return f"{s // 60} min {s % 60} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 >= 60 else f"{s // 3600} h"


def sim_cost_warning(what: str, seconds: float, size: str, quick: str) -> bool:
    """Under the simulator, warn once per `what` per process (SimulatorSlowWarning) when `seconds`, the estimate
    for `size`, is above SIM_WARN_S; `quick` says which sizes are fast. Returns whether it warned."""
    if backend != "sim" or seconds <= SIM_WARN_S or what in _SIM_WARNED:
        return False
    _SIM_WARNED.add(what)
    warnings.warn(f"{what} on the simulator: about {_duration(seconds)} for {size} (estimated); {quick}. On a GPU "
                  "each launch takes milliseconds; set FP8LAB_BACKEND=gpu on a machine with one.", SimulatorSlowWarning,
                  stacklevel=_validate.user_stacklevel())
    return True


def sim_check(what: str, dims, cost: SimCost, steps: int = 1) -> None:
    """The one line before a public call's launch: under the simulator, warn (once per `what`, e.g. "fl.gemm") when
    `cost` puts `steps` calls on `dims` above SIM_WARN_S, naming the n x n (x n) that it puts under SIM_QUICK_S."""
    if backend != "sim" or what in _SIM_WARNED:
        return
    dims = tuple(int(d) for d in dims)
    seconds = steps * cost.seconds(dims)
    if seconds > SIM_WARN_S:
        n = max([n for n in _NICE if cost.seconds((n,) * len(dims)) <= SIM_QUICK_S], default=1)
        size = cost.names + "x".join(map(str, dims)) + (f", {steps} steps" if steps > 1 else "")
        quick = f"sizes like {'x'.join([str(n)] * len(dims))} take about {SIM_QUICK_S:g} s" + " a step" * (steps > 1)
        sim_cost_warning(what, seconds, size, quick)
