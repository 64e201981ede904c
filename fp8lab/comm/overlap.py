"""Overlap on one GPU: copies on streams beside a kernel, and an FP8 GEMM that leaves SMs to communication.

DeepSeek-V3 (arXiv 2412.19437, section 3.2.2) overlaps its all-to-all communication with computation and gives 20
of the H800's 132 SMs to the communication kernels. Two experiments measure both ideas on one GPU:

- `streams()` (fp8lab/comm/streams.py): the FP8 GEMM (fp8_gemm version 7) and copies of pinned host memory to and
  from the GPU (H2D, D2H), issued one after another on one stream, then each on its own stream: the copy engines
  move bytes while the SMs compute. Every operation is timed with CUDA events against one start event;
  `plot_timeline` draws them. `try_overlap(issue)`: your own plan (a copy and the GEMM on the streams you choose),
  verified and timed against both on one stream.
- `sm_budget()` (fp8lab/comm/sm_budget.py): the persistent GEMM (version 7) on `sms` SMs, alone and beside
  `copy_persistent` (a bandwidth-bound stand-in for a communication kernel, one block per SM) on the SMs left over,
  on a second stream: GEMM TFLOP/s and copy GB/s for each split, and what giving 20 SMs away costs the GEMM;
  `plot_sm_budget` draws it.

This module is their entry point and keeps every public name of both (their shared sizes and helpers are in
fp8lab/comm/overlap_common.py). `python -m fp8lab.comm.overlap` and `fp8lab bench overlap` check both, then time
them on a GPU (`--markdown`, `--plot DIR`, `--json PATH`). Under the simulator the experiments run at tiny sizes
and verify their outputs; nothing is timed (times are None, shown as "not measured").
"""

from __future__ import annotations

import datetime
import json
import os
import sys

from .. import bench
from ..device import hardware, runtime
from . import sm_budget as budget_experiment
from . import streams as streams_experiment
from .overlap_common import CHECK_SIZES, EVENT_TOLERANCE_MS, GIVEN_SMS, NOT_MEASURED, SIZES, default_splits
from .sm_budget import (COPY_SMEM, COPY_THREADS, COPY_UNROLL, SmBudgetResult, Split, copy_kernel, copy_persistent,
                        plot_sm_budget, sm_budget)
from .streams import OverlapTry, StreamsResult, TimedOp, plot_timeline, streams, try_overlap

__all__ = [
    "GIVEN_SMS", "SIZES", "CHECK_SIZES", "NOT_MEASURED", "EVENT_TOLERANCE_MS", "default_splits", "COPY_THREADS",
    "COPY_SMEM", "COPY_UNROLL", "copy_kernel", "copy_persistent", "TimedOp", "StreamsResult", "streams",
    "plot_timeline", "OverlapTry", "try_overlap", "Split", "SmBudgetResult", "sm_budget", "plot_sm_budget", "OPTIONS", "recording", "recorded",
    "checks", "timings", "main",
]

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
    if copy_kernel is not budget_experiment.copy_kernel:
        # try_kernel(overlap, ...) swapped this module's name only, and the copy runs from fp8lab.comm.sm_budget
        raise ValueError("a copy kernel is tried as fp8lab.comm.sm_budget's: try_kernel(sm_budget, 'copy', "
                         "copy_kernel) with `from fp8lab.comm import sm_budget`")
    rows = budget_experiment.checks(rng, only=("copy",)) if bench.selected(only, "copy") else []
    rows += streams_experiment.checks(rng, only)
    return rows + (budget_experiment.checks(rng, only=("sm_budget",)) if bench.selected(only, "sm_budget") else [])


def timings(rng, args) -> list:
    """Both experiments at realistic sizes (GPU only), with the ceilings measured in the same run; --plot DIR also
    writes the figures, --json PATH the results. With args.only = ["copy"]: the copy kernel alone on every SM, at
    sm_budget's copy size (fp8lab.comm.sm_budget.timings)."""
    if getattr(args, "only", None) is not None:
        return budget_experiment.timings(rng, args)
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
