"""Routed experts' token permutation: each expert's tokens gathered into contiguous rows (padded to 128-row groups),
and the experts' outputs scattered back to their tokens, weighted by the gates.

Routing gives every token t its top-k experts expert_ids[t, j] and gates[t, j] (fp8lab.comm.moe.route: DeepSeek-V3's
sigmoid affinities). `permute` sorts the (token, choice) pairs by expert, keeping token order within an expert (a
stable counting sort on the device, kernels.common's), and copies x[t] into row slots[t, j] of `rows`: expert e's
tokens in rows offsets[e] .. offsets[e] + count_e, then zero rows up to offsets[e + 1], a multiple of 128 (the
layout fl.fp8_grouped_gemm takes: DeepGEMM's contiguous one). `unpermute` adds each token's k expert outputs,
out[t] = sum_j gates[t, j] * y[slots[t, j]] in j order: deterministic, no atomics. Their backwards:
`unpermute_backward` (dy[slots[t, j]] = gates[t, j] * dout[t], padding rows 0; dgates[t, j] = dout[t] . y[slots[t, j]])
and `permute_backward` (dx[t] = sum_j drows[slots[t, j]] in j order).

version 1: the sort (count per tile of keys, scan, place), a one-block scan of the groups' padded starts, then a
           block per row of `rows` copying its token (or zeros) and recording the slot; the other ops a block per
           token, threads along the width.

Everything is exact (copies, and sums in a fixed order of float32 values): bit for bit the NumPy references.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..device import runtime
from ..device.runtime import cuda
from .common import (SORT_SCAN_THREADS, SORT_TILE, find_run, make_chunk_starts_kernel, offsets_scan_kernel,
                     place_kernel, tile_count_kernel, tile_scan_kernel, zero_rows_kernel)
from .versions import Version

GROUP_ROWS = 128  # each expert's rows are padded to a multiple of this (fl.fp8_grouped_gemm's 128-row tiles)
THREADS = runtime.block_threads(128)  # threads along the width
_ZERO = np.float32(0.0)


padded_starts_kernel = make_chunk_starts_kernel(GROUP_ROWS, GROUP_ROWS)
"""One block: starts[e] = the first row of expert e's group, each group ceil(count_e / 128) * 128 rows; starts[E] =
the rows in all (common.make_chunk_starts_kernel)."""


@cuda.jit
def gather_kernel(x, order, offsets, starts, k, rows, slots):
    """A block per row s of rows (grid-stride): in expert e's group (starts[e] <= s < starts[e + 1]), its i-th row
    (i = s - starts[e]) is the i-th pair of e in sorted order, pair a = order[offsets[e] + i] (token a // k,
    choice a % k): x[a // k] copied, slots[a] = s; past e's count, zeros."""
    experts = offsets.size - 1
    D = x.shape[1]
    s = cuda.blockIdx.x
    while s < starts[experts]:
        lo = find_run(starts, experts, s)  # the expert of row s
        i = s - starts[lo]
        if i < offsets[lo + 1] - offsets[lo]:
            a = order[offsets[lo] + i]
            t = a // k
            for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
                rows[s, d] = x[t, d]
            if cuda.threadIdx.x == 0:
                slots[t, a % k] = s
        else:
            for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
                rows[s, d] = _ZERO
        s += cuda.gridDim.x


@cuda.jit
def unpermute_kernel(y, slots, gates, out):
    """out[t, d] = sum_j gates[t, j] * y[slots[t, j], d], j in order, from 0; a block per token (grid-stride)."""
    t = cuda.blockIdx.x
    while t < out.shape[0]:
        for d in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            acc = _ZERO
            for j in range(slots.shape[1]):
                acc += gates[t, j] * y[slots[t, j], d]
            out[t, d] = acc
        t += cuda.gridDim.x


@cuda.jit
def scatter_grad_kernel(dout, y, slots, gates, dy, dgates):
    """dy[slots[t, j]] = gates[t, j] * dout[t] (rows no pair owns stay as they are: the caller zeroes dy first);
    dgates[t, j] = dout[t] . y[slots[t, j]], summed in d order by thread 0 after the block's partial sums."""
    part = cuda.shared.array(THREADS, np.float32)
    t = cuda.blockIdx.x
    while t < dout.shape[0]:
        for j in range(slots.shape[1]):
            s = slots[t, j]
            p = _ZERO
            for d in range(cuda.threadIdx.x, dout.shape[1], cuda.blockDim.x):
                dy[s, d] = gates[t, j] * dout[t, d]
                p += dout[t, d] * y[s, d]
            part[cuda.threadIdx.x] = p
            cuda.syncthreads()
            if cuda.threadIdx.x == 0:
                acc = _ZERO
                for i in range(cuda.blockDim.x):
                    acc += part[i]
                dgates[t, j] = acc
            cuda.syncthreads()
        t += cuda.gridDim.x


@cuda.jit
def gather_grad_kernel(drows, slots, dx):
    """dx[t, d] = sum_j drows[slots[t, j], d], j in order, from 0."""
    t = cuda.blockIdx.x
    while t < dx.shape[0]:
        for d in range(cuda.threadIdx.x, dx.shape[1], cuda.blockDim.x):
            acc = _ZERO
            for j in range(slots.shape[1]):
                acc += drows[slots[t, j], d]
            dx[t, d] = acc
        t += cuda.gridDim.x


class Scratch:
    """The sort's device buffers for `tokens` tokens of `k` choices among `experts`, made once."""

    def __init__(self, tokens: int, k: int, experts: int):
        self.tokens, self.k, self.experts = (V.positive_int(n, v) for n, v in
                                             (("tokens", tokens), ("k", k), ("experts", experts)))
        pairs = self.tokens * self.k
        self.tiles = math.ceil(pairs / SORT_TILE)
        self.tile_counts = cuda.device_array((self.tiles, self.experts), np.int32)
        self.offsets = cuda.device_array(self.experts + 1, np.int32)
        self.starts = cuda.device_array(self.experts + 1, np.int32)
        self.order = cuda.device_array(pairs, np.int32)

    @property
    def most_rows(self) -> int:
        """An upper bound of the padded rows: every pair, plus at most 127 padding rows per expert."""
        return self.tokens * self.k + self.experts * (GROUP_ROWS - 1)


def _grid(n: int) -> int:
    return max(1, min(n, runtime.MAX_BLOCKS))


def launch_permute(x, ids, scratch: Scratch, rows, slots) -> None:
    """Version 1 on device arrays: x (T, D) float32, ids (T * k,) int32 (expert ids, flat), rows (>= the padded rows,
    D) float32, slots (T, k) int32; the group starts are left in scratch.starts."""
    pairs = ids.size
    zero_rows_kernel[_grid(scratch.tiles), THREADS](scratch.tile_counts)
    tile_count_kernel[scratch.tiles, SORT_TILE](ids, scratch.tile_counts)
    tile_scan_kernel[runtime.grid_1d(scratch.experts, THREADS)](scratch.tile_counts, scratch.offsets)
    offsets_scan_kernel[1, SORT_SCAN_THREADS](scratch.offsets)
    place_kernel[scratch.tiles, SORT_TILE](ids, scratch.tile_counts, scratch.offsets, scratch.order)
    padded_starts_kernel[1, SORT_SCAN_THREADS](scratch.offsets, scratch.starts)
    gather_kernel[_grid(rows.shape[0]), THREADS](x, scratch.order, scratch.offsets, scratch.starts,
                                                 pairs // x.shape[0], rows, slots)


VERSIONS = {
    1: Version("counting sort of the expert ids, then a block per padded row copying its token", launch_permute),
}
BEST = 1


# ----------------------------------------------------------------------------------------------------------------
# Public ops
# ----------------------------------------------------------------------------------------------------------------


def _ids(expert_ids, T: int, experts: int):
    ids = V.array("expert_ids", expert_ids, ndim=2)
    if np.dtype(ids.dtype).kind not in "iu" or ids.shape[0] != T:
        raise ValueError(f"expert_ids must be an integer array of shape ({T}, k), one row per token, got "
                         f"{V.describe(ids)}")
    host = runtime.to_host(ids)
    if ((host < 0) | (host >= experts)).any():
        raise ValueError(f"expert_ids must lie in [0, {experts}) (experts = {experts}), got values from "
                         f"{host.min()} to {host.max()}")
    if any(len(set(r)) != len(r) for r in host.tolist()):
        raise ValueError("expert_ids must name k different experts for each token (top-k routing), got a repeat")
    return np.ascontiguousarray(host, np.int32)


def permute(x, expert_ids, experts: int, *, scratch: Scratch | None = None):
    """(rows, offsets, slots): rows (offsets[-1], D) float32, each expert's tokens in token order then zero rows to
    a multiple of 128; offsets (experts + 1,) host int64, the groups' first rows; slots (T, k) int32, the row of
    each (token, choice). x (T, D) float32 and expert_ids (T, k) integers in [0, experts), k different per token;
    NumPy or device arrays (rows and slots are device arrays unless x is NumPy)."""
    x = V.array("x", x, dtype=np.float32, ndim=2)
    experts = V.positive_int("experts", experts)
    T, D = x.shape
    ids = _ids(expert_ids, T, experts)
    k = ids.shape[1]
    if scratch is None:
        scratch = Scratch(T, k, experts)
    elif (scratch.tokens, scratch.k, scratch.experts) != (T, k, experts):
        raise ValueError(f"scratch must be a Scratch({T}, {k}, {experts}), got one for ({scratch.tokens}, "
                         f"{scratch.k}, {scratch.experts})")
    rows = cuda.device_array((scratch.most_rows, D), np.float32)
    slots = cuda.device_array((T, k), np.int32)
    launch_permute(runtime.to_device(x), cuda.to_device(ids.reshape(-1)), scratch, rows, slots)
    offsets = scratch.starts.copy_to_host().astype(np.int64)
    rows = rows[:int(offsets[-1])]
    if not V.is_device_array(x):
        return rows.copy_to_host(), offsets, slots.copy_to_host()
    return rows, offsets, slots


def _slots(slots, rows: int, distinct: bool = False):
    """slots checked: int32 (T, k), every value a row of the rows array (in [0, rows)), all different with
    distinct (unpermute_backward writes one row per slot: a repeat would be a race)."""
    s = V.array("slots", slots, dtype=np.int32, ndim=2)
    host = runtime.to_host(s)
    if host.size and (host.min() < 0 or host.max() >= rows):
        raise ValueError(f"slots must lie in [0, {rows}) (the rows of the experts' array), got values from "
                         f"{host.min()} to {host.max()}")
    if distinct and len(np.unique(host)) != host.size:
        raise ValueError("slots must all be different (permute gives each (token, choice) its own row), got a repeat")
    return s


def unpermute(y, slots, gates):
    """out (T, D) float32: out[t] = sum_j gates[t, j] * y[slots[t, j]], j in order. y (R, D) float32 (the experts'
    outputs, permute's row order), slots (T, k) int32 from permute, gates (T, k) float32."""
    y = V.array("y", y, dtype=np.float32, ndim=2)
    s = _slots(slots, y.shape[0])
    gates = V.array("gates", gates, dtype=np.float32, shape=tuple(s.shape))
    out = cuda.device_array((s.shape[0], y.shape[1]), np.float32)
    unpermute_kernel[_grid(s.shape[0]), THREADS](runtime.to_device(y), runtime.to_device(s), runtime.to_device(gates),
                                                 out)
    return out if any(V.is_device_array(a) for a in (y, slots, gates)) else out.copy_to_host()


def unpermute_backward(dout, y, slots, gates):
    """(dy, dgates) of unpermute: dy (R, D) float32, dy[slots[t, j]] = gates[t, j] * dout[t] and 0 on rows no pair
    owns (padding); dgates (T, k) float32, dgates[t, j] = dout[t] . y[slots[t, j]] (a block's partial sums added
    in thread order)."""
    y = V.array("y", y, dtype=np.float32, ndim=2)
    shape = tuple(V.array("slots", slots, dtype=np.int32, ndim=2).shape)
    dout = V.array("dout", dout, dtype=np.float32, shape=(shape[0], y.shape[1]))
    gates = V.array("gates", gates, dtype=np.float32, shape=shape)
    s = _slots(slots, y.shape[0], distinct=True)
    dy = cuda.device_array(y.shape, np.float32)
    dgates = cuda.device_array(s.shape, np.float32)
    zero_rows_kernel[_grid(y.shape[0]), THREADS](dy)
    scatter_grad_kernel[_grid(s.shape[0]), THREADS](runtime.to_device(dout), runtime.to_device(y),
                                                    runtime.to_device(s), runtime.to_device(gates), dy, dgates)
    if any(V.is_device_array(a) for a in (dout, y, slots, gates)):
        return dy, dgates
    return dy.copy_to_host(), dgates.copy_to_host()


def permute_backward(drows, slots):
    """dx (T, D) float32 of permute: dx[t] = sum_j drows[slots[t, j]], j in order."""
    drows = V.array("drows", drows, dtype=np.float32, ndim=2)
    s = _slots(slots, drows.shape[0])
    dx = cuda.device_array((s.shape[0], drows.shape[1]), np.float32)
    gather_grad_kernel[_grid(s.shape[0]), THREADS](runtime.to_device(drows), runtime.to_device(s), dx)
    return dx if V.is_device_array(drows) or V.is_device_array(slots) else dx.copy_to_host()


# ----------------------------------------------------------------------------------------------------------------
# References (NumPy): the same float32 operations in the same order
# ----------------------------------------------------------------------------------------------------------------


def reference(x, expert_ids, experts: int):
    """(rows, offsets, slots) of permute: a stable sort of the flat (token, choice) pairs by expert."""
    x = np.asarray(x, np.float32)
    ids = np.asarray(expert_ids).reshape(-1)
    T, k = np.shape(expert_ids)
    counts = np.bincount(ids, minlength=experts)
    offsets = np.concatenate([[0], np.cumsum(-(-counts // GROUP_ROWS) * GROUP_ROWS)]).astype(np.int64)
    rows = np.zeros((int(offsets[-1]), x.shape[1]), np.float32)
    slots = np.zeros((T, k), np.int32)
    order = np.argsort(ids, kind="stable")
    for e in range(experts):
        pairs = order[ids[order] == e]
        rows[offsets[e]:offsets[e] + len(pairs)] = x[pairs // k]
        slots.reshape(-1)[pairs] = offsets[e] + np.arange(len(pairs))
    return rows, offsets, slots


def reference_unpermute(y, slots, gates) -> np.ndarray:
    """float32 sum over j of gates[:, j, None] * y[slots[:, j]], from 0, in j order."""
    y, gates = np.asarray(y, np.float32), np.asarray(gates, np.float32)
    out = np.zeros((slots.shape[0], y.shape[1]), np.float32)
    for j in range(slots.shape[1]):
        out += gates[:, j, None] * y[slots[:, j]]
    return out


def reference_permute_backward(drows, slots) -> np.ndarray:
    drows = np.asarray(drows, np.float32)
    dx = np.zeros((slots.shape[0], drows.shape[1]), np.float32)
    for j in range(slots.shape[1]):
        dx += drows[slots[:, j]]
    return dx


# ----------------------------------------------------------------------------------------------------------------
# Check, then time
# ----------------------------------------------------------------------------------------------------------------


CHECK = {"sim": (70, 3, 5, 33), "gpu": (16381, 8, 64, 1031)}
"""(tokens, k, experts, D) of the checks; under the simulator 70 x 3 pairs over 5 experts: groups of 128 rows with
few tokens each, odd D."""
BENCH = (16384, 8, 64, 2048)
"""(tokens, k, experts, D) of the timings: 16384 tokens, top-8 of 64 experts (DeepSeek-V3 routes to 8 of 256), 2048
wide."""


def make_routing(rng, tokens: int, k: int, experts: int):
    """x-independent routing: k different experts per token (skewed: expert e drawn with weight 1 + e % 4), and
    gates in (0, 1)."""
    w = 1.0 + np.arange(experts) % 4
    ids = np.stack([rng.choice(experts, k, replace=False, p=w / w.sum()) for _ in range(tokens)]).astype(np.int32)
    return ids, rng.uniform(0.05, 1, (tokens, k)).astype(np.float32)


def checks(rng, only=None) -> list:
    T, k, E, D = CHECK["sim" if runtime.IS_SIM else "gpu"]
    x = rng.standard_normal((T, D), dtype=np.float32)
    ids, gates = make_routing(rng, T, k, E)
    rows, offsets, slots = permute(cuda.to_device(x), ids, E)
    want = reference(x, ids, E)
    assert np.array_equal(offsets, want[1]), f"permute: group starts {offsets} != {want[1]}"
    assert np.array_equal(rows.copy_to_host(), want[0]) and np.array_equal(slots.copy_to_host(), want[2]), \
        "permute: rows or slots differ from the reference"
    y = rng.standard_normal(tuple(rows.shape), dtype=np.float32)
    out = unpermute(y, slots.copy_to_host(), gates)
    assert np.array_equal(out, reference_unpermute(y, want[2], gates)), "unpermute differs from the reference"
    dout = rng.standard_normal((T, D), dtype=np.float32)
    dy, dgates = unpermute_backward(dout, y, want[2], gates)
    ref_dy = np.zeros_like(y)
    for j in range(k):
        ref_dy[want[2][:, j]] = gates[:, j, None] * dout
    assert np.array_equal(dy, ref_dy), "unpermute_backward: dy differs"
    bench.assert_close("unpermute_backward dgates", dgates,
                       np.einsum("td,tjd->tj", dout.astype(np.float64), y[want[2]].astype(np.float64)),
                       atol=D * 2.0**-22 * np.abs(dout).max() * np.abs(y).max(), rtol=0)
    assert np.array_equal(permute_backward(y, want[2]), reference_permute_backward(y, want[2])), \
        "permute_backward differs from the reference"
    return [(f"permute {T} tokens x top-{k} of {E} experts, D={D}: rows, group starts, slots", "bit-exact"),
            ("unpermute, permute_backward, unpermute_backward's dy", "bit-exact"),
            ("unpermute_backward's dgates", "within the float32 bound")]


def timings(rng, args) -> list:
    T, k, E, D = BENCH
    x = cuda.to_device(rng.standard_normal((T, D), dtype=np.float32))
    ids, gates = make_routing(rng, T, k, E)
    scratch = Scratch(T, k, E)
    rows, offsets, slots = permute(x, ids, E, scratch=scratch)
    y = cuda.to_device(rng.standard_normal(tuple(rows.shape), dtype=np.float32))
    dg = cuda.to_device(gates)
    move = 4 * T * D + 4 * T * k * D  # a token read, k rows written (or k rows read, one written)
    tbl = [bench.Row("permute: sort + gather to 128-row groups",
                     timing.time_ms(lambda: permute(x, ids, E, scratch=scratch)), move),
           bench.Row("unpermute: weighted sum of k rows per token", timing.time_ms(lambda: unpermute(y, slots, dg)),
                     move)]
    return [bench.Table(f"permute / unpermute, {T} tokens, top-{k} of {E} experts, D={D}", "GB/s", tbl,
                        ceiling=bench.copy_ceiling_gbs(4 * T * D * k))]


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
