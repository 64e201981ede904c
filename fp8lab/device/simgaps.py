"""Closes the gaps of Numba's CUDA simulator (numba-cuda 0.30.x) that the course's kernels need.

Imported by runtime.py only when the simulator is the backend; the only module that touches numba's
simulator internals (BlockManager, BlockThread), so a numba-cuda upgrade is checked in one place.

1. Warp shuffles (`shfl_down_sync`, `shfl_xor_sync`): the simulator has none. Here each warp of a block
   shares a barrier; a shuffle deposits the lane's value, waits for the warp, and reads its source lane.
2. Speed. The simulator runs every CUDA thread as an OS thread and implements `syncthreads` by a manager
   thread that busy-polls all threads while holding the GIL: a barrier cost ~10-25 ms. A condition-variable
   barrier and a yield in the manager's poll make barrier-heavy kernels 3-4x faster.
Both barriers count threads that have exited, so a kernel whose threads return early still completes
(as it does on a GPU), and both are aborted when a thread raises, so a failing kernel never hangs.
3. Silence. Device arithmetic runs as NumPy scalars, which warn on overflow, Inf * 0 or 0 / 0 where a GPU
   gives Inf or NaN silently; each simulated thread runs under np.errstate(ignore) (thread-local, so setting
   it around a launch would not reach these threads).
4. Device-function calls. The simulator calls every device function inside `swapped_cuda_module`, which takes a
   global lock and a lock per module on the way in and out (so that `cuda.threadIdx` in the function's module
   means the calling thread's); with 32-256 threads calling small helpers millions of times, those locks were
   most of a kernel's time (and most of the CI's system time). A device function whose code never names the
   `cuda` module (a bit cast, a bfloat16 rounding) is now called directly: the same Python runs, without locks.
"""

from __future__ import annotations

import sys
import threading
import time
import types

import numpy as np
from numba.cuda.simulator import kernel as _simkernel

WARP_SIZE = 32
_lock = threading.Lock()


class SimulatorAborted(RuntimeError):
    """Another thread of the simulated block raised; this one stops at its next barrier."""


class _Barrier:
    """A reusable barrier whose party count drops as threads exit."""

    def __init__(self, live: int):
        self.cond = threading.Condition()
        self.live = live
        self.waiting = 0
        self.generation = 0
        self.broken = False

    def _release(self):
        self.waiting = 0
        self.generation += 1
        self.cond.notify_all()

    def wait(self):
        with self.cond:
            if self.broken:
                raise SimulatorAborted("simulated block aborted")
            gen = self.generation
            self.waiting += 1
            if self.waiting >= self.live:
                self._release()
                return
            while gen == self.generation and not self.broken:
                self.cond.wait()
            if self.broken and gen == self.generation:
                raise SimulatorAborted("simulated block aborted")

    def leave(self):
        with self.cond:
            self.live -= 1
            if self.waiting and self.waiting >= self.live:
                self._release()

    def abort(self):
        with self.cond:
            self.broken = True
            self.cond.notify_all()


def _nthreads(manager) -> int:
    bx, by, bz = manager._block_dim
    return bx * by * bz


def _state(manager):
    """Per-block state, made on first use: the block barrier, warp barriers, exited thread ids."""
    st = manager.__dict__.get("_fp8lab")
    if st is None:
        with _lock:
            st = manager.__dict__.get("_fp8lab")
            if st is None:
                st = manager._fp8lab = {"block": _Barrier(_nthreads(manager)), "warps": {}, "exited": set()}
    return st


def _warp(thread):
    manager = thread._manager
    st = _state(manager)
    w = thread.thread_id // WARP_SIZE
    warp = st["warps"].get(w)
    if warp is None:
        with _lock:
            warp = st["warps"].get(w)
            if warp is None:
                lanes = min(WARP_SIZE, _nthreads(manager) - w * WARP_SIZE)
                gone = sum(1 for t in st["exited"] if t // WARP_SIZE == w)
                warp = st["warps"][w] = {
                    "barrier": _Barrier(lanes - gone),
                    "lanes": lanes,
                    "values": ([None] * WARP_SIZE, [None] * WARP_SIZE),
                    "round": [0] * WARP_SIZE,
                }
    return warp


def lane_id() -> int:
    """The calling simulated thread's lane (threadIdx.x mod 32 for one-dimensional blocks)."""
    return threading.current_thread().thread_id % WARP_SIZE


def thread_index() -> int:
    """The calling simulated thread's linear index in its block (threadIdx.x for one-dimensional blocks)."""
    return threading.current_thread().thread_id


def _exchange(value) -> tuple[int, list, int]:
    """Deposit this lane's value and wait for the warp: (lane, every lane's value, live lanes). One barrier."""
    # Round r writes buffer r % 2. A lane writes that buffer again only in round r + 2, after every lane
    # has passed the barrier of round r + 1, so every read of round r is done by then.
    t = threading.current_thread()
    lane = t.thread_id % WARP_SIZE
    warp = _warp(t)
    buf = warp["values"][warp["round"][lane] % 2]
    warp["round"][lane] += 1
    buf[lane] = value
    warp["barrier"].wait()
    return lane, buf, warp["lanes"]


def _shuffle(value, src_lane):
    lane, buf, lanes = _exchange(value)
    src = src_lane(lane)
    return buf[src] if 0 <= src < lanes and buf[src] is not None else value


def warp_allgather(value) -> list:
    """Every live lane's value, in lane order: what a warp-wide instruction (mma.sync) sees of its operands.
    One barrier, like a shuffle; the twins of such instructions are built on it."""
    _, buf, lanes = _exchange(value)
    return list(buf[:lanes])


def shfl_down_sync(mask, value, delta):
    """Simulator twin of `cuda.shfl_down_sync`: lane i reads lane i + delta (its own value past the end)."""
    return _shuffle(value, lambda lane: lane + delta if lane + delta < WARP_SIZE else lane)


def shfl_xor_sync(mask, value, lane_mask):
    """Simulator twin of `cuda.shfl_xor_sync`: lane i reads lane i ^ lane_mask."""
    return _shuffle(value, lambda lane: lane ^ lane_mask)


def _syncthreads(self):
    if self.abort:
        raise SimulatorAborted("abort flag set on syncthreads call")
    _state(self._manager)["block"].wait()


_orig_thread_run = _simkernel.BlockThread.run
_orig_is_alive = _simkernel.BlockThread.is_alive
_orig_manager_run = _simkernel.BlockManager.run


def _thread_run(self):
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a GPU gives Inf/NaN silently
            _orig_thread_run(self)
    finally:
        st = _state(self._manager)
        with _lock:
            st["exited"].add(self.thread_id)
            warp = st["warps"].get(self.thread_id // WARP_SIZE)
        st["block"].leave()
        if warp is not None:
            warp["barrier"].leave()


def _is_alive(self):
    time.sleep(0)  # the manager polls this in a tight loop: let the simulated threads run instead
    return _orig_is_alive(self)


def _manager_run(self, *args):
    try:
        return _orig_manager_run(self, *args)
    finally:  # on an exception, wake every thread still waiting so none is left hanging
        st = self.__dict__.get("_fp8lab")
        if st is not None:
            st["block"].abort()
            for w in list(st["warps"].values()):
                w["barrier"].abort()


def _names_cuda(fn) -> bool:
    """Whether fn's code (nested code objects included) reads a global or closure variable bound to numba.cuda, or to
    the simulator's stand-in for it (while a kernel of fn's module runs, the simulator has swapped it in there: a
    kernel from another module, a lecture's editable copy, may call fn later, with numba.cuda back in place)."""
    from numba import cuda
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    names, stack = set(), [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    if any(fn.__globals__.get(n) is cuda or isinstance(fn.__globals__.get(n), FakeCUDAModule) for n in names):
        return True
    for cell in fn.__closure__ or ():
        try:
            if cell.cell_contents is cuda or isinstance(cell.cell_contents, FakeCUDAModule):
                return True
        except ValueError:  # an empty cell
            pass
    return False


_orig_call = _simkernel.FakeCUDAKernel.__call__


def _call(self, *args):
    if self._device:
        direct = self.__dict__.get("_fp8lab_direct")
        if direct is None:
            direct = self._fp8lab_direct = not _names_cuda(self.fn)
        if direct:
            return self.fn(*args)
    return _orig_call(self, *args)


def install() -> None:
    _simkernel.FakeCUDAKernel.__call__ = _call
    sys.setswitchinterval(1e-3)
    _simkernel.BlockThread.syncthreads = _syncthreads
    _simkernel.BlockThread.run = _thread_run
    _simkernel.BlockThread.is_alive = _is_alive
    _simkernel.BlockManager.run = _manager_run
