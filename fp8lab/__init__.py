"""fp8lab: FP8 mixed-precision training the DeepSeek-V3 way, from PyTorch down to Numba-CUDA and PTX.

The backend ("gpu" or "sim", Numba's CUDA simulator) is chosen once, when the first kernel or
`fp8lab.backend` is used, by probing the CUDA driver without importing numba; FP8LAB_BACKEND=gpu|sim
overrides. Kernels compile lazily, on first launch.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Public name -> the module that defines it. Imported on first use (PEP 562), so that `fp8lab --backend sim`
# and FP8LAB_BACKEND can still choose the backend after `import fp8lab`: the choice is made when
# fp8lab.device.runtime is first imported (by the first kernel, `fp8lab.backend`, `fp8lab.info()`, ...).
_PUBLIC = {
    "backend": "device.runtime", "SimulatorSlowWarning": "device.runtime",
    "E4M3": "numerics.formats", "E5M2": "numerics.formats", "E8M0": "numerics.formats",
    "encode": "numerics.formats", "decode": "numerics.formats",
    "QuantizedTensor": "quant", "quantize": "quant", "dequantize": "quant", "requantize_tile_to_col": "quant",
    "DelayedScaling": "numerics.scaling", "gemm": "kernels.gemm", "fp8_gemm": "kernels.fp8_gemm",
    "fp8_grouped_gemm": "kernels.fp8_gemm", "fp8_grouped_wgrad": "kernels.fp8_gemm",
    "bf16_gemm": "kernels.bf16_gemm", "attention": "kernels.attention", "attention_backward": "kernels.attention",
    "train": "training.loop", "History": "training.loop", "RECIPES": "numerics.recipes", "TASKS": "training.loop",
    "TrainingDiverged": "training.loop",
}

# public submodules, imported on first use too: fl.pipeline.simulate(...)
_SUBMODULES = {"pipeline": "comm.pipeline", "overlap": "comm.overlap"}

__all__ = ["info", *_PUBLIC, *_SUBMODULES]

# Modules that moved when the package was grouped by concern (ARCHITECTURE.md), old name -> new. A learner's older
# copy of a worksheet (`from fp8lab import formats`, `from fp8lab.runtime import cuda`) keeps working, with a
# FutureWarning naming the new import.
_MOVED = {
    "formats": "numerics.formats", "spec": "numerics.spec", "accum": "numerics.accum", "scaling": "numerics.scaling",
    "runtime": "device.runtime", "hardware": "device.hardware", "ptx": "device.ptx", "timing": "bench.timing",
    "check": "course.check", "notebook": "course.notebook", "recorded": "course.recorded",
    "plotting": "course.plotting", "worksheets": "course.worksheets", "lm": "training.model",
    "lm_engine": "training.engine_kernels", "lm_torch": "training.engine_torch", "corpus": "training.corpus",
    "checkpoint": "training.checkpoint", "moe": "comm.moe", "overhead": "bench.overhead",
}


def _moved(name: str):
    """The module `name` moved to, after a FutureWarning naming its new import."""
    import warnings
    from importlib import import_module

    new = _MOVED[name]
    parent, _, last = new.rpartition(".")
    warnings.warn(f"fp8lab.{name} moved to fp8lab.{new}: write `from fp8lab.{parent} import {last}` (or "
                  f"`from fp8lab.{new} import ...`)", FutureWarning, stacklevel=3)
    module = globals()[name] = import_module(f".{new}", __name__)  # warned once
    return module


class _MovedFinder:
    """`import fp8lab.<old name>[.<submodule>]` for the modules in _MOVED: the moved module itself."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        head, _, rest = fullname.partition(".")
        old, _, sub = rest.partition(".")
        if head != __name__ or old not in _MOVED:
            return None
        import importlib.util

        class Alias:
            @staticmethod
            def create_module(spec):
                module = _moved(old)
                if sub:
                    from importlib import import_module

                    module = import_module(f"{module.__name__}.{sub}")
                return module

            @staticmethod
            def exec_module(module):
                pass

        return importlib.util.spec_from_loader(fullname, Alias())


def _install_finder() -> None:
    import sys

    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


_install_finder()


def __getattr__(name: str):
    if name in _SUBMODULES:
        from importlib import import_module

        module = import_module(f".{_SUBMODULES[name]}", __name__)
        globals()[name] = module
        return module
    if name in _MOVED:
        return _moved(name)
    if name not in _PUBLIC:
        raise AttributeError(f"module 'fp8lab' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def info(show: bool = False) -> dict:
    """Backend, device (name, SMs, compute capability, memory) and library versions, as a dict.

    show=True also prints it as a small table (what `fp8lab info` prints).
    """
    import platform

    from .device import runtime

    d = {"fp8lab": __version__, "backend": runtime.backend, "why": runtime.backend_reason}
    d.update({f"device_{k}": v for k, v in runtime.device_info().items()})
    d["python"] = platform.python_version()
    for dist in ("numpy", "numba", "numba-cuda", "llvmlite", "ml_dtypes", "matplotlib", "torch"):
        d[dist] = _version(dist) or "not installed"
    if show:
        width = max(map(len, d))
        for k, v in d.items():
            print(f"{k:<{width}}  {'-' if v is None else v}")
    return d
