"""Token embedding: the forward gather out[m, :] = table[ids[m], :] and its backward, a scatter-add into dtable.

table (V, D) float32, ids (M,) integer token ids in [0, V), out and dout (M, D) float32. The backward is
dtable[v, :] = sum of dout[m, :] over the tokens m with ids[m] == v (dtable is overwritten; an id that no token
uses gets a row of zeros). Tokens that share an id are a race for the same row: the versions handle it apart.

gather: one block per token row (a grid-stride loop over rows), threads along D: coalesced reads and writes.
version 1: zero dtable, then one float atomic add per element (cuda.atomic.add). Simple, but the adds into a row
           land in whatever order the hardware serves them, and float addition is not associative: the result
           can change in its last bits from run to run (checked against the exact sum with a rounding bound).
version 2: deterministic, no float atomics. A stable counting sort on the device: count the tokens per (tile of
           tokens, id) with integer atomics, scan the counts to row offsets, place each token's index in id order
           keeping token order (its rank among the earlier tokens of its tile with the same id); then one block per
           (vocabulary row, column chunk) sums that row's tokens in token order. Bit-exact with `reference`, which
           adds each row's tokens in token order in float32, and the same bits on every run.
version 3: deterministic and parallel within a row. Version 2's sum of a row is one block walking all the row's
           tokens: with characters for tokens one row holds about 15% of them (the space, in Tiny Shakespeare's
           training text), ~40,000 a step at the large preset, one after the other. Version 3 cuts each row's sorted tokens into segments of SEGMENT,
           sums every segment in its own block (in token order), then adds each row's segment sums in order: the
           same bits on every run, bit for bit `reference(..., segment=SEGMENT)`.

Hot path: pass device arrays, a `Scratch` made once for version 2, and check_range=False for device ids that
were range-checked where they were made (checking them here copies them to the host). The kernels never read
or write outside their arrays even so: a gathered row for an id outside [0, V) is NaN, and the backward
skips such a token.
Run `python -m fp8lab.kernels.embedding` to check every kernel against the reference and time it.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate, bench
from ..device import runtime
from ..bench import timing
from ..device.runtime import MAX_BLOCKS, cuda
from .common import (SORT_SCAN_THREADS, SORT_TILE, find_run, make_chunk_starts_kernel, offsets_scan_kernel,
                     place_kernel, tile_count_kernel, tile_scan_kernel, zero_rows_kernel)
from .versions import Version

THREADS = runtime.block_threads(256)  # row kernels (gather, zero, atomics): threads along D
SUM_THREADS = runtime.block_threads(128)  # version 2's sums: columns of one chunk
TILE_TOKENS = SORT_TILE  # versions 2 and 3: tokens per counting tile (common's stable counting sort)
SCAN_THREADS = SORT_SCAN_THREADS  # the one block that scans the row counts
UNROLL = 8  # version 2's sums: loads in flight per thread before their in-order adds
SEGMENT = runtime.block_threads(256)  # version 3: tokens summed by one block (32 under the simulator: small tests
# still cut rows into several segments)
_NAN = np.float32(np.nan)


# ----------------------------------------------------------------------------------------------------------------
# Forward: gather
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def gather_kernel(table, ids, out):
    vocab = table.shape[0]
    D = table.shape[1]
    m = cuda.blockIdx.x
    while m < ids.size:  # a block per token row, grid-stride
        v = ids[m]
        if 0 <= v < vocab:  # the same for the whole block: no divergence
            for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):  # neighbouring threads, neighbouring columns
                out[m, d] = table[v, d]
        else:  # an id the host did not check: a visible NaN row, never a read outside the table
            for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
                out[m, d] = _NAN
        m += cuda.gridDim.x


# ----------------------------------------------------------------------------------------------------------------
# Backward version 1: float atomics
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def scatter_add_atomic_kernel(dout, ids, dtable):
    vocab = dtable.shape[0]
    D = dtable.shape[1]
    m = cuda.blockIdx.x
    while m < ids.size:
        v = ids[m]
        if 0 <= v < vocab:
            for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
                cuda.atomic.add(dtable, (v, d), dout[m, d])  # tokens with the same id race here
        m += cuda.gridDim.x


# ----------------------------------------------------------------------------------------------------------------
# Backward version 2: stable counting sort, then per-row sums in token order
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def _sum_in_order(dout, order, k, end, d, buf):
    """The float32 sum, from 0, of dout[order[k], d] ... dout[order[end - 1], d] in that order (buf: UNROLL floats
    of local memory)."""
    acc = np.float32(0)
    while k + UNROLL <= end:
        for u in range(UNROLL):  # UNROLL independent loads in flight together...
            buf[u] = dout[order[k + u], d]
        for u in range(UNROLL):  # ...then the adds, strictly in token order
            acc += buf[u]
        k += UNROLL
    while k < end:
        acc += dout[order[k], d]
        k += 1
    return acc


@cuda.jit
def row_sum_kernel(dout, order, offsets, dtable):
    """dtable[v, d] = the sum of dout[m, d] over v's tokens m in token order, from 0, in float32: one block per
    (row v, chunk of blockDim.x columns), grid-stride. Rows without tokens get 0."""
    buf = cuda.local.array(UNROLL, np.float32)
    vocab = dtable.shape[0]
    D = dtable.shape[1]
    chunks = (D + cuda.blockDim.x - 1) // cuda.blockDim.x
    w = cuda.blockIdx.x
    while w < vocab * chunks:
        v = w // chunks
        d = (w % chunks) * cuda.blockDim.x + cuda.threadIdx.x
        if d < D:
            dtable[v, d] = _sum_in_order(dout, order, int(offsets[v]), int(offsets[v + 1]), d, buf)
        w += cuda.gridDim.x


# ----------------------------------------------------------------------------------------------------------------
# Backward version 3: version 2's sort, then sums of segments of SEGMENT tokens, then each row's segment sums
# ----------------------------------------------------------------------------------------------------------------


segment_scan_kernel = make_chunk_starts_kernel(SEGMENT, 1)
"""One block: seg_base[v] = the first segment of id v (the exclusive scan of ceil(tokens of v / SEGMENT)),
seg_base[V] = the number of segments (common.make_chunk_starts_kernel)."""


@cuda.jit
def segment_sum_kernel(dout, order, offsets, seg_base, partials):
    """partials[s, d] = the sum of dout[m, d] over segment s's tokens (up to SEGMENT of one id, in token order),
    from 0, in float32: one block per (segment, chunk of blockDim.x columns), grid-stride."""
    buf = cuda.local.array(UNROLL, np.float32)
    vocab = offsets.size - 1
    D = dout.shape[1]
    chunks = (D + cuda.blockDim.x - 1) // cuda.blockDim.x
    total = seg_base[vocab]
    w = cuda.blockIdx.x
    while w < total * chunks:
        s = w // chunks
        lo = find_run(seg_base, vocab, s)  # the id of segment s
        d = (w % chunks) * cuda.blockDim.x + cuda.threadIdx.x
        if d < D:
            k = int(offsets[lo]) + (s - int(seg_base[lo])) * SEGMENT
            partials[s, d] = _sum_in_order(dout, order, k, min(k + SEGMENT, int(offsets[lo + 1])), d, buf)
        w += cuda.gridDim.x


@cuda.jit
def segment_combine_kernel(partials, seg_base, dtable):
    """dtable[v, d] = the sum of v's segment sums in order, from 0 (0 for a row without tokens): one block per
    (row, chunk of columns), grid-stride."""
    vocab = dtable.shape[0]
    D = dtable.shape[1]
    chunks = (D + cuda.blockDim.x - 1) // cuda.blockDim.x
    w = cuda.blockIdx.x
    while w < vocab * chunks:
        v = w // chunks
        d = (w % chunks) * cuda.blockDim.x + cuda.threadIdx.x
        if d < D:
            acc = np.float32(0)
            for s in range(seg_base[v], seg_base[v + 1]):
                acc += partials[s, d]
            dtable[v, d] = acc
        w += cuda.gridDim.x


VERSIONS = {  # kernel: the backward's kernels, in launch order
    1: Version("zero dtable, then a float atomic add per element (run-to-run bits may differ)",
               (zero_rows_kernel, scatter_add_atomic_kernel)),
    2: Version("deterministic: stable counting sort of the ids, then per-row sums in token order (bit-exact)",
               (zero_rows_kernel, tile_count_kernel, tile_scan_kernel, offsets_scan_kernel, place_kernel,
                row_sum_kernel)),
    3: Version("deterministic: version 2's sort, then sums of SEGMENT tokens in parallel, then each row's in order",
               (zero_rows_kernel, tile_count_kernel, tile_scan_kernel, offsets_scan_kernel, place_kernel,
                segment_scan_kernel, segment_sum_kernel, segment_combine_kernel)),
}
BEST = 3
SORTED = (2, 3)
"""The versions that sort the ids first (they work in a Scratch)."""


class Scratch:
    """The sorting versions' device buffers for `vocab` rows and up to `tokens` ids, allocated once and reused every
    step (version 3 also for rows of `width` columns: its segment sums).

    tile_counts (ceil(tokens / TILE_TOKENS), vocab) int32: tokens per (tile, id), then their tile bases;
    offsets (vocab + 1,) int32: id v's tokens are order[offsets[v]:offsets[v + 1]];
    order (tokens,) int32: token indices sorted by id, token order kept within an id;
    seg_base (vocab + 1,) int32 and partials (segments, width) float32: version 3's segments of id v are
    partials[seg_base[v]:seg_base[v + 1]] (at most ceil(tokens / SEGMENT) + vocab segments). width None: made by
    the first version 3 call (a CUDA graph cannot allocate: pass width for a step that will be captured).
    """

    def __init__(self, vocab: int, tokens: int, width: int | None = None):
        self.vocab = _validate.positive_int("vocab", vocab)
        self.tokens = _validate.positive_int("tokens", tokens)
        self.tiles = math.ceil(self.tokens / TILE_TOKENS)
        self.tile_counts = cuda.device_array((self.tiles, self.vocab), np.int32)
        self.offsets = cuda.device_array(self.vocab + 1, np.int32)
        self.order = cuda.device_array(self.tokens, np.int32)
        self.segments = math.ceil(self.tokens / SEGMENT) + self.vocab
        self.seg_base = cuda.device_array(self.vocab + 1, np.int32)
        self.partials = None
        if width is not None:
            self.partials_for(_validate.positive_int("width", width))

    def partials_for(self, width: int):
        """The segment sums' buffer for rows of `width` columns (made, or made again wider, when needed)."""
        if self.partials is None or self.partials.shape[1] != width:
            self.partials = cuda.device_array((self.segments, width), np.float32)
        return self.partials


# ----------------------------------------------------------------------------------------------------------------
# Launchers (device arrays, checked by the public functions below)
# ----------------------------------------------------------------------------------------------------------------


def _rows_grid(rows: int) -> int:
    return max(1, min(rows, MAX_BLOCKS))


def _launch_backward(dout, ids, dtable, version: int, scratch) -> None:
    """VERSIONS[version]'s kernels, in order; version 2 works in `scratch`."""
    vocab, D = dtable.shape
    M = ids.shape[0]
    if version == 1:
        zero_rows, scatter_add = VERSIONS[1].kernel
        zero_rows[_rows_grid(vocab), THREADS](dtable)
        scatter_add[_rows_grid(M), THREADS](dout, ids, dtable)
        return
    zero_rows, tile_count, tile_scan, offsets_scan, place, *sums = VERSIONS[version].kernel
    tiles = math.ceil(M / TILE_TOKENS)
    zero_rows[_rows_grid(scratch.tiles), THREADS](scratch.tile_counts)
    tile_count[tiles, TILE_TOKENS](ids, scratch.tile_counts)
    tile_scan[runtime.grid_1d(vocab, THREADS)](scratch.tile_counts, scratch.offsets)
    offsets_scan[1, SCAN_THREADS](scratch.offsets)
    place[tiles, TILE_TOKENS](ids, scratch.tile_counts, scratch.offsets, scratch.order)
    chunks = math.ceil(D / SUM_THREADS)
    if version == 2:
        sums[0][_rows_grid(vocab * chunks), SUM_THREADS](dout, scratch.order, scratch.offsets, dtable)
        return
    segment_scan, segment_sum, combine = sums
    partials = scratch.partials_for(D)
    segment_scan[1, SCAN_THREADS](scratch.offsets, scratch.seg_base)
    most = math.ceil(M / SEGMENT) + vocab  # segments at most; the blocks past the real count exit at once
    segment_sum[_rows_grid(most * chunks), SUM_THREADS](dout, scratch.order, scratch.offsets, scratch.seg_base,
                                                        partials)
    combine[_rows_grid(vocab * chunks), SUM_THREADS](partials, scratch.seg_base, dtable)


# ----------------------------------------------------------------------------------------------------------------
# Public ops: argument checks, NumPy or device arrays
# ----------------------------------------------------------------------------------------------------------------


def _checked_ids(ids, vocab: int, check_range, rows_of: str):
    """ids as a 1-D integer array (NumPy: C-contiguous int32; device: int32 or int64 as given), range-checked
    against [0, vocab) unless check_range is False and ids is a device array."""
    check_range = _validate.boolean("check_range", check_range)
    ids = _validate.array("ids", ids, ndim=1)
    on_device = _validate.is_device_array(ids)
    dtype = np.dtype(ids.dtype)
    if on_device and dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"ids must have dtype int32 or int64 on the device, got {_validate.describe(ids)}")
    if dtype.kind not in "iu":
        raise TypeError(f"ids must have an integer dtype (token ids), got {_validate.describe(ids)}")
    if check_range or not on_device:
        host = runtime.to_host(ids)
        bad = (host < 0) | (host >= vocab)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"ids must lie in [0, {vocab}) (the rows of {rows_of}), got {int(bad.sum())} value(s) "
                             f"outside, the first ({host[i]}) at index {i} in {_validate.describe(ids)}")
    return ids if on_device else np.ascontiguousarray(ids, dtype=np.int32)


def _finish(out, dev_out):
    """Copy a device result into a NumPy `out` (the NumPy convenience path); return out."""
    if dev_out is not out:
        out[...] = dev_out.copy_to_host()
    return out


def gather(table, ids, out, *, check_range: bool = True):
    """out[m, :] = table[ids[m], :]: table (V, D) float32, ids (M,) integer in [0, V), out (M, D) float32.

    NumPy or device arrays; out is written and returned. check_range=False skips the range check of device ids
    (it copies them to the host); an id outside [0, V) then gives a NaN row, never a read outside the table.
    """
    table = _validate.array("table", table, dtype=np.float32, ndim=2)
    vocab, D = table.shape
    ids = _checked_ids(ids, vocab, check_range, "table")
    out = _validate.array("out", out, dtype=np.float32, shape=(ids.shape[0], D))
    dev_out = out if _validate.is_device_array(out) else cuda.device_array(out.shape, np.float32)
    gather_kernel[_rows_grid(ids.shape[0]), THREADS](runtime.to_device(table), runtime.to_device(ids), dev_out)
    return _finish(out, dev_out)


def backward(dout, ids, dtable, version: int | None = None, *, scratch: Scratch | None = None,
             check_range: bool = True):
    """dtable[v, :] = sum of dout[m, :] over the tokens with ids[m] == v (0 where no token has id v).

    dout (M, D) float32, ids (M,) integer in [0, V), dtable (V, D) float32, overwritten and returned; NumPy or
    device arrays. version None: BEST. Versions 2 and 3 work in `scratch` (a Scratch(V, tokens >= M), made once
    per run; version 3 with width=D where a CUDA graph will capture the call) or allocate one per call.
    check_range=False skips the range check of device ids (a copy to the host); the
    kernels then skip any token whose id is outside [0, V).
    """
    dout = _validate.array("dout", dout, dtype=np.float32, ndim=2)
    M, D = dout.shape
    dtable = _validate.array("dtable", dtable, dtype=np.float32, ndim=2)
    vocab = dtable.shape[0]
    if dtable.shape[1] != D:
        raise ValueError(f"dtable must have shape ({vocab}, {D}) (D columns, as dout has), got "
                         f"{_validate.describe(dtable)}")
    ids = _checked_ids(ids, vocab, check_range, "dtable")
    if ids.shape[0] != M:
        raise ValueError(f"dout must have shape ({ids.shape[0]}, {D}) (one row per id), got "
                         f"{_validate.describe(dout)}")
    version = _validate.version("version", version, VERSIONS, default=BEST)
    if version in SORTED:
        if scratch is None:
            scratch = Scratch(vocab, M)
        elif not isinstance(scratch, Scratch):
            raise TypeError(f"scratch must be a Scratch or None, got {_validate.describe(scratch)}")
        elif scratch.vocab != vocab or scratch.tokens < M:
            raise ValueError(f"scratch must be a Scratch for vocab = {vocab} and tokens >= {M}, got one for vocab = "
                             f"{scratch.vocab} and tokens = {scratch.tokens}")
    dev_out = dtable if _validate.is_device_array(dtable) else cuda.device_array(dtable.shape, np.float32)
    _launch_backward(runtime.to_device(dout), runtime.to_device(ids), dev_out, version, scratch)
    return _finish(dtable, dev_out)


# ----------------------------------------------------------------------------------------------------------------
# References (NumPy)
# ----------------------------------------------------------------------------------------------------------------


def reference_gather(table, ids) -> np.ndarray:
    """The spec of gather: table[ids] (exact)."""
    return np.asarray(table, np.float32)[np.asarray(ids)]


def reference(dout, ids, vocab: int, segment: int | None = None) -> np.ndarray:
    """The spec of the backward, bit for bit: each row of a float32 zero table gets its tokens' dout rows added
    one by one in token order, in float32 (what version 2 computes). segment: a row's tokens (in token order) cut
    into runs of `segment`, each run summed so from 0, then the runs' sums added so (version 3, SEGMENT)."""
    dout = np.asarray(dout, np.float32)
    ids = np.asarray(ids)
    dtable = np.zeros((vocab, dout.shape[1]), np.float32)
    if segment is None:
        for m, v in enumerate(ids.tolist()):
            dtable[v] += dout[m]  # one float32 rounding per add, token order
        return dtable
    for v in np.unique(ids).tolist():
        rows = dout[ids == v]
        for start in range(0, len(rows), segment):
            run = np.zeros(dout.shape[1], np.float32)
            for x in rows[start:start + segment]:
                run += x
            dtable[v] += run
    return dtable


def reference_of(version: int):
    """The bit-for-bit spec of a sorting version: reference(dout, ids, vocab) in its order of additions."""
    if version not in SORTED:
        raise ValueError(f"version must be one of {SORTED} (a deterministic version), got {version!r}")
    return lambda dout, ids, vocab: reference(dout, ids, vocab, None if version == 2 else SEGMENT)


def reference_exact(dout, ids, vocab: int) -> np.ndarray:
    """The backward in float64 (order-free to within float64 rounding): what version 1 is compared with."""
    dtable = np.zeros((vocab, np.shape(dout)[1]), np.float64)
    np.add.at(dtable, np.asarray(ids), np.asarray(dout, np.float64))
    return dtable


def error_bound(dout, ids, vocab: int) -> np.ndarray:
    """Elementwise bound on |a float32 sum of a row's tokens in any order - the exact sum|.

    n addends starting from 0 take at most n - 1 roundings of relative error u = 2^-24 each, so the recursive
    summation bound is gamma_(n-1) * sum |dout| with gamma_k = k u / (1 - k u) (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., section 4.2); n * 2^-23 covers it with a factor of 2 to spare. Rows without
    tokens get 0: they must be exactly 0.
    """
    ids = np.asarray(ids)
    n = np.bincount(ids, minlength=vocab).astype(np.float64)
    abs_sum = reference_exact(np.abs(np.asarray(dout, np.float32)), ids, vocab)
    return n[:, None] * 2.0**-23 * abs_sum


def assert_bits_equal(name: str, got, ref) -> None:
    """float32 arrays equal bit for bit (a NaN, or a -0 for a +0, is a mismatch)."""
    got, ref = np.asarray(got), np.asarray(ref)
    bench.assert_close(name, got, ref, atol=0, rtol=0)  # readable first mismatches (NaN fails)
    if got.dtype != ref.dtype or not np.array_equal(got.view(np.uint32), ref.view(np.uint32)):
        raise AssertionError(f"{name}: equal values but not equal bits (signed zeros?)")


# ----------------------------------------------------------------------------------------------------------------
# The harness
# ----------------------------------------------------------------------------------------------------------------


def problem(rng, vocab: int, tokens: int, D: int, unused=(), top: float | None = None):
    """(table, ids, dout): standard-normal float32 table (vocab, D) and dout (tokens, D), ids drawn uniformly from
    [0, vocab) without the rows in `unused` (so their gradient rows must come out 0); top: the share of tokens
    drawn for the first used row instead (text is skewed so: the space is about 15% of Tiny Shakespeare)."""
    rows = np.setdiff1d(np.arange(vocab), np.asarray(unused, np.int64))
    p = None
    if top is not None:
        p = np.full(len(rows), (1 - top) / (len(rows) - 1))
        p[0] = top
    ids = rng.choice(rows, tokens, p=p).astype(np.int32)
    table = rng.standard_normal((vocab, D), dtype=np.float32)
    dout = rng.standard_normal((tokens, D), dtype=np.float32)
    return table, ids, dout


def checks(rng) -> list:
    # simulator: a few tiles of TILE_TOKENS (32) with a partial last one; GPU: the capstone's short vocabulary
    vocab, M, D = (7, 200, 37) if runtime.IS_SIM else (65, 16381, 1025)  # simulated: ~40 tokens a row, 2 segments
    unused = (2, vocab - 1)
    table, ids, dout = problem(rng, vocab, M, D, unused)
    dtable_, ids_, dout_ = cuda.to_device(table), cuda.to_device(ids), cuda.to_device(dout)
    out = bench.poisoned((M, D), np.float32)
    gather(dtable_, ids_, out)
    assert_bits_equal("gather", out.copy_to_host(), reference_gather(table, ids))
    rows = [(f"gather, V={vocab} M={M} D={D}", "exact")]

    g = bench.poisoned((vocab, D), np.float32)  # the unused rows too: they must become 0
    backward(dout_, ids_, g, 1)
    got = g.copy_to_host()
    bench.assert_close("backward v1", got, reference_exact(dout, ids, vocab), atol=error_bound(dout, ids, vocab),
                       rtol=0)
    if (got[list(unused)] != 0).any():
        raise AssertionError(f"backward v1: rows {unused} have no tokens and must be 0")
    rows.append((f"backward v1, V={vocab} M={M} D={D}, rows {unused} unused", "within the float32 summation bound"))

    scratch = Scratch(vocab, M)
    for v in SORTED:
        ref = reference_of(v)(dout, ids, vocab)
        for run in (1, 2):  # the second run, on reused scratch, must give the same bits
            g = bench.poisoned((vocab, D), np.float32)
            backward(dout_, ids_, g, v, scratch=scratch)
            assert_bits_equal(f"backward v{v} (run {run})", g.copy_to_host(), ref)
        rows.append((f"backward v{v}, V={vocab} M={M} D={D}, rows {unused} unused, run twice", "bit-exact, twice"))
    return rows


PROBLEMS = ((65, 16384, 1024, None), (32000, 16384, 1024, None), (65, 262144, 128, 0.2))
"""timings' (vocab, tokens, D, top share): 65 ids, ~250 tokens each (the hard case for atomics); 32000 ids, mostly
0 or 1 token each; the large preset's characters (16384 windows of 16, 128 wide), one id a fifth of them (more
than the space's 15%: a margin)."""


def timings(rng, args) -> list:
    torch = bench.torch_cuda()
    tables = []
    for vocab, M, D, top in PROBLEMS:
        ceiling = bench.copy_ceiling_gbs(4 * M * D)
        table, ids, dout = problem(rng, vocab, M, D, top=top)
        t_, i_, d_ = cuda.to_device(table), cuda.to_device(ids), cuda.to_device(dout)
        out = cuda.device_array((M, D), np.float32)
        dtable = cuda.device_array((vocab, D), np.float32)
        scratch = Scratch(vocab, M)
        gather_bytes = 4 * M + 4 * len(np.unique(ids)) * D + 4 * M * D  # ids, each used row once, out
        backward_bytes = 4 * M + 4 * M * D + 4 * vocab * D  # ids, dout, dtable
        rows = [bench.Row("gather: a block per token row",
                          timing.time_ms(lambda: gather(t_, i_, out, check_range=False)), gather_bytes)]
        rows += [bench.Row(f"backward v{v}: {desc}",
                           timing.time_ms(lambda v=v: backward(d_, i_, dtable, v, scratch=scratch, check_range=False)),
                           backward_bytes) for v, desc in VERSIONS.items()]
        if torch is not None:
            F = torch.nn.functional
            ti = torch.as_tensor(ids.astype(np.int64), device="cuda")
            tw, tg = torch.as_tensor(table, device="cuda"), torch.as_tensor(dout, device="cuda")
            tdt = torch.empty((vocab, D), device="cuda")
            rows.append(bench.Row("torch F.embedding", timing.torch_time_ms(torch, lambda: F.embedding(ti, tw)),
                                  gather_bytes))
            rows.append(bench.Row("torch zero_ + index_add_ (float atomics)",
                                  timing.torch_time_ms(torch, lambda: tdt.zero_().index_add_(0, ti, tg)),
                                  backward_bytes))
            rows.append(bench.Row("torch embedding backward (aten.embedding_dense_backward)",
                                  timing.torch_time_ms(
                                      torch, lambda: torch.ops.aten.embedding_dense_backward(tg, ti, vocab, -1, False)),
                                  backward_bytes))
        tables.append(bench.Table(
            f"embedding, M={M} tokens, D={D}, V={vocab} ({M / vocab:,.1f} tokens per row"
            + ("" if top is None else f", one row {top:.0%} of them") + "), float32; bytes = ids + "
            f"used table rows once + out (gather), ids + dout + dtable (backward)", "GB/s", rows, ceiling=ceiling))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
