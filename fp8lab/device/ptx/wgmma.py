"""wgmma, the asynchronous warpgroup MMA of sm_90a, with its twin: `wgmma_m64k32(n, fa, fb)` (FP8) and
`wgmma_m64k16(n)` (bfloat16) (one warpgroup, A and B in shared memory, read through 64-bit matrix descriptors), its
fences and groups (`wgmma_fence`,
`wgmma_commit_group`, `wgmma_wait_group`, `fence_proxy_async`), the shared-memory layout it reads
(`smem_descriptor`, `swizzle_128b` on the device; `smem_descriptor_np`, `smem_descriptor_fields`,
`swizzle_128b_np` on the host), where each thread's accumulators sit in D (`wgmma_d_layout`), and what a kernel
issuing it needs (`WGMMA`, `require_wgmma`).

The twin runs each wgmma at issue: it decodes both descriptors, reads this thread's rows of A and columns of B
through the 128-byte swizzle and adds their products to its accumulators in k order (FP32); the fences and waits
do nothing. It models K-major operands with the 128-byte swizzle only (what the course's kernels use).
"""

from __future__ import annotations

import functools

import numpy as np

from ...numerics import formats
from .. import runtime
from .. import simgaps as _simgaps
from ..runtime import cuda
from .base import HARDWARE, as_bytes, asm, barrier_intrinsic, sum_in_order, twin_noop

WGMMA_CC = (9, 0)  # wgmma exists on the sm_90a target only (PTX ISA): H100, H200, H800
WGMMA = runtime.Capability("wgmma, which needs an sm_90 GPU (H100, H200, H800: compute capability 9.0)", WGMMA_CC,
                           WGMMA_CC)
"""What a kernel issuing wgmma needs (a kernel version's `needs`, kernels.versions)."""


def require_wgmma(version) -> None:
    """ValueError naming `version` unless this GPU runs wgmma (nothing under the simulator: the twins run)."""
    runtime.require(WGMMA, version)


# ----------------------------------------------------------------------------------------------------------------
# The hardware path: @intrinsic builders (GPU only)
# ----------------------------------------------------------------------------------------------------------------


def _acc_asm(context, builder, aryty, ary, regs, text, extra_tys=(), extra=(), extra_constraints=""):
    """Load acc[0..regs), run `text` with them as "+f" operands ($0..$regs-1; extra operands follow the tied
    copies, from $2*regs), store the results back. The local array lives in registers after optimisation."""
    from llvmlite import ir
    from numba.cuda import cgutils, types

    f32 = ir.FloatType()
    a = context.make_array(aryty)(context, builder, value=ary)
    ptrs = [cgutils.get_item_pointer(context, builder, aryty, a, [context.get_constant(types.intp, k)])
            for k in range(regs)]
    vals = [builder.load(p) for p in ptrs]
    cons = ",".join(["=f"] * regs + [str(k) for k in range(regs)]) + extra_constraints + ",~{memory}"
    res = asm(builder, ir.LiteralStructType([f32] * regs), [f32] * regs + list(extra_tys), text, cons,
               vals + list(extra))
    for k, p in enumerate(ptrs):
        builder.store(builder.extract_value(res, k), p)


def wgmma_sync_intrinsic(text: str, regs: int, name: str):
    """An @intrinsic `name(acc)`: `text` (wgmma.fence / wgmma.wait_group) with the float32 local array acc[0..regs)
    tied through it, so the compiler moves no read or write of the accumulators across it (CUTLASS's
    warpgroup_fence_operand does the same with an empty asm)."""
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def sync(typingctx, acc):
        if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.ndim == 1):
            return None
        sig = types.void(acc)

        def codegen(context, builder, sig, args):
            _acc_asm(context, builder, sig.args[0], args[0], regs, text)
            return context.get_dummy_value()

        return sig, codegen

    sync.__name__ = sync.__qualname__ = name
    return intrinsic(sync)


def wgmma_intrinsic(n: int, fa: str = "e4m3", fb: str = "e4m3"):
    """An @intrinsic `wgmma(acc, s, desc_a, desc_b, scale_d)` (GPU only, sm_90a): one warpgroup (128 threads)
    issues `wgmma.mma_async.sync.aligned.m64n{n}k{K}.f32.{fa}.{fb}`: D (64 x n, f32) = A (64 x K) @ B (K x n)
    + (D if scale_d else 0), A and B read from shared memory through 64-bit matrix descriptors, both K-major. K is 32
    for FP8 (e4m3, e5m2: no transposed operand exists) and 16 for bf16 (whose two transpose immediates are 0: K-major
    too). Either way one k-slice is 32 bytes of each row. acc: a float32 local array of n / 2 values, this thread's
    part of D (see wgmma_d_layout), read and written in place. The instruction is asynchronous: the results may be
    read only after wgmma_commit_group and wgmma_wait_group. s is not used on the GPU (the descriptors hold the
    addresses); the twin reads the operands from it."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    regs = n // 2
    k = _k_of(fa, fb)
    ops = ", ".join(f"${j}" for j in range(regs))
    trans = ", 0, 0" if fa == "bf16" else ""  # imm-trans-a, imm-trans-b: bf16 only (PTX ISA, wgmma.mma_async)
    text = (f"{{ .reg .pred p; setp.ne.b32 p, ${2 * regs + 2}, 0; wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{fa}.{fb} "
            f"{{{ops}}}, ${2 * regs}, ${2 * regs + 1}, p, 1, 1{trans}; }}")

    def wgmma(typingctx, acc, s, desc_a, desc_b, scale_d):
        if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and isinstance(s, types.Array)
                and all(isinstance(t, types.Integer) for t in (desc_a, desc_b, scale_d))):
            return None
        sig = types.void(acc, s, desc_a, desc_b, scale_d)

        def codegen(context, builder, sig, args):
            i64, i32 = ir.IntType(64), ir.IntType(32)
            da = context.cast(builder, args[2], sig.args[2], types.uint64)
            db = context.cast(builder, args[3], sig.args[3], types.uint64)
            sd = context.cast(builder, args[4], sig.args[4], types.int32)
            _acc_asm(context, builder, sig.args[0], args[0], regs, text, (i64, i64, i32), (da, db, sd), ",l,l,r")
            return context.get_dummy_value()

        return sig, codegen

    wgmma.__name__ = wgmma.__qualname__ = f"wgmma_m64n{n}k{k}_{fa}_{fb}"
    return intrinsic(wgmma)


WGMMA_INPUTS = ("e4m3", "e5m2", "bf16")
"""The operand formats the course's wgmma takes: FP8 (k = 32) or bfloat16 (k = 16), 32 bytes of K per k-slice."""


def _k_of(fa: str, fb: str) -> int:
    if fa not in WGMMA_INPUTS or fb not in WGMMA_INPUTS or (fa == "bf16") != (fb == "bf16"):
        raise ValueError(f"wgmma operands must be two FP8 formats (e4m3, e5m2) or bf16 and bf16, got {fa!r} and {fb!r}")
    return 16 if fa == "bf16" else 32


# ----------------------------------------------------------------------------------------------------------------
# The layouts, in NumPy: D's registers, the matrix descriptor, the 128-byte swizzle
# ----------------------------------------------------------------------------------------------------------------


def wgmma_d_layout(n: int) -> np.ndarray:
    """(128, n // 2, 2): the (row, col) of D (64 x n) held in accumulator register r of thread t of a warpgroup
    (PTX ISA, "Register fragments", wgmma .m64nNk32 D): warp w = t // 32 owns rows 16w..16w+15 and, per 8
    columns j, lays them out as mma.m16n8's D: register 4j + i at row 16w + g + 8 (i >> 1), column
    8j + 2 (t % 4) + (i & 1), with g = (t % 32) // 4."""
    t = np.arange(128)[:, None]
    r = np.arange(n // 2)[None, :]
    j, i = r >> 2, r & 3
    row = 16 * (t >> 5) + ((t & 31) >> 2) + 8 * (i >> 1)
    col = 8 * j + 2 * (t & 3) + (i & 1)
    return np.stack(np.broadcast_arrays(row, col), axis=-1)


SWIZZLE_MODES = {0: "none (interleave)", 1: "128-byte", 2: "64-byte", 3: "32-byte"}


def smem_descriptor_fields(desc: int) -> dict:
    """The fields of a wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
    leading and stride byte offsets (each stored >> 4 in 14 bits), base offset, swizzle mode."""
    desc = int(desc)
    return {"start_address": (desc & 0x3FFF) << 4, "leading_byte_offset": ((desc >> 16) & 0x3FFF) << 4,
            "stride_byte_offset": ((desc >> 32) & 0x3FFF) << 4, "base_offset": (desc >> 49) & 7,
            "swizzle": SWIZZLE_MODES[(desc >> 62) & 3]}


def smem_descriptor_np(address: int, leading_bytes: int, stride_bytes: int, swizzle: int) -> int:
    """Host twin of smem_descriptor (a device function): the same 64-bit wgmma descriptor as a Python int."""
    return (((address & 0x3FFFF) >> 4) | (((leading_bytes & 0x3FFFF) >> 4) << 16)
            | (((stride_bytes & 0x3FFFF) >> 4) << 32) | (int(swizzle) << 62))


def swizzle_128b_np(offset):
    """NumPy twin of swizzle_128b: byte offset -> where the 128-byte swizzle stores it."""
    offset = np.asarray(offset, np.int64)
    return offset ^ (((offset >> 7) & 7) << 4)


def _operand_rows(b8, desc, rows):
    """Bytes (len(rows), 32) of a K-major, 128-byte-swizzled operand slice that `desc` describes (32 bytes of K
    from its start address): what wgmma reads for those rows of A (or of B, rows = columns n): 32 FP8 codes or 16
    bfloat16 values (little-endian) per row."""
    desc = int(desc)
    start = (desc & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    if (desc >> 62) & 3 != 1 or (desc >> 49) & 7:
        raise ValueError(f"the wgmma twin models K-major operands with the 128-byte swizzle and base offset 0 only, "
                         f"got descriptor {smem_descriptor_fields(desc)}")
    rows = np.asarray(rows, np.int64)[:, None]
    lin = start + (rows // 8) * sbo + (rows % 8) * 128 + np.arange(32)[None, :]  # 8-row atoms of 128 B rows
    return b8[swizzle_128b_np(lin)]


# ----------------------------------------------------------------------------------------------------------------
# The twin (simulator) and the binding
# ----------------------------------------------------------------------------------------------------------------


def _bf16_values(rows8):
    """float32 values of bfloat16 bytes (r, 2 k), little-endian: each value's bits are the float32's top half."""
    u16 = np.ascontiguousarray(rows8).view("<u2")
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _twin_wgmma(n: int, fa: str, fb: str):
    """Twin of wgmma m64n{n}k32 (FP8) or m64n{n}k16 (bf16): decode both descriptors, read this thread's two rows of
    A and n / 4 columns of B from shared memory through the 128-byte swizzle, and add their products in k order
    (FP32; a product of two FP8 or two bfloat16 values is exact in float32) to its accumulators (wgmma_d_layout).
    Done at issue: the twin has no asynchrony to wait for."""
    _k_of(fa, fb)
    if fa == "bf16":
        ta = tb = _bf16_values
    else:
        va, vb = formats.value_table(fa), formats.value_table(fb)
        ta, tb = (lambda c: va[c]), (lambda c: vb[c])
    lay = wgmma_d_layout(n)

    def wgmma(acc, s, desc_a, desc_b, scale_d):
        t = _simgaps.thread_index() % 128
        b = as_bytes(s)
        rows = lay[t, 0:4:2, 0] % 64            # its two rows (registers 0 and 2)
        cols = lay[t, :, 1].reshape(-1, 4)[:, :2].ravel()  # its n / 4 columns, in register order
        av = ta(_operand_rows(b, desc_a, rows)).astype(np.float32)  # (2, k)
        bv = tb(_operand_rows(b, desc_b, cols)).astype(np.float32)  # (n / 4, k)
        regs = n // 2
        d = np.zeros((2, regs // 2), np.float32)  # d[h, 2j + e] is register 4j + 2h + e
        if scale_d:
            for r in range(regs):
                d[(r >> 1) & 1, 2 * (r >> 2) + (r & 1)] = acc[r]
        d = sum_in_order(d, av[:, None, :] * bv[None, :, :])
        for r in range(regs):
            acc[r] = d[(r >> 1) & 1, 2 * (r >> 2) + (r & 1)]

    return wgmma


if HARDWARE:
    fence_proxy_async = barrier_intrinsic("fence.proxy.async.shared::cta;", "fence_proxy_async")
    wgmma_commit_group = barrier_intrinsic("wgmma.commit_group.sync.aligned;", "wgmma_commit_group")
else:
    fence_proxy_async = cuda.jit(device=True)(twin_noop)
    wgmma_commit_group = cuda.jit(device=True)(twin_noop)


@functools.lru_cache(maxsize=None)
def wgmma_fence(regs: int):
    """`wgmma.fence.sync.aligned;` taking the accumulator array (regs float32): issue before the first wgmma that
    reads registers written by other instructions."""
    if HARDWARE:
        return wgmma_sync_intrinsic("wgmma.fence.sync.aligned;", regs, f"wgmma_fence_{regs}")
    return cuda.jit(device=True)(twin_noop)


@functools.lru_cache(maxsize=None)
def wgmma_wait_group(n: int, regs: int):
    """`wgmma.wait_group.sync.aligned n;` taking the accumulator array: after it, at most n committed wgmma
    groups are pending and the accumulators of the others may be read."""
    if HARDWARE:
        return wgmma_sync_intrinsic(f"wgmma.wait_group.sync.aligned {int(n)};", regs, f"wgmma_wait_group_{n}_{regs}")
    return cuda.jit(device=True)(twin_noop)


@functools.lru_cache(maxsize=None)
def wgmma_m64k32(n: int, fa: str = "e4m3", fb: str = "e4m3"):
    """wgmma.mma_async m64n{n}k32 with float32 accumulators, A in fa and B in fb (FP8), hardware or twin."""
    if fa == "bf16" or fb == "bf16":
        raise ValueError("bf16 wgmma is m64nNk16: use wgmma_m64k16")
    return _wgmma(n, fa, fb)


@functools.lru_cache(maxsize=None)
def wgmma_m64k16(n: int):
    """wgmma.mma_async m64n{n}k16.f32.bf16.bf16, float32 accumulators, both operands bfloat16 and K-major, hardware
    or twin. A k-slice is 16 values, 32 bytes: the same descriptors and swizzled tiles as wgmma_m64k32's."""
    return _wgmma(n, "bf16", "bf16")


def _wgmma(n: int, fa: str, fb: str):
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"n must be a multiple of 8 in 8..256 (the wgmma shapes), got {n}")
    _k_of(fa, fb)
    if HARDWARE:
        return wgmma_intrinsic(n, fa, fb)
    return cuda.jit(device=True)(_twin_wgmma(n, fa, fb))


@cuda.jit(device=True)
def swizzle_128b(offset):
    """Where the 128-byte swizzle stores byte `offset` of a tile (1024-byte aligned): the 16-byte chunk index
    (bits 4-6) XOR the row within the 8-row atom (bits 7-9). 8 consecutive 128-byte rows then put any given
    chunk in 8 different bank groups (PTX ISA, "Shared Memory Matrix Layout", swizzling modes)."""
    return offset ^ (((offset >> 7) & 7) << 4)


@cuda.jit(device=True)
def smem_descriptor(address, leading_bytes, stride_bytes, swizzle):
    """A wgmma shared-memory matrix descriptor (uint64; PTX ISA, "Matrix Descriptor Format"): start address in
    bits 0-13, leading-dimension byte offset in 16-29, stride-dimension byte offset in 32-45 (each >> 4),
    base offset 0, swizzle mode in 62-63 (1 = 128-byte)."""
    d = np.uint64((address & 0x3FFFF) >> 4)
    d |= np.uint64((leading_bytes & 0x3FFFF) >> 4) << np.uint64(16)
    d |= np.uint64((stride_bytes & 0x3FFFF) >> 4) << np.uint64(32)
    d |= np.uint64(swizzle) << np.uint64(62)
    return d
