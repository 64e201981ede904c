"""The FP8 mma.sync m16n8k32 (one warp, fragments in registers) with its twin: `mma_m16n8k32(fa, fb)` for A in
format fa and B in fb (`mma_m16n8k32_e4m3` for E4M3 x E4M3), its fragment layout and result in NumPy, and what a
kernel issuing it needs (`MMA_FP8`, `require_mma_fp8`). `ldmatrix_x4` (fp8lab/device/ptx/memory.py) loads its
fragments from shared memory.

mma.sync m16n8k32 (PTX ISA, "Matrix Fragments for mma.m16n8k32", the .e4m3/.e5m2/.s8 layout; sm_89+): one warp
computes D (16 x 8, f32) = A (16 x 32, "row") @ B (32 x 8, "col") + C, each lane holding a fragment. With
g = lane >> 2 and t = lane & 3: a lane's A registers a0..a3 hold 16 codes, value i (byte i & 3 of register i >> 2)
at row g + 8 * ((i >> 2) & 1), column 4t + (i & 3) + 16 * (i >> 3); its B registers b0, b1 hold 8 codes, value i
at k = 4t + (i & 3) + 16 * (i >> 2) of column g; its C/D values i = 0..3 are at row g + 8 * (i >> 1), column
2t + (i & 1). `mma_m16n8k32_layout()` returns these maps, `pack_mma_m16n8k32` packs matrices into per-lane
registers, `mma_m16n8k32_reference` is the NumPy result. The twin computes D in FP32, summing k in order; the
hardware's accumulator keeps fewer bits (`fp8lab.numerics.accum` models it). On sm_90, NVIDIA runs FP8 mma.sync
through the FP16 tensor-core path (CUTLASS issue 1986): full FP8 rate on Hopper needs wgmma.
"""

from __future__ import annotations

import functools

import numpy as np

from ...numerics import formats
from .. import runtime
from .. import simgaps as _simgaps
from ..runtime import cuda
from .base import HARDWARE, sum_in_order

MMA_M16N8K32_E4M3 = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"
MMA_FP8_CC = (8, 9)  # FP8 mma.sync: sm_89 and newer
MMA_FP8 = runtime.Capability("FP8 mma.sync, which needs compute capability 8.9 or newer", MMA_FP8_CC)
"""What a kernel issuing FP8 mma.sync needs (a kernel version's `needs`, kernels.versions)."""


def require_mma_fp8(version) -> None:
    """ValueError naming `version` unless this GPU runs FP8 mma.sync."""
    runtime.require(MMA_FP8, version)


# ----------------------------------------------------------------------------------------------------------------
# The hardware path: the @intrinsic builder (GPU only)
# ----------------------------------------------------------------------------------------------------------------


def mma_instruction(fa: str = "e4m3", fb: str = "e4m3") -> str:
    """The PTX of one FP8 mma.sync m16n8k32 with float32 C and D: A in format fa, B in fb."""
    return f"mma.sync.aligned.m16n8k32.row.col.f32.{fa}.{fb}.f32"


def mma_intrinsic(instruction: str = MMA_M16N8K32_E4M3):
    """An @intrinsic `mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)` (GPU only): one warp-wide
    `mma.sync` (`instruction`: m16n8k32 with FP8 operands packed four to a 32-bit register, or m16n8k16 with
    bfloat16 ones packed two to a register), float32 C and D. Every lane of the warp must call it (".sync.aligned");
    the asm is marked as having side effects so the compiler never moves it into a branch or merges two of them."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        regs, accs = (a0, a1, a2, a3, b0, b1), (c0, c1, c2, c3)
        if not all(isinstance(r, types.Integer) for r in regs) or not all(isinstance(c, types.Float) for c in accs):
            return None
        sig = types.UniTuple(types.float32, 4)(*regs, *accs)

        def codegen(context, builder, sig, args):
            i32, f32 = ir.IntType(32), ir.FloatType()
            ins = []
            for v, ty in zip(args[:6], sig.args[:6]):
                ins.append(builder.trunc(v, i32) if ty.bitwidth > 32 else builder.zext(v, i32) if ty.bitwidth < 32
                           else v)
            ins += [context.cast(builder, v, ty, types.float32) for v, ty in zip(args[6:], sig.args[6:])]
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = ir.InlineAsm(fnty, f"{instruction} {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, "
                                     "{$10, $11, $12, $13};", "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=True)
            res = builder.call(asm, ins)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, k) for k in range(4)])

        return sig, codegen

    mma.__name__ = mma.__qualname__ = "mma_" + instruction.replace(".", "_")
    return intrinsic(mma)


# ----------------------------------------------------------------------------------------------------------------
# The fragment layout, in NumPy (PTX ISA, "Matrix Fragments for mma.m16n8k32")
# ----------------------------------------------------------------------------------------------------------------


def mma_m16n8k32_layout() -> dict[str, np.ndarray]:
    """Which element each lane holds: "a" (32, 16, 2) = (row, k) of A value i of lane l; "b" (32, 8, 2) = (k, col)
    of B value i; "c" (32, 4, 2) = (row, col) of C/D value i."""
    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane & 3
    i = np.arange(16)[None, :]
    a = np.stack(np.broadcast_arrays(g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3)), axis=-1)
    i = np.arange(8)[None, :]
    b = np.stack(np.broadcast_arrays(4 * t + (i & 3) + 16 * (i >> 2), g + 0 * i), axis=-1)
    i = np.arange(4)[None, :]
    c = np.stack(np.broadcast_arrays(g + 8 * (i >> 1), 2 * t + (i & 1)), axis=-1)
    return {"a": a, "b": b, "c": c}


def _pack(lay, a, b, names, dtype, k):
    """Per-lane registers (a (32, 4) uint32, b (32, 2) uint32) of an m16n8k`k` mma from A (16, k) and B given as
    its transpose (8, k) (the "col" layout), elements of `dtype` packed low first into 32-bit registers."""
    a, b = np.asarray(a, dtype), np.asarray(b, dtype)
    if a.shape != (16, k) or b.shape != (8, k):
        raise ValueError(f"{names[0]} must have shape (16, {k}) and {names[1]} (8, {k}), got {a.shape} and "
                         f"{b.shape}")
    a_vals = a[lay["a"][..., 0], lay["a"][..., 1]]
    b_vals = b[lay["b"][..., 1], lay["b"][..., 0]]  # B[k, n] = b[n, k]
    return (np.ascontiguousarray(a_vals).view(np.uint32).reshape(32, 4),
            np.ascontiguousarray(b_vals).view(np.uint32).reshape(32, 2))


_MMA_LAYOUT = mma_m16n8k32_layout()


def pack_mma_m16n8k32(a_codes, b_codes):
    """Per-lane registers: (a (32, 4) uint32, b (32, 2) uint32) from FP8 codes a (16, 32) and b (8, 32), i.e. B
    given as its transpose (N, K), the "col" layout; byte j of a register is value 4 * register + j."""
    return _pack(_MMA_LAYOUT, a_codes, b_codes, ("a_codes", "b_codes"), np.uint8, 32)


def mma_m16n8k32_reference(a_codes, b_codes, c, fmt: str = "e4m3", fmt_b: str | None = None) -> np.ndarray:
    """D (16, 8) float32 = decode(a) @ decode(b).T + c, summed in FP32 in k order (what the twins compute); a in
    format fmt, b in fmt_b (default: fmt). Any number of rows of a works the same (row by row)."""
    a = formats.decode(np.asarray(a_codes, np.uint8), formats.get_format(fmt)).astype(np.float32)
    b = formats.decode(np.asarray(b_codes, np.uint8), formats.get_format(fmt_b or fmt)).astype(np.float32)
    d = np.asarray(c, np.float32).copy()
    for k in range(a.shape[1]):  # products of FP8 values are exact in float32; the sums round
        d = (d + a[:, k : k + 1] * b[None, :, k]).astype(np.float32)
    return d


# ----------------------------------------------------------------------------------------------------------------
# The twin (simulator) and the binding
# ----------------------------------------------------------------------------------------------------------------


def _make_twin(lay, dtype, k, decode_a, decode_b):
    """Twin of a warp-wide mma.sync m16n8k`k` whose operands are `dtype` elements packed into 32-bit registers:
    gather every lane's fragments, rebuild A and B (the layout `lay`), decode them to float32 (decode_a, decode_b)
    and compute this lane's four outputs (FP32 sums in k order)."""

    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        regs = _simgaps.warp_allgather((a0, a1, a2, a3, b0, b1))
        a_vals = np.array([r[:4] for r in regs], np.uint32).view(dtype).reshape(32, -1)
        b_vals = np.array([r[4:] for r in regs], np.uint32).view(dtype).reshape(32, -1)
        a = np.zeros((16, k), dtype)
        b = np.zeros((8, k), dtype)
        a[lay["a"][..., 0], lay["a"][..., 1]] = a_vals
        b[lay["b"][..., 1], lay["b"][..., 0]] = b_vals
        lane = _simgaps.lane_id()
        av = decode_a(a[lay["c"][lane, :, 0]])  # (4, k): this lane's rows
        bv = decode_b(b[lay["c"][lane, :, 1]])  # and columns
        d = sum_in_order(np.array([c0, c1, c2, c3], np.float32), av * bv)
        return d[0], d[1], d[2], d[3]

    return mma


def _twin_mma(fa: str = "e4m3", fb: str = "e4m3"):
    """Twin of the warp-wide FP8 mma.sync m16n8k32 in formats fa, fb (codes decoded through value tables)."""
    ta, tb = formats.value_table(fa), formats.value_table(fb)
    return _make_twin(_MMA_LAYOUT, np.uint8, 32, lambda x: ta[x].astype(np.float32),
                      lambda x: tb[x].astype(np.float32))


_twin_mma_m16n8k32_e4m3 = _twin_mma()

if HARDWARE:
    mma_m16n8k32_e4m3 = mma_intrinsic(MMA_M16N8K32_E4M3)
else:
    mma_m16n8k32_e4m3 = cuda.jit(device=True)(_twin_mma_m16n8k32_e4m3)


@functools.lru_cache(maxsize=None)
def mma_m16n8k32(fa: str = "e4m3", fb: str = "e4m3"):
    """The mma.sync m16n8k32 of A in format fa and B in fb (float32 C and D), hardware or twin."""
    if (fa, fb) == ("e4m3", "e4m3"):
        return mma_m16n8k32_e4m3
    if HARDWARE:
        return mma_intrinsic(mma_instruction(fa, fb))
    return cuda.jit(device=True)(_twin_mma(fa, fb))


# ----------------------------------------------------------------------------------------------------------------
# BF16 mma.sync m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"; sm_80+)
# ----------------------------------------------------------------------------------------------------------------

MMA_M16N8K16_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
MMA_BF16 = runtime.Capability("BF16 mma.sync, which needs compute capability 8.0 or newer", (8, 0))
"""What a kernel issuing BF16 mma.sync needs (a kernel version's `needs`)."""


def mma_m16n8k16_layout() -> dict[str, np.ndarray]:
    """Which element each lane holds in the BF16 m16n8k16 (g = lane >> 2, t = lane & 3): "a" (32, 8, 2), value i
    (half i & 1 of register i >> 1) at row g + 8 * ((i >> 1) & 1), column 2t + (i & 1) + 8 * (i >> 2); "b"
    (32, 4, 2), value i at k = 2t + (i & 1) + 8 * (i >> 1) of column g; "c" (32, 4, 2), as m16n8k32's: row
    g + 8 * (i >> 1), column 2t + (i & 1). So the C fragments of two neighbouring n8 tiles are, as pairs, the A
    fragment of a k16 product: what flash attention uses to feed its probabilities P to P V without shared memory."""
    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane & 3
    i = np.arange(8)[None, :]
    a = np.stack(np.broadcast_arrays(g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)), axis=-1)
    i = np.arange(4)[None, :]
    b = np.stack(np.broadcast_arrays(2 * t + (i & 1) + 8 * (i >> 1), g + 0 * i), axis=-1)
    c = _MMA_LAYOUT["c"]
    return {"a": a, "b": b, "c": c}


_MMA16_LAYOUT = mma_m16n8k16_layout()


def pack_mma_m16n8k16(a_bits, b_bits):
    """Per-lane registers (a (32, 4) uint32, b (32, 2) uint32) from bfloat16 bits a (16, 16) and b (8, 16) uint16,
    B given as its transpose (N, K); the low half of a register is its first value."""
    return _pack(_MMA16_LAYOUT, a_bits, b_bits, ("a_bits", "b_bits"), np.uint16, 16)


def _bf16_values(bits) -> np.ndarray:
    """float32 values of bfloat16 bits (uint16): exact, the bits moved up by 16."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def mma_m16n8k16_reference(a_bits, b_bits, c) -> np.ndarray:
    """D (16, 8) float32 = bf16(a) @ bf16(b).T + c summed in FP32 in k order (what the twin computes; the products
    of two bfloat16 values are exact in float32)."""
    a, b = _bf16_values(a_bits), _bf16_values(b_bits)
    return sum_in_order(np.asarray(c, np.float32), a[:, None, :] * b[None, :, :])


if HARDWARE:  # the FP8 builder's asm: any operands packed into 32-bit registers, float32 C and D
    mma_m16n8k16_bf16 = mma_intrinsic(MMA_M16N8K16_BF16)
else:
    mma_m16n8k16_bf16 = cuda.jit(device=True)(_make_twin(_MMA16_LAYOUT, np.uint16, 16, _bf16_values,
                                                         _bf16_values))
