"""The grouped FP8 GEMMs of routed experts: the tokens of each expert in contiguous rows, each group padded to a
multiple of 128 rows (DeepGEMM's "contiguous" layout for its grouped GEMMs).

- `fp8_grouped_gemm` (Fprop, and Dgrad with qb the experts' transposed weights): y[rows of e] =
  dequant(qa[rows of e]) @ dequant(qb[e]).T;
- `fp8_grouped_wgrad` (Wgrad): dW[e] = dequant(qdyt[:, rows of e]) @ dequant(qxt[:, rows of e]).T, the sum over
  expert e's tokens, from dy^T and x^T quantized in 1 x 128 tiles along the tokens (DeepSeek-V3's 128 x 1 tiles of dy
  and x): with 128-row groups no tile spans two experts. Each expert's columns are first copied into contiguous
  buffers (the GEMM kernels read whole rows).

One launch of the chosen fp8_gemm version per non-empty group, on views of qa's rows, qb[e] and y's rows: group by
group the same bits as `fp8_gemm` of that group (a test holds it to that). With groups padded to 128 rows, every
1 x 128 tile of qa and every 128-row output tile belongs to one expert, which is what a single-launch kernel (a
table from output tile to expert) needs next."""

from __future__ import annotations

import numpy as np

from ... import _validate as V
from ...device import runtime
from ...device.runtime import cuda
from ...numerics import spec
from ...numerics.spec import GROUP_K, ScaleKind
from ..common import zero_rows_kernel
from .host import check_device, launch, output
from .reference import check_operand, reference64
from .table import PERSISTENT_VERSIONS, VERSIONS, best_version

GROUP_ROWS = GROUP_K  # every group's rows are a multiple of this (DeepGEMM pads each expert's tokens so)


def check_offsets(offsets, M: int, E: int) -> np.ndarray:
    """offsets as int64 (E + 1,): 0 first, M last, nondecreasing, every one a multiple of GROUP_ROWS."""
    off = np.asarray(offsets)
    if off.dtype.kind not in "iu" or off.shape != (E + 1,):
        raise ValueError(f"offsets must be {E + 1} integers (E + 1 for qb's E = {E} experts): the first row of each "
                         f"group and M, got {V.describe(offsets)}")
    off = off.astype(np.int64)
    if off[0] != 0 or off[-1] != M or (np.diff(off) < 0).any() or (off % GROUP_ROWS).any():
        raise ValueError(f"offsets must start at 0, end at M = {M}, never decrease, and be multiples of {GROUP_ROWS} "
                         f"(each expert's rows padded to whole 128-row tiles), got {off.tolist()}")
    return off


def _operands(qa, qb):
    """qa (M, K) in 1 x 128 tiles and qb (E, N, K) in per-expert 128 x 128 blocks, checked: their data and scales,
    then fmts."""
    a, sa, fa = check_operand("qa", qa, "tile")
    b, sb, fb = check_operand("qb", qb, "block", experts=True)
    if a.shape[1] != b.shape[2]:
        raise ValueError(f"qa and qb must share K: qa.data is {a.shape}, qb.data {b.shape} (E, N, K)")
    return a, sa, b, sb, fa, fb


def _version(version) -> int:
    """A grouped GEMM's fp8_gemm version: checked, not the persistent one (its grid is sized per call), runnable
    here; None: best_version()."""
    version = V.version("version", version, VERSIONS, default=best_version())
    if version in PERSISTENT_VERSIONS:
        raise ValueError(f"version must not be a persistent one {PERSISTENT_VERSIONS} (its grid is sized per call), "
                         f"got {version}")
    check_device(version)
    return version


def fp8_grouped_gemm(qa, qb, offsets, out=None, version=None):
    """y (M, N) float32: rows offsets[e]:offsets[e + 1] of y = dequant(those rows of qa) @ dequant(qb[e]).T.

    qa: (M, K) codes in 1 x 128 tiles (fl.quantize(x, granularity="tile")), the rows of each expert together;
    qb: (E, N, K) codes with 128 x 128 blocks per expert (fl.quantize(w, granularity="block") of an (E, N, K) w);
    offsets: E + 1 host integers, 0 to M, each group a multiple of 128 rows (empty groups allowed). out: a float32
    (M, N) device array to write (None: a new one). version: an fp8_gemm version other than the persistent one
    (None: best_version()). Returns NumPy for NumPy operands, else the device array; each group's rows are
    bit for bit fl.fp8_gemm of that group's qa rows and qb[e] with the same version."""
    a, sa, b, sb, fa, fb = _operands(qa, qb)
    (M, K), (E, N, _) = a.shape, b.shape
    off = check_offsets(offsets, M, E)
    version = _version(version)
    y = output(out, M, N)
    da, dsa, db, dsb = (runtime.to_device(x) for x in (a, sa, b, sb))
    for e in range(E):
        r0, r1 = int(off[e]), int(off[e + 1])
        if r1 > r0:
            launch(da[r0:r1], dsa[r0:r1], db[e], dsb[e], y[r0:r1], ScaleKind.TILE, ScaleKind.BLOCK, fa, fb,
                   version=version)
    on_device = V.is_device_array(qa.data) or V.is_device_array(qb.data)
    return y if (on_device or out is not None) else y.copy_to_host()


@cuda.jit
def _copy_cols_kernel(src, c0, dst):
    """dst[r, c] = src[r, c0 + c] (a block per row, grid-stride, threads along the row)."""
    r = cuda.blockIdx.x
    while r < dst.shape[0]:
        for c in range(cuda.threadIdx.x, dst.shape[1], cuda.blockDim.x):
            dst[r, c] = src[r, c0 + c]
        r += cuda.gridDim.x


def _cols(src, c0: int, width: int):
    """A contiguous copy of src[:, c0:c0 + width] (device arrays)."""
    dst = cuda.device_array((src.shape[0], width), src.dtype)
    _copy_cols_kernel[max(1, min(src.shape[0], runtime.MAX_BLOCKS)), runtime.block_threads(128)](src, c0, dst)
    return dst


def _wgrad_operands(qdyt, qxt):
    """qdyt (N, M) and qxt (K, M), both in 1 x 128 tiles along the M tokens, checked."""
    a, sa, fa = check_operand("qdyt", qdyt, "tile")
    b, sb, fb = check_operand("qxt", qxt, "tile")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"qdyt and qxt must cover the same tokens (their second dimension): qdyt.data is {a.shape}, "
                         f"qxt.data {b.shape}")
    return a, sa, b, sb, fa, fb


def fp8_grouped_wgrad(qdyt, qxt, offsets, out=None, version=None):
    """dW (E, N, K) float32: dW[e] = dequant(qdyt)[:, rows of e] @ dequant(qxt)[:, rows of e].T, each expert's weight
    gradient summed over its tokens (0 for an expert with none).

    qdyt: dy^T (N, M) and qxt: x^T (K, M), both quantized in 1 x 128 tiles along the M tokens
    (fl.quantize(dy.T.copy(), granularity="tile")); offsets: E + 1 host integers as fp8_grouped_gemm takes them
    (multiples of 128, so no tile spans two experts). out: a float32 (E, N, K) device array (None: a new one).
    version: as fp8_grouped_gemm. Each expert's result is bit for bit fl.fp8_gemm of its columns."""
    a, sa, b, sb, fa, fb = _wgrad_operands(qdyt, qxt)
    (N, M), K = a.shape, b.shape[0]
    E = np.shape(offsets)[0] - 1 if np.ndim(offsets) == 1 and np.shape(offsets)[0] >= 2 else 0
    if E < 1:
        raise ValueError(f"offsets must be E + 1 >= 2 integers (each expert's first token, then M), got "
                         f"{V.describe(offsets)}")
    off = check_offsets(offsets, M, E)
    version = _version(version)
    dw = output(out, E, N, K)
    da, dsa, db, dsb = (runtime.to_device(x) for x in (a, sa, b, sb))
    for e in range(E):
        r0, r1 = int(off[e]), int(off[e + 1])
        if r1 == r0:
            zero_rows_kernel[max(1, min(N, runtime.MAX_BLOCKS)), runtime.block_threads(128)](dw[e])
            continue
        g0, g1 = r0 // GROUP_K, r1 // GROUP_K
        launch(_cols(da, r0, r1 - r0), _cols(dsa, g0, g1 - g0), _cols(db, r0, r1 - r0), _cols(dsb, g0, g1 - g0), dw[e],
               ScaleKind.TILE, ScaleKind.TILE, fa, fb, version=version)
    on_device = V.is_device_array(qdyt.data) or V.is_device_array(qxt.data)
    return dw if (on_device or out is not None) else dw.copy_to_host()


def reference_grouped_wgrad(qdyt, qxt, offsets) -> np.ndarray:
    """float64 (E, N, K): each expert's dequant(qdyt)[:, rows] @ dequant(qxt)[:, rows].T (0 for an empty one)."""
    a, sa, b, sb, fa, fb = _wgrad_operands(qdyt, qxt)
    (N, M), K = a.shape, b.shape[0]
    off = check_offsets(offsets, M, len(offsets) - 1)
    a, sa, b, sb = (runtime.to_host(x) for x in (a, sa, b, sb))
    out = np.zeros((len(off) - 1, N, K))
    for e in range(len(off) - 1):
        r0, r1 = int(off[e]), int(off[e + 1])
        if r1 > r0:
            g0, g1 = r0 // GROUP_K, r1 // GROUP_K
            out[e] = reference64(spec.QuantizedTensor(np.ascontiguousarray(a[:, r0:r1]), sa[:, g0:g1].copy(), fa,
                                                      "tile"),
                                 spec.QuantizedTensor(np.ascontiguousarray(b[:, r0:r1]), sb[:, g0:g1].copy(), fb,
                                                      "tile"))
    return out


def reference_grouped(qa, qb, offsets) -> np.ndarray:
    """float64: each group's rows of dequant(qa) @ dequant(qb[e]).T (fp8_gemm's reference64 group by group)."""
    a, sa, b, sb, fa, fb = _operands(qa, qb)
    (M, K), (E, N, _) = a.shape, b.shape
    off = check_offsets(offsets, M, E)
    a, sa, b, sb = (runtime.to_host(x) for x in (a, sa, b, sb))
    y = np.zeros((M, N))
    for e in range(E):
        r0, r1 = int(off[e]), int(off[e + 1])
        if r1 > r0:
            y[r0:r1] = reference64(spec.QuantizedTensor(a[r0:r1], sa[r0:r1], fa, "tile"),
                                   spec.QuantizedTensor(b[e], sb[e], fb, "block"))
    return y
