"""What every intrinsic module of `fp8lab.device.ptx` builds on: `HARDWARE` (whether the names bind to inline PTX or
to their simulator twins), the llvmlite helpers that emit inline PTX (`asm`, `byte_pointer`, `shared32`,
`barrier_intrinsic`), and the pieces the twins share (`as_bytes`, `sum_in_order`, `twin_noop`).
"""

from __future__ import annotations

import numpy as np

from .. import runtime

HARDWARE = not runtime.IS_SIM
"""True on a GPU: the names of fp8lab.device.ptx run PTX. False under the simulator: software twins."""


# ----------------------------------------------------------------------------------------------------------------
# Emitting inline PTX (GPU only)
# ----------------------------------------------------------------------------------------------------------------


def asm(builder, ret, argtys, text, constraints, args):
    """Emit one volatile inline-asm statement (side effects: never moved, merged or dropped)."""
    from llvmlite import ir

    return builder.call(ir.InlineAsm(ir.FunctionType(ret, argtys), text, constraints, side_effect=True), args)


def byte_pointer(context, builder, aryty, ary, off, offty):
    """Generic i8* to byte `off` of array `ary`'s data."""
    from llvmlite import ir
    from numba.cuda import types

    a = context.make_array(aryty)(context, builder, value=ary)
    p = builder.bitcast(a.data, ir.IntType(8).as_pointer())
    return builder.gep(p, [context.cast(builder, off, offty, types.intp)])


def shared32(builder, p):
    """The 32-bit shared-window address of a generic pointer into shared memory (what .shared operands take)."""
    from llvmlite import ir

    return builder.ptrtoint(builder.addrspacecast(p, ir.IntType(8).as_pointer(3)), ir.IntType(32))


def barrier_intrinsic(text: str, name: str):
    """An @intrinsic `name()` running one operand-free PTX statement with a memory clobber (GPU only)."""
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def barrier(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            asm(builder, ir.VoidType(), [], text, "~{memory}", [])
            return context.get_dummy_value()

        return sig, codegen

    barrier.__name__ = barrier.__qualname__ = name
    return intrinsic(barrier)


# ----------------------------------------------------------------------------------------------------------------
# Shared by the twins (simulator)
# ----------------------------------------------------------------------------------------------------------------


def as_bytes(s):
    """A shared array's bytes (a uint8 view), as the twins address it."""
    return s.view(np.uint8) if s.dtype != np.uint8 else s


def sum_in_order(c, products):
    """c + products[..., 0] + products[..., 1] + ... in float32, one rounding per addition, left to right (what the
    twins promise: the reference's k order). np.add.accumulate is sequential, unlike np.sum's pairwise sum; the
    products of two FP8 values are exact in float32."""
    terms = np.concatenate([np.asarray(c, np.float32)[..., None], np.asarray(products, np.float32)], axis=-1)
    return np.add.accumulate(terms, axis=-1, dtype=np.float32)[..., -1]


def twin_noop(*args):
    """Twin of an instruction that changes no value (fences, waits, commits: the twins finish at issue)."""
    return None

