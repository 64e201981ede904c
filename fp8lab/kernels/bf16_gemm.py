"""BF16 GEMM on the tensor cores, NT layout: y[m, n] = sum_k a[m, k] * b[n, k], float32 out, a (M, K) and b (N, K)
bfloat16 (FP32 accumulation).

The baseline DeepSeek-V3 compares its FP8 recipe against (arXiv 2412.19437, section 3.3): the same wgmma, the same
swizzled shared tiles and the same cp.async pipeline as fp8_gemm versions 5-6, with bfloat16 operands
(`wgmma.mma_async ... m64nNk16.f32.bf16.bf16`). A k-slice is 16 values of 2 bytes, 32 bytes: the FP8 kernels'
32-byte k-slice, so the tiles, descriptors and swizzle are byte for byte fp8_gemm's; a stage holds 64 values of K
(128 bytes) instead of 128. No scales, no promotion: one FP32 accumulator spans all of K.

Operands: float32 arrays are rounded to bfloat16 on the way in (round to nearest even: `to_bf16`), uint16 arrays
are bfloat16 bit patterns as they are. The kernels read the bits through a uint8 view (each row 2 K bytes).

version 1: wgmma m64n128k16 for 2 warpgroups (128 x 128 tiles), four cp.async stages, wait after each stage.
version 2: version 1 pipelined: stage k's wgmma run while stage k - 1's finish (wait_group 1), five stages.
version 3: version 2 with 128 x 256 tiles (two m64n128k16 per k-slice: 128 accumulators per thread), four stages.

`residual` (bf16_gemm, launch): the epilogue adds a float32 (M, N) array after the sum, y = residual + a b^T
(residual may be out: out += a b^T), compiled in per flag (`make_kernel(..., add=True)`): the default kernels have
no residual code. The kernel engine writes its residual stream this way (fp8lab.training.engine_kernels).

Other ops: `to_bf16(x, out=None, transpose=False)`: float32 (R, C) -> uint16 bfloat16 bits (R, C), or (C, R) for
transpose=True (one pass: the cast fused with the transpose, as DeepSeek-V3 fuses its FP8 cast, section 3.3.4);
`to_bf16_both(x)`: both layouts from one read of x; reference `reference_to_bf16`; `cast_launch` and
`cast_both_launch` are them without checks. `launch` is the GEMM without checks.

Under the simulator the wgmma twins sum in FP32 in k order: versions 1-3 are then bit-exact with `reference_in_order`.
On a GPU they are checked against float64 of the rounded inputs within `error_bound`. Run it:
`fp8lab bench bf16_gemm [--markdown]` (`python -m fp8lab.kernels.bf16_gemm`).
"""

from __future__ import annotations

import numpy as np

from .. import _validate as V
from .. import bench
from ..bench import timing
from ..device import ptx, runtime
from ..device.runtime import cuda
from ..numerics import formats
from .common import bf16_store_bits, load_swizzled_tile, make_store_wgmma, vec_ok
from .versions import Version, best, check_device

BM, BK_BYTES, THREADS = 128, 128, 256  # 128 rows per tile, stages of 128 bytes of K (64 values), 2 warpgroups
TILE_BYTES = 128 * BK_BYTES  # one 128-row operand tile of a stage
REGS = 64  # float32 accumulators per thread of an m64n128 wgmma
_U8 = runtime.numba_type("uint8")
_F0 = np.float32(0.0)


def _smem(bn: int, stages: int) -> int:
    return stages * (TILE_BYTES + bn * BK_BYTES) + 1024  # + slack to align the tiles to 1024 bytes (the swizzle)


def make_kernel(bn: int, stages: int, pipelined: bool, add: bool = False):
    """A bf16 GEMM kernel with bn-column tiles (128 or 256), `stages` shared stages, and (pipelined) stage k's wgmma
    issued before stage k - 1's are waited for. Grid (ceil(N / bn), ceil(M / 128)), 256 threads, _smem(bn, stages)
    bytes of dynamic shared memory; a and b are uint8 views of the bfloat16 bits (each row 2 K bytes). add=True: the
    epilogue adds the residual r (float32 (M, N), may be c): c = r + acc; add=False never reads r (pass c).

    A 256-column tile is two m64n128k16 per k-slice into two accumulator arrays of 64 (acc0: columns 0-127, acc1:
    128-255), not one m64n256k16 into 128: numba leaves a 128-element local array in local memory (ptxas reports a
    512-byte stack frame), and wgmma's accumulators must be registers."""
    two = bn == 256
    wgmma = ptx.wgmma_m64k16(128)
    fence = ptx.wgmma_fence(REGS)
    wait_all = ptx.wgmma_wait_group(0, REGS)
    wait_one = ptx.wgmma_wait_group(1, REGS)
    store = make_store_wgmma(128)
    store_add = make_store_wgmma(128, add=True)
    stage_bytes = TILE_BYTES + bn * BK_BYTES
    ahead = stages - 2 if pipelined else stages - 1  # stages copied ahead of the one the tensor cores read
    # copies of stage kt done; the non-pipelined loop has committed one group more (its load precedes the wait)
    wait_copies = ptx.cp_async_wait_group(ahead - 1 if pipelined else ahead)

    @cuda.jit(device=True)
    def load_stage(s, so, a, b, m0, n0, k0, M, N, Kb, vec, tid):
        """a's 128 rows and b's bn rows of bytes k0 .. k0 + 127, swizzled (b's 128-row tiles back to back)."""
        load_swizzled_tile(s, so, a, m0, k0, M, Kb, vec, tid)
        load_swizzled_tile(s, so + TILE_BYTES, b, n0, k0, N, Kb, vec, tid)
        if two:
            load_swizzled_tile(s, so + 2 * TILE_BYTES, b, n0 + 128, k0, N, Kb, vec, tid)

    @cuda.jit(device=True)
    def copy_stage(s, pad, a, b, m0, n0, ld, nk, M, N, Kb, vec, tid):
        """Stage ld (if K has it) into its slot, then commit one cp.async group, empty or not: wait_group counts
        groups, one per stage."""
        if ld < nk:
            load_stage(s, pad + (ld % stages) * stage_bytes, a, b, m0, n0, ld * BK_BYTES, M, N, Kb, vec, tid)
        ptx.cp_async_commit()

    @cuda.jit(device=True)
    def issue(acc0, acc1, s, base, so, wg, first):
        # 4 k-slices of 16 values (32 bytes: descriptor + 2) per stage; scale-d 0 only for the very first slice
        desc_a = ptx.smem_descriptor(base + so + wg * 64 * 128, 16, 1024, 1)
        desc_b = ptx.smem_descriptor(base + so + TILE_BYTES, 16, 1024, 1)
        desc_b1 = ptx.smem_descriptor(base + so + 2 * TILE_BYTES, 16, 1024, 1)
        fence(acc0)
        if two:
            fence(acc1)
        for kk in range(BK_BYTES // 32):
            wgmma(acc0, s, desc_a + 2 * kk, desc_b + 2 * kk, first + kk)
            if two:
                wgmma(acc1, s, desc_a + 2 * kk, desc_b1 + 2 * kk, first + kk)
        ptx.wgmma_commit_group()

    @cuda.jit(device=True)
    def wait(acc0, acc1, one):
        if one:
            wait_one(acc0)
            if two:
                wait_one(acc1)
        else:
            wait_all(acc0)
            if two:
                wait_all(acc1)

    @cuda.jit
    def bf16_gemm_kernel(a, b, c, r, vec):
        """Warpgroup wg computes rows 64 wg .. 64 wg + 63 of the block's 128 x bn tile (bn / 2 float32 accumulators
        per thread). Not pipelined (version 1): per stage copy ahead, wait for the copies, issue 4 wgmma, wait for
        them, barrier. Pipelined (2, 3): the wait for stage k's wgmma moves to stage k + 1 (wait_group 1), so the
        tensor cores always have the next stage queued; a stage is refilled two iterations after it was read."""
        smem = cuda.shared.array(0, _U8)
        acc0 = cuda.local.array(REGS, np.float32)
        acc1 = cuda.local.array(REGS, np.float32)
        M, Kb = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        wg, t = tid // 128, tid % 128
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * bn
        row0 = m0 + 64 * wg + 16 * (t // 32) + (t % 32) // 4  # this thread's rows: row0, row0 + 8
        base = ptx.shared_address(smem)
        pad = (1024 - base % 1024) % 1024  # the 128-byte swizzle repeats every 1024 bytes: align the tiles to it
        for o in range(REGS):
            acc0[o] = _F0
            acc1[o] = _F0
        nk = (Kb + BK_BYTES - 1) // BK_BYTES
        for st in range(ahead):
            copy_stage(smem, pad, a, b, m0, n0, st, nk, M, N, Kb, vec, tid)
        for kt in range(nk):
            if not pipelined:  # the slot of stage kt - 1, read and waited for, is free
                copy_stage(smem, pad, a, b, m0, n0, kt + ahead, nk, M, N, Kb, vec, tid)
            wait_copies()             # this thread's copies of stage kt have landed
            ptx.fence_proxy_async()   # ... and are visible to wgmma (which reads through the async proxy)
            cuda.syncthreads()        # ... and so are every thread's; pipelined: stage kt - 2's wgmma are done
            if pipelined:  # everyone passed the wait of iteration kt - 1: the slot of stage kt - 2 is free
                copy_stage(smem, pad, a, b, m0, n0, kt + ahead, nk, M, N, Kb, vec, tid)
            issue(acc0, acc1, smem, base, pad + (kt % stages) * stage_bytes, wg, kt * (BK_BYTES // 32))
            wait(acc0, acc1, pipelined)  # pipelined: stage kt - 1's wgmma are complete, stage kt's may still run
            if not pipelined:
                cuda.syncthreads()  # the stage is free for the copies of iteration kt + 1
        wait(acc0, acc1, False)
        if add:  # the residual added after the sum (compiled in)
            store_add(c, acc0, row0, n0, t % 4, M, N, r)
            if two:
                store_add(c, acc1, row0, n0 + 128, t % 4, M, N, r)
        else:
            store(c, acc0, row0, n0, t % 4, M, N)
            if two:
                store(c, acc1, row0, n0 + 128, t % 4, M, N)

    return bf16_gemm_kernel


def _launcher(bn: int, stages: int, pipelined: bool):
    def launch(a8, b8, out, stream=0, residual=None):
        vec = vec_ok(a8, 16) & vec_ok(b8, 16)
        add = residual is not None
        kernel = runtime.cached(("bf16_gemm", bn, stages, pipelined) + (("add",) if add else ()),
                                lambda: make_kernel(bn, stages, pipelined, add))
        M, N = out.shape
        grid = ((N + bn - 1) // bn, (M + BM - 1) // BM)
        runtime.launch_with_shared(kernel, grid, THREADS, _smem(bn, stages), a8, b8, out,
                                   out if residual is None else residual, vec, stream=stream)

    launch.bn, launch.stages, launch.pipelined = bn, stages, pipelined
    return launch


def _cost(b, bn=128):  # seconds under the simulator (M x N x K rounded up to the tile): docs/notes/simulator.md
    return runtime.SimCost(0.2, b, 0, tile=(128, bn, 64), names="M x N x K = ")


VERSIONS = {
    1: Version("wgmma m64n128k16, 128 x 128 tiles, 4 cp.async stages, wait after each stage", _launcher(128, 4, False),
               needs=ptx.WGMMA, traits={"tensor_cores"}, sim_cost=_cost(1.4e-7)),
    2: Version("version 1 pipelined: stage k's wgmma issued before stage k - 1's are waited for, 5 stages",
               _launcher(128, 5, True), needs=ptx.WGMMA, traits={"tensor_cores"}, sim_cost=_cost(1.3e-7)),
    3: Version("version 2 with 128 x 256 tiles (two m64n128k16 per k-slice, 128 accumulators per thread), 4 stages",
               _launcher(256, 4, True), needs=ptx.WGMMA, traits={"tensor_cores"}, sim_cost=_cost(7.5e-8, 256)),
}
BEST = 3
"""The default: the largest tiles, which read the fewest bytes per multiply (unmeasured: BENCHMARKS.md will say)."""


# ----------------------------------------------------------------------------------------------------------------
# The reference
# ----------------------------------------------------------------------------------------------------------------


def reference_to_bf16(x: np.ndarray, transpose: bool = False) -> np.ndarray:
    """uint16 bfloat16 bits of float32 x rounded to nearest even (formats.round_bf16), x.T's for transpose."""
    bits = formats.round_bf16(np.asarray(x, np.float32)).view(np.uint32) >> np.uint32(16)
    nan = np.isnan(x)  # a NaN whose payload sits in the low half keeps NaN-ness (the kernel sets the quiet bit)
    bits = np.where(nan, bits | np.uint32(0x40), bits).astype(np.uint16)
    return np.ascontiguousarray(bits.T if transpose else bits)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """float32 values of uint16 bfloat16 bits (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def reference(a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """float64 (M, N): the exact products of the bfloat16 operands summed in float64 (what the GEMM approximates)."""
    return bf16_values(a_bits).astype(np.float64) @ bf16_values(b_bits).astype(np.float64).T


def reference_in_order(a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """float32 (M, N): each output's K products (exact in float32: 8 + 8 significant bits) added in k order, one
    float32 rounding per addition: what the wgmma twins compute, bit for bit."""
    products = bf16_values(a_bits)[:, None, :] * bf16_values(b_bits)[None, :, :]
    return np.add.accumulate(products, axis=-1, dtype=np.float32)[..., -1]


def error_bound(a_bits: np.ndarray, b_bits: np.ndarray) -> np.ndarray:
    """A bound on |y - reference| for FP32 accumulation in any order: K units in the last place (2^-23 relative) of
    sum_k |a b|, doubled for an accumulator that truncates instead of rounding (the tensor core's adder is not
    documented). A wrong fragment or tile costs O(|a b|), far above it."""
    K = a_bits.shape[1]
    mag = np.abs(bf16_values(a_bits)).astype(np.float64) @ np.abs(bf16_values(b_bits)).astype(np.float64).T
    return 2.0 * max(K, 1) * 2.0**-23 * mag + np.finfo(np.float32).tiny


# ----------------------------------------------------------------------------------------------------------------
# The host API
# ----------------------------------------------------------------------------------------------------------------


@cuda.jit
def _to_bf16_kernel(x, out):
    """out = bfloat16 bits of x, grid-stride over the flat index."""
    i = cuda.grid(1)
    while i < x.size:
        out[i] = bf16_store_bits(x[i])
        i += cuda.gridsize(1)


_T = 32  # the transposing cast's tile: 32 x 32 through shared memory, 32 x 8 threads
_T_PADDED = 33  # _T + 1 columns: a column of the tile spans every bank (a literal: shared.array needs one)


@cuda.jit(device=True)
def _store_tile_transposed(tile, out_t, r0, c0, R, C, tx, ty):
    """The block's 32 x 32 tile of bfloat16 bits (tile[j, i] from x[r0 + j, c0 + i]) written along out_t's rows
    (out_t (C, R) = x^T), after a syncthreads."""
    cuda.syncthreads()
    for j in range(ty, _T, 8):
        if c0 + j < C and r0 + tx < R:
            out_t[c0 + j, r0 + tx] = tile[tx, j]


@cuda.jit
def _to_bf16_t_kernel(x, out):
    """out (C, R) = bfloat16 bits of x (R, C) transposed: a 32 x 32 tile read along x's rows and written along out's
    (both coalesced), the cast done once, between them, on the float32 value."""
    tile = cuda.shared.array((_T, _T_PADDED), np.uint16)
    R, C = x.shape
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * _T, cuda.blockIdx.x * _T
    for j in range(ty, _T, 8):
        if r0 + j < R and c0 + tx < C:
            tile[j, tx] = bf16_store_bits(x[r0 + j, c0 + tx])
    _store_tile_transposed(tile, out, r0, c0, R, C, tx, ty)


@cuda.jit
def _to_bf16_both_kernel(x, out, out_t):
    """out (R, C) and out_t (C, R) = bfloat16 bits of x (R, C) in both layouts from one read of x: each 32 x 32 tile
    cast once, written along out's rows at once and along out_t's rows through shared memory."""
    tile = cuda.shared.array((_T, _T_PADDED), np.uint16)
    R, C = x.shape
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * _T, cuda.blockIdx.x * _T
    for j in range(ty, _T, 8):
        if r0 + j < R and c0 + tx < C:
            v = bf16_store_bits(x[r0 + j, c0 + tx])
            tile[j, tx] = v
            out[r0 + j, c0 + tx] = v
    _store_tile_transposed(tile, out_t, r0, c0, R, C, tx, ty)


def to_bf16(x, out=None, transpose: bool = False):
    """uint16 bfloat16 bits of float32 x (R, C), rounded to nearest even: (R, C), or (C, R) with transpose=True
    (the cast and the transpose in one pass). NumPy in, NumPy out; a device array in, a device array out (or
    `out`, a uint16 device array of the result's shape). NaN stays NaN, values past bfloat16's range become +-Inf."""
    transpose = V.boolean("transpose", transpose)
    x = _contiguous("x", V.array("x", x, dtype=np.float32, ndim=2))
    R, C = x.shape
    shape = (C, R) if transpose else (R, C)
    if out is None:
        y = cuda.device_array(shape, np.uint16)
    else:
        y = V.array("out", out, dtype=np.uint16, shape=shape, writable=True)
        if not V.is_device_array(y):
            raise TypeError(f"out must be a device array, got {V.describe(out)}")
    cast_launch(runtime.to_device(x), y, transpose)  # V.array refuses empty arrays
    return y if (V.is_device_array(x) or out is not None) else y.copy_to_host()


def to_bf16_both(x, out=None, out_t=None):
    """(bits (R, C), bits_t (C, R)): to_bf16(x) and to_bf16(x, transpose=True) from one read of float32 x (R, C), as
    a GEMM whose operand is needed in both NT layouts (Dgrad's dy and Wgrad's dy^T) wants them. NumPy in, NumPy
    out; a device array in, device arrays out (or `out` / `out_t`: uint16 device arrays of those shapes)."""
    x = V.array("x", x, dtype=np.float32, ndim=2)
    R, C = x.shape
    ys = []
    for name, given, shape in (("out", out, (R, C)), ("out_t", out_t, (C, R))):
        if given is None:
            ys.append(cuda.device_array(shape, np.uint16))
            continue
        y = V.array(name, given, dtype=np.uint16, shape=shape, writable=True)
        if not V.is_device_array(y):
            raise TypeError(f"{name} must be a device array, got {V.describe(given)}")
        ys.append(y)
    cast_both_launch(runtime.to_device(x), *ys)
    if V.is_device_array(x) or out is not None or out_t is not None:
        return tuple(ys)
    return tuple(y.copy_to_host() for y in ys)


def cast_both_launch(x, out, out_t, stream=0) -> None:
    """to_bf16_both on device arrays (no checks): x float32 (R, C) C-contiguous, out uint16 (R, C), out_t (C, R)."""
    R, C = x.shape
    _to_bf16_both_kernel[((C + _T - 1) // _T, (R + _T - 1) // _T), (_T, 8), stream](x, out, out_t)


def cast_launch(x, out, transpose: bool = False, stream=0) -> None:
    """to_bf16 on device arrays (no checks): x float32 (R, C) C-contiguous, out uint16 (R, C) or (C, R)."""
    R, C = x.shape
    if transpose:
        _to_bf16_t_kernel[((C + _T - 1) // _T, (R + _T - 1) // _T), (_T, 8), stream](x, out)
    else:
        n = R * C
        blocks, threads = runtime.grid_1d(n, runtime.block_threads(256), runtime.MAX_BLOCKS)
        _to_bf16_kernel[blocks, threads, stream](x.reshape(n), out.reshape(n))


def _contiguous(name: str, x):
    """A device array as it is when C-contiguous (kernels read its rows flat), else a ValueError naming it; host arrays
    pass (runtime.to_device makes them contiguous)."""
    if V.is_device_array(x) and not x.is_c_contiguous():
        raise ValueError(f"{name}: a device array must be C-contiguous (its rows are read flat), got shape "
                         f"{tuple(x.shape)} with strides {x.strides}")
    return x


def _operand(name: str, x):
    """(device uint8 view of the bfloat16 bits (rows, 2 K), on the device already): float32 rounded here, uint16
    taken as bits."""
    x = _contiguous(name, V.array(name, x, dtype=(np.float32, np.uint16), ndim=2))  # values, or bfloat16 bits
    if np.dtype(x.dtype) == np.float32:  # one upload, the cast on the device
        bits = cuda.device_array(x.shape, np.uint16)
        cast_launch(runtime.to_device(x), bits)
    else:
        bits = runtime.to_device(x)
    return bits.view(np.uint8)


def best_version() -> int:
    """BEST where the device can run it (wgmma: sm_90) and under the simulator (the twins run); BEST too on a GPU
    that runs none of them, so that bf16_gemm's device check says what is missing."""
    return best(VERSIONS, BEST) if any(row.runs_here() for row in VERSIONS.values()) else BEST


def bf16_gemm(a, b, out=None, version=None, residual=None):
    """y = a @ b.T (+ residual) in float32 (M, N), bfloat16 inputs, FP32 accumulation, on the tensor cores (wgmma;
    sm_90).

    a (M, K), b (N, K): float32 arrays (rounded to bfloat16, nearest even, on the way in: `to_bf16`) or uint16
    arrays of bfloat16 bits; NumPy or device arrays. out: optional float32 (M, N) device array. version: 1..3
    (None: BEST). residual: optional float32 (M, N) array (NumPy or device) added in the epilogue after the whole sum,
    y = residual + a @ b.T with the bits of a separate add; it may be `out` itself (out += a @ b.T), every version
    has it. Returns a NumPy array for NumPy inputs, else the device array. NaN or Inf inputs give NaN or Inf in the
    outputs that use them."""
    a8, b8 = _operand("a", a), _operand("b", b)
    (M, Ka), (N, Kb) = a8.shape, b8.shape
    if Ka != Kb:
        raise ValueError(f"a and b must share K (their second dimension): got a {tuple(a.shape)}, b {tuple(b.shape)}")
    version = V.version("version", version, VERSIONS, default=best_version())
    check_device(VERSIONS, version)
    if out is None:
        y = cuda.device_array((M, N), np.float32)
    else:
        y = V.array("out", out, dtype=np.float32, shape=(M, N), writable=True)
        if not V.is_device_array(y):
            raise TypeError(f"out must be a device array, got {V.describe(out)}")
    if residual is not None:
        residual = runtime.to_device(V.array("residual", residual, dtype=np.float32, shape=(M, N)))
    runtime.sim_check("fl.bf16_gemm", (M, N, Ka // 2), VERSIONS[version].cost())
    launch(a8, b8, y, version, residual=residual)
    on_device = V.is_device_array(a) or V.is_device_array(b)
    return y if (on_device or out is not None) else y.copy_to_host()


def launch(a8, b8, out, version=BEST, stream=0, residual=None):
    """Launch on device arrays (no checks): a8 (M, 2 K), b8 (N, 2 K) uint8 views of bfloat16 bits, out (M, N)
    float32; residual: None, or a float32 (M, N) device array (may be out): out = residual + a b^T."""
    VERSIONS[version].kernel(a8, b8, out, stream=stream, residual=residual)


# ----------------------------------------------------------------------------------------------------------------
# The harness
# ----------------------------------------------------------------------------------------------------------------


def _random_bits(rng, rows, cols):
    return reference_to_bf16(rng.standard_normal((rows, cols), dtype=np.float32))


def checks(rng, only=None) -> list:
    """Every version (those in `only`) on fresh N(0, 1) operands of odd shapes, outputs poisoned: against
    `reference_in_order` bit for bit under the simulator, against float64 within `error_bound` on a GPU; both
    operand kinds (float32 rounded on the way in, uint16 bits); and `to_bf16` against its reference."""
    rows = []
    # K = 328: rows of 656 bytes, 16-byte aligned (cp.async), 6 stages (every slot refilled); K = 75: the byte path
    shapes = ((70, 140, 328, "uint16 bits"), (37, 130, 75, "float32")) if runtime.IS_SIM else \
        ((1000, 777, 1112, "uint16 bits"), (1000, 777, 1111, "float32"))
    for M, N, K, kind in shapes:
        a32 = rng.standard_normal((M, K), dtype=np.float32)
        b32 = rng.standard_normal((N, K), dtype=np.float32)
        a, b = reference_to_bf16(a32), reference_to_bf16(b32)
        ref64, bound = reference(a, b), error_bound(a, b)
        in_order = reference_in_order(a, b) if runtime.IS_SIM else None
        x, w = (a, b) if kind == "uint16 bits" else (a32, b32)
        for v in VERSIONS:
            if not bench.selected(only, v):
                continue
            out = bench.poisoned((M, N), np.float32)
            bf16_gemm(runtime.to_device(x), runtime.to_device(w), out=out, version=v)
            got = out.copy_to_host()
            label = f"v{v} {M}x{N}x{K}, {kind}"
            if np.isnan(got).any():
                raise AssertionError(f"{label}: NaN in the output (an element was not written)")
            err = np.abs(got - ref64)
            if not (err <= bound).all():
                raise AssertionError(f"{label}: error {err.max():.3g} above the FP32 accumulation bound")
            if in_order is not None:
                bench.assert_codes_equal(label + " vs reference_in_order", got.view(np.uint32),
                                         in_order.view(np.uint32))
            rel = np.linalg.norm(got - ref64) / np.linalg.norm(ref64)
            rows.append((label, ("bit-exact with the k-order reference; " if in_order is not None else "ok; ")
                         + f"normwise error vs float64 {rel:.2e}"))
    if bench.selected(only, "to_bf16"):
        x = rng.standard_normal((37, 45), dtype=np.float32) * np.float32(1e30)
        x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
        for transpose in (False, True):
            out = bench.poisoned((45, 37) if transpose else (37, 45), np.uint16)
            to_bf16(runtime.to_device(x), out=out, transpose=transpose)
            bench.assert_codes_equal(f"to_bf16 transpose={transpose}", out.copy_to_host(),
                                     reference_to_bf16(x, transpose))
        out, out_t = bench.poisoned((37, 45), np.uint16), bench.poisoned((45, 37), np.uint16)
        to_bf16_both(runtime.to_device(x), out=out, out_t=out_t)
        bench.assert_codes_equal("to_bf16_both", out.copy_to_host(), reference_to_bf16(x))
        bench.assert_codes_equal("to_bf16_both, transposed", out_t.copy_to_host(), reference_to_bf16(x, True))
        rows.append(("to_bf16 37x45, both layouts (and to_bf16_both), NaN/Inf/-0 and overflow", "bit-exact"))
    return rows


def timings(rng, args) -> list:
    """Every version at 4096^3 and 4096 x 7168 x 16384 (the FP8 GEMM's DeepSeek shape) against cuBLAS's BF16 GEMM
    (torch.mm on bfloat16) in the same run, each with its normwise error against cuBLAS's own float32 result; with
    args.only those versions only, no peers."""
    only = getattr(args, "only", None)
    torch = bench.torch_cuda()
    tables = []
    for M, N, K in ((4096, 4096, 4096), (4096, 7168, 16384)):
        flops = 2.0 * M * N * K
        a = cuda.to_device(_random_bits(rng, M, K))
        b = cuda.to_device(_random_bits(rng, N, K))
        out = cuda.device_array((M, N), np.float32)
        ref = None
        if torch is not None:
            ta = torch.as_tensor(a, device="cuda").view(torch.bfloat16)
            tb = torch.as_tensor(b, device="cuda").view(torch.bfloat16)
            tf32 = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False  # the reference in true float32
            ref = torch.mm(ta.float(), tb.float().t())
            torch.backends.cuda.matmul.allow_tf32 = tf32
            norm = torch.linalg.norm(ref).item()
        rows = []
        for v in VERSIONS:
            if not bench.selected(only, v):
                continue

            def run(v=v):
                return launch(a.view(np.uint8), b.view(np.uint8), out, v)
            ms = timing.time_ms(run, warmup=1, repeat=3)
            extra = {"normwise error vs fp32": "-"}
            if ref is not None:
                diff = torch.linalg.norm(torch.as_tensor(out, device="cuda") - ref).item()
                extra["normwise error vs fp32"] = f"{diff / norm:.2e}"
            rows.append(bench.Row(f"v{v}: {VERSIONS[v]}", ms, flops, extra))
        if not rows:
            continue
        ceiling = None
        if torch is not None and only is None:
            tc = torch.empty((M, N), device="cuda", dtype=torch.bfloat16)
            ms = timing.torch_time_ms(torch, lambda: torch.mm(ta, tb.t(), out=tc))
            rows.append(bench.Row("torch.mm on bfloat16, bfloat16 out (cuBLAS)", ms, flops, {
                "normwise error vs fp32": f"{torch.linalg.norm(tc.float() - ref).item() / norm:.2e}"}))
            ceiling = bench.rate(flops, ms, "TFLOP/s")
        tables.append(bench.Table(f"BF16 GEMM {M}x{N}x{K}, NT, float32 out", "TFLOP/s", rows, ceiling=ceiling,
                                  ceiling_label="cuBLAS BF16", peak_kind="bf16"))
        del a, b, out
        if torch is not None:
            del ref
            torch.cuda.empty_cache()
    return tables


def main(argv=None) -> int:
    return bench.main(__name__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
