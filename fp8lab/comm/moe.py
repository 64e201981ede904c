"""MoE token dispatch in FP8 and combine in BF16, as an all-to-all among processes, and what that communication
costs at DeepSeek-V3's size (arXiv 2412.19437: routing 2.1.2, all-to-all 3.2.2, FP8 dispatch 3.3).

- `route`: expert ids and gate weights per token from router logits (sigmoid + normalisation over the selected,
  as DeepSeek-V3; or softmax, as DeepSeek-V2), optionally node-limited;
- `send_plan`: which token rows the dispatch sends to which rank (`try_send_plan` checks your own against it);
- `reference_moe`, `reference_dispatch`: the MoE layer's output and what every rank receives, in NumPy, without
  communication;
- `dispatch`, `run_experts`, `combine`: the same through `torch.distributed.all_to_all_single`, one code path for
  any world size (1 included): tokens travel as FP8 E4M3 codes with 1x128 tile scales, expert outputs come back
  in BF16 and are weighted and summed on the token's own rank;
- `run_alltoall`: spawns the ranks on 127.0.0.1 (NCCL on GPUs, else gloo) and checks them against the reference;
- `comm_cost`, `plot_comm_cost`: bytes and time per token over InfiniBand and NVLink at DeepSeek-V3's size.

This module gathers the public names of three: `moe_reference` (routing, FP8 token quantization, the NumPy
reference, the lecture's experts and the error bound), `moe_alltoall` (the collectives and the launcher) and
`moe_cost` (the cost model). Experts are spread evenly and contiguously: expert e lives on rank
e // (experts // world_size). Quantization is fp8lab's NumPy spec (`spec.quantize(x, "tile")`: bit for bit what
`fl.quantize(x, "e4m3", "tile")`'s kernel writes), so the ranks need neither numba nor the simulator. PyTorch is
optional: only `dispatch`, `combine` and `run_alltoall` import it, when called.
"""

from __future__ import annotations

from .moe_alltoall import (BACKENDS, AllToAllResult, DispatchHandle, alltoall_inputs, combine, dispatch, free_port,
                           run_alltoall, run_experts)
from .moe_cost import CommCost, comm_cost, plot_comm_cost
from .moe_reference import (FMT, SCORES, TILE, LinearExperts, Received, dequantize_tokens, expert_rank,
                            fp8_error_bound, quantize_tokens, reference_dispatch, reference_moe, route, send_plan,
                            try_send_plan)

__all__ = [
    "SCORES", "BACKENDS", "route", "expert_rank", "send_plan", "try_send_plan", "quantize_tokens", "dequantize_tokens", "LinearExperts",
    "reference_moe", "reference_dispatch", "fp8_error_bound", "Received", "DispatchHandle", "dispatch",
    "run_experts", "combine", "free_port", "alltoall_inputs", "AllToAllResult", "run_alltoall", "CommCost",
    "comm_cost", "plot_comm_cost",
]
