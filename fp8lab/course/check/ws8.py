"""ws8: inline PTX from Python: the mma.sync fragment layout, and a cvt intrinsic with its simulator twin."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...numerics import formats, spec
from ...device import ptx, runtime
from ...device.runtime import cuda
from ._core import NotAttempted, fail, launch, not_attempted_message, question, still_a_placeholder

__all__ = ["mma_a_fragment", "cvt_e4m3x2_intrinsic"]


@question
def mma_a_fragment(fn, rng=None):
    """Check `fn(lane, i) -> (row, k)`: the element of the 16 x 32 A matrix that value i (0..15) of lane (0..31)
    holds in mma.sync.aligned.m16n8k32 with 8-bit operands (PTX ISA, "Matrix Fragments for mma.m16n8k32")."""
    q = "mma_a_fragment"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    want = ptx.mma_m16n8k32_layout()["a"]
    seen = set()
    for lane in range(32):
        for i in range(16):
            got = tuple(int(v) for v in fn(lane, i))
            if got != tuple(int(v) for v in want[lane, i]):
                g, t, r = lane >> 2, lane & 3, i >> 2
                rule = (f"the row is wrong: register r = i >> 2 = {r} holds row g (r = 0, 2) or g + 8 (r = 1, 3), "
                        f"g = lane >> 2 = {g}" if got[:1] != tuple(want[lane, i].tolist())[:1] else
                        f"k is wrong: register r = i >> 2 = {r} covers k from 4t (r = 0, 1) or 16 + 4t (r = 2, 3), "
                        f"t = lane & 3 = {t}, and byte i & 3 = {i & 3} is the place inside those four")
                fail(q, [f"lane {lane}, value {i}: got {got}, expected {tuple(want[lane, i].tolist())}"], rule)
            seen.add(got)
    return "every lane's 16 values at the PTX ISA's (row, k); together they cover the 16 x 32 matrix once"


def _cvt_cases(rng):
    top = float(spec.FP8_MAX["e4m3"])  # 448: the largest E4M3 value; top + 16 rounds to it, top + 32 saturates
    special = np.array([0.0, -0.0, 1.0, -1.0, top, top + 16, top + 32, -1e9, np.inf, -np.inf, 2.0**-9, 2.0**-10,
                        1.5 * 2.0**-10, 2.0**-6, 0.0625 * 1.0625, 17.0, 18.0, 19.0], np.float32)
    rand = (rng.standard_normal(200) * rng.choice([1e-3, 1.0, 100.0, 1000.0], 200)).astype(np.float32)
    x = np.concatenate([special, rand])
    return x, np.roll(x, 7)


@question
def cvt_e4m3x2_intrinsic(intrinsic_fn, twin, rng=None):
    """Check an @intrinsic `cvt(hi, lo) -> uint16` emitting `cvt.rn.satfinite.e4m3x2.f32 d, hi, lo;` and its
    software twin `twin(hi, lo) -> int`, the same result in Python. The twin must equal fp8lab.numerics.formats bit for
    bit, in plain Python and inside a kernel. On a GPU the intrinsic runs in that kernel and must give the same
    bits; under the simulator (which cannot run PTX) its typing is tried with float32 and float64 arguments and
    its code generator is run outside the compiler, and the inline assembly it emits (text and constraints) is
    inspected instead."""
    q = "cvt_e4m3x2_intrinsic"
    for f in (intrinsic_fn, twin):
        if still_a_placeholder(getattr(f, "_defn", f)):  # an @intrinsic: its typing function
            raise NotAttempted(not_attempted_message(q, f))
    rng = np.random.default_rng() if rng is None else rng
    hi, lo = _cvt_cases(rng)
    want = ((formats.encode(hi, saturate=True).astype(np.uint16) << 8) | formats.encode(lo, saturate=True))
    got_twin = np.array([int(twin(np.float32(h), np.float32(v))) for h, v in zip(hi, lo)], np.uint16)
    _compare(q, "the twin (plain Python)", hi, lo, got_twin, want)
    fn = intrinsic_fn if not runtime.IS_SIM else cuda.jit(device=True)(twin)

    @cuda.jit
    def cvt_kernel(h, v, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = fn(h[i], v[i])

    out = bench.poisoned(hi.shape, np.float32)  # float32 holds every uint16 exactly; NaN = never written
    launch(q, "a kernel over all inputs", cvt_kernel, (-(-hi.size // 128), 128), cuda.to_device(hi),
           cuda.to_device(lo), out)
    got = out.copy_to_host()
    if np.isnan(got).any():
        fail(q, ["some outputs were never written (still NaN)"])
    where = "the intrinsic on the GPU" if not runtime.IS_SIM else "the twin inside a simulated kernel"
    _compare(q, where, hi, lo, got.astype(np.uint16), want)
    if runtime.IS_SIM:
        asm = _inline_asm_of(q, intrinsic_fn)
        return (f"twin bit-exact with fp8lab.numerics.formats in a simulated kernel; the intrinsic emits {asm!r} "
                "(it runs on a GPU: the simulator cannot execute PTX)")
    return "the intrinsic on the GPU equals the twin and fp8lab.numerics.formats bit for bit (ties, saturation, Inf)"


class _Context:
    """Just enough of numba's lowering context to run an intrinsic's codegen outside a compiler."""

    def cast(self, builder, value, fromty, toty):
        return value

    def get_dummy_value(self):
        return None


def _inline_asm_of(q, intrinsic_fn) -> str:
    """Type the intrinsic for (float32, float32), run its codegen into a scratch LLVM function, and return the
    inline assembly it emitted; fail unless it is cvt.rn.satfinite.e4m3x2.f32 into a 16-bit register."""
    from llvmlite import ir
    from numba.cuda import types

    defn = getattr(intrinsic_fn, "_defn", None)
    if defn is None:
        fail(q, [f"expected an @intrinsic (numba.cuda.extending.intrinsic), got {type(intrinsic_fn).__name__}"],
             "decorate the typing function `def cvt(typingctx, hi, lo)` with @intrinsic")
    typed = defn(None, types.float32, types.float32)
    if not typed or typed[0].return_type != types.uint16:
        fail(q, [f"typing (float32, float32) gave {typed!r}: expected (uint16(float32, float32), codegen)"],
             "return sig, codegen with sig = types.uint16(hi, lo)")
    if not defn(None, types.float64, types.float32):
        fail(q, ["typing (float64, float32) gave None: the intrinsic must accept any two floats"],
             "test isinstance(hi, types.Float) and isinstance(lo, types.Float), and cast both to float32 in codegen "
             "with context.cast(builder, args[k], sig.args[k], types.float32)")
    sig, codegen = typed
    f32 = ir.FloatType()
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(ir.IntType(16), [f32, f32]), "probe")
    builder = ir.IRBuilder(fn.append_basic_block())
    codegen(_Context(), builder, sig, list(fn.args))
    calls = [ins for ins in fn.blocks[0].instructions if isinstance(getattr(ins, "callee", None), ir.InlineAsm)]
    if not calls:
        fail(q, ["the codegen emitted no inline assembly"], "build ir.InlineAsm(fnty, text, constraints) and "
             "builder.call it with the two float32 arguments")
    asm = calls[0].callee
    text = " ".join(asm.asm.split())
    if not text.startswith("cvt.rn.satfinite.e4m3x2.f32 "):
        fail(q, [f"the inline assembly is {asm.asm!r}: its instruction is not cvt.rn.satfinite.e4m3x2.f32"],
             "the instruction names the rounding (.rn), the saturation (.satfinite), the destination pair (.e4m3x2) "
             "and the source type (.f32), in that order, as the PTX ISA spells it")
    if "$0, $1, $2" not in text:
        fail(q, [f"the inline assembly is {asm.asm!r}: its operands are not the destination, then hi, then lo"],
             "$n numbers the operands of the call: outputs first, then the inputs in the order builder.call passes "
             "them; PTX writes the destination first")
    operands = [c for c in asm.constraint.replace(" ", "").split(",") if not c.startswith("~")]  # clobbers: optional
    roles = ["$0, the result (a 16-bit register, written)", "$1, hi (a .f32 input)", "$2, lo (a .f32 input)"]
    if len(operands) != 3:
        fail(q, [f"the constraints are {asm.constraint!r}: {len(operands)} operand(s), expected 3 (one output, two "
                 "inputs)"], "one constraint per operand, separated by commas, outputs first")
    wrong = [f"{role} has {c!r}" for role, c, want in zip(roles, operands, ["=h", "f", "f"]) if c != want]
    if wrong:
        fail(q, [f"the constraints are {asm.constraint!r}: " + "; ".join(wrong)],
             "a letter per operand from the list above says its register class; '=' marks the one written")
    return text


def _compare(q, where, hi, lo, got, want):
    bad = np.flatnonzero(got != want)
    if len(bad):
        i = bad[0]
        fail(q, [f"{where}: {len(bad)} of {len(want)} results differ, e.g. cvt(hi={hi[i]!r}, lo={lo[i]!r}) gave "
                 f"0x{int(got[i]):04x}, expected 0x{int(want[i]):04x}"],
             "the value converted from the first operand (hi) goes to the upper byte, lo to the lower byte; "
             "'.rn' rounds to nearest even, '.satfinite' clamps overflow and +-Inf to +-max normal")
