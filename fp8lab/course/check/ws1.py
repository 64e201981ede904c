"""ws1: an RMSNorm forward kernel with a block reduction, checked against the float64 reference."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...device import runtime
from ...kernels import rmsnorm
from ...device.runtime import cuda
from ._core import fail, launch, question, require_kernel

__all__ = ["RMSNORM_THREADS", "RMSNORM_EPS", "rmsnorm_forward_kernel"]

RMSNORM_THREADS = runtime.block_threads(128)  # threads per block: 128 on a GPU, 32 under the simulator
RMSNORM_EPS = rmsnorm.EPS  # float32(1e-6), as in fp8lab.kernels.rmsnorm


def _rmsnorm_cases(rng):
    T = RMSNORM_THREADS
    rows = []
    # (name, y, g): a row longer than the block and not a multiple of it; a row shorter than the block;
    # tiny values (where eps matters), large values, and one all-zero row (rstd = 1/sqrt(eps)).
    n1 = T + 13 if runtime.IS_SIM else 4 * T + 77
    y = rng.standard_normal((3, n1)).astype(np.float32) * 3
    y[1] *= 1e-4
    rows.append((f"{y.shape[0]} rows of {n1} (longer than a block of {T} threads, not a multiple of it; "
                 f"row 1 is tiny, ~1e-4, where eps matters)", y))
    n2 = 7 if runtime.IS_SIM else 100
    y = rng.standard_normal((2, n2)).astype(np.float32) * 100
    y[0] = 0
    rows.append((f"2 rows of {n2} (shorter than the block; row 0 is all zeros, row 1 ~ 100)", y))
    if not runtime.IS_SIM:
        y = rng.standard_normal((512, 7168)).astype(np.float32)
        rows.append(("512 rows of 7168", y))
    return [(name, y, rng.uniform(0.5, 1.5, y.shape[1]).astype(np.float32)) for name, y in rows]


@question
def rmsnorm_forward_kernel(kernel, rng=None):
    """Check a kernel `(y, g, z, rstd)`: z = y * rstd * g, rstd[m] = 1 / sqrt(mean(y[m]^2) + eps), launched
    with one block of RMSNORM_THREADS threads per row (grid = M blocks)."""
    q = "rmsnorm_forward_kernel"
    require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    T = RMSNORM_THREADS
    for name, y, g in _rmsnorm_cases(rng):
        M, N = y.shape
        z, rstd = bench.poisoned((M, N), np.float32), bench.poisoned(M, np.float32)
        launch(q, name, kernel, (M, T), cuda.to_device(y), cuda.to_device(g), z, rstd)
        z_ref, r_ref = rmsnorm.reference_forward(y, g)
        for label, got, ref, atol in (("rstd", rstd.copy_to_host(), r_ref, 0.0),
                                      ("z", z.copy_to_host(), z_ref, 1e-5)):
            n_bad, bad = bench.first_mismatches(got, ref, atol=atol, rtol=1e-4, limit=3)
            if n_bad:
                lines = [f"case {name}: {n_bad} of {got.size} values of {label} are wrong, e.g."]
                lines += [f"  {label}{list(i)}: got {gv!r}, expected {rv!r}" for i, gv, rv in bad]
                fail(q, lines, _rmsnorm_hint(label, bad, got, y, T))
    return f"z and rstd match the float64 reference (rows longer and shorter than {T} threads, tiny, zero rows)"


def _rmsnorm_hint(label, bad, got, y, T):
    idx, gv, rv = bad[0]
    N = y.shape[1]
    if label == "rstd" and np.isnan(got).all():
        return "rstd[m] was never written: have one thread (threadIdx.x == 0) store it for its row"
    if label == "z" and N > T and np.isnan(got[:, T:]).all() and not np.isnan(got[:, :T]).any():
        return (f"columns from blockDim.x ({T}) on are still the NaN poison: each thread must loop over the "
                "row, for n in range(cuda.threadIdx.x, N, cuda.blockDim.x)")
    if np.isnan(gv):
        return "that output is still the NaN poison (never written) or NaN was computed: check every store"
    m = idx[0]
    if np.abs(y[m]).max() < 1e-2:
        return "wrong only on tiny rows? rstd = 1 / sqrt(mean(y^2) + eps), with eps = RMSNORM_EPS inside the sqrt"
    if label == "rstd" and N > T and rv and gv / rv > 1:
        return ("rstd too large: the sum of squares is missing elements or partial sums. Does every thread "
                "loop over the whole row (for n in range(cuda.threadIdx.x, N, cuda.blockDim.x)), and does the "
                "tree add every thread's partial sum before anyone reads the total (after cuda.syncthreads())?")
    return ("divide the sum of squares by N (the row length), not by blockDim.x; the block reduction must "
            "finish (cuda.syncthreads()) before any thread reads the total")
