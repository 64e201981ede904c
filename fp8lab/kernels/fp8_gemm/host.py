"""fp8_gemm's host side: `fp8_gemm` (checked: QuantizedTensors in, float32 out) and `launch` (device arrays, no
checks), both dispatching through the VERSIONS table; the SM count a persistent version may take."""

from __future__ import annotations

import numpy as np

from ... import _validate as V
from ...device import runtime
from ...device.runtime import cuda
from ...numerics.spec import ScaleKind
from .. import versions
from .reference import check_operand, check_options
from .table import BEST, LIMITED_VERSIONS, PERSISTENT_VERSIONS, RESIDUAL_VERSIONS, VERSIONS, best_version
from .tensor_cores import tiles

SIM_SMS = 132
"""The SMs the simulator pretends to have (an H100/H200/H800's 132, NVIDIA H100 datasheet), so that `sms` values
written for those GPUs are accepted under the simulator too."""


def check_device(version: int) -> None:
    """ValueError naming the version when this GPU cannot run it (wgmma: sm_90 only; FP8 mma.sync: sm_89+)."""
    versions.check_device(VERSIONS, version)


def device_sms() -> int:
    """The SMs of the current GPU (its MULTIPROCESSOR_COUNT; 132 on an H100/H200/H800); SIM_SMS under the
    simulator."""
    if runtime.IS_SIM:
        return SIM_SMS
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def check_sms(sms, version: int) -> int | None:
    """`sms` validated for `version`: an int in 1..device_sms() for a persistent version (None: all SMs); None
    for the others, which take none."""
    if version not in PERSISTENT_VERSIONS:
        if sms is not None:
            raise ValueError(f"sms (a persistent grid of that many blocks) needs version in {PERSISTENT_VERSIONS}, "
                             f"got sms={sms!r} with version {version}")
        return None
    limit = device_sms()
    if sms is None:
        return limit
    if isinstance(sms, (bool, np.bool_)) or not isinstance(sms, (int, np.integer)):
        raise TypeError(f"sms must be None or an int in 1..{limit} (this device's SMs), got {V.describe(sms)}")
    if not 1 <= sms <= limit:
        raise ValueError(f"sms must be None or an int in 1..{limit} (this device's SMs), got {sms}")
    return int(sms)


def _check_residual(version: int) -> None:
    if version not in RESIDUAL_VERSIONS:
        have = ", ".join(map(str, RESIDUAL_VERSIONS))
        raise ValueError(f"residual (an epilogue that adds it to the product) is implemented by versions {have}, "
                         f"got version {version}")


def output(out, *shape: int):
    """The float32 device array of `shape` a GEMM writes: out, checked, or a new one when out is None."""
    if out is None:
        return cuda.device_array(shape, np.float32)
    y = V.array("out", out, dtype=np.float32, shape=shape)
    if not V.is_device_array(y):
        raise TypeError(f"out must be a device array, got {V.describe(out)}")
    return y


def fp8_gemm(qa, qb, accum_bits=None, promote_every=None, out=None, version=None, sms=None, residual=None):
    """y = dequant(qa) @ dequant(qb).T (+ residual), float32 (M, N), scales applied per K-group of 128 inside the
    kernel.

    qa: (M, K) codes, granularity "tile" (scale (M, ceil(K/128))) or "tensor" (scale (1,)); qb: (N, K) codes,
    "block" (scale (ceil(N/128), ceil(K/128))) or "tensor" ("block" for qa and "tile" for qb work too). Any
    object with .data (uint8), .scale (float32), .granularity and .fmt ('e4m3' or 'e5m2') will do, e.g.
    fp8lab.QuantizedTensor; NumPy or device arrays.
    accum_bits: None = FP32 accumulation; 1..23 = emulate a tensor-core accumulator with that many mantissa
    bits (13 = Hopper's FP22, see fp8lab.numerics.accum). promote_every: multiple of 32; None = 128 with tile/block
    scales, no promotion with per-tensor scales. out: optional float32 (M, N) device array.
    version: 1..7 (None: `best_version()` without accum_bits (6 on an H100/H200/H800), 2 with; only 1 and 2 emulate
    accum_bits). On a GPU versions 4 (mma.sync, sm_89+), 5, 6 and 7 (wgmma, sm_90) run on the tensor cores; under
    the simulator their twins sum in FP32 in k order.
    sms: version 7 only: the blocks of its persistent grid, one per SM, 1..device_sms() (None: every SM, at most
    one per output tile); the other SMs stay free for concurrent work. sms above the tile count leaves blocks
    idle.
    residual: optional float32 (M, N) array (NumPy or device) added in the epilogue: y = residual + A B^T, the add
    after the whole sum (one float32 rounding, the bits of `residual + fp8_gemm(qa, qb)`), so the sum never makes
    a round trip through memory. residual may be `out` itself (out += A B^T): each element is read just before it
    is written, by the same thread. Versions RESIDUAL_VERSIONS (2-7) have it, compiled in (the default kernels have
    no residual code); version 1 (lecture 06's editable kernel) raises ValueError.
    Returns a NumPy array for NumPy inputs, else the device array. A NaN scale (a group that held NaN/Inf,
    see fp8lab.quantize) or a NaN code makes the outputs that use it NaN; nothing is checked for finiteness.
    """
    da, dsa, fa = check_operand("qa", qa)
    db, dsb, fb = check_operand("qb", qb)
    (M, K), (N, K2) = da.shape, db.shape
    if K != K2:
        raise ValueError(f"qa and qb must share K (their second dimension): got qa.data {da.shape}, "
                         f"qb.data {db.shape}")
    fine = qa.granularity != "tensor" or qb.granularity != "tensor"
    bits, promote = check_options(accum_bits, promote_every, fine)
    version = V.version("version", version, VERSIONS, default=best_version() if bits < 0 else max(LIMITED_VERSIONS))
    grid_sms = check_sms(sms, version)
    if version in PERSISTENT_VERSIONS and sms is None:
        grid_sms = min(grid_sms, tiles(M, N))
    check_device(version)
    if bits >= 0 and version not in LIMITED_VERSIONS:
        raise ValueError(f"version {version} accumulates in FP32 only; accum_bits={accum_bits} needs version in "
                         f"{LIMITED_VERSIONS} (or None)")
    y = output(out, M, N)
    if residual is not None:
        residual = runtime.to_device(V.array("residual", residual, dtype=np.float32, shape=(M, N)))
        _check_residual(version)
    # warns once if the simulator would take minutes
    runtime.sim_check("fl.fp8_gemm", (M, N, K), VERSIONS[version].cost("accum_bits" if bits >= 0 else None))
    launch(runtime.to_device(da), runtime.to_device(dsa), runtime.to_device(db), runtime.to_device(dsb), y,
           ScaleKind.of(qa.granularity), ScaleKind.of(qb.granularity), fa, fb, bits, promote, version, sms=grid_sms,
           residual=residual)
    on_device = V.is_device_array(qa.data)
    return y if (on_device or out is not None) else y.copy_to_host()


def launch(a, sa, b, sb, out, a_kind, b_kind, fmt_a="e4m3", fmt_b="e4m3", bits=-1, promote=0, version=BEST,
           tc_promote=True, sms=None, stream=0, residual=None):
    """Launch on device arrays (no checks): a_kind / b_kind a spec.ScaleKind (TENSOR, TILE, BLOCK); bits -1 = FP32.
    tc_promote=False (versions 4 and 5, per-tensor scales): no promotion, the hardware accumulator spans all of K.
    sms: a persistent version's grid (None: one block per tile). stream: versions with the "streams" trait (0: the
    default stream). residual: a float32 (M, N) device array (may be out): out = residual + A B^T."""
    row = VERSIONS[version]
    if residual is not None:
        _check_residual(version)
    if stream != 0 and not row.has("streams"):
        have = " and ".join(map(str, versions.with_trait(VERSIONS, "streams")))
        raise ValueError(f"stream is implemented by versions {have}, got version {version}")
    a_kind, b_kind = int(a_kind), int(b_kind)  # compiled-in constants: plain ints in the kernel cache's keys
    sa2 = sa.reshape(1, 1) if a_kind == ScaleKind.TENSOR else sa  # per-tensor scales as (1, 1): one indexing scheme
    sb2 = sb.reshape(1, 1) if b_kind == ScaleKind.TENSOR else sb
    row.kernel(version, a, sa2, b, sb2, out, a_kind, b_kind, fmt_a, fmt_b, bits=bits, promote=promote,
               tc_promote=tc_promote, sms=sms, stream=stream, residual=residual)
