"""Choose the backend once, before numba is imported.

`gpu`: a CUDA driver with at least one device answers; kernels run for real.
`sim`: no device; `NUMBA_ENABLE_CUDASIM=1` makes the same kernel source run on the CPU.

numba reads NUMBA_ENABLE_CUDASIM when `numba` is imported, and the mode is fixed for good once
`numba.cuda` is imported (numba's configuration is read at import; numba.core.config). So the probe must not touch numba: it asks the driver through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import sys

BACKENDS = ("gpu", "sim")
ENV_VAR = "FP8LAB_BACKEND"


class BackendError(RuntimeError):
    """The backend asked for cannot be used (unknown name, no GPU, numba already in the other mode)."""


def probe_driver() -> tuple[int, str]:
    """Return (device count, reason) from libcuda, without importing numba (well under 1 ms)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no CUDA driver (libcuda.so.1 not found)"
    if lib.cuInit(0) != 0:
        return 0, "CUDA driver found, but cuInit failed"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0, "CUDA driver found, but cuDeviceGetCount failed"
    if count.value == 0:
        return 0, "CUDA driver found, but it reports no device"
    return count.value, f"{count.value} CUDA device(s) found"


def preflight(flag: str | None = None) -> None:
    """Refuse, without importing numba, a backend that cannot work: an unknown name, or gpu without a device.
    flag: the value of a command line's --backend (named in the message), else FP8LAB_BACKEND is checked."""
    raw = flag if flag is not None else os.environ.get(ENV_VAR, "")
    source = f"--backend {flag}" if flag is not None else f"{ENV_VAR}={raw.strip().lower()}"
    want = raw.strip().lower()
    if want and want not in BACKENDS:
        name = "--backend" if flag is not None else ENV_VAR
        raise BackendError(f"{name} must be one of {BACKENDS} (or unset to probe), got {raw!r}")
    if want == "gpu":
        ndev, reason = probe_driver()
        if ndev == 0:
            raise BackendError(f"{source}, but {reason}. Leave it out (or use 'sim') to run on the simulator.")


def _numba_mode() -> str | None:
    """The mode numba is already in, or None when numba.cuda is not imported yet."""
    if "numba.cuda" not in sys.modules:
        return None
    from numba.core import config

    return "sim" if config.ENABLE_CUDASIM else "gpu"


def select() -> tuple[str, str]:
    """Pick the backend and configure numba for it. Returns (backend, why)."""
    requested = os.environ.get(ENV_VAR, "").strip().lower()
    if requested not in ("",) + BACKENDS:
        raise BackendError(f"{ENV_VAR} must be one of {BACKENDS} (or unset to probe), got {os.environ[ENV_VAR]!r}")
    ndev, reason = probe_driver()
    if requested:
        backend, why = requested, f"{ENV_VAR}={requested} ({reason})"
        if requested == "gpu" and ndev == 0:
            raise BackendError(
                f"{ENV_VAR}=gpu, but {reason}. Unset {ENV_VAR} (or set it to 'sim') to use the simulator."
            )
    else:
        backend, why = ("gpu", reason) if ndev else ("sim", reason + ": using Numba's CUDA simulator")

    already = _numba_mode()
    if already is not None and already != backend:
        raise BackendError(
            f"numba.cuda was imported before fp8lab, in {already!r} mode, but fp8lab chose {backend!r} "
            f"({why}). The mode cannot change once numba.cuda is imported: import fp8lab first, or set "
            f"{ENV_VAR}={already} (restart the kernel/interpreter after changing it)."
        )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if backend == "sim" else "0"
    # The lessons launch small grids on purpose; numba would warn about low occupancy on each one.
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    if "numba" in sys.modules and already is None:
        # numba was imported (e.g. by another library) but not numba.cuda: re-read the flag.
        from numba.core import config

        config.reload_config()
    return backend, why
