"""Memory intrinsics, each with its twin: vector loads and stores, an L2 prefetch, and the copies and loads of the
tensor-core path (cp.async global -> shared copies in flight, ldmatrix fragment loads).

- `ld_global_v4_f32(x, i, j)`: `ld.global.v4.f32` of x[i, j:j+4] (16-byte aligned); `ld_global_nc_v4_f32`: the same
  through the read-only path, `ld.global.nc.L1::evict_last.v4.f32`, volatile (data the kernel never writes, read
  by every row: kept in L1, and never moved out of a loop);
- `ld_shared_v4_f32(s, i, j)`, `st_shared_v4_f32(s, i, j, x0, x1, x2, x3)`: `ld/st.shared.v4.f32`;
  `ld_shared_v4_f32_1d(s, k)`: the load of s[k:k+4] from a 1-D array (dynamic shared memory is 1-D);
- `prefetch_l2_bulk(a, i, j, nbytes)`: `cp.async.bulk.prefetch.L2.global` (sm_90), a hint;
- `shared_address(s)`, `cp_async_16(s, off, x, i, j, nbytes)`, `cp_async_commit()`, `cp_async_wait_group(n)`,
  `ldmatrix_x4(s, off)`: see `async_copy_intrinsics`.
Under the simulator the loads are scalar loads, cp.async a byte copy done at once, ldmatrix the warp's rows gathered.

Vector loads: the PTX ISA requires a vector access to be aligned to its full size (16 bytes); a misaligned one
faults. Numba hands kernels a generic pointer to a shared array; casting it back to the shared address space
(addrspacecast to addrspace(3)) and loading a <4 x float> with align 16 lets NVVM emit one `ld.shared.v4.f32`,
with no inline assembly.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import simgaps as _simgaps
from ..runtime import cuda
from .base import HARDWARE, as_bytes, asm, barrier_intrinsic, byte_pointer, shared32, twin_noop


# ----------------------------------------------------------------------------------------------------------------
# The hardware path: @intrinsic builders (GPU only)
# ----------------------------------------------------------------------------------------------------------------


def ld_global_v4_intrinsic(instruction: str = "ld.global.v4.f32", volatile: bool = False):
    """An @intrinsic `ld_global_v4_f32(x, i, j) -> (x[i,j], x[i,j+1], x[i,j+2], x[i,j+3])` (GPU only).

    x: a 2-D float32 array in global memory; the address of x[i, j] must be 16-byte aligned (the PTX ISA requires
    vector accesses to be aligned to their full size; a misaligned one faults). No bounds check. The asm reads
    no memory the compiler knows of, so it may move a load out of a loop whose address does not change; volatile
    keeps each load where it is written (in the loop: registers are not held across iterations).
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
            asm = ir.InlineAsm(fnty, instruction + " {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l", side_effect=volatile)
            res = builder.call(asm, [ptr])
            vals = [builder.extract_value(res, k) for k in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return intrinsic(ld_global_v4_f32)


def prefetch_l2_intrinsic():
    """An @intrinsic `prefetch_l2_bulk(a, i, j, nbytes)` (GPU only, sm_90): `cp.async.bulk.prefetch.L2.global [p],
    nbytes;` with p the address of a[i, j] (any 2-D array): asks L2 to fetch nbytes from p, with no register or
    shared memory to receive them and nothing to wait for, so that later loads of those bytes hit L2 (PTX ISA,
    "cp.async.bulk.prefetch"; p 16-byte aligned, nbytes a multiple of 16). No bounds check."""
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    def prefetch_l2_bulk(typingctx, a, i, j, nbytes):
        if not (isinstance(a, types.Array) and a.ndim == 2
                and all(isinstance(t, types.Integer) for t in (i, j, nbytes))):
            return None
        sig = types.void(a, i, j, nbytes)

        def codegen(context, builder, sig, args):
            aty, ity, jty, nty = sig.args
            ary = context.make_array(aty)(context, builder, value=args[0])
            inds = [context.cast(builder, args[1], ity, types.intp), context.cast(builder, args[2], jty, types.intp)]
            ptr = cgutils.get_item_pointer(context, builder, aty, ary, inds)
            n = context.cast(builder, args[3], nty, types.uint32)
            asm(builder, ir.VoidType(), [ptr.type, ir.IntType(32)], "cp.async.bulk.prefetch.L2.global [$0], $1;",
                 "l,r", [ptr, n])
            return context.get_dummy_value()

        return sig, codegen

    return intrinsic(prefetch_l2_bulk)


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


def ld_shared_v4_1d_intrinsic():
    """An @intrinsic `ld_shared_v4_f32_1d(s, k)` -> s[k:k+4] (GPU only): s a 1-D float32 shared array (such as the
    dynamic one, `cuda.shared.array(0, float32)`, which numba makes 1-D; reshaping it needs a helper that is not
    device code), k a multiple of 4 from a 16-byte aligned base. One `ld.shared.v4.f32`, as `ld_shared_v4_f32`."""
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    f32 = ir.FloatType()
    vec = ir.VectorType(f32, 4)

    def ld_shared_v4_f32_1d(typingctx, s, k):
        if not (isinstance(s, types.Array) and s.ndim == 1 and s.dtype == types.float32
                and isinstance(k, types.Integer)):
            return None
        sig = types.UniTuple(types.float32, 4)(s, k)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, value=args[0])
            ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary,
                                           [context.cast(builder, args[1], sig.args[1], types.intp)])
            p = builder.bitcast(builder.addrspacecast(ptr, f32.as_pointer(3)), vec.as_pointer(3))
            v = builder.load(p, align=16)
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), q)) for q in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return intrinsic(ld_shared_v4_f32_1d)


def async_copy_intrinsics():
    """@intrinsics `shared_address(s)`, `cp_async_16(s, off, x, i, j, nbytes)`, `cp_async_commit()` and
    `ldmatrix_x4(s, off)` (GPU only). s: a 1-D shared array, addressed in bytes from s[0]; x: a 2-D global array.

    cp.async (PTX ISA, "cp.async", sm_80+) copies 16 bytes from global to shared memory without passing through
    registers; `.cg` caches in L2 only. The fourth operand (src-size) copies only nbytes (0..16) and fills the
    rest of the 16 bytes with zeros: ragged edges need no branch. Both addresses must be 16-byte aligned.
    Copies complete in the order of `cp.async.commit_group`; `cp.async.wait_group n` waits until at most n
    groups are pending (cp_async_wait_group).

    ldmatrix (sm_75+): each of the warp's 32 lanes gives the shared address of one 16-byte row (lanes 8q..8q+7 the
    rows of matrix q); lane l receives, from each matrix q, register q = the 4 bytes at row l // 4, bytes
    4 (l % 4)..+3: exactly an mma.m16n8k32 A fragment (four 8 x 16-byte matrices) or two B fragments.
    """
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)

    def shared_address(typingctx, s):
        if not isinstance(s, types.Array):
            return None
        sig = types.uint32(s)

        def codegen(context, builder, sig, args):
            return shared32(builder, byte_pointer(context, builder, sig.args[0], args[0], ir.Constant(i32, 0),
                                                    types.int32))

        return sig, codegen

    def cp_async_16(typingctx, s, off, x, i, j, nbytes):
        if not (isinstance(s, types.Array) and isinstance(x, types.Array) and x.ndim == 2
                and all(isinstance(t, types.Integer) for t in (off, i, j, nbytes))):
            return None
        sig = types.void(s, off, x, i, j, nbytes)

        def codegen(context, builder, sig, args):
            dst = shared32(builder, byte_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1]))
            xty = sig.args[2]
            ary = context.make_array(xty)(context, builder, value=args[2])
            inds = [context.cast(builder, args[k], sig.args[k], types.intp) for k in (3, 4)]
            src = cgutils.get_item_pointer(context, builder, xty, ary, inds)
            n = context.cast(builder, args[5], sig.args[5], types.uint32)
            asm(builder, ir.VoidType(), [i32, src.type, i32], "cp.async.cg.shared.global [$0], [$1], 16, $2;",
                 "r,l,r,~{memory}", [dst, src, n])
            return context.get_dummy_value()

        return sig, codegen

    def cp_async_commit(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            asm(builder, ir.VoidType(), [], "cp.async.commit_group;", "~{memory}", [])
            return context.get_dummy_value()

        return sig, codegen

    def ldmatrix_x4(typingctx, s, off):
        if not (isinstance(s, types.Array) and isinstance(off, types.Integer)):
            return None
        sig = types.UniTuple(types.uint32, 4)(s, off)

        def codegen(context, builder, sig, args):
            addr = shared32(builder, byte_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1]))
            res = asm(builder, ir.LiteralStructType([i32] * 4), [i32],
                       "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}",
                       [addr])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, k) for k in range(4)])

        return sig, codegen

    return (intrinsic(shared_address), intrinsic(cp_async_16), intrinsic(cp_async_commit), intrinsic(ldmatrix_x4))


# ----------------------------------------------------------------------------------------------------------------
# The software twins (simulator): plain loads and copies
# ----------------------------------------------------------------------------------------------------------------


def _twin_ld_global_v4_f32(x, i, j):
    """Twin of ld.global.v4.f32: four scalar loads."""
    return x[i, j], x[i, j + 1], x[i, j + 2], x[i, j + 3]


def _twin_ld_shared_v4_f32(s, i, j):
    """Twin of ld.shared.v4.f32: four scalar loads."""
    return s[i, j], s[i, j + 1], s[i, j + 2], s[i, j + 3]


def _twin_ld_shared_v4_f32_1d(s, k):
    """Twin of ld.shared.v4.f32 on a 1-D array: four scalar loads."""
    return s[k], s[k + 1], s[k + 2], s[k + 3]


def _twin_prefetch_l2_bulk(a, i, j, nbytes):
    """Twin of cp.async.bulk.prefetch.L2: nothing (a prefetch changes no value)."""
    return None


def _twin_st_shared_v4_f32(s, i, j, x0, x1, x2, x3):
    """Twin of st.shared.v4.f32: four scalar stores."""
    s[i, j] = x0
    s[i, j + 1] = x1
    s[i, j + 2] = x2
    s[i, j + 3] = x3


def _twin_shared_address(s):
    """Twin: offsets are counted from s[0], which sits at address 0 (1024-byte aligned)."""
    return 0


def _twin_cp_async_16(s, off, x, i, j, nbytes):
    """Twin of cp.async 16 bytes with src-size: copy nbytes, zero the rest, at once."""
    b = as_bytes(s)
    for q in range(16):
        b[off + q] = x[i, j + q] if q < nbytes else 0


def _twin_ldmatrix_x4(s, off):
    """Twin of ldmatrix .x4 .b16: gather the warp's row offsets; register q of lane l = the 4 bytes at row l // 4
    of matrix q, from byte 4 (l % 4)."""
    offs = _simgaps.warp_allgather(off)
    lane = _simgaps.lane_id()
    b = as_bytes(s)
    out = []
    for q in range(4):
        o = offs[8 * q + lane // 4] + 4 * (lane % 4)
        out.append(np.uint32(int(b[o]) | int(b[o + 1]) << 8 | int(b[o + 2]) << 16 | int(b[o + 3]) << 24))
    return out[0], out[1], out[2], out[3]


# ----------------------------------------------------------------------------------------------------------------
# Binding: one name per operation, hardware or twin
# ----------------------------------------------------------------------------------------------------------------

if HARDWARE:
    ld_global_v4_f32 = ld_global_v4_intrinsic()
    ld_global_nc_v4_f32 = ld_global_v4_intrinsic("ld.global.nc.L1::evict_last.v4.f32", volatile=True)
    ld_shared_v4_f32, st_shared_v4_f32 = shared_v4_intrinsics()
    ld_shared_v4_f32_1d = ld_shared_v4_1d_intrinsic()
    prefetch_l2_bulk = prefetch_l2_intrinsic()
    shared_address, cp_async_16, cp_async_commit, ldmatrix_x4 = async_copy_intrinsics()
else:
    ld_global_v4_f32 = cuda.jit(device=True)(_twin_ld_global_v4_f32)
    ld_global_nc_v4_f32 = cuda.jit(device=True)(_twin_ld_global_v4_f32)
    ld_shared_v4_f32 = cuda.jit(device=True)(_twin_ld_shared_v4_f32)
    ld_shared_v4_f32_1d = cuda.jit(device=True)(_twin_ld_shared_v4_f32_1d)
    prefetch_l2_bulk = cuda.jit(device=True)(_twin_prefetch_l2_bulk)
    st_shared_v4_f32 = cuda.jit(device=True)(_twin_st_shared_v4_f32)
    shared_address = cuda.jit(device=True)(_twin_shared_address)
    cp_async_16 = cuda.jit(device=True)(_twin_cp_async_16)
    cp_async_commit = cuda.jit(device=True)(twin_noop)
    ldmatrix_x4 = cuda.jit(device=True)(_twin_ldmatrix_x4)


@functools.lru_cache(maxsize=None)
def cp_async_wait_group(n: int):
    """`cp.async.wait_group n;` as a function of no arguments: wait until at most n committed groups are pending."""
    if HARDWARE:
        return barrier_intrinsic(f"cp.async.wait_group {int(n)};", f"cp_async_wait_group_{int(n)}")
    return cuda.jit(device=True)(twin_noop)
