"""Overlap on one GPU, experiment 1, streams: copies between host and GPU beside an FP8 GEMM.

`streams()` issues a copy of pinned host memory to the GPU (H2D), the FP8 GEMM (fp8_gemm version 7 on every SM) and
a copy back (D2H), one after another on one stream, then each on its own stream: the copy engines move bytes while
the SMs compute. It times every operation with CUDA events against one start event and verifies every output;
`plot_timeline` draws the two runs. Under the simulator it runs at tiny sizes and times nothing (times None).
`try_overlap(issue)` is the hands-on version: your function puts a copy and the GEMM on the streams it chooses; it is
checked and timed against both on one stream.
`fp8lab bench overlap` (`fp8lab.comm.overlap`) runs it with experiment 2 (`fp8lab.comm.sm_budget`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _validate as V
from .. import bench
from ..device import runtime
from ..device.runtime import cuda
from ..kernels import fp8_gemm as fg
from .overlap_common import (CHECK_SIZES, EVENT_TOLERANCE_MS, NOT_MEASURED, SIZES, assert_gemm, check_bytes,
                             check_shape, gemm_operands, launch_gemm, ms_text, rate_text, size_text, timed_on_streams)


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


class _TimedRuns:
    """What a result of timed runs (`runs`: mode -> [TimedOp]) derives: each run's total and the gain of the run
    GAIN[1] over the run GAIN[0]."""

    GAIN: tuple = ()

    def total_ms(self, mode: str) -> float | None:
        """From the start event to the end of the last op of run `mode`; None when not measured."""
        ends = [op.end_ms for op in self.runs[mode]]
        return None if None in ends else max(ends)

    @property
    def gain(self) -> float | None:
        """GAIN[0]'s total / GAIN[1]'s total (1 = no gain); None when not measured."""
        s, o = (self.total_ms(mode) for mode in self.GAIN)
        return None if s is None or o is None else s / o


@dataclasses.dataclass
class StreamsResult(_TimedRuns):
    """`streams()`: runs["serialized"] (every op on one stream) and runs["overlapped"] (one stream each), the same
    ops in the same issue order; gain = serialized total / overlapped total."""

    GAIN = ("serialized", "overlapped")
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
                cells.append([mode, op.name, op.engine, op.stream, span, rate_text(op.work, op.ms, op.unit)])
        s, o, g = self.total_ms("serialized"), self.total_ms("overlapped"), self.gain
        cells.append(["serialized", "total", "-", "-", ms_text(s), "-"])
        cells.append(["overlapped", "total", "-", "-", ms_text(o), "-"])
        cells.append(["gain", "serialized / overlapped", "-", "-", "not measured" if g is None else f"{g:.2f}x", "-"])
        title = (f"Streams: H2D {size_text(self.h2d_bytes)} (pinned), FP8 GEMM {M}x{N}x{K} (fp8_gemm v7, all SMs), "
                 f"D2H {size_text(self.d2h_bytes)} (pinned); times from one start event, serialized on one stream vs "
                 "one stream each")
        return [bench.Table(title, None, header=["run", "op", "engine", "stream", "start - end", "rate"],
                            cells=cells)]


def streams(gemm=None, h2d_bytes=None, d2h_bytes=None, *, repeat: int = 5, rng=None) -> StreamsResult:
    """The FP8 GEMM (version 7 on every SM) and two copies of pinned host memory, issued H2D, GEMM, D2H: first on
    one stream (serialized), then each on its own stream (overlapped: the H2D and D2H copy engines and the SMs work
    at once), each op timed with CUDA events from one start event; outputs poisoned before and verified after.

    gemm: (M, N, K); h2d_bytes, d2h_bytes: bytes of each copy (multiples of 16). None: runtime-dependent sizes
    (SIZES: a few KiB and one tile under the simulator, 64 MiB each and 4096 x 7168 x 16384 on a GPU). repeat: runs
    per mode (the run of median makespan is kept). Under the simulator nothing is timed (times None).
    """
    size = SIZES[runtime.backend]["streams"]
    M, N, K = check_shape("gemm", size["gemm"] if gemm is None else gemm)
    n_in = check_bytes("h2d_bytes", size["h2d_bytes"] if h2d_bytes is None else h2d_bytes) // 4
    n_out = check_bytes("d2h_bytes", size["d2h_bytes"] if d2h_bytes is None else d2h_bytes) // 4
    repeat = V.positive_int("repeat", repeat)
    rng = np.random.default_rng() if rng is None else rng
    fg.check_device(7)
    host_in = cuda.pinned_array(n_in, np.float32)  # pinned: the copy engine reads it while the host goes on
    host_in[:] = rng.standard_normal(n_in, dtype=np.float32)
    host_out = cuda.pinned_array(n_out, np.float32)
    src_out = rng.standard_normal(n_out, dtype=np.float32)
    dev_in, dev_out = cuda.device_array(n_in, np.float32), cuda.to_device(src_out)
    qa, qb, flops = gemm_operands(rng, M, N, K)
    y = cuda.device_array((M, N), np.float32)
    sms = min(fg.device_sms(), fg.tiles(M, N))
    ops = [("H2D", "copy engine (H2D)", lambda s: dev_in.copy_to_device(host_in, stream=s), 4.0 * n_in, "GB/s"),
           ("GEMM", "SMs", lambda s: launch_gemm(qa, qb, y, sms=sms, stream=s), flops, "TFLOP/s"),
           ("D2H", "copy engine (D2H)", lambda s: dev_out.copy_to_host(host_out, stream=s), 4.0 * n_out, "GB/s")]
    runs, outputs = {}, {}
    for mode in ("serialized", "overlapped"):
        dev_in.copy_to_device(np.full(n_in, np.nan, np.float32))  # poisoned: each run must write every output
        host_out[:] = np.nan
        y.copy_to_device(np.full((M, N), np.nan, np.float32))
        streams_ = [cuda.stream()] * 3 if mode == "serialized" else [cuda.stream() for _ in ops]
        ids = [0, 0, 0] if mode == "serialized" else [0, 1, 2]
        times = timed_on_streams([(fn, s) for (_, _, fn, _, _), s in zip(ops, streams_)], repeat)
        cuda.synchronize()
        runs[mode] = [TimedOp(name, engine, k, work, unit, t0, t1)
                      for (name, engine, _, work, unit), k, (t0, t1) in zip(ops, ids, times)]
        if not np.array_equal(dev_in.copy_to_host(), host_in):
            raise AssertionError(f"{mode}: the H2D copy did not deliver the host buffer")
        if not np.array_equal(host_out, src_out):
            raise AssertionError(f"{mode}: the D2H copy did not deliver the device buffer")
        outputs[mode] = y.copy_to_host()
    assert_gemm("streams, serialized", outputs["serialized"], qa, qb)
    assert_gemm("streams, overlapped", outputs["overlapped"], qa, qb, outputs["serialized"], "the serialized run")
    result = StreamsResult((M, N, K), 4 * n_in, 4 * n_out, runs)
    result.check()
    return result


@dataclasses.dataclass
class OverlapTry(_TimedRuns):
    """`try_overlap()`: runs["one stream"] (the library's: the copy, then the GEMM, on one stream) and runs["yours"]
    (the same ops on the streams your function chose, in its order); `streams` counts your distinct streams;
    gain = one-stream total / your total."""

    GAIN = ("one stream", "yours")
    gemm: tuple
    h2d_bytes: int
    streams: int
    runs: dict

    def tables(self) -> list:
        M, N, K = self.gemm
        cells = []
        for mode, ops in self.runs.items():
            for op in ops:
                span = "not measured" if op.start_ms is None else f"{op.start_ms:.3f} - {op.end_ms:.3f} ms"
                cells.append([mode, op.name, op.stream, span, rate_text(op.work, op.ms, op.unit)])
            cells.append([mode, "total", "-", ms_text(self.total_ms(mode)), "-"])
        g = self.gain
        cells.append(["gain", "one stream / yours", "-", "not measured" if g is None else f"{g:.2f}x", "-"])
        title = (f"Your overlap: H2D {size_text(self.h2d_bytes)} (pinned) and FP8 GEMM {M}x{N}x{K} (fp8_gemm v7) on "
                 f"{self.streams} stream{'s' if self.streams > 1 else ''}, against both on one stream")
        return [bench.Table(title, None, header=["run", "op", "stream", "start - end", "rate"], cells=cells)]


def try_overlap(issue, gemm=None, h2d_bytes=None, *, repeat: int = 5, rng=None) -> OverlapTry:
    """Your overlap of a copy with a GEMM, checked and timed. issue(copy, gemm) must call copy(stream) once (pinned
    host memory to the GPU) and gemm(stream) once (fp8_gemm version 7 on every SM), each with a stream it makes
    (`cuda.stream()`), in the order it wants them issued. Both outputs are poisoned before and verified after.
    On a GPU each op is timed with CUDA events on its stream, from one start event (median of `repeat` runs), and
    so are the same ops on one stream; under the simulator nothing is timed (times None).

    gemm: (M, N, K), h2d_bytes (a multiple of 16): None for streams()'s sizes. TypeError/ValueError naming what
    issue did wrong (not callable; an op called twice, never, or without a stream)."""
    if not callable(issue):
        raise TypeError(f"issue must be a function issue(copy, gemm) that calls copy(stream) and gemm(stream), got "
                        f"{V.describe(issue)}")
    size = SIZES[runtime.backend]["streams"]
    M, N, K = check_shape("gemm", size["gemm"] if gemm is None else gemm)
    n = check_bytes("h2d_bytes", size["h2d_bytes"] if h2d_bytes is None else h2d_bytes) // 4
    repeat = V.positive_int("repeat", repeat)
    rng = np.random.default_rng() if rng is None else rng
    fg.check_device(7)
    host = cuda.pinned_array(n, np.float32)
    host[:] = rng.standard_normal(n, dtype=np.float32)
    dev = cuda.device_array(n, np.float32)
    qa, qb, flops = gemm_operands(rng, M, N, K)
    y = cuda.device_array((M, N), np.float32)
    sms = min(fg.device_sms(), fg.tiles(M, N))
    ops = {"H2D": (lambda s: dev.copy_to_device(host, stream=s), 4.0 * n, "GB/s"),
           "GEMM": (lambda s: launch_gemm(qa, qb, y, sms=sms, stream=s), flops, "TFLOP/s")}

    plan = []  # what issue asks for: (op name, stream), in its order; the ops run later, timed

    def asker(name):
        def call(stream=None):
            if stream is None or not callable(getattr(stream, "synchronize", None)):
                raise TypeError(f"{name.lower() if name == 'GEMM' else 'copy'}(stream): stream must be a CUDA "
                                f"stream (cuda.stream()), got {V.describe(stream)}")
            plan.append((name, stream))
        return call

    issue(asker("H2D"), asker("GEMM"))
    counts = {k: [name for name, _ in plan].count(k) for k in ops}
    if counts != {"H2D": 1, "GEMM": 1}:
        raise ValueError(f"issue must call copy(stream) once and gemm(stream) once, got copy {counts['H2D']} and "
                         f"gemm {counts['GEMM']} times")
    ids = {}
    for _, s in plan:
        ids.setdefault(id(s), len(ids))
    one = cuda.stream()
    runs = {}
    for mode, calls in (("one stream", [(k, one) for k in ops]), ("yours", plan)):
        dev.copy_to_device(np.full(n, np.nan, np.float32))  # poisoned: each run must write every output
        y.copy_to_device(np.full((M, N), np.nan, np.float32))
        times = timed_on_streams([(ops[k][0], s) for k, s in calls], repeat)
        cuda.synchronize()
        runs[mode] = [TimedOp(k, "copy engine (H2D)" if k == "H2D" else "SMs", 0 if mode == "one stream" else
                              ids[id(s)], ops[k][1], ops[k][2], t0, t1) for (k, s), (t0, t1) in zip(calls, times)]
        if not np.array_equal(dev.copy_to_host(), host):
            raise AssertionError(f"{mode}: the H2D copy did not deliver the host buffer")
        assert_gemm(f"try_overlap, {mode}", y.copy_to_host(), qa, qb)
    return OverlapTry((M, N, K), 4 * n, len(ids), runs)


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
                     f"{size_text(result.h2d_bytes)})", fontsize=9)
    else:
        ax.set_xlim(0, 1)
        ax.text(0.5, (len(labels) - 1) / 2, NOT_MEASURED, ha="center",
                va="center", fontsize=9, color="tab:red")
        ax.set_title(f"Streams timeline (GEMM {M}x{N}x{K}): not measured", fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def checks(rng, only=None) -> list[tuple[str, str]]:
    """`streams()` run once untimed (tiny sizes under the simulator, CHECK_SIZES on a GPU): every output delivered,
    both runs equal, the result consistent. only: bench.selected's filter ("streams"; None: run it)."""
    if not bench.selected(only, "streams"):
        return []
    r = streams(**({} if runtime.IS_SIM else CHECK_SIZES["streams"]), repeat=1, rng=rng)
    M, N, K = r.gemm
    return [(f"streams: H2D {r.h2d_bytes} bytes, GEMM v7 {M}x{N}x{K}, D2H {r.d2h_bytes} bytes; serialized on one "
             "stream, overlapped on three",
             "every output delivered, both runs equal; "
             + ("times not measured (simulator)" if r.gain is None else
                f"events in order; serialized {r.total_ms('serialized'):.3f} ms, overlapped "
                f"{r.total_ms('overlapped'):.3f} ms"))]
