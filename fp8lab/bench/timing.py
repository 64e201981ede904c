"""Timing GPU work from Python: CUDA events around the work, the GPU held until Python has queued it.

- `time_ms(fn)`: median GPU time of fn() (what a kernel costs the GPU);
- `launch_ms(fn)`: median wall time of one call from Python until the GPU is done (what a Python loop pays);
- `torch_time_ms(torch, fn)`: time_ms for PyTorch work (peers and ceilings measured in the same run);
- `hold_gpu(ms)`, `warm_up(fn, calls, sync)`, `hold_ms(enqueue_s)`: the pieces; `fmt_ms(ms)` for tables.

Under the simulator nothing is timed (None, shown as "not measured"): its events are synchronous and report
-1, and a timing of Python threads says nothing about a GPU.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..device import ptx, runtime
from ..device.runtime import cuda

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


def _make_hold_kernel():
    globaltimer_ns = ptx.globaltimer_ns

    @cuda.jit
    def hold_kernel(ns):
        t0 = globaltimer_ns()
        spins = np.uint64(0)
        while globaltimer_ns() - t0 < ns and spins < ns:  # spins: a bound, should the clock ever stall
            spins += np.uint64(1)

    return hold_kernel


def hold_gpu(ms: float) -> None:
    """Keep the GPU busy for `ms` milliseconds: one thread spins on %globaltimer (ptx.globaltimer_ns) on
    the default stream, and work enqueued behind it meanwhile runs back to back when it ends. Under the
    simulator the same kernel spins on the host's clock."""
    runtime.cached(("timing.hold",), _make_hold_kernel)[1, 1](np.uint64(ms * 1e6))


def time_ms(fn, *, warmup: int = 2, repeat: int = 10) -> float | None:
    """Median GPU time of `fn()` in milliseconds, measured with CUDA events, after `warm_up(fn, warmup)`.

    Before each timed call the GPU is held (`hold_gpu`) for twice the time Python needs to enqueue fn, so the
    start event fires only once fn's kernels are all queued: the events then measure the GPU's work, not the
    GPU waiting for Python (quantize_tile needs ~70 us of Python per call on an H200 host, a fifth of its
    0.34 ms kernel). nvbench's "blocking kernel" does the same. `launch_ms` measures the Python side.

    Returns None under the simulator ("not measured"): its events are synchronous and report -1, and a
    Python-threads timing says nothing about a GPU.
    """
    if runtime.IS_SIM:
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
    if runtime.IS_SIM:
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


def torch_time_ms(torch, fn, warmup: int = 3, repeat: int = 20) -> float:
    """Median GPU time of a PyTorch callable with CUDA events, warmed up and held as `time_ms` does. The hold runs
    on numba's default stream, the legacy NULL stream, so it orders PyTorch's work only while PyTorch's current
    stream is that stream too (its default)."""
    hold = hold_ms(warm_up(fn, warmup, torch.cuda.synchronize))
    on_null_stream = torch.cuda.current_stream().cuda_stream == 0
    times = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if on_null_stream:
            hold_gpu(hold)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def fmt_ms(ms: float | None) -> str:
    return "not measured (simulator)" if ms is None else f"{ms:.3f} ms"
