"""Draw the course's static diagrams into notebooks/figures/*.svg (matplotlib; the lectures embed them).

    python scripts/diagrams.py            # rewrites every diagram
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "notebooks" / "figures"
plt.rcParams.update({"svg.hashsalt": "fp8lab", "svg.fonttype": "none", "font.size": 9})  # reproducible ids; text stays text


def _save(fig, name: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / f"{name}.svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    print("wrote", OUT / f"{name}.svg")


def _box(ax, x, y, w, h, text="", color="white", fontsize=8, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="k", lw=0.8, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, a, b, text="", **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, lw=1, color="k", **kw))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.15, text, ha="center", fontsize=7)


def fp8_bit_layouts():
    """Sign, exponent and mantissa fields of E4M3, E5M2, E8M0 and BF16 (OCP OFP8 / MX specifications)."""
    formats = [("E4M3", [("S", 1), ("exponent", 4), ("mantissa", 3)], "bias 7, max 448, no Inf, NaN = S.1111.111"),
               ("E5M2", [("S", 1), ("exponent", 5), ("mantissa", 2)], "bias 15, max 57344, Inf and NaN as IEEE"),
               ("E8M0", [("exponent", 8)], "scale 2^(e - 127), no sign, 0xFF = NaN (MX)"),
               ("BF16", [("S", 1), ("exponent", 8), ("mantissa", 7)], "float32's range, 8 significant bits")]
    colors = {"S": "#f4cccc", "exponent": "#cfe2f3", "mantissa": "#d9ead3"}
    fig, ax = plt.subplots(figsize=(8, 2.6))
    for row, (name, fields, note) in enumerate(formats):
        y = (len(formats) - 1 - row) * 1.0
        ax.text(-0.4, y + 0.35, name, ha="right", va="center", fontsize=10, weight="bold")
        x = 0
        for field, bits in fields:
            for b in range(bits):
                _box(ax, x + b, y, 1, 0.7, color=colors[field])
            ax.text(x + bits / 2, y + 0.35, field if bits > 1 else field, ha="center", va="center", fontsize=7)
            x += bits
        ax.text(16.5, y + 0.35, note, va="center", fontsize=8)
    ax.set_xlim(-2, 30)
    ax.set_ylim(-0.2, len(formats))
    ax.axis("off")
    ax.set_title("Bit layouts (one box = one bit, most significant first)")
    _save(fig, "fp8_bit_layouts")


def scale_groups():
    """Which elements share one scale: per tensor, per row, 1x128 tile, 128x128 block, MX 1x32."""
    kinds = [("per tensor", None), ("per row", (1, 512)), ("1x128 tile\n(activations)", (1, 128)),
             ("128x128 block\n(weights)", (128, 128)), ("MX 1x32\n(E8M0 scales)", (1, 32))]
    fig, axes = plt.subplots(1, len(kinds), figsize=(12, 2.8))
    rows, cols = 256, 512
    for ax, (name, group) in zip(axes, kinds):
        ax.add_patch(Rectangle((0, 0), cols, rows, facecolor="#eeeeee", edgecolor="k", lw=0.8))
        if group is None:
            ax.add_patch(Rectangle((0, 0), cols, rows, facecolor="#cfe2f3", edgecolor="k", lw=0.8))
        else:
            gh, gw = group
            for i, y in enumerate(range(0, rows, max(gh, 16))):
                for j, x in enumerate(range(0, cols, gw)):
                    h = gh if gh > 1 else 12
                    if (i + j) % 2 == 0:
                        ax.add_patch(Rectangle((x, rows - y - h), gw, h, facecolor="#cfe2f3", edgecolor="#6fa8dc",
                                               lw=0.4))
        ax.set_xlim(-10, cols + 10)
        ax.set_ylim(-10, rows + 10)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(name, fontsize=9)
    fig.suptitle("One scale per shaded group (a 256 x 512 matrix; rows drawn 12 units tall where a group is one row)",
                 fontsize=9)
    _save(fig, "scale_groups")


def thread_hierarchy():
    """Grid -> blocks -> warps -> threads, and the memory each level sees."""
    fig, ax = plt.subplots(figsize=(10, 4))
    _box(ax, 0, 0, 6.2, 4, "", color="#fff2cc")
    ax.text(0.1, 3.75, "grid (one kernel launch)", fontsize=9, weight="bold")
    for b in range(2):
        bx = 0.3 + b * 3
        _box(ax, bx, 0.3, 2.7, 3.2, "", color="#d9ead3")
        ax.text(bx + 0.1, 3.25, f"block {b} (on one SM)", fontsize=8)
        for w in range(2):
            wy = 1.9 - w * 1.4
            _box(ax, bx + 0.2, wy, 2.3, 1.1, "", color="#cfe2f3")
            ax.text(bx + 0.3, wy + 0.85, f"warp {w}: 32 threads", fontsize=7)
            for t in range(8):
                _box(ax, bx + 0.3 + t * 0.27, wy + 0.15, 0.22, 0.5, "", color="white")
            ax.text(bx + 2.45, wy + 0.4, "...", fontsize=8)
    mem = [("registers\nper thread", "#ffffff"), ("shared memory\nper block, on chip, up to 228 KiB per SM", "#cfe2f3"),
           ("L2 cache\nall SMs, 50 MB (H100)", "#d9ead3"),
           ("global memory (HBM)\nall SMs, 3.35 TB/s (H100), 4.8 TB/s (H200)", "#fff2cc")]
    for k, (text, color) in enumerate(mem):
        _box(ax, 6.8, 3.1 - k * 0.95, 4.2, 0.75, text, color=color, fontsize=7)
    ax.text(8.9, 3.95, "memory spaces, fastest first", ha="center", fontsize=8, weight="bold")
    ax.text(3.1, -0.25, "a warp's 32 threads issue each instruction together; "
            "cuda.syncthreads() waits for the whole block",
            ha="center", fontsize=7)
    ax.set_xlim(-0.1, 11.2)
    ax.set_ylim(-0.3, 4.2)
    ax.axis("off")
    _save(fig, "thread_hierarchy")


def gemm_tiling():
    """Block tiling and register blocking of C = A @ B (lecture 05's v5-v7)."""
    fig, ax = plt.subplots(figsize=(9, 4.2))
    _box(ax, 0, 0, 3, 3, "", color="#eeeeee")
    ax.text(1.5, -0.3, "A (M x K)", ha="center")
    _box(ax, 0, 1.8, 3, 0.6, "", color="#cfe2f3")
    ax.text(-0.2, 2.1, "BM rows of A,\nBK at a time", ha="right", va="center", fontsize=7)
    _box(ax, 3.6, 3.6, 3, 3, "", color="#eeeeee")
    ax.text(5.1, 6.75, "B (K x N)", ha="center")
    _box(ax, 4.8, 3.6, 0.6, 3, "", color="#d9ead3")
    ax.text(5.1, 5.1, "BN\ncols", ha="center", va="center", fontsize=7)
    _box(ax, 3.6, 0, 3, 3, "", color="#eeeeee")
    ax.text(5.1, -0.3, "C (M x N)", ha="center")
    _box(ax, 4.8, 1.8, 0.6, 0.6, "", color="#f4cccc")
    _arrow(ax, (5.4, 2.1), (7.3, 2.5))
    # zoom: the block tile with thread sub-tiles
    for i in range(4):
        for j in range(4):
            _box(ax, 7.4 + j * 0.4, 1.0 + i * 0.4, 0.4, 0.4, "", color="#f4cccc" if (i, j) != (1, 2) else "#e06666")
    ax.text(8.2, 0.7, "block tile BM x BN: one thread\nblock; each thread owns TM x TN\n"
                      "outputs in registers (dark)", ha="center", va="top", fontsize=7)
    ax.text(8.6, 3.9, "per k: TM values of A and TN of B,\nread from shared memory into registers,\nfeed TM x TN FMAs",
            ha="center", fontsize=7)
    ax.set_xlim(-1.6, 9.6)
    ax.set_ylim(-0.8, 7.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("Tiling: shared-memory tiles per block, register blocks per thread")
    _save(fig, "gemm_tiling")


def bank_conflicts():
    """32 banks of 4 bytes; a warp reading a column of a 32 x 32 float tile: 32-way conflict, padded: none."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    for ax, pad, title in ((axes[0], 0, "tile[32][32]: column j lives in bank j for every row\n"
                                        "a warp reading column 0: 32 threads, one bank, 32-way conflict"),
                           (axes[1], 1, "tile[32][33] (one float of padding per row)\n"
                                        "row r of column 0 is in bank r: all 32 banks, no conflict")):
        for r in range(8):
            for c in range(12):
                bank = (r * (32 + pad) + c) % 32
                hit = c == 0
                _box(ax, c, 7 - r, 1, 1, str(bank), color="#e06666" if hit else "#ffffff", fontsize=6)
        ax.text(6, -0.6, "cells: bank number of each float (first 8 rows, 12 columns); red: what the warp reads",
                ha="center", fontsize=7)
        ax.set_xlim(-0.2, 12.2)
        ax.set_ylim(-1.0, 8.2)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=8)
    _save(fig, "bank_conflicts")


def promotion_pipeline():
    """DeepSeek-V3's promotion: the tensor core sums one K-group of 128, the CUDA cores scale and add it in FP32."""
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for g in range(4):
        x = g * 2.4
        for kk in range(4):
            _box(ax, x + kk * 0.5, 2.2, 0.5, 0.5, f"k{32 * kk}", color="#cfe2f3", fontsize=6)
        ax.text(x + 1.0, 2.85, f"K-group {g} (128 of K)", ha="center", fontsize=7)
        _box(ax, x, 1.2, 2.0, 0.6, "tensor core: partial sum\n(13-bit accumulator)", color="#fff2cc", fontsize=6)
        _arrow(ax, (x + 1.0, 2.2), (x + 1.0, 1.8))
        _box(ax, x, 0.1, 2.0, 0.6, "CUDA cores: acc += partial\n x sa[m, g] x sb[n, g] (FP32)", color="#d9ead3",
             fontsize=6)
        _arrow(ax, (x + 1.0, 1.2), (x + 1.0, 0.7))
        if g < 3:
            _arrow(ax, (x + 2.0, 0.4), (x + 2.4, 0.4))
    ax.text(9.7, 0.4, "y[m, n]", va="center", fontsize=8)
    ax.text(5.0, -0.25, "each K-group: 4 wgmma of k = 32; sa, sb: that group's scales of row m and column n",
            ha="center", fontsize=7)
    ax.set_xlim(-0.2, 10.4)
    ax.set_ylim(-0.5, 3.1)
    ax.axis("off")
    ax.set_title("Promotion every N_C = 128 (DeepSeek-V3, section 3.3.2): the limited accumulator never sums more "
                 "than one K-group", fontsize=9)
    _save(fig, "promotion_pipeline")


if __name__ == "__main__":
    for draw in (fp8_bit_layouts, scale_groups, thread_hierarchy, gemm_tiling, bank_conflicts, promotion_pipeline):
        draw()
