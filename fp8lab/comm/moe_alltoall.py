"""The MoE layer's communication through `torch.distributed.all_to_all_single`, one code path for any world size (1
included): `dispatch` sends each token in FP8 (E4M3 codes, 1x128 tile scales) to the ranks of its experts,
`run_experts` runs this rank's experts on what it received, `combine` brings the expert outputs back in BF16 and
sums them, weighted, on the token's own rank; `run_alltoall` spawns the ranks on 127.0.0.1 (NCCL on GPUs, else gloo)
and checks them against `fp8lab.comm.moe_reference` (DeepSeek-V3, arXiv 2412.19437, sections 3.2.2 and 3.3).

Quantization is fp8lab's NumPy spec (`spec.quantize(x, "tile")`: bit for bit what `fl.quantize(x, "e4m3", "tile")`'s
kernel writes), so the ranks need neither numba nor the simulator. PyTorch is optional: only `dispatch`, `combine`
and `run_alltoall` import it, when called.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import time

import numpy as np

from .. import _validate as V
from ..numerics import spec
from .moe_reference import (LinearExperts, Received, apply_expert, check_expert_ids, check_gates, check_placement,
                            check_seed, check_tokens, dequantize_tokens, fp8_error_bound, quantize_tokens,
                            reference_moe, route, send_plan, weighted_sum)

BACKENDS = ("gloo", "nccl")
# Fill values of receive buffers: a row the all-to-all failed to write shows up as NaN or an invalid expert id.
_POISON_META = -2


# ----------------------------------------------------------------------------------------------------------------
# The collectives: dispatch, run_experts, combine
# ----------------------------------------------------------------------------------------------------------------


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError("fp8lab.comm.moe's all-to-all needs PyTorch (optional in fp8lab): in the repository, "
                          ".venv/bin/pip install -e '.[torch]' (the CPU build is enough for gloo) "
                          f"[{e}]") from None
    if not dist.is_available():
        raise ImportError("fp8lab.comm.moe's all-to-all needs torch.distributed, which this PyTorch build lacks")
    return torch, dist


@dataclasses.dataclass
class DispatchHandle:
    """What `combine` needs from `dispatch` on the same rank, plus what was measured.

    pair_token, pair_slot: int64 (P,): the (token, slot) of each expert output this rank gets back, in arrival
    order (destination rank, then token, then slot); pairs_from: int64 (world_size,) how many come from each rank;
    pairs_to: int64 (world_size,) how many expert outputs this rank returns to each source (its received rows'
    slots on this rank); rows_to: int64 (world_size,) token rows this rank sent to each rank.
    bytes_sent: {"dispatch": ..., "combine": ...} bytes this rank sent to OTHER ranks (payload and per-row metadata;
    the count exchange not included); seconds: {"quantize", "dispatch_comm", "combine_comm"}.
    """

    world_size: int
    rank: int
    tokens: int
    hidden: int
    top_k: int
    experts: int
    pair_token: np.ndarray
    pair_slot: np.ndarray
    pairs_from: np.ndarray
    pairs_to: np.ndarray
    rows_to: np.ndarray
    group: object = None
    device: object = None
    bytes_sent: dict = dataclasses.field(default_factory=dict)
    seconds: dict = dataclasses.field(default_factory=dict)


def _group_info(dist, group):
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call torch.distributed.init_process_group first "
                           "(fp8lab.comm.moe.run_alltoall does it for every rank it spawns)")
    return dist.get_world_size(group), dist.get_rank(group)


def _device(torch, dist, group, device):
    if device is not None:
        return torch.device(device)
    if dist.get_backend(group) == "nccl":  # NCCL moves device memory only
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _all_to_all(torch, dist, group, device, send, send_counts, recv_counts, fill):
    """One all_to_all_single of rows (dim 0), uneven splits; the receive buffer is filled with `fill` first, so a
    row the collective did not write is visible (NaN, 0x7F, -2)."""
    if isinstance(send, np.ndarray):
        send = torch.from_numpy(np.ascontiguousarray(send))
    send = send.to(device)
    out = torch.full((int(np.sum(recv_counts)), *send.shape[1:]), fill, dtype=send.dtype, device=device)
    dist.all_to_all_single(out, send, output_split_sizes=[int(c) for c in recv_counts],
                           input_split_sizes=[int(c) for c in send_counts], group=group)
    return out


def dispatch(x, expert_ids, experts: int, *, group=None, device=None) -> tuple[Received, DispatchHandle]:
    """Send this rank's tokens to the ranks of their experts, in FP8: (what this rank received, a handle for
    `combine`). Every rank of the group calls it (a collective).

    x: float (T, H) this rank's tokens, finite (H need not be a multiple of 128: the last tile is shorter);
    expert_ids: int (T, top_k) distinct ids in [0, experts), e.g. from `route`. Each token is quantized to E4M3
    codes with 1x128 tile scales (`quantize_tokens`) and sent ONCE to every rank that holds at least one of its
    experts, with its row index and the ids of its experts there (int32 metadata). Counts are exchanged first,
    then three all_to_all_single calls move codes (uint8), scales (float32) and metadata (int32).
    group: a torch.distributed process group (None: the default one). device: where the buffers live (None:
    the current CUDA device with NCCL, else the CPU).
    """
    torch, dist = _torch()
    world_size, rank = _group_info(dist, group)
    experts, world_size = check_placement(experts, world_size)
    x = check_tokens("x", x)
    T, H = x.shape
    ids = check_expert_ids("expert_ids", expert_ids, T, experts)
    k = ids.shape[1]
    dev = _device(torch, dist, group, device)

    t0 = time.perf_counter()
    codes, scales = quantize_tokens(x)
    plan = send_plan(ids, experts, world_size)  # each token once to every rank that holds one of its experts
    rows = np.concatenate([r for r, _ in plan])
    local_ids = np.concatenate([ids_r for _, ids_r in plan])
    send_counts = np.array([len(r) for r, _ in plan], np.int64)
    to_rank = np.repeat(np.arange(world_size), send_counts)
    meta = np.concatenate([rows[:, None], local_ids], axis=1).astype(np.int32)
    send_codes, send_scales = codes[rows], scales[rows]
    t1 = time.perf_counter()

    counts = torch.from_numpy(send_counts).to(dev)
    recv_counts_t = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts_t, counts, group=group)
    recv_counts = recv_counts_t.cpu().numpy()
    got_codes = _all_to_all(torch, dist, group, dev, send_codes, send_counts, recv_counts, spec.POISON_CODE)
    got_scales = _all_to_all(torch, dist, group, dev, send_scales, send_counts, recv_counts, float("nan"))
    got_meta = _all_to_all(torch, dist, group, dev, meta, send_counts, recv_counts, _POISON_META)
    _sync(torch, dev)
    t2 = time.perf_counter()

    got_meta = got_meta.cpu().numpy()
    received = Received(got_codes.cpu().numpy(), got_scales.cpu().numpy(), got_meta[:, 1:].copy(),
                        np.repeat(np.arange(world_size), recv_counts).astype(np.int64), got_meta[:, 0].astype(np.int64))
    row_i, slot = np.nonzero(local_ids >= 0)  # the expert outputs coming back: (dest rank, token, slot) order
    row_bytes = H + 4 * scales.shape[1] + 4 * (k + 1)
    others = np.arange(world_size) != rank
    handle = DispatchHandle(
        world_size, rank, T, H, k, experts, pair_token=rows[row_i], pair_slot=slot,
        pairs_from=np.bincount(to_rank[row_i], minlength=world_size).astype(np.int64),
        pairs_to=np.bincount(received.source[np.nonzero(received.expert_ids >= 0)[0]],
                             minlength=world_size).astype(np.int64),
        rows_to=send_counts, group=group, device=dev,
        bytes_sent={"dispatch": int(send_counts[others].sum()) * row_bytes},
        seconds={"quantize": t1 - t0, "dispatch_comm": t2 - t1})
    return received, handle


def run_experts(received: Received, expert_fn) -> np.ndarray:
    """float32 (P, H): the expert outputs of every (row, slot) of `received` whose expert id is not -1, in row-major
    (row, slot) order, which is the order `combine` sends them back in. The rows are dequantized first; each local
    expert is called once, on its rows in arrival order (source rank, then token)."""
    if not isinstance(received, Received):
        raise TypeError(f"received must be a Received (from dispatch), got {V.describe(received)}")
    if not callable(expert_fn):
        raise TypeError(f"expert_fn must be callable as expert_fn(e, rows), got {V.describe(expert_fn)}")
    ids = received.expert_ids
    x = dequantize_tokens(received.codes, received.scales)
    row, slot = np.nonzero(ids >= 0)
    index = np.full(ids.shape, -1, np.int64)
    index[row, slot] = np.arange(len(row))
    y = np.full((len(row), x.shape[1]), np.nan, np.float32)
    for e in np.unique(ids[ids >= 0]):
        r, s = np.nonzero(ids == e)
        y[index[r, s]] = apply_expert(expert_fn, int(e), x[r])
    return y


def combine(y, handle: DispatchHandle, gates) -> np.ndarray:
    """Send the expert outputs y (P, H) float32 (from `run_experts`) back to their tokens' ranks in BF16 and return
    this rank's MoE output, float32 (T, H): sum_j gates[t, j] * float32(bf16 output of slot j), in slot order.
    A collective: every rank of the dispatch calls it. gates: float (T, top_k), this rank's gate weights (they never
    leave the rank). bfloat16 is nearest-even, as formats.round_bf16."""
    torch, dist = _torch()
    if not isinstance(handle, DispatchHandle):
        raise TypeError(f"handle must be a DispatchHandle (from dispatch), got {V.describe(handle)}")
    shape = (int(handle.pairs_to.sum()), handle.hidden)
    if not isinstance(y, np.ndarray) or y.dtype != np.float32:
        raise TypeError(f"y must be a float32 NumPy array (from run_experts), got {V.describe(y)}")
    if y.shape != shape:
        raise ValueError(f"y must have shape {shape} (one row per expert output this rank computed), got "
                         f"{V.describe(y)}")
    if not np.isfinite(y).all():
        raise ValueError(f"y must be finite, got {V.nonfinite_summary(y)} in {V.describe(y)}")
    g = check_gates("gates", gates, (handle.tokens, handle.top_k))
    dev = handle.device
    t0 = time.perf_counter()
    send = torch.from_numpy(np.ascontiguousarray(y)).to(dev).to(torch.bfloat16)
    back = _all_to_all(torch, dist, handle.group, dev, send, handle.pairs_to, handle.pairs_from, float("nan"))
    _sync(torch, dev)
    t1 = time.perf_counter()
    slots = np.full((handle.tokens, handle.top_k, handle.hidden), np.nan, np.float32)
    slots[handle.pair_token, handle.pair_slot] = back.float().cpu().numpy()
    others = np.arange(handle.world_size) != handle.rank
    handle.bytes_sent["combine"] = int(handle.pairs_to[others].sum()) * 2 * handle.hidden
    handle.seconds["combine_comm"] = t1 - t0
    return weighted_sum(g, slots)


# ----------------------------------------------------------------------------------------------------------------
# The launcher
# ----------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alltoall_inputs(rank: int, tokens: int, hidden: int, experts: int, top_k: int, seed: int = 0):
    """(x float32 (tokens, hidden), expert_ids, gates) of one rank in `run_alltoall`, drawn from (seed, rank):
    Gaussian rows times a per-token magnitude e^N(0,1) (so tiles get different scales); sigmoid routing of
    Gaussian logits."""
    rng = np.random.default_rng([check_seed("seed", seed), 1, rank])
    x = (rng.standard_normal((tokens, hidden)) * np.exp(rng.standard_normal((tokens, 1)))).astype(np.float32)
    ids, gates = route(rng.standard_normal((tokens, experts)), top_k)
    return x, ids, gates


@dataclasses.dataclass
class AllToAllResult:
    """What `run_alltoall` measured. Errors: max_abs_diff_fp8 and mismatches against reference_moe run on the
    dequantized tokens with the BF16 rounding (0 and 0: bit-exact); max_abs_err against the float32 reference on
    the raw tokens, bound_ratio = max(|err| / fp8_error_bound) (<= 1). Bytes: sent to other ranks, all ranks
    together; dispatch_bytes_bf16: the same rows sent in BF16 instead. Seconds: the slowest rank's; dispatch_s and
    combine_s are whole calls (quantize, pack, unpack included), *_comm_s the collectives alone."""

    world_size: int
    backend: str
    tokens: int
    hidden: int
    experts: int
    top_k: int
    seed: int
    max_abs_diff_fp8: float
    mismatches: int
    max_abs_err: float
    bound_ratio: float
    max_abs_out: float
    dispatch_bytes: int
    dispatch_bytes_bf16: int
    combine_bytes: int
    dispatch_s: float
    dispatch_comm_s: float
    experts_s: float
    combine_s: float
    combine_comm_s: float

    def rows(self) -> list[list[str]]:
        """[what, value] rows for a printed table."""
        ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
        return [
            ["ranks, backend", f"{self.world_size}, {self.backend}"],
            ["tokens per rank x hidden", f"{self.tokens} x {self.hidden}"],
            ["experts, top_k", f"{self.experts}, {self.top_k}"],
            ["vs reference on FP8-dequantized tokens", f"max |diff| {self.max_abs_diff_fp8:.3g}, "
                                                       f"{self.mismatches} element(s) differ"],
            ["vs float32 reference", f"max |err| {self.max_abs_err:.3g} (max |out| {self.max_abs_out:.3g}), "
                                     f"{self.bound_ratio:.3f} of the FP8+BF16 bound"],
            ["dispatch bytes to other ranks (FP8)", f"{self.dispatch_bytes:,}"],
            ["  the same rows in BF16", f"{self.dispatch_bytes_bf16:,}"],
            ["combine bytes to other ranks (BF16)", f"{self.combine_bytes:,}"],
            ["dispatch (all-to-all alone)", f"{ms(self.dispatch_s)} ({ms(self.dispatch_comm_s)})"],
            ["experts", ms(self.experts_s)],
            ["combine (all-to-all alone)", f"{ms(self.combine_s)} ({ms(self.combine_comm_s)})"],
        ]


def _rank_main(rank, world_size, port, backend, tokens, hidden, experts, top_k, seed, outdir):
    """One spawned rank: init, dispatch, experts, combine; writes its output and measurements to outdir."""
    torch, dist = _torch()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, **kw)
    try:
        x, ids, gates = alltoall_inputs(rank, tokens, hidden, experts, top_k, seed)
        fn = LinearExperts(experts, hidden, seed)
        per = experts // world_size
        for e in range(rank * per, (rank + 1) * per):  # draw the weights before the clock starts
            fn.weight(e)
        dist.barrier()  # connections are set up before anything is timed
        t0 = time.perf_counter()
        received, handle = dispatch(x, ids, experts)
        t1 = time.perf_counter()
        y = run_experts(received, fn)
        t2 = time.perf_counter()
        out = combine(y, handle, gates)
        t3 = time.perf_counter()
        rows_sent = int(handle.rows_to[np.arange(world_size) != rank].sum())
        np.savez(os.path.join(outdir, f"rank{rank}.npz"), out=out, dispatch_s=t1 - t0, experts_s=t2 - t1,
                 combine_s=t3 - t2, dispatch_comm_s=handle.seconds["dispatch_comm"],
                 combine_comm_s=handle.seconds["combine_comm"], dispatch_bytes=handle.bytes_sent["dispatch"],
                 dispatch_bytes_bf16=rows_sent * (2 * hidden + 4 * (top_k + 1)),
                 combine_bytes=handle.bytes_sent["combine"])
    finally:
        dist.destroy_process_group()


def run_alltoall(world_size: int, tokens: int, hidden: int, experts: int, top_k: int, backend: str | None = None,
                 seed: int = 0) -> AllToAllResult:
    """Spawn `world_size` processes (torch.multiprocessing, a free port on 127.0.0.1), each with its own `tokens`
    tokens (`alltoall_inputs`), run dispatch (FP8) -> LinearExperts -> combine (BF16), and check the result
    against the NumPy reference in this process. backend: "nccl" (one GPU per rank), "gloo" (CPU), or None: NCCL
    when at least 2 and at least world_size CUDA devices are present, else gloo. Quantization in the ranks is the
    NumPy spec (no numba). The parent keeps experts weights of hidden^2 floats each: keep hidden * experts small.
    The ranks are started with the "spawn" method, which re-imports a script's main module: in a script, call this
    under `if __name__ == "__main__":`.
    """
    world_size = V.positive_int("world_size", world_size)
    tokens = V.positive_int("tokens", tokens)
    hidden = V.positive_int("hidden", hidden)
    experts, world_size = check_placement(experts, world_size)
    top_k = V.positive_int("top_k", top_k)
    if top_k > experts:
        raise ValueError(f"top_k must be at most experts ({experts}), got {top_k}")
    seed = check_seed("seed", seed)
    if backend is not None:
        V.choice("backend", backend, BACKENDS)
    torch, _ = _torch()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        backend = "nccl" if gpus >= max(2, world_size) else "gloo"
    elif backend == "nccl" and gpus < world_size:
        raise ValueError(f"backend 'nccl' needs one CUDA device per rank (world_size {world_size}), got {gpus} "
                         "device(s)")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="fp8lab-alltoall-") as outdir:
        mp.spawn(_rank_main, args=(world_size, free_port(), backend, tokens, hidden, experts, top_k, seed, outdir),
                 nprocs=world_size, join=True)
        ranks = []
        for r in range(world_size):
            with np.load(os.path.join(outdir, f"rank{r}.npz")) as f:
                ranks.append({k: f[k] for k in f.files})

    parts = [alltoall_inputs(r, tokens, hidden, experts, top_k, seed) for r in range(world_size)]
    x, ids, gates = (np.concatenate([p[i] for p in parts]) for i in range(3))
    out = np.concatenate([d["out"] for d in ranks])
    fn = LinearExperts(experts, hidden, seed)
    ref_fp8 = reference_moe(dequantize_tokens(*quantize_tokens(x)), ids, gates, fn, world_size, experts=experts,
                            combine="bf16")
    ref32 = reference_moe(x, ids, gates, fn, world_size, experts=experts)
    bound = fp8_error_bound(x, ids, gates, fn)
    err = np.abs(out.astype(np.float64) - ref32)
    total = lambda key: int(sum(int(d[key]) for d in ranks))  # noqa: E731
    slowest = lambda key: float(max(float(d[key]) for d in ranks))  # noqa: E731
    return AllToAllResult(
        world_size, backend, tokens, hidden, experts, top_k, seed,
        max_abs_diff_fp8=float(np.max(np.abs(out.astype(np.float64) - ref_fp8))),
        mismatches=int(np.count_nonzero(out.view(np.uint32) != ref_fp8.view(np.uint32))),
        max_abs_err=float(err.max()), bound_ratio=float(np.max(err / bound)), max_abs_out=float(np.abs(out).max()),
        dispatch_bytes=total("dispatch_bytes"), dispatch_bytes_bf16=total("dispatch_bytes_bf16"),
        combine_bytes=total("combine_bytes"), dispatch_s=slowest("dispatch_s"),
        dispatch_comm_s=slowest("dispatch_comm_s"), experts_s=slowest("experts_s"), combine_s=slowest("combine_s"),
        combine_comm_s=slowest("combine_comm_s"))
