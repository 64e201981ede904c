"""The one place that knows the backend: numba.cuda, the simulator's gaps closed, problem sizes, launch helpers.

Kernel source imports `cuda`, `shfl_down_sync` and `shfl_xor_sync` from here and never forks by backend:
- on the GPU these are numba's own intrinsics;
- under the simulator (which has no warp shuffles) they are emulated (see _simgaps.py), so reduction
  kernels run unchanged. Every live lane of the warp must call the shuffle, as `0xFFFFFFFF` masks
  require on the GPU too.
"""

from __future__ import annotations

import math

import numpy as np

from . import _backend, _validate

backend, backend_reason = _backend.select()
IS_SIM = backend == "sim"

from numba import cuda  # noqa: E402  (must follow backend selection)

FULL_MASK = 0xFFFFFFFF
WARP_SIZE = 32

if IS_SIM:
    from . import _simgaps

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
        "bench": dict(n=4096),
        "gemm_tile": 8,
    },
    "gpu": {
        "train": dict(batch=64, d_in=512, d_out=256, steps=600, lr=1e-3, ema_decay=0.99),
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


_UNUSED: dict = {}


def unused_array(dtype, ndim: int = 2):
    """A (1, ..., 1) device array of dtype to pass where a kernel takes an array it will not touch: allocated
    once and cached, since an allocation per launch costs more than the launch itself."""
    key = (np.dtype(dtype), ndim)
    if key not in _UNUSED:
        _UNUSED[key] = cuda.device_array((1,) * ndim, dtype)
    return _UNUSED[key]


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
