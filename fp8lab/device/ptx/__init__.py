"""Inline PTX from Python: every intrinsic with its simulator twin (`intrinsics`), and PTX text (`compile`).

    from fp8lab.device import ptx
    ptx.cvt_e4m3x2_satfinite(hi, lo)   # in a kernel: one cvt.rn.satfinite.e4m3x2.f32 on a GPU, a twin elsewhere
    ptx.ptx_of(kernel, "void(float32[::1], uint8[::1])")   # the PTX a kernel compiles to

The tensor-core path: `mma_m16n8k32` (mma.sync, one warp, fragments in registers, `ldmatrix_x4` to load them),
`cp_async_16` / `cp_async_commit` / `cp_async_wait_group` (global -> shared copies in flight), `wgmma_m64k32`
(one warpgroup, operands in shared memory through `smem_descriptor`, `swizzle_128b` layout), `wgmma_fence`,
`wgmma_commit_group`, `wgmma_wait_group`, `fence_proxy_async`.
Bit casts: `f32_as_u32(x)` / `u32_as_f32(u)` (`mov.b32`: the same 32 bits as the other type, for bit arithmetic
on floats such as bfloat16 rounding).

See intrinsics.py for the table of intrinsics, their PTX and their twins.
"""

from .compile import PTXUnavailableWarning, find_instructions, ptx_of, ptx_status
from .intrinsics import (CVT_E4M3X2, CVT_E5M2X2, CVT_F16X2_E4M3X2, CVT_F16X2_E5M2X2, HARDWARE, bitcast_intrinsics,
    MMA_FP8, MMA_FP8_CC, WGMMA, WGMMA_CC, MMA_M16N8K32_E4M3, cvt_e4m3x2_satfinite, cvt_e5m2x2_satfinite, cvt_x2_intrinsic,
    decode_e4m3x2, decode_e5m2x2, decode_x2_intrinsic, encode_e4m3_sat_hw, encode_e5m2_sat_hw, f32_as_u32,
    globaltimer_intrinsic, globaltimer_ns, ld_global_v4_f32, ld_global_nc_v4_f32, ld_global_v4_intrinsic,
    ld_shared_v4_1d_intrinsic, ld_shared_v4_f32, ld_shared_v4_f32_1d, mma_intrinsic, mma_m16n8k32_e4m3,
    mma_m16n8k32_layout, mma_m16n8k32_reference, pack_mma_m16n8k32, prefetch_l2_bulk, prefetch_l2_intrinsic,
    require_wgmma, require_mma_fp8, shared_v4_intrinsics, st_shared_v4_f32, u32_as_f32, SWIZZLE_MODES,
    async_copy_intrinsics, barrier_intrinsic, cp_async_16, cp_async_commit, cp_async_wait_group, fence_proxy_async,
    ldmatrix_x4, mma_instruction, mma_m16n8k32, shared_address, smem_descriptor, smem_descriptor_fields,
    smem_descriptor_np, swizzle_128b, swizzle_128b_np, wgmma_commit_group, wgmma_d_layout, wgmma_fence, wgmma_intrinsic,
    wgmma_m64k32, wgmma_sync_intrinsic, wgmma_wait_group)

__all__ = [
    "HARDWARE", "CVT_E4M3X2", "CVT_E5M2X2", "CVT_F16X2_E4M3X2", "CVT_F16X2_E5M2X2", "cvt_x2_intrinsic",
    "decode_x2_intrinsic", "globaltimer_intrinsic", "ld_global_v4_intrinsic", "shared_v4_intrinsics",
    "cvt_e4m3x2_satfinite", "cvt_e5m2x2_satfinite", "encode_e4m3_sat_hw", "encode_e5m2_sat_hw", "decode_e4m3x2",
    "decode_e5m2x2", "globaltimer_ns", "ld_global_v4_f32", "ld_shared_v4_f32", "st_shared_v4_f32", "ptx_of",
    "ptx_status", "find_instructions", "PTXUnavailableWarning", "MMA_M16N8K32_E4M3", "mma_intrinsic",
    "mma_m16n8k32_e4m3", "mma_m16n8k32_layout", "mma_m16n8k32_reference", "pack_mma_m16n8k32",
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
