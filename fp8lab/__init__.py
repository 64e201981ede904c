"""fp8lab: FP8 mixed-precision training the DeepSeek-V3 way, from PyTorch down to Numba-CUDA and PTX.

The backend ("gpu" or "sim", Numba's CUDA simulator) is chosen once, here, by probing the CUDA driver
without importing numba; FP8LAB_BACKEND=gpu|sim overrides. Kernels compile lazily, on first launch.
"""

from __future__ import annotations

from .runtime import backend  # first: selects the backend before numba.cuda is imported

from .formats import E4M3, E5M2, E8M0, decode, encode  # noqa: E402
from .kernels.fp8_gemm import fp8_gemm  # noqa: E402
from .kernels.gemm import gemm  # noqa: E402
from .quant import QuantizedTensor, dequantize, quantize, requantize_tile_to_col  # noqa: E402
from .scaling import DelayedScaling  # noqa: E402
from .training import RECIPES, History, TrainingDiverged, train  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "backend", "info", "E4M3", "E5M2", "E8M0", "encode", "decode", "quantize", "dequantize",
    "QuantizedTensor", "requantize_tile_to_col", "DelayedScaling", "gemm", "fp8_gemm", "train", "History", "RECIPES", "TrainingDiverged",
]


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
