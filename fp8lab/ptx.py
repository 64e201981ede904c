"""The hardware FP8 conversion through inline PTX, and the PTX that kernels compile to.

What is here:
- `cvt_e4m3x2_satfinite(hi, lo)`, `cvt_e5m2x2_satfinite(hi, lo)`: two float32 -> two FP8 codes packed in a
  uint16, `hi`'s code in the upper byte, `lo`'s in the lower byte. On a GPU each is one PTX instruction,
  `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32`, emitted by an `@intrinsic` (numba.cuda.extending) through
  llvmlite's `InlineAsm` (`cvt_x2_intrinsic` builds them);
- `encode_e4m3_sat_hw(x)`, `encode_e5m2_sat_hw(x)`: device functions returning one code (int 0..255), the low
  byte of the instruction applied to (0, x), as CUDA's `__nv_cvt_float_to_fp8` does;
- `globaltimer_ns()`: the GPU's nanosecond clock (`mov.u64 d, %globaltimer;`), for `runtime.hold_gpu`;
- `decode_e4m3x2(codes16)`, `decode_e5m2x2(codes16)`: two FP8 codes packed in a uint16 -> (float32 of the low
  byte, float32 of the high byte), through `cvt.rn.f16x2.{e4m3x2,e5m2x2}` and two `cvt.f32.f16` (exact);
- `encode_e4m3_sat_hw_kernel(x, codes)`: a grid-stride kernel, codes[i] = encode_e4m3_sat_hw(x[i]), and
  `encode_e4m3_sat_sw_kernel`, the same loop with the software device function (to compare the two);
- `ptx_of(fn, signature)`: the PTX text of a kernel or device function, or None with a warning that says why
  not; `ptx_status()`; `find_instructions(ptx_text, prefix)`.

Backends. `HARDWARE = not runtime.IS_SIM`. The simulator cannot run inline PTX, so kernel source never forks by
backend: under the simulator the same names are the bit-exact software twins from fp8lab.formats
(`encode_e4m3_sat_hw` *is* `formats.encode_e4m3_sat`, `encode_e5m2_sat_hw` *is* `formats.encode_e5m2_sat`, and
the cvt names pack two software codes). On a GPU, tests/test_ptx.py proves hardware == software bit for bit.

Operand order (PTX ISA, "cvt", data movement and conversion instructions): in
`cvt.rn.satfinite.e4m3x2.f32 d, a, b;` "the value converted from input a is stored in the upper 8 bits of d and
the value converted from input b is stored in the lower 8 bits of d" (d is .b16). CUDA's cuda_fp8.hpp
(`__nv_cvt_float_to_fp8`) writes `cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;` with inputs (x, 0.0f) and keeps the
low byte: the same order. Here the intrinsic's arguments follow the instruction: cvt(hi=a, lo=b). In LLVM IR
inline assembly the operands are written `$0, $1, $2` (CUDA C++'s `%0` is a literal `%` there, the prefix of
PTX register names).

What the instruction does: round to nearest even; `.satfinite` clamps overflow and +-Inf to +-max normal
(448 / 57344), the policy of `formats.encode(..., saturate=True)`. It needs sm_89 or newer (PTX ISA 7.8).

Differences to know:
- NaN: the PTX ISA promises only "NaN" for a NaN input, not which code. The software path returns the quiet
  NaN with the input's sign (E4M3 0x7F / 0xFF, E5M2 0x7E / 0xFE). tests/test_ptx.py compares NaN-ness there, and
  reports which codes the hardware produced.
- float64 inputs: the instruction reads float32, so the hardware path rounds a float64 to float32 first (two
  roundings), while the software twin rounds a float64 directly. Pass float32 (the course's kernels do).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time
import warnings

import numpy as np

from . import formats, runtime
from .runtime import cuda

__all__ = [
    "HARDWARE",
    "CVT_E4M3X2",
    "CVT_E5M2X2",
    "cvt_x2_intrinsic",
    "cvt_e4m3x2_satfinite",
    "cvt_e5m2x2_satfinite",
    "encode_e4m3_sat_hw",
    "encode_e5m2_sat_hw",
    "decode_x2_intrinsic",
    "decode_e4m3x2",
    "decode_e5m2x2",
    "globaltimer_ns",
    "encode_e4m3_sat_hw_kernel",
    "encode_e4m3_sat_sw_kernel",
    "ENCODE_KERNEL_SIGNATURE",
    "ptx_of",
    "ptx_status",
    "find_instructions",
    "PTXUnavailableWarning",
]

HARDWARE = not runtime.IS_SIM
"""True on a GPU: the names below run the PTX instruction. False under the simulator: software twins."""

CVT_E4M3X2 = "cvt.rn.satfinite.e4m3x2.f32"
CVT_E5M2X2 = "cvt.rn.satfinite.e5m2x2.f32"
CVT_F16X2_E4M3X2 = "cvt.rn.f16x2.e4m3x2"
CVT_F16X2_E5M2X2 = "cvt.rn.f16x2.e5m2x2"

_F32_ZERO = np.float32(0.0)


# ----------------------------------------------------------------------------------------------------------------
# The hardware path: inline PTX (GPU only)
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


def _twin_decode_e4m3x2(codes):
    """Software twin of cvt.rn.f16x2.e4m3x2 widened to float32: (value of the low byte, of the high byte)."""
    return formats.decode_e4m3(codes & 0xFF), formats.decode_e4m3((codes >> 8) & 0xFF)


def _twin_decode_e5m2x2(codes):
    """Software twin of cvt.rn.f16x2.e5m2x2 widened to float32."""
    return formats.decode_e5m2(codes & 0xFF), formats.decode_e5m2((codes >> 8) & 0xFF)


def _hw_encode_e4m3_sat(x):
    """E4M3 code (int 0..255) of x from the hardware: the low byte of cvt.rn.satfinite.e4m3x2.f32 (0, x)."""
    return cvt_e4m3x2_satfinite(_F32_ZERO, x) & 0xFF


def _hw_encode_e5m2_sat(x):
    """E5M2 code (int 0..255) of x from the hardware: the low byte of cvt.rn.satfinite.e5m2x2.f32 (0, x)."""
    return cvt_e5m2x2_satfinite(_F32_ZERO, x) & 0xFF


# ----------------------------------------------------------------------------------------------------------------
# The software twins (simulator): bit-exact with fp8lab.formats.encode(..., saturate=True)
# ----------------------------------------------------------------------------------------------------------------


def _twin_cvt_e4m3x2_satfinite(hi, lo):
    """Software twin of cvt.rn.satfinite.e4m3x2.f32: (code(hi) << 8) | code(lo)."""
    return (formats.encode_e4m3_sat(hi) << 8) | formats.encode_e4m3_sat(lo)


def _twin_cvt_e5m2x2_satfinite(hi, lo):
    """Software twin of cvt.rn.satfinite.e5m2x2.f32: (code(hi) << 8) | code(lo)."""
    return (formats.encode_e5m2_sat(hi) << 8) | formats.encode_e5m2_sat(lo)


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


def _twin_globaltimer_ns():
    return np.uint64(time.perf_counter_ns())


if HARDWARE:
    globaltimer_ns = globaltimer_intrinsic()
    cvt_e4m3x2_satfinite = cvt_x2_intrinsic(CVT_E4M3X2)
    cvt_e5m2x2_satfinite = cvt_x2_intrinsic(CVT_E5M2X2)
    encode_e4m3_sat_hw = cuda.jit(device=True)(_hw_encode_e4m3_sat)
    encode_e5m2_sat_hw = cuda.jit(device=True)(_hw_encode_e5m2_sat)
    decode_e4m3x2 = decode_x2_intrinsic(CVT_F16X2_E4M3X2)
    decode_e5m2x2 = decode_x2_intrinsic(CVT_F16X2_E5M2X2)
else:
    globaltimer_ns = cuda.jit(device=True)(_twin_globaltimer_ns)
    cvt_e4m3x2_satfinite = cuda.jit(device=True)(_twin_cvt_e4m3x2_satfinite)
    cvt_e5m2x2_satfinite = cuda.jit(device=True)(_twin_cvt_e5m2x2_satfinite)
    encode_e4m3_sat_hw = formats.encode_e4m3_sat
    encode_e5m2_sat_hw = formats.encode_e5m2_sat
    decode_e4m3x2 = cuda.jit(device=True)(_twin_decode_e4m3x2)
    decode_e5m2x2 = cuda.jit(device=True)(_twin_decode_e5m2x2)


@cuda.jit
def encode_e4m3_sat_hw_kernel(x, codes):
    """codes[i] = encode_e4m3_sat_hw(x[i]): x float32 (n,), codes uint8 (n,); any grid (grid-stride loop)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        codes[i] = encode_e4m3_sat_hw(x[i])
        i += step


@cuda.jit
def encode_e4m3_sat_sw_kernel(x, codes):
    """The same loop with the software device function formats.encode_e4m3_sat, to compare with the hardware."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < x.size:
        codes[i] = formats.encode_e4m3_sat(x[i])
        i += step


ENCODE_KERNEL_SIGNATURE = "void(float32[::1], uint8[::1])"
"""The signature of the two encode kernels on contiguous arrays, for ptx_of."""


# ----------------------------------------------------------------------------------------------------------------
# PTX text
# ----------------------------------------------------------------------------------------------------------------


class PTXUnavailableWarning(UserWarning):
    """ptx_of could not produce PTX on this machine; the message says why and what to install."""


_HOW_TO_GET_PTX = (
    "To see PTX without a GPU, install the CUDA compiler wheels (about 450 MB): "
    "pip install 'fp8lab[ptx]' (that is numba-cuda[cu13]); or run on a machine with an NVIDIA GPU."
)


def ptx_status() -> tuple[bool, str]:
    """(can ptx_of produce PTX here, why). Cheap: under the simulator it only looks for libnvvm and libnvrtc."""
    if HARDWARE:
        return True, "on the GPU: numba-cuda compiles in this process"
    try:
        from cuda import pathfinder
    except ImportError:
        return False, "no CUDA compiler found (cuda-pathfinder is not installed). " + _HOW_TO_GET_PTX
    missing = []
    for lib in ("nvvm", "nvrtc"):  # NVVM compiles to PTX; numba-cuda asks NVRTC which architectures exist
        try:
            pathfinder.load_nvidia_dynamic_lib(lib)
        except Exception:  # DynamicLibNotFoundError and friends
            missing.append("lib" + lib)
    if missing:
        return False, f"the simulator has no compiler, and these were not found: {', '.join(missing)}. " + _HOW_TO_GET_PTX
    return True, "simulator: PTX comes from a subprocess with NUMBA_ENABLE_CUDASIM=0 (NVVM and NVRTC found)"


def _is_device(fn, device: bool | None) -> bool:
    if device is not None:
        return bool(device)
    opts = getattr(fn, "targetoptions", None)  # numba-cuda dispatcher
    if isinstance(opts, dict):
        return bool(opts.get("device", False))
    return bool(getattr(fn, "_device", False))  # simulator's FakeCUDAKernel; a plain function: a kernel


def _unavailable(message: str) -> None:
    warnings.warn(message, PTXUnavailableWarning, stacklevel=3)
    return None


def ptx_of(fn, signature, *, device: bool | None = None, cc: tuple[int, int] | None = None,
           timeout: float = 300.0) -> str | None:
    """The PTX text of a kernel or device function compiled for `signature`, or None (with a warning).

    fn: a `cuda.jit` kernel or device function (or the plain Python function; then `device` says which).
    signature: e.g. "void(float32[::1], uint8[::1])" for a kernel, "int64(float32)" for a device function.
    cc: compute capability; default: the current device's on a GPU, (9, 0) (Hopper) under the simulator.

    - GPU: compiled in this process (`numba.cuda.compile_ptx`), fresh, no launch needed.
    - Simulator: compiled in a subprocess with NUMBA_ENABLE_CUDASIM=0, where fp8lab's names are the GPU ones
      (so `encode_e4m3_sat_hw` is the inline-PTX function). That needs the CUDA compiler wheels (`pip install
      'fp8lab[ptx]'`) and a function the subprocess can import: defined at the top level of a module, not in a
      notebook (`__main__`). Under the simulator `encode_e4m3_sat_hw` *is* formats.encode_e4m3_sat: to see the
      PTX instruction, pass a kernel that calls it, such as `encode_e4m3_sat_hw_kernel`.
    Returns None, with a `PTXUnavailableWarning` that says why and how to get PTX, when it cannot compile.
    """
    pyfunc = getattr(fn, "py_func", fn)
    if not callable(pyfunc):
        raise TypeError(f"fn must be a cuda.jit kernel or device function, got {type(fn).__name__}")
    is_device = _is_device(fn, device)
    opts = getattr(fn, "targetoptions", None) or {}
    fastmath = bool(opts.get("fastmath", getattr(fn, "_fastmath", False)))

    if HARDWARE:
        if cc is None:
            cc = cuda.get_current_device().compute_capability
        ptx, _ = cuda.compile_ptx(pyfunc, signature, device=is_device, cc=tuple(cc), fastmath=fastmath)
        return ptx

    ok, why = ptx_status()
    if not ok:
        return _unavailable(f"no PTX for {pyfunc.__name__}: {why}")
    if not isinstance(signature, str):
        return _unavailable(
            f"no PTX for {pyfunc.__name__}: under the simulator the signature must be a string such as "
            f"'void(float32[::1], uint8[::1])' (it goes to a subprocess), got {type(signature).__name__}"
        )
    module, qualname = pyfunc.__module__, pyfunc.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return _unavailable(
            f"no PTX for {pyfunc.__name__}: under the simulator PTX is compiled in a subprocess, which can only "
            f"import functions defined at the top level of a module (this one is {module}.{qualname}). Move it "
            "into a module, or run on a GPU."
        )
    cc = tuple(cc) if cc is not None else (9, 0)
    args = [module, qualname, signature, str(int(is_device)), f"{cc[0]},{cc[1]}", str(int(fastmath))]
    env = dict(os.environ)
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    env.pop(runtime._backend.ENV_VAR, None)
    paths = [p if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    try:
        done = subprocess.run([sys.executable, "-c", _SUBPROCESS, *args], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _unavailable(f"no PTX for {pyfunc.__name__}: the compiler subprocess ran past {timeout:g} s")
    if done.returncode != 0 or ".version" not in done.stdout:
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        return _unavailable(f"no PTX for {pyfunc.__name__}: the compiler subprocess failed:\n{tail}\n" + _HOW_TO_GET_PTX)
    return done.stdout


# Runs in a fresh interpreter with NUMBA_ENABLE_CUDASIM=0 and no GPU. fp8lab would pick the simulator there (no
# driver answers), so its driver probe is replaced before the package is imported: fp8lab then believes in a
# device, takes the GPU code paths (inline PTX, float32 constants) and compiles, launching nothing. numba-cuda
# compiles the device functions that fn calls for "the current device", which needs a driver: here that device
# is a stand-in that only knows its compute capability.
_SUBPROCESS = r"""
import importlib, importlib.util, os, sys
module, qualname, signature, device, cc, fastmath = sys.argv[1:7]
spec = importlib.util.find_spec("fp8lab")  # locates the package without running its __init__
path = os.path.join(os.path.dirname(spec.origin), "_backend.py")
bspec = importlib.util.spec_from_file_location("fp8lab._backend", path)
backend = importlib.util.module_from_spec(bspec)
sys.modules["fp8lab._backend"] = backend
bspec.loader.exec_module(backend)
backend.probe_driver = lambda: (1, "compile only: PTX without a device (fp8lab.ptx.ptx_of)")
import fp8lab
from numba import cuda
import numba.cuda.dispatcher as dispatcher
cc = tuple(map(int, cc.split(",")))

class CompileOnlyDevice:  # device functions called from fn compile for the current device's cc: this one
    compute_capability = cc

dispatcher.get_current_device = CompileOnlyDevice
obj = importlib.import_module(module)
for part in qualname.split("."):
    obj = getattr(obj, part)
pyfunc = getattr(obj, "py_func", obj)
ptx, _ = cuda.compile_ptx(pyfunc, signature, device=device == "1", cc=cc,
                          fastmath=fastmath == "1")
sys.stdout.write(ptx)
"""


def find_instructions(ptx_text: str, prefix: str) -> list[str]:
    """The lines of ptx_text that contain `prefix` (e.g. "cvt.rn.satfinite"), stripped of indentation."""
    if not isinstance(ptx_text, str):
        raise TypeError(f"ptx_text must be a str (PTX text), got {type(ptx_text).__name__}")
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
    return [line.strip() for line in ptx_text.splitlines() if prefix in line]
