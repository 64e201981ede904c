"""PTX text of the course's kernels: `ptx_of(fn, signature)`, `ptx_status()`, `find_instructions(text, prefix)`.

On a GPU the kernel is compiled in this process (`numba.cuda.compile_ptx`). Under the simulator it is compiled
in a subprocess with NUMBA_ENABLE_CUDASIM=0, which needs the CUDA compiler wheels (`pip install 'fp8lab[ptx]'`,
numba-cuda[cu13], about 450 MB); without them `ptx_of` returns None with a warning that says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from .. import select as _backend
from ..runtime import cuda
from .base import HARDWARE


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
      notebook (`__main__`). To see an intrinsic's instruction, pass a kernel that calls it, such as
      `fp8lab.kernels.cast.encode_e4m3_sat_hw_kernel`.
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
    env.pop(_backend.ENV_VAR, None)
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
path = os.path.join(os.path.dirname(spec.origin), "device", "select.py")
bspec = importlib.util.spec_from_file_location("fp8lab.device.select", path)
backend = importlib.util.module_from_spec(bspec)
sys.modules["fp8lab.device.select"] = backend
bspec.loader.exec_module(backend)
backend.probe_driver = lambda: (1, "compile only: PTX without a device (fp8lab.device.ptx.ptx_of)")
pspec = importlib.util.spec_from_file_location("fp8lab.device.pool", os.path.join(os.path.dirname(spec.origin),
"device", "pool.py"))
pool = importlib.util.module_from_spec(pspec)
sys.modules["fp8lab.device.pool"] = pool
pspec.loader.exec_module(pool)
pool.install = lambda: False  # the caching allocator needs a driver; nothing is allocated here
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
