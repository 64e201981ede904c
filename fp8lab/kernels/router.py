"""DeepSeek-V3's router on the device: each token's top-k experts by sigmoid affinity plus a balancing bias, its gates
the selected affinities normalized to sum 1, and the bias update that balances the load without an auxiliary loss.

DeepSeek-V3 (arXiv 2412.19437, section 2.1.2): s_e = sigmoid(u . e_e) for the token's logits; the top-k experts
by s_e + b_e are selected, but the gates use s_e alone, divided by the sum over the selected; after each step b_e
decreases by gamma where expert e was overloaded and increases by gamma where it was underloaded. `route` computes
the first part from the router's logits (T, E); `update_bias` the second from the tokens each expert received.
The NumPy reference is fp8lab.comm.moe.route (the all-to-all lecture's), which this matches: the same experts, in
the same order (descending selection score, ties to the lower id), gates within a float32 rounding.

version 1: a warp per token, lane l holding experts l, l + 32, ...: sigmoid in float64, then k rounds of a warp
           argmax by shuffles (value, then lower id), the chosen expert's score set to -inf for the next round.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..comm.moe_reference import route as reference_route
from ..comm.moe_reference import update_bias as reference_update_bias
from ..device import runtime
from ..device.runtime import FULL_MASK, WARP_SIZE, cuda, shfl_xor_sync
from .versions import Version

MAX_EXPERTS = 256  # DeepSeek-V3 routes among 256 experts
PER_LANE = MAX_EXPERTS // WARP_SIZE
MAX_K = 16  # experts per token at most (DeepSeek-V3: 8)
WARPS = runtime.block_threads(128) // WARP_SIZE  # tokens per block
_NEG_INF = np.float64(-np.inf)


@cuda.jit
def route_kernel(logits, bias, k, ids, gates):
    """Warp per token t (grid-stride): ids[t, :k] the top-k experts by sigmoid(logits[t]) + bias, gates[t] their
    sigmoids over the sum of them (float64, rounded once)."""
    s = cuda.local.array(PER_LANE, np.float64)
    sel = cuda.local.array(PER_LANE, np.float64)
    picked = cuda.local.array(MAX_K, np.int64)
    vals = cuda.local.array(MAX_K, np.float64)
    T, E = logits.shape
    lane = cuda.threadIdx.x % WARP_SIZE
    warps = cuda.blockDim.x // WARP_SIZE
    t = cuda.blockIdx.x * warps + cuda.threadIdx.x // WARP_SIZE
    while t < T:  # warp-uniform: every lane of a warp takes the same trips
        for i in range(PER_LANE):
            e = lane + WARP_SIZE * i
            s[i] = 0.0
            sel[i] = _NEG_INF
            if e < E:
                s[i] = 1.0 / (1.0 + math.exp(-np.float64(logits[t, e])))
                sel[i] = s[i] + np.float64(bias[e])
        total = 0.0
        for j in range(k):
            best, who = _NEG_INF, E  # this lane's best unpicked expert (lower id on ties)
            for i in range(PER_LANE):
                e = lane + WARP_SIZE * i
                if e < E and (sel[i] > best or (sel[i] == best and e < who)):
                    best, who = sel[i], e
            off = WARP_SIZE // 2
            while off > 0:  # the warp's best: the largest score, then the lowest id
                b2 = shfl_xor_sync(FULL_MASK, best, off)
                w2 = shfl_xor_sync(FULL_MASK, who, off)
                if b2 > best or (b2 == best and w2 < who):
                    best, who = b2, w2
                off //= 2
            picked[j] = who  # every lane has the warp's choice after the butterfly
            vals[j] = _pick(s, who, lane)
            total += vals[j]
            if who < E and who % WARP_SIZE == lane:  # the owner takes it out of the next rounds (who == E: no
                sel[who // WARP_SIZE] = _NEG_INF      # finite candidate was left, a NaN row: nothing to take out)
        if lane == 0:  # the gates: the selected sigmoids over their sum, rounded once
            for j in range(k):
                ids[t, j] = picked[j]
                gates[t, j] = np.float32(vals[j] / total)
        t += cuda.gridDim.x * warps


@cuda.jit(device=True)
def _pick(s, who, lane):
    """The chosen expert's sigmoid, broadcast to the warp from its owner (a shuffle sum of one nonzero term)."""
    v = s[who // WARP_SIZE] if who % WARP_SIZE == lane and who // WARP_SIZE < PER_LANE else 0.0
    off = WARP_SIZE // 2
    while off > 0:
        v += shfl_xor_sync(FULL_MASK, v, off)
        off //= 2
    return v


@cuda.jit
def update_bias_kernel(bias, offsets, gamma):
    """bias[e] -= gamma where expert e got more than the mean load, += gamma where fewer (one thread per expert):
    the load is offsets[e + 1] - offsets[e] (permute's unpadded group sizes)."""
    e = cuda.grid(1)
    E = bias.size
    if e < E:
        mean = np.float64(offsets[E] - offsets[0]) / E
        load = np.float64(offsets[e + 1] - offsets[e])
        if load > mean:
            bias[e] -= gamma
        elif load < mean:
            bias[e] += gamma


def launch_route(logits, bias, k: int, ids, gates) -> None:
    T = logits.shape[0]
    route_kernel[max(1, min(runtime.MAX_BLOCKS, math.ceil(T / WARPS))), WARPS * WARP_SIZE](logits, bias, k, ids, gates)


VERSIONS = {1: Version("a warp per token: float64 sigmoids, k rounds of a warp argmax by shuffles", launch_route)}
BEST = 1


def route(logits, top_k: int, bias=None):
    """(expert_ids (T, top_k) int32, gates (T, top_k) float32) from router logits (T, E) float32, E <= 256: the
    top_k experts by sigmoid(logits) + bias (bias (E,) float32, None: 0), in descending order (ties to the lower
    id), gates the selected sigmoids over their sum. NumPy or device arrays (device results for device logits)."""
    logits = V.array("logits", logits, dtype=np.float32, ndim=2)
    T, E = logits.shape
    if not 1 <= E <= MAX_EXPERTS or T == 0:
        raise ValueError(f"logits must be (T, E) with T >= 1 and 1 <= E <= {MAX_EXPERTS} experts, got "
                         f"{V.describe(logits)}")
    top_k = V.positive_int("top_k", top_k)
    if top_k > min(E, MAX_K):
        raise ValueError(f"top_k must be at most the number of experts ({E}) and at most {MAX_K}, got {top_k}")
    b = np.zeros(E, np.float32) if bias is None else V.array("bias", bias, dtype=np.float32, shape=(E,))
    for name, a in (("logits", logits), ("bias", b)):  # on the device unchecked: a NaN row gives id E, which
        if not V.is_device_array(a) and not np.isfinite(a).all():  # permute refuses
            raise ValueError(f"{name} must be finite (a NaN or Inf cannot be ranked), got "
                             f"{int((~np.isfinite(a)).sum())} non-finite value(s) in {V.describe(a)}")
    ids = cuda.device_array((T, top_k), np.int32)
    gates = cuda.device_array((T, top_k), np.float32)
    launch_route(runtime.to_device(logits), runtime.to_device(b), top_k, ids, gates)
    if V.is_device_array(logits):
        return ids, gates
    return ids.copy_to_host(), gates.copy_to_host()


def update_bias(bias, offsets, gamma: float) -> None:
    """DeepSeek-V3's bias update, in place on a float32 (E,) device array: bias[e] -= gamma for an expert that got
    more tokens than the mean, += gamma for fewer (offsets (E + 1,) int32 device array: each expert's first row
    before padding, as permute's Scratch.offsets; an expert at the mean keeps its bias)."""
    gamma = float(gamma)
    if not 0 <= gamma < np.inf:
        raise ValueError(f"gamma must be a finite number >= 0 (the bias update speed), got {gamma!r}")
    bias = V.array("bias", bias, dtype=np.float32, ndim=1)
    offsets = V.array("offsets", offsets, dtype=np.int32, shape=(bias.size + 1,))
    if not (V.is_device_array(bias) and V.is_device_array(offsets)):
        raise TypeError(f"bias and offsets must be device arrays (updated in place on the device), got "
                        f"{V.describe(bias)} and {V.describe(offsets)}")
    update_bias_kernel[runtime.grid_1d(bias.size, 32)](bias, offsets, np.float32(gamma))


def reference(logits, top_k: int, bias=None):
    """fp8lab.comm.moe.route with DeepSeek-V3's sigmoid scores (ids int64, gates float32)."""
    return reference_route(np.asarray(logits, np.float32), top_k, bias=None if bias is None else np.asarray(bias))


CHECK = {"sim": (37, 9, 3), "gpu": (16381, 256, 8)}
"""(tokens, experts, top_k) of the checks."""


def checks(rng, only=None) -> list:
    T, E, k = CHECK["sim" if runtime.IS_SIM else "gpu"]
    logits = rng.standard_normal((T, E), dtype=np.float32) * np.float32(2)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    logits[0, :4] = logits[0, 4]  # a tie: the lower ids first
    out = []
    for b in (None, bias):
        ids, gates = route(logits, k, b)
        want_ids, want_gates = reference(logits, k, b)
        assert np.array_equal(ids, want_ids), "route: experts differ from the reference"
        bench.assert_close("route gates", gates, want_gates, atol=0, rtol=2.0**-23)
        out.append((f"route {T} tokens, top-{k} of {E}{' + bias' if b is not None else ''}", "same experts; gates "
                    "within a float32 ulp"))
    counts = np.bincount(ids.reshape(-1), minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    d = cuda.to_device(bias)
    update_bias(d, cuda.to_device(offsets), 1e-3)
    assert np.array_equal(d.copy_to_host(), reference_update_bias(bias, counts, 1e-3)), "update_bias differs"
    out.append(("update_bias", "bit-exact"))
    return out


def timings(rng, args) -> list:
    T, E, k = 16384, 256, 8
    logits = cuda.to_device(rng.standard_normal((T, E), dtype=np.float32))
    bias = cuda.to_device(np.zeros(E, np.float32))
    ids, gates = cuda.device_array((T, k), np.int32), cuda.device_array((T, k), np.float32)
    row = bench.Row(f"route: {VERSIONS[1]}", timing.time_ms(lambda: launch_route(logits, bias, k, ids, gates)),
                    4 * T * E + 8 * T * k)
    return [bench.Table(f"router, {T} tokens, top-{k} of {E} experts", "GB/s", [row],
                        ceiling=bench.copy_ceiling_gbs(4 * T * E))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
