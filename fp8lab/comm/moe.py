"""MoE token dispatch in FP8 and combine in BF16, as an all-to-all among processes, and what that communication
costs at DeepSeek-V3's size (arXiv 2412.19437: routing 2.1.2, all-to-all 3.2.2, FP8 dispatch 3.3).

- `route`: expert ids and gate weights per token from router logits (sigmoid + normalisation over the selected,
  as DeepSeek-V3; or softmax, as DeepSeek-V2), optionally node-limited;
- `reference_moe`, `reference_dispatch`: the MoE layer's output and what every rank receives, in NumPy, without
  communication;
- `dispatch`, `run_experts`, `combine`: the same through `torch.distributed.all_to_all_single`, one code path for
  any world size (1 included): tokens travel as FP8 E4M3 codes with 1x128 tile scales, expert outputs come back
  in BF16 and are weighted and summed on the token's own rank;
- `run_alltoall`: spawns the ranks on 127.0.0.1 (NCCL on GPUs, else gloo) and checks them against the reference;
- `comm_cost`, `plot_comm_cost`: bytes and time per token over InfiniBand and NVLink at DeepSeek-V3's size.

Experts are spread evenly and contiguously: expert e lives on rank e // (experts // world_size). Quantization is
fp8lab's NumPy spec (`spec.quantize(x, "tile")`: bit for bit what `fl.quantize(x, "e4m3", "tile")`'s kernel
writes), so the ranks need neither numba nor the simulator. PyTorch is optional: only `dispatch`, `combine` and
`run_alltoall` import it, when called.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import time

import numpy as np

from .. import _validate as V
from ..numerics import formats, spec

__all__ = [
    "SCORES", "BACKENDS", "route", "expert_rank", "quantize_tokens", "dequantize_tokens", "LinearExperts",
    "reference_moe", "reference_dispatch", "fp8_error_bound", "Received", "DispatchHandle", "dispatch",
    "run_experts", "combine", "free_port", "alltoall_inputs", "AllToAllResult", "run_alltoall", "CommCost",
    "comm_cost", "plot_comm_cost",
]

SCORES = ("sigmoid", "softmax")
BACKENDS = ("gloo", "nccl")
FMT = "e4m3"
TILE = spec.GROUP_K  # 1 x 128 tiles along the hidden dimension (arXiv 2412.19437, section 3.3)
# Fill values of receive buffers: a row the all-to-all failed to write shows up as NaN or an invalid expert id.
_POISON_META = -2


# ----------------------------------------------------------------------------------------------------------------
# Routing and placement
# ----------------------------------------------------------------------------------------------------------------


def route(logits, top_k: int, *, score: str = "sigmoid", normalize: bool = True, bias=None, nodes: int | None = None,
          max_nodes: int | None = None):
    """Top-k routing: (expert_ids int64 (T, top_k), gates float32 (T, top_k)) from router logits (T, experts).

    score="sigmoid" (DeepSeek-V3, section 2.1.2): s = sigmoid(logit); the top_k experts by s + bias are selected
    and their gates are s / (sum of the selected s) (normalize=True). score="softmax" (DeepSeek-V2): s =
    softmax over all experts; DeepSeek-V2 uses the selected s as they are (normalize=False).
    bias: (experts,) added to s for the SELECTION only, never to the gates (DeepSeek-V3's auxiliary-loss-free load
    balancing, section 2.1.2). nodes, max_nodes: node-limited routing (section 2.1.2): the experts are split into
    `nodes` contiguous groups and each token picks its top_k experts within the `max_nodes` groups with the highest
    sum of their top_k // max_nodes selection scores (at least 1); DeepSeek-V3: 8 experts, 4 nodes.
    Columns are ordered by descending selection score; ties go to the lower expert id. Scores are computed in
    float64, gates rounded to float32 once.
    """
    logits = V.array("logits", logits, dtype=(np.float16, np.float32, np.float64), ndim=2, allow_device=False,
                     finite=True)
    T, E = logits.shape
    top_k = V.positive_int("top_k", top_k)
    if top_k > E:
        raise ValueError(f"top_k must be at most the number of experts ({E}, logits.shape[1]), got {top_k}")
    V.choice("score", score, SCORES)
    normalize = V.boolean("normalize", normalize)
    u = logits.astype(np.float64)
    if score == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-u))
    else:
        z = np.exp(u - u.max(axis=1, keepdims=True))
        s = z / z.sum(axis=1, keepdims=True)
    sel = s.copy()
    if bias is not None:
        bias = V.array("bias", bias, dtype=(np.float16, np.float32, np.float64), shape=(E,), allow_device=False,
                       finite=True)
        sel += bias.astype(np.float64)
    if (nodes is None) != (max_nodes is None):
        raise ValueError(f"nodes and max_nodes must be given together, got nodes={nodes!r}, max_nodes={max_nodes!r}")
    if nodes is not None:
        nodes = V.positive_int("nodes", nodes)
        max_nodes = V.positive_int("max_nodes", max_nodes)
        if E % nodes:
            raise ValueError(f"nodes must divide the number of experts ({E}, logits.shape[1]), got {nodes}")
        if max_nodes > nodes:
            raise ValueError(f"max_nodes must be at most nodes ({nodes}), got {max_nodes}")
        per_node = E // nodes
        if max_nodes * per_node < top_k:
            raise ValueError(f"max_nodes must leave at least top_k ({top_k}) experts to choose from: {max_nodes} "
                             f"node(s) x {per_node} experts per node = {max_nodes * per_node}")
        best = np.sort(sel.reshape(T, nodes, per_node), axis=2)[:, :, ::-1]
        node_score = best[:, :, : max(1, top_k // max_nodes)].sum(axis=2)
        keep = np.argsort(-node_score, axis=1, kind="stable")[:, :max_nodes]
        allowed = np.zeros((T, nodes), bool)
        np.put_along_axis(allowed, keep, True, axis=1)
        sel = np.where(np.repeat(allowed, per_node, axis=1), sel, -np.inf)
    ids = np.argsort(-sel, axis=1, kind="stable")[:, :top_k]
    g = np.take_along_axis(s, ids, axis=1)
    if normalize:
        g = g / g.sum(axis=1, keepdims=True)
    return ids.astype(np.int64), g.astype(np.float32)


def _placement(experts, world_size) -> tuple[int, int]:
    experts = V.positive_int("experts", experts)
    world_size = V.positive_int("world_size", world_size)
    if experts % world_size:
        raise ValueError(f"experts must be a multiple of world_size ({world_size}) so every rank holds as many "
                         f"experts, got {experts}")
    return experts, world_size


def expert_rank(expert_ids, experts: int, world_size: int) -> np.ndarray:
    """The rank that holds each expert: expert_ids // (experts // world_size) (contiguous, even placement)."""
    experts, world_size = _placement(experts, world_size)
    ids = _ids_array("expert_ids", expert_ids, None, experts)
    return ids // (experts // world_size)


def _ids_array(name, expert_ids, tokens, experts) -> np.ndarray:
    """int64 (T, k) ids in [0, experts), distinct within a row (a token meets each expert at most once)."""
    ids = V.array(name, expert_ids, ndim=2, allow_device=False)
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype, got {V.describe(ids)}")
    if tokens is not None and ids.shape[0] != tokens:
        raise ValueError(f"{name} must have one row per token ({tokens}), got {V.describe(ids)}")
    ids = ids.astype(np.int64)
    bad = (ids < 0) | (ids >= experts)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise ValueError(f"{name} must hold expert ids in [0, {experts}), got {ids[i]} at index {i}")
    srt = np.sort(ids, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1)
    if dup.any():
        t = int(np.argmax(dup))
        raise ValueError(f"{name} must not repeat an expert within a token's row, got {ids[t].tolist()} at row {t}")
    return ids


def _tokens(name, x) -> np.ndarray:
    arr = V.array(name, x, dtype=(np.float16, np.float32, np.float64), ndim=2, allow_device=False, finite=True)
    return V.float32_host(name, arr)


def _gates(name, gates, shape) -> np.ndarray:
    g = V.array(name, gates, dtype=(np.float16, np.float32, np.float64), shape=shape, allow_device=False, finite=True)
    return V.float32_host(name, g)


# ----------------------------------------------------------------------------------------------------------------
# The NumPy reference
# ----------------------------------------------------------------------------------------------------------------


def quantize_tokens(x) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 (T, H), scales float32 (T, ceil(H/128))): E4M3 with one scale per 1 x 128 tile (a shorter last
    tile when H is not a multiple of 128), fp8lab's spec (`spec.quantize(x, "tile", "e4m3")`)."""
    x = _tokens("x", x)
    codes, scales, _ = spec.quantize(x, "tile", FMT, TILE)
    return codes, scales


def dequantize_tokens(codes, scales) -> np.ndarray:
    """float32 (T, H): decode(codes) * scale of each element's tile: what the experts see."""
    codes = V.array("codes", codes, dtype=np.uint8, ndim=2, allow_device=False)
    scales = V.array("scales", scales, dtype=np.float32, shape=spec.scale_shape("tile", codes.shape, TILE),
                     allow_device=False)
    return spec.dequantize(codes, scales, 1, TILE, FMT)


def _apply_expert(expert_fn, e: int, rows: np.ndarray) -> np.ndarray:
    out = expert_fn(e, rows)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise TypeError(f"expert_fn({e}, rows) must return a float32 NumPy array, got {V.describe(out)}")
    if out.shape != rows.shape:
        raise ValueError(f"expert_fn({e}, rows) must return an array of the rows' shape {rows.shape}, got "
                         f"{V.describe(out)}")
    return out


def _expert_slots(x, ids, expert_fn) -> np.ndarray:
    """float32 (T, k, H): expert ids[t, j]'s output for token t; each expert called once, on its rows in token
    order (the order in which a rank receives them: by source rank, then token)."""
    T, H = x.shape
    out = np.full((T, ids.shape[1], H), np.nan, np.float32)
    for e in np.unique(ids):
        t, j = np.nonzero(ids == e)
        out[t, j] = _apply_expert(expert_fn, int(e), x[t])
    return out


def _weighted_sum(gates, slots) -> np.ndarray:
    """sum_j gates[:, j] * slots[:, j], float32, in slot order (the combine's arithmetic on every path)."""
    out = gates[:, 0, None] * slots[:, 0]
    for j in range(1, slots.shape[1]):
        out = out + gates[:, j, None] * slots[:, j]
    return out.astype(np.float32)


def reference_moe(x, expert_ids, gates, expert_fn, world_size: int = 1, *, experts: int | None = None,
                  combine: str = "float32") -> np.ndarray:
    """The MoE layer without communication: out[t] = sum_j gates[t, j] * expert_fn(expert_ids[t, j], x[t]),
    float32 (T, H), the sum taken in slot order j = 0, 1, ... in float32.

    x: (T, H) float tokens of all ranks, rank r holding the r-th chunk of np.array_split(range(T), world_size).
    expert_fn(e, rows float32 (n, H)) -> float32 (n, H); called once per expert, on its rows in token order: the
    order in which the expert's rank receives them (source rank, then token), so the result does not depend on
    world_size, and `dispatch`/`combine` reproduce it bit for bit when given the same inputs.
    combine="bf16": every expert output is rounded to bfloat16 (nearest even) before it is weighted, as
    `combine` sends it; "float32": not rounded. experts: the number of experts (checked against world_size and
    the ids); None: 1 + the largest id, not checked against world_size.
    Run it on `dequantize_tokens(*quantize_tokens(x))` with combine="bf16" for what the FP8 path must give.
    """
    x = _tokens("x", x)
    T, H = x.shape
    world_size = V.positive_int("world_size", world_size)
    if experts is not None:
        experts, world_size = _placement(experts, world_size)
    ids = _ids_array("expert_ids", expert_ids, T, experts if experts is not None else np.iinfo(np.int64).max)
    g = _gates("gates", gates, ids.shape)
    if not callable(expert_fn):
        raise TypeError(f"expert_fn must be callable as expert_fn(e, rows), got {V.describe(expert_fn)}")
    V.choice("combine", combine, ("float32", "bf16"))
    slots = _expert_slots(x, ids, expert_fn)
    if combine == "bf16":
        slots = formats.round_bf16(slots)
    return _weighted_sum(g, slots)


@dataclasses.dataclass
class Received:
    """What one rank receives in the dispatch: n token rows, grouped by source rank, in token order within each.

    codes: uint8 (n, H) E4M3 codes; scales: float32 (n, ceil(H/128)) 1x128 tile dequantization scales;
    expert_ids: int32 (n, top_k): the token's expert id in each of its slots whose expert lives on this rank,
    -1 in the others; source: int64 (n,) the sending rank; token: int64 (n,) the token's row on that rank.
    A token with several experts on this rank arrives once.
    """

    codes: np.ndarray
    scales: np.ndarray
    expert_ids: np.ndarray
    source: np.ndarray
    token: np.ndarray


def reference_dispatch(x, expert_ids, experts: int, world_size: int) -> list[Received]:
    """What each rank must receive (list index = rank) when the tokens x (T, H) of all ranks, split as
    np.array_split(range(T), world_size), are dispatched to the experts expert_ids (T, top_k); no communication."""
    x = _tokens("x", x)
    experts, world_size = _placement(experts, world_size)
    ids = _ids_array("expert_ids", expert_ids, x.shape[0], experts)
    codes, scales = quantize_tokens(x)
    dest = ids // (experts // world_size)
    sizes = [len(c) for c in np.array_split(np.arange(x.shape[0]), world_size)]
    source_of = np.repeat(np.arange(world_size, dtype=np.int64), sizes)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    out = []
    for r in range(world_size):
        rows = np.flatnonzero((dest == r).any(axis=1))  # global token order = (source rank, token)
        source = source_of[rows]
        out.append(Received(codes[rows], scales[rows], np.where(dest[rows] == r, ids[rows], -1).astype(np.int32),
                            source, rows - first[source]))
    return out


# ----------------------------------------------------------------------------------------------------------------
# The lecture's experts and the error bound of the FP8 path
# ----------------------------------------------------------------------------------------------------------------


class LinearExperts:
    """expert_fn for the lecture: expert e maps a row to row @ W_e, W_e (hidden, hidden) float32 with N(0, 1/hidden)
    entries drawn from (seed, e), so every process builds the same weights. The product is computed in float64 and
    rounded to float32 once: its bits do not depend on how a BLAS blocks or threads it, so every rank and the
    reference agree exactly."""

    def __init__(self, experts: int, hidden: int, seed: int = 0):
        self.experts = V.positive_int("experts", experts)
        self.hidden = V.positive_int("hidden", hidden)
        self.seed = _seed("seed", seed)
        self._w: dict[int, np.ndarray] = {}

    def __getstate__(self):  # spawned ranks draw their own weights
        return {"experts": self.experts, "hidden": self.hidden, "seed": self.seed, "_w": {}}

    def weight(self, e: int) -> np.ndarray:
        """W_e, float32 (hidden, hidden)."""
        if e not in self._w:
            if not 0 <= e < self.experts:
                raise ValueError(f"e must be an expert id in [0, {self.experts}), got {e}")
            rng = np.random.default_rng([self.seed, 2, e])
            self._w[e] = (rng.standard_normal((self.hidden, self.hidden)) / np.sqrt(self.hidden)).astype(np.float32)
        return self._w[e]

    def __call__(self, e: int, rows: np.ndarray) -> np.ndarray:
        return (rows.astype(np.float64) @ self.weight(e).astype(np.float64)).astype(np.float32)


def fp8_error_bound(x, expert_ids, gates, experts: LinearExperts) -> np.ndarray:
    """float32 (T, H): a bound on |FP8 dispatch + BF16 combine - reference_moe(x, ..., combine="float32")| per
    element, for LinearExperts.

    Per input element, the 1x128 E4M3 round trip errs by at most 2^-4 |x| (half an ulp, 3 mantissa bits) or, in the
    subnormal range, 2^-10 * scale (half of the smallest subnormal 2^-9, in units of the tile's scale), plus float32
    roundings (2^-20 |x| covers them). Through expert j the error is at most |err| @ |W_j|; the FP8 path's output z_j
    is then rounded to float32 (2^-24) and to BF16 (2^-9, nearest even, 8 significant bits). The gated sums add
    float32 roundings on both sides: (k + 2) * 2^-23 * sum_j |g_j| |z_j|.
    """
    x = _tokens("x", x)
    if not isinstance(experts, LinearExperts):
        raise TypeError(f"experts must be a LinearExperts, got {V.describe(experts)}")
    ids = _ids_array("expert_ids", expert_ids, x.shape[0], experts.experts)
    g = np.abs(_gates("gates", gates, ids.shape)).astype(np.float64)
    codes, scales = quantize_tokens(x)
    deq = dequantize_tokens(codes, scales)
    err = np.abs(x).astype(np.float64) * (2.0 ** -4 + 2.0 ** -20) + \
        spec.expand(scales, 1, TILE, x.shape).astype(np.float64) * 2.0 ** -10
    k = ids.shape[1]
    bound = np.zeros(x.shape, np.float64)
    for e in np.unique(ids):
        t, j = np.nonzero(ids == e)
        w = experts.weight(int(e)).astype(np.float64)
        z = np.abs(deq[t].astype(np.float64) @ w)
        bound[t] += g[t, j, None] * (err[t] @ np.abs(w) + (2.0 ** -9 + 2.0 ** -22 + (k + 2) * 2.0 ** -23) * z)
    return bound.astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# The communicating version
# ----------------------------------------------------------------------------------------------------------------


def _torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise ImportError("fp8lab.comm.moe's all-to-all needs PyTorch (optional in fp8lab): pip install torch "
                          f"(the CPU build is enough for gloo) [{e}]") from None
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
    experts, world_size = _placement(experts, world_size)
    x = _tokens("x", x)
    T, H = x.shape
    ids = _ids_array("expert_ids", expert_ids, T, experts)
    k = ids.shape[1]
    dev = _device(torch, dist, group, device)

    t0 = time.perf_counter()
    codes, scales = quantize_tokens(x)
    dest = ids // (experts // world_size)
    rows_to = [np.flatnonzero((dest == r).any(axis=1)) for r in range(world_size)]
    rows = np.concatenate(rows_to)
    send_counts = np.array([len(r) for r in rows_to], np.int64)
    to_rank = np.repeat(np.arange(world_size), send_counts)
    local_ids = np.where(dest[rows] == to_rank[:, None], ids[rows], -1)
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
        y[index[r, s]] = _apply_expert(expert_fn, int(e), x[r])
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
    g = _gates("gates", gates, (handle.tokens, handle.top_k))
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
    return _weighted_sum(g, slots)


# ----------------------------------------------------------------------------------------------------------------
# The launcher
# ----------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seed(name, seed) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 0, got {V.describe(seed)}")
    if seed < 0:
        raise ValueError(f"{name} must be an int >= 0, got {seed}")
    return int(seed)


def alltoall_inputs(rank: int, tokens: int, hidden: int, experts: int, top_k: int, seed: int = 0):
    """(x float32 (tokens, hidden), expert_ids, gates) of one rank in `run_alltoall`, drawn from (seed, rank):
    Gaussian rows times a per-token magnitude e^N(0,1) (so tiles get different scales); sigmoid routing of
    Gaussian logits."""
    rng = np.random.default_rng([_seed("seed", seed), 1, rank])
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
    experts, world_size = _placement(experts, world_size)
    top_k = V.positive_int("top_k", top_k)
    if top_k > experts:
        raise ValueError(f"top_k must be at most experts ({experts}), got {top_k}")
    seed = _seed("seed", seed)
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


# ----------------------------------------------------------------------------------------------------------------
# What it costs at DeepSeek-V3's size
# ----------------------------------------------------------------------------------------------------------------


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
