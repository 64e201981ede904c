"""Overlap on one GPU: copies on streams beside a kernel, and an FP8 GEMM that leaves SMs to communication.

DeepSeek-V3 (arXiv 2412.19437, section 3.2.2) overlaps its all-to-all communication with computation and gives 20
of the H800's 132 SMs to the communication kernels. Two experiments measure both ideas on one GPU:

- `streams()`: the FP8 GEMM (fp8_gemm version 7) and copies of pinned host memory to and from the GPU (H2D, D2H),
  issued one after another on one stream, then each on its own stream: the copy engines move bytes while the SMs
  compute. Every operation is timed with CUDA events against one start event; `plot_timeline` draws them.
- `sm_budget()`: the persistent GEMM (version 7) on `sms` SMs, alone and beside `copy_persistent` (a
  bandwidth-bound stand-in for a communication kernel, one block per SM) on the SMs left over, on a second stream:
  GEMM TFLOP/s and copy GB/s for each split, and what giving 20 SMs away costs the GEMM; `plot_sm_budget` draws it.

`python -m fp8lab.comm.overlap` and `fp8lab bench overlap` check both, then time them on a GPU (`--markdown`, `--plot
DIR`). Under the simulator the experiments run at tiny sizes and verify their outputs; nothing is timed (times are
None, shown as "not measured").
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys

import numpy as np

from .. import _validate as V
from .. import bench
from ..device import hardware, runtime
from ..bench import timing
from ..kernels import fp8_gemm as fg
from ..device.runtime import cuda

COPY_THREADS = runtime.block_threads(1024)  # per block of copy_persistent: 1024 on a GPU, 32 under the simulator
COPY_SMEM = hardware.SM90["smem"] // 2
"""Shared memory each copy block reserves and never uses, so that it owns its SM as a communication kernel does: half
of an sm_90 SM's 228 KiB, and with the 1 KiB the system reserves per block neither a second copy block nor a block
of fp8_gemm version 7 (129 KiB) fits beside it (CUDA C++ Programming Guide, compute capability 9.0)."""
GIVEN_SMS = 20  # DeepSeek-V3's SMs for communication (of 132 on an H800), section 3.2.2
_TILE, _BLOCK = 1, 2  # fp8_gemm.launch's scale kinds of random_operands' operands (1 x 128 tiles, 128 x 128 blocks)

SIZES = {
    # simulator: one GEMM tile (two for the split), a few KiB; the pretend device of sm_budget has 2 SMs
    "sim": dict(streams=dict(gemm=(20, 9, 100), h2d_bytes=4096, d2h_bytes=4096),
                sm_budget=dict(gemm=(130, 9, 100), copy_bytes=8192, total_sms=2, splits=(2, 1))),
    # GPU: the course's DeepSeek-like GEMM (about 1.3 ms on an H200) and copies of about that length over PCIe
    "gpu": dict(streams=dict(gemm=(4096, 7168, 16384), h2d_bytes=64 << 20, d2h_bytes=64 << 20),
                sm_budget=dict(gemm=(4096, 7168, 16384), copy_bytes=256 << 20, total_sms=None, splits=None)),
}
CHECK_SIZES = {  # `checks` on a GPU: outputs verified against float64 (NumPy), so a medium GEMM
    "streams": dict(gemm=(1000, 777, 1111), h2d_bytes=1 << 20, d2h_bytes=1 << 20),
    "sm_budget": dict(gemm=(1000, 777, 1111), copy_bytes=1 << 20),
}


def default_splits(total: int) -> tuple[int, ...]:
    """SMs given to the GEMM: all of them, all but DeepSeek-V3's 20, then 100, 80, 64, 48, 32 (those below total)."""
    return tuple(sorted({s for s in (total, total - GIVEN_SMS, 100, 80, 64, 48, 32) if 0 < s <= total},
                        reverse=True))


def _size(nbytes: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << k:
            return f"{nbytes / (1 << k):g} {unit}"
    return f"{nbytes} bytes"


def _sms(n: int) -> str:
    return f"{n} SM" + "s" * (n != 1)


NOT_MEASURED = "not measured" + (" (simulator): CUDA events report no times" if runtime.IS_SIM else "")


def _fmt(ms: float | None) -> str:
    return "not measured" if ms is None else f"{ms:.3f} ms"


def _rate(work: float, ms: float | None, unit: str) -> str:
    v = bench.rate(work, ms, unit)
    return "-" if v is None else (f"{v:,.0f} {unit}" if unit == "GB/s" else f"{v:,.1f} {unit}")


def _check_bytes(name: str, value) -> int:
    n = V.positive_int(name, value)
    if n % 8:
        raise ValueError(f"{name} must be a multiple of 8 (the copies move 8-byte words of float32), got {n}")
    return n


def _check_shape(name: str, value) -> tuple[int, int, int]:
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError(f"{name} must be a tuple (M, N, K) of positive ints, got {V.describe(value)}")
    return tuple(V.positive_int(f"{name}[{i}]", v) for i, v in enumerate(value))


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
# Timing work on several streams against one start event
# ----------------------------------------------------------------------------------------------------------------


def _timed(calls, repeat: int):
    """Run `calls` ([(fn(stream), stream)], in issue order) `repeat` times and return, for the run of median
    makespan, [(start_ms, end_ms)] of each call from one start event; [(None, None), ...] under the simulator.

    The GPU is held (timing.hold_gpu, on the legacy default stream) while Python queues everything; the start event
    follows the hold on that stream, and numba's streams wait for the legacy default stream, so nothing starts
    before it. Each call is bracketed by events on its own stream."""
    if runtime.IS_SIM:
        for fn, s in calls:
            fn(s)
        return [(None, None)] * len(calls)

    def enqueue():
        for fn, s in calls:
            fn(s)

    hold = timing.hold_ms(timing.warm_up(enqueue, 2, cuda.synchronize))
    runs = []
    for _ in range(repeat):
        start = cuda.event()
        marks = [(cuda.event(), cuda.event()) for _ in calls]
        timing.hold_gpu(hold)
        start.record()
        for (fn, s), (e0, e1) in zip(calls, marks):
            e0.record(s)
            fn(s)
            e1.record(s)
        cuda.synchronize()
        runs.append([(cuda.event_elapsed_time(start, e0), cuda.event_elapsed_time(start, e1)) for e0, e1 in marks])
    runs.sort(key=lambda r: max(e for _, e in r))
    return runs[len(runs) // 2]


def _covered(a, b) -> float | None:
    """The fraction of span a = (start, end) during which span b ran; None when not measured."""
    if a[0] is None or b[0] is None:
        return None
    inside = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    return inside / (a[1] - a[0]) if a[1] > a[0] else 1.0


# ----------------------------------------------------------------------------------------------------------------
# Experiment 1: copies and a kernel on streams
# ----------------------------------------------------------------------------------------------------------------

EVENT_TOLERANCE_MS = 2e-3
"""Event times are ordered up to this (CUDA events resolve about half a microsecond)."""


@dataclasses.dataclass
class TimedOp:
    """One operation of a run: `start_ms` and `end_ms` from the run's start event (None: not measured). `work` is
    bytes (unit GB/s) or floating-point operations (unit TFLOP/s); `stream` numbers the streams of its run."""

    name: str
    engine: str
    stream: int
    work: float
    unit: str
    start_ms: float | None = None
    end_ms: float | None = None

    @property
    def ms(self) -> float | None:
        return None if self.start_ms is None else self.end_ms - self.start_ms


@dataclasses.dataclass
class StreamsResult:
    """`streams()`: runs["serialized"] (every op on one stream) and runs["overlapped"] (one stream each), the same
    ops in the same issue order."""

    gemm: tuple
    h2d_bytes: int
    d2h_bytes: int
    runs: dict

    def to_dict(self) -> dict:
        """Plain data (JSON-ready); `from_dict` rebuilds the result, e.g. from a run recorded on a GPU."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StreamsResult":
        runs = {mode: [TimedOp(**op) for op in ops] for mode, ops in d["runs"].items()}
        return cls(tuple(d["gemm"]), int(d["h2d_bytes"]), int(d["d2h_bytes"]), runs)

    def total_ms(self, mode: str) -> float | None:
        """From the start event to the end of the last op of run `mode`; None when not measured."""
        ends = [op.end_ms for op in self.runs[mode]]
        return None if None in ends else max(ends)

    @property
    def gain(self) -> float | None:
        """serialized total / overlapped total (1 = no gain); None when not measured."""
        s, o = self.total_ms("serialized"), self.total_ms("overlapped")
        return None if s is None or o is None else s / o

    def check(self) -> None:
        """AssertionError unless both runs hold the same ops, serialized on one stream and overlapped on one stream
        each, and (when measured) every op starts after the start event and ends after it starts, and the
        serialized ops run one after another."""
        names = {mode: [op.name for op in ops] for mode, ops in self.runs.items()}
        if set(self.runs) != {"serialized", "overlapped"} or names["serialized"] != names["overlapped"]:
            raise AssertionError(f"runs must be serialized and overlapped with the same ops, got {names}")
        if len({op.stream for op in self.runs["serialized"]}) != 1:
            raise AssertionError("serialized ops must share one stream")
        if len({op.stream for op in self.runs["overlapped"]}) != len(self.runs["overlapped"]):
            raise AssertionError("overlapped ops must each have their own stream")
        for mode, ops in self.runs.items():
            measured = [op.start_ms is not None and op.end_ms is not None for op in ops]
            if any(measured) and not all(measured):
                raise AssertionError(f"{mode}: some ops were timed and some were not")
            for op in ops:
                if op.start_ms is not None and not (-EVENT_TOLERANCE_MS <= op.start_ms <= op.end_ms):
                    raise AssertionError(f"{mode} {op.name}: start {op.start_ms} / end {op.end_ms} out of order")
        ops = self.runs["serialized"]
        for prev, op in zip(ops, ops[1:]):
            if op.start_ms is not None and op.start_ms < prev.end_ms - EVENT_TOLERANCE_MS:
                raise AssertionError(f"serialized {op.name} starts at {op.start_ms:.4f} ms, before {prev.name} "
                                     f"ends at {prev.end_ms:.4f} ms")

    def tables(self) -> list:
        M, N, K = self.gemm
        cells = []
        for mode, ops in self.runs.items():
            for op in ops:
                span = "not measured" if op.start_ms is None else f"{op.start_ms:.3f} - {op.end_ms:.3f} ms"
                cells.append([mode, op.name, op.engine, op.stream, span, _rate(op.work, op.ms, op.unit)])
        s, o, g = self.total_ms("serialized"), self.total_ms("overlapped"), self.gain
        cells.append(["serialized", "total", "-", "-", _fmt(s), "-"])
        cells.append(["overlapped", "total", "-", "-", _fmt(o), "-"])
        cells.append(["gain", "serialized / overlapped", "-", "-", "not measured" if g is None else f"{g:.2f}x", "-"])
        title = (f"Streams: H2D {_size(self.h2d_bytes)} (pinned), FP8 GEMM {M}x{N}x{K} (fp8_gemm v7, all SMs), "
                 f"D2H {_size(self.d2h_bytes)} (pinned); times from one start event, serialized on one stream vs one "
                 "stream each")
        return [bench.Table(title, None, header=["run", "op", "engine", "stream", "start - end", "rate"],
                            cells=cells)]


def _gemm_operands(rng, M, N, K):
    qa, qb = fg.random_operands(rng, M, N, K, on_device=True)
    return qa, qb, 2.0 * M * N * K


def _launch7(qa, qb, out, sms, stream=0):
    fg.launch(qa.data, qa.scale, qb.data, qb.scale, out, _TILE, _BLOCK, version=7, sms=sms, stream=stream)


def _assert_gemm(label, got, qa, qb, exact=None, exact_label=""):
    """got (host) is NaN-free and equals `exact` (the output of `exact_label`) bit for bit when given; else, at a
    size NumPy can check (M N K <= 2^31), it matches the reference: bit for bit under the simulator, within
    tensor_core_bound on a GPU."""
    if np.isnan(got).any():
        raise AssertionError(f"{label}: NaN in the GEMM output (a tile was not written)")
    if exact is not None:
        if not np.array_equal(got, exact):
            raise AssertionError(f"{label}: the GEMM output differs from that of {exact_label} in "
                                 f"{int((got != exact).sum())} elements")
        return
    host = [dataclasses.replace(q, data=runtime.to_host(q.data), scale=runtime.to_host(q.scale)) for q in (qa, qb)]
    (M, K), N = host[0].data.shape, host[1].data.shape[0]
    if M * N * K > 2**31:
        return
    if runtime.IS_SIM:
        ref = fg.reference(*host)
        if not np.array_equal(got, ref):
            raise AssertionError(f"{label}: differs from fp8_gemm.reference in {int((got != ref).sum())} elements")
    else:
        err = np.abs(got.astype(np.float64) - fg.reference64(*host))
        if not (err <= fg.tensor_core_bound(*host)).all():
            raise AssertionError(f"{label}: error {err.max():.3g} above the tensor-core bound")


def streams(gemm=None, h2d_bytes=None, d2h_bytes=None, *, repeat: int = 5, rng=None) -> StreamsResult:
    """The FP8 GEMM (version 7 on every SM) and two copies of pinned host memory, issued H2D, GEMM, D2H: first on
    one stream (serialized), then each on its own stream (overlapped: the H2D and D2H copy engines and the SMs work
    at once), each op timed with CUDA events from one start event; outputs poisoned before and verified after.

    gemm: (M, N, K); h2d_bytes, d2h_bytes: bytes of each copy (multiples of 16). None: runtime-dependent sizes
    (SIZES: a few KiB and one tile under the simulator, 64 MiB each and 4096 x 7168 x 16384 on a GPU). repeat: runs
    per mode (the run of median makespan is kept). Under the simulator nothing is timed (times None).
    """
    size = SIZES[runtime.backend]["streams"]
    M, N, K = _check_shape("gemm", size["gemm"] if gemm is None else gemm)
    n_in = _check_bytes("h2d_bytes", size["h2d_bytes"] if h2d_bytes is None else h2d_bytes) // 4
    n_out = _check_bytes("d2h_bytes", size["d2h_bytes"] if d2h_bytes is None else d2h_bytes) // 4
    repeat = V.positive_int("repeat", repeat)
    rng = np.random.default_rng() if rng is None else rng
    fg.check_device(7)
    host_in = cuda.pinned_array(n_in, np.float32)  # pinned: the copy engine reads it while the host goes on
    host_in[:] = rng.standard_normal(n_in, dtype=np.float32)
    host_out = cuda.pinned_array(n_out, np.float32)
    src_out = rng.standard_normal(n_out, dtype=np.float32)
    dev_in, dev_out = cuda.device_array(n_in, np.float32), cuda.to_device(src_out)
    qa, qb, flops = _gemm_operands(rng, M, N, K)
    y = cuda.device_array((M, N), np.float32)
    sms = min(fg.device_sms(), fg.tiles(M, N))
    ops = [("H2D", "copy engine (H2D)", lambda s: dev_in.copy_to_device(host_in, stream=s), 4.0 * n_in, "GB/s"),
           ("GEMM", "SMs", lambda s: _launch7(qa, qb, y, sms, s), flops, "TFLOP/s"),
           ("D2H", "copy engine (D2H)", lambda s: dev_out.copy_to_host(host_out, stream=s), 4.0 * n_out, "GB/s")]
    runs, outputs = {}, {}
    for mode in ("serialized", "overlapped"):
        dev_in.copy_to_device(np.full(n_in, np.nan, np.float32))  # poisoned: each run must write every output
        host_out[:] = np.nan
        y.copy_to_device(np.full((M, N), np.nan, np.float32))
        streams_ = [cuda.stream()] * 3 if mode == "serialized" else [cuda.stream() for _ in ops]
        ids = [0, 0, 0] if mode == "serialized" else [0, 1, 2]
        times = _timed([(fn, s) for (_, _, fn, _, _), s in zip(ops, streams_)], repeat)
        cuda.synchronize()
        runs[mode] = [TimedOp(name, engine, k, work, unit, t0, t1)
                      for (name, engine, _, work, unit), k, (t0, t1) in zip(ops, ids, times)]
        if not np.array_equal(dev_in.copy_to_host(), host_in):
            raise AssertionError(f"{mode}: the H2D copy did not deliver the host buffer")
        if not np.array_equal(host_out, src_out):
            raise AssertionError(f"{mode}: the D2H copy did not deliver the device buffer")
        outputs[mode] = y.copy_to_host()
    _assert_gemm("streams, serialized", outputs["serialized"], qa, qb)
    _assert_gemm("streams, overlapped", outputs["overlapped"], qa, qb, outputs["serialized"], "the serialized run")
    result = StreamsResult((M, N, K), 4 * n_in, 4 * n_out, runs)
    result.check()
    return result


def plot_timeline(result: StreamsResult, ax=None, path=None):
    """The ops of both runs of `streams()` as boxes on a time axis, one row per run and engine (copy engine H2D,
    SMs, copy engine D2H), the stream of each op written in its box; returns the figure. Under the simulator (times
    None) the rows are drawn with a "not measured" note. path: also save it there (PNG)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 3.2))
    else:
        fig = ax.figure
    colors = {"H2D": "tab:blue", "GEMM": "tab:orange", "D2H": "tab:green"}
    labels, measured = [], True
    y = 0
    for mode in ("overlapped", "serialized"):
        for op in result.runs[mode]:
            labels.append(f"{mode}: {op.engine}")
            if op.start_ms is None:
                measured = False
            else:
                ax.broken_barh([(op.start_ms, op.ms)], (y - 0.4, 0.8), color=colors.get(op.name, "tab:gray"))
                ax.text(op.start_ms + op.ms / 2, y, f"{op.name} (stream {op.stream})", ha="center", va="center",
                        fontsize=7)
            y += 1
        total = result.total_ms(mode)
        if total is not None:
            ax.axvline(total, color="k", ls=":" if mode == "overlapped" else "--", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start event")
    M, N, K = result.gemm
    if measured:
        s, o = result.total_ms("serialized"), result.total_ms("overlapped")
        ax.set_title(f"Serialized {s:.2f} ms, overlapped {o:.2f} ms: {result.gain:.2f}x (GEMM {M}x{N}x{K}, copies "
                     f"{_size(result.h2d_bytes)})", fontsize=9)
    else:
        ax.set_xlim(0, 1)
        ax.text(0.5, (len(labels) - 1) / 2, NOT_MEASURED, ha="center",
                va="center", fontsize=9, color="tab:red")
        ax.set_title(f"Streams timeline (GEMM {M}x{N}x{K}): not measured", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


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
            gemm_rows.append(bench.Row(f"v7 on {_sms(s.sms)}, alone", s.gemm_alone_ms, self.flops,
                                       {"of v7 on all SMs": of_full(s.gemm_alone_ms), "copy running during": "-"}))
            if s.copy_sms:
                gemm_rows.append(bench.Row(f"v7 on {_sms(s.sms)}, beside the copy on {s.copy_sms}", s.gemm_beside_ms,
                                           self.flops, {"of v7 on all SMs": of_full(s.gemm_beside_ms),
                                                        "copy running during": pct(s.gemm_covered)}))
                copy_rows.append(bench.Row(f"copy on {_sms(s.copy_sms)}, alone", s.copy_alone_ms,
                                           2.0 * self.copy_bytes, {"GEMM running during": "-"}))
                copy_rows.append(bench.Row(f"copy on {_sms(s.copy_sms)}, beside v7 on {s.sms}", s.copy_beside_ms,
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
            tables.append(bench.Table(f"SM budget: the copy kernel ({_size(self.copy_bytes)} read and written per "
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
    A block of the GEMM takes nearly all of an SM's registers (about 240 per thread, 256 threads) and 129 KiB of its
    shared memory, a block of the copy reserves COPY_SMEM: no two blocks share an SM, so the GEMM's `sms` blocks
    run on `sms` SMs and the copy's blocks on the others.
    """
    size = SIZES[runtime.backend]["sm_budget"]
    M, N, K = _check_shape("gemm", size["gemm"] if gemm is None else gemm)
    nbytes = _check_bytes("copy_bytes", size["copy_bytes"] if copy_bytes is None else copy_bytes)
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
    qa, qb, flops = _gemm_operands(rng, M, N, K)
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
                _launch7(qa, qb, y, sms, s)

        if measure:
            sp.gemm_alone_ms = timing.time_ms(gemm)
        else:
            gemm()
        alone = y.copy_to_host()
        _assert_gemm(f"v7 on {_sms(sms)}", alone, qa, qb, first, f"v7 on {_sms(splits[0])}")
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
                (g0, g1), (c0, c1) = _timed([(gemm, s1), (lambda s: copy(s, reps), s2)], repeat)
                sp.gemm_beside_ms, sp.gemm_covered = g1 - g0, _covered((g0, g1), (c0, c1))
                # the GEMM outlasts the copy: every repeat of the copy runs beside it
                reps = max(1, math.floor(0.5 * sp.gemm_alone_ms / sp.copy_alone_ms))
                calls = max(1, math.ceil(2.0 * reps * sp.copy_alone_ms / sp.gemm_alone_ms))
                (g0, g1), (c0, c1) = _timed([(lambda s: gemm(s, calls), s1), (lambda s: copy(s, reps), s2)], repeat)
                sp.copy_beside_ms, sp.copy_covered = (c1 - c0) / reps, _covered((c0, c1), (g0, g1))
            else:
                gemm(s1)
                copy(s2, 2)
            cuda.synchronize()
            _assert_gemm(f"v7 on {_sms(sms)} beside the copy on {sp.copy_sms}", y.copy_to_host(), qa, qb, alone,
                         "the same GEMM alone")
            if not np.array_equal(dst.copy_to_host(), src.copy_to_host()):
                raise AssertionError(f"the copy on {_sms(sp.copy_sms)} beside the GEMM did not deliver its buffer")
        result.splits.append(sp)
    if measure:
        result.v6_ms = timing.time_ms(lambda: fg.launch(qa.data, qa.scale, qb.data, qb.scale, y, _TILE, _BLOCK,
                                                        version=6))
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
# python -m fp8lab.comm.overlap, fp8lab bench overlap
# ----------------------------------------------------------------------------------------------------------------

OPTIONS = {"--plot": dict(metavar="DIR", default=None, help="also write the figures (overlap_timeline.png, "
                                                            "overlap_sm_budget.png) to the folder DIR"),
           "--json": dict(metavar="PATH", default=None, help="also write both results as JSON (the form of "
                                                             "fp8lab/data/h200_overlap.json, which `recorded` reads)")}


def recording(st: StreamsResult, sb: SmBudgetResult, how: str) -> dict:
    """Both results with the device, date and software that produced them: what fp8lab/data/h200_overlap.json
    holds (`recorded()` reads it back)."""
    info = runtime.device_info()
    return {"device": f"{info['name']} (cc {info['cc']}, {info['sms']} SMs)",
            "date": datetime.date.today().isoformat(), "software": bench.software_versions(), "how": how,
            "streams": st.to_dict(), "sm_budget": sb.to_dict()}


def recorded(name: str = "h200_overlap") -> tuple[dict, StreamsResult, SmBudgetResult]:
    """The run recorded on a GPU and shipped with fp8lab (fp8lab/data/<name>.json): (its device/date/how, the
    streams result, the SM-budget result), ready for `tables()`, `plot_timeline` and `plot_sm_budget`."""
    d = hardware.recorded(name)
    meta = {k: v for k, v in d.items() if k not in ("streams", "sm_budget")}
    return meta, StreamsResult.from_dict(d["streams"]), SmBudgetResult.from_dict(d["sm_budget"])


def checks(rng, only=None) -> list[tuple[str, str]]:
    """The copy kernel delivers its buffer; both experiments, run once untimed, deliver every output (poisoned
    first); the streams result is consistent. Tiny sizes under the simulator, medium ones on a GPU. only: which of
    "copy", "streams", "sm_budget" to check (bench.selected; None: all)."""
    rows = []
    n = 2 * (2 * COPY_UNROLL * COPY_THREADS + 37)  # 8-byte words: one block makes two unrolled trips and a tail
    src = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    grids = sorted({1, min(2, fg.device_sms()), min(fg.device_sms(), 7)}) if bench.selected(only, "copy") else []
    for blocks in grids:
        dst = bench.poisoned(n, np.float32)
        copy_persistent(src, dst, blocks, 2)
        bench.assert_close(f"copy_persistent, {blocks} blocks", dst.copy_to_host(), src.copy_to_host(), atol=0,
                           rtol=0)
        rows.append((f"copy_persistent: {n} float32, {blocks} block(s), 2 repeats", "equal to the source"))
    sizes = {} if runtime.IS_SIM else CHECK_SIZES
    if bench.selected(only, "streams"):
        rows.append(_check_streams(rng, sizes))
    if bench.selected(only, "sm_budget"):
        rows.append(_check_sm_budget(rng, sizes))
    return rows


def _check_streams(rng, sizes) -> tuple[str, str]:
    r = streams(**sizes.get("streams", {}), repeat=1, rng=rng)
    M, N, K = r.gemm
    return (f"streams: H2D {r.h2d_bytes} bytes, GEMM v7 {M}x{N}x{K}, D2H {r.d2h_bytes} bytes; serialized on one "
            "stream, overlapped on three",
            "every output delivered, both runs equal; "
            + ("times not measured (simulator)" if r.gain is None else
               f"events in order; serialized {r.total_ms('serialized'):.3f} ms, overlapped "
               f"{r.total_ms('overlapped'):.3f} ms"))


def _check_sm_budget(rng, sizes) -> tuple[str, str]:
    total = 2 if runtime.IS_SIM else fg.device_sms()
    splits = (2, 1) if runtime.IS_SIM else tuple(sorted({total, max(1, total - GIVEN_SMS), min(7, total)},
                                                         reverse=True))
    b = sm_budget(**sizes.get("sm_budget", {}), total_sms=total, splits=splits, measure=False, rng=rng)
    M, N, K = b.gemm
    return (f"sm_budget: GEMM v7 {M}x{N}x{K} on {', '.join(map(str, splits))} of {total} SMs, alone and beside "
            f"the copy ({b.copy_bytes} bytes) on the rest",
            f"the first split {'bit-exact with' if runtime.IS_SIM else 'within the tensor-core bound of'} "
            "fp8_gemm.reference; every split and the GEMM beside the copy give its bits; the copy delivered")


def timings(rng, args) -> list:
    """Both experiments at realistic sizes (GPU only), with the ceilings measured in the same run; --plot DIR also
    writes the figures. With args.only = ["copy"] (fp8lab.course.notebook.try_kernel): the copy kernel alone on every
    SM,
    at sm_budget's copy size."""
    if getattr(args, "only", None) is not None:
        if not bench.selected(args.only, "copy"):
            raise ValueError(f"only: overlap's timings take ['copy'] or nothing, got {list(args.only)}")
        n = SIZES["gpu"]["sm_budget"]["copy_bytes"] // 4
        src = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
        dst = cuda.device_array(n, np.float32)
        sms = fg.device_sms()
        row = bench.time_row(f"copy_kernel on {_sms(sms)}", lambda: copy_persistent(src, dst, sms), 2 * src.nbytes)
        return [bench.Table(f"persistent copy of {_size(src.nbytes)}; bytes = read + written", "GB/s", [row],
                            ceiling=bench.copy_ceiling_gbs(src.nbytes))]
    r = streams(rng=rng)
    b = sm_budget(rng=rng)
    path = getattr(args, "json", None)
    if path:
        record = recording(r, b, how="fp8lab bench overlap --markdown --json PATH (sizes: overlap.SIZES['gpu']; "
                                     "BENCHMARKS.md, section overlap)")
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {path}", file=sys.stderr)
    plot = getattr(args, "plot", None)
    if plot:
        os.makedirs(plot, exist_ok=True)
        for name, fn, res in (("overlap_timeline.png", plot_timeline, r), ("overlap_sm_budget.png", plot_sm_budget, b)):
            path = os.path.join(plot, name)
            fn(res, path=path)
            print(f"wrote {path}", file=sys.stderr)  # stderr: stdout may be a BENCHMARKS.md section
    return r.tables() + b.tables()


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
