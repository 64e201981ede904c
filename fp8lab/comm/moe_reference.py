"""MoE routing and the MoE layer in NumPy, without communication: what `fp8lab.comm.moe`'s all-to-all must give
(DeepSeek-V3, arXiv 2412.19437: routing 2.1.2, FP8 dispatch 3.3).

- `route`: expert ids and gate weights per token from router logits (sigmoid + normalisation over the selected,
  as DeepSeek-V3; or softmax, as DeepSeek-V2), optionally node-limited; `update_bias`: DeepSeek-V3's balancing
  step for route's bias; `expert_rank`: where each expert lives;
- `quantize_tokens`, `dequantize_tokens`: tokens as E4M3 codes with one scale per 1x128 tile, fp8lab's NumPy spec;
- `send_plan`: which token rows go to which rank (`try_send_plan` checks yours against it);
- `reference_moe`, `reference_dispatch`: the MoE layer's output and what every rank receives;
- `LinearExperts`, `fp8_error_bound`: the lecture's experts and a bound on the FP8 path's error through them;
- `check_placement`, `check_expert_ids`, `check_tokens`, `check_gates`, `check_seed`, `apply_expert`,
  `weighted_sum`: argument checks and arithmetic that the all-to-all (`fp8lab.comm.moe_alltoall`) shares.

Experts are spread evenly and contiguously: expert e lives on rank e // (experts // world_size).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import _validate as V
from ..numerics import formats, spec

SCORES = ("sigmoid", "softmax")
FMT = "e4m3"
TILE = spec.GROUP_K  # 1 x 128 tiles along the hidden dimension (arXiv 2412.19437, section 3.3)


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


def update_bias(bias, loads, gamma: float) -> np.ndarray:
    """DeepSeek-V3's auxiliary-loss-free balancing (section 2.1.2), one step: the selection bias route() takes,
    lowered by gamma for an expert that got more tokens than the mean (loads, one count per expert), raised by gamma
    for one that got fewer, unchanged at the mean; float32 (kernels.router.update_bias does the same on the
    device)."""
    gamma = float(gamma)
    if not 0 <= gamma < np.inf:
        raise ValueError(f"gamma must be a finite number >= 0 (the bias update speed), got {gamma!r}")
    if loads is None:
        raise ValueError("loads must be the tokens each expert got (ExpertLayer.loads after a forward), got None")
    loads = np.asarray(loads, np.float64)
    step = np.where(loads > loads.mean(), -np.float32(gamma), np.where(loads < loads.mean(), np.float32(gamma), 0))
    return (np.asarray(bias, np.float32) + step.astype(np.float32)).astype(np.float32)


def check_placement(experts, world_size) -> tuple[int, int]:
    """(experts, world_size) as ints; ValueError unless both are positive and every rank holds as many experts."""
    experts = V.positive_int("experts", experts)
    world_size = V.positive_int("world_size", world_size)
    if experts % world_size:
        raise ValueError(f"experts must be a multiple of world_size ({world_size}) so every rank holds as many "
                         f"experts, got {experts}")
    return experts, world_size


def expert_rank(expert_ids, experts: int, world_size: int) -> np.ndarray:
    """The rank that holds each expert: expert_ids // (experts // world_size) (contiguous, even placement)."""
    experts, world_size = check_placement(experts, world_size)
    ids = check_expert_ids("expert_ids", expert_ids, None, experts)
    return ids // (experts // world_size)


def check_expert_ids(name, expert_ids, tokens, experts) -> np.ndarray:
    """The argument `name` as int64 (T, k) ids in [0, experts), distinct within a row (a token meets each expert at
    most once), T = tokens unless tokens is None; TypeError/ValueError naming it otherwise."""
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


def check_tokens(name, x) -> np.ndarray:
    """The argument `name` as float32 (T, H) host tokens: a finite 2-D float array."""
    arr = V.array(name, x, dtype=(np.float16, np.float32, np.float64), ndim=2, allow_device=False, finite=True)
    return V.float32_host(name, arr)


def check_gates(name, gates, shape) -> np.ndarray:
    """The argument `name` as float32 host gate weights of `shape`, finite."""
    g = V.array(name, gates, dtype=(np.float16, np.float32, np.float64), shape=shape, allow_device=False, finite=True)
    return V.float32_host(name, g)


def check_seed(name, seed) -> int:
    """The argument `name` as an int >= 0 (a seed of np.random.default_rng)."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 0, got {V.describe(seed)}")
    if seed < 0:
        raise ValueError(f"{name} must be an int >= 0, got {seed}")
    return int(seed)


# ----------------------------------------------------------------------------------------------------------------
# The NumPy reference
# ----------------------------------------------------------------------------------------------------------------


def quantize_tokens(x) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint8 (T, H), scales float32 (T, ceil(H/128))): E4M3 with one scale per 1 x 128 tile (a shorter last
    tile when H is not a multiple of 128), fp8lab's spec (`spec.quantize(x, "tile", "e4m3")`)."""
    x = check_tokens("x", x)
    codes, scales, _ = spec.quantize(x, "tile", FMT, TILE)
    return codes, scales


def dequantize_tokens(codes, scales) -> np.ndarray:
    """float32 (T, H): decode(codes) * scale of each element's tile: what the experts see."""
    codes = V.array("codes", codes, dtype=np.uint8, ndim=2, allow_device=False)
    scales = V.array("scales", scales, dtype=np.float32, shape=spec.scale_shape("tile", codes.shape, TILE),
                     allow_device=False)
    return spec.dequantize(codes, scales, 1, TILE, FMT)


def apply_expert(expert_fn, e: int, rows: np.ndarray) -> np.ndarray:
    """expert_fn(e, rows), checked: a float32 NumPy array of the rows' shape."""
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
        out[t, j] = apply_expert(expert_fn, int(e), x[t])
    return out


def weighted_sum(gates, slots) -> np.ndarray:
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
    x = check_tokens("x", x)
    T, H = x.shape
    world_size = V.positive_int("world_size", world_size)
    if experts is not None:
        experts, world_size = check_placement(experts, world_size)
    ids = check_expert_ids("expert_ids", expert_ids, T, experts if experts is not None else np.iinfo(np.int64).max)
    g = check_gates("gates", gates, ids.shape)
    if not callable(expert_fn):
        raise TypeError(f"expert_fn must be callable as expert_fn(e, rows), got {V.describe(expert_fn)}")
    V.choice("combine", combine, ("float32", "bf16"))
    slots = _expert_slots(x, ids, expert_fn)
    if combine == "bf16":
        slots = formats.round_bf16(slots)
    return weighted_sum(g, slots)


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


def send_plan(expert_ids, experts: int, world_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Where the dispatch sends each token (DeepSeek-V3, section 3.2.2: a token travels once to each place that
    holds its experts): for each rank r, (rows, local_ids): rows int64, the tokens with at least one expert on r,
    in token order (each once, however many of its experts live there); local_ids int32 (len(rows), top_k): the
    token's expert id in each slot whose expert lives on r, -1 in its other slots. `dispatch` and
    `reference_dispatch` both send by it."""
    experts, world_size = check_placement(experts, world_size)
    ids = check_expert_ids("expert_ids", expert_ids, None, experts)
    dest = ids // (experts // world_size)
    plan = []
    for r in range(world_size):
        rows = np.flatnonzero((dest == r).any(axis=1))
        plan.append((rows.astype(np.int64), np.where(dest[rows] == r, ids[rows], -1).astype(np.int32)))
    return plan


PLAN_CASES = ((37, 8, 2, 2), (50, 16, 4, 4), (23, 12, 3, 5), (64, 8, 8, 1))
"""try_send_plan's routings: (tokens, experts, world_size, top_k); token counts that split unevenly."""


def try_send_plan(fn, *, rng=None) -> list[tuple[str, str]]:
    """Check your send plan: fn(expert_ids, experts, world_size) must return what `send_plan` returns (for each
    rank, the rows it sends there and their local expert ids, as arrays or lists) on random routings (`route` of
    fresh logits) for each of PLAN_CASES. Returns one (case, result) row per case; AssertionError naming the case,
    the rank and the first difference otherwise."""
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(expert_ids, experts, world_size), got {V.describe(fn)}")
    rng = np.random.default_rng() if rng is None else rng
    rows_out = []
    for T, E, W, k in PLAN_CASES:
        ids, _ = route(rng.standard_normal((T, E)), k)
        want = send_plan(ids, E, W)
        got = fn(ids.copy(), E, W)
        case = f"{T} tokens, {E} experts on {W} ranks, top-{k}"
        if not isinstance(got, (list, tuple)) or len(got) != W:
            raise AssertionError(f"{case}: your plan must have one (rows, local_ids) pair per rank ({W}), got "
                                 f"{V.describe(got)}")
        for r, ((rows, local), pair) in enumerate(zip(want, got)):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise AssertionError(f"{case}: rank {r}: expected a pair (rows, local_ids), got {V.describe(pair)}")
            g_rows, g_local = np.asarray(pair[0]).reshape(-1), np.asarray(pair[1]).reshape(-1, k)
            if g_rows.shape != rows.shape or not np.array_equal(g_rows, rows):
                n = min(len(g_rows), len(rows))
                i = next((j for j in range(n) if g_rows[j] != rows[j]), n)
                raise AssertionError(f"{case}: rank {r} should get {len(rows)} token rows, yours sends {len(g_rows)}; "
                                     f"first difference at position {i}: library "
                                     f"{rows[i] if i < len(rows) else 'nothing'}, yours "
                                     f"{g_rows[i] if i < len(g_rows) else 'nothing'}")
            if g_local.shape != local.shape or not np.array_equal(g_local, local):
                i = int(np.argmax((g_local != local).any(axis=1))) if g_local.shape == local.shape else 0
                raise AssertionError(f"{case}: rank {r}, token {rows[i]}: local expert ids should be "
                                     f"{local[i].tolist()}, yours {g_local[i].tolist() if len(g_local) else []}")
        sent = [len(r) for r, _ in want]
        rows_out.append((case, f"rows per rank {sent} ({T * k} (token, expert) pairs): equal to the library's"))
    return rows_out


def reference_dispatch(x, expert_ids, experts: int, world_size: int) -> list[Received]:
    """What each rank must receive (list index = rank) when the tokens x (T, H) of all ranks, split as
    np.array_split(range(T), world_size), are dispatched to the experts expert_ids (T, top_k); no communication."""
    x = check_tokens("x", x)
    experts, world_size = check_placement(experts, world_size)
    ids = check_expert_ids("expert_ids", expert_ids, x.shape[0], experts)
    codes, scales = quantize_tokens(x)
    sizes = [len(c) for c in np.array_split(np.arange(x.shape[0]), world_size)]
    source_of = np.repeat(np.arange(world_size, dtype=np.int64), sizes)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    out = []
    for rows, local_ids in send_plan(ids, experts, world_size):  # global token order = (source rank, token)
        source = source_of[rows]
        out.append(Received(codes[rows], scales[rows], local_ids, source, rows - first[source]))
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
        self.seed = check_seed("seed", seed)
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
    x = check_tokens("x", x)
    if not isinstance(experts, LinearExperts):
        raise TypeError(f"experts must be a LinearExperts, got {V.describe(experts)}")
    ids = check_expert_ids("expert_ids", expert_ids, x.shape[0], experts.experts)
    g = np.abs(check_gates("gates", gates, ids.shape)).astype(np.float64)
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
