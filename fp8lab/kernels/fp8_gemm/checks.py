"""fp8_gemm's checks: every version on fresh random operands of odd shapes, outputs poisoned, against `reference64`
within its bound and (where it sums in the reference's order) against `reference`."""

from __future__ import annotations

import numpy as np

from ... import bench
from ...device import runtime
from ...device.runtime import cuda
from ...numerics import spec
from ...numerics.spec import GROUP_K, QuantizedTensor
from .host import fp8_gemm
from .reference import error_bound, fma_tolerance, reference, reference64, tensor_core_bound
from .table import LIMITED_VERSIONS, TENSOR_CORE_VERSIONS, VERSIONS


def operand_on_device(q):
    return QuantizedTensor(cuda.to_device(q.data), cuda.to_device(q.scale), q.fmt, q.granularity, q.block)


def random_operands(rng, M, N, K, on_device=False):
    """(qa, qb): fresh N(0, 1) a (M, K) in 1 x 128 tiles and b (N, K) in 128 x 128 blocks, E4M3 (spec.quantize)."""
    qs = []
    for (rows, granularity) in ((M, "tile"), (N, "block")):
        codes, scale, _ = spec.quantize(rng.standard_normal((rows, K), dtype=np.float32), granularity)
        q = QuantizedTensor(codes, scale, "e4m3", granularity, GROUP_K)
        qs.append(operand_on_device(q) if on_device else q)
    return tuple(qs)


def _check_all(rng, M, N, K, only=None) -> list:
    """Every version (those in `only`: bench.selected), FP32 and limited accumulation, against the references;
    returns table rows.

    FP32: against reference64 within error_bound, and (simulator) bit for bit against `reference`. Limited
    accumulation: against `reference` (the NumPy model is slow, so on a GPU on a corner of at most 96 x 96:
    the outputs of a GEMM do not depend on each other)."""
    rows = []
    for accum_bits, promote in ((None, None), (13, 128), (13, 32)):
        versions = [v for v in (VERSIONS if accum_bits is None else LIMITED_VERSIONS) if bench.selected(only, v)]
        if not versions:
            continue
        m, n = (M, N) if (runtime.IS_SIM or accum_bits is None) else (min(M, 96), min(N, 96))
        qa, qb = random_operands(rng, m, n, K)
        da, db = operand_on_device(qa), operand_on_device(qb)
        ref64 = reference64(qa, qb)
        ref = reference(qa, qb, accum_bits, promote) if (runtime.IS_SIM or accum_bits is not None) else None
        for v in versions:
            out = bench.poisoned((m, n), np.float32)
            fp8_gemm(da, db, accum_bits, promote, out=out, version=v)
            got = out.copy_to_host()
            label = f"v{v} {m}x{n}x{K} accum_bits={accum_bits} promote_every={promote}"
            if np.isnan(got).any():
                raise AssertionError(f"{label}: NaN in the output (an element was not written)")
            tc_hw = v in TENSOR_CORE_VERSIONS and not runtime.IS_SIM
            if accum_bits is None:
                err = np.abs(got.astype(np.float64) - ref64)
                bound = tensor_core_bound(qa, qb) if tc_hw else error_bound(qa, qb)
                if not (err <= bound).all():
                    raise AssertionError(f"{label}: error {err.max():.3g} above the "
                                         f"{'tensor-core' if tc_hw else 'FP32'} bound")
            # versions 1, 2 (and the twins of 4, 5) add in the reference's order; version 3 scales the operands
            in_order = v in LIMITED_VERSIONS or (v in TENSOR_CORE_VERSIONS and runtime.IS_SIM)
            if ref is not None and in_order:
                # simulator: bit-exact; GPU: `acc + partial * s` may be one FMA: ~1 rounding per K-group
                err = np.abs(got.astype(np.float64) - ref)
                if not (err <= fma_tolerance(qa, qb)).all():
                    raise AssertionError(f"{label}: differs from reference by up to {err.max():.3g}")
            if tc_hw:
                how = "ok (tensor-core bound)"
            elif not in_order:
                how = "ok (FP32 bound)"
            else:
                how = "bit-exact" if runtime.IS_SIM else ("ok (FP32 bound)" if ref is None else "ok (FMA tolerance)")
            rel = np.abs(got - ref64) / np.abs(ref64)
            rows.append([label, how, f"{rel.max():.2e} / {np.median(rel):.2e}"])
    return rows


def checks(rng, only=None) -> list:
    """Every version (those in `only`; None: all), FP32 and limited accumulation, against the references (see
    _check_all)."""
    M, N, K = (5, 9, 300) if runtime.IS_SIM else (1000, 777, 1111)
    return [(f"{label}", f"{how}; rel. err. vs float64 max / median {err}") for label, how, err in
            _check_all(rng, M, N, K, only)]
