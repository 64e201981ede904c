"""Input checks shared by every public op: each error names the argument, what was expected, what was given.

NumPy only (device arrays are recognised by duck typing), so the NumPy spec modules can use it too.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import sys
import warnings

import numpy as np


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The stacklevel for a warnings.warn called right after this: the first frame outside the fp8lab package (the
    user's line), however many of fp8lab's functions lie in between."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def is_device_array(x) -> bool:
    # Duck-typed: the simulator's FakeCUDAArray has no __cuda_array_interface__ and no is_cuda_array.
    return hasattr(x, "copy_to_host") and hasattr(x, "shape") and not isinstance(x, np.ndarray)


def describe(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        kind = "device array" if is_device_array(x) else type(x).__name__
        return f"{kind} of shape {tuple(x.shape)} and dtype {np.dtype(x.dtype).name}"
    return f"{type(x).__name__} {x!r}"[:120]


def array(name: str, x, *, dtype=None, ndim=None, shape=None, allow_device=True, finite=False, writable=False):
    """Return x as a NumPy array (or the device array itself) after checking it.

    dtype: a NumPy dtype or a tuple of them; shape: a tuple where None matches any length; writable: a host array
    must accept writes (an output). Host inputs that are not arrays (lists) are converted; their dtype is then
    checked. A masked array is refused: kernels would read the values under its mask.
    """
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} must be a plain array, got a masked array of shape {tuple(x.shape)}: kernels read "
                        f"every value, masked or not; pass {name}.filled(value) (or {name}.data) to say which")
    if allow_device and is_device_array(x):
        arr = x
    elif isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (list, tuple)) or np.isscalar(x):
        try:
            arr = np.asarray(x)
        except Exception:  # pragma: no cover - ragged lists
            raise TypeError(f"{name} must be an array, got {describe(x)}") from None
    else:
        where = "a NumPy or CUDA device array" if allow_device else "a NumPy array"
        raise TypeError(f"{name} must be {where}, got {describe(x)}")

    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        allowed = tuple(np.dtype(d) for d in allowed)
        if np.dtype(arr.dtype) not in allowed:
            names = " or ".join(d.name for d in allowed)
            raise TypeError(f"{name} must have dtype {names}, got {describe(arr)}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got {describe(arr)}")
    if shape is not None:
        if len(shape) != arr.ndim or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
            dims = ["any" if s is None else str(s) for s in shape]
            want = f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(dims) + ")"
            raise ValueError(f"{name} must have shape {want}, got {describe(arr)}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty, got {describe(arr)}")
    if finite and isinstance(arr, np.ndarray) and not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite, got {nonfinite_summary(arr)} in {describe(arr)}")
    if writable and isinstance(arr, np.ndarray) and not arr.flags.writeable:
        raise ValueError(f"{name} must be writable (the result is written into it), got a read-only {describe(arr)}")
    return arr


def _first(mask: np.ndarray):
    """The index of mask's first True, as an int for 1-D arrays and a tuple otherwise."""
    i = tuple(int(j) for j in np.unravel_index(int(np.argmax(mask)), mask.shape))
    return i[0] if len(i) == 1 else i


def nonfinite_summary(arr: np.ndarray) -> str:
    """'2 NaN/Inf value(s), the first (inf) at index (0, 3)', for a NumPy array that holds some."""
    bad = ~np.isfinite(arr)
    i = _first(bad)
    return f"{int(bad.sum())} NaN/Inf value(s), the first ({arr[i]}) at index {i}"


def float32_host(name: str, arr: np.ndarray) -> np.ndarray:
    """A float16/32/64 NumPy array as a C-contiguous float32 array; ValueError where a finite float64 value lies
    beyond float32's range (the cast would silently make it +-Inf)."""
    with np.errstate(over="ignore"):  # overflow is reported below, with the index
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if arr.dtype == np.float64:
        over = np.isinf(out) & np.isfinite(arr)
        if over.any():
            i = _first(over)
            raise ValueError(f"{name} must lie within float32's range (|value| <= {np.finfo(np.float32).max}), got "
                             f"{int(over.sum())} value(s) beyond it, the first ({arr[i]}) at index {i} in "
                             f"{describe(arr)}")
    return out


def boolean(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {describe(value)}")
    return bool(value)


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int, got {describe(value)}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


def positive_float(name: str, value) -> float:
    """A positive finite real number (int, float, NumPy scalar, Fraction, ...) as a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {describe(value)}")
    try:
        f = float(value)
    except OverflowError:  # a Fraction beyond float's range
        f = math.inf
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return f


def choice(name: str, value, options) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {tuple(options)}, got {describe(value)}")
    if value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return value


def version(name: str, value, versions, default=None) -> int:
    """A kernel version: None gives `default`; otherwise an int (not a bool) that is a key of `versions`."""
    if value is None and default is not None:
        return int(default)
    keys = tuple(versions)
    expected = f"None or an int in {keys}" if default is not None else f"an int in {keys}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {expected}, got {describe(value)}")
    if int(value) not in keys:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


@contextlib.contextmanager
def no_float_warnings():
    """Silence NumPy's floating-point RuntimeWarnings ("invalid value / overflow / divide by zero encountered")
    while the block runs, for NumPy arithmetic that may legitimately overflow (a diverging NumPy training step).
    Simulated kernels need no such block: fp8lab/device/simgaps.py silences their threads, as a GPU is silent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"(invalid value|overflow|divide by zero) encountered", RuntimeWarning)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            yield
