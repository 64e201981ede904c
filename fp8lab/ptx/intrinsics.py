"""Every inline-PTX intrinsic of the course, each with its simulator twin, bound once by backend.

On a GPU (`HARDWARE`) each name below is an `@intrinsic` (numba.cuda.extending) that emits PTX through llvmlite's
`InlineAsm`, or a device function built on one. Under the simulator, which cannot run PTX, the same name is a
software twin with the same result, so kernel source never forks by backend. On a GPU, tests/test_ptx.py proves
hardware == twin bit for bit.

| name | PTX (GPU) | twin (simulator) |
|---|---|---|
| `cvt_e4m3x2_satfinite(hi, lo)`, `cvt_e5m2x2_satfinite` | `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` | `formats.encode(.., saturate=True)` |
| `encode_e4m3_sat_hw(x)`, `encode_e5m2_sat_hw(x)` | the low byte of the cvt of (0, x) | the same on the twin |
| `decode_e4m3x2(codes16)`, `decode_e5m2x2` | `cvt.rn.f16x2.{e4m3x2,e5m2x2}` + 2 `cvt.f32.f16` | `formats.decode` |
| `globaltimer_ns()` | `mov.u64 d, %globaltimer;` | the host's nanosecond clock |
| `ld_global_v4_f32(x, i, j)` | `ld.global.v4.f32` (16-byte aligned) | four scalar loads |
| `ld_shared_v4_f32(s, i, j)`, `st_shared_v4_f32(s, i, j, ...)` | `ld/st.shared.v4.f32` (addrspacecast) | four scalar accesses |
| `mma_m16n8k32_e4m3(a0..a3, b0, b1, c0..c3)` | `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32` (one warp) | the warp's fragments gathered, FP32 sums in k order |

Operand order of cvt (PTX ISA, "cvt", data movement and conversion instructions): in
`cvt.rn.satfinite.e4m3x2.f32 d, a, b;` "the value converted from input a is stored in the upper 8 bits of d and
the value converted from input b is stored in the lower 8 bits of d" (d is .b16). CUDA's cuda_fp8.hpp
(`__nv_cvt_float_to_fp8`) writes `cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;` with inputs (x, 0.0f) and keeps the
low byte: the same order. Here the intrinsic's arguments follow the instruction: cvt(hi=a, lo=b). In LLVM IR
inline assembly the operands are written `$0, $1, $2` (CUDA C++'s `%0` is a literal `%` there, the prefix of
PTX register names).

What cvt does: round to nearest even; `.satfinite` clamps overflow and +-Inf to +-max normal (448 / 57344), the
policy of `formats.encode(..., saturate=True)`. It needs sm_89 or newer (PTX ISA 7.8). Differences to know:
- NaN: the PTX ISA promises only "NaN" for a NaN input, not which code. The twin returns the quiet NaN with the
  input's sign (E4M3 0x7F / 0xFF, E5M2 0x7E / 0xFE); tests compare NaN-ness there.
- float64 inputs: the instruction reads float32, so the hardware path rounds a float64 to float32 first (two
  roundings), while the twin rounds a float64 directly. Pass float32 (the course's kernels do).
- `cvt.rn.f16x2.e4m3x2` returns a positive canonical NaN for 0xFF; the twin keeps the code's sign.

mma.sync m16n8k32 (PTX ISA, "Matrix Fragments for mma.m16n8k32", the .e4m3/.e5m2/.s8 layout; sm_89+): one warp
computes D (16 x 8, f32) = A (16 x 32, "row") @ B (32 x 8, "col") + C, each lane holding a fragment. With
g = lane >> 2 and t = lane & 3: a lane's A registers a0..a3 hold 16 codes, value i (byte i & 3 of register i >> 2)
at row g + 8 * ((i >> 2) & 1), column 4t + (i & 3) + 16 * (i >> 3); its B registers b0, b1 hold 8 codes, value i
at k = 4t + (i & 3) + 16 * (i >> 2) of column g; its C/D values i = 0..3 are at row g + 8 * (i >> 1), column
2t + (i & 1). `mma_m16n8k32_layout()` returns these maps, `pack_mma_m16n8k32` packs matrices into per-lane
registers, `mma_m16n8k32_reference` is the NumPy result. The twin computes D in FP32, summing k in order; the
hardware's accumulator keeps fewer bits (`fp8lab.accum` models it). On sm_90, NVIDIA runs FP8 mma.sync
through the FP16 tensor-core path (CUTLASS issue 1986): full FP8 rate on Hopper needs wgmma.

Vector loads: the PTX ISA requires a vector access to be aligned to its full size (16 bytes); a misaligned one
faults. Numba hands kernels a generic pointer to a shared array; casting it back to the shared address space
(addrspacecast to addrspace(3)) and loading a <4 x float> with align 16 lets NVVM emit one `ld.shared.v4.f32`,
with no inline assembly.
"""

from __future__ import annotations

import time

import numpy as np

from .. import _simgaps, formats, runtime
from ..runtime import cuda

HARDWARE = not runtime.IS_SIM
"""True on a GPU: the names here run PTX. False under the simulator: software twins."""

CVT_E4M3X2 = "cvt.rn.satfinite.e4m3x2.f32"
CVT_E5M2X2 = "cvt.rn.satfinite.e5m2x2.f32"
CVT_F16X2_E4M3X2 = "cvt.rn.f16x2.e4m3x2"
CVT_F16X2_E5M2X2 = "cvt.rn.f16x2.e5m2x2"
MMA_M16N8K32_E4M3 = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"

_F32_ZERO = np.float32(0.0)


# ----------------------------------------------------------------------------------------------------------------
# The hardware path: @intrinsic builders (GPU only)
# ----------------------------------------------------------------------------------------------------------------


def cvt_x2_intrinsic(instruction: str):
    """An @intrinsic `cvt(hi, lo) -> uint16` running `<instruction> d, hi, lo;` (GPU only).

    instruction: a PTX conversion of two .f32 inputs to a packed .b16, e.g. "cvt.rn.satfinite.e4m3x2.f32".
    The PTX ISA stores the value converted from the first source (hi) in the upper 8 bits of d and the second
    (lo) in the lower 8 bits. Any float argument is converted to float32 first (a float64 is rounded once to
    float32 before the instruction rounds it again: pass float32).
    """
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def cvt_x2(typingctx, hi, lo):
        if not (isinstance(hi, types.Float) and isinstance(lo, types.Float)):
            return None  # numba then reports a typing error naming the argument types
        sig = types.uint16(hi, lo)

        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            a = context.cast(builder, args[0], sig.args[0], types.float32)
            b = context.cast(builder, args[1], sig.args[1], types.float32)
            # "=h": d is a 16-bit register (.b16); "f", "f": a and b are .f32 registers. No side effects, so
            # the compiler may move or merge identical conversions like any arithmetic.
            fnty = ir.FunctionType(ir.IntType(16), [f32, f32])
            asm = ir.InlineAsm(fnty, f"{instruction} $0, $1, $2;", "=h,f,f")
            return builder.call(asm, [a, b])

        return sig, codegen

    cvt_x2.__name__ = cvt_x2.__qualname__ = "cvt_x2_" + instruction.replace(".", "_")
    return intrinsic(cvt_x2)


def decode_x2_intrinsic(instruction: str):
    """An @intrinsic `decode(codes16) -> (lo, hi)`: two FP8 codes packed in a uint16 -> two float32 (GPU only).

    instruction: "cvt.rn.f16x2.e4m3x2" or "cvt.rn.f16x2.e5m2x2" (sm_89+). It converts both bytes to a pair of
    float16 (exact: every E4M3 and E5M2 value is a float16), then `cvt.f32.f16` widens each (exact). The low
    byte comes back first, matching the packing of the cvt_*x2_satfinite encoders.
    """
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def decode_x2(typingctx, codes):
        if not isinstance(codes, types.Integer):
            return None
        sig = types.UniTuple(types.float32, 2)(codes)

        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            c16 = builder.trunc(args[0], ir.IntType(16)) if sig.args[0].bitwidth > 16 else \
                builder.zext(args[0], ir.IntType(16)) if sig.args[0].bitwidth < 16 else args[0]
            fnty = ir.FunctionType(ir.LiteralStructType([f32, f32]), [ir.IntType(16)])
            asm = ir.InlineAsm(
                fnty,
                "{ .reg .b32 h2; .reg .b16 lo, hi; "
                f"{instruction} h2, $2; mov.b32 {{lo, hi}}, h2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }}",
                "=f,=f,h")
            res = builder.call(asm, [c16])
            vals = [builder.extract_value(res, k) for k in range(2)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    decode_x2.__name__ = decode_x2.__qualname__ = "decode_x2_" + instruction.replace(".", "_")
    return intrinsic(decode_x2)


def globaltimer_intrinsic():
    """An @intrinsic `globaltimer_ns() -> uint64`: PTX's %globaltimer, a nanosecond clock shared by the GPU (GPU
    only). The asm is marked as having side effects, so the compiler neither merges two reads nor hoists one
    out of a loop."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def globaltimer_ns(typingctx):
        sig = types.uint64()

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(64), [])
            return builder.call(ir.InlineAsm(fnty, "mov.u64 $0, %globaltimer;", "=l", side_effect=True), [])

        return sig, codegen

    return intrinsic(globaltimer_ns)


def ld_global_v4_intrinsic(instruction: str = "ld.global.v4.f32"):
    """An @intrinsic `ld_global_v4_f32(x, i, j) -> (x[i,j], x[i,j+1], x[i,j+2], x[i,j+3])` (GPU only).

    x: a 2-D float32 array in global memory; the address of x[i, j] must be 16-byte aligned (the PTX ISA requires
    vector accesses to be aligned to their full size; a misaligned one faults). No bounds check.
    """
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def ld_global_v4_f32(typingctx, x, i, j):
        if not (isinstance(x, types.Array) and x.ndim == 2 and x.dtype == types.float32
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            return None  # numba then reports a typing error naming the argument types
        sig = types.UniTuple(types.float32, 4)(x, i, j)

        def codegen(context, builder, sig, args):
            xty, ity, jty = sig.args
            ary = context.make_array(xty)(context, builder, value=args[0])
            inds = [context.cast(builder, args[1], ity, types.intp), context.cast(builder, args[2], jty, types.intp)]
            ptr = cgutils.get_item_pointer(context, builder, xty, ary, inds)
            f32 = ir.FloatType()
            # four "=f" outputs (.f32 registers) returned as one struct, "l": the 64-bit address
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [f32.as_pointer()])
            asm = ir.InlineAsm(fnty, instruction + " {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l")
            res = builder.call(asm, [ptr])
            vals = [builder.extract_value(res, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return intrinsic(ld_global_v4_f32)


def shared_v4_intrinsics():
    """@intrinsics `ld_shared_v4_f32(s, i, j)` -> s[i, j:j+4] and `st_shared_v4_f32(s, i, j, x0, x1, x2, x3)`.

    s: a 2-D float32 shared array; the element address must be 16-byte aligned (rows of a multiple of 4 floats,
    j a multiple of 4). Numba hands kernels a generic pointer to a shared array; casting it back to the shared
    address space (addrspacecast to addrspace(3)) and loading a <4 x float> with align 16 lets NVVM emit one
    `ld.shared.v4.f32` (or `st.shared.v4.f32`) instead of four scalar accesses. No bounds check.
    """
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    f32 = ir.FloatType()
    vec = ir.VectorType(f32, 4)

    def _shared_ptr(context, builder, sig, args):
        xty, ity, jty = sig.args[:3]
        ary = context.make_array(xty)(context, builder, value=args[0])
        inds = [context.cast(builder, args[1], ity, types.intp), context.cast(builder, args[2], jty, types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, xty, ary, inds)
        return builder.bitcast(builder.addrspacecast(ptr, f32.as_pointer(3)), vec.as_pointer(3))

    def _ok(x, i, j):
        return (isinstance(x, types.Array) and x.ndim == 2 and x.dtype == types.float32
                and isinstance(i, types.Integer) and isinstance(j, types.Integer))

    def ld_shared_v4_f32(typingctx, x, i, j):
        if not _ok(x, i, j):
            return None
        sig = types.UniTuple(types.float32, 4)(x, i, j)

        def codegen(context, builder, sig, args):
            v = builder.load(_shared_ptr(context, builder, sig, args), align=16)
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), k)) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    def st_shared_v4_f32(typingctx, x, i, j, x0, x1, x2, x3):
        if not (_ok(x, i, j) and all(isinstance(t, types.Float) for t in (x0, x1, x2, x3))):
            return None
        sig = types.void(x, i, j, x0, x1, x2, x3)

        def codegen(context, builder, sig, args):
            v = ir.Constant(vec, ir.Undefined)
            for k in range(4):
                val = context.cast(builder, args[3 + k], sig.args[3 + k], types.float32)
                v = builder.insert_element(v, val, ir.Constant(ir.IntType(32), k))
            builder.store(v, _shared_ptr(context, builder, sig, args), align=16)
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(ld_shared_v4_f32), intrinsic(st_shared_v4_f32)



def mma_intrinsic(instruction: str = MMA_M16N8K32_E4M3):
    """An @intrinsic `mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)` (GPU only): one warp-wide
    `mma.sync` of shape m16n8k32, FP8 operands packed four to a 32-bit register, float32 C and D. Every lane of
    the warp must call it (".sync.aligned"); the asm is marked as having side effects so the compiler never
    moves it into a branch or merges two of them."""
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
# The mma.sync m16n8k32 fragment layout, in NumPy (PTX ISA, "Matrix Fragments for mma.m16n8k32")
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


def pack_mma_m16n8k32(a_codes, b_codes):
    """Per-lane registers: (a (32, 4) uint32, b (32, 2) uint32) from FP8 codes a (16, 32) and b (8, 32), i.e. B
    given as its transpose (N, K), the "col" layout; byte j of a register is value 4 * register + j."""
    a_codes, b_codes = np.asarray(a_codes, np.uint8), np.asarray(b_codes, np.uint8)
    if a_codes.shape != (16, 32) or b_codes.shape != (8, 32):
        raise ValueError(f"a_codes must have shape (16, 32) and b_codes (8, 32), got {a_codes.shape} and "
                         f"{b_codes.shape}")
    lay = mma_m16n8k32_layout()
    a_vals = a_codes[lay["a"][..., 0], lay["a"][..., 1]]  # (32, 16)
    b_vals = b_codes[lay["b"][..., 1], lay["b"][..., 0]]  # (32, 8): B[k, n] = b_codes[n, k]
    return (np.ascontiguousarray(a_vals).view(np.uint32).reshape(32, 4),
            np.ascontiguousarray(b_vals).view(np.uint32).reshape(32, 2))


_MMA_LAYOUT = mma_m16n8k32_layout()


def mma_m16n8k32_reference(a_codes, b_codes, c, fmt: str = "e4m3") -> np.ndarray:
    """D (16, 8) float32 = decode(a) @ decode(b).T + c, summed in FP32 in k order (what the twin computes)."""
    f = formats.get_format(fmt)
    a = formats.decode(np.asarray(a_codes, np.uint8), f).astype(np.float32)
    b = formats.decode(np.asarray(b_codes, np.uint8), f).astype(np.float32)
    d = np.asarray(c, np.float32).copy()
    for k in range(a.shape[1]):  # products of FP8 values are exact in float32; the sums round
        d = (d + a[:, k : k + 1] * b[None, :, k]).astype(np.float32)
    return d


# ----------------------------------------------------------------------------------------------------------------
# The software twins (simulator): the NumPy spec itself, or plain loads
# ----------------------------------------------------------------------------------------------------------------


def _code(x, fmt) -> int:
    return int(formats.encode(np.float64(x), fmt, saturate=True))


def _twin_cvt_e4m3x2_satfinite(hi, lo):
    """Twin of cvt.rn.satfinite.e4m3x2.f32: (code(hi) << 8) | code(lo), the spec's saturating encode."""
    return (_code(hi, formats.E4M3) << 8) | _code(lo, formats.E4M3)


def _twin_cvt_e5m2x2_satfinite(hi, lo):
    """Twin of cvt.rn.satfinite.e5m2x2.f32."""
    return (_code(hi, formats.E5M2) << 8) | _code(lo, formats.E5M2)


def _twin_decode_e4m3x2(codes):
    """Twin of cvt.rn.f16x2.e4m3x2 widened to float32: (value of the low byte, of the high byte)."""
    table = formats.value_table(formats.E4M3)
    return table[int(codes) & 0xFF], table[(int(codes) >> 8) & 0xFF]


def _twin_decode_e5m2x2(codes):
    """Twin of cvt.rn.f16x2.e5m2x2 widened to float32."""
    table = formats.value_table(formats.E5M2)
    return table[int(codes) & 0xFF], table[(int(codes) >> 8) & 0xFF]


def _twin_globaltimer_ns():
    return np.uint64(time.perf_counter_ns())


def _twin_ld_global_v4_f32(x, i, j):
    """Twin of ld.global.v4.f32: four scalar loads."""
    return x[i, j], x[i, j + 1], x[i, j + 2], x[i, j + 3]


def _twin_ld_shared_v4_f32(s, i, j):
    """Twin of ld.shared.v4.f32: four scalar loads."""
    return s[i, j], s[i, j + 1], s[i, j + 2], s[i, j + 3]


def _twin_mma_m16n8k32_e4m3(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """Twin of the warp-wide mma.sync: gather every lane's fragments, rebuild A and B, and compute this lane's
    four outputs (FP32 sums in k order)."""
    regs = _simgaps.warp_allgather((a0, a1, a2, a3, b0, b1))
    lay = _MMA_LAYOUT
    a_vals = np.array([r[:4] for r in regs], np.uint32).view(np.uint8).reshape(32, 16)
    b_vals = np.array([r[4:] for r in regs], np.uint32).view(np.uint8).reshape(32, 8)
    a = np.zeros((16, 32), np.uint8)
    b = np.zeros((8, 32), np.uint8)
    a[lay["a"][..., 0], lay["a"][..., 1]] = a_vals
    b[lay["b"][..., 1], lay["b"][..., 0]] = b_vals
    lane = _simgaps.lane_id()
    av = formats.decode(a[lay["c"][lane, :, 0]], formats.E4M3).astype(np.float32)  # (4, 32): this lane's rows
    bv = formats.decode(b[lay["c"][lane, :, 1]], formats.E4M3).astype(np.float32)  # and columns
    d = np.array([c0, c1, c2, c3], np.float32)
    for k in range(32):  # the reference's order
        d = (d + av[:, k] * bv[:, k]).astype(np.float32)
    return d[0], d[1], d[2], d[3]


def _twin_st_shared_v4_f32(s, i, j, x0, x1, x2, x3):
    """Twin of st.shared.v4.f32: four scalar stores."""
    s[i, j] = x0
    s[i, j + 1] = x1
    s[i, j + 2] = x2
    s[i, j + 3] = x3


# ----------------------------------------------------------------------------------------------------------------
# Binding: one name per operation, hardware or twin
# ----------------------------------------------------------------------------------------------------------------

if HARDWARE:
    cvt_e4m3x2_satfinite = cvt_x2_intrinsic(CVT_E4M3X2)
    cvt_e5m2x2_satfinite = cvt_x2_intrinsic(CVT_E5M2X2)
    decode_e4m3x2 = decode_x2_intrinsic(CVT_F16X2_E4M3X2)
    decode_e5m2x2 = decode_x2_intrinsic(CVT_F16X2_E5M2X2)
    globaltimer_ns = globaltimer_intrinsic()
    ld_global_v4_f32 = ld_global_v4_intrinsic()
    ld_shared_v4_f32, st_shared_v4_f32 = shared_v4_intrinsics()
    mma_m16n8k32_e4m3 = mma_intrinsic(MMA_M16N8K32_E4M3)
else:
    cvt_e4m3x2_satfinite = cuda.jit(device=True)(_twin_cvt_e4m3x2_satfinite)
    cvt_e5m2x2_satfinite = cuda.jit(device=True)(_twin_cvt_e5m2x2_satfinite)
    decode_e4m3x2 = cuda.jit(device=True)(_twin_decode_e4m3x2)
    decode_e5m2x2 = cuda.jit(device=True)(_twin_decode_e5m2x2)
    globaltimer_ns = cuda.jit(device=True)(_twin_globaltimer_ns)
    ld_global_v4_f32 = cuda.jit(device=True)(_twin_ld_global_v4_f32)
    ld_shared_v4_f32 = cuda.jit(device=True)(_twin_ld_shared_v4_f32)
    st_shared_v4_f32 = cuda.jit(device=True)(_twin_st_shared_v4_f32)
    mma_m16n8k32_e4m3 = cuda.jit(device=True)(_twin_mma_m16n8k32_e4m3)


@cuda.jit(device=True)
def encode_e4m3_sat_hw(x):
    """E4M3 code (int 0..255) of x: the low byte of cvt.rn.satfinite.e4m3x2.f32 (0, x), as CUDA's
    __nv_cvt_float_to_fp8 does."""
    return cvt_e4m3x2_satfinite(_F32_ZERO, x) & 0xFF


@cuda.jit(device=True)
def encode_e5m2_sat_hw(x):
    """E5M2 code (int 0..255) of x: the low byte of cvt.rn.satfinite.e5m2x2.f32 (0, x)."""
    return cvt_e5m2x2_satfinite(_F32_ZERO, x) & 0xFF
