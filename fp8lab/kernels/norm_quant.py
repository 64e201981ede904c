"""Fused bias + RMSNorm + 1x128 E4M3 tile quantization (the capstone's pre-norm), and its backward.

For x (M, N) float32 (the residual stream), an optional bias b (N,) and the gain g (N,), all float32:

    y = x + b                              (float32; y = x when there is no bias)
    rstd = 1 / sqrt(mean(y^2) + eps)       per row, eps = spec.RMSNORM_EPS (the same as kernels/rmsnorm.py)
    z = y * rstd * g                       (float32, in this order)

and the outputs codes (M, N) uint8 E4M3 and scales (M, ceil(N/128)) float32, the 1x128 tile quantization of the
float32 z by fp8lab/numerics/spec.py's rule (scale = amax / 448 per tile, the amax floored at AMAX_FLOOR, round to
nearest
even, saturating; a tile holding NaN/Inf is poisoned), rstd (M,) for the backward, and z only when asked for.
Only rstd depends on a kernel's order of additions; given the rstd a kernel wrote, its codes, scales and z are bit
for bit those of `reference(x, b, g, rstd)`.

version 1: unfused: a row kernel (one block per row, block reduction) writes z to global memory, then a warp-per-tile
           kernel reads z back and quantizes it: z makes a round trip (8 more bytes per element than needed).
version 2: fused: one block per row keeps its row in registers, reduces rstd, then computes z tile by tile, finds
           each tile's amax with warp shuffles and writes codes and scales; z reaches memory only when asked for.
version 3: version 2's math in persistent blocks that stream rows through a shared-memory ring (cp.async), b and
           g kept beside it: faster than version 2 for wide rows.
version 4: narrow rows (N <= 2048): one warp per row, 8 rows a block, b and g staged once per block in shared
           memory; wider rows run version 3. BEST: over 85% of copy at 16384 x 1024 and 16384 x 7168, bias or
           not; an 8 MiB x such as the capstone's default step (4096 x 512) is mostly launch and latency (57-62%).

How version 2 moves only the bytes that must move (x read, codes written: 5 bytes per element; b, g, scales and
rstd are small, and b and g stay in the L2 cache), at the bandwidth of a copy:
- The row is read once, with many loads in flight. Each thread issues all of its 16-byte loads (ld.global.v4.f32)
  of x and b into local arrays before it uses any value (memory-level parallelism: a warp of N = 7168 has 8 x 512
  bytes of x in flight), then the sum of squares, the block reduction, rstd, z, the amax and the codes all come
  from those registers. The arrays' indices are constants once the loops are unrolled, so they live in registers
  (the PTX has no local memory).
- Layout (quantize_fine version 3's): a warp takes a "set" of 4 neighbouring tiles, 8 lanes per tile, and lane l of
  a tile holds the float4s l, l + 8, l + 16, l + 24 of it (16 elements). Each load instruction of the warp reads
  four whole 128-byte lines; a tile's amax takes 3 xor-shuffles inside its 8 lanes and its scale two divisions,
  spread over 16 elements per lane; the hardware cvt.rn.satfinite.e4m3x2.f32 packs the codes two at a time and
  four codes leave in one 4-byte store.
- The block size follows N: warps = ceil(sets / SETS_PER_WARP), at least MIN_WARPS, so a thread holds at most 2
  sets (32 floats of x, 32 of b) and a wide row is spread over more warps, not more registers (N = 1024: 1 warp,
  N = 7168: 7). Up to FIT_THREADS threads (N = 16384) a block's registers always fit an SM; longer rows get
  ANY_THREADS threads holding more sets each (with many sets the compiler keeps them in local memory: correct,
  slower). The block size is compiled in (one kernel per size, cached), so each load's offset from the thread's
  first address is a constant; only a warp's last set can pass the end of the row, and its loads read from a
  clamped address and select 0 rather than branch, so that nothing separates the loads.
- Rows that are not a multiple of 4 floats (or misaligned arrays) run the same layout with scalar loads and byte
  stores (a flag compiled into the kernel). Elements past N are zeros in registers: they add nothing to the sum of
  squares and leave the amax of a partial last tile alone.

How version 3 keeps more of x in flight (version 2 at N = 7168 with a bias: 80 registers a thread, 3 blocks of
224 threads an SM, each with one row, and a block's loads are in flight only until its reduction starts):
- Persistent blocks, as many as fit on the GPU at once (the occupancy calculator: 2 an SM at N = 7168): block k
  takes rows k, k + grid, ...; each thread holds one tile set (N = 7168: 14 warps) in version 2's layout. Rows
  stream through a ring in dynamic shared memory: while a row is reduced and written, the next ones are arriving
  by cp.async. Each thread copies exactly the float4s it later reads, so the ring needs cp.async.wait_group, not a
  barrier.
- Without a bias: a ring of STAGES3 = 3 rows (84 KiB at N = 7168); g is loaded per row through the read-only path
  with an L1 evict-last hint (ld.global.nc.L1::evict_last, volatile so that the compiler does not hoist it out of
  the row loop into registers).
- With a bias: each thread keeps the float4s of b and g it reads in shared memory after the ring (loaded once,
  its own, so again no barrier), and the ring holds STAGES3_BIAS = 2 rows: 4 rows' room in all (112 KiB at
  N = 7168, still 2 blocks an SM); thread 0 asks L2 for the L2_AHEAD3 = 2 rows after the ring's
  (cp.async.bulk.prefetch.L2, sm_90). Read per row from L1 instead, b and g compete with the ring for the SM's
  256 KiB of L1 + shared memory.
- The block reduction uses two slot buffers, one barrier per row. The same z = (y * rstd) * g, amax, scale and cvt
  as version 2: codes, scales and z bit for bit the reference given the kernel's rstd. Its rstd may differ from
  version 2's in the last bits (one set per thread, not two: another order of additions). Rows not a multiple of 4
  floats or not 16-byte aligned, and rows whose shared memory would pass MAX_SHARED3 (N > 16384 without a bias,
  N > 14336 with one), run version 2.
Measured on an NVIDIA H200 on 2026-12-04 (percent of a copy timed in the same run, bytes = x read + codes written,
x (16384, N), three timings each): with a bias, b and g read per row with a ring of 3 rows 85-86% at N = 7168 and
78% at N = 4096 (version 2: 75.5% and 82.5%); b alone kept with a ring of 2: 91-92% / 82%; b alone with a ring of
3: 87% / 85%; b and g with a ring of 3: 83% / 89%; b and g with a ring of 2 (this version): 86-88% / 88%, the one
layout over 85% at both widths (the benchmark's runs at N = 7168: 87.0-89.5%). Without a bias, the L2 prefetch
cost 91% against 93.7-97% without it at N = 7168 (sweep and benchmark runs). Version 3 loses to version 2 on
narrow rows (N = 1024: 63-74% of copy against version 2's 73-84%): version 4 takes those.

How version 4 reaches copy speed on narrow rows (at N = 1024 version 2 is a block of one warp per row, 73-76% of
copy with a bias, 81-84% without; version 3's ring 63-74%):
- A row of N <= 2048 fits one warp in version 2's layout (2 tile sets a lane at N = 1024, 4 at 2048), so its sum
  of squares is one warp_sum: no block reduction. A block holds 8 such rows, one per warp.
- The block stages b and g (zeros past N) in shared memory once for its 8 rows, while its x loads are in flight;
  after the one barrier each warp reads them with ld.shared.v4.f32 where version 2 loads them from global memory
  (L1/L2 hits) for every row, 8 loads a lane per array at N = 1024.
Measured on an NVIDIA H200 on 2026-12-04 by a sweep of 14 candidates (percent of a copy timed in the same run,
x (16384, N)): one warp per row with b and g in shared memory, 8 rows a block: N = 1024 90.8% with a bias, 92.9%
without (version 2: 76.0%, 84.2%; the benchmark's runs of version 4: 87.5-89.2% / 88.4-91.9%); N = 2048
87.4% / 97.3% (79.6% / 91.5%). The same kernel reading b and g from
global memory: 74.7% / 86.2% at N = 1024; with 2, 4 or 16 rows a block: 69.1-87.5% with a bias. Persistent warps
(the next row's x prefetched into registers, 96 registers a thread) 86.5% / 90.0%; per-warp cp.async rings of 2-4
rows 78.7-85.6% with a bias; an L2 prefetch ahead of them 68-73%.

Backward (`backward`, one version; y = x + b is recomputed, not stored), with dot = sum_n dz * g * y per row:
    dy = rstd * g * dz - rstd^3 * y * dot / N    (dx = dy, since y = x + b; db = column sum of dy)
    gy = dz * y * rstd                            (dg = column sum of gy)
One block per row; a thread keeps its elements of y and dz in registers, so x and dz are read once. Element
n = thread + k * threads: every warp access, load or store, is one coalesced 128-byte line, and with the block size
compiled in and unsigned indices (numba adds no negative-index wrap-around to those), each is one base address
plus a constant offset. The column sums of dx and gy are the caller's (elementwise.colsum): no atomics.

Run `python -m fp8lab.kernels.norm_quant` to check every version and the backward against the references, then
(on a GPU) time them against a copy and PyTorch.
TIP: a kernel that fails only on the GPU: run it under the simulator (FP8LAB_BACKEND=sim), where `print` and pdb
work inside kernels; keep the shape small.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V
from .. import bench
from ..device import ptx, runtime
from ..numerics import spec
from ..bench import timing
from ..device.ptx import ld_global_v4_f32
from ..device.runtime import FULL_MASK, MAX_BLOCKS, WARP_SIZE, cuda, shfl_xor_sync
from ..numerics.spec import FP8_MAX, GROUP_K, POISON_CODE
from .common import CVT_X2, ENCODE_SAT, amax_scale, block_sum, load4, nanmax, vec_ok, warp_max, warp_sum

EPS = spec.RMSNORM_EPS
TILE = GROUP_K  # 1 x 128 tiles (DeepSeek-V3 activations)
_E4M3_MAX = FP8_MAX["e4m3"]
_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)

MIN_WARPS = 1  # warps per row block at least: N = 1024 ran fastest as one warp of 2 sets (H200: 75% of copy)
MAX_THREADS = 1024  # CUDA's limit per block
FIT_THREADS = 512  # blocks up to this size when a thread holds 2 sets / 16 elements (under 128 registers each)
ANY_THREADS = 256  # blocks of this size launch whatever their register count (256 x 255 < 65536 per SM)
THREADS1 = runtime.block_threads(128)  # version 1's row kernel
QUANT_WARPS1 = 1 if runtime.IS_SIM else 4  # version 1's quantize kernel: warps per block, one tile each
PER_LANE1 = TILE // WARP_SIZE  # version 1's quantize kernel: elements per lane (array sizes must be constants)
LANES = 8  # version 2: lanes per tile
TILES_PER_SET = WARP_SIZE // LANES  # version 2: a warp's set of neighbouring tiles
SET_VALUES = TILE * TILES_PER_SET // WARP_SIZE  # 16 floats a lane holds per set
SETS_PER_WARP = 2  # version 2: sets a thread holds while warps last (32 floats in registers)
BWD_PER_THREAD = 16  # backward: elements of y (and of dz) a thread holds while threads last


# ----------------------------------------------------------------------------------------------------------------
# Version 1: unfused (row kernel writes z, quantize kernel reads it back)
# ----------------------------------------------------------------------------------------------------------------


def make_forward_kernels1(has_bias: bool):
    """(row kernel, quantize kernel) of version 1; has_bias is compiled in."""
    encode = ENCODE_SAT["e4m3"]

    @cuda.jit
    def rmsnorm_bias_kernel1(x, b, g, z, rstd):
        """One block per row: block_sum of y^2, then z = y * rstd * g (x and b are read twice)."""
        slots = cuda.shared.array(32, np.float32)
        N = x.shape[1]
        m = cuda.blockIdx.x
        ss = _ZERO
        for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
            v = x[m, n]
            if has_bias:
                v += b[n]
            ss += v * v
        ss = block_sum(ss, slots)
        r = np.float32(_ONE / math.sqrt(ss / np.float32(N) + EPS))
        if cuda.threadIdx.x == 0:
            rstd[m] = r
        for n in range(cuda.threadIdx.x, N, cuda.blockDim.x):
            v = x[m, n]
            if has_bias:
                v += b[n]
            z[m, n] = v * r * g[n]

    @cuda.jit
    def tile_quantize_kernel1(z, codes, scales):
        """One warp per 1 x 128 tile of z: 4 elements per lane, warp_max, the software E4M3 encoder."""
        vals = cuda.local.array(PER_LANE1, np.float32)
        N = z.shape[1]
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        w = cuda.grid(1) // WARP_SIZE
        while w < scales.size:  # warp-uniform: every lane reaches every shuffle
            r = w // ntiles
            t = w % ntiles
            amax = _ZERO
            for j in range(PER_LANE1):
                c = t * TILE + lane + WARP_SIZE * j  # lanes on consecutive addresses: coalesced
                v = z[r, c] if c < N else _ZERO
                vals[j] = v
                amax = nanmax(amax, abs(v))
            amax = warp_max(amax)
            s, inv = amax_scale(amax, _E4M3_MAX)
            for j in range(PER_LANE1):
                c = t * TILE + lane + WARP_SIZE * j
                if c < N:
                    codes[r, c] = POISON_CODE if inv != inv else encode(vals[j] * inv)
            if lane == 0:
                scales[r, t] = s
            w += cuda.gridsize(1) // WARP_SIZE

    return rmsnorm_bias_kernel1, tile_quantize_kernel1


# ----------------------------------------------------------------------------------------------------------------
# Version 2: fused, the row in registers
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit(device=True)
def load4_row(a, i, c, N, vec, inside):
    """a[i, c:c+4] as four float32, zeros past N.

    vec (N % 4 == 0, 16-byte aligned rows): one 16-byte load; where the caller knows the float4 is inside the row
    (`inside`, a constant once loops are unrolled) from a constant offset, else from a clamped address (c past N
    reads the row's last float4 again) followed by a select. No branch either way, so the compiler can issue all of
    a thread's loads back to back. Not vec: common.load4 (scalar loads, bounds checked)."""
    if vec:
        if inside:
            return ld_global_v4_f32(a, i, c)
        ok = c < N
        v0, v1, v2, v3 = ld_global_v4_f32(a, i, c if ok else N - 4)
        return (v0 if ok else _ZERO), (v1 if ok else _ZERO), (v2 if ok else _ZERO), (v3 if ok else _ZERO)
    return load4(a, i, c, i + 1, N, 0)


@cuda.jit(device=True)
def sum_squares(y, bv, nvals, has_bias):
    """y += b in this thread's registers (when there is a bias), then the thread's sum of y^2 (versions 2 and 3)."""
    if has_bias:
        for i in range(nvals):
            y[i] += bv[i]
    ss = _ZERO
    for i in range(nvals):
        ss += y[i] * y[i]
    return ss


@cuda.jit(device=True)
def normalize_set(y, i0, r, gv):
    """One tile set of a lane (versions 2 and 3): z = y * rstd * g in place of y[i0 : i0 + SET_VALUES], the tile's amax
    over its 8 lanes by xor-shuffles, and its (scale, inv); a NaN or +-Inf z makes the amax NaN (z * 0 is NaN then),
    which poisons the tile."""
    amax = _ZERO
    bad = _ZERO
    for j in range(SET_VALUES):
        y[i0 + j] = y[i0 + j] * r * gv[j]
        amax = max(amax, abs(y[i0 + j]))  # a plain max: NaN is caught by `bad`
        bad += y[i0 + j] * _ZERO
    amax += bad
    off = LANES // 2
    while off > 0:  # xor partners stay inside the tile's 8 lanes
        amax = nanmax(amax, shfl_xor_sync(FULL_MASK, amax, off))
        off //= 2
    return amax_scale(amax, _E4M3_MAX)


_CVT_E4M3X2 = CVT_X2["e4m3"]
_POISON4 = np.uint32(POISON_CODE * 0x01010101)


@cuda.jit(device=True)
def pack4(z0, z1, z2, z3):
    """Four E4M3 codes in a little-endian uint32 (z0 in the low byte): two cvt.rn.satfinite.e4m3x2.f32."""
    return np.uint32(_CVT_E4M3X2(z1, z0)) | (np.uint32(_CVT_E4M3X2(z3, z2)) << np.uint32(16))


@cuda.jit(device=True)
def pack_set(y, i0, inv):
    """A lane's 16 codes of a set (z in y[i0 : i0 + 16], times inv) as four uint32 words, or four poisoned words
    when inv is NaN (versions 3 and 4; all four words before any store, which takes fewer registers)."""
    if inv != inv:
        return _POISON4, _POISON4, _POISON4, _POISON4
    return (pack4(y[i0] * inv, y[i0 + 1] * inv, y[i0 + 2] * inv, y[i0 + 3] * inv),
            pack4(y[i0 + 4] * inv, y[i0 + 5] * inv, y[i0 + 6] * inv, y[i0 + 7] * inv),
            pack4(y[i0 + 8] * inv, y[i0 + 9] * inv, y[i0 + 10] * inv, y[i0 + 11] * inv),
            pack4(y[i0 + 12] * inv, y[i0 + 13] * inv, y[i0 + 14] * inv, y[i0 + 15] * inv))


def make_forward_kernel2(warps: int, sets: int, has_bias: bool, write_z: bool, vec: int):
    """Version 2 for blocks of `warps` warps, each holding up to `sets` tile sets of a row; bias, z output and
    16-byte access compiled in. With the block size a constant, every load's offset from the thread's first
    address is a constant too: one address register per array, not one per load."""
    cvt_x2 = CVT_X2["e4m3"]
    nvals = sets * SET_VALUES
    nbias = nvals if has_bias else 1
    poison4 = np.uint32(POISON_CODE * 0x01010101)

    @cuda.jit
    def norm_quant_kernel2(x, b, g, codes, codes4, scales, rstd, z):
        """b and g are (1, N) views, so that they are read 16 bytes at a time too; codes4 is codes viewed as uint32
        (M, N/4) where vec (else unused).

        Sets s < sets - 1 of every warp are whole sets of whole tiles (sets = ceil(row's sets / warps)), so only
        the last one needs bounds."""
        y = cuda.local.array(nvals, np.float32)  # registers: every index is a constant once loops are unrolled
        bv = cuda.local.array(nbias, np.float32)
        gv = cuda.local.array(SET_VALUES, np.float32)
        slots = cuda.shared.array(32, np.float32)
        N = x.shape[1]
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        warp = cuda.threadIdx.x // WARP_SIZE
        sub = lane // LANES  # which tile of the set
        gl = lane % LANES  # lane within the tile
        m = cuda.blockIdx.x
        first = (warp * TILES_PER_SET + sub) * TILE + gl * 4  # the thread's first element in set 0
        # 1. the row (and b, from L2) into registers: every load issued before any value is used
        for s in range(sets):
            for q in range(4):
                i = s * SET_VALUES + 4 * q
                c = first + s * warps * TILES_PER_SET * TILE + q * LANES * 4
                y[i], y[i + 1], y[i + 2], y[i + 3] = load4_row(x, m, c, N, vec, s < sets - 1)
                if has_bias:
                    bv[i], bv[i + 1], bv[i + 2], bv[i + 3] = load4_row(b, 0, c, N, vec, s < sets - 1)
        # 2. rstd (elements past N are 0)
        ss = block_sum(sum_squares(y, bv, nvals, has_bias), slots)
        r = np.float32(_ONE / math.sqrt(ss / np.float32(N) + EPS))
        if cuda.threadIdx.x == 0:
            rstd[m] = r
        # 3. z, tile amax, scale, codes, one set at a time
        for s in range(sets):
            ts = warp + s * warps
            if ts * TILES_PER_SET < ntiles:  # warp-uniform: all 32 lanes reach the shuffles
                tk = ts * TILES_PER_SET + sub
                c0 = first + s * warps * TILES_PER_SET * TILE
                for q in range(4):  # g (L1/L2 hits) for the whole set first
                    gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = load4_row(
                        g, 0, c0 + q * LANES * 4, N, vec, s < sets - 1)
                scale, inv = normalize_set(y, s * SET_VALUES, r, gv)  # z replaces y in the registers
                if tk < ntiles:
                    for q in range(4):
                        c = c0 + q * LANES * 4
                        i = s * SET_VALUES + 4 * q
                        if c < N:
                            word = poison4
                            if inv == inv:
                                lo = cvt_x2(y[i + 1] * inv, y[i] * inv)  # element c in the low byte
                                hi = cvt_x2(y[i + 3] * inv, y[i + 2] * inv)
                                word = np.uint32(lo) | (np.uint32(hi) << np.uint32(16))
                            if vec:
                                codes4[m, c // 4] = word  # little-endian: byte e of the word is element c + e
                            for e in range(4):
                                if not vec and c + e < N:
                                    codes[m, c + e] = np.uint8((word >> np.uint32(8 * e)) & np.uint32(0xFF))
                                if write_z and c + e < N:
                                    z[m, c + e] = y[i + e]
                    if gl == 0:
                        scales[m, tk] = scale

    return norm_quant_kernel2


# ----------------------------------------------------------------------------------------------------------------
# Version 3: persistent blocks stream rows through a shared-memory ring (cp.async), b and g kept beside it
# ----------------------------------------------------------------------------------------------------------------

STAGES3 = 3  # version 3: rows a block's ring holds (stages - 1 in flight while one is used)
STAGES3_BIAS = 2  # with a bias: a ring of 2 rows, then b and g kept in shared memory (4 rows' room in all)
L2_AHEAD3 = 2  # version 3 with a bias: rows past the ring's that a block asks L2 for (none without a bias)
MAX_SHARED3 = 227 * 1024  # dynamic shared memory a block may have on sm_90; a larger ring runs version 2
SIM_RESIDENT = 2  # version 3 under the simulator: 2 blocks, so that each takes several rows around its ring
_F32T = runtime.numba_type("float32")  # dynamic shared arrays take numba's type on both backends


def forward_warps3(N: int) -> tuple[int, int]:
    """Version 3's (warps, sets) for rows of N elements: one tile set per thread up to 32 warps (N = 16384), more
    sets each beyond."""
    nsets = -(-(-(-N // TILE)) // TILES_PER_SET)
    warps = min(MAX_THREADS // WARP_SIZE, nsets)
    return warps, -(-nsets // warps)


def ring3(has_bias: bool) -> tuple[int, int]:
    """Version 3's (rows in the ring, rows' worth of b and g kept after it): (3, 0) without a bias, (2, 2) with."""
    return (STAGES3_BIAS, 2) if has_bias else (STAGES3, 0)


def make_forward_kernel3(warps: int, sets: int, has_bias: bool, write_z: bool, exact: int):
    """Version 3 for blocks of `warps` warps, each thread holding up to `sets` tile sets of a row (version 2's
    layout); rows 16-byte aligned with N % 4 == 0 (cp.async copies 16 aligned bytes). exact: the layout covers the
    row exactly (N = warps * sets * 512), so no access needs a bound: each one base address plus a constant."""
    nvals = sets * SET_VALUES
    nbias = nvals if has_bias else 1
    set_stride = warps * TILES_PER_SET * TILE  # elements between a thread's sets
    set_words = set_stride // 4
    span = sets * set_stride  # floats of one ring stage (the block's layout of a row)
    load_bg = ptx.ld_global_nc_v4_f32  # volatile: loaded per row, not hoisted out of the row loop into registers
    stages = ring3(has_bias)[0]
    bo = stages * span  # with a bias: where b is kept, then g
    go = bo + span
    wait = ptx.cp_async_wait_group(stages - 1)
    ld_smem = ptx.ld_shared_v4_f32_1d
    cp16 = ptx.cp_async_16
    commit = ptx.cp_async_commit
    prefetch = ptx.prefetch_l2_bulk
    ahead = L2_AHEAD3 if has_bias else 0  # measured: without a bias the prefetches cost more than they bring
    q_step = LANES * 4  # elements between a lane's float4s in a tile

    @cuda.jit(device=True)
    def load_row(a, c, N, inside):
        """a[0, c:c+4] through the read-only path, zeros past N (load4_row's clamp and select)."""
        if inside:
            return load_bg(a, 0, c)
        ok = c < N
        v0, v1, v2, v3 = load_bg(a, 0, c if ok else N - 4)
        return (v0 if ok else _ZERO), (v1 if ok else _ZERO), (v2 if ok else _ZERO), (v3 if ok else _ZERO)

    @cuda.jit
    def norm_quant_kernel3(x, xb, b, g, codes4, scales, rstd, z):
        """x (M, N), xb the same as bytes (for cp.async); b, g (1, N) views; codes4 codes as uint32 (M, N/4).
        Block k takes rows k, k + grid, k + 2 grid, ..."""
        y = cuda.local.array(nvals, np.float32)  # registers: constant indices once loops are unrolled
        bv = cuda.local.array(nbias, np.float32)
        gv = cuda.local.array(SET_VALUES, np.float32)
        slots = cuda.shared.array((2, 32), np.float32)  # two buffers: one barrier per row
        ring = cuda.shared.array(0, _F32T)  # stages x span floats, then b and g with a bias
        M, N = x.shape
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        warp = cuda.threadIdx.x // WARP_SIZE
        sub = lane // LANES
        gl = lane % LANES
        tile0 = warp * TILES_PER_SET + sub
        first = tile0 * TILE + gl * 4  # the thread's first element: then + s * set_stride + q * q_step
        fw = tile0 * (TILE // 4) + gl  # the same as a word of codes4: then + s * set_words + q * LANES
        grid = cuda.gridDim.x
        m = cuda.blockIdx.x
        if ahead > 0 and cuda.threadIdx.x == 0:
            for p in range(stages - 1, stages - 1 + ahead):  # the rows after the ring's first ones
                pr = m + p * grid
                if pr < M:
                    prefetch(x, pr, 0, N * 4)
        for p in range(stages - 1):  # prologue: the first stages - 1 rows in flight
            pr = m + p * grid
            for s in range(sets):
                for q in range(4):
                    c = first + s * set_stride + q * q_step
                    ok = exact or c < N  # else zero-filled: zeros past N, as version 2's registers
                    cp16(ring, (p * span + c) * 4, xb, pr if pr < M else 0, (c if ok else 0) * 4,
                         16 if ok and pr < M else 0)
            commit()
        if has_bias:  # each thread keeps the float4s of b and g it reads: its own, so no barrier
            for s in range(sets):
                for q in range(4):
                    k = first + s * set_stride + q * q_step
                    ring[bo + k], ring[bo + k + 1], ring[bo + k + 2], ring[bo + k + 3] = load_row(
                        b, k, N, exact or s < sets - 1)
                    ring[go + k], ring[go + k + 1], ring[go + k + 2], ring[go + k + 3] = load_row(
                        g, k, N, exact or s < sets - 1)
        stage = 0
        par = 0
        while m < M:  # block-uniform: every thread reaches every barrier and shuffle
            if ahead > 0 and cuda.threadIdx.x == 0:
                pr = m + (stages - 1 + ahead) * grid
                if pr < M:
                    prefetch(x, pr, 0, N * 4)
            pr = m + (stages - 1) * grid  # the row stages - 1 ahead, into the stage read last time
            pst = stage - 1 if stage > 0 else stages - 1
            for s in range(sets):
                for q in range(4):
                    c = first + s * set_stride + q * q_step
                    ok = exact or c < N
                    cp16(ring, (pst * span + c) * 4, xb, pr if pr < M else 0, (c if ok else 0) * 4,
                         16 if ok and pr < M else 0)
            commit()
            wait()  # this thread's copies of row m have landed (it reads only what it copied: no barrier)
            for s in range(sets):
                for q in range(4):
                    i = s * SET_VALUES + 4 * q
                    k = first + s * set_stride + q * q_step
                    y[i], y[i + 1], y[i + 2], y[i + 3] = ld_smem(ring, stage * span + k)
                    if has_bias:
                        bv[i], bv[i + 1], bv[i + 2], bv[i + 3] = ld_smem(ring, bo + k)
            # rstd: block_sum's order (warp_sum, then the warps' sums by warp_sum)
            ss = warp_sum(sum_squares(y, bv, nvals, has_bias))
            if warps > 1:
                if lane == 0:
                    slots[par, warp] = ss
                cuda.syncthreads()
                ss = warp_sum(slots[par, lane] if lane < warps else _ZERO)
                par ^= 1
            r = np.float32(_ONE / math.sqrt(ss / np.float32(N) + EPS))
            if cuda.threadIdx.x == 0:
                rstd[m] = r
            for s in range(sets):
                ts = warp + s * warps
                if exact or ts * TILES_PER_SET < ntiles:  # warp-uniform
                    tk = ts * TILES_PER_SET + sub
                    c0 = first + s * set_stride
                    for q in range(4):
                        if has_bias:
                            gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = ld_smem(ring, go + c0 + q * q_step)
                        else:
                            gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = load_row(
                                g, c0 + q * q_step, N, exact or s < sets - 1)
                    scale, inv = normalize_set(y, s * SET_VALUES, r, gv)
                    i0 = s * SET_VALUES
                    w0, w1, w2, w3 = pack_set(y, i0, inv)
                    mu = np.uint64(m)  # unsigned indices: no negative-index wrap-around code
                    if exact or tk < ntiles:
                        for q in range(4):
                            c = c0 + q * q_step
                            i = i0 + 4 * q
                            if exact or c < N:
                                word = w0 if q == 0 else w1 if q == 1 else w2 if q == 2 else w3
                                codes4[mu, np.uint64(fw + s * set_words + q * LANES)] = word
                                if write_z:
                                    for e in range(4):
                                        z[mu, np.uint64(c + e)] = y[i + e]
                        if gl == 0:
                            scales[mu, np.uint64(tk)] = scale
            m += grid
            stage = stage + 1 if stage < stages - 1 else 0

    return norm_quant_kernel3


# ----------------------------------------------------------------------------------------------------------------
# Version 4: narrow rows, one warp per row, several rows per block, b and g staged in shared memory
# ----------------------------------------------------------------------------------------------------------------

ROWS4 = 2 if runtime.IS_SIM else 8  # version 4: rows (warps) per block (the simulator: fewer Python threads)
MAX_SETS4 = 4  # version 4 takes rows of up to 4 tile sets (N <= 2048: 64 floats a lane); wider rows run version 3


def make_forward_kernel4(rows: int, sets: int, has_bias: bool, write_z: bool, exact: int):
    """Version 4 for blocks of `rows` warps, warp w taking row blockIdx * rows + w whole (up to `sets` tile sets a
    lane, version 2's layout with one warp); rows 16-byte aligned with N % 4 == 0. exact: N = sets * 512, so no
    access needs a bound."""
    nvals = sets * SET_VALUES
    nbias = nvals if has_bias else 1
    set_stride = TILES_PER_SET * TILE  # one warp covers the row: 512 elements between a lane's sets
    span = sets * set_stride
    nsb = span if has_bias else 1
    ld_smem = ptx.ld_shared_v4_f32_1d
    q_step = LANES * 4
    stage_step = rows * WARP_SIZE * 4  # floats of b and g the block stages per pass

    @cuda.jit
    def norm_quant_kernel4(x, b, g, codes4, scales, rstd, z):
        """b, g (1, N) views; codes4 codes as uint32 (M, N/4). The block's warps share b and g in shared memory;
        nothing else is shared, so the one barrier is the staging's."""
        y = cuda.local.array(nvals, np.float32)  # registers (constant indices once loops are unrolled)
        bv = cuda.local.array(nbias, np.float32)
        gv = cuda.local.array(SET_VALUES, np.float32)
        sb = cuda.shared.array(nsb, np.float32)
        sg = cuda.shared.array(span, np.float32)
        M, N = x.shape
        ntiles = scales.shape[1]
        lane = cuda.threadIdx.x % WARP_SIZE
        sub = lane // LANES
        gl = lane % LANES
        first = sub * TILE + gl * 4  # the lane's first element: then + s * set_stride + q * q_step
        fw = sub * (TILE // 4) + gl  # the same as a word of codes4
        m = cuda.blockIdx.x * rows + cuda.threadIdx.x // WARP_SIZE
        mr = m if m < M else M - 1  # a warp past the last row loads one anyway and stores nothing (no branch)
        # 1. the row into registers: every load issued before any value is used
        for s in range(sets):
            for q in range(4):
                i = s * SET_VALUES + 4 * q
                y[i], y[i + 1], y[i + 2], y[i + 3] = load4_row(x, mr, first + s * set_stride + q * q_step, N, 1,
                                                               exact or s < sets - 1)
        # 2. meanwhile the block stages b and g (zeros past N) in shared memory, once for its `rows` rows
        for k0 in range(0, span, stage_step):
            k = k0 + cuda.threadIdx.x * 4
            if k < span:
                if has_bias:
                    sb[k], sb[k + 1], sb[k + 2], sb[k + 3] = load4_row(b, 0, k, N, 1, exact)
                sg[k], sg[k + 1], sg[k + 2], sg[k + 3] = load4_row(g, 0, k, N, 1, exact)
        cuda.syncthreads()
        if m < M:  # warp-uniform
            if has_bias:
                for s in range(sets):
                    for q in range(4):
                        i = s * SET_VALUES + 4 * q
                        bv[i], bv[i + 1], bv[i + 2], bv[i + 3] = ld_smem(sb, first + s * set_stride + q * q_step)
            ss = warp_sum(sum_squares(y, bv, nvals, has_bias))  # the row's sum: one warp, no block reduction
            r = np.float32(_ONE / math.sqrt(ss / np.float32(N) + EPS))
            mu = np.uint64(m)  # unsigned indices: no negative-index wrap-around code
            if lane == 0:
                rstd[mu] = r
            for s in range(sets):
                if exact or s * TILES_PER_SET < ntiles:  # warp-uniform
                    c0 = first + s * set_stride
                    for q in range(4):
                        gv[4 * q], gv[4 * q + 1], gv[4 * q + 2], gv[4 * q + 3] = ld_smem(sg, c0 + q * q_step)
                    scale, inv = normalize_set(y, s * SET_VALUES, r, gv)  # z replaces y in the registers
                    i0 = s * SET_VALUES
                    w0, w1, w2, w3 = pack_set(y, i0, inv)
                    tk = s * TILES_PER_SET + sub
                    if exact or tk < ntiles:
                        for q in range(4):
                            c = c0 + q * q_step
                            if exact or c < N:
                                word = w0 if q == 0 else w1 if q == 1 else w2 if q == 2 else w3
                                codes4[mu, np.uint64(fw + s * (set_stride // 4) + q * LANES)] = word
                                if write_z:
                                    for e in range(4):
                                        z[mu, np.uint64(c + e)] = y[i0 + 4 * q + e]
                        if gl == 0:
                            scales[mu, np.uint64(tk)] = scale

    return norm_quant_kernel4


_RESIDENT: dict = {}


def _resident_blocks(kernel, threads: int, smem: int, args) -> int:
    """Blocks of `kernel` that fit on the GPU at once (the driver's occupancy calculator, with smem bytes of
    dynamic shared memory; asked once per kernel and size); SIM_RESIDENT under the simulator."""
    if runtime.IS_SIM:
        return SIM_RESIDENT
    compiled = kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    key = (id(compiled), threads, smem)
    if key not in _RESIDENT:
        runtime.allow_dynamic_shared(kernel, args, smem)  # above 48 KiB the query needs the opt-in too
        _RESIDENT[key] = max(1, compiled.max_cooperative_grid_blocks(threads, smem))
    return _RESIDENT[key]


# ----------------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------------


def make_backward_kernel(threads: int, per_thread: int, has_bias: bool):
    """The backward for blocks of `threads` threads, each holding up to `per_thread` elements of a row (element
    n = thread + k * threads); bias compiled in. The block size is a constant, so every load's offset from the
    thread's first address is a constant too, and only the last k can fall past N (per_thread = ceil(N / threads))."""

    @cuda.jit
    def norm_quant_backward_kernel(dz, x, b, g, rstd, dx, gy):
        ys = cuda.local.array(per_thread, np.float32)  # registers (constant indices once unrolled)
        dzs = cuda.local.array(per_thread, np.float32)
        slots = cuda.shared.array(32, np.float32)
        N = x.shape[1]
        # Unsigned indices: numba adds no negative-index wrap-around, so x[m, tid + k * threads] is one base address
        # plus a constant offset per k.
        tid = np.uint64(cuda.threadIdx.x)
        m = np.uint64(cuda.blockIdx.x)
        nu = np.uint64(N)  # (comparing unsigned with signed integers would go through float64)
        last = tid + np.uint64((per_thread - 1) * threads)
        ok = last < nu
        nl = last if ok else nu - np.uint64(1)  # the last k reads from a clamped index, then selects: no branch
        # all loads issued before any value is used
        for k in range(per_thread - 1):
            ys[k] = x[m, tid + np.uint64(k * threads)]
            dzs[k] = dz[m, tid + np.uint64(k * threads)]
        v = x[m, nl]
        d = dz[m, nl]
        ys[per_thread - 1] = v if ok else _ZERO
        dzs[per_thread - 1] = d if ok else _ZERO
        if has_bias:
            for k in range(per_thread - 1):
                ys[k] += b[tid + np.uint64(k * threads)]
            bn = b[nl]
            ys[per_thread - 1] += bn if ok else _ZERO
        dot = _ZERO
        for k in range(per_thread - 1):
            dot += dzs[k] * g[tid + np.uint64(k * threads)] * ys[k]
        gn = g[nl]
        dot += dzs[per_thread - 1] * (gn if ok else _ZERO) * ys[per_thread - 1]
        dot = block_sum(dot, slots)
        r = rstd[m]
        c = r * r * r * dot / np.float32(N)
        for k in range(per_thread):
            n = tid + np.uint64(k * threads)
            if k < per_thread - 1 or ok:
                gn = g[n]
                dx[m, n] = r * gn * dzs[k] - c * ys[k]
                gy[m, n] = dzs[k] * ys[k] * r

    return norm_quant_backward_kernel


VERSIONS = {
    1: "unfused: row kernel writes z, warp-per-tile kernel reads it back and quantizes",
    2: "fused: one block per row, row in registers, 8 lanes per tile, codes written directly",
    3: "version 2's math in persistent blocks: rows stream through a cp.async shared-memory ring, b and g beside it",
    4: "narrow rows: one warp per row, 8 rows a block sharing b and g in shared memory; wider rows run version 3",
}
BEST = 4  # the fastest at N = 1024 and 2048 (warp per row) and at 7168 with a bias (version 3's ring)


# ----------------------------------------------------------------------------------------------------------------
# Launchers: device arrays in, device arrays out (the caller allocates once; nothing is allocated per call except
# version 1's scratch z when none is given)
# ----------------------------------------------------------------------------------------------------------------


def _on_device(name: str, a) -> None:
    if not V.is_device_array(a):
        raise TypeError(f"{name} must be a CUDA device array (cuda.to_device, cuda.device_array; norm_quantize takes "
                        f"NumPy arrays), got {V.describe(a)}")


def _device(name: str, a, dtype, shape) -> None:
    """A TypeError/ValueError naming `name` unless a is a device array of dtype and shape (cheap: called per launch)."""
    _on_device(name, a)
    if a.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {V.describe(a)}")
    if tuple(a.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {V.describe(a)}")


def _check_x(x, name: str = "x") -> tuple[int, int]:
    _on_device(name, x)
    if x.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {V.describe(x)}")
    if x.ndim != 2 or 0 in x.shape:
        raise ValueError(f"{name} must be 2-D (M, N) with M, N > 0, got {V.describe(x)}")
    return tuple(x.shape)


def _check_threads(threads):
    if threads is None:
        return None
    if isinstance(threads, (bool, np.bool_)) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be None or a multiple of 32 up to {MAX_THREADS}, got {V.describe(threads)}")
    if threads <= 0 or threads % WARP_SIZE or threads > MAX_THREADS:
        raise ValueError(f"threads must be None or a multiple of 32 up to {MAX_THREADS}, got {threads}")
    return int(threads)


def forward_warps(N: int) -> int:
    """Version 2's warps per row block for rows of N elements: enough that a thread holds at most SETS_PER_WARP
    sets, up to FIT_THREADS threads (N = 16384); longer rows get ANY_THREADS threads holding more sets each."""
    nsets = -(-(-(-N // TILE)) // TILES_PER_SET)
    warps = max(MIN_WARPS, -(-nsets // SETS_PER_WARP))
    return warps if warps * WARP_SIZE <= FIT_THREADS else ANY_THREADS // WARP_SIZE


def backward_threads(N: int) -> int:
    """The backward's threads per row block: enough that a thread holds at most BWD_PER_THREAD elements, a
    multiple of 32, up to FIT_THREADS (N = 8192); longer rows get ANY_THREADS threads holding more each."""
    threads = max(MIN_WARPS * WARP_SIZE, -(-N // (BWD_PER_THREAD * WARP_SIZE)) * WARP_SIZE)
    return threads if threads <= FIT_THREADS else ANY_THREADS


def forward(x, b, g, codes, scales, rstd, z=None, *, version: int = BEST, threads: int | None = None) -> None:
    """Device arrays: x (M, N) float32, b (N,) float32 or None, g (N,) float32 (b and g contiguous) -> codes (M, N)
    uint8 E4M3, scales (M, ceil(N/128)) float32 (dequantization factors, 1x128 tiles), rstd (M,) float32, and z
    (M, N) float32 when z is given (version 1 allocates a scratch z when it is not). Nothing else is allocated.

    threads: threads per row block, a multiple of 32 (None: version 2 picks by N with `forward_warps`, version 3
    with `forward_warps3`, version 1 uses THREADS1); version 4: threads per block of rows, one warp each (None:
    ROWS4 rows). Blocks above ANY_THREADS threads may fail to launch when each thread holds many tile sets (too many
    registers for the block). Version 3 runs version 2 where its ring cannot be used: rows not 16-byte aligned or
    N % 4 != 0 (cp.async copies 16 aligned bytes), or a ring over MAX_SHARED3. Version 4 runs version 3 for rows
    over MAX_SETS4 tile sets (N > 2048), and version 2 where version 3 would (and below compute capability 9.0 with
    a bias, 8.0 without, which version 3 needs); `threads` then means that version's.
    """
    version = V.version("version", version, VERSIONS, default=BEST)
    threads = _check_threads(threads)
    M, N = _check_x(x)
    if b is not None:
        _device("b", b, np.float32, (N,))
    _device("g", g, np.float32, (N,))
    _device("codes", codes, np.uint8, (M, N))
    _device("scales", scales, np.float32, (M, -(-N // TILE)))
    _device("rstd", rstd, np.float32, (M,))
    if z is not None:
        _device("z", z, np.float32, (M, N))
    for name, a in (("b", b), ("g", g)):
        if a is not None and not a.is_c_contiguous():  # version 2 reads them as (1, N) views
            raise ValueError(f"{name} must be C-contiguous, got a strided {V.describe(a)}")
    has_bias = b is not None
    grid = M  # one block per row
    if version == 1:
        row_k, quant_k = runtime.cached(("norm_quant.forward1", has_bias), lambda: make_forward_kernels1(has_bias))
        if z is None:
            z = cuda.device_array((M, N), np.float32)
        row_k[grid, threads or THREADS1](x, b if has_bias else g, g, z, rstd)
        blocks = min(MAX_BLOCKS, -(-scales.size // QUANT_WARPS1))
        quant_k[blocks, QUANT_WARPS1 * WARP_SIZE](z, codes, scales)
        return
    b2 = (b if has_bias else g).reshape(1, N)  # (1, N) views: read 16 bytes at a time
    g2 = g.reshape(1, N)
    vec = int(vec_ok(x, 16) and vec_ok(g2, 16) and vec_ok(b2, 16) and vec_ok(codes, 4))
    write_z = z is not None
    sets4 = -(-N // (TILES_PER_SET * TILE))
    if version == 4 and vec and sets4 <= MAX_SETS4:
        rows = threads // WARP_SIZE if threads else ROWS4
        exact = int(sets4 * TILES_PER_SET * TILE == N)
        kernel = runtime.cached(("norm_quant.forward4", rows, sets4, has_bias, write_z, exact),
                                lambda: make_forward_kernel4(rows, sets4, has_bias, write_z, exact))
        kernel[-(-M // rows), rows * WARP_SIZE](x, b2, g2, codes.view(np.uint32), scales, rstd,
                                                 z if write_z else runtime.unused_array(np.float32))
        return
    cap = runtime.compute_capability() if vec and version == 4 else None  # None: the simulator, or not asked
    need = (9, 0) if has_bias else (8, 0)  # version 3's L2 prefetch (with a bias), its cp.async (without)
    if vec and (version == 3 or (version == 4 and (cap is None or cap >= need))):  # 4 runs 2 below `need`
        runtime.require_capability(f"cp.async{'.bulk.prefetch.L2 (rows with a bias)' if has_bias else ''}, which "
                                   f"needs compute capability {need[0]}.0 or newer", version, lambda cc: cc >= need)
        warps, sets = forward_warps3(N)
        if threads:
            warps = threads // WARP_SIZE
            sets = -(-(-(-scales.shape[1] // TILES_PER_SET)) // warps)
        smem = 4 * sum(ring3(has_bias)) * sets * warps * TILES_PER_SET * TILE
        if smem <= MAX_SHARED3:
            exact = int(warps * sets * TILES_PER_SET * TILE == N)
            kernel = runtime.cached(("norm_quant.forward3", warps, sets, has_bias, write_z, exact),
                                    lambda: make_forward_kernel3(warps, sets, has_bias, write_z, exact))
            args = (x, x.view(np.uint8), b2, g2, codes.view(np.uint32), scales, rstd,
                    z if write_z else runtime.unused_array(np.float32))
            blocks = min(M, _resident_blocks(kernel, warps * WARP_SIZE, smem, args))
            runtime.launch_with_shared(kernel, blocks, warps * WARP_SIZE, smem, *args)
            return
    warps = threads // WARP_SIZE if threads else forward_warps(N)
    sets = -(-(-(-scales.shape[1] // TILES_PER_SET)) // warps)
    kernel = runtime.cached(("norm_quant.forward2", warps, sets, has_bias, write_z, vec),
                            lambda: make_forward_kernel2(warps, sets, has_bias, write_z, vec))
    codes4 = codes.view(np.uint32) if vec else runtime.unused_array(np.uint32)
    kernel[grid, warps * WARP_SIZE](x, b2, g2, codes, codes4, scales, rstd,
                                    z if write_z else runtime.unused_array(np.float32))


def backward(dz, x, b, g, rstd, dx, gy, *, threads: int | None = None) -> None:
    """Device arrays: dz, x (M, N) float32, b (N,) float32 or None, g (N,), rstd (M,) (the forward's) -> dx (M, N)
    float32 (= dy, the gradient of y = x + b and of x) and gy = dz * y * rstd (M, N) float32. The caller sums
    columns: dg = sum over rows of gy, db = sum over rows of dx (elementwise.colsum).

    threads: threads per row block, a multiple of 32 (None: `backward_threads(N)`); as for `forward`, blocks above
    ANY_THREADS threads may fail to launch when each thread holds many elements.
    """
    threads = _check_threads(threads)
    M, N = _check_x(x)
    _device("dz", dz, np.float32, (M, N))
    if b is not None:
        _device("b", b, np.float32, (N,))
    _device("g", g, np.float32, (N,))
    _device("rstd", rstd, np.float32, (M,))
    _device("dx", dx, np.float32, (M, N))
    _device("gy", gy, np.float32, (M, N))
    threads = threads or backward_threads(N)
    per_thread = -(-N // threads)
    has_bias = b is not None
    kernel = runtime.cached(("norm_quant.backward", threads, per_thread, has_bias),
                            lambda: make_backward_kernel(threads, per_thread, has_bias))
    kernel[M, threads](dz, x, b if has_bias else g, g, rstd, dx, gy)


# ----------------------------------------------------------------------------------------------------------------
# Convenience: NumPy (or device) arrays in, fresh arrays out
# ----------------------------------------------------------------------------------------------------------------


def _operand(name: str, a, shape=None, ndim=None):
    """A float32 device array as it is, or a NumPy array (float16/32/64) copied to a float32 device array."""
    if V.is_device_array(a):
        return V.array(name, a, dtype=np.float32, ndim=ndim, shape=shape)
    arr = V.array(name, a, dtype=(np.float16, np.float32, np.float64), ndim=ndim, shape=shape, allow_device=False)
    return cuda.to_device(V.float32_host(name, arr))


def norm_quantize(x, b, g, *, version: int | None = None, return_z: bool = False):
    """(codes, scales, rstd), or (codes, scales, rstd, z) with return_z: `forward` on fresh outputs.

    x (M, N), b (N,) or None, g (N,): NumPy arrays (float16/32/64, converted to float32) or float32 device arrays.
    The results are NumPy arrays when x is a NumPy array, device arrays when it is a device array.
    """
    version = V.version("version", version, VERSIONS, default=BEST)
    return_z = V.boolean("return_z", return_z)
    on_device = V.is_device_array(x)
    x_d = _operand("x", x, ndim=2)
    M, N = x_d.shape
    b_d = None if b is None else _operand("b", b, shape=(N,))
    g_d = _operand("g", g, shape=(N,))
    codes = cuda.device_array((M, N), np.uint8)
    scales = cuda.device_array((M, -(-N // TILE)), np.float32)
    rstd = cuda.device_array(M, np.float32)
    z = cuda.device_array((M, N), np.float32) if return_z else None
    forward(x_d, b_d, g_d, codes, scales, rstd, z, version=version)
    out = (codes, scales, rstd) + ((z,) if return_z else ())
    return out if on_device else tuple(a.copy_to_host() for a in out)


def norm_quantize_backward(dz, x, b, g, rstd):
    """(dx, gy): `backward` on fresh outputs, NumPy arrays for a NumPy dz and device arrays for a device dz (inputs
    as for `norm_quantize`; rstd (M,) the forward's). db = dx.sum(axis=0) and dg = gy.sum(axis=0)."""
    on_device = V.is_device_array(dz)
    dz_d = _operand("dz", dz, ndim=2)
    M, N = dz_d.shape
    x_d = _operand("x", x, shape=(M, N))
    b_d = None if b is None else _operand("b", b, shape=(N,))
    g_d = _operand("g", g, shape=(N,))
    rstd_d = _operand("rstd", rstd, shape=(M,))
    dx = cuda.device_array((M, N), np.float32)
    gy = cuda.device_array((M, N), np.float32)
    backward(dz_d, x_d, b_d, g_d, rstd_d, dx, gy)
    return (dx, gy) if on_device else (dx.copy_to_host(), gy.copy_to_host())


# ----------------------------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------------------------


def _y(x, b) -> np.ndarray:
    """y = x + b in float32, the kernels' first rounding (x itself without a bias)."""
    x = np.asarray(x, np.float32)
    return x if b is None else x + np.asarray(b, np.float32)


def reference_rstd(x, b) -> np.ndarray:
    """rstd in float64 from the float32 y = x + b."""
    y = _y(x, b).astype(np.float64)
    return 1.0 / np.sqrt((y * y).mean(axis=1) + float(EPS))


def reference(x, b, g, rstd=None):
    """(codes, scales, rstd, z) of the forward: the spec of every version.

    rstd: the (M,) values to normalize with; None computes them in float64 (then rounded to float32). Given a
    kernel's rstd, every output is bit for bit the kernel's: z = (y * rstd) * g in float32 (y = x + b in float32),
    codes and scales = spec.quantize(z, "tile").
    """
    y = _y(x, b)
    rstd = np.asarray(reference_rstd(x, b) if rstd is None else rstd, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # a NaN/Inf row gives NaN z, as on the GPU
        z = (y * rstd[:, None]) * np.asarray(g, np.float32)
    codes, scales, _ = spec.quantize(z, "tile")
    return codes, scales, rstd, z


def reference_backward(dz, x, b, g, rstd=None):
    """(dx, gy) in float64 from the float32 y = x + b: dx = rstd g dz - rstd^3 y dot / N, gy = dz y rstd, with
    dot = sum_n dz g y per row. rstd: the forward's (None: float64 `reference_rstd`)."""
    y = _y(x, b).astype(np.float64)
    r = np.asarray(reference_rstd(x, b) if rstd is None else rstd, np.float64)[:, None]
    dz = np.asarray(dz, np.float64)
    g = np.asarray(g, np.float64)
    dot = (dz * g * y).sum(axis=1, keepdims=True)
    return r * g * dz - r**3 * y * dot / y.shape[1], dz * y * r


def dx_error_scale(dz, x, b, g, rstd) -> np.ndarray:
    """(M, N) float64: |rstd g dz| + rstd^3 |y| sum_n |dz g y| / N, what dx's float32 rounding error is a few ulps
    of. dx is a difference of two terms each at most this large, and its dot is a float32 sum whose error is
    bounded by sum |dz g y| times (terms per thread + reduction levels) ulps; comparing dx against the reference
    relative to this scale keeps the check tight on rows of every magnitude, where cancellation makes dx itself
    small."""
    y = _y(x, b).astype(np.float64)
    r = np.asarray(rstd, np.float64)[:, None]
    dzg = np.abs(np.asarray(dz, np.float64) * np.asarray(g, np.float64))
    return r * dzg + r**3 * np.abs(y) * (dzg * np.abs(y)).sum(axis=1, keepdims=True) / y.shape[1]


# ----------------------------------------------------------------------------------------------------------------
# Check, then time (bench.main)
# ----------------------------------------------------------------------------------------------------------------

RSTD_RTOL = 1e-5
"""rstd against float64. The sum of squares is a float32 sum of positive terms, so its relative error is at most
(terms per thread + reduction levels) units of 2^-24: 64 (3.8e-6) at worst here (version 1, 128 threads, N = 7172),
half of that in rstd (a square root), plus four roundings (mean, eps, sqrt, division)."""
DX_TOL = 2.0**-17
"""dx against float64, relative to `dx_error_scale`: 128 units of 2^-24. For N up to 8192 the backward's dot is a
float32 sum of at most 16 terms per thread and 9 reduction levels (at most 25 units of sum |dz g y|), and each term
of dx adds a few roundings: about 40 units at worst."""
GY_RTOL = 2.0**-22
"""gy = (dz * y) * rstd: two float32 roundings, at most 2 units of 2^-24 relative to float64; 4 allowed."""

CHECK_SHAPES = {"sim": ((5, 300, True), (3, 129, False), (7, 1024, False)),
                "gpu": ((1027, 7172, True), (515, 1029, False), (1031, 7168, False), (2053, 1540, True))}
"""(M, N, bias) for the checks: the first N a multiple of 4 (16-byte path) but not of 128, the second not of 4
(scalar path; versions 3 and 4 run version 2), the third a row version 3's layout covers exactly (no bounds code),
with a NaN in row 1 (which poisons that row only); version 4's warp-per-row kernel runs the rows of N <= 2048 with
N % 4 == 0 (300 and 1024 under the simulator, 1540 on a GPU, where M is not a multiple of its 8 rows a block)."""
BENCH_SHAPES = ((4096, 512), (16384, 1024), (16384, 7168))
"""Timed shapes (M, N): the capstone's default step (4096 windows a step, width 512: 8 MiB of x, so launch and
ramp-up weigh), 16384 rows of width 1024 (issue 13's example of a realistic size) and of width 7168 (DeepSeek-V3's
hidden size)."""


def make_inputs(rng, M: int, N: int, bias: bool = True):
    """(x, b, g, dz) float32 with a spread of magnitudes: rows scaled by 10^[-3, 3], columns by 10^[-1, 1], 1% of
    the elements 50x larger (LLM-like outliers), gains of both signs; never all zero. b is None without bias."""
    row = 10.0 ** rng.uniform(-3, 3, (M, 1))
    col = 10.0 ** rng.uniform(-1, 1, N)
    x = rng.standard_normal((M, N)) * row * col
    x[rng.random((M, N)) < 0.01] *= 50
    b = (0.05 * rng.standard_normal(N)).astype(np.float32) if bias else None
    g = rng.uniform(0.25, 2.0, N) * np.where(rng.random(N) < 0.1, -1, 1)
    dz = rng.standard_normal((M, N)) * 10.0 ** rng.uniform(-2, 2, (M, 1))
    return x.astype(np.float32), b, g.astype(np.float32), dz.astype(np.float32)


def checks(rng) -> list:
    """Every version and the backward on CHECK_SHAPES, outputs poisoned: codes, scales and z bit for bit against
    `reference` given the kernel's rstd, rstd against float64 (a NaN row: NaN rstd and scales, poisoned codes), dx
    and gy against `reference_backward`."""
    out = []
    for k, (M, N, bias) in enumerate(CHECK_SHAPES["sim" if runtime.IS_SIM else "gpu"]):
        x, b, g, dz = make_inputs(rng, M, N, bias)
        nan_row = k == 2
        if nan_row:
            x[1, 7] = np.nan
        x_d, g_d = cuda.to_device(x), cuda.to_device(g)
        b_d = None if b is None else cuda.to_device(b)
        ref_r = reference_rstd(x, b)
        for v in VERSIONS:
            codes, scales = bench.poisoned((M, N), np.uint8), bench.poisoned((M, -(-N // TILE)), np.float32)
            rstd, z = bench.poisoned(M, np.float32), bench.poisoned((M, N), np.float32)
            forward(x_d, b_d, g_d, codes, scales, rstd, z, version=v)
            r = rstd.copy_to_host()
            bench.assert_close(f"v{v} rstd", r, ref_r, atol=0, rtol=RSTD_RTOL)
            ref_codes, ref_scales, _, ref_z = reference(x, b, g, r)
            bench.assert_codes_equal(f"v{v} codes", codes.copy_to_host(), ref_codes)
            assert np.array_equal(scales.copy_to_host(), ref_scales, equal_nan=True), f"v{v}: scales differ"
            assert np.array_equal(z.copy_to_host(), ref_z, equal_nan=True), f"v{v}: z differs"
            if nan_row:
                assert np.isnan(r[1]) and (codes.copy_to_host()[1] == POISON_CODE).all(), f"v{v}: NaN row"
            out.append((f"v{v} forward, {M}x{N}, {'bias' if bias else 'no bias'}{', a NaN row' if nan_row else ''}",
                        "codes, scales, z bit-exact; rstd within tolerance"))
        dx, gy = bench.poisoned((M, N), np.float32), bench.poisoned((M, N), np.float32)
        backward(cuda.to_device(dz), x_d, b_d, g_d, rstd, dx, gy)
        ref_dx, ref_gy = reference_backward(dz, x, b, g, r)
        scale = dx_error_scale(dz, x, b, g, r)
        bench.assert_close("backward dx", dx.copy_to_host() / scale, ref_dx / scale, atol=DX_TOL, rtol=0)
        bench.assert_close("backward gy", gy.copy_to_host(), ref_gy, atol=0, rtol=GY_RTOL)
        out.append((f"backward, {M}x{N}", "dx, gy within tolerance of float64"))
    return out


def torch_norm_quantize(torch, tx, tb, tg):
    """A straightforward PyTorch peer: bias add, RMSNorm, then DeepGEMM-style 1x128 tile quantization (N a multiple
    of 128): (codes as float8_e4m3fn, scales, rstd). Divisions by 448 go through a 0-dim tensor on the GPU
    (quantize_fine.torch_tile_quantize says why)."""
    y = tx + tb
    rstd = torch.rsqrt(y.square().mean(dim=1, keepdim=True) + float(EPS))
    z = y * rstd * tg
    M, N = z.shape
    zv = z.view(M, N // TILE, TILE)
    amax = zv.abs().amax(dim=2, keepdim=True).clamp(min=float(spec.AMAX_FLOOR))
    fp8_max = torch.full((), _E4M3_MAX, device=tx.device)
    codes = (zv * (fp8_max / amax)).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn).view(M, N)
    return codes, (amax / fp8_max).view(M, N // TILE), rstd


def timings(rng, args) -> list:
    """Every version, versions 2-4 without a bias too, version 2 with z also written, the backward and PyTorch
    on BENCH_SHAPES.
    Bytes that must move: forward x read, b and g read, codes, scales and rstd written (z too where written);
    backward dz and x read, b, g and rstd read, dx and gy written."""
    tables = []
    torch = bench.torch_cuda()
    for M, N in BENCH_SHAPES:
        x = rng.standard_normal((M, N), dtype=np.float32)
        x[rng.random((M, N)) < 0.01] *= 50
        b = (0.05 * rng.standard_normal(N)).astype(np.float32)
        g = rng.uniform(0.5, 1.5, N).astype(np.float32)
        dz = rng.standard_normal((M, N), dtype=np.float32)
        x_d, b_d, g_d, dz_d = (cuda.to_device(a) for a in (x, b, g, dz))
        codes = cuda.device_array((M, N), np.uint8)
        scales = cuda.device_array((M, N // TILE), np.float32)
        rstd, z = cuda.device_array(M, np.float32), cuda.device_array((M, N), np.float32)
        dx, gy = cuda.device_array((M, N), np.float32), cuda.device_array((M, N), np.float32)
        small = b.nbytes + g.nbytes + rstd.nbytes
        fwd_bytes = x.nbytes + codes.size + scales.nbytes + small
        rows = [bench.time_row(f"v1 forward: {VERSIONS[1]}",  # z: version 1's intermediate, allocated once
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, z, version=1), fwd_bytes,
                               launch=True),
                bench.time_row(f"v2 forward: {VERSIONS[2]}",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, version=2), fwd_bytes, launch=True),
                bench.time_row(f"v3 forward: {VERSIONS[3]}",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, version=3), fwd_bytes, launch=True),
                bench.time_row(f"v4 forward: {VERSIONS[4]}",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, version=4), fwd_bytes, launch=True),
                bench.time_row("v2 forward, no bias (bytes without b)",
                               lambda: forward(x_d, None, g_d, codes, scales, rstd, version=2), fwd_bytes - b.nbytes,
                               launch=True),
                bench.time_row("v3 forward, no bias (bytes without b)",
                               lambda: forward(x_d, None, g_d, codes, scales, rstd, version=3), fwd_bytes - b.nbytes,
                               launch=True),
                bench.time_row("v4 forward, no bias (bytes without b)",
                               lambda: forward(x_d, None, g_d, codes, scales, rstd, version=4), fwd_bytes - b.nbytes,
                               launch=True),
                bench.time_row("v2 forward, z also written (bytes include z)",
                               lambda: forward(x_d, b_d, g_d, codes, scales, rstd, z, version=2), fwd_bytes + z.nbytes,
                               launch=True),
                bench.time_row("backward: one block per row, y and dz in registers",
                               lambda: backward(dz_d, x_d, b_d, g_d, rstd, dx, gy), 4 * x.nbytes + small, launch=True)]
        if torch is not None:
            tx, tb, tg = (torch.from_numpy(a).cuda() for a in (x, b, g))
            tcodes, _, _ = torch_norm_quantize(torch, tx, tb, tg)
            forward(x_d, b_d, g_d, codes, scales, rstd, version=BEST)
            same = float((tcodes.view(torch.uint8).cpu().numpy() == codes.copy_to_host()).mean())
            rows.append(bench.time_row(f"torch: y, rsqrt, z, amax, .to(float8_e4m3fn) ({same:.2%} of codes equal)",
                                       lambda: torch_norm_quantize(torch, tx, tb, tg), fwd_bytes,
                                       timer=lambda fn: timing.torch_time_ms(torch, fn), launch=True))
        tables.append(bench.Table(f"bias + RMSNorm + 1x128 E4M3 quantize, x ({M}, {N}) float32; bytes = what must "
                                  "move (read + written)", "GB/s", rows, ceiling=bench.copy_ceiling_gbs(x.nbytes)))
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    main()
