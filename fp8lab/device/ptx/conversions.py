"""FP8 conversions, bit casts and the global timer: the intrinsics that touch registers only, each with its twin.

- `cvt_e4m3x2_satfinite(hi, lo)`, `cvt_e5m2x2_satfinite`: two float32 -> two FP8 codes packed in a uint16
  (`cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32`); `encode_e4m3_sat_hw(x)`, `encode_e5m2_sat_hw(x)`: the low byte of the
  cvt of (0, x), one code as CUDA's `__nv_cvt_float_to_fp8` makes it;
- `decode_e4m3x2(codes16)`, `decode_e5m2x2`: two codes -> two float32 (`cvt.rn.f16x2.{e4m3x2,e5m2x2}`, widened);
- `f32_as_u32(x)`, `u32_as_f32(u)`: `mov.b32`, the same 32 bits read as the other type;
- `globaltimer_ns()`: PTX's `%globaltimer`, a nanosecond clock.
The builders (`cvt_x2_intrinsic`, `decode_x2_intrinsic`, `bitcast_intrinsics`, `globaltimer_intrinsic`) make the
GPU's @intrinsics; under the simulator each name is a twin built on `fp8lab.numerics.formats` or NumPy.

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
"""

from __future__ import annotations

import time

import numpy as np

from ...numerics import formats
from ..runtime import cuda
from .base import HARDWARE

CVT_E4M3X2 = "cvt.rn.satfinite.e4m3x2.f32"
CVT_E5M2X2 = "cvt.rn.satfinite.e5m2x2.f32"
CVT_F16X2_E4M3X2 = "cvt.rn.f16x2.e4m3x2"
CVT_F16X2_E5M2X2 = "cvt.rn.f16x2.e5m2x2"

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


def bitcast_intrinsics():
    """@intrinsics `f32_as_u32(x) -> uint32` and `u32_as_f32(u) -> float32` (GPU only): `mov.b32 d, a;` between
    a .f32 and a .b32 register, the same 32 bits read as the other type (CUDA's __float_as_uint / __uint_as_float).
    No conversion happens: NaN payloads (signalling ones too), -0.0, Inf and subnormals come out as they went in.
    A float64 x is first rounded to float32 (pass float32); an integer u is converted to uint32 first (its low
    32 bits, two's complement for negative values). Bit arithmetic on floats (bfloat16 rounding, kernels.common)
    is built on these."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def f32_as_u32(typingctx, x):
        if not isinstance(x, types.Float):
            return None  # numba then reports a typing error naming the argument type
        sig = types.uint32(x)

        def codegen(context, builder, sig, args):
            a = context.cast(builder, args[0], sig.args[0], types.float32)
            # "=r": a .b32 register, "f": a .f32 one; no side effects, so it may be moved or merged like arithmetic
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, "mov.b32 $0, $1;", "=r,f"), [a])

        return sig, codegen

    def u32_as_f32(typingctx, u):
        if not isinstance(u, types.Integer):
            return None
        sig = types.float32(u)

        def codegen(context, builder, sig, args):
            a = context.cast(builder, args[0], sig.args[0], types.uint32)
            fnty = ir.FunctionType(ir.FloatType(), [ir.IntType(32)])
            return builder.call(ir.InlineAsm(fnty, "mov.b32 $0, $1;", "=f,r"), [a])

        return sig, codegen

    return intrinsic(f32_as_u32), intrinsic(u32_as_f32)


# ----------------------------------------------------------------------------------------------------------------
# The software twins (simulator): the NumPy spec itself
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


def _twin_f32_as_u32(x):
    """Twin of mov.b32 (.f32 -> .b32): a NumPy view, which keeps every bit (NaN payloads included)."""
    return np.float32(x).view(np.uint32)


def _twin_u32_as_f32(u):
    """Twin of mov.b32 (.b32 -> .f32): the low 32 bits of u viewed as float32."""
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Binding: one name per operation, hardware or twin
# ----------------------------------------------------------------------------------------------------------------

if HARDWARE:
    cvt_e4m3x2_satfinite = cvt_x2_intrinsic(CVT_E4M3X2)
    cvt_e5m2x2_satfinite = cvt_x2_intrinsic(CVT_E5M2X2)
    decode_e4m3x2 = decode_x2_intrinsic(CVT_F16X2_E4M3X2)
    decode_e5m2x2 = decode_x2_intrinsic(CVT_F16X2_E5M2X2)
    globaltimer_ns = globaltimer_intrinsic()
    f32_as_u32, u32_as_f32 = bitcast_intrinsics()
else:
    cvt_e4m3x2_satfinite = cuda.jit(device=True)(_twin_cvt_e4m3x2_satfinite)
    cvt_e5m2x2_satfinite = cuda.jit(device=True)(_twin_cvt_e5m2x2_satfinite)
    decode_e4m3x2 = cuda.jit(device=True)(_twin_decode_e4m3x2)
    decode_e5m2x2 = cuda.jit(device=True)(_twin_decode_e5m2x2)
    globaltimer_ns = cuda.jit(device=True)(_twin_globaltimer_ns)
    f32_as_u32 = cuda.jit(device=True)(_twin_f32_as_u32)
    u32_as_f32 = cuda.jit(device=True)(_twin_u32_as_f32)


@cuda.jit(device=True)
def encode_e4m3_sat_hw(x):
    """E4M3 code (int 0..255) of x: the low byte of cvt.rn.satfinite.e4m3x2.f32 (0, x), as CUDA's
    __nv_cvt_float_to_fp8 does."""
    return cvt_e4m3x2_satfinite(_F32_ZERO, x) & 0xFF


@cuda.jit(device=True)
def encode_e5m2_sat_hw(x):
    """E5M2 code (int 0..255) of x: the low byte of cvt.rn.satfinite.e5m2x2.f32 (0, x)."""
    return cvt_e5m2x2_satfinite(_F32_ZERO, x) & 0xFF
