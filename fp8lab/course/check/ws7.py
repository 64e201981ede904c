"""ws7: the FP8 GEMM with a scale per K-group of 128 (1 x 128 tiles of a, 128 x 128 blocks of b), the partial sum
of each group scaled and added in FP32 on the CUDA cores (DeepSeek-V3, arXiv 2412.19437, section 3.3.2), and the
error against K with and without promotion, checked against fp8lab.kernels.fp8_gemm.reference (the spec the
library's kernels match bit for bit under the simulator) and fp8lab.numerics.accum.

The wrong-answer models below only choose a hint; right or wrong is always decided by the library's references."""

from __future__ import annotations

import ast
import inspect
import textwrap

import numpy as np

from ... import bench
from ...device import runtime
from ...device.runtime import cuda
from ...kernels import fp8_gemm as fg
from ...numerics import accum, formats, spec
from ...numerics.spec import GROUP_K, QuantizedTensor
from ._core import (NotAttempted, call_answer, fail, launch, not_attempted_message, question, require_kernel,
                    still_a_placeholder)

__all__ = ["FP8_GEMM_BLOCK", "scaled_group_sum", "fp8_gemm_promoted_kernel", "promotion_vs_k"]

FP8_GEMM_BLOCK = (16, 4)  # threads per block: 16 along n (threadIdx.x), 4 along m (threadIdx.y)
_LUT = formats.value_table(formats.E4M3).astype(np.float32)  # code -> value, 256 entries


def _call(q, fn, call, args, hint):
    """fn(*args), a learner's exception turned into a failure naming the call (`call`: a short description)."""
    return call_answer(q, fn, args, hint, call)


def _require_own_code(q, fn, instead):
    """Refuse an answer whose source calls the library's references (it would be checked against itself)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in {"dot_limited", "limited_step", "fp8_gemm", "reference64"} or (
                isinstance(node, ast.Attribute) and name == "reference"):
            fail(q, [f"{getattr(fn, '__name__', 'your function')} calls {name}: that is what the check compares "
                     "with"], f"write the arithmetic yourself ({instead}); the library is the reference, not part "
                              "of the answer")


def _operands(rng, M, N, K):
    """(qa, qb): fresh N(0, 1) a (M, K) in 1 x 128 tiles, b (N, K) in 128 x 128 blocks, E4M3 (host arrays). Each
    row gets its own size, so the scales differ from group to group."""
    qs = []
    for rows, granularity in ((M, "tile"), (N, "block")):
        x = rng.standard_normal((rows, K), dtype=np.float32) * np.exp2(rng.integers(-4, 5, (rows, 1))).astype(
            np.float32)
        codes, scale, _ = spec.quantize(x, granularity)
        qs.append(QuantizedTensor(codes, scale, "e4m3", granularity, GROUP_K))
    return tuple(qs)


def _group(q, g):
    """The operand q cut to its K-group g (codes and that group's column of scales)."""
    k0 = g * GROUP_K
    return QuantizedTensor(q.data[:, k0:k0 + GROUP_K], q.scale[:, g:g + 1], q.fmt, q.granularity, q.block)


def _order_matters():
    """(qa, qb): one K-group whose float32 sum in k order differs from the sum in any other order: 256 * 256 first,
    then 127 products 2^-9 * 1, each under half an ulp of 2^16, so lost one by one in k order but not when added
    apart first (np.sum's and np.dot's partial sums). Random inputs catch that mistake only by chance."""
    a = np.full((1, GROUP_K), 2.0 ** -9, np.float32)
    b = np.ones((1, GROUP_K), np.float32)
    a[0, 0] = b[0, 0] = 256.0
    one = np.ones((1, 1), np.float32)
    return (QuantizedTensor(formats.encode(a), one, "e4m3", "tile", GROUP_K),
            QuantizedTensor(formats.encode(b), one.copy(), "e4m3", "block", GROUP_K))


def _f32_sum(p):
    """float32 sum in k order (one rounding per addition)."""
    return np.cumsum(np.asarray(p, np.float32), dtype=np.float32)[-1] if len(p) else np.float32(0)


# ------------------------------------------------------------------------------ Q1: one K-group, scaled (NumPy)


def _q1_variants(qa, qb, m, n, g):
    """(label, value, hint): the mistakes the check recognizes for output (m, n), group g."""
    k0, k1 = g * GROUP_K, min((g + 1) * GROUP_K, qa.data.shape[1])
    a = formats.decode(qa.data[m, k0:k1])
    b = formats.decode(qb.data[n, k0:k1])
    p = (a * b).astype(np.float32)
    sa, sb = qa.scale[m, g], qb.scale[n // GROUP_K, g]
    s = np.float32(sa * sb)
    whole_k = _f32_sum(formats.decode(qa.data[m]) * formats.decode(qb.data[n]))
    order = ("add the products one at a time in float32, in k order (acc = np.float32(acc + p[k])), then "
             "multiply once: np.sum and np.dot add in another order (pairwise) and float64 rounds differently")
    return [
        ("float64 sum", np.float32(np.float32(np.sum(p.astype(np.float64))) * s), order),
        ("np.sum", np.float32(np.sum(p, dtype=np.float32) * s), order),
        ("np.dot", np.float32(np.float32(np.dot(a, b)) * s), order),
        ("scaled products", _f32_sum(p * s),
         "sum the group's products first, then multiply the partial sum by sa * sb once: the scale is the same for "
         "every k of the group, so it comes out of the group's sum (that is why one scale per 128 of K costs so "
         "little)"),
        ("two roundings", np.float32(np.float32(_f32_sum(p) * sa) * sb),
         "multiply the two scales first (one float32 product, s = sa * sb), then partial * s: (partial * sa) * sb "
         "rounds twice"),
        ("divided", np.float32(_f32_sum(p) / s),
         "the scales are dequantization factors (x ~= decode(code) * scale): multiply, do not divide"),
        ("no scales", _f32_sum(p), "multiply the partial sum by sa[m, g] * sb[n // 128, g]"),
        ("whole K", np.float32(whole_k * s), f"sum only the group's k: {k0} <= k < {k1} for g = {g}"),
        ("b's scale of row 0", np.float32(_f32_sum(p) * np.float32(sa * qb.scale[0, g])),
         "b's scales are one per 128 x 128 block: row n uses sb[n // 128, g]"),
    ]


@question
def scaled_group_sum(fn, rng=None):
    """Check `fn(a_codes, sa, b_codes, sb, m, n, g) -> float32`: output (m, n)'s term of K-group g, the float32 sum in
    k order of decode(a[m, k]) * decode(b[n, k]) over the group, times sa[m, g] * sb[n // 128, g]; bit for bit equal
    to fp8_gemm.reference of that single group."""
    q = "scaled_group_sum"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    _require_own_code(q, fn, "formats.decode, a float32 loop over k, one multiplication by sa * sb")
    rng = np.random.default_rng() if rng is None else rng
    hint = "return one number: np.float32(partial * (sa[m, g] * sb[n // 128, g]))"
    n_checked = 0
    cases = [_operands(rng, M, N, K) for M, N, K in ((5, 2 * GROUP_K + 7, 2 * GROUP_K + 45), (3, 9, 100))]
    for qa, qb in cases + [_order_matters()]:
        (M, K), N = qa.data.shape, qb.data.shape[0]
        G = -(-K // GROUP_K)
        picks = [(M - 1, N - 1, G - 1), (0, 0, 0)] + [(int(rng.integers(M)), int(rng.integers(N)),
                                                       int(rng.integers(G))) for _ in range(10)]
        if N > GROUP_K:
            picks.append((int(rng.integers(M)), GROUP_K + 3, 0))  # b's second block row
        for m, n, g in picks:
            want = fg.reference(_group(qa, g), _group(qb, g))[m, n]
            call = f"scaled_group_sum(a_codes {qa.data.shape}, sa, b_codes {qb.data.shape}, sb, m={m}, n={n}, g={g})"
            got = _call(q, fn, call, (qa.data.copy(), qa.scale.copy(), qb.data.copy(), qb.scale.copy(), m, n, g),
                        "index b's scales by the block row n // 128; the last group of K may be shorter than 128")
            try:
                got = np.asarray(got)
                ok_type = got.size == 1 and got.dtype.kind == "f"
            except Exception:
                ok_type = False
            if not ok_type:
                fail(q, [f"{call} returned {got!r}: expected one float32 number"], hint)
            got = got.reshape(())
            n_checked += 1
            if got.dtype != np.float32:
                fail(q, [f"{call} returned a {got.dtype} number: expected float32, as the kernel keeps it"],
                     "keep the arithmetic in float32: the products, the running sum (np.float32(0) to start) and "
                     "the scales are all float32")
            if not (got == want):  # NaN is never equal
                lines = [f"{call}: returned {float(got)!r}, expected {float(want)!r} (fp8_gemm.reference of that "
                         "group)"]
                h = next((h for _, v, h in _q1_variants(qa, qb, m, n, g) if v == got), None)
                fail(q, lines, h or "sum the group's products in float32, one at a time in k order, then scale that "
                                    "sum once by the two operands' scales of this group (check.hint gives the formula)")
    return (f"{n_checked} group terms (odd K, a short last group, b's second block row, a sum that depends on the "
            "order) equal fp8_gemm.reference's, bit for bit")


# ------------------------------------------------------------------------------ Q2: the kernel


def _q2_models(qa, qb):
    """(label, float32 (M, N), hint): whole GEMMs with one usual mistake each."""
    A, B = formats.decode(qa.data), formats.decode(qb.data)
    M, K = A.shape
    N = B.shape[0]
    G = -(-K // GROUP_K)
    SA, SB = qa.scale, np.repeat(qb.scale, GROUP_K, axis=0)[:N]

    def run(groups, scale):
        acc = np.zeros((M, N), np.float32)
        for g in groups:
            partial = np.zeros((M, N), np.float32)
            for k in range(g * GROUP_K, min((g + 1) * GROUP_K, K)):
                partial = partial + np.outer(A[:, k], B[:, k])
            acc = acc + scale(partial, g)
        return acc

    def s(g):
        return np.outer(SA[:, g], SB[:, g])

    return [
        ("last group missing", run(range(K // GROUP_K), lambda p, g: p * s(g)),
         "the last K-group may be short: loop k0 over range(0, K, 128) and stop each group at min(k0 + 128, K)"),
        ("group 0's scales", run(range(G), lambda p, g: p * s(0)),
         "each K-group has its own scales: column g = k0 // 128 of sa and sb"),
        ("two roundings", run(range(G), lambda p, g: (p * SA[:, g:g + 1]) * SB[:, g][None, :]),
         "multiply the two scales first, s = sa[m, g] * sb[n // 128, g], then acc += partial * s"),
        ("no scales", run(range(G), lambda p, g: p), "multiply each group's partial sum by its two scales"),
    ]


@question
def fp8_gemm_promoted_kernel(kernel, rng=None):
    """Check a kernel `(a, sa, b, sb, lut, c)`: c = the FP8 GEMM a @ b.T with scales per K-group (a: 1 x 128 tiles,
    b: 128 x 128 blocks), one thread per output (n = cuda.grid(2)[0], m = cuda.grid(2)[1]), blocks of
    FP8_GEMM_BLOCK threads. Bit for bit equal to fp8_gemm.reference under the simulator (within
    fp8_gemm.fma_tolerance on a GPU, where acc + partial * s may be one FMA); c poisoned with NaN."""
    q = "fp8_gemm_promoted_kernel"
    require_kernel(q, kernel)
    rng = np.random.default_rng() if rng is None else rng
    bx, by = FP8_GEMM_BLOCK
    shapes = ([(6, GROUP_K + 5, 2 * GROUP_K + 3), (3, 5, 100)] if runtime.IS_SIM else
              [(300, 517, 1000), (3, 5, 100)])
    lut = cuda.to_device(_LUT)
    for M, N, K in shapes:
        name = f"M={M}, N={N}, K={K}"
        qa, qb = _operands(rng, M, N, K)
        c = bench.poisoned((M, N), np.float32)
        grid = (-(-N // bx), -(-M // by))
        launch(q, name, kernel, (grid, (bx, by)), cuda.to_device(qa.data), cuda.to_device(qa.scale),
               cuda.to_device(qb.data), cuda.to_device(qb.scale), lut, c)
        got = c.copy_to_host()
        ref = fg.reference(qa, qb)
        tol = fg.fma_tolerance(qa, qb)
        bad = ~(np.abs(got.astype(np.float64) - ref) <= tol)  # NaN fails
        if bad.any():
            idx = [tuple(int(v) for v in i) for i in np.argwhere(bad)[:3]]
            lines = [f"case {name}: {int(bad.sum())} of {got.size} outputs differ from fp8_gemm.reference, e.g."]
            lines += [f"  c[{m}, {n}]: got {got[m, n]!r}, expected {ref[m, n]!r}" for m, n in idx]
            fail(q, lines, _q2_hint(got, ref, bad, qa, qb))
    return ("c equals fp8_gemm.reference " + ("bit for bit" if runtime.IS_SIM else "within one FMA rounding per "
            "K-group") + " on odd shapes (a short last K-group, b's second block row, K below 128)")


def _q2_hint(got, ref, bad, qa, qb):
    if np.isnan(got[bad]).any():
        return ("some outputs are still the NaN poison: n, m = cuda.grid(2) (x along n, y along m), and every "
                "thread with m < M and n < N stores c[m, n]")
    for _, y, h in _q2_models(qa, qb):
        if np.array_equal(y[bad], got[bad]):
            return h
    if qb.data.shape[0] > GROUP_K and not bad[:, :GROUP_K].any():
        return "only b's rows from 128 on are wrong: b's scale of row n is sb[n // 128, g]"
    return ("per K-group: partial = np.float32(0), then partial += lut[a[m, k]] * lut[b[n, k]] in k order; "
            "acc += partial * (sa[m, g] * sb[n // 128, g]); everything float32")


# ------------------------------------------------------------------------------ Q3: error against K


def _errors(a, b, ks, bits=13, promote=128, metric=np.max, exact_dtype=np.float64):
    out = []
    for k in ks:
        ak, bk = a[:, :k], b[:, :k]
        exact = (ak.astype(exact_dtype) @ bk.astype(exact_dtype).T).astype(np.float64)
        row = []
        for y in (accum.dot_limited(ak, bk, bits), accum.dot_limited(ak, bk, bits, promote_every=promote),
                  accum.dot_limited(ak, bk, None)):
            row.append(float(metric(np.abs(y.astype(np.float64) - exact) / np.abs(exact))))
        out.append(row)
    return np.array(out)


@question
def promotion_vs_k(fn, rng=None):
    """Check `fn(a, b, ks) -> array (len(ks), 3)`: for each k, the largest relative error over the outputs of the
    GEMM of the first k columns of a and b (E4M3 values, float32) with the limited accumulator (13 bits) without
    promotion, promoted every 128, and FP32 accumulation; recomputed with fp8lab.numerics.accum."""
    q = "promotion_vs_k"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    hint = "return np.array(rows): one row [no promotion, promoted every 128, FP32] per k"
    for M, N, ks in ((3, 5, [96, 320, 1000]), (2, 4, [128, 700])):
        a, b = (formats.decode(spec.quantize(rng.random((r, max(ks)), dtype=np.float32), "tile")[0])
                for r in (M, N))
        call = f"promotion_vs_k(a {a.shape}, b {b.shape}, ks={ks})"
        got = _call(q, fn, call, (a.copy(), b.copy(), list(ks)), hint)
        try:
            got = np.asarray(got, np.float64)
        except (TypeError, ValueError):
            fail(q, [f"{call} returned {got!r}: expected an array of numbers"], hint)
        if got.shape != (len(ks), 3):
            fail(q, [f"{call} returned shape {got.shape}: expected ({len(ks)}, 3)"], hint)
        want = _errors(a, b, ks)
        if not np.allclose(got, want, rtol=1e-9, atol=0):  # NaN fails
            variants = [
                ("mean", _errors(a, b, ks, metric=np.mean),
                 "the largest relative error over the outputs (np.max), as DeepSeek reports it, not the mean"),
                ("promote every 32", _errors(a, b, ks, promote=32), "promote every 128 of K (N_C = 128), not 32"),
                ("14 bits", _errors(a, b, ks, bits=14), "13 mantissa bits (FP22), not 14"),
                ("float32 exact", _errors(a, b, ks, exact_dtype=np.float32),
                 "compute the exact product in float64: a float32 'exact' has errors of its own"),
                ("whole K", np.repeat(_errors(a, b, [max(ks)]), len(ks), axis=0),
                 "use only the first k columns of a and b for each k: a[:, :k], b[:, :k]"),
            ]
            h = next((h for _, v, h in variants if v.shape == got.shape and np.allclose(got, v, rtol=1e-9)), None)
            if h is None and np.allclose(got[:, [1, 0, 2]], want, rtol=1e-9):
                h = "the columns are swapped: no promotion first, then promoted every 128, then FP32"
            i = int(np.argmax(~np.isclose(got, want, rtol=1e-9).all(axis=1)))
            fail(q, [f"{call}: row for k = {ks[i]} is {got[i].tolist()}, expected {want[i].tolist()}"],
                 h or "per k, compare each model's result on the first k columns with the float64 product: the largest "
                      "relative error, no promotion, promoted every 128, FP32 (check.hint gives the calls)")
    return "the errors without promotion, promoted every 128 and in FP32 equal fp8lab.numerics.accum's for every k"
