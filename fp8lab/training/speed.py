"""The capstone's step time: the course's recipes against PyTorch peers on the same model, at each size, and where FP8 starts to pay.

`fp8lab bench train [--markdown] [--sizes default,large] [--widths 512,1024,2048,4096] [--steps N] [--plot PATH]`
(GPU: timings; the simulator runs the checks only). Two tables per size and one crossover:

- recipes and peers: the step time (median wall time of a step, after the first steps, which compile kernels) of
  the course's fp32, bf16 (tensor cores) and fp8-deepseek on the kernel engine (each step one CUDA graph; and
  fp8-deepseek once more with every kernel launched from Python), and of the same model in PyTorch:
  BF16 autocast eager, the same under torch.compile, torchao's float8 training (rowwise and tensorwise scales, under
  torch.compile, as torchao runs it) and Transformer Engine's block scaling (1 x 128 / 128 x 128, DeepSeek-V3's),
  each where it installs (a row says why when it does not); with the validation loss, so that speed is never read
  apart from parity.
- GPU milliseconds by op of the course's runs: launched from Python (the profiled eager steps) and, once the step
  is a CUDA graph, its forward and backward replayed as one graph (History.graph_breakdown): what each op costs
  without launch gaps.
- the crossover: step time against the model's width at a fixed number of windows a step, bf16 against
  fp8-deepseek, the course's and the peers': at a fixed batch the GEMMs' work grows as width^2, the quantization's
  as width, and the launches' overhead not at all, so FP8 pays only past some width (torchao's float8 docs and
  pytorch/ao issues 572 and 1297 ask where).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np

from .. import bench
from ..device import runtime
from . import engine_torch, loop
from . import model as lm

COMPILED_FLOAT8 = ("rowwise", "tensorwise")
RECIPES = ("fp32", "bf16", "fp8-deepseek")
"""The course's recipes timed: the float32 baseline, BF16 on the tensor cores, DeepSeek-V3's FP8."""
PEERS = (("PyTorch BF16 autocast, eager", {}), ("PyTorch BF16 autocast, torch.compile", {"compile": True}),
         *((engine_torch.FLOAT8[k] + (", torch.compile" if k in COMPILED_FLOAT8 else ""),
            {"float8": k, "compile": k in COMPILED_FLOAT8}) for k in engine_torch.FLOAT8))
"""(label, engine_torch.train options) of every peer, in table order: torchao's float8 training under torch.compile
(its casts are fused by the compiler: torchao's float8 README measures it so), Transformer Engine's as it comes."""
WIDTHS = (512, 1024, 2048, 4096)
SWIGLU_RATIO = 5632 / 2048  # the large preset's hidden / width (TinyLlama's 5632 at width 2048: 8/3 rounded up to 256s)



def _sizes(text: str) -> list:
    """--sizes, checked when the command line is read (before minutes of training)."""
    names = [s for s in text.split(",") if s]
    bad = [s for s in names if s not in loop.PRESETS]
    if bad:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: each size must be one of {', '.join(loop.PRESETS)}")
    return names


def _recipes(text: str) -> list:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in RECIPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"--recipes: a comma-separated list of {', '.join(RECIPES)}, got {text!r}")
    return names


def _widths(text: str) -> list:
    """--widths, checked when the command line is read: positive multiples of 16 (16 characters a window)."""
    out = []
    for w in (w for w in text.split(",") if w):
        if not w.isdigit() or int(w) <= 0 or int(w) % 16:
            raise argparse.ArgumentTypeError(f"{w!r}: each width must be a positive multiple of 16")
        out.append(int(w))
    return out


OPTIONS = {
    "--sizes": dict(type=_sizes, default="default,large", help="named sizes to time (training.loop.PRESETS), "
                                                               "comma-separated (default: %(default)s)"),
    "--widths": dict(type=_widths, default=",".join(map(str, WIDTHS)), help="widths of the crossover, "
                     "comma-separated, multiples of 16 (default: %(default)s; empty: no crossover)"),
    "--steps": dict(type=int, default=None, help="steps per run (default: the size's own steps, so that the "
                                                 "validation loss means something; the crossover runs 30)"),
    "--recipes": dict(type=_recipes, default=",".join(RECIPES), help="the course's recipes to time at each size "
                      "(default: %(default)s; fp32's SIMT GEMMs take seconds a step at --sizes large)"),
    "--plot": dict(default="runs/train_crossover.png", help="where to draw the crossover (default: %(default)s)"),
}


@dataclasses.dataclass
class Run:
    """One timed run: what ran, its median step time (ms) and final validation loss (nats), or why it did not."""

    label: str
    step_ms: float | None = None
    val_loss: float | None = None
    why_not: str | None = None
    gpu_busy: float | None = None  # the course's runs with a CUDA graph: GPU time over step time (History.gpu_busy)
    breakdown: dict | None = None  # the course's runs on a GPU: History.breakdown (launched from Python)
    graph_breakdown: dict | None = None  # and History.graph_breakdown (forward and backward as one CUDA graph)


def preset(size: str) -> dict:
    """The training arguments of a named size (its sizes, steps and lr) on this backend."""
    d = loop.sizes("chars", size)
    return {k: d[k] for k in ("batch", "context", "embed", "hidden", "blocks", "steps", "lr", "eval_batches")}


def at_width(width: int, batch: int) -> dict:
    """The large preset's shape at another width: 16 characters of width / 16, SwiGLU width x 5632 / 2048 rounded to
    a multiple of 128, 4 blocks, `batch` windows."""
    if width % 16:
        raise ValueError(f"--widths: each a multiple of 16 (16 characters a window), got {width}")
    hidden = max(128, 128 * round(SWIGLU_RATIO * width / 128))
    return dict(preset("large"), context=16, embed=width // 16, hidden=hidden, batch=batch)


def course_run(recipe: str, args: dict, steps: int, graph: bool | None = None) -> Run:
    """The kernel engine on `args` (preset's keys) for `steps` steps, validated once at the end; graph as
    fl.train's (None: the step replayed as a CUDA graph on a GPU)."""
    a = dict(args, steps=steps)
    h = loop.train(recipe, task="chars", engine="kernels", progress=False, eval_every=steps, graph=graph, **a)
    return Run(course_label(recipe, graph), h.step_ms, h.eval_loss, gpu_busy=h.gpu_busy, breakdown=h.breakdown,
               graph_breakdown=h.graph_breakdown)


def course_label(recipe: str, graph: bool | None = None) -> str:
    """"fp8lab RECIPE", and for a BF16 recipe where its GEMMs run (engine_kernels.bf16_tensor_cores); graph=False:
    "(no CUDA graph)" after it."""
    from ..numerics import recipes
    from .engine_kernels import bf16_tensor_cores

    label = f"fp8lab {recipe}"
    if recipes.get(recipe).gemm_precision == "bf16":
        label += " (" + ("tensor cores" if bf16_tensor_cores() else "SIMT GEMMs") + ")"
    return label + (" (no CUDA graph)" if graph is False else "")


def peer_run(label: str, options: dict, args: dict, steps: int) -> Run:
    """engine_torch.train with `options` on the same model and batches; Run.why_not where it cannot run."""
    ok, why = engine_torch.peer_status(**options)
    if not ok:
        return Run(label, why_not=why)
    cfg = lm.Config(_vocab(), args["context"], args["embed"], args["hidden"], args["blocks"])
    try:
        r = engine_torch.train(cfg, steps, args["batch"], args["lr"], eval_batches=args["eval_batches"], **options)
    except Exception as e:  # a peer that installs but fails (a version mismatch): a row that says so
        return Run(label, why_not=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return Run(label, r["step_ms"], r["val_loss"])


def _vocab() -> int:
    from . import corpus

    return corpus.load().vocab_size


def compare(size: str, steps: int | None = None, peers=PEERS, recipes=RECIPES) -> tuple[dict, list[Run]]:
    """Every recipe of `recipes` (RECIPES) and every peer at a named size: (its arguments, runs)."""
    args = preset(size)
    n = steps or args["steps"]
    runs = [course_run(r, args, n) for r in recipes]
    if not runtime.IS_SIM:  # what the CUDA graph saves: the FP8 recipe with every kernel launched from Python
        from ..numerics import recipes as R

        runs += [course_run(r, args, n, graph=False) for r in recipes if R.get(r).gemm_precision == "fp8"]
    runs += [peer_run(label, opt, args, n) for label, opt in peers]
    return args, runs


def table(size: str, args: dict, runs: list[Run], steps: int) -> bench.Table:
    """The recipes-and-peers table: step time, its ratio to the course's bf16 and to PyTorch eager, the validation
    loss and its distance from the course's bf16."""
    by = {r.label: r for r in runs}
    bf16 = by.get(course_label("bf16"))  # None when --recipes left it out: its columns say "-"
    eager = by.get(PEERS[0][0])
    cells = []
    for r in runs:
        if r.why_not:
            cells.append([r.label, "-", "-", "-", "-", "-", "-", r.why_not])
            continue
        cells.append([r.label, f"{r.step_ms:.2f} ms", "-" if r.gpu_busy is None else f"{r.gpu_busy:.0%}",
                      _ratio(bf16.step_ms if bf16 else None, r.step_ms),
                      _ratio(eager.step_ms if eager and not eager.why_not else None, r.step_ms),
                      f"{r.val_loss:.4f}", f"{(r.val_loss - bf16.val_loss) / bf16.val_loss:+.2%}" if bf16 else "-",
                      ""])
    width = args["context"] * args["embed"]
    return bench.Table(f"train --task chars --size {size}: {args['batch']} windows of {args['context']} characters a "
                       f"step, width {width}, SwiGLU {args['hidden']}, {args['blocks']} blocks, "
                       f"{steps} steps; speedup = the other's step time / this one's; GPU busy = the GPU time of "
                       "the graph's replays over their wall time", None,
                       header=["run", "step", "GPU busy", "speedup vs fp8lab bf16", "vs PyTorch eager", "val (nats)",
                               "val vs fp8lab bf16", "not run because"], cells=cells)


def breakdown_table(size: str, runs: list[Run]) -> bench.Table | None:
    """GPU milliseconds per step by op of the course's runs: launched from Python (the profiled eager steps, gaps
    included) and, where the step became a CUDA graph, the forward and backward replayed as one; None when no run
    measured any (the simulator)."""
    cols = []
    for r in runs:
        if r.breakdown and not r.label.endswith("(no CUDA graph)"):
            cols.append((f"{r.label}: launched from Python", r.breakdown))
            if r.graph_breakdown:
                cols.append((f"{r.label}: one CUDA graph", r.graph_breakdown))
    if not cols:
        return None
    ops = list(dict.fromkeys(k for _, b in cols for k in b))
    cells = [[op] + ["-" if op not in b else f"{b[op]:.3f}" for _, b in cols] for op in ops]
    cells.append(["all"] + [f"{sum(b.values()):.3f}" for _, b in cols])
    return bench.Table(f"train --size {size}: GPU ms per step by op (CUDA events between the ops; launched from "
                       "Python they include the waits for Python; the graph holds the forward and backward only: "
                       "no batch copy, AdamW, EMA copy or loss read)", None,
                       header=["op"] + [label for label, _ in cols], cells=cells)


def _ratio(base, ms) -> str:
    return "-" if base is None or ms is None else f"{base / ms:.2f}x"


def crossover(widths, batch: int, steps: int, peers=PEERS[:3]) -> dict:
    """{series label: [step ms per width (None where it did not run)]}: the course's bf16 and fp8-deepseek and the
    peers (default: eager, compile, torchao rowwise) at each width, `batch` windows a step."""
    series = {}
    for w in widths:
        args = at_width(w, batch)
        for recipe in ("bf16", "fp8-deepseek"):
            r = course_run(recipe, args, steps)
            series.setdefault(r.label, []).append(r.step_ms)
        for label, opt in peers:
            r = peer_run(label, opt, args, steps)
            series.setdefault(label, []).append(r.step_ms)
    return series


def crossover_table(widths, series: dict, batch: int) -> bench.Table:
    cells = [[label] + ["-" if ms is None else f"{ms:.2f}" for ms in row] for label, row in series.items()]
    fp8, bf16 = series.get(course_label("fp8-deepseek")), series.get(course_label("bf16"))
    if fp8 and bf16:
        cells.append(["fp8lab: bf16 / fp8-deepseek"] + [_ratio(b, f) for b, f in zip(bf16, fp8)])
    return bench.Table(f"step time (ms) against width, {batch} windows a step, SwiGLU width x {SWIGLU_RATIO:.2f}, "
                       "4 blocks", None, header=["run"] + [f"width {w}" for w in widths], cells=cells)


def checks(rng) -> list:
    """The harness end to end on a tiny model (2 steps): every course recipe on the kernel engine, the PyTorch BF16
    eager peer where PyTorch is installed (on the CPU without a GPU), the tables built."""
    del rng  # the runs draw their own batches (fl.train's seeded stream)
    tiny = dict(batch=8, context=4, embed=16, hidden=32, blocks=1, steps=2, lr=3e-3, eval_batches=1)
    out = []
    runs = [course_run(r, tiny, 2) for r in RECIPES]
    runs += [peer_run(label, opt, tiny, 2) for label, opt in PEERS[:1]]
    for r in runs:
        if r.why_not is None and not (math.isfinite(r.val_loss) and r.step_ms > 0):
            raise AssertionError(f"{r.label}: validation loss {r.val_loss}, step {r.step_ms} ms")
        out.append((f"{r.label}: 2 steps of a tiny model", r.why_not or f"val {r.val_loss:.4f} nats"))
    table("tiny", dict(tiny), runs, 2).columns(None)
    timed = dataclasses.replace(runs[-1], label=course_label("fp8-deepseek"), breakdown={"GEMM Fprop": 1.0,
                                "AdamW": 0.5}, graph_breakdown={"GEMM Fprop": 0.6})  # the simulator times none
    breakdown_table("tiny", [timed]).columns(None)
    series = {course_label("bf16"): [1.0, 2.0], course_label("fp8-deepseek"): [2.0, None]}
    crossover_table((16, 32), series, 8).columns(None)
    out.append(("tables", "built"))
    return out


def timings(rng, args) -> list:
    """GPU only: every size in --sizes (recipes and peers), then the crossover over --widths, drawn to --plot."""
    del rng
    tables = []
    for size in args.sizes:
        sargs, runs = compare(size, args.steps, recipes=args.recipes)
        tables.append(table(size, sargs, runs, args.steps or sargs["steps"]))
        ops = breakdown_table(size, runs)
        if ops is not None:
            tables.append(ops)
    widths = args.widths
    if widths:
        batch = preset("large")["batch"]
        series = crossover(widths, batch, args.steps or 30)
        tables.append(crossover_table(widths, series, batch))
        if args.plot:
            from ..course.plotting import plot_crossover

            plot_crossover(widths, series, args.plot, f"{runtime.device_info()['name']}, {batch} windows a step")
            print(f"wrote {args.plot}")
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv, name="train")
