"""Sum of a float32 vector, the CUDA primer's reduction ladder (lecture 01): atomics, shared memory, warp shuffles.

total = sum(x) for x (n,) float32, into out (1,) float32. Every version first lets each thread add its own elements
i, i + S, i + 2S, ... (a grid-stride loop, S = all threads of the grid: neighbouring threads read neighbouring
addresses, so every warp's load is one coalesced 128-byte line); the versions differ in how the threads' partial
sums meet:

version 1: atomics: every thread adds its partial sum to out[0] with atomicAdd; the adds to one address are
           serialized in the L2 cache, one after another.
version 2: shared memory: a block's threads write their sums to shared memory and halve them in a tree,
           synchronizing the block (syncthreads) between levels; thread 0 adds the block's total (one atomic per
           block).
version 3: warp shuffles: the 32 lanes of a warp exchange registers (shfl.sync.bfly, 5 steps), no shared memory
           and no barrier; lane 0 adds the warp's total (one atomic per warp).

Floating-point addition is not associative: each version adds in another order, and the order of atomics changes
from run to run, so totals differ in their last bits; all are within float32's error bound of the float64 sum
(`error_bound`). Also here, for the primer's first lessons: `thread_ids` (every thread writes where it is in the
grid: block, thread, warp, lane, global index) and `axpy` (y = a x + y with a grid-stride loop).

Run `python -m fp8lab.kernels.reduce` to check every version against the reference, then (on a GPU) time them
against a copy.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from .. import bench
from ..device import runtime
from ..bench import timing
from ..device.runtime import WARP_SIZE, cuda
from .common import warp_sum
from .versions import Version

THREADS = runtime.block_threads(256)  # threads per block: a power of two (version 2's tree halves it)
BLOCKS = 4 if runtime.IS_SIM else 1024  # blocks of the grid-stride launch: ~8 per SM on a 132-SM GPU


@cuda.jit(device=True)
def thread_sum(x):
    """The first step of every version: this thread's elements g, g + S, g + 2S, ... (S = all threads of the grid)
    added in a register; neighbouring threads read neighbouring addresses at every step (coalesced)."""
    acc = np.float32(0)
    i = cuda.grid(1)
    while i < x.size:
        acc += x[i]
        i += cuda.gridsize(1)
    return acc


@cuda.jit
def reduce_kernel1(x, out):
    cuda.atomic.add(out, 0, thread_sum(x))  # every thread: gridsize atomics on one address


@cuda.jit
def reduce_kernel2(x, out):
    part = cuda.shared.array(THREADS, np.float32)  # one slot per thread of the block
    t = cuda.threadIdx.x
    part[t] = thread_sum(x)
    cuda.syncthreads()  # every slot written before any is read
    half = cuda.blockDim.x // 2
    while half > 0:
        if t < half:
            part[t] += part[t + half]
        cuda.syncthreads()  # this level done before the next reads it (every thread reaches it: no deadlock)
        half //= 2
    if t == 0:
        cuda.atomic.add(out, 0, part[0])


@cuda.jit
def reduce_kernel3(x, out):
    acc = warp_sum(thread_sum(x))  # registers to registers inside the warp: every lane gets the warp's total
    if cuda.threadIdx.x % WARP_SIZE == 0:
        cuda.atomic.add(out, 0, acc)


VERSIONS = {
    1: Version("atomics: a grid-stride partial sum per thread, then one atomicAdd per thread on out[0]",
               reduce_kernel1),
    2: Version("shared memory: a tree over the block's partial sums with syncthreads, one atomicAdd per block",
               reduce_kernel2),
    3: Version("warp shuffles: 5 xor-shuffles per warp, no shared memory or barrier, one atomicAdd per warp",
               reduce_kernel3),
}
BEST = 3


def grid(n: int, blocks: int | None = None) -> int:
    """Blocks of a launch for n elements: BLOCKS (1024 x 256 threads on a GPU, 4 x 32 under the simulator), fewer
    when n is small; or `blocks`."""
    return min(BLOCKS, max(1, -(-n // THREADS))) if blocks is None else V.positive_int("blocks", blocks)


def launch(x, out, *, version: int = BEST, blocks: int | None = None) -> None:
    """out[0] = sum(x) for device arrays x (n,) float32 and out (1,) float32; out is zeroed first (the kernels add
    into it). blocks: the grid (None: `grid`)."""
    version = V.version("version", version, VERSIONS, default=BEST)
    for name, a, shape in (("x", x, None), ("out", out, (1,))):
        if not V.is_device_array(a):
            raise TypeError(f"{name} must be a CUDA device array (cuda.to_device), got {V.describe(a)}")
        if a.dtype != np.float32 or a.ndim != 1 or (shape and a.shape != shape):
            raise ValueError(f"{name} must be a 1-D float32 device array{' of shape (1,)' if shape else ''}, "
                             f"got {V.describe(a)}")
    g = grid(x.shape[0], blocks)
    out.copy_to_device(np.zeros(1, np.float32))
    VERSIONS[version].kernel[g, THREADS](x, out)


def reduce_sum(x, *, version: int | None = None) -> float:
    """sum(x) of a 1-D float32 array (host or device) on the GPU (or simulator), as a Python float."""
    x = runtime.to_device(x)  # device arrays pass through
    out = cuda.device_array(1, np.float32)
    launch(x, out, version=BEST if version is None else version)
    return float(out.copy_to_host()[0])


def reference(x) -> float:
    """The float64 sum: what every version approximates."""
    return float(np.sum(np.asarray(x, np.float64)))


def error_bound(x) -> float:
    """float32 summation's error bound, (n + 32) u sum |x| with u = 2^-24: whatever the order of the additions (a
    thread's loop, a tree, shuffles, atomics: adding a 0 is exact), the float sum of n terms is within about
    (n - 1) u sum |x| of the exact one (Higham, Accuracy and Stability of Numerical Algorithms, section 4.2);
    the 32 is slack."""
    a = np.abs(np.asarray(x, np.float64))
    return (a.size + 32) * 2.0**-24 * float(a.sum())


# ----------------------------------------------------------------------------------------------------------------
# The primer's first kernels
# ----------------------------------------------------------------------------------------------------------------

ID_FIELDS = ("block", "thread", "warp", "lane", "global")


@cuda.jit
def thread_ids_kernel(ids):
    """ids[g] = (blockIdx.x, threadIdx.x, warp, lane, g) for the thread with global index g."""
    g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # = cuda.grid(1)
    if g < ids.shape[0]:  # the last block may have threads past the end
        ids[g, 0] = cuda.blockIdx.x
        ids[g, 1] = cuda.threadIdx.x
        ids[g, 2] = cuda.threadIdx.x // WARP_SIZE
        ids[g, 3] = cuda.threadIdx.x % WARP_SIZE
        ids[g, 4] = g


def thread_ids(blocks: int, threads: int, n: int | None = None) -> np.ndarray:
    """Launch thread_ids_kernel on `blocks` blocks of `threads` threads for n rows (default: every thread): an
    (n, 5) int32 array with the columns ID_FIELDS."""
    blocks, threads = V.positive_int("blocks", blocks), V.positive_int("threads", threads)
    if threads > 1024:
        raise ValueError(f"threads must be at most 1024 (CUDA's limit per block), got {threads}")
    n = blocks * threads if n is None else V.positive_int("n", n)
    ids = bench.poisoned((n, len(ID_FIELDS)), np.int32)
    thread_ids_kernel[blocks, threads](ids)
    return ids.copy_to_host()


def reference_thread_ids(blocks: int, threads: int, n: int | None = None) -> np.ndarray:
    n = blocks * threads if n is None else n
    g = np.arange(n)
    return np.stack([g // threads, g % threads, g % threads // WARP_SIZE, g % threads % WARP_SIZE, g], 1).astype(
        np.int32)


@cuda.jit
def axpy_kernel(a, x, y):
    """y = a x + y, with a grid-stride loop: any grid covers any n."""
    i = cuda.grid(1)
    while i < x.size:
        y[i] = a * x[i] + y[i]
        i += cuda.gridsize(1)


def axpy(a: float, x, y, *, blocks: int | None = None) -> None:
    """y = a x + y in place for 1-D float32 device arrays of one length; blocks: the grid (None: enough blocks for
    one element per thread, at most runtime.MAX_BLOCKS)."""
    for name, v in (("x", x), ("y", y)):
        if not V.is_device_array(v) or v.dtype != np.float32 or v.ndim != 1:
            raise TypeError(f"{name} must be a 1-D float32 CUDA device array, got {V.describe(v)}")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have one shape, got {x.shape} and {y.shape}")
    grid = runtime.grid_1d(x.shape[0], THREADS, runtime.MAX_BLOCKS)[0] if blocks is None else \
        V.positive_int("blocks", blocks)
    axpy_kernel[grid, THREADS](np.float32(a), x, y)


def reference_axpy(a: float, x, y) -> np.ndarray:
    return (np.float32(a) * np.asarray(x, np.float32) + np.asarray(y, np.float32)).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Check, then time (bench.main)
# ----------------------------------------------------------------------------------------------------------------

CHECK_N = {"sim": (1, 1000, 4099), "gpu": (1, 1000, 4099, 10_000_019)}
"""Vector lengths for the checks: one element, and lengths that are not multiples of a block or of the grid."""
BENCH_N = 1 << 26  # 256 MiB of float32


def make_input(rng, n: int) -> np.ndarray:
    """float32 of both signs over six decades, never all zero."""
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(np.float32)


def checks(rng, only=None) -> list:
    """only: the versions (and of "thread_ids", "axpy" the ops) to check (bench.selected); None: all."""
    out = []
    for n in CHECK_N["sim" if runtime.IS_SIM else "gpu"]:
        x = make_input(rng, n)
        x_d = cuda.to_device(x)
        ref, bound = reference(x), error_bound(x)
        for v in (v for v in VERSIONS if bench.selected(only, v)):
            total = bench.poisoned(1, np.float32)
            launch(x_d, total, version=v)
            got = float(total.copy_to_host()[0])
            assert np.isfinite(got) and abs(got - ref) <= bound, f"v{v}, n = {n}: {got} against {ref} (bound {bound})"
            out.append((f"v{v} sum, n = {n:,}", f"within {bound:.1e} of the float64 sum"))
    if bench.selected(only, "thread_ids"):
        ids = thread_ids(3, 64, 150)
        assert np.array_equal(ids, reference_thread_ids(3, 64, 150)), "thread_ids differ"
        out.append(("thread_ids 3 x 64 for 150 rows", "bit-exact"))
    if bench.selected(only, "axpy"):
        x, y = make_input(rng, 1001), make_input(rng, 1001)
        y_d = cuda.to_device(y)
        axpy(0.5, cuda.to_device(x), y_d, blocks=2)
        assert np.array_equal(y_d.copy_to_host(), reference_axpy(0.5, x, y)), "axpy differs"
        out.append(("axpy n = 1001 on 2 blocks", "bit-exact"))
    return out


def timings(rng, args) -> list:
    """Every version (those in args.only) at n = 2^26 (the bytes read: 4n) against a copy of the same buffer."""
    only = getattr(args, "only", None)
    x_d = cuda.to_device(make_input(rng, BENCH_N))
    total = cuda.device_array(1, np.float32)
    g = grid(BENCH_N)
    # only the kernel is timed (launch() also zeroes `total` from the host); the sums pile up in total, unread
    rows = [bench.time_row(f"v{v}: {d}", lambda v=v: VERSIONS[v].kernel[g, THREADS](x_d, total), 4.0 * BENCH_N)
            for v, d in VERSIONS.items() if bench.selected(only, v)]
    torch = bench.torch_cuda()
    if torch is not None and only is None:
        tx = torch.as_tensor(x_d.copy_to_host()).cuda()
        rows.append(bench.time_row("torch.sum", lambda: tx.sum(), 4.0 * BENCH_N,
                                   timer=lambda fn: timing.torch_time_ms(torch, fn)))
    return [bench.Table(f"sum of {BENCH_N:,} float32 ({4 * BENCH_N >> 20} MiB read, {g} blocks of {THREADS}); bytes = "
                        "read; a copy is the reference (a pure read may beat it: no turnarounds from reads to "
                        "writes)", "GB/s", rows, ceiling=bench.copy_ceiling_gbs(4 * BENCH_N))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
