"""What both overlap experiments (`fp8lab.comm.streams`, `fp8lab.comm.sm_budget`) share: their sizes (`SIZES`,
`CHECK_SIZES`), DeepSeek-V3's split of the SMs (`GIVEN_SMS`, `default_splits`), the FP8 GEMM they run (fp8_gemm
version 7 on some SMs: `gemm_operands`, `launch_gemm`, `assert_gemm`), timing calls on several streams against one
start event (`timed_on_streams`, `covered`, `EVENT_TOLERANCE_MS`), argument checks and the text of their tables.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..device import runtime
from ..device.runtime import cuda
from ..kernels import fp8_gemm as fg
from ..numerics.spec import ScaleKind

GIVEN_SMS = 20  # DeepSeek-V3's SMs for communication (of 132 on an H800), section 3.2.2

SIZES = {
    # simulator: one GEMM tile (two for the split), a few KiB; the pretend device of sm_budget has 2 SMs
    "sim": dict(streams=dict(gemm=(20, 9, 100), h2d_bytes=4096, d2h_bytes=4096),
                sm_budget=dict(gemm=(130, 9, 100), copy_bytes=8192, total_sms=2, splits=(2, 1))),
    # GPU: the course's DeepSeek-like GEMM, and copies over PCIe sized to last about as long as it
    # (docs/notes/overlap.md has the times)
    "gpu": dict(streams=dict(gemm=(4096, 7168, 16384), h2d_bytes=64 << 20, d2h_bytes=64 << 20),
                sm_budget=dict(gemm=(4096, 7168, 16384), copy_bytes=256 << 20, total_sms=None, splits=None)),
}
CHECK_SIZES = {  # `checks` on a GPU: outputs verified against float64 (NumPy), so a medium GEMM
    "streams": dict(gemm=(1000, 777, 1111), h2d_bytes=1 << 20, d2h_bytes=1 << 20),
    "sm_budget": dict(gemm=(1000, 777, 1111), copy_bytes=1 << 20),
}
EVENT_TOLERANCE_MS = 2e-3
"""Event times are ordered up to this (CUDA events resolve about half a microsecond)."""
NOT_MEASURED = "not measured" + (" (simulator): CUDA events report no times" if runtime.IS_SIM else "")


def default_splits(total: int) -> tuple[int, ...]:
    """SMs given to the GEMM: all of them, all but DeepSeek-V3's 20, then 100, 80, 64, 48, 32 (those below total)."""
    return tuple(sorted({s for s in (total, total - GIVEN_SMS, 100, 80, 64, 48, 32) if 0 < s <= total},
                        reverse=True))


def size_text(nbytes: int) -> str:
    """nbytes as "64 MiB", "4 KiB", "100 bytes"."""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << k:
            return f"{nbytes / (1 << k):g} {unit}"
    return f"{nbytes} bytes"


def sms_text(n: int) -> str:
    """"1 SM", "20 SMs"."""
    return f"{n} SM" + "s" * (n != 1)


def ms_text(ms: float | None) -> str:
    """A time in ms for a table, or "not measured"."""
    return "not measured" if ms is None else f"{ms:.3f} ms"


def rate_text(work: float, ms: float | None, unit: str) -> str:
    """work / time in unit (GB/s or TFLOP/s) for a table, "-" when not measured."""
    v = bench.rate(work, ms, unit)
    return "-" if v is None else (f"{v:,.0f} {unit}" if unit == "GB/s" else f"{v:,.1f} {unit}")


def check_bytes(name: str, value) -> int:
    """The argument `name` as a positive int, a multiple of 8 (bytes of the copies)."""
    n = V.positive_int(name, value)
    if n % 8:
        raise ValueError(f"{name} must be a multiple of 8 (the copies move 8-byte words of float32), got {n}")
    return n


def check_shape(name: str, value) -> tuple[int, int, int]:
    """The argument `name` as a GEMM shape (M, N, K) of positive ints."""
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError(f"{name} must be a tuple (M, N, K) of positive ints, got {V.describe(value)}")
    return tuple(V.positive_int(f"{name}[{i}]", v) for i, v in enumerate(value))


# ----------------------------------------------------------------------------------------------------------------
# Timing work on several streams against one start event
# ----------------------------------------------------------------------------------------------------------------


def timed_on_streams(calls, repeat: int):
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


def covered(a, b) -> float | None:
    """The fraction of span a = (start, end) during which span b ran; None when not measured."""
    if a[0] is None or b[0] is None:
        return None
    inside = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    return inside / (a[1] - a[0]) if a[1] > a[0] else 1.0


# ----------------------------------------------------------------------------------------------------------------
# The GEMM under test: fp8_gemm version 7 (persistent) on some of the SMs
# ----------------------------------------------------------------------------------------------------------------


def gemm_operands(rng, M, N, K):
    """(qa, qb, flops): random FP8 operands of an M x N x K GEMM on the device (fp8_gemm.random_operands)."""
    qa, qb = fg.random_operands(rng, M, N, K, on_device=True)
    return qa, qb, 2.0 * M * N * K


def launch_gemm(qa, qb, out, version: int = 7, **kwargs) -> None:
    """out = qa @ qb.T by fp8_gemm `version` (kwargs to fp8_gemm.launch: sms, stream); asynchronous. qa, qb: from
    gemm_operands (1 x 128 tiles, 128 x 128 blocks)."""
    fg.launch(qa.data, qa.scale, qb.data, qb.scale, out, ScaleKind.TILE, ScaleKind.BLOCK, version=version, **kwargs)


def assert_gemm(label, got, qa, qb, exact=None, exact_label=""):
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

