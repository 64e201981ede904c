"""The one place that knows the backend: numba.cuda, the simulator's gaps closed, timing, problem sizes.

Kernel source imports `cuda`, `shfl_down_sync` and `shfl_xor_sync` from here and never forks by backend:
- on the GPU these are numba's own intrinsics;
- under the simulator (which has no warp shuffles) they are emulated (see _simgaps.py), so reduction
  kernels run unchanged. Every live lane of the warp must call the shuffle, as `0xFFFFFFFF` masks
  require on the GPU too.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from . import _backend

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


WARMUP_MS = 50.0
"""Least wall time of warm-up calls before timing (when warmup > 0): an idle GPU runs at low clocks and needs a
few tens of milliseconds of work to reach its boost clock; two warm-up launches of a 0.5 ms kernel are not
enough, and then a compute-heavy kernel looks slower than it is next to a memory-bound copy."""

HOLD_MARGIN_MS = 0.05
HOLD_MAX_MS = 20.0
"""time_ms holds the GPU for twice Python's time to enqueue fn, plus HOLD_MARGIN_MS, at most HOLD_MAX_MS."""


def warm_up(fn, calls: int, sync) -> float | None:
    """`calls` calls of fn, then more until WARMUP_MS of wall time has passed (nothing when calls is 0); `sync`
    waits for the device (numba's or torch's synchronize).

    Returns the median wall time in seconds of one `fn()` call on an idle device, the first call left out (it
    may compile): what Python needs to enqueue fn's work. None when calls is 0.
    """
    enqueue = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        enqueue.append(time.perf_counter() - t)
        sync()
    t0 = time.perf_counter()
    while calls > 0 and (time.perf_counter() - t0) * 1e3 < WARMUP_MS:
        t = time.perf_counter()
        fn()
        enqueue.append(time.perf_counter() - t)
        sync()
    return statistics.median(enqueue[1:] or enqueue) if enqueue else None


def hold_ms(enqueue_s: float | None) -> float:
    """How long to hold the GPU before timing a call whose enqueue takes enqueue_s seconds (None: unknown)."""
    if enqueue_s is None:
        return HOLD_MAX_MS
    return min(HOLD_MAX_MS, 2e3 * enqueue_s + HOLD_MARGIN_MS)


_hold_kernel = None


def hold_gpu(ms: float) -> None:
    """Keep the GPU busy for `ms` milliseconds: one thread spins on %globaltimer (fp8lab.ptx.globaltimer_ns) on
    the default stream, and work enqueued behind it meanwhile runs back to back when it ends. Under the
    simulator the same kernel spins on the host's clock."""
    global _hold_kernel
    if _hold_kernel is None:
        from .ptx import globaltimer_ns

        @cuda.jit
        def hold_kernel(ns):
            t0 = globaltimer_ns()
            spins = np.uint64(0)
            while globaltimer_ns() - t0 < ns and spins < ns:  # spins: a bound, should the clock ever stall
                spins += np.uint64(1)

        _hold_kernel = hold_kernel
    _hold_kernel[1, 1](np.uint64(ms * 1e6))


def time_ms(fn, *, warmup: int = 2, repeat: int = 10) -> float | None:
    """Median GPU time of `fn()` in milliseconds, measured with CUDA events, after `warm_up(fn, warmup)`.

    Before each timed call the GPU is held (`hold_gpu`) for twice the time Python needs to enqueue fn, so the
    start event fires only once fn's kernels are all queued: the events then measure the GPU's work, not the
    GPU waiting for Python (quantize_tile needs ~70 us of Python per call on an H200 host, a fifth of its
    0.34 ms kernel: BENCHMARKS.md). nvbench's "blocking kernel" does the same. `launch_ms` measures the Python side.

    Returns None under the simulator ("not measured"): its events are synchronous and report -1, and a
    Python-threads timing says nothing about a GPU.
    """
    if IS_SIM:
        return None
    hold = hold_ms(warm_up(fn, warmup, cuda.synchronize))
    times = []
    for _ in range(repeat):
        start, stop = cuda.event(), cuda.event()
        hold_gpu(hold)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return statistics.median(times)


def launch_ms(fn, *, repeat: int = 20) -> float | None:
    """Median wall time of one `fn()` call from Python until the GPU has finished it (enqueue, run, synchronize),
    in milliseconds: what a Python loop that waits for each result pays per call (calls queued without waiting
    overlap Python's part with the GPU's). None under the simulator."""
    if IS_SIM:
        return None
    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


_UNUSED: dict = {}


def unused_array(dtype, ndim: int = 2):
    """A (1, ..., 1) device array of dtype to pass where a kernel takes an array it will not touch: allocated
    once and cached, since an allocation per launch costs more than the launch itself."""
    key = (np.dtype(dtype), ndim)
    if key not in _UNUSED:
        _UNUSED[key] = cuda.device_array((1,) * ndim, dtype)
    return _UNUSED[key]


def fmt_ms(ms: float | None) -> str:
    return "not measured (simulator)" if ms is None else f"{ms:.3f} ms"


def grid_1d(n: int, threads: int = 256, max_blocks: int | None = None) -> tuple[int, int]:
    """(blocks, threads) covering n elements; capped for grid-stride loops."""
    blocks = max(1, math.ceil(n / threads))
    if max_blocks is not None:
        blocks = min(blocks, max_blocks)
    return blocks, threads


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
