"""Plots shared by the notebooks and the command line: training losses, a training step's time by op, the SGEMM
ladder, and one Linear's GEMMs in a recipe drawn as DeepSeek-V3's Figure 6 (`plot_recipe`, from `recipe_flow`)."""

from __future__ import annotations

import numpy as np

from ..device.hardware import H100_FP32_TFLOPS
from ..numerics import recipes

BOEHM_A6000 = {1: 1.3, 2: 8.5, 3: 12.8, 4: 36.5, 5: 68.7, 6: 78.4}
"""Boehm's published SGEMM ladder (RTX A6000, 4092^2, percent of cuBLAS; "How to Optimize a CUDA Matmul Kernel for
cuBLAS-like Performance", 2022): his numbers, not ours, for the rungs that match gemm versions 1-6. Version 7 has no
counterpart (his kernel 6 already had 128-bit shared loads; double buffering comes later in his list)."""


def plot_losses(histories, ax=None, path=None, title=None):
    """Training loss per step for each History (log scale), with the noise floor; returns the figure.

    path: also save the figure there (PNG).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    else:
        fig = ax.figure
    chars = bool(histories) and histories[0].task == "chars"
    for h in histories:
        steps = np.arange(1, len(h.loss) + 1)
        line, = ax.plot(steps, h.loss, lw=1, alpha=0.6 if chars else 1,
                        label=f"{h.recipe} ({h.engine}): final {h.final_loss:.4f}")
        if chars and h.val_loss:  # validation losses as points in the same colour
            vs, vl = zip(*h.val_loss)
            ax.plot(vs, vl, "o-", ms=3, color=line.get_color(), label=f"{h.recipe} validation: {vl[-1]:.4f}")
    if histories and not chars:
        ax.axhline(histories[0].floor, color="k", ls="--", lw=0.8, label=f"noise floor {histories[0].floor:g}")
    if histories:
        h = histories[0]
        if chars:
            m = h.model
            what = (f"width {m['context'] * m['embed']}, SwiGLU {m['hidden']}, {m['blocks']} blocks" +
                    (f", outliers x{m['outliers']:g}" if m.get("outliers", 1) != 1 else ""))
        else:
            what = f"{h.d_in} -> {h.d_out}"
        ax.set_title(title or f"batch {h.batch}, {what}, {h.optimizer} lr {h.lr:g}, seed {h.seed} ({h.backend})",
                     fontsize=9)
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.yaxis,):  # plain numbers (0.3, 2) instead of 3x10^-1 on a log axis
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)" if chars else "MSE loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_breakdown(histories, ax=None, path=None, title=None):
    """A training step's GPU time by op (History.breakdown, milliseconds per step), one stacked bar per recipe;
    returns the figure, or None when no history has a breakdown (the simulator measures none).

    path: also save the figure there (PNG).
    """
    import matplotlib.pyplot as plt

    hs = [h for h in histories if h.breakdown]
    if not hs:
        return None
    names = list(dict.fromkeys(k for h in hs for k in h.breakdown))  # the first recipe's order, largest first
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(hs)))
    else:
        fig = ax.figure
    colors = plt.get_cmap("tab20")(np.arange(len(names)) % 20)
    for row, h in enumerate(hs):
        left = 0.0
        for k, c in zip(names, colors):
            ms = h.breakdown.get(k, 0.0)
            ax.barh(row, ms, left=left, color=c, label=k if row == 0 or k not in hs[0].breakdown else None)
            left += ms
        ax.text(left, row, f" {left:.1f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(hs)), [h.recipe for h in hs])
    ax.invert_yaxis()
    ax.set_xlabel("GPU time per training step (ms)")
    ax.set_title(title or f"where a step's time goes ({hs[0].batch} windows per step)", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(hs) < 3 else -0.2))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def plot_crossover(widths, series: dict, path=None, subtitle: str = "", ax=None):
    """Step time against model width, one line per run (fp8lab.training.speed.crossover: {label: [ms or None per
    width]}), log-log: where FP8 starts to pay is where its line crosses below BF16's. Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 4))
    else:
        fig = ax.figure
    for label, row in series.items():
        pts = [(w, ms) for w, ms in zip(widths, row) if ms is not None]
        if pts:
            style = "-o" if label.startswith("fp8lab") else "--s"
            ax.plot(*zip(*pts), style, label=label, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(widths), [str(w) for w in widths])
    ax.set_xlabel("model width (SwiGLU width x 5632 / 2048, 4 blocks)")
    ax.set_ylabel("training step (ms)")
    ax.set_title("where FP8 starts to pay" + (f" ({subtitle})" if subtitle else ""), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    if path is not None:
        import os

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def plot_step_ladder(steps_ms: dict, title: str = "", ax=None):
    """One horizontal bar per way of running a training step ({label: milliseconds}, in ladder order), the time
    written at each bar's end. Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 0.9 + 0.45 * len(steps_ms)))
    else:
        fig = ax.figure
    labels, ms = list(steps_ms), list(steps_ms.values())
    ax.barh(range(len(ms)), ms, color=plt.get_cmap("tab10")(np.arange(len(ms)) % 10))
    for row, v in enumerate(ms):
        ax.text(v, row, f" {v:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(ms)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(ms))
    ax.set_xlabel("training step (ms, median wall time)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def plot_ladder(tflops: dict, cublas: float | None = None, path=None, ax=None, title=None, source: str = "this run"):
    """Bar chart of the ladder: TFLOP/s per version (measured) with the cuBLAS and FP32-peak lines; returns the
    figure. `source` says where the numbers come from ("this run", or a recorded run's device and date). When
    nothing was measured (tflops values all None), plots Boehm's A6000 percentages of cuBLAS instead, labelled as
    his numbers."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4))
    else:
        fig = ax.figure
    vs = sorted(tflops)
    labels = [f"v{v}" for v in vs]
    measured = all(tflops.get(v) is not None for v in vs)
    if measured:
        vals = [tflops[v] for v in vs]
        ax.bar(labels, vals, color="tab:blue", label=f"fp8lab (measured, {source})")
        if cublas is not None:
            ax.axhline(cublas, color="k", ls="--", lw=1, label=f"cuBLAS SGEMM {cublas:.1f} TFLOP/s ({source})")
        ax.axhline(H100_FP32_TFLOPS, color="tab:red", ls=":", lw=1,
                   label=f"H100 FP32 peak ~{H100_FP32_TFLOPS:.0f} TFLOP/s (datasheet)")
        ax.set_ylabel("TFLOP/s")
        for x, v in zip(labels, vals):
            ax.annotate(f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=8)
        ax.set_title(title or "SGEMM ladder, measured")
        ax.set_ylim(0, 1.3 * max(vals + [H100_FP32_TFLOPS, cublas or 0]))
    else:
        vs = [v for v in vs if v in BOEHM_A6000]  # the rungs that match his kernels
        labels = [f"v{v}" for v in vs]
        vals = [BOEHM_A6000[v] for v in vs]
        ax.bar(labels, vals, color="tab:gray", label="Boehm's published numbers (RTX A6000, 4092^2), NOT measured here")
        ax.axhline(100, color="k", ls="--", lw=1, label="cuBLAS = 100%")
        ax.set_ylabel("% of cuBLAS SGEMM")
        for x, v in zip(labels, vals):
            ax.annotate(f"{v:g}%", (x, v), ha="center", va="bottom", fontsize=8)
        ax.set_title(title or "SGEMM ladder: Boehm's A6000 percentages (simulator: nothing measured)")
        ax.set_ylim(0, 125)  # room for the legend above the cuBLAS line
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


# ----------------------------------------------------------------------------------------------------------------
# One Linear's three GEMMs in a recipe, in the style of DeepSeek-V3's Figure 6
# ----------------------------------------------------------------------------------------------------------------

PRECISION_COLORS = {"fp32": "#9ecae1", "bf16": "#a1d99b", "e4m3": "#fdae6b", "e5m2": "#fc9272"}
PRECISION_NAMES = {"fp32": "FP32", "bf16": "BF16", "e4m3": "E4M3", "e5m2": "E5M2"}
_GRAIN = {"tensor": "one scale per tensor", "tile": "1×128 tiles", "block": "128×128 blocks"}
# (GEMM, formula, name of a, name of b, output); the operands in the NT layout of fp8lab.numerics.recipes
_GEMM_ROWS = (("fprop", "y = x Wᵀ", "x", "W", "y"), ("dgrad", "dx = dy W", "dy", "Wᵀ", "dx"),
              ("wgrad", "dW = dyᵀ x", "dyᵀ", "xᵀ", "dW"))
_SOURCES = {"x": "x", "W": "W (master)", "dy": "dy", "Wᵀ": "W (master)", "dyᵀ": "dy", "xᵀ": "x"}
# where an operand may reuse the codes another GEMM made: Wᵀ and dyᵀ transposed exactly (per tensor or square
# blocks), xᵀ transposed exactly or re-tiled from Fprop's 1×128 codes (wgrad_x_from_fprop)
_REUSE = {"dgrad.b": "fprop.b", "wgrad.a": "dgrad.a", "wgrad.b": "fprop.a"}


def _cast(op, pow2: bool, transposed: str | None) -> str:
    """How a float32 tensor becomes the operand `op` (a recipes.Operand); transposed: the name of the tensor whose
    transpose the operand is, or None."""
    if not op.fp8:
        text = "none (FP32)" if op.precision == "fp32" else "round to BF16"
        return "transpose" + ("" if op.precision == "fp32" else ", " + text) if transposed else text
    grain = _GRAIN[op.granularity] + (", 2^k scales" if pow2 and op.granularity != "tensor" else "")
    text = f"quantize to {PRECISION_NAMES[op.precision]},\n{grain}"
    if transposed:
        text = "transpose, " + text + (f" (128×1 of {transposed})" if op.granularity == "tile" else "")
    return text


def recipe_flow(recipe) -> list[dict]:
    """How each of a Linear's six GEMM operands is made in `recipe` (a Recipe or its name), as the engines make it
    (fp8lab.numerics.recipes' docstring; fp8lab.training.engine_kernels.DeviceLinear): one dict per operand with
    gemm ("fprop", ...), formula, operand (its name in the NT layout: x, W, dy, Wᵀ, dyᵀ, xᵀ), precision and
    granularity (the recipe's Operand), source (what it is made from: a float32 tensor, or codes another GEMM made),
    source_precision, how (the cast, an exact transpose of codes, or the re-tiling of Fprop's codes of x), reuses
    (the "gemm.side" key of the operand whose codes it reuses, or None)."""
    r = recipes.get(recipe)
    ops = r.operands()
    out = []
    for gemm, formula, name_a, name_b, _ in _GEMM_ROWS:
        for side, name in (("a", name_a), ("b", name_b)):
            key, op = f"{gemm}.{side}", ops[f"{gemm}.{side}"]
            how, reuses = _cast(op, op.pow2, name[:-1] if name.endswith("ᵀ") else None), None
            src = _REUSE.get(key)
            if key == "wgrad.b" and r.wgrad_x_from_fprop:
                how, reuses = "re-tile 1×128 → 128×1\n(decode, re-quantize" + (", 2^k scales)" if op.pow2 else ")"), src
            elif src and op.fp8 and op == ops[src] and op.exact_transpose:
                how, reuses = "transpose the codes\nand scales (exact)", src
            source, source_precision = _SOURCES[name], "fp32"
            if reuses:
                g, s = reuses.split(".")
                source = f"{_SOURCES[name].split()[0]}'s codes\n(made for {g.capitalize()})"
                source_precision = ops[reuses].precision
            else:
                source += f"\n{PRECISION_NAMES['fp32']}"
            out.append(dict(gemm=gemm, formula=formula, operand=name, precision=op.precision,
                            granularity=op.granularity, source=source, source_precision=source_precision, how=how,
                            reuses=reuses))
    return out


def plot_recipe(recipe, ax=None, path=None):
    """One Linear layer's Fprop, Dgrad and Wgrad in `recipe` (a Recipe or its name), drawn from the recipe's fields
    in the style of DeepSeek-V3's Figure 6 (arXiv 2412.19437): each float32 tensor, the cast that makes each GEMM
    operand (coloured by the operand's precision), the GEMM (float32 accumulation), its float32 output, and the
    optimizer step on the float32 master weights with the recipe's AdamW moments; returns the figure.

    path: also save it there (PNG)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    r = recipes.get(recipe)
    flow = recipe_flow(r)
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, 6.6))
    else:
        fig = ax.figure
    ax.set_xlim(0, 11)
    ax.set_ylim(-0.6, 10.4)
    ax.axis("off")

    def box(x, y, text, precision, w=2.1, h=0.62, bold=False):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04", lw=0.8,
                                    fc=PRECISION_COLORS[precision], ec="k"))
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, fontweight="bold" if bold else "normal")

    def arrow(x0, y0, x1, y1, style="-|>", ls="-"):
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle=style, lw=0.9, ls=ls, color="k",
                                                            shrinkA=0, shrinkB=0))

    xs, xc, xg, xo = 1.1, 3.9, 6.6, 9.2  # columns: float32 source, cast, GEMM, output
    accumulate = "FP32" if r.gemm_precision == "fp32" else "FP32 accumulation"
    for row, (gemm, formula, _, _, out_name) in enumerate(_GEMM_ROWS):
        yg = 9 - 3.2 * row
        operands = [f for f in flow if f["gemm"] == gemm]
        box(xg, yg, f"{gemm.capitalize()}\n{formula}\n{accumulate}", "fp32", w=2.0, h=1.3, bold=True)
        for f, dy in zip(operands, (0.55, -0.55)):
            y = yg + dy
            box(xs, y, f["source"], f["source_precision"], w=1.7)
            box(xc, y, f["how"], f["precision"], w=2.5, h=0.72)
            arrow(xs + 0.85, y, xc - 1.25, y)
            arrow(xc + 1.25, y, xg - 1.0, yg + dy / 2)
            ax.text(xc + 1.35, y + (0.2 if dy > 0 else -0.2), f"{f['operand']}: {PRECISION_NAMES[f['precision']]}",
                    fontsize=7, ha="left", va="center", style="italic")
        box(xo, yg, f"{out_name}\nFP32", "fp32", w=1.4)
        arrow(xg + 1.0, yg, xo - 0.7, yg)
    # the optimizer: dW (FP32) -> AdamW with the recipe's moments -> FP32 master weights
    y_opt = 9 - 3.2 * 2 - 1.7
    box(xo, y_opt, f"AdamW\nmoments {PRECISION_NAMES[r.moments]}", r.moments, w=1.8)
    arrow(xo, 9 - 3.2 * 2 - 0.31, xo, y_opt + 0.31)
    box(xs, y_opt, "master weights W\nFP32 (read by Fprop\nand Dgrad above)", "fp32", w=2.0, h=0.9)
    arrow(xo - 0.9, y_opt, xs + 1.0, y_opt)
    pow2 = r.pow2_operands
    extra = [f"scales rounded up to powers of two: {', '.join(pow2)}" if pow2 else "",
             "x not kept in FP32: Wgrad re-tiles Fprop's codes" if r.wgrad_x_from_fprop else ""]
    title = f"recipe {r.name!r}: one Linear layer (in the style of DeepSeek-V3's Figure 6, arXiv 2412.19437)"
    ax.set_title(title + "".join(f"\n{e}" for e in extra if e), fontsize=9)
    used = ["fp32"] + sorted(({f["precision"] for f in flow} | {r.moments}) - {"fp32"}, key=recipes.PRECISIONS.index)
    ax.legend(handles=[Patch(fc=PRECISION_COLORS[p], ec="k", label=PRECISION_NAMES[p]) for p in used],
              loc="lower center", ncol=len(used), fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.04))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig
