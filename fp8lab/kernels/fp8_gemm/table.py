"""fp8_gemm's versions, one row each (kernels/versions.py): what each does, what launches it, what the GPU must have,
its traits and its simulator cost. The launcher, the device checks and `best_version` read this table."""

from __future__ import annotations

from ...device import ptx, runtime
from ..versions import Version, best, with_trait
from . import simt, tensor_cores


def _cost(a, b, c, tm, tn, tk):  # seconds under the simulator, dims rounded up to the tile (docs/notes/simulator.md)
    return runtime.SimCost(a, b, c, tile=(tm, tn, tk), names="M x N x K = ")


VERSIONS = {
    1: Version("one thread per output, K-groups of 128 from global memory", simt.launch_v12,
               traits={"limited_accumulation"}, sim_cost=_cost(0.2, 3.7e-6, 0, 8, 8, 1),
               sim_costs={"accum_bits": _cost(0.6, 1.7e-5, 0, 8, 8, 32)}),
    2: Version("TILE x TILE shared-memory tiles, BLOCK_K = 128 steps, scales per tile in shared memory",
               simt.launch_v12, traits={"limited_accumulation", "residual"},
               sim_cost=_cost(0.2, 1.2e-6, 1.0e-3, 8, 8, 128),
               sim_costs={"accum_bits": _cost(1.1, 1.3e-5, 0, 8, 8, 128)}),
    3: Version("SGEMM v7's 128 x 128 register-blocked core; codes dequantized per K-group while staged in shared "
               "memory", simt.launch_v3, traits={"residual"}, sim_cost=_cost(0.2, 2.0e-6, 0, 128, 128, 8)),
    4: Version("tensor cores, mma.sync m16n8k32: 3-buffer cp.async ring, ldmatrix fragments, promotion every 128",
               tensor_cores.launch_mma, needs=ptx.MMA_FP8, traits={"tensor_cores", "residual"},
               sim_cost=_cost(0.2, 1.2e-6, 0, 128, 128, 128)),
    5: Version("tensor cores, wgmma m64n128k32: 4-stage cp.async pipeline, swizzled tiles, descriptors, promotion "
               "every 128", tensor_cores.launch_mma, needs=ptx.WGMMA, traits={"tensor_cores", "residual"},
               sim_cost=_cost(0.2, 3.3e-7, 0, 128, 128, 128)),
    6: Version("version 5 overlapped: group k+1's wgmma issued before group k is promoted, one barrier per K-group",
               tensor_cores.launch_overlapped, needs=ptx.WGMMA, traits={"tensor_cores", "streams", "residual"},
               sim_cost=_cost(0.2, 3.3e-7, 0, 128, 128, 128)),
    7: Version("version 6 persistent: `sms` blocks (one per SM) loop over the output tiles, the other SMs left free",
               tensor_cores.launch_overlapped, needs=ptx.WGMMA,
               traits={"tensor_cores", "streams", "persistent", "residual"},
               sim_cost=_cost(0.2, 3.3e-7, 0, 128, 128, 128)),
}
BEST = 6
"""The default without accum_bits: wgmma overlapped, the fastest (BENCHMARKS.md). Inside each K-group of 128 its sums
are the tensor core's (13 mantissa bits, truncated), across groups FP32: DeepSeek-V3's promotion."""

# Derived from the table, for readers
LIMITED_VERSIONS = with_trait(VERSIONS, "limited_accumulation")
"""Versions that emulate the limited accumulator (accum_bits); with accum_bits the default is the last of them."""
TENSOR_CORE_VERSIONS = with_trait(VERSIONS, "tensor_cores")
"""Versions whose K-group partial sums come from the tensor cores: FP32 sums in k order under the simulator (the
twins), the hardware's own accumulator on a GPU (see `tensor_core_bound`)."""
PERSISTENT_VERSIONS = with_trait(VERSIONS, "persistent")
"""Versions that take `sms`."""
RESIDUAL_VERSIONS = with_trait(VERSIONS, "residual")
"""Versions whose epilogue adds a residual (`residual=`): all but version 1, lecture 06's editable kernel."""


def best_version() -> int:
    """BEST where the device can run it (6 on sm_90: wgmma), else the highest-numbered version it runs (4 from sm_89:
    FP8 mma.sync, else 3); BEST under the simulator."""
    return best(VERSIONS, BEST)
