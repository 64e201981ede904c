"""Overlap on one GPU, experiment 2, the SM budget: an FP8 GEMM that leaves SMs to a communication kernel.

DeepSeek-V3 (arXiv 2412.19437, section 3.2.2) gives 20 of the H800's 132 SMs to its communication kernels.
`sm_budget()` runs the persistent FP8 GEMM (fp8_gemm version 7) on `sms` SMs, alone and beside `copy_persistent`
(a bandwidth-bound stand-in for a communication kernel, one block per SM) on the SMs left over, on a second stream:
GEMM TFLOP/s and copy GB/s for each split, and what giving 20 SMs away costs the GEMM; `plot_sm_budget` draws it.
Under the simulator it runs at tiny sizes on a pretend device of 2 SMs and times nothing.

`copy_kernel` is lecture 10's editable kernel: `checks(rng, only=["copy"])` checks it alone and `timings` with
`args.only = ["copy"]` times it on every SM (what `fp8lab.course.notebook.try_kernel` runs). `fp8lab bench overlap`
(`fp8lab.comm.overlap`) runs this experiment with experiment 1 (`fp8lab.comm.streams`).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..device import hardware, runtime
from ..device.runtime import cuda
from ..kernels import fp8_gemm as fg
from .overlap_common import (CHECK_SIZES, GIVEN_SMS, NOT_MEASURED, SIZES, assert_gemm, check_bytes, check_shape,
                             covered, default_splits, gemm_operands, launch_gemm, size_text, sms_text,
                             timed_on_streams)

COPY_THREADS = runtime.block_threads(1024)  # per block of copy_persistent: 1024 on a GPU, 32 under the simulator
COPY_SMEM = hardware.SM90["smem"] // 2
"""Shared memory each copy block reserves and never uses, so that it owns its SM as a communication kernel does: half
of an sm_90 SM's 228 KiB, and with the 1 KiB the system reserves per block neither a second copy block nor a block
of fp8_gemm version 7 (129 KiB) fits beside it (CUDA C++ Programming Guide, compute capability 9.0)."""


# ----------------------------------------------------------------------------------------------------------------
# The communication stand-in: a persistent copy kernel, one block per SM
# ----------------------------------------------------------------------------------------------------------------


COPY_UNROLL = 8  # loads in flight per thread before its stores: 64 bytes, 64 KiB per SM of 1024 threads


@cuda.jit
def copy_kernel(src8, dst8, repeats):
    """dst8 = src8, `repeats` times over, by gridDim.x blocks that stay resident until done (a persistent kernel,
    like a communication kernel that owns its SMs). src8, dst8: 1-D uint64 (the float32 buffer's bytes, 8 at a time:
    a warp moves 256 contiguous bytes per instruction, and integers copy every bit). Each thread issues COPY_UNROLL
    loads, a grid stride apart, before it stores them: enough bytes in flight for a few SMs to stream from HBM."""
    n = src8.shape[0]
    step = cuda.gridDim.x * cuda.blockDim.x
    first = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    buf = cuda.local.array(COPY_UNROLL, np.uint64)  # constant indices after unrolling: registers
    for _ in range(repeats):
        i = first
        while i + (COPY_UNROLL - 1) * step < n:
            for u in range(COPY_UNROLL):
                buf[u] = src8[i + u * step]
            for u in range(COPY_UNROLL):
                dst8[i + u * step] = buf[u]
            i += COPY_UNROLL * step
        while i < n:
            dst8[i] = src8[i]
            i += step


def copy_persistent(src, dst, blocks: int, repeats: int = 1, stream=0) -> None:
    """dst[:] = src, `repeats` times, by a grid of `blocks` blocks (one per SM) of COPY_THREADS threads.

    src, dst: float32 1-D device arrays of the same even size (8-byte words); blocks: 1..the device's
    SMs (fp8_gemm.device_sms()); repeats: positive int; stream: a numba stream (0: the default stream). Moves
    2 * src.nbytes * repeats bytes (read + written). Each block reserves COPY_SMEM of shared memory, so `blocks`
    blocks take `blocks` SMs to themselves. Asynchronous, like every launch.
    """
    for name, x in (("src", src), ("dst", dst)):
        V.array(name, x, dtype=np.float32, ndim=1)
        if not V.is_device_array(x):
            raise TypeError(f"{name} must be a device array (cuda.device_array / cuda.to_device), got {V.describe(x)}")
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have the same shape, got {src.shape} and {dst.shape}")
    if src.size % 2:
        raise ValueError(f"src.size must be even (the kernel moves 8-byte words), got {src.size}")
    limit = fg.device_sms()
    if isinstance(blocks, (bool, np.bool_)) or not isinstance(blocks, (int, np.integer)):
        raise TypeError(f"blocks must be an int in 1..{limit} (this device's SMs), got {V.describe(blocks)}")
    if not 1 <= blocks <= limit:
        raise ValueError(f"blocks must be an int in 1..{limit} (this device's SMs), got {blocks}")
    repeats = V.positive_int("repeats", repeats)
    runtime.launch_with_shared(copy_kernel, int(blocks), COPY_THREADS, COPY_SMEM, src.view(np.uint64),
                               dst.view(np.uint64), repeats, stream=stream)


# ----------------------------------------------------------------------------------------------------------------
# Experiment 2: the SM budget
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Split:
    """One split of the SMs: `sms` to the GEMM, `copy_sms` (the rest) to the copy. Times in ms (None: not measured
    or not applicable). gemm_beside_ms: the GEMM while the copy runs (its repeats outlast the GEMM); copy_beside_ms:
    one repeat of the copy while the GEMM runs (the GEMM launched until it outlasts the copy); *_covered: the
    fraction of that op's span during which the other ran."""

    sms: int
    copy_sms: int
    gemm_alone_ms: float | None = None
    gemm_beside_ms: float | None = None
    gemm_covered: float | None = None
    copy_alone_ms: float | None = None
    copy_beside_ms: float | None = None
    copy_covered: float | None = None


@dataclasses.dataclass
class SmBudgetResult:
    """`sm_budget()`: one Split per GEMM SM count, the ceilings measured in the same run (None when not measured or
    not available): v6 (one block per tile, every SM), cuBLAS blockwise FP8 (TFLOP/s) and the copy ceiling (GB/s)."""

    gemm: tuple
    total_sms: int
    copy_bytes: int
    splits: list
    v6_ms: float | None = None
    cublas_tflops: float | None = None
    copy_ceiling_gbs: float | None = None

    def to_dict(self) -> dict:
        """Plain data (JSON-ready); `from_dict` rebuilds the result, e.g. from a run recorded on a GPU."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SmBudgetResult":
        d = dict(d)
        d["gemm"], d["splits"] = tuple(d["gemm"]), [Split(**sp) for sp in d["splits"]]
        return cls(**d)

    @property
    def flops(self) -> float:
        M, N, K = self.gemm
        return 2.0 * M * N * K

    def split(self, sms: int) -> Split | None:
        return next((s for s in self.splits if s.sms == sms), None)

    def cost(self, given: int = GIVEN_SMS, beside: bool = False) -> float | None:
        """1 - (GEMM TFLOP/s on total - given SMs) / (on all SMs, alone): what giving `given` SMs away costs the
        GEMM, alone or beside the copy on them. None when not measured."""
        full, part = self.split(self.total_sms), self.split(self.total_sms - given)
        if full is None or part is None or full.gemm_alone_ms is None:
            return None
        ms = part.gemm_beside_ms if beside else part.gemm_alone_ms
        return None if ms is None else 1.0 - full.gemm_alone_ms / ms

    def tables(self) -> list:
        M, N, K = self.gemm
        full = self.split(self.total_sms)
        base = None if full is None else full.gemm_alone_ms

        def of_full(ms):
            return "-" if ms is None or base is None else f"{base / ms:.1%}"

        def pct(x):
            return "-" if x is None else f"{x:.0%}"

        gemm_rows = []
        if self.v6_ms is not None:  # measured beside the splits (not under the simulator)
            gemm_rows.append(bench.Row(f"v6: one block per tile, all {self.total_sms} SMs", self.v6_ms, self.flops,
                                       {"of v7 on all SMs": of_full(self.v6_ms), "copy running during": "-"}))
        copy_rows = []
        for s in self.splits:
            gemm_rows.append(bench.Row(f"v7 on {sms_text(s.sms)}, alone", s.gemm_alone_ms, self.flops,
                                       {"of v7 on all SMs": of_full(s.gemm_alone_ms), "copy running during": "-"}))
            if s.copy_sms:
                gemm_rows.append(bench.Row(f"v7 on {sms_text(s.sms)}, beside the copy on {s.copy_sms}",
                                           s.gemm_beside_ms, self.flops,
                                           {"of v7 on all SMs": of_full(s.gemm_beside_ms),
                                            "copy running during": pct(s.gemm_covered)}))
                copy_rows.append(bench.Row(f"copy on {sms_text(s.copy_sms)}, alone", s.copy_alone_ms,
                                           2.0 * self.copy_bytes, {"GEMM running during": "-"}))
                copy_rows.append(bench.Row(f"copy on {sms_text(s.copy_sms)}, beside v7 on {s.sms}", s.copy_beside_ms,
                                           2.0 * self.copy_bytes, {"GEMM running during": pct(s.copy_covered)}))
        title = (f"SM budget: FP8 GEMM {M}x{N}x{K} (fp8_gemm v7, persistent) on part of the {self.total_sms} SMs, "
                 "alone and beside a copy kernel on the others (second stream)")
        if self.split(self.total_sms - GIVEN_SMS) is not None:
            cost, cost_beside = self.cost(), self.cost(beside=True)
            title += f"; giving {GIVEN_SMS} SMs away costs the GEMM " + (
                "(not measured)" if cost is None else
                f"{cost:.1%} alone" + ("" if cost_beside is None else f", {cost_beside:.1%} beside the copy"))
        tables = [bench.Table(title, "TFLOP/s", gemm_rows,
                              ceiling=self.cublas_tflops, ceiling_label="cuBLAS FP8 blockwise", peak_kind="fp8")]
        if copy_rows:
            tables.append(bench.Table(f"SM budget: the copy kernel ({size_text(self.copy_bytes)} read and written per "
                                      "repeat, one block per SM) on the SMs the GEMM leaves, alone and beside it",
                                      "GB/s", copy_rows, ceiling=self.copy_ceiling_gbs))
        cells = []
        for s in self.splits:
            gb = bench.rate(self.flops, s.gemm_beside_ms, "TFLOP/s")
            ca = bench.rate(2.0 * self.copy_bytes, s.copy_alone_ms, "GB/s")
            cb = bench.rate(2.0 * self.copy_bytes, s.copy_beside_ms, "GB/s")
            ga = bench.rate(self.flops, s.gemm_alone_ms, "TFLOP/s")
            cells.append([f"{s.sms} + {s.copy_sms}",
                          "not measured" if ga is None else f"{ga:,.1f}",
                          "-" if not s.copy_sms else ("not measured" if gb is None else f"{gb:,.1f}"),
                          of_full(s.gemm_alone_ms),
                          "-" if not s.copy_sms else ("not measured" if ca is None else f"{ca:,.0f}"),
                          "-" if not s.copy_sms else ("not measured" if cb is None else f"{cb:,.0f}")])
        tables.append(bench.Table("SM budget, summary: SMs to the GEMM + SMs to the copy", None,
                                  header=["SMs", "GEMM TFLOP/s alone", "GEMM beside the copy", "GEMM of all SMs",
                                          "copy GB/s alone", "copy beside the GEMM"], cells=cells))
        return tables


def _check_splits(splits, total: int) -> tuple[int, ...]:
    if not isinstance(splits, (tuple, list)) or not splits:
        raise TypeError(f"splits must be a non-empty tuple of ints in 1..{total} (SMs for the GEMM), "
                        f"got {V.describe(splits)}")
    out = []
    for k, s in enumerate(splits):
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"splits[{k}] must be an int in 1..{total} (SMs for the GEMM), got {V.describe(s)}")
        if not 1 <= s <= total:
            raise ValueError(f"splits[{k}] must be an int in 1..{total} (SMs for the GEMM), got {s}")
        out.append(int(s))
    return tuple(out)


def sm_budget(gemm=None, copy_bytes=None, total_sms=None, splits=None, *, measure: bool = True, repeat: int = 5,
              rng=None) -> SmBudgetResult:
    """The persistent FP8 GEMM (fp8_gemm version 7) on `sms` of `total_sms` SMs for each sms in `splits`: alone,
    then beside copy_persistent on the other total_sms - sms SMs (a second stream). Outputs poisoned and verified
    (the GEMM beside the copy gives the bits it gives alone; the copy delivers its buffer).

    gemm: (M, N, K); copy_bytes: the copy's buffer (multiple of 8; each repeat reads and writes it); total_sms:
    1..the device's SMs (None: all); splits: SMs for the GEMM, each in 1..total_sms (None: default_splits(total)).
    None sizes: SIZES (a 2-tile GEMM, 8 KiB, a pretend device of 2 SMs under the simulator; 4096 x 7168 x 16384 and
    256 MiB on a GPU). measure=False runs each configuration once, untimed (what `checks` does). On a GPU the
    ceilings are measured in the same run: v6 (every SM), cuBLAS blockwise FP8 through torch when installed, and
    bench.copy_ceiling_gbs.

    Timing: the GEMM beside the copy runs while the copy, given enough repeats to outlast it, streams on the other
    SMs; the copy beside the GEMM is timed per repeat while the GEMM, launched until it outlasts the copy, runs.
    A block of the GEMM takes nearly all of an SM's registers (256 threads; ptxas's count per thread is in
    docs/notes/overlap.md) and 129 KiB of its shared memory, a block of the copy reserves COPY_SMEM: no two blocks
    share an SM, so the GEMM's `sms` blocks run on `sms` SMs and the copy's blocks on the others.
    """
    size = SIZES[runtime.backend]["sm_budget"]
    M, N, K = check_shape("gemm", size["gemm"] if gemm is None else gemm)
    nbytes = check_bytes("copy_bytes", size["copy_bytes"] if copy_bytes is None else copy_bytes)
    limit = fg.device_sms()
    total = size["total_sms"] if total_sms is None else total_sms
    total = limit if total is None else total
    if isinstance(total, (bool, np.bool_)) or not isinstance(total, (int, np.integer)):
        raise TypeError(f"total_sms must be None or an int in 1..{limit} (this device's SMs), got {V.describe(total)}")
    if not 1 <= total <= limit:
        raise ValueError(f"total_sms must be None or an int in 1..{limit} (this device's SMs), got {total}")
    total = int(total)
    if splits is None:
        splits = size["splits"] if size["splits"] is not None and total_sms is None else default_splits(total)
    splits = _check_splits(splits, total)
    measure = V.boolean("measure", measure) and not runtime.IS_SIM
    repeat = V.positive_int("repeat", repeat)
    rng = np.random.default_rng() if rng is None else rng
    fg.check_device(7)
    qa, qb, flops = gemm_operands(rng, M, N, K)
    y = cuda.device_array((M, N), np.float32)
    src = cuda.to_device(rng.standard_normal(nbytes // 4, dtype=np.float32))
    dst = cuda.device_array(nbytes // 4, np.float32)
    result = SmBudgetResult((M, N, K), total, nbytes, [])
    first = None  # the first split's output: every split must give these bits (the same tile code)
    s1, s2 = cuda.stream(), cuda.stream()
    for sms in splits:
        sp = Split(sms, total - sms)
        y.copy_to_device(np.full((M, N), np.nan, np.float32))

        def gemm(s=0, calls=1, sms=sms):
            for _ in range(calls):
                launch_gemm(qa, qb, y, sms=sms, stream=s)

        if measure:
            sp.gemm_alone_ms = timing.time_ms(gemm)
        else:
            gemm()
        alone = y.copy_to_host()
        assert_gemm(f"v7 on {sms_text(sms)}", alone, qa, qb, first, f"v7 on {sms_text(splits[0])}")
        first = alone if first is None else first
        if sp.copy_sms:
            def copy(s=0, repeats=1, blocks=sp.copy_sms):
                copy_persistent(src, dst, blocks, repeats, s)

            y.copy_to_device(np.full((M, N), np.nan, np.float32))
            dst.copy_to_device(np.full(nbytes // 4, np.nan, np.float32))
            if measure:
                sp.copy_alone_ms = timing.time_ms(copy)
                # the copy outlasts the GEMM: the whole GEMM runs beside it
                reps = max(1, math.ceil(1.5 * sp.gemm_alone_ms / sp.copy_alone_ms))
                (g0, g1), (c0, c1) = timed_on_streams([(gemm, s1), (lambda s: copy(s, reps), s2)], repeat)
                sp.gemm_beside_ms, sp.gemm_covered = g1 - g0, covered((g0, g1), (c0, c1))
                # the GEMM outlasts the copy: every repeat of the copy runs beside it
                reps = max(1, math.floor(0.5 * sp.gemm_alone_ms / sp.copy_alone_ms))
                calls = max(1, math.ceil(2.0 * reps * sp.copy_alone_ms / sp.gemm_alone_ms))
                (g0, g1), (c0, c1) = timed_on_streams([(lambda s: gemm(s, calls), s1), (lambda s: copy(s, reps), s2)],
                                                      repeat)
                sp.copy_beside_ms, sp.copy_covered = (c1 - c0) / reps, covered((c0, c1), (g0, g1))
            else:
                gemm(s1)
                copy(s2, 2)
            cuda.synchronize()
            assert_gemm(f"v7 on {sms_text(sms)} beside the copy on {sp.copy_sms}", y.copy_to_host(), qa, qb, alone,
                         "the same GEMM alone")
            if not np.array_equal(dst.copy_to_host(), src.copy_to_host()):
                raise AssertionError(f"the copy on {sms_text(sp.copy_sms)} beside the GEMM did not deliver its buffer")
        result.splits.append(sp)
    if measure:
        result.v6_ms = timing.time_ms(lambda: launch_gemm(qa, qb, y, version=6))
        torch = bench.torch_cuda()
        blockwise = None if torch is None else fg.torch_blockwise(torch, qa, qb)
        if blockwise is not None:
            result.cublas_tflops = bench.rate(flops, timing.torch_time_ms(torch, blockwise), "TFLOP/s")
        result.copy_ceiling_gbs = bench.copy_ceiling_gbs(nbytes)
    return result


def plot_sm_budget(result: SmBudgetResult, ax=None, path=None):
    """GEMM TFLOP/s against the SMs it gets (alone, beside the copy) and, on a second axis, the copy's GB/s on the
    SMs left over, with DeepSeek-V3's split marked; returns the figure. Under the simulator (nothing measured) the
    axes carry a "not measured" note. path: also save it there (PNG)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    else:
        fig = ax.figure
    sms = [s.sms for s in result.splits]

    def series(get, work, unit):
        return [bench.rate(work, get(s), unit) for s in result.splits]

    alone = series(lambda s: s.gemm_alone_ms, result.flops, "TFLOP/s")
    M, N, K = result.gemm
    if all(v is None for v in alone):
        ax.text(0.5, 0.5, NOT_MEASURED, ha="center", va="center",
                transform=ax.transAxes, color="tab:red")
        ax.set_title(f"SM budget (GEMM {M}x{N}x{K}): not measured", fontsize=9)
    else:
        ax.plot(sms, alone, "o-", color="tab:orange", label="GEMM alone")
        beside = series(lambda s: s.gemm_beside_ms, result.flops, "TFLOP/s")
        ax.plot(*zip(*[(x, v) for x, v in zip(sms, beside) if v is not None] or [([], [])]), "o--",
                color="tab:red", label="GEMM beside the copy")
        if result.cublas_tflops:
            ax.axhline(result.cublas_tflops, color="k", ls=":", lw=0.8, label="cuBLAS FP8 blockwise, all SMs")
        ax.set_ylabel("GEMM TFLOP/s")
        ax2 = ax.twinx()
        work = 2.0 * result.copy_bytes
        for get, style, label in ((lambda s: s.copy_alone_ms, "s-", "copy alone"),
                                  (lambda s: s.copy_beside_ms, "s--", "copy beside the GEMM")):
            pts = [(x, v) for x, v in zip(sms, series(get, work, "GB/s")) if v is not None]
            if pts:
                ax2.plot(*zip(*pts), style, color="tab:blue", label=label, alpha=0.8)
        ax2.set_ylabel("copy GB/s (on the other SMs)")
        ax.set_ylim(0, 1.15 * ax.get_ylim()[1])  # from zero: the cost reads as a fraction
        ax2.set_ylim(0, 1.15 * ax2.get_ylim()[1])
        given = result.total_sms - GIVEN_SMS
        if given in sms:
            ax.axvline(given, color="gray", lw=0.8, ls="--")
            ax.text(given, 0.98 * ax.get_ylim()[1], f"{GIVEN_SMS} SMs to communication (DeepSeek-V3) ", fontsize=7,
                    va="top", ha="right")
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), ncol=3)
        cost = result.cost()
        ax.set_title(f"FP8 GEMM {M}x{N}x{K} on part of {result.total_sms} SMs"
                     + ("" if cost is None else f": {GIVEN_SMS} SMs away cost {cost:.1%}"), fontsize=9)
    ax.set_xlabel(f"SMs given to the GEMM (the copy gets the rest of {result.total_sms})")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


# ----------------------------------------------------------------------------------------------------------------
# Checks and timings (fp8lab.comm.overlap runs them; try_kernel runs the copy's)
# ----------------------------------------------------------------------------------------------------------------


def checks(rng, only=None) -> list[tuple[str, str]]:
    """The copy kernel delivers its buffer (1, 2 and 7 blocks, two repeats); `sm_budget()`, run once untimed (tiny
    sizes under the simulator, CHECK_SIZES on a GPU), delivers every output (poisoned first). only: which of "copy",
    "sm_budget" to check (bench.selected; None: both)."""
    rows = []
    if bench.selected(only, "copy"):
        n = 2 * (2 * COPY_UNROLL * COPY_THREADS + 37)  # 8-byte words: one block makes two unrolled trips and a tail
        src = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
        for blocks in sorted({1, min(2, fg.device_sms()), min(fg.device_sms(), 7)}):
            dst = bench.poisoned(n, np.float32)
            copy_persistent(src, dst, blocks, 2)
            bench.assert_close(f"copy_persistent, {blocks} blocks", dst.copy_to_host(), src.copy_to_host(), atol=0,
                               rtol=0)
            rows.append((f"copy_persistent: {n} float32, {blocks} block(s), 2 repeats", "equal to the source"))
    if bench.selected(only, "sm_budget"):
        total = 2 if runtime.IS_SIM else fg.device_sms()
        splits = (2, 1) if runtime.IS_SIM else tuple(sorted({total, max(1, total - GIVEN_SMS), min(7, total)},
                                                             reverse=True))
        b = sm_budget(**({} if runtime.IS_SIM else CHECK_SIZES["sm_budget"]), total_sms=total, splits=splits,
                      measure=False, rng=rng)
        M, N, K = b.gemm
        rows.append((f"sm_budget: GEMM v7 {M}x{N}x{K} on {', '.join(map(str, splits))} of {total} SMs, alone and "
                     f"beside the copy ({b.copy_bytes} bytes) on the rest",
                     f"the first split {'bit-exact with' if runtime.IS_SIM else 'within the tensor-core bound of'} "
                     "fp8_gemm.reference; every split and the GEMM beside the copy give its bits; the copy delivered"))
    return rows


def timings(rng, args) -> list:
    """On a GPU: with args.only = ["copy"] (what fp8lab.course.notebook.try_kernel passes), the copy kernel alone
    on every SM at SIZES' copy size; without `only`, `sm_budget()` at realistic sizes with its ceilings."""
    if getattr(args, "only", None) is None:
        return sm_budget(rng=rng).tables()
    if not bench.selected(args.only, "copy"):
        raise ValueError(f"only: the SM budget's timings take ['copy'] or nothing, got {list(args.only)}")
    n = SIZES["gpu"]["sm_budget"]["copy_bytes"] // 4
    src = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    dst = cuda.device_array(n, np.float32)
    sms = fg.device_sms()
    row = bench.time_row(f"copy_kernel on {sms_text(sms)}", lambda: copy_persistent(src, dst, sms), 2 * src.nbytes)
    return [bench.Table(f"persistent copy of {size_text(src.nbytes)}; bytes = read + written", "GB/s", [row],
                        ceiling=bench.copy_ceiling_gbs(src.nbytes))]
