"""A NumPy model of the Hopper FP8 tensor-core accumulator, and DeepSeek-V3's accuracy-vs-K experiment.

DeepSeek-V3 (arXiv 2412.19437, section 3.5.2) reports that the FP8 GEMM on H800 tensor cores "is limited to
retaining around 14 bits" of the accumulated sum, that the maximum relative error of a K = 4096 GEMM on
random inputs "is nearly 2%", and fixes it by promoting the partial sums to FP32 registers on the CUDA cores
every N_C = 128 elements of K (4 WGMMAs), where the per-group scales are applied too. SageAttention2
(arXiv 2411.10958) describes the accumulator as "FP22": 1 sign, 8 exponent and 13 mantissa bits, the lower
bits truncated, the products of each group of 32 aligned to the group's largest exponent. The multi-term
adder behind that description (align every addend to the largest exponent, truncate what falls below the
last kept bit, add exactly, normalize, truncate) is the one Fasi, Higham, Mikaitis and Pranesh measured on
earlier tensor cores ("Numerical behavior of NVIDIA tensor cores", PeerJ Computer Science 2021), where the
running accumulator (the C of D = A*B + C) is one of the aligned addends.

The model, exactly (B = accum_bits, 13 for FP22; products of FP8 values are exact in float32):

    acc = 0                                            # the limited accumulator, B + 1 significant bits
    for each group of `group` (32) consecutive k:      # one tensor-core step (the last group may be short)
        terms = [a[k] * b[k] for k in the group] + [acc]
        E     = max frexp-exponent of the nonzero terms # x = m * 2^e, 0.5 <= |m| < 1
        ulp   = 2^(E - B - 1)                          # the last kept bit of the largest term
        t     = sum(trunc(term / ulp) for term in terms)   # aligned and truncated toward zero; exact
        acc   = trunc_to_bits(t * ulp, B)              # normalized, truncated toward zero to B mantissa bits
    promote_every = P (a multiple of group): after every P elements of k (and at the end)
        fp32 = float32(fp32 + acc); acc = 0            # DeepSeek's promotion to an FP32 register
    without promotion the result is acc.

Zero terms take no part in choosing E (frexp(0) would say exponent 0). Everything is exact in float64: terms
have at most 24 significant bits, the aligned sum is an integer below 33 * 2^24. `accum_bits=None` is plain
FP32 accumulation: fp32 = float32(fp32 + a[k] * b[k]) in k order, one rounding per product (an FMA on a GPU
gives the same bits, since the product of two FP8 values is exact in float32). accum_bits=23 is an
accumulator with float32's precision but truncating, which lands close to FP32 (see the tests).

This is the arithmetic of fp8lab/kernels/fp8_gemm/simt.py's `accum_bits` option, bit for bit: the kernel
processes k in the same order with the same groups. What the model does not know: the real order in which a
WGMMA (m64nNk32) adds its 32 products and whether the accumulator joins the alignment of each group; the
rounding of the real hardware's normalization; behaviour with NaN/Inf inputs (not modelled).

`error_vs_k` runs DeepSeek's experiment on this model (see its docstring for the inputs and the metric).
"""

from __future__ import annotations

import numpy as np

from . import formats, spec

__all__ = ["dot_limited", "error_vs_k", "limited_step", "trunc_to_bits", "check_bits", "check_group_promote",
           "GROUP"]

GROUP = 32  # products per tensor-core alignment group (SageAttention2: groups of 32)
_ZERO_EXP = -(1 << 20)  # exponent given to zero terms: below every real one


def check_bits(accum_bits):
    if accum_bits is None:
        return None
    if isinstance(accum_bits, bool) or not isinstance(accum_bits, (int, np.integer)):
        raise TypeError(f"accum_bits must be None or an int in 1..23, got {type(accum_bits).__name__} {accum_bits!r}")
    if not 1 <= accum_bits <= 23:
        raise ValueError(f"accum_bits must be None or an int in 1..23 (mantissa bits kept), got {accum_bits}")
    return int(accum_bits)


def check_group_promote(group, promote_every):
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group <= 0:
        raise ValueError(f"group must be a positive int, got {group!r}")
    if promote_every is not None:
        if isinstance(promote_every, bool) or not isinstance(promote_every, (int, np.integer)):
            raise TypeError(f"promote_every must be None or a positive multiple of group={group}, got "
                            f"{type(promote_every).__name__} {promote_every!r}")
        if promote_every <= 0 or promote_every % group:
            raise ValueError(f"promote_every must be None or a positive multiple of group={group}, "
                             f"got {promote_every}")
    return int(group), None if promote_every is None else int(promote_every)


def trunc_to_bits(x, bits: int) -> np.ndarray:
    """x (float64 array) truncated toward zero to `bits` mantissa bits (bits + 1 significant bits)."""
    m, e = np.frexp(np.asarray(x, np.float64))
    return np.ldexp(np.trunc(np.ldexp(m, bits + 1)), e - bits - 1)


def _exponent(x):
    """frexp exponent of x, _ZERO_EXP where x == 0."""
    _, e = np.frexp(x)
    return np.where(x == 0, _ZERO_EXP, e)


def limited_step(acc, p, bits):
    """One alignment group: acc (..., M, N) float64 limited accumulator(s), p (M, N, g) exact products.

    acc may carry extra leading axes (several accumulators fed the same products)."""
    e_p = _exponent(p).max(axis=-1)
    E = np.maximum(e_p, _exponent(acc))
    sh = (bits + 1 - E).astype(np.int32)  # term / ulp == ldexp(term, sh)
    sh = np.clip(sh, -2000, 2000)  # all-zero terms: E = _ZERO_EXP; every term is 0 anyway
    t = np.trunc(np.ldexp(p, sh[..., None])).sum(axis=-1) + np.trunc(np.ldexp(acc, sh))
    return trunc_to_bits(np.ldexp(t, -sh), bits)


def _as_2d(name, x):
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise TypeError(f"{name} must be a float array (FP8-decoded values), got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 1-D (K,) or 2-D (rows, K), got shape {arr.shape}")
    return arr.astype(np.float32)


def dot_limited(a, b, accum_bits=13, group: int = GROUP, promote_every=None) -> np.ndarray:
    """The model's a @ b.T: a (M, K) or (K,), b (N, K) or (K,) FP8-decoded float32 values -> float32 (M, N).

    1-D inputs are treated as one row (the result then has shape (1, 1), (1, N) or (M, 1)).
    accum_bits: mantissa bits of the limited accumulator (13 = FP22), None = plain FP32 accumulation.
    group: products aligned together (32). promote_every: None, or a multiple of group: every that many k the
    limited sum is added to an FP32 accumulator and restarted (DeepSeek's N_C = 128). See the module
    docstring for the exact arithmetic. Vectorized over M and N; the loop runs over K / group groups.
    """
    bits = check_bits(accum_bits)
    group, promote_every = check_group_promote(group, promote_every)
    a, b = _as_2d("a", a), _as_2d("b", b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a and b must share K (the last dimension): got a {a.shape}, b {b.shape}")
    M, K = a.shape
    N = b.shape[0]
    if bits is None:  # FP32: one float32 rounding per product, k order
        acc = np.zeros((M, N), np.float32)
        for k in range(K):
            acc = acc + np.outer(a[:, k], b[:, k])  # the products are exact in float32
        return acc
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fp32 = np.zeros((M, N), np.float32)
    lim = np.zeros((M, N), np.float64)
    for k0 in range(0, K, group):
        p = a64[:, None, k0:k0 + group] * b64[None, :, k0:k0 + group]
        lim = limited_step(lim, p, bits)
        if promote_every is not None and (k0 + group) % promote_every == 0:
            fp32 = fp32 + lim.astype(np.float32)  # lim holds <= 24 significant bits: exact in float32
            lim = np.zeros_like(lim)
    if promote_every is None:
        return lim.astype(np.float32)
    return fp32 + lim.astype(np.float32)  # the last, partial promotion (lim is 0 when K % promote_every == 0)


def _inputs(rng, shape, dist):
    if dist == "normal":
        return rng.standard_normal(shape, dtype=np.float32)
    return rng.random(shape, dtype=np.float32)


def error_vs_k(ks=(256, 512, 1024, 2048, 4096, 8192, 16384), trials: int = 2, accum_bits: int = 13,
               promote_every_list=(32, 64, 128, 256), rng=None, size: int = 64, dist: str = "uniform") -> dict:
    """DeepSeek-V3's experiment (section 3.5.2) on this model: relative error of an FP8 GEMM vs K.

    Inputs: each trial draws a (size, Kmax) and b (size, Kmax) float32, Kmax = max(ks), from `dist`:
      "uniform": U[0, 1) (positive: no cancellation, |exact| grows like K / 4, the accumulator is always
                 large against each product: the case where limited precision hurts most);
      "normal":  N(0, 1) (zero-mean: |exact| grows like sqrt(K), and some outputs are near 0).
    Both are quantized to E4M3 per 1 x 128 tile along K (scale = amax / 448, `spec.quantize(x, "tile")`); the GEMM runs
    on the decoded FP8 values (the scales only multiply results, they do not change relative errors). The
    GEMM with K = k uses the first k columns (so the curves over K are correlated, and one pass over Kmax
    gives every point).
    Metric: y_exact = float64 a[:, :k] @ b[:, :k].T of the same FP8 values. "uniform": the relative error of
    each output element, |y - y_exact| / |y_exact|. "normal": |y - y_exact| / rms(y_exact) over the trial's
    matrix (the elementwise ratio is unbounded where y_exact is near 0, so its max says nothing).
    Returns {"ks": ks, "dist": dist, "curves": {label: {"max": [...], "mean": [...]}}} with labels "FP32",
    f"FP{accum_bits + 9} (no promotion)" and f"promote every {P}", max and mean over all trials' elements.
    """
    bits = check_bits(accum_bits)
    if bits is None:
        raise ValueError("accum_bits must be an int in 1..23 for error_vs_k (FP32 is always included)")
    if dist not in ("uniform", "normal"):
        raise ValueError(f"dist must be one of ('uniform', 'normal'), got {dist!r}")
    ks = [int(k) for k in ks]
    if not ks or any(k <= 0 or k % GROUP for k in ks) or ks != sorted(set(ks)):
        raise ValueError(f"ks must be increasing positive multiples of {GROUP}, got {ks}")
    plist = [None] + [check_group_promote(GROUP, p)[1] for p in promote_every_list]
    rng = np.random.default_rng() if rng is None else rng
    kmax = ks[-1]
    labels = ["FP32", f"FP{bits + 9} (no promotion)"] + [f"promote every {p}" for p in plist[1:]]
    errs = {lab: {k: [] for k in ks} for lab in labels}
    for _ in range(trials):
        a = spec.quantize(_inputs(rng, (size, kmax), dist), "tile")[0]
        b = spec.quantize(_inputs(rng, (size, kmax), dist), "tile")[0]
        a, b = formats.decode(a), formats.decode(b)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        C = len(plist)
        lim = np.zeros((C, size, size))
        fp32 = np.zeros((C, size, size), np.float32)
        f32 = np.zeros((size, size), np.float32)
        exact = np.zeros((size, size))
        for k0 in range(0, kmax, GROUP):
            for k in range(k0, k0 + GROUP):  # FP32 accumulation, k order
                f32 = f32 + np.outer(a[:, k], b[:, k])
            p = a64[:, None, k0:k0 + GROUP] * b64[None, :, k0:k0 + GROUP]
            exact += p.sum(axis=-1)  # float64: error ~1e-16 relative, far below what is measured
            lim = limited_step(lim, p, bits)
            for c, P in enumerate(plist):
                if P is not None and (k0 + GROUP) % P == 0:
                    fp32[c] = fp32[c] + lim[c].astype(np.float32)
                    lim[c] = 0
            k = k0 + GROUP
            if k in errs["FP32"]:
                denom = np.abs(exact) if dist == "uniform" else np.sqrt(np.mean(exact**2))
                outs = [f32] + [lim[0]] + [fp32[c] + lim[c].astype(np.float32) for c in range(1, C)]
                for lab, y in zip(labels, outs):
                    errs[lab][k].append((np.abs(y.astype(np.float64) - exact) / denom).ravel())
    curves = {}
    for lab in labels:
        allk = [np.concatenate(errs[lab][k]) for k in ks]
        curves[lab] = {"max": [float(e.max()) for e in allk], "mean": [float(e.mean()) for e in allk]}
    return {"ks": ks, "dist": dist, "curves": curves}
