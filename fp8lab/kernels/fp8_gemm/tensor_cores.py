"""fp8_gemm versions 4-7, on the tensor cores: codes staged in shared memory by cp.async, the tensor cores' partial
sum of each K-group of 128 promoted to FP32 registers on the CUDA cores, where its scales are applied (DeepSeek-V3's
promotion, arXiv 2412.19437, section 3.3.2).

version 4: mma.sync.m16n8k32 (inline PTX, fp8lab.device.ptx): 128 x 128 block tiles, 8 warps of 64 x 32 outputs;
           codes copied global -> shared by cp.async, three stages of one K-group in flight, rows padded to 144
           bytes; fragments loaded by ldmatrix. On sm_90 ptxas runs FP8 mma.sync as FP16 HMMA, which sums like FP32.
version 5: wgmma.mma_async m64n128k32 for 2 warpgroups (128 x 128 tiles), operands read by the tensor core from
           128-byte-swizzled shared memory through descriptors, four cp.async stages of one K-group each (128 KiB of
           dynamic shared memory), wait and promote after each K-group. The H200's wgmma keeps 13 mantissa bits
           inside a K-group (kernels/tc_accum.py measures it).
version 6: version 5 overlapped: two sets of partial sums alternate, K-group k + 1 is issued before K-group k is
           promoted (wgmma.wait_group 1), one barrier per K-group. Same arithmetic as version 5.
version 7: version 6 persistent: a grid of `sms` blocks, one per SM, each looping over output tiles (block i takes
           tiles i, i + sms, ...: DeepGEMM's num_sms), the same tile code (one device function for both), so the GEMM
           can leave SMs to other work, as DeepSeek-V3 gives 20 of 132 SMs to communication (section 3.2.2).

Under the simulator these run their twins (fp8lab.device.ptx), which sum each K-group in FP32 in k order: they are
then bit-exact with `reference`. On a GPU they are checked against float64 within `tensor_core_bound`.
"""

from __future__ import annotations

import numpy as np

from ...device import ptx, runtime
from ...device.runtime import cuda
from ...numerics.spec import GROUP_K
from ..common import copy16, load_swizzled_tile, make_store_wgmma, vec_ok

# Version 4 (mma.sync): 128 x 128 block tiles, 8 warps of 64 x 32, stages of one K-group (128 bytes of K),
# STAGES4 in flight; each shared row padded to 144 bytes so that the 8 rows an ldmatrix reads fall in 8
# different groups of 4 banks (144 bytes = 36 banks: row r starts at bank 4r mod 32).
BM4, BN4, BK4, THREADS4, STAGES4 = 128, 128, GROUP_K, 256, 3
ROW4 = BK4 + 16
STAGE4 = (BM4 + BN4) * ROW4
COPIES4 = BM4 * BK4 // 16 // THREADS4  # 16-byte copies per thread per operand and stage
SMEM4 = STAGES4 * STAGE4 + 128  # + alignment slack
# Version 5 (wgmma): 128 x 128 block tiles, 2 warpgroups of 64 x 128, stages of one K-group (128 bytes of K),
# STAGES5 in flight, 128-byte-swizzled tiles aligned to 1024 bytes.
BM5, BN5, BK5, THREADS5, STAGES5 = 128, 128, GROUP_K, 256, 4
TILE5 = 128 * BK5
STAGE5 = 2 * TILE5
SMEM5 = STAGES5 * STAGE5 + 1024
REGS5 = BN5 // 2  # float32 accumulators per thread of an m64n128 wgmma

_F0 = np.float32(0.0)
U8 = runtime.numba_type("uint8")  # dynamic shared arrays take a numba type (the simulator reads its itemsize)


@cuda.jit(device=True)
def _scale_at(s, kind, r, g):
    """The scale of row r (clamped by the caller) in K-group g: per tensor, per 1 x 128 tile, per 128 x 128 block."""
    if kind == 0:
        return s[0, 0]
    if kind == 1:
        return s[r, g]
    return s[r // GROUP_K, g]


@cuda.jit(device=True)
def _ldmatrix_into(frag, at, s, off):
    """frag[at : at + 4] = the four registers ldmatrix.x4 gives this lane for the rows at s[off:] (see version 4)."""
    x0, x1, x2, x3 = ptx.ldmatrix_x4(s, off)
    frag[at] = x0
    frag[at + 1] = x1
    frag[at + 2] = x2
    frag[at + 3] = x3


def make_wgmma_issue(fmt_a: str, fmt_b: str):
    """A device function issue(part, s, base, so, wg, scale0): the four wgmma m64n128k32 of one K-group whose a and
    b tiles sit at s[so:] and s[so + TILE5:] (warpgroup wg reads a's rows 64 wg..), committed as one group;
    scale-d = scale0 + kk, so scale0 = 0 starts `part` afresh (part = A B) and scale0 > 0 adds to it."""
    wgmma = ptx.wgmma_m64k32(BN5, fmt_a, fmt_b)
    fence = ptx.wgmma_fence(REGS5)

    @cuda.jit(device=True)
    def issue(part, s, base, so, wg, scale0):
        # K-major 128-byte-swizzled tiles: 8-row atoms of 128-byte rows, 1024 bytes apart (stride offset); the
        # leading offset is unused in this mode. A k-slice of 32 starts 32 bytes further (2 = 32 >> 4).
        desc_a = ptx.smem_descriptor(base + so + wg * 64 * 128, 16, 1024, 1)
        desc_b = ptx.smem_descriptor(base + so + TILE5, 16, 1024, 1)
        fence(part)
        for kk in range(BK5 // 32):
            wgmma(part, s, desc_a + 2 * kk, desc_b + 2 * kk, scale0 + kk)
        ptx.wgmma_commit_group()

    return issue


@cuda.jit(device=True)
def _promote_wgmma(part, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, g):
    """total += part * (sa * sb) for K-group g, in the wgmma m64n128 accumulator layout: this thread's rows row0 and
    row0 + 8 (registers 4j + 0, 1 and 4j + 2, 3), columns n0 + 8j + 2 t4 + (0, 1). With B per tensor or per
    128 x 128 block one scale serves the whole 128-column tile."""
    sr0 = _scale_at(sa, a_kind, min(row0, M - 1), g)
    sr1 = _scale_at(sa, a_kind, min(row0 + 8, M - 1), g)
    sbk = _scale_at(sb, b_kind, min(n0, N - 1), g)
    for j in range(BN5 // 8):
        for i in range(4):
            o = 4 * j + i
            sc = sbk
            if b_kind == 1:
                sc = _scale_at(sb, b_kind, min(n0 + 8 * j + 2 * t4 + i % 2, N - 1), g)
            total[o] += part[o] * ((sr0 if i < 2 else sr1) * sc)


_store_wgmma = make_store_wgmma(BN5)
"""This thread's 64 outputs of an m64n128 tile (the layout of _promote_wgmma), edges masked."""
_store_wgmma_add = make_store_wgmma(BN5, add=True)
"""_store_wgmma with a residual (the last argument r): c = r + total."""


def make_kernel4(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, promote: bool = True, add: bool = False):
    """Version 4 (mma.sync) for one pair of scale kinds and formats (compiled in). promote=False (per-tensor scales
    only, for the accumulator experiment): the partial sums stay in the tensor core's accumulator for all of K.
    add=True: the epilogue adds the residual r, c = r + total (r is not read otherwise: pass c)."""
    mma = ptx.mma_m16n8k32(fmt_a, fmt_b)
    wait_copies = ptx.cp_async_wait_group(STAGES4 - 1)

    @cuda.jit(device=True)
    def load_stage(s, off, x, r0, k0, rows, K, vec, tid):
        """x[r0 : r0 + 128, k0 : k0 + BK4] -> rows of ROW4 bytes at s[off:]: copies of 16 bytes, COPIES4 per thread."""
        for h in range(COPIES4):
            c = tid + THREADS4 * h
            r = c // (BK4 // 16)
            col = (c % (BK4 // 16)) * 16
            copy16(s, off + r * ROW4 + col, x, r0 + r, k0 + col, rows, K, vec)

    @cuda.jit
    def fp8_gemm_kernel4(a, sa, b, sb, c, res, vec):
        """Block 256 threads = 8 warps, grid (ceil(N/128), ceil(M/128)); warp w computes the 64 x 32 outputs at
        rows 64 (w % 2), columns 32 (w // 2) of the block's 128 x 128 tile as 4 x 4 mma.m16n8k32 tiles.

        Per stage of BK4 = 128 bytes of K (one K-group): every thread issues cp.async copies of 16 bytes (a and b
        slices), STAGES4 - 1 stages ahead; the warp loads its fragments with ldmatrix (4 for a, 2 for b per 32 of
        K) and issues 16 mma.sync. After each stage the partial sums leave the tensor core's accumulator:
        total += part * (sa * sb) on the CUDA cores, part = 0 (DeepSeek's promotion).
        """
        smem = cuda.shared.array(0, U8)
        part = cuda.local.array(64, np.float32)   # (i * 4 + j) * 4 + r: tile (i, j) of the warp, register r
        total = cuda.local.array(64, np.float32)
        afr = cuda.local.array(16, np.uint32)
        bfr = cuda.local.array(8, np.uint32)
        srow = cuda.local.array(8, np.float32)
        scol = cuda.local.array(8, np.float32)
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t4 = lane // 4, lane % 4
        wm, wn = (warp % 2) * 64, (warp // 2) * 32
        m0, n0 = cuda.blockIdx.y * BM4, cuda.blockIdx.x * BN4
        base = ptx.shared_address(smem)
        pad = (128 - base % 128) % 128
        for o in range(64):
            part[o] = _F0
            total[o] = _F0
        # ldmatrix: lane l gives row l % 8 of matrix l // 8. a: matrices (rows 0-7 | 8-15) x (bytes 0-15 | 16-31)
        # are registers a0..a3 of an m16 x k32 fragment; b: two n8 tiles x (bytes 0-15 | 16-31).
        q, r8 = lane // 8, lane % 8
        a_lane = (wm + r8 + 8 * (q % 2)) * ROW4 + 16 * (q // 2)
        b_lane = (BM4 + wn + r8 + 8 * (q // 2)) * ROW4 + 16 * (q % 2)
        nk = (K + BK4 - 1) // BK4
        for s0 in range(STAGES4 - 1):
            if s0 < nk:
                load_stage(smem, pad + s0 * STAGE4, a, m0, s0 * BK4, M, K, vec, tid)
                load_stage(smem, pad + s0 * STAGE4 + BM4 * ROW4, b, n0, s0 * BK4, N, K, vec, tid)
            ptx.cp_async_commit()  # one group per stage, empty or not: wait_group counts groups
        for kt in range(nk):
            nxt = kt + STAGES4 - 1
            if nxt < nk:  # a later stage's copies, in flight during this stage's mma
                so = pad + (nxt % STAGES4) * STAGE4
                load_stage(smem, so, a, m0, nxt * BK4, M, K, vec, tid)
                load_stage(smem, so + BM4 * ROW4, b, n0, nxt * BK4, N, K, vec, tid)
            ptx.cp_async_commit()
            wait_copies()  # this stage's group is complete; the later ones may still be in flight
            cuda.syncthreads()  # every thread's copies of this stage are visible
            st = pad + (kt % STAGES4) * STAGE4
            for kk in range(BK4 // 32):
                for i in range(4):
                    _ldmatrix_into(afr, 4 * i, smem, st + a_lane + i * 16 * ROW4 + kk * 32)
                for jj in range(2):
                    _ldmatrix_into(bfr, 4 * jj, smem, st + b_lane + jj * 16 * ROW4 + kk * 32)
                for i in range(4):
                    for j in range(4):
                        o = (i * 4 + j) * 4
                        d0, d1, d2, d3 = mma(afr[4 * i], afr[4 * i + 1], afr[4 * i + 2], afr[4 * i + 3], bfr[2 * j],
                                             bfr[2 * j + 1], part[o], part[o + 1], part[o + 2], part[o + 3])
                        part[o] = d0
                        part[o + 1] = d1
                        part[o + 2] = d2
                        part[o + 3] = d3
            if promote and ((kt + 1) * BK4 % GROUP_K == 0 or kt == nk - 1):  # the end of a K-group: promote
                grp = (kt * BK4) // GROUP_K
                for i in range(4):
                    for h in range(2):
                        srow[2 * i + h] = _scale_at(sa, a_kind, min(m0 + wm + 16 * i + g + 8 * h, M - 1), grp)
                for j in range(4):
                    for e in range(2):
                        scol[2 * j + e] = _scale_at(sb, b_kind, min(n0 + wn + 8 * j + 2 * t4 + e, N - 1), grp)
                for i in range(4):
                    for j in range(4):
                        for r in range(4):
                            o = (i * 4 + j) * 4 + r
                            total[o] += part[o] * (srow[2 * i + r // 2] * scol[2 * j + r % 2])
                            part[o] = _F0
            cuda.syncthreads()  # everyone is done with this stage before it is refilled
        if not promote:
            s_all = sa[0, 0] * sb[0, 0]
            for o in range(64):
                total[o] = part[o] * s_all
        for i in range(4):
            for j in range(4):
                for r in range(4):
                    row = m0 + wm + 16 * i + g + 8 * (r // 2)
                    col = n0 + wn + 8 * j + 2 * t4 + r % 2
                    if row < M and col < N:
                        if add:  # after the sum: the bits of a separate add of the residual
                            c[row, col] = res[row, col] + total[(i * 4 + j) * 4 + r]
                        else:
                            c[row, col] = total[(i * 4 + j) * 4 + r]

    return fp8_gemm_kernel4


def make_kernel5(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, promote: bool = True, add: bool = False):
    """Version 5 (wgmma) for one pair of scale kinds and formats (compiled in); promote and add as in make_kernel4."""
    issue = make_wgmma_issue(fmt_a, fmt_b)
    wait_mma = ptx.wgmma_wait_group(0, REGS5)
    wait_copies = ptx.cp_async_wait_group(STAGES5 - 1)

    @cuda.jit
    def fp8_gemm_kernel5(a, sa, b, sb, c, r, vec):
        """Block 256 threads = 2 warpgroups, grid (ceil(N/128), ceil(M/128)); warpgroup w computes rows 64w..64w+63
        of the block's 128 x 128 tile with wgmma m64n128k32 (64 float32 accumulators per thread).

        STAGES5 stages of 128 x 128 codes of a and of b (one K-group) in dynamic shared memory, filled by cp.async
        STAGES5 - 1 groups ahead. Per K-group: 4 asynchronous wgmma (k = 32 each) read a and b from shared memory
        through descriptors, the first with scale-d = 0 (D = A B: no zeroing); commit, wait; then the CUDA cores
        promote: total += part * (sa * sb)."""
        smem = cuda.shared.array(0, U8)
        part = cuda.local.array(REGS5, np.float32)
        total = cuda.local.array(REGS5, np.float32)
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        wg, t = tid // 128, tid % 128
        g, t4 = (t % 32) // 4, t % 4
        row0 = cuda.blockIdx.y * BM5 + 64 * wg + 16 * (t // 32) + g  # this thread's rows: row0, row0 + 8
        m0, n0 = cuda.blockIdx.y * BM5, cuda.blockIdx.x * BN5
        base = ptx.shared_address(smem)
        pad = (1024 - base % 1024) % 1024  # the 128-byte swizzle repeats every 1024 bytes: align the tiles to it
        for o in range(REGS5):
            part[o] = _F0
            total[o] = _F0
        nk = (K + BK5 - 1) // BK5
        for st in range(STAGES5 - 1):
            if st < nk:
                load_swizzled_tile(smem, pad + st * STAGE5, a, m0, st * BK5, M, K, vec, tid)
                load_swizzled_tile(smem, pad + st * STAGE5 + TILE5, b, n0, st * BK5, N, K, vec, tid)
            ptx.cp_async_commit()  # one group per stage, empty or not: wait_group counts groups
        for kt in range(nk):
            nxt = kt + STAGES5 - 1
            if nxt < nk:
                so = pad + (nxt % STAGES5) * STAGE5
                load_swizzled_tile(smem, so, a, m0, nxt * BK5, M, K, vec, tid)
                load_swizzled_tile(smem, so + TILE5, b, n0, nxt * BK5, N, K, vec, tid)
            ptx.cp_async_commit()
            wait_copies()             # this thread's copies of stage kt have landed
            ptx.fence_proxy_async()   # ... and are visible to wgmma (which reads through the async proxy)
            cuda.syncthreads()        # ... and so are every other thread's
            so = pad + (kt % STAGES5) * STAGE5
            # scale-d 0 (D = A B) at the first k-slice of each K-group, or only of K when not promoting
            issue(part, smem, base, so, wg, 0 if promote else kt * (BK5 // 32))
            wait_mma(part)
            if not promote:
                cuda.syncthreads()
                continue
            _promote_wgmma(part, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt)
            cuda.syncthreads()  # the stage is free for the copies of iteration kt + 1
        if not promote:
            s_all = sa[0, 0] * sb[0, 0]
            for o in range(REGS5):
                total[o] = part[o] * s_all
        if add:
            _store_wgmma_add(c, total, row0, n0, t4, M, N, r)
        else:
            _store_wgmma(c, total, row0, n0, t4, M, N)

    return fp8_gemm_kernel5



def make_kernel6(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, vec: int, persistent: bool = False,
                 add: bool = False):
    """Version 6 (wgmma, overlapped) for one pair of scale kinds and formats and one load path (compiled in);
    persistent=True gives version 7, the same tile code in a loop over tiles (`make_kernel7`); add as in
    make_kernel4."""
    issue = make_wgmma_issue(fmt_a, fmt_b)
    wait_one, wait_all = ptx.wgmma_wait_group(1, REGS5), ptx.wgmma_wait_group(0, REGS5)
    first_copies = ptx.cp_async_wait_group(STAGES5 - 2)  # stage 0 of the S - 1 committed in the prologue
    next_copies = ptx.cp_async_wait_group(STAGES5 - 3)   # stage kt + 1, with kt + S - 2 groups committed

    @cuda.jit(device=True)
    def load_stage(s, so, a, b, m0, n0, k0, M, N, K, tid):
        """Both 128 x 128 tiles of a K-group, swizzled (the load path `vec` compiled in)."""
        load_swizzled_tile(s, so, a, m0, k0, M, K, vec, tid)
        load_swizzled_tile(s, so + TILE5, b, n0, k0, N, K, vec, tid)

    @cuda.jit(device=True)
    def step(kt, nk, cur, nxt, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4):
        """K-group kt is in flight into `cur` and group kt + 1 exists. Issue kt + 1 into `nxt` (and the copies of
        group kt + S - 1), then wait for kt only and promote it while kt + 1 runs on the tensor cores."""
        next_copies()
        ptx.fence_proxy_async()
        cuda.syncthreads()  # stage kt + 1 landed for all; every thread is done with group kt - 1's stage
        ld = kt + STAGES5 - 1
        if ld < nk:
            load_stage(smem, pad + (ld % STAGES5) * STAGE5, a, b, m0, n0, ld * BK5, M, N, K, tid)
        ptx.cp_async_commit()
        issue(nxt, smem, base, pad + ((kt + 1) % STAGES5) * STAGE5, wg, 0)
        wait_one(cur)  # at most one group pending: group kt is complete
        _promote_wgmma(cur, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt)

    @cuda.jit(device=True)
    def gemm_tile(a, sa, b, sb, c, r, smem, base, pad, p0, p1, total, m0, n0):
        """The 128 x 128 output tile at rows m0, columns n0: version 5's tiles and pipeline, rearranged so that the
        tensor cores never wait for the CUDA cores: two sets of partial sums alternate (p0, p1), group kt + 1 is
        issued before group kt is promoted, and one barrier per K-group does both jobs (copies visible, previous
        stage free). On return this thread's wgmma are complete; the other warpgroup's may still read the last
        stage."""
        M, K = a.shape
        N = b.shape[0]
        tid = cuda.threadIdx.x
        wg, t = tid // 128, tid % 128
        g, t4 = (t % 32) // 4, t % 4
        row0 = m0 + 64 * wg + 16 * (t // 32) + g  # this thread's rows: row0, row0 + 8
        for o in range(REGS5):
            p0[o] = _F0
            p1[o] = _F0
            total[o] = _F0
        nk = (K + BK5 - 1) // BK5
        for s0 in range(STAGES5 - 1):
            if s0 < nk:
                load_stage(smem, pad + s0 * STAGE5, a, b, m0, n0, s0 * BK5, M, N, K, tid)
            ptx.cp_async_commit()
        first_copies()
        ptx.fence_proxy_async()
        cuda.syncthreads()
        issue(p0, smem, base, pad, wg, 0)
        kt = 0
        # two groups per trip, so that p0 and p1 are fixed registers, never indexed at run time; no branch
        # touches them inside the loop (a merge would copy accumulators while a wgmma writes them)
        while kt + 2 < nk:
            step(kt, nk, p0, p1, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4)
            step(kt + 1, nk, p1, p0, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4)
            kt += 2
        if kt + 1 < nk:  # the last two groups (kt in p0 is in flight)
            step(kt, nk, p0, p1, total, smem, base, pad, a, b, sa, sb, m0, n0, M, N, K, tid, wg, row0, t4)
            wait_all(p1)
            _promote_wgmma(p1, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt + 1)
        else:  # the last group
            wait_all(p0)
            _promote_wgmma(p0, total, sa, sb, a_kind, b_kind, row0, n0, t4, M, N, kt)
        if add:
            _store_wgmma_add(c, total, row0, n0, t4, M, N, r)
        else:
            _store_wgmma(c, total, row0, n0, t4, M, N)

    if not persistent:
        @cuda.jit
        def fp8_gemm_kernel6(a, sa, b, sb, c, r):
            """Block 256 threads = 2 warpgroups, grid (ceil(N/128), ceil(M/128)): one output tile per block."""
            smem = cuda.shared.array(0, U8)
            p0 = cuda.local.array(REGS5, np.float32)
            p1 = cuda.local.array(REGS5, np.float32)
            total = cuda.local.array(REGS5, np.float32)
            base = ptx.shared_address(smem)
            pad = (1024 - base % 1024) % 1024  # the 128-byte swizzle repeats every 1024 bytes: align the tiles to it
            gemm_tile(a, sa, b, sb, c, r, smem, base, pad, p0, p1, total, cuda.blockIdx.y * BM5,
                      cuda.blockIdx.x * BN5)

        return fp8_gemm_kernel6

    @cuda.jit
    def fp8_gemm_kernel7(a, sa, b, sb, c, r):
        """Persistent: a 1-D grid of `sms` blocks (one per SM: a block's registers and shared memory fill an SM),
        block i computing output tiles i, i + gridDim.x, ... in row-major tile order (version 6's block order),
        as DeepGEMM's num_sms does. The SMs left out are free for other work (communication kernels)."""
        smem = cuda.shared.array(0, U8)
        p0 = cuda.local.array(REGS5, np.float32)
        p1 = cuda.local.array(REGS5, np.float32)
        total = cuda.local.array(REGS5, np.float32)
        base = ptx.shared_address(smem)
        pad = (1024 - base % 1024) % 1024
        tiles_m = (a.shape[0] + BM5 - 1) // BM5
        tiles_n = (b.shape[0] + BN5 - 1) // BN5
        # tile i = tm * tiles_n + tn for i = blockIdx.x, + gridDim.x, ...: (tm, tn) carried forward, not divided
        # (a 64-bit division is a subroutine call in SASS, and any call makes ptxas serialize every wgmma, C7509)
        tm = 0
        tn = cuda.blockIdx.x
        while tn >= tiles_n:
            tn -= tiles_n
            tm += 1
        while tm < tiles_m:
            gemm_tile(a, sa, b, sb, c, r, smem, base, pad, p0, p1, total, tm * BM5, tn * BN5)
            cuda.syncthreads()  # both warpgroups' wgmma are done with the stages before the next tile refills them
            tn += cuda.gridDim.x
            while tn >= tiles_n:
                tn -= tiles_n
                tm += 1

    return fp8_gemm_kernel7


def make_kernel7(a_kind: int, b_kind: int, fmt_a: str, fmt_b: str, vec: int, add: bool = False):
    """Version 7 (version 6 persistent) for one pair of scale kinds and formats and one load path (compiled in)."""
    return make_kernel6(a_kind, b_kind, fmt_a, fmt_b, vec, persistent=True, add=add)


def tiles(M: int, N: int) -> int:
    """Output tiles of a persistent version's (M, N) output: ceil(M/128) * ceil(N/128)."""
    return -(-M // BM5) * -(-N // BN5)


def _add_key(residual) -> tuple:
    """The kernel cache key's tail for the residual epilogue: () for the default kernel, whose key is unchanged."""
    return () if residual is None else ("add",)


def launch_mma(version, a, sa, b, sb, out, a_kind, b_kind, fmt_a, fmt_b, tc_promote=True, residual=None, **_):
    """Versions 4 and 5 on device arrays. tc_promote=False (per-tensor scales only): no promotion, the hardware
    accumulator spans all of K (the accumulator experiment). residual: out = residual + A B^T."""
    make, smem, threads = (make_kernel4, SMEM4, THREADS4) if version == 4 else (make_kernel5, SMEM5, THREADS5)
    if not tc_promote and (a_kind, b_kind) != (0, 0):
        raise ValueError("tc_promote=False needs per-tensor scales on both operands (one scale for all of K)")
    add = residual is not None
    kernel = runtime.cached((f"fp8_gemm.v{version}", a_kind, b_kind, fmt_a, fmt_b, tc_promote) + _add_key(residual),
                            lambda: make(a_kind, b_kind, fmt_a, fmt_b, tc_promote, add))
    M, N = out.shape
    grid = ((N + BN4 - 1) // BN4, (M + BM4 - 1) // BM4)
    runtime.launch_with_shared(kernel, grid, threads, smem, a, sa, b, sb, out, out if residual is None else residual,
                               vec_ok(a, 16) & vec_ok(b, 16))


def overlapped_kernel(version, a_kind, b_kind, fmt_a, fmt_b, vec, add: bool = False):
    """Version 6's or 7's kernel for one pair of scale kinds and formats and one load path (add: the residual
    epilogue), built once (runtime.cached)."""
    make = make_kernel6 if version == 6 else make_kernel7
    return runtime.cached((f"fp8_gemm.v{version}", a_kind, b_kind, fmt_a, fmt_b, vec) + (("add",) if add else ()),
                          lambda: make(a_kind, b_kind, fmt_a, fmt_b, vec, add=add))


def launch_overlapped(version, a, sa, b, sb, out, a_kind, b_kind, fmt_a, fmt_b, tc_promote=True, sms=None,
                      stream=0, residual=None, **_):
    """Versions 6 and 7 on device arrays; version 7's grid is `sms` blocks (None: one per tile). residual:
    out = residual + A B^T."""
    if not tc_promote:
        raise ValueError(f"tc_promote=False is implemented by versions 4 and 5, got version {version}")
    kernel = overlapped_kernel(version, a_kind, b_kind, fmt_a, fmt_b, vec_ok(a, 16) & vec_ok(b, 16),
                               add=residual is not None)
    M, N = out.shape
    grid = ((N + BN5 - 1) // BN5, (M + BM5 - 1) // BM5) if version == 6 else (sms or tiles(M, N))
    runtime.launch_with_shared(kernel, grid, THREADS5, SMEM5, a, sa, b, sb, out, out if residual is None else residual,
                               stream=stream)
