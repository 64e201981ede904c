"""The check-then-time harness every kernel module runs on (`python -m fp8lab.kernels.<op>`, `fp8lab bench <op>`).

The llm.c `dev/cuda` pattern: validate every version against the reference (tolerance + |ref| * rtol, NaN is
failure, first mismatches printed), then time it and report GB/s or TFLOP/s against a ceiling measured in the
same run (a copy, cuBLAS through PyTorch) and against the datasheet peak. fp8lab/kernels/README.md states the
contract; `main(module_name, argv)` runs one module:

1. `module.checks(rng)` -> [(what was checked, result)], raising AssertionError at the first mismatch
   (`checks(rng, only=...)` with `--only 2,...`, for modules whose checks take it);
2. `module.timings(rng, args)` -> [Table] (GPU only; under the simulator nothing is timed; `args.only` as above);
3. prints the tables, or with `--markdown` one BENCHMARKS.md section (command, date, device, versions).

Also here: `poisoned` outputs, `first_mismatches` / `assert_close` / `assert_codes_equal`, the copy ceiling, and
table printing, for tests, notebooks and worksheet checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import inspect
import sys
import time

import numpy as np

from ..device import hardware, runtime
from ..device.runtime import cuda
from . import timing

ELEMENTWISE_N = runtime.per_backend({"sim": 4096, "gpu": 1 << 28})
"""Elements of the elementwise benchmarks: 2^28 float32 (1 GiB) on a GPU, 4096 under the simulator."""

# ----------------------------------------------------------------------------------------------------------------
# Checking
# ----------------------------------------------------------------------------------------------------------------


def selected(only, what) -> bool:
    """Whether a module's check or timing of `what` (a version number, or the name of an op without versions) runs
    in a run limited to `only` (a collection of both; None: everything). Modules whose checks take `only`
    (`checks(rng, only=None)`; their timings read `args.only`) are the ones `--only` and
    fp8lab.course.notebook.try_kernel
    can limit."""
    return only is None or what in only


def _only(text: str) -> tuple:
    """--only's value: comma-separated version numbers and op names, e.g. "2" or "2,bias_add"."""
    items = tuple(int(t) if t.strip().isdigit() else t.strip() for t in text.split(","))
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected version numbers or op names separated by commas, got {text!r}")
    return items


def poisoned(shape, dtype):
    """A device array filled with a value no kernel writes by accident: NaN for floats, 0xA5 for codes."""
    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind == "f" else 0xA5
    return cuda.to_device(np.full(shape, fill, dtype=dtype))


def first_mismatches(got, ref, *, atol: float, rtol: float, limit: int = 5):
    """(count, [(index, got, expected)]) of the elements where |got - ref| > atol + rtol*|ref|; NaN in got fails
    unless ref is NaN there too."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    ok = np.abs(got - ref) <= atol + rtol * np.abs(ref)
    ok |= np.isnan(got) & np.isnan(ref)
    bad = np.argwhere(~ok)
    return len(bad), [(tuple(int(i) for i in idx), float(got[tuple(idx)]), float(ref[tuple(idx)]))
                      for idx in bad[:limit]]


def mismatches(got, ref, *, atol: float, rtol: float, limit: int = 5) -> list[str]:
    """Lines describing the first `limit` mismatches (empty when everything is within tolerance)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return [f"shape {got.shape} != reference shape {ref.shape}"]
    n, bad = first_mismatches(got, ref, atol=atol, rtol=rtol, limit=limit)
    if not n:
        return []
    return [f"{n} of {got.size} elements differ"] + [f"  at {i}: got {g!r}, expected {r!r}" for i, g, r in bad]


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


# ----------------------------------------------------------------------------------------------------------------
# Ceilings and units
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def _copy_kernel(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


def copy_ceiling_gbs(nbytes: int) -> float | None:
    """Copy bandwidth in GB/s (bytes read + written) on buffers of nbytes: the memory-bound ceiling.

    The faster of PyTorch's device-to-device copy (when installed) and a grid-stride Numba copy kernel,
    measured now, in the same run as the kernel it is compared with. None under the simulator.
    """
    if runtime.IS_SIM:
        return None
    n = max(1, nbytes // 4)
    src = cuda.to_device(np.random.default_rng().random(n, dtype=np.float32))
    dst = cuda.device_array_like(src)
    blocks = 4 * cuda.get_current_device().MULTIPROCESSOR_COUNT * 8
    best = timing.time_ms(lambda: _copy_kernel[blocks, 256](src, dst), warmup=3, repeat=20)
    torch = torch_cuda()
    if torch is not None:
        ts = torch.rand(n, device="cuda")
        td = torch.empty_like(ts)
        best = min(best, timing.torch_time_ms(torch, lambda: td.copy_(ts)))
    return 2 * 4 * n / (best * 1e-3) / 1e9


def torch_cuda():
    """torch, if installed with a usable GPU and we are on the GPU backend; else None (it is optional)."""
    if runtime.IS_SIM:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def rate(work: float, ms: float | None, unit: str) -> float | None:
    """work (bytes for GB/s, operations for TFLOP/s) per millisecond, in unit."""
    if ms is None:
        return None
    return work / (ms * 1e-3) / (1e9 if unit == "GB/s" else 1e12)


def gbs(nbytes: int, ms: float | None) -> str:
    return "-" if ms is None else f"{rate(nbytes, ms, 'GB/s'):,.0f}"


def of_ceiling(nbytes: int, ms: float | None, ceiling: float | None) -> str:
    """Achieved bandwidth as a fraction of the measured copy ceiling."""
    return "-" if ms is None or ceiling is None else f"{rate(nbytes, ms, 'GB/s') / ceiling:.0%}"


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [[str(c) for c in r] for r in [header] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for j, r in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths))


# ----------------------------------------------------------------------------------------------------------------
# Timing tables
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    """One timed line: `work` is the bytes that must move (GB/s tables) or the operations done (TFLOP/s tables).
    `extra`: more columns by name (e.g. "a call from Python"), the same names in every row of a table."""

    label: str
    ms: float | None
    work: float
    extra: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Table:
    """A timing table: rows, the unit, the ceiling measured in the same run, and which datasheet peak applies.

    A table with `unit=None` is a plain table of `header` and `cells` (measurements that are not speeds)."""

    title: str
    unit: str | None
    rows: list = dataclasses.field(default_factory=list)
    ceiling: float | None = None
    ceiling_label: str = "copy"
    peak_kind: str = "fp32"
    header: list | None = None
    cells: list | None = None

    def columns(self, device_name: str | None) -> tuple[list[str], list[list[str]]]:
        if self.unit is None:
            return list(self.header), [[str(c) for c in r] for r in self.cells]
        pk = hardware.peak(self.unit, device_name, self.peak_kind)
        extra = list(self.rows[0].extra) if self.rows else []
        head = ["kernel", "time", self.unit, f"of {self.ceiling_label}"]
        head += [f"of {pk[1]}"] if pk else []
        body = []
        for r in self.rows:
            v = rate(r.work, r.ms, self.unit)
            line = [r.label, timing.fmt_ms(r.ms), "-" if v is None else (f"{v:,.0f}" if self.unit == "GB/s"
                                                                          else f"{v:,.1f}"),
                    "-" if v is None or not self.ceiling else f"{v / self.ceiling:.1%}"]
            line += ["-" if v is None else f"{v / pk[0]:.1%}"] if pk else []
            line += [str(r.extra.get(k, "-")) for k in extra]
            body.append(line)
        return head + extra, body

    def heading(self) -> str:
        if self.unit is None or self.ceiling is None:
            return self.title
        fmt = f"{self.ceiling:,.0f}" if self.unit == "GB/s" else f"{self.ceiling:,.1f}"
        return f"{self.title}; ceiling: {self.ceiling_label} {fmt} {self.unit}, measured in the same run"


def time_row(label: str, fn, work: float, *, timer=None, launch: bool = False) -> Row:
    """A Row for fn: its GPU time (timer, default timing.time_ms) and, with launch=True, a column "a call from
    Python" (timing.launch_ms: from Python until the GPU is done)."""
    ms = (timer or timing.time_ms)(fn)
    extra = {"a call from Python": timing.fmt_ms(timing.launch_ms(fn))} if launch else {}
    return Row(label, ms, work, extra)


# ----------------------------------------------------------------------------------------------------------------
# main: one kernel module, checked then timed
# ----------------------------------------------------------------------------------------------------------------


def _short(module_name: str) -> str:
    return module_name.rsplit(".", 1)[-1]


def device_label() -> str:
    """The device as tables and recordings name it: "NVIDIA H200 (132 SMs, cc 9.0)" (the simulator: its name)."""
    dev = runtime.device_info()
    return dev["name"] if runtime.IS_SIM else f"{dev['name']} ({dev['sms']} SMs, cc {dev['cc']})"


def software_versions() -> str:
    from importlib import metadata

    out = []
    for dist in ("numba-cuda", "torch"):
        try:
            out.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def _markdown(module, short, checks, tables, seconds, flags=()) -> str:
    dev = runtime.device_info()
    where = device_label()
    command = " ".join(["fp8lab bench", short, "--markdown", *flags])
    lines = [f"### {short}: {(module.__doc__ or '').strip().splitlines()[0]}", "",
             f"`{command}` · {datetime.date.today().isoformat()} · {where} · "
             f"{software_versions()} · {seconds:.0f} s", "",
             f"Checks before timing: {len(checks)} passed ({'; '.join(c[0] for c in checks[:4])}"
             f"{'; ...' if len(checks) > 4 else ''}).", ""]
    for t in tables:
        head, body = t.columns(dev["name"])
        lines += [f"**{t.heading()}**", "", "| " + " | ".join(head) + " |",
                  "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in body]
        lines.append("")
    return "\n".join(lines)


def main(module_name: str, argv=None, name: str | None = None) -> int:
    """Check every version of the kernel module, then time it: `python -m fp8lab.kernels.<op> [--markdown]`.
    name: what `fp8lab bench NAME` calls it, when that is not the module's own name."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    if module_name == "__main__":  # python -m fp8lab.kernels.<op>
        module_name = module.__spec__.name
    short = name or _short(module_name)
    parser = argparse.ArgumentParser(prog=f"fp8lab bench {short}",
                                     description=(module.__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print one BENCHMARKS.md section instead")
    parser.add_argument("--check-only", action="store_true", help="run the checks, time nothing")
    takes_only = "only" in inspect.signature(module.checks).parameters  # modules with editable kernels
    parser.add_argument("--only", type=_only, metavar="V,...",
                        help=("check and time only these versions (or ops), e.g. 2 or 2,bias_add" if takes_only else
                              argparse.SUPPRESS))  # not listed where refused
    for flag, kwargs in getattr(module, "OPTIONS", {}).items():
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    rng = np.random.default_rng()
    t0 = time.perf_counter()
    if args.only is not None and not takes_only:
        parser.error(f"--only: {short} checks and times every version at once (its checks take no `only`)")
    checks = module.checks(rng) if args.only is None else module.checks(rng, only=args.only)  # raises at a mismatch
    if not checks:
        parser.error(f"--only: {', '.join(map(str, args.only))} selects none of {short}'s checks")
    if not args.markdown:
        print_table(f"{short}: checks against the reference ({runtime.backend}, {time.perf_counter() - t0:.1f} s)",
                    ["check", "result"], [list(c) for c in checks])
    if args.check_only:
        return 0
    if runtime.IS_SIM:
        print("simulator: nothing is timed (CUDA events report -1, and Python threads say nothing about a GPU).")
        return 0
    tables = module.timings(rng, args)
    if args.markdown:
        flags = [f for f, kw in getattr(module, "OPTIONS", {}).items()
                 if kw.get("action") == "store_true" and getattr(args, f.lstrip("-").replace("-", "_"))]
        print(_markdown(module, short, checks, tables, time.perf_counter() - t0, flags))
        return 0
    name = runtime.device_info()["name"]
    for t in tables:
        head, body = t.columns(name)
        print_table(t.heading(), head, body)
    return 0
