"""Plots shared by the notebooks and the command line: training losses, a training step's time by op, the SGEMM
ladder."""

from __future__ import annotations

import numpy as np

from ..device.hardware import H100_FP32_TFLOPS

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
