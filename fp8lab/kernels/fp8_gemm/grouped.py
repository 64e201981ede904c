"""The grouped FP8 GEMM of routed experts (`fp8_grouped_gemm`): the tokens of each expert in contiguous rows of qa,
each group padded to a multiple of 128 rows (DeepGEMM's "contiguous" layout for its grouped GEMMs), multiplied by
that expert's weight qb[e]: y[rows of e] = dequant(qa[rows of e]) @ dequant(qb[e]).T.

One launch of the chosen fp8_gemm version per non-empty group, on views of qa's rows, qb[e] and y's rows: group by
group the same bits as `fp8_gemm` of that group (a test holds it to that). With groups padded to 128 rows, every
1 x 128 tile of qa and every 128-row output tile belongs to one expert, which is what a single-launch kernel (a
table from output tile to expert) needs next."""

from __future__ import annotations

import numpy as np

from ... import _validate as V
from ...device import runtime
from ...numerics import spec
from ...numerics.spec import GROUP_K, ScaleKind
from .host import check_device, launch, output
from .reference import reference64
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
    for name, q, want in (("qa", qa, "tile"), ("qb", qb, "block")):
        if not all(hasattr(q, a) for a in ("data", "scale", "granularity", "fmt")):
            raise TypeError(f"{name} must be a QuantizedTensor, got {V.describe(q)}")
        if q.granularity != want or getattr(q, "block", GROUP_K) not in (None, GROUP_K):
            raise ValueError(f"{name} must have granularity {want!r} with block {GROUP_K}, got {q.granularity!r} "
                             f"(block {getattr(q, 'block', None)!r})")
    a = V.array("qa.data", qa.data, dtype=np.uint8, ndim=2)
    b = V.array("qb.data", qb.data, dtype=np.uint8, ndim=3)
    (M, K), (E, N, K2) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"qa and qb must share K: qa.data is {a.shape}, qb.data {b.shape} (E, N, K)")
    sa = V.array("qa.scale", qa.scale, dtype=np.float32, shape=spec.scale_shape("tile", (M, K)))
    sb = V.array("qb.scale", qb.scale, dtype=np.float32, shape=(E,) + spec.scale_shape("block", (N, K)))
    return a, sa, b, sb, spec.fmt_name(qa.fmt, "qa.fmt"), spec.fmt_name(qb.fmt, "qb.fmt")


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
    version = V.version("version", version, VERSIONS, default=best_version())
    if version in PERSISTENT_VERSIONS:
        raise ValueError(f"version must not be a persistent one {PERSISTENT_VERSIONS} (its grid is sized per call), "
                         f"got {version}")
    check_device(version)
    y = output(out, M, N)
    da, dsa, db, dsb = (runtime.to_device(x) for x in (a, sa, b, sb))
    for e in range(E):
        r0, r1 = int(off[e]), int(off[e + 1])
        if r1 > r0:
            launch(da[r0:r1], dsa[r0:r1], db[e], dsb[e], y[r0:r1], ScaleKind.TILE, ScaleKind.BLOCK, fa, fb,
                   version=version)
    on_device = V.is_device_array(qa.data) or V.is_device_array(qb.data)
    return y if (on_device or out is not None) else y.copy_to_host()


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
