"""Inline PTX from Python: every intrinsic of the course with its simulator twin, and PTX text (`compile`).

    from fp8lab.device import ptx
    ptx.cvt_e4m3x2_satfinite(hi, lo)   # in a kernel: one cvt.rn.satfinite.e4m3x2.f32 on a GPU, a twin elsewhere
    ptx.ptx_of(kernel, "void(float32[::1], uint8[::1])")   # the PTX a kernel compiles to

On a GPU (`HARDWARE`) each name below is an `@intrinsic` (numba.cuda.extending) that emits PTX through llvmlite's
`InlineAsm`, or a device function built on one. Under the simulator, which cannot run PTX, the same name is a
software twin with the same result, so kernel source never forks by backend. On a GPU, tests/test_ptx.py proves
hardware == twin bit for bit. Each module binds its names once, by backend; `base` holds what they share.

conversions.py: FP8 conversions, bit casts and the clock (registers only)

| name | PTX (GPU) | twin (simulator) |
|---|---|---|
| `cvt_e4m3x2_satfinite(hi, lo)` | `cvt.rn.satfinite.e4m3x2.f32` | `formats.encode(.., saturate=True)` |
| `cvt_e5m2x2_satfinite(hi, lo)` | `cvt.rn.satfinite.e5m2x2.f32` | the same, E5M2 |
| `encode_e4m3_sat_hw(x)`, `encode_e5m2_sat_hw(x)` | the low byte of the cvt of (0, x) | the same on the twin |
| `decode_e4m3x2(codes16)`, `decode_e5m2x2` | `cvt.rn.f16x2.{e4m3x2,e5m2x2}` + 2 `cvt.f32.f16` | `formats.decode` |
| `globaltimer_ns()` | `mov.u64 d, %globaltimer;` | the host's nanosecond clock |
| `f32_as_u32(x)`, `u32_as_f32(u)` | `mov.b32`: the same 32 bits, no conversion (1) | a NumPy `.view` |

memory.py: vector loads and stores, an L2 prefetch, cp.async and ldmatrix

| name | PTX (GPU) | twin (simulator) |
|---|---|---|
| `ld_global_v4_f32(x, i, j)` | `ld.global.v4.f32` (16-byte aligned) | four scalar loads |
| `ld_global_nc_v4_f32(x, i, j)` | `ld.global.nc.L1::evict_last.v4.f32`, volatile (2) | four scalar loads |
| `ld_shared_v4_f32(s, i, j)` | `ld.shared.v4.f32` (addrspacecast) | four scalar loads |
| `st_shared_v4_f32(s, i, j, x0, x1, x2, x3)` | `st.shared.v4.f32` (addrspacecast) | four scalar stores |
| `ld_shared_v4_f32_1d(s, k)` | `ld.shared.v4.f32` of s[k:k+4], s 1-D (3) | four scalar loads |
| `prefetch_l2_bulk(a, i, j, nbytes)` | `cp.async.bulk.prefetch.L2.global [&a[i, j]], nbytes;` (4) | nothing (a hint) |
| `shared_address(s)` | s[0]'s 32-bit shared-window address (addrspacecast, ptrtoint) | 0 (offsets are from s[0]) |
| `cp_async_16(s, off, x, i, j, nbytes)` | `cp.async.cg.shared.global [s+off], [&x[i,j]], 16, nbytes;` (5) | byte copy |
| `cp_async_commit()`, `cp_async_wait_group(n)` | `cp.async.commit_group;`, `cp.async.wait_group n;` | nothing (5) |
| `ldmatrix_x4(s, off)` | `ldmatrix.sync.aligned.m8n8.x4.shared.b16` (one warp) (6) | the warp's row offsets gathered |

mma.py: the FP8 mma.sync m16n8k32 and the BF16 m16n8k16

| name | PTX (GPU) | twin (simulator) |
|---|---|---|
| `mma_m16n8k32_e4m3(a0..a3, b0, b1, c0..c3)` | `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32` | (7) |
| `mma_m16n8k32(fa, fb)` | the same for any pair of E4M3/E5M2 operands | the same |
| `mma_m16n8k16_bf16(a0..a3, b0, b1, c0..c3)` | `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` | (7) |

wgmma.py: the warpgroup MMA of sm_90a, its fences and its shared-memory layout

| name | PTX (GPU) | twin (simulator) |
|---|---|---|
| `fence_proxy_async()` | `fence.proxy.async.shared::cta;` (8) | nothing |
| `wgmma_fence(regs)(acc)` | `wgmma.fence.sync.aligned;` (9) | nothing |
| `wgmma_commit_group()` | `wgmma.commit_group.sync.aligned;` | nothing |
| `wgmma_wait_group(n, regs)(acc)` | `wgmma.wait_group.sync.aligned n;` (9) | nothing |
| `wgmma_m64k32(n, fa, fb)(acc, s, desc_a, desc_b, scale_d)` | `wgmma.mma_async.sync.aligned.m64n{n}k32` (10) | (11) |
| `wgmma_m64k16(n)(acc, s, desc_a, desc_b, scale_d)` | `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16` (12) | (11) |

(1) NaN payloads, -0.0 and subnormals kept; the twin is `np.float32(x).view(np.uint32)` and
`np.uint32(u).view(np.float32)`. (2) For data the kernel never writes, read by every row: the read-only path, kept
in L1; volatile, so never moved out of a loop. (3) Dynamic shared memory is 1-D. (4) sm_90; 16-byte aligned, nbytes
a multiple of 16. (5) Zero-fills past nbytes; the twin copies at once, so its waits do nothing. (6) Lane l gives row
l % 8 of matrix l // 8. (7) The warp's fragments gathered, FP32 sums in k order. (8) Generic-proxy stores become
visible to wgmma. (9) acc tied through it: no access to the accumulators moves across. (10) `.f32.{fa}.{fb}`: one
warpgroup, float32 accumulators, A in fa and B in fb, both in shared memory. (11) The descriptors decoded, this
thread's outputs summed in k order. (12) Both operands K-major (the transpose immediates 0); 16 values, 32 bytes of
K per instruction, as for FP8.

The tensor-core path: `mma_m16n8k32` (mma.sync, one warp, fragments in registers, `ldmatrix_x4` to load them),
`cp_async_16` / `cp_async_commit` / `cp_async_wait_group` (global -> shared copies in flight), `wgmma_m64k32`
(one warpgroup, operands in shared memory through `smem_descriptor`, `swizzle_128b` layout), `wgmma_fence`,
`wgmma_commit_group`, `wgmma_wait_group`, `fence_proxy_async`. A new intrinsic goes into the module of its
kind, with its twin, and a row in the table above.
"""

from .base import HARDWARE, barrier_intrinsic
from .compile import PTXUnavailableWarning, find_instructions, ptx_of, ptx_status
from .conversions import (CVT_E4M3X2, CVT_E5M2X2, CVT_F16X2_E4M3X2, CVT_F16X2_E5M2X2, bitcast_intrinsics,
                          cvt_e4m3x2_satfinite, cvt_e5m2x2_satfinite, cvt_x2_intrinsic, decode_e4m3x2, decode_e5m2x2,
                          decode_x2_intrinsic, encode_e4m3_sat_hw, encode_e5m2_sat_hw, f32_as_u32,
                          globaltimer_intrinsic, globaltimer_ns, u32_as_f32)
from .memory import (async_copy_intrinsics, cp_async_16, cp_async_commit, cp_async_wait_group, ld_global_nc_v4_f32,
                     ld_global_v4_f32, ld_global_v4_intrinsic, ld_shared_v4_1d_intrinsic, ld_shared_v4_f32,
                     ld_shared_v4_f32_1d, ldmatrix_x4, prefetch_l2_bulk, prefetch_l2_intrinsic, shared_address,
                     shared_v4_intrinsics, st_shared_v4_f32)
from .mma import (MMA_BF16, MMA_FP8, MMA_FP8_CC, MMA_M16N8K16_BF16, MMA_M16N8K32_E4M3, mma_instruction, mma_intrinsic,
                  mma_m16n8k16_bf16, mma_m16n8k16_layout, mma_m16n8k16_reference, mma_m16n8k32, mma_m16n8k32_e4m3,
                  mma_m16n8k32_layout, mma_m16n8k32_reference, pack_mma_m16n8k16, pack_mma_m16n8k32, require_mma_fp8)
from .wgmma import (SWIZZLE_MODES, WGMMA, WGMMA_CC, fence_proxy_async, require_wgmma, smem_descriptor,
                    smem_descriptor_fields, smem_descriptor_np, swizzle_128b, swizzle_128b_np, wgmma_commit_group,
                    wgmma_d_layout, wgmma_fence, wgmma_intrinsic, wgmma_m64k16, wgmma_m64k32, wgmma_sync_intrinsic,
                    wgmma_wait_group)

__all__ = [
    "HARDWARE", "CVT_E4M3X2", "CVT_E5M2X2", "CVT_F16X2_E4M3X2", "CVT_F16X2_E5M2X2", "cvt_x2_intrinsic",
    "decode_x2_intrinsic", "globaltimer_intrinsic", "ld_global_v4_intrinsic", "shared_v4_intrinsics",
    "cvt_e4m3x2_satfinite", "cvt_e5m2x2_satfinite", "encode_e4m3_sat_hw", "encode_e5m2_sat_hw", "decode_e4m3x2",
    "decode_e5m2x2", "globaltimer_ns", "ld_global_v4_f32", "ld_shared_v4_f32", "st_shared_v4_f32", "ptx_of",
    "ptx_status", "find_instructions", "PTXUnavailableWarning", "MMA_M16N8K32_E4M3", "mma_intrinsic",
    "mma_m16n8k32_e4m3", "mma_m16n8k32_layout", "mma_m16n8k32_reference", "pack_mma_m16n8k32",
    "MMA_M16N8K16_BF16", "MMA_BF16", "mma_m16n8k16_bf16", "mma_m16n8k16_layout", "mma_m16n8k16_reference",
    "pack_mma_m16n8k16",
    "async_copy_intrinsics",
    "barrier_intrinsic",
    "cp_async_16",
    "cp_async_commit",
    "cp_async_wait_group",
    "fence_proxy_async",
    "ldmatrix_x4",
    "mma_instruction",
    "mma_m16n8k32",
    "shared_address",
    "smem_descriptor",
    "smem_descriptor_fields",
    "smem_descriptor_np",
    "swizzle_128b",
    "swizzle_128b_np",
    "wgmma_commit_group",
    "wgmma_d_layout",
    "wgmma_fence",
    "wgmma_intrinsic",
    "wgmma_m64k16",
    "wgmma_m64k32",
    "wgmma_sync_intrinsic",
    "wgmma_wait_group",
    "SWIZZLE_MODES",
    "WGMMA",
    "WGMMA_CC",
    "MMA_FP8",
    "MMA_FP8_CC",
    "require_wgmma",
    "require_mma_fp8",
    "bitcast_intrinsics",
    "ld_global_nc_v4_f32",
    "ld_shared_v4_1d_intrinsic",
    "ld_shared_v4_f32_1d",
    "prefetch_l2_bulk",
    "prefetch_l2_intrinsic",
    "f32_as_u32",
    "u32_as_f32",
]
