"""Plots shared by the notebooks and the command line."""

from __future__ import annotations

import numpy as np


def plot_losses(histories, ax=None, path=None, title=None):
    """Training loss per step for each History (log scale), with the noise floor; returns the figure.

    path: also save the figure there (PNG).
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    else:
        fig = ax.figure
    for h in histories:
        steps = np.arange(1, len(h.loss) + 1)
        ax.plot(steps, h.loss, lw=1, label=f"{h.recipe} ({h.engine}): final {h.final_loss:.4f}")
    if histories:
        ax.axhline(histories[0].floor, color="k", ls="--", lw=0.8, label=f"noise floor {histories[0].floor:g}")
        h = histories[0]
        ax.set_title(title or f"batch {h.batch}, {h.d_in} -> {h.d_out}, {h.optimizer} lr {h.lr:g}, "
                              f"seed {h.seed} ({h.backend})")
    ax.set_yscale("log")
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.yaxis,):  # plain numbers (0.3, 2) instead of 3x10^-1 on a log axis
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("step")
    ax.set_ylabel("MSE loss")
    ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
