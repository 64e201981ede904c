"""Inline PTX from Python: every intrinsic with its simulator twin (`intrinsics`), and PTX text (`compile`).

    from fp8lab import ptx
    ptx.cvt_e4m3x2_satfinite(hi, lo)   # in a kernel: one cvt.rn.satfinite.e4m3x2.f32 on a GPU, a twin elsewhere
    ptx.ptx_of(kernel, "void(float32[::1], uint8[::1])")   # the PTX a kernel compiles to

See intrinsics.py for the table of intrinsics, their PTX and their twins.
"""

from .compile import PTXUnavailableWarning, find_instructions, ptx_of, ptx_status
from .intrinsics import (
    CVT_E4M3X2,
    CVT_E5M2X2,
    CVT_F16X2_E4M3X2,
    CVT_F16X2_E5M2X2,
    HARDWARE,
    MMA_M16N8K32_E4M3,
    cvt_e4m3x2_satfinite,
    cvt_e5m2x2_satfinite,
    cvt_x2_intrinsic,
    decode_e4m3x2,
    decode_e5m2x2,
    decode_x2_intrinsic,
    encode_e4m3_sat_hw,
    encode_e5m2_sat_hw,
    globaltimer_intrinsic,
    globaltimer_ns,
    ld_global_v4_f32,
    ld_global_v4_intrinsic,
    ld_shared_v4_f32,
    mma_intrinsic,
    mma_m16n8k32_e4m3,
    mma_m16n8k32_layout,
    mma_m16n8k32_reference,
    pack_mma_m16n8k32,
    shared_v4_intrinsics,
    st_shared_v4_f32,
)

__all__ = [
    "HARDWARE", "CVT_E4M3X2", "CVT_E5M2X2", "CVT_F16X2_E4M3X2", "CVT_F16X2_E5M2X2", "cvt_x2_intrinsic",
    "decode_x2_intrinsic", "globaltimer_intrinsic", "ld_global_v4_intrinsic", "shared_v4_intrinsics",
    "cvt_e4m3x2_satfinite", "cvt_e5m2x2_satfinite", "encode_e4m3_sat_hw", "encode_e5m2_sat_hw", "decode_e4m3x2",
    "decode_e5m2x2", "globaltimer_ns", "ld_global_v4_f32", "ld_shared_v4_f32", "st_shared_v4_f32", "ptx_of",
    "ptx_status", "find_instructions", "PTXUnavailableWarning", "MMA_M16N8K32_E4M3", "mma_intrinsic",
    "mma_m16n8k32_e4m3", "mma_m16n8k32_layout", "mma_m16n8k32_reference", "pack_mma_m16n8k32",
]
