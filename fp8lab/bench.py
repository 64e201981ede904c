"""Checking and timing helpers shared by every `python -m fp8lab.kernels.<op>` main.

The llm.c `dev/cuda` pattern: validate every version against the reference (tolerance + |ref| * rtol, NaN
is failure, first mismatches printed), then time it and report GB/s against a ceiling measured in the same
run.
"""

from __future__ import annotations

import numpy as np

from . import runtime
from .runtime import cuda


def poisoned(shape, dtype):
    """A device array filled with a value no kernel writes by accident: NaN for floats, 0xA5 for codes."""
    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind == "f" else 0xA5
    return cuda.to_device(np.full(shape, fill, dtype=dtype))


def mismatches(got, ref, *, atol: float, rtol: float, limit: int = 5) -> list[str]:
    """Describe the first `limit` elements where |got - ref| > atol + rtol*|ref| (NaN in got always fails)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return [f"shape {got.shape} != reference shape {ref.shape}"]
    ok = np.abs(got - ref) <= atol + rtol * np.abs(ref)
    ok &= ~np.isnan(got) | np.isnan(ref)
    ok |= np.isnan(got) & np.isnan(ref)
    bad = np.argwhere(~ok)
    out = [f"{len(bad)} of {got.size} elements differ"] if len(bad) else []
    for idx in bad[:limit]:
        idx = tuple(int(i) for i in idx)
        out.append(f"  at {idx}: got {got[idx]!r}, expected {ref[idx]!r}")
    return out


def assert_close(name: str, got, ref, *, atol: float, rtol: float) -> None:
    bad = mismatches(got, ref, atol=atol, rtol=rtol)
    if bad:
        raise AssertionError(f"{name}: " + "\n".join(bad))


def assert_codes_equal(name: str, got, ref) -> None:
    """FP8 codes compare bit for bit."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape or got.dtype != ref.dtype:
        raise AssertionError(f"{name}: got {got.dtype}{got.shape}, expected {ref.dtype}{ref.shape}")
    bad = np.argwhere(got != ref)
    if len(bad):
        lines = [f"{name}: {len(bad)} of {got.size} codes differ"]
        for idx in bad[:5]:
            idx = tuple(int(i) for i in idx)
            lines.append(f"  at {idx}: got 0x{int(got[idx]):02X}, expected 0x{int(ref[idx]):02X}")
        raise AssertionError("\n".join(lines))


@cuda.jit
def _copy_kernel(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


def copy_ceiling_gbs(nbytes: int) -> float | None:
    """Copy bandwidth in GB/s (bytes read + written) on buffers of nbytes: the memory-bound ceiling.

    The faster of PyTorch's device-to-device copy (when installed) and a grid-stride Numba copy kernel,
    measured now, in the same run as the kernel it is compared with.
    """
    if runtime.IS_SIM:
        return None
    n = max(1, nbytes // 4)
    src = cuda.to_device(np.random.default_rng().random(n, dtype=np.float32))
    dst = cuda.device_array_like(src)
    blocks = 4 * cuda.get_current_device().MULTIPROCESSOR_COUNT * 8
    best = runtime.time_ms(lambda: _copy_kernel[blocks, 256](src, dst), warmup=3, repeat=20)
    torch = torch_cuda()
    if torch is not None:
        ts = torch.rand(n, device="cuda")
        td = torch.empty_like(ts)
        best = min(best, torch_time_ms(torch, lambda: td.copy_(ts)))
    return 2 * 4 * n / (best * 1e-3) / 1e9


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [[str(c) for c in r] for r in [header] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for j, r in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths))


def gbs(nbytes: int, ms: float | None) -> str:
    return "-" if ms is None else f"{nbytes / (ms * 1e-3) / 1e9:,.0f}"


def torch_cuda():
    """torch, if installed with a usable GPU and we are on the GPU backend; else None (it is optional)."""
    if runtime.IS_SIM:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def torch_time_ms(torch, fn, warmup: int = 3, repeat: int = 20) -> float:
    """Median GPU time of a PyTorch callable with CUDA events (the ceiling measured in the same run), warmed up
    and held as runtime.time_ms does. The hold runs on numba's default stream, the legacy NULL stream, so it
    orders PyTorch's work only while PyTorch's current stream is that stream too (its default)."""
    import statistics

    hold = runtime.hold_ms(runtime.warm_up(fn, warmup, torch.cuda.synchronize))
    on_null_stream = torch.cuda.current_stream().cuda_stream == 0
    times = []
    for _ in range(repeat):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if on_null_stream:
            runtime.hold_gpu(hold)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def of_ceiling(nbytes: int, ms: float | None, ceiling: float | None) -> str:
    """Achieved bandwidth as a fraction of the measured copy ceiling."""
    return "-" if ms is None or ceiling is None else f"{nbytes / (ms * 1e-3) / 1e9 / ceiling:.0%}"
