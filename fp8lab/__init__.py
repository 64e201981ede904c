"""fp8lab: FP8 mixed-precision training the DeepSeek-V3 way, from PyTorch down to Numba-CUDA and PTX.

The backend ("gpu" or "sim", Numba's CUDA simulator) is chosen once, when the first kernel or
`fp8lab.backend` is used, by probing the CUDA driver without importing numba; FP8LAB_BACKEND=gpu|sim
overrides. Kernels compile lazily, on first launch.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Public name -> the module that defines it. Imported on first use (PEP 562), so that `fp8lab --backend sim`
# and FP8LAB_BACKEND can still choose the backend after `import fp8lab`: the choice is made when
# fp8lab.runtime is first imported (by the first kernel, `fp8lab.backend`, `fp8lab.info()`, ...).
_PUBLIC = {
    "backend": "runtime", "SimulatorSlowWarning": "runtime",
    "E4M3": "formats", "E5M2": "formats", "E8M0": "formats", "encode": "formats", "decode": "formats",
    "QuantizedTensor": "quant", "quantize": "quant", "dequantize": "quant", "requantize_tile_to_col": "quant",
    "DelayedScaling": "scaling", "gemm": "kernels.gemm", "fp8_gemm": "kernels.fp8_gemm",
    "train": "training", "History": "training", "RECIPES": "training", "TASKS": "training",
    "TrainingDiverged": "training",
}

_SUBMODULES = ("pipeline", "overlap")  # public submodules, imported on first use too: fl.pipeline.simulate(...)

__all__ = ["info", *_PUBLIC, *_SUBMODULES]


def __getattr__(name: str):
    if name in _SUBMODULES:
        from importlib import import_module

        return import_module(f".{name}", __name__)  # the import also sets the package attribute
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

    from . import runtime

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
