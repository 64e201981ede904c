"""DeepSeek-V3's EMA of the weights, kept in CPU memory and updated off the training loop's thread (CpuEma)."""

from __future__ import annotations

import numba
import numpy as np

from ..device import runtime


@numba.njit(nogil=True)
def average(ema, w, decay, rest):
    """ema[i] = ema[i] * decay + rest * w[i] for float32 arrays and scalars, in one pass, releasing the GIL; each
    product and the sum rounded to float32 as NumPy rounds them (numba fuses no multiply-add without fastmath),
    so the bits are those of the reference engine's two NumPy lines."""
    for i in range(ema.size):
        ema[i] = ema[i] * decay + rest * w[i]


class CpuEma:
    """An exponential moving average of flat float32 weights kept in CPU memory and updated by a worker thread, as
    DeepSeek-V3 keeps its EMA (arXiv 2412.19437, section 3.3: "stored in CPU memory and updated asynchronously
    after each training step"). `push(copy)` has `copy(buffer)` write the weights into one of two host buffers and
    returns while the worker adds that snapshot (in push order), so the next step's kernels run meanwhile;
    `value()` waits for the worker and returns the average. NumPy releases the GIL during array arithmetic.
    `push(copy, stream)`: `copy(buffer)` only queues the copy on that CUDA stream (buffers in pinned memory); the
    worker waits for it (an event recorded after it) before reading the snapshot; the host waits only when the
    worker is two snapshots behind. `close()` ends the worker and its threads (fl.train calls it at the end of a
    run); an error in the worker is raised again by the next push() or value().

    The update is one pass over memory (`average`: NumPy's `ema *= decay; ema += (1 - decay) * w` reads and writes
    the weights three times) over CHUNK-sized slices on up to THREADS threads: at the large preset the weights are
    0.55 GB a step. Each element sees the same float32 operations, ema * decay + (1 - decay) * w, so the bits do
    not depend on the split."""

    CHUNK = 1 << 20
    THREADS = 16  # at most; memory-bound, so more threads help until the host's memory bandwidth is used up

    def __init__(self, initial: np.ndarray, decay: float, buffers=None):
        import queue
        import threading

        self.ema = np.array(initial, np.float32)
        self.decay, self.rest = np.float32(decay), np.float32(1 - decay)  # as the reference engine rounds them
        self.buffers = buffers or [np.empty_like(self.ema), np.empty_like(self.ema)]
        self.free = [threading.Event(), threading.Event()]
        for e in self.free:
            e.set()
        self.turn = 0
        self.copied = [None, None]  # push(copy, stream): the event after each buffer's queued copy
        self.error = None  # what stopped the worker, raised again in the caller's thread
        self.todo = queue.Queue()
        self.chunks = [slice(i, i + self.CHUNK) for i in range(0, self.ema.size, self.CHUNK)]
        self.pool = None
        if len(self.chunks) > 1:
            import concurrent.futures
            import os

            self.pool = concurrent.futures.ThreadPoolExecutor(min(self.THREADS, os.cpu_count() or 1))
        threading.Thread(target=self._work, daemon=True).start()

    def _add(self, w: np.ndarray, part: slice) -> None:
        average(self.ema.reshape(-1)[part], w[part], self.decay, self.rest)

    def _work(self) -> None:
        while True:
            k = self.todo.get()
            try:
                if k is None:  # close()
                    return
                if self.error is None:
                    self._average(k)
            except BaseException as e:  # kept for the caller; the buffers are freed so that nobody waits forever
                self.error = e
            finally:
                if k is not None:
                    self.free[k].set()
                self.todo.task_done()

    def _average(self, k: int) -> None:
        if self.copied[k] is not None:
            if not runtime.IS_SIM:
                runtime.cuda.current_context()  # this thread's driver calls need the context
            self.copied[k].synchronize()
        w = self.buffers[k].reshape(-1)
        if w.size != self.ema.size or w.dtype != np.float32:  # average() checks no bounds
            raise ValueError(f"a snapshot must hold {self.ema.size} float32 weights, got {w.size} {w.dtype}")
        if self.pool is None:
            self._add(w, slice(None))
        else:
            list(self.pool.map(lambda part: self._add(w, part), self.chunks))

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the CPU EMA's worker failed: {type(self.error).__name__}: {self.error}") \
                from self.error

    def close(self) -> None:
        """End the worker thread and its pool (after the snapshots already pushed)."""
        self.todo.put(None)
        self.todo.join()
        if self.pool is not None:
            self.pool.shutdown()
        self._raise()

    def push(self, copy, stream=None) -> None:
        self._raise()
        k = self.turn
        self.free[k].wait()  # the worker is done with this buffer's previous snapshot
        self.free[k].clear()
        copy(self.buffers[k])
        if stream is not None:
            self.copied[k] = self.copied[k] or runtime.cuda.event()
            self.copied[k].record(stream)
        else:
            self.copied[k] = None
        self.todo.put(k)
        self.turn = 1 - k

    def value(self) -> np.ndarray:
        self.todo.join()
        self._raise()
        return self.ema
