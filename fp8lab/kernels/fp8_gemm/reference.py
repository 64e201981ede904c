"""fp8_gemm's NumPy side: operand validation, the references every version is checked against, and the error
bounds.

`reference` is the spec: the kernels' arithmetic in their order, float32 (bit-exact with versions 1, 2 and the
tensor-core twins under the simulator). Products of two FP8 values are exact in float32, so a fused multiply-add
gives the same bits as a multiply then an add inside each group; on a GPU the compiler may contract
`acc + partial * s` into one FMA (one rounding instead of two), so GPU results differ from `reference` by at most
about one float32 rounding per K-group (`fma_tolerance`). `reference64` is the float64 value the error bounds
(`error_bound` for FP32 accumulation, `tensor_core_bound` for the tensor cores' own) are measured from.
"""

from __future__ import annotations

import numpy as np

from ... import _validate as V
from ...device import runtime
from ...numerics import accum, formats, spec
from ...numerics.spec import GROUP_K

ALIGN = accum.GROUP  # products per alignment group of the limited accumulator (32)
OPERAND_GRANULARITIES = ("tensor", "tile", "block")  # of spec.GRANULARITIES, the ones fp8_gemm takes


def check_operand(name: str, q, granularity: str | None = None, experts: bool = False):
    """(data, scale, fmt) of an fp8_gemm operand, checked. granularity: the one it must have (None: any of
    OPERAND_GRANULARITIES); experts: data (E, rows, K), one matrix per routed expert, scale (E, ...) each expert's
    (fl.quantize of a 3-D weight with granularity "block")."""
    for attr in ("data", "scale", "granularity", "fmt"):
        if not hasattr(q, attr):
            raise TypeError(f"{name} must be a QuantizedTensor (attributes data, scale, granularity, fmt), "
                            f"got {V.describe(q)} without .{attr}")
    V.choice(f"{name}.granularity", q.granularity, OPERAND_GRANULARITIES)
    if granularity is not None and q.granularity != granularity:
        raise ValueError(f"{name} must have granularity {granularity!r}, got {q.granularity!r}")
    fmt = spec.fmt_name(q.fmt, f"{name}.fmt")
    block = getattr(q, "block", None)
    if q.granularity != "tensor" and block not in (None, GROUP_K):
        raise ValueError(f"{name}.block must be {GROUP_K} for granularity {q.granularity!r} (the kernel's K-group), "
                         f"got {block!r}")
    data = V.array(f"{name}.data", q.data, dtype=np.uint8, ndim=3 if experts else 2)
    rows, K = data.shape[-2:]
    scale = V.array(f"{name}.scale", q.scale, dtype=np.float32,
                    shape=data.shape[:-2] + spec.scale_shape(q.granularity, (rows, K)))
    return data, scale, fmt


def check_options(accum_bits, promote_every, fine: bool):
    bits = accum.check_bits(accum_bits)
    _, promote = accum.check_group_promote(ALIGN, promote_every)
    if bits is None:
        if promote is not None:
            raise ValueError(f"promote_every needs accum_bits (the limited accumulator it promotes), got "
                             f"promote_every={promote} with accum_bits=None")
        return -1, 0
    if fine:
        if promote is None:
            promote = GROUP_K
        if GROUP_K % promote:
            raise ValueError(f"promote_every must divide {GROUP_K} with tile/block scales (each partial sum is "
                             f"scaled per {GROUP_K}-group), got {promote}")
    return bits, 0 if promote is None else promote


def expanded_scales(q, rows: int, K: int) -> np.ndarray:
    """(rows, ceil(K/128)) float32: the scale of every (row, K-group)."""
    s = np.asarray(runtime.to_host(q.scale), np.float32)
    nk = -(-K // GROUP_K)
    if q.granularity == "tensor":
        return np.full((rows, nk), s.reshape(-1)[0], np.float32)
    if q.granularity == "tile":
        return s
    return np.repeat(s, GROUP_K, axis=0)[:rows]


def decoded(name, q):
    data, _, fmt = check_operand(name, q)
    return formats.decode(runtime.to_host(data), fmt)


def reference(qa, qb, accum_bits=None, promote_every=None) -> np.ndarray:
    """NumPy spec, float32 (M, N): the kernels' arithmetic in their order (bit-exact under the simulator).

    FP32: per K-group g, partial = float32 sum of the products in k order; acc = acc + partial * (sa * sb).
    Limited (accum_bits): the fp8lab.numerics.accum model, groups of 32, promotion as in `fp8_gemm`.
    """
    A, B = decoded("qa", qa), decoded("qb", qb)
    M, K = A.shape
    N = B.shape[0]
    if B.shape[1] != K:
        raise ValueError(f"qa and qb must share K: got {A.shape} and {B.shape}")
    fine = qa.granularity != "tensor" or qb.granularity != "tensor"
    bits, promote = check_options(accum_bits, promote_every, fine)
    SA, SB = expanded_scales(qa, M, K), expanded_scales(qb, N, K)

    def s(g):
        return np.outer(SA[:, g], SB[:, g])  # float32 sa * sb, one rounding, as in the kernel

    acc = np.zeros((M, N), np.float32)
    if bits < 0:
        for k0 in range(0, K, GROUP_K):
            partial = np.zeros((M, N), np.float32)
            for k in range(k0, min(k0 + GROUP_K, K)):
                partial = partial + np.outer(A[:, k], B[:, k])
            acc = acc + partial * s(k0 // GROUP_K)
        return acc
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    lim = np.zeros((M, N))
    for k0 in range(0, K, ALIGN):
        lim = accum.limited_step(lim, A64[:, None, k0:k0 + ALIGN] * B64[None, :, k0:k0 + ALIGN], bits)
        if promote and (k0 + ALIGN) % promote == 0:
            acc = acc + lim.astype(np.float32) * s(k0 // GROUP_K)
            lim = np.zeros_like(lim)
    return acc + lim.astype(np.float32) * s((K - 1) // GROUP_K)


def _dequantized64(qa, qb):
    """float64 dequant(qa), dequant(qb): each code times its group's scale."""
    A, B = decoded("qa", qa), decoded("qb", qb)
    M, K = A.shape
    N = B.shape[0]
    SA = np.repeat(expanded_scales(qa, M, K), GROUP_K, axis=1)[:, :K].astype(np.float64)
    SB = np.repeat(expanded_scales(qb, N, K), GROUP_K, axis=1)[:, :K].astype(np.float64)
    return A.astype(np.float64) * SA, B.astype(np.float64) * SB


def reference64(qa, qb) -> np.ndarray:
    """float64 dequant(qa) @ dequant(qb).T: the exact value (up to float64 rounding) the errors are measured from."""
    A, B = _dequantized64(qa, qb)
    return A @ B.T


def abs_product(qa, qb) -> np.ndarray:
    """float64 sum_k |dequant(qa)[m, k] * dequant(qb)[n, k]|: the scale of every rounding error of the sum."""
    A, B = _dequantized64(qa, qb)
    return np.abs(A) @ np.abs(B).T


def error_bound(qa, qb) -> np.ndarray:
    """|y - reference64| bound for FP32 accumulation in any grouping: (K + 2) * 2^-23 * abs_product (at most
    K additions and K/128 scale steps, each one float32 rounding of relative size <= 2^-24 of a partial sum
    bounded by abs_product, doubled for slack)."""
    K = decoded("qa", qa).shape[1]
    return (K + 2) * 2.0**-23 * abs_product(qa, qb) + 1e-30


def tensor_core_bound(qa, qb) -> np.ndarray:
    """|y - reference64| allowed for versions 4-7 on a GPU: the FP32 bound plus 2^-9 * abs_product for the
    tensor core's own accumulator inside each K-group. wgmma keeps 13 mantissa bits and truncates
    (fp8lab.kernels.tc_accum finds it on the GPU, BENCHMARKS.md records the H200's; DeepSeek-V3 reports about 14
    bits): each of the 4 instructions of a K-group loses less than 2^-12 of its largest term per term, and random
    signs average most of it out; a wrong fragment or descriptor is off by whole products (order 1 of
    abs_product)."""
    return error_bound(qa, qb) + 2.0**-9 * abs_product(qa, qb)


def fma_tolerance(qa, qb) -> np.ndarray:
    """|y - reference| allowed on a GPU, where `acc + partial * s` may be one FMA: one float32 rounding of a
    value bounded by abs_product per K-group (plus two for slack). 0 under the simulator."""
    if runtime.IS_SIM:
        return np.zeros(1)
    K = decoded("qa", qa).shape[1]
    return 2.0**-23 * (K // GROUP_K + 2) * abs_product(qa, qb) + 1e-30
