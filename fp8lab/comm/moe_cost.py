"""What the MoE all-to-all costs at DeepSeek-V3's size: bytes per token over InfiniBand and NVLink for the dispatch
(FP8 or BF16) and the combine (BF16), the time they take per batch (`comm_cost`, its docstring states the model and
its sources in arXiv 2412.19437), and a plot against the batch size (`plot_comm_cost`).
"""

from __future__ import annotations

import dataclasses

from .. import _validate as V
from .moe_reference import TILE


@dataclasses.dataclass(frozen=True)
class CommCost:
    """Bytes per token and seconds per batch of `comm_cost` (its docstring states the model). *_row_bytes: one
    token row; ib_rows / nvlink_rows: rows per token on each link; *_ib_bytes / *_nvlink_bytes: bytes per token;
    *_s: seconds for the batch; dispatch_s = max(IB, NVLink) (the two overlap), total_s = dispatch_s + combine_s;
    fp8_dispatch_saving: 1 - FP8 row / BF16 row; fp8_total_saving: 1 - total_s with FP8 dispatch / with BF16
    dispatch (same combine)."""

    tokens: int
    dispatch: str
    combine: str
    dispatch_row_bytes: int
    combine_row_bytes: int
    ib_rows: int
    nvlink_rows: int
    dispatch_ib_bytes: int
    dispatch_nvlink_bytes: int
    combine_ib_bytes: int
    combine_nvlink_bytes: int
    dispatch_ib_s: float
    dispatch_nvlink_s: float
    combine_ib_s: float
    combine_nvlink_s: float
    dispatch_s: float
    combine_s: float
    total_s: float
    fp8_dispatch_saving: float
    fp8_total_saving: float

    def rows(self) -> list[list[str]]:
        """[phase, link, bytes per token, time] rows for a printed table."""
        us = lambda s: f"{s * 1e6:,.1f} us"  # noqa: E731
        return [
            [f"dispatch ({self.dispatch})", "IB", f"{self.dispatch_ib_bytes:,}", us(self.dispatch_ib_s)],
            [f"dispatch ({self.dispatch})", "NVLink", f"{self.dispatch_nvlink_bytes:,}", us(self.dispatch_nvlink_s)],
            [f"combine ({self.combine})", "IB", f"{self.combine_ib_bytes:,}", us(self.combine_ib_s)],
            [f"combine ({self.combine})", "NVLink", f"{self.combine_nvlink_bytes:,}", us(self.combine_nvlink_s)],
            ["dispatch + combine", "max(IB, NVLink) each", "-", us(self.total_s)],
        ]


_ROW_BYTES = {"fp8": lambda h: h + 4 * -(-h // TILE), "bf16": lambda h: 2 * h, "fp32": lambda h: 4 * h}


def comm_cost(tokens: int, hidden: int = 7168, top_k: int = 8, max_nodes: int = 4, gpus_per_node: int = 8,
              nvlink_gbs: float = 160, ib_gbs: float = 50, dispatch: str = "fp8", combine: str = "bf16") -> CommCost:
    """Bytes per token over InfiniBand (IB) and NVLink for the MoE dispatch and combine of one GPU's batch of
    `tokens` tokens, and the time they take. Assumptions, each with its source (arXiv 2412.19437):

    - hidden 7168, 8 routed experts per token, at most 4 nodes per token, 8 GPUs per node: DeepSeek-V3's
      configuration (sections 4.2 and 2.1.2, node-limited routing), its cluster (section 3.1).
    - NVLink 160 GB/s and IB 50 GB/s per GPU (section 3.2.2); GB = 1e9 bytes.
    - Dispatch (section 3.2.2): a token crosses IB once per destination node (the GPU with the same in-node index),
      then NVLink to the GPUs of its experts there. Upper bound used here: every selected node is remote, so
      ib_rows = min(top_k, max_nodes); every expert GPU differs from the receiving one and no two experts share a
      GPU, so nvlink_rows = min(top_k, max_nodes * gpus_per_node).
    - Combine (section 3.2.2): the reverse path: NVLink from each expert GPU to the forwarding GPU, which accumulates,
      then IB once per node: the same row counts.
    - Row payload (section 3.3, low-precision communication): FP8 dispatch = hidden bytes of E4M3 codes +
      ceil(hidden/128) float32 1x128 tile scales (7168 + 224 = 7392 bytes); BF16 = 2 * hidden (14336); combine in
      BF16. Routing metadata (expert ids, gates: tens of bytes) and latencies are left out.
    - IB and NVLink transfers overlap (the dispatch kernels pipeline them, section 3.2.2), so a phase takes the
      longer of the two; dispatch and combine do not overlap each other here (DualPipe hides both behind compute,
      section 3.2.1; this counts what it has to hide).
    """
    tokens = V.positive_int("tokens", tokens)
    hidden = V.positive_int("hidden", hidden)
    top_k = V.positive_int("top_k", top_k)
    max_nodes = V.positive_int("max_nodes", max_nodes)
    gpus_per_node = V.positive_int("gpus_per_node", gpus_per_node)
    nvlink = V.positive_float("nvlink_gbs", nvlink_gbs) * 1e9
    ib = V.positive_float("ib_gbs", ib_gbs) * 1e9
    V.choice("dispatch", dispatch, ("fp8", "bf16"))
    V.choice("combine", combine, ("bf16", "fp32"))
    ib_rows = min(top_k, max_nodes)
    nv_rows = min(top_k, max_nodes * gpus_per_node)

    def phase(row_bytes):
        ib_s, nv_s = tokens * ib_rows * row_bytes / ib, tokens * nv_rows * row_bytes / nvlink
        return ib_rows * row_bytes, nv_rows * row_bytes, ib_s, nv_s, max(ib_s, nv_s)

    d_row, c_row = _ROW_BYTES[dispatch](hidden), _ROW_BYTES[combine](hidden)
    d, c = phase(d_row), phase(c_row)
    fp8_total = phase(_ROW_BYTES["fp8"](hidden))[4] + c[4]
    bf16_total = phase(_ROW_BYTES["bf16"](hidden))[4] + c[4]
    return CommCost(tokens, dispatch, combine, d_row, c_row, ib_rows, nv_rows, d[0], d[1], c[0], c[1], d[2], d[3],
                    c[2], c[3], d[4], c[4], d[4] + c[4],
                    fp8_dispatch_saving=1 - _ROW_BYTES["fp8"](hidden) / _ROW_BYTES["bf16"](hidden),
                    fp8_total_saving=1 - fp8_total / bf16_total)


def plot_comm_cost(tokens=None, ax=None, path=None, title=None, **kwargs):
    """Time of dispatch + combine per batch against tokens per GPU (log-log): IB and NVLink, FP8 and BF16 dispatch
    (combine in BF16), from `comm_cost` (kwargs go to it: hidden, top_k, max_nodes, ...); returns the figure.
    tokens: the batch sizes (default 256 ... 32768); path: also save the figure there (PNG)."""
    import matplotlib.pyplot as plt

    tokens = [2 ** i for i in range(8, 16)] if tokens is None else [V.positive_int("tokens", t) for t in tokens]
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    else:
        fig = ax.figure
    for disp, style in (("fp8", "-"), ("bf16", "--")):
        costs = [comm_cost(t, dispatch=disp, **kwargs) for t in tokens]
        for link, color in (("ib", "tab:red"), ("nvlink", "tab:blue")):
            ms = [1e3 * (getattr(c, f"dispatch_{link}_s") + getattr(c, f"combine_{link}_s")) for c in costs]
            ax.plot(tokens, ms, style, color=color, marker="o", ms=3,
                    label=f"{'IB' if link == 'ib' else 'NVLink'}, {disp.upper()} dispatch + BF16 combine")
    c = comm_cost(tokens[0], **kwargs)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per GPU")
    ax.set_ylabel("time on the link (ms)")
    ax.set_title(title or f"MoE all-to-all per GPU: {c.ib_rows} IB rows, {c.nvlink_rows} NVLink rows per token "
                          f"(DeepSeek-V3, arXiv 2412.19437 section 3.2.2)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
