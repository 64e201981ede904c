"""A caching device allocator behind fp8lab's device arrays, plugged into numba through its External Memory
Management (EMM) interface (numba-cuda documentation, "External Memory Management").

Without it every `cuda.device_array` is a cuMemAlloc and every few frees numba flushes a batch of cuMemFree
calls, which wait for the device: the public API (`fl.quantize` of a 1 GiB device activation) ran at 36% of
its kernel's speed on an H200. Here freed blocks are kept, by rounded size, and handed out again, as PyTorch's
caching allocator does. fp8lab queues all its work on the default stream, so a block is only reused by work
queued after the work that used it. Cached blocks go back to the driver when an allocation runs out of
memory, or on `release()`.

`BlockCache` is the bookkeeping (plain Python, tested on the simulator); `install()` makes it numba's memory
manager on a GPU, before the first CUDA context, unless NUMBA_CUDA_MEMORY_MANAGER names another one.
"""

from __future__ import annotations

import functools
import weakref

SMALL = 1 << 20  # up to 1 MiB: sizes rounded up to 512 B; above: to 2 MiB (little waste, few distinct sizes)
ROUND_SMALL = 512
ROUND_LARGE = 2 << 20


def bucket(nbytes: int) -> int:
    """The size of the block that serves a request of nbytes."""
    step = ROUND_SMALL if nbytes <= SMALL else ROUND_LARGE
    return max(step, -(-nbytes // step) * step)


class BlockCache:
    """Free device blocks by size; `take`, `give` and `release` are its methods. Built with two functions:
    alloc(nbytes) -> pointer (raises MemoryError when the device is full) and free(pointer), which returns a
    block to the driver. The GPU memory manager also releases every cached block when its context is reset."""

    def __init__(self, alloc, free):
        self._alloc, self._free = alloc, free
        self.blocks: dict[int, list] = {}
        self.stats = {"driver_allocs": 0, "reuses": 0, "cached_bytes": 0, "in_use_bytes": 0}

    def take(self, nbytes: int):
        """(pointer, block size) for a request of nbytes: a cached block if one fits, else a new one."""
        n = bucket(nbytes)
        free = self.blocks.get(n)
        if free:
            ptr = free.pop()
            self.stats["reuses"] += 1
            self.stats["cached_bytes"] -= n
        else:
            try:
                ptr = self._alloc(n)
            except MemoryError:  # the cache may hold what is missing
                self.release()
                ptr = self._alloc(n)
            self.stats["driver_allocs"] += 1
        self.stats["in_use_bytes"] += n
        return ptr, n

    def give(self, ptr, n: int) -> None:
        """A block is free again (its array was garbage-collected): keep it for the next request of its size."""
        self.blocks.setdefault(n, []).append(ptr)
        self.stats["cached_bytes"] += n
        self.stats["in_use_bytes"] -= n

    def release(self) -> int:
        """Return every cached block to the driver; the number of bytes freed."""
        freed = 0
        for n, ptrs in self.blocks.items():
            for p in ptrs:
                self._free(p)
                freed += n
        self.blocks.clear()
        self.stats["cached_bytes"] = 0
        return freed


def install() -> bool:
    """Make the caching allocator numba's memory manager (GPU only, before the first context)."""
    from numba.core import config

    if config.CUDA_MEMORY_MANAGER != "default":  # the user chose one (RMM, ...): keep it
        return False
    from numba.cuda.cudadrv import driver as drv

    oom = drv.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY

    def alloc(nbytes):
        try:
            return drv.driver.cuMemAlloc(nbytes)
        except drv.CudaAPIError as e:
            if e.code == oom:
                raise MemoryError(f"out of device memory allocating {nbytes} bytes") from e
            raise

    class CachingMemoryManager(drv.GetIpcHandleMixin, drv.HostOnlyCUDAMemoryManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.cache = BlockCache(alloc, drv.driver.cuMemFree)

        def initialize(self):
            if self.deallocations.memory_capacity == drv._SizeNotSet:  # host allocations' flush threshold
                self.deallocations.memory_capacity = self.get_memory_info().total

        def memalloc(self, size):
            ptr, n = self.cache.take(size)
            give = functools.partial(self.cache.give, ptr, n)
            return drv.MemoryPointer(weakref.proxy(self.context), ptr, size, finalizer=give)

        def get_memory_info(self):
            free, total = drv.driver.cuMemGetInfo()
            return drv.MemoryInfo(free=free, total=total)

        def reset(self):
            super().reset()
            self.cache.release()

        @property
        def interface_version(self):
            return 1

    drv.set_memory_manager(CachingMemoryManager)
    return True


def cache():
    """The current context's BlockCache (None under the simulator or with another memory manager)."""
    from numba import cuda

    return getattr(getattr(cuda.current_context(), "memory_manager", None), "cache", None)
