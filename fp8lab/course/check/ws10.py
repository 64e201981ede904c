"""ws10: the FP8 Linear's weight gradient the DeepSeek-V3 way: the cached 1x128 tiles of x re-quantized as 128x1
tiles (checked bit for bit against fp8lab.numerics.spec.requantize_tile_to_col), Wgrad from them (against the NumPy
engine's fp8lab.training.engine_reference.Linear("fp8-deepseek").backward), what the second rounding costs (arXiv
2412.19437, sections 3.3 and 3.5.2) and how many values it changes with amax / 448 and with power-of-two scales
(section 3.3.3)."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import numpy as np

from ...numerics import formats, spec
from ...training import engine_reference as numpy_engine
from ._core import NotAttempted, fail, not_attempted_message, question, still_a_placeholder, tie_traps

__all__ = ["requantize_tile_to_col", "fp8_wgrad", "wgrad_errors", "retile_changes"]

G = spec.GROUP_K  # 128: tokens per column tile, channels per row tile
F32 = np.float32
E4M3_ONE = 0x38  # the E4M3 code of 1.0 (0xB8: -1.0)
RTOL_ERRORS = 1e-3  # Q3: the learner's norms may be float32; a float32 reference moves them by ~1e-5
SHARE_TOL = 1e-9  # Q4: shares of elements; two right answers differ by float rounding at most


def _call(q, fn, args, what, hint):
    """fn(*args), a learner's exception turned into a failure naming the call."""
    try:
        return fn(*args)
    except NotImplementedError as e:
        if still_a_placeholder(fn):
            raise
        raise NotAttempted(f"not attempted yet: {what} raised NotImplementedError ({e}): it calls an answer not "
                           "written yet (question 1's requantize_tile_to_col?)") from None
    except Exception as e:
        fail(q, [f"{what} raised {type(e).__name__}: {e}"[:600]], hint)


def _calls_attribute(fn, name) -> bool:
    """True if fn's source calls `<something>.name(...)` (the library's answer under its own name)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
               for n in ast.walk(tree))


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _deq_tiles(codes, scales):
    return spec.dequantize(codes, scales, 1, G)


# ---------------------------------------------------------------------------- Q1: 1x128 tiles -> 128x1 tiles


def _activations(rng, M, K, outliers=2):
    """float32 (M, K): tokens of different magnitudes, a few outlier channels, some -0.0."""
    x = rng.standard_normal((M, K)) * np.exp2(rng.uniform(-4, 4, (M, 1)))
    if outliers:
        x[:, rng.choice(K, min(outliers, K), replace=False)] *= rng.uniform(20, 60)
    x = x.astype(F32)
    x[rng.random((M, K)) < 0.01] = -0.0
    return x


def _trap_case(rng):
    """(codes, scales) of x (150, 40) where some values of one column group sit on E4M3 rounding ties after the
    re-scaling, so that encode(v * inv) and encode(v / scale) differ: 1.0 codes whose tile scale is the value."""
    M, K = 150, 40
    codes, scales, _ = spec.quantize(_activations(rng, M, K, outliers=0), "tile")
    k = int(rng.integers(K))
    for _ in range(100):  # for ~1 amax in 10 no tie separates the two roundings: nudge the amax's tile scale
        col = np.abs(_deq_tiles(codes, scales)[:G, k])
        top = int(np.argmax(col))
        traps = tie_traps(F32(col[top]), rng, 8)
        if len(traps) >= 4:
            break
        scales[top, 0] *= F32(rng.uniform(1.01, 1.1))
    rows = [r for r in rng.permutation(G) if r != top][: len(traps)]
    for r, t in zip(rows, traps):
        codes[r, k] = E4M3_ONE | (0x80 if t < 0 else 0)
        scales[r, 0] = abs(t)  # the row's other values change too: harmless, they stay valid codes x scales
    return (f"codes (150, 40) with values placed on E4M3 rounding ties in channel {k} after the re-scaling",
            codes, scales)


def _requant_cases(rng):
    out = []
    M, K = 300, 200  # two full token groups and one of 44; one full channel tile and one of 72
    x = _activations(rng, M, K)
    k0 = int(rng.integers(K))
    x[:G, k0] = 0.0  # channel k0 is zero in token group 0: the AMAX_FLOOR case of the new tiles
    x[:G:3, k0] = -0.0
    c, s, _ = spec.quantize(x, "tile")
    out.append((f"x ({M}, {K}) quantized in 1x128 tiles (ragged: a last token group of {M - 2 * G}, a last "
                f"channel tile of {K - G}); channel {k0} is zero in tokens 0..127", c, s))
    c, s, _ = spec.quantize(_activations(rng, 70, 130), "tile")
    out.append(("x (70, 130): fewer than 128 tokens, a channel tile of 2", c, s))
    out.append(_trap_case(rng))
    M = int(rng.integers(129, 400))
    K = int(rng.integers(1, 260))
    K += K == M
    c, s, _ = spec.quantize(_activations(rng, M, K), "tile")
    out.append((f"random x ({M}, {K})", c, s))
    return out


def _requant_variants(codes, scales):
    """(hint, (codes_t, scales_t)) of known mistakes, tried in order when an answer is wrong."""
    M, K = codes.shape
    dec = formats.decode(codes)
    old = spec.expand(scales, 1, G, codes.shape)

    def tiles_of(v_t, divide=False):
        amax = np.maximum(spec.group_amax(v_t, 1, G), spec.AMAX_FLOOR)
        scale = (amax / spec.FP8_MAX["e4m3"]).astype(F32)
        if divide:
            with np.errstate(over="ignore"):
                return formats.encode((v_t / spec.expand(scale, 1, G, v_t.shape)).astype(F32)), scale
        c, s, _ = spec.quantize(v_t, "tile")
        return c, s

    v_t = np.ascontiguousarray((dec * old).astype(F32).T)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        by_div = np.ascontiguousarray((dec / old).astype(F32).T)
    return [
        ("decode(code) is only the code's value: multiply it by its tile's old scale, scales[m, k // 128], before "
         "taking the new amax (the 128 tokens of a column group come from 128 different row tiles, each with its "
         "own scale)", tiles_of(np.ascontiguousarray(dec.T))),
        ("scale is the DEQUANTIZATION factor: the value is decode(code) * scale, not decode(code) / scale",
         tiles_of(by_div)),
        ("compute the new codes as encode(v * inv) with inv = 448 / amax (float32), as fp8lab.numerics.spec does, not "
         "encode(v / scale): the two float32 roundings differ next to E4M3 rounding ties", tiles_of(v_t, True)),
    ]


def _requant_shape_hint(M, K, gc, gs):
    n_col = -(-M // G)
    if gc.shape == (M, K) and gs.shape == (M, -(-K // G)):
        return ("these are 1x128 tiles along the channels again, x's own layout: Wgrad reduces over the tokens, so "
                "each scale must cover 128 tokens of one channel: group the columns of x, i.e. the rows of x^T")
    if gc.shape == (M, K) and gs.shape == (n_col, K):
        return ("this is x's layout, (M, K) with scales (ceil(M/128), K): return the same tiles as tiles of x^T, "
                "codes (K, M) and scales (K, ceil(M/128)), K-major as the Wgrad GEMM reads them (and as "
                "fp8lab.numerics.spec.requantize_tile_to_col returns them): transpose both")
    if gc.shape == (K, M) and M % G and gs.shape == (K, M // G):
        return (f"M = {M} tokens is not a multiple of 128: the last column group holds the {M % G} tokens left "
                f"and has its own scale, so there are ceil(M/128) = {n_col} groups, not M // 128")
    return (f"return (codes_t, scales_t): uint8 codes (K, M) = ({K}, {M}), float32 scales (K, ceil(M/128)) = "
            f"({K}, {n_col})")


def _where_wrong(mask, M, K):
    """A hint when every mismatch (in x^T's (K, M) layout) lies in a ragged last group or tile."""
    ks, ms = np.nonzero(mask)
    if M % G and (ms >= M - M % G).all():
        return (f"only the last column group is wrong: it holds the last M % 128 = {M % G} tokens; its amax is over "
                "those tokens only (pad with zeros, or slice), and it gets its own scale")
    if K % G and (ks >= K - K % G).all():
        return (f"only channels {K - K % G}.. are wrong: they lie in the last 1x128 tile of each row of x, "
                f"{K % G} channels wide, whose old scale is scales[:, -1]; expand the old scales with "
                "np.repeat(scales, 128, axis=1)[:, :K]")
    return None


@question
def requantize_tile_to_col(fn, rng=None):
    """Check `fn(codes, scales) -> (codes_t, scales_t)`: x's E4M3 codes (M, K) in 1x128 tiles with scales (M,
    ceil(K/128)) re-quantized as 128x1 tiles, i.e. tiles of x^T: codes_t uint8 (K, M), scales_t float32 (K,
    ceil(M/128)); bit-exact with fp8lab.numerics.spec.requantize_tile_to_col, on ragged shapes, an all-zero group and
    values on rounding ties. The inputs must not be modified."""
    q = "requantize_tile_to_col"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    if _calls_attribute(fn, "requantize_tile_to_col"):
        fail(q, ["your function calls the library's requantize_tile_to_col, which is the answer"],
             "write it from fl.decode, the old scales, a max over each group of 128 tokens and fl.encode")
    rng = np.random.default_rng() if rng is None else rng
    cases = _requant_cases(rng)
    for what, codes, scales in cases:
        M, K = codes.shape
        want_c, want_s = spec.requantize_tile_to_col(codes, scales)
        args = (codes.copy(), scales.copy())
        got = _call(q, fn, args, f"{q}(codes {codes.shape}, scales {scales.shape})",
                    f"{what}. A ragged shape breaks code that assumes multiples of 128: the last row tile has K % 128 "
                    "channels (np.repeat(scales, 128, axis=1)[:, :K]), the last column group M % 128 tokens")
        if not (_same_bits(args[0], codes) and _same_bits(args[1], scales)):
            fail(q, [f"{what}: your function changed its input codes or scales"],
                 "the cached FP8 x is read, not overwritten: work on copies (np.array(codes), ...)")
        try:
            gc, gs = got
            gc, gs = np.asarray(gc), np.asarray(gs)
        except (TypeError, ValueError):
            fail(q, [f"{what}: returned {type(got).__name__}, expected a pair (codes_t, scales_t)"],
                 "return codes_t, scales_t")
        if gc.shape != want_c.shape or gs.shape != want_s.shape:
            fail(q, [f"{what}: returned codes {gc.shape} and scales {gs.shape}, expected codes {want_c.shape} and "
                     f"scales {want_s.shape}"], _requant_shape_hint(M, K, gc, gs))
        if gc.dtype != np.uint8 or gs.dtype != np.float32:
            fail(q, [f"{what}: returned codes of dtype {gc.dtype} and scales of dtype {gs.dtype}, expected uint8 "
                     "and float32"], "fl.encode returns uint8 codes; keep the scale arithmetic in float32 "
                     "(np.float32 amax / np.float32(448))")
        variants = _requant_variants(codes, scales)
        if np.array_equal(gc, codes.T) and not np.array_equal(want_c, codes.T):
            fail(q, [f"{what}: your codes are the old codes, transposed"],
                 "a code means decode(code) * its tile's scale; under a new scale per 128 tokens of a channel every "
                 "value must be re-encoded, encode(value * 448 / new_amax): that second rounding is the point")
        if np.isnan(gs).any() or not (gs > 0).all():
            bad = np.argwhere(~(gs > 0))[0]
            fail(q, [f"{what}: scales_t[{bad[0]}, {bad[1]}] is {gs[tuple(bad)]!r}"],
                 "an all-zero group has amax 0: floor it at spec.AMAX_FLOOR (1e-12) before computing "
                 "scale = amax / 448 and inv = 448 / amax, as lecture 04's quantizer does")
        if not _same_bits(gs, want_s):
            k, g = np.argwhere(gs.view(np.uint32) != want_s.view(np.uint32))[0]
            hint = next((h for h, (vc, vs) in variants if _same_bits(gs, vs)), None) \
                or _where_wrong(np.repeat(gs != want_s, G, axis=1)[:, :M], M, K) \
                or ("scales_t[k, g] = max |x[m, k]| over tokens m in 128 g .. 128 g + 127 (the dequantized values: "
                    "decode(codes) * old scale), divided by np.float32(448)")
            fail(q, [f"{what}: scales_t[{k}, {g}] (channel {k}, tokens {G * g}..{min(G * g + G, M) - 1}) is "
                     f"{gs[k, g]!r}, expected {want_s[k, g]!r}"], hint)
        if not np.array_equal(gc, want_c):
            mask = gc != want_c
            k, m = np.argwhere(mask)[0]
            hint = next((h for h, (vc, vs) in variants if np.array_equal(gc, vc)), None) or _where_wrong(mask, M, K) \
                or "codes_t[k, m] = encode(x[m, k] * inv[k, m // 128]) with x = decode(codes) * old scale"
            got_v, want_v = (float(formats.decode(np.uint8(c))) for c in (gc[k, m], want_c[k, m]))
            fail(q, [f"{what}: {int(mask.sum())} of {mask.size} codes differ; first at codes_t[{k}, {m}] (x[{m}, "
                     f"{k}]): 0x{gc[k, m]:02X} ({got_v:g}), expected 0x{want_c[k, m]:02X} ({want_v:g})"], hint)
    return (f"{len(cases)} tensors (ragged token groups and channel tiles, an all-zero group, rounding ties): codes "
            "and scales bit-exact with fp8lab.numerics.spec.requantize_tile_to_col")


# ------------------------------------------------------------------------------------------------- Q2: Wgrad


def _gradients(rng, M, N):
    """float32 dy (M, N): gradient-sized values (~1e-5), columns of different magnitudes."""
    return (rng.standard_normal((M, N)) * 1e-5 * np.exp2(rng.uniform(-3, 3, (1, N)))).astype(F32)


def _wgrad_cases(rng):
    shapes = [(300, 200, 70), (70, 130, 129)]
    M = int(rng.integers(129, 400))
    shapes.append((M, int(rng.integers(100, 300)), int(rng.integers(30, 150))))
    out = []
    for M, K, N in shapes:
        x = _activations(rng, M, K)
        w = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(F32)
        out.append((M, K, N, x, w, _gradients(rng, M, N)))
    return out


def _wgrad_variants(dy, xc, xs):
    """(hint, dW) of known mistakes."""
    dtc, dts, _ = spec.quantize(np.ascontiguousarray(dy.T), "tile")
    xtc, xts = spec.requantize_tile_to_col(xc, xs)
    a, b = _deq_tiles(dtc, dts), _deq_tiles(xtc, xts)
    dc, ds, _ = spec.quantize(dy, "tile")
    bc, bs, _ = spec.quantize(dy, "block")
    return [
        ("dy is quantized along the wrong axis: spec.quantize(dy, 'tile') groups 128 output channels of one token, "
         "right for Dgrad (dx = dy W reduces over N); Wgrad reduces over the tokens, so quantize dy^T: "
         "spec.quantize(np.ascontiguousarray(dy.T), 'tile')", _deq_tiles(dc, ds).T @ b.T),
        ("x is dequantized from its 1x128 tiles (scales that vary along the tokens, the reduction): an FP8 GEMM "
         "applies one scale per operand to each 128-long partial sum, so it cannot use them: re-tile x as 128x1 "
         "(your requantize_tile_to_col) and dequantize that", a @ _deq_tiles(xc, xs)),
        ("dy is quantized in 128x128 blocks: DeepSeek-V3 keeps gradients in fine 1x128 tiles (its appendix B.2: "
         "block-wise quantization of activation gradients made a model diverge)",
         spec.dequantize(bc, bs, G, G).T @ b.T),
        ("dy is used in float32: in fp8-deepseek all three GEMMs run in E4M3, Wgrad too, so dy^T is quantized "
         "in 1x128 tiles along the tokens", dy.T @ b.T),
    ]


def _close(got, want, bound):
    return got.shape == want.shape and bool(np.all(np.abs(got.astype(np.float64) - want) <= bound))


@question
def fp8_wgrad(fn, rng=None):
    """Check `fn(dy, x_codes, x_scales) -> dW`: dy float32 (M, N), x's cached E4M3 codes (M, K) and 1x128 tile
    scales (M, ceil(K/128)) -> dW (N, K) = dy^T x the fp8-deepseek way, equal to the NumPy engine's Linear("fp8-deepseek")
    .backward's dW up to float32 rounding (|error| <= 2 M 2^-24 (|A| |B|^T) for the dequantized operands A, B)."""
    q = "fp8_wgrad"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    cases = _wgrad_cases(rng)
    exact = 0
    for M, K, N, x, w, dy in cases:
        lin = numpy_engine.Linear("fp8-deepseek")
        lin.forward(x, w)
        xc, xs = lin.cache[0], lin.cache[1]  # the FP8 x that Fprop kept
        want = lin.backward(dy)[1]
        what = f"dy ({M}, {N}), x_codes ({M}, {K}), x_scales {xs.shape}"
        args = (dy.copy(), xc.copy(), xs.copy())
        got = _call(q, fn, args, f"fp8_wgrad({what})",
                    "dy^T: spec.quantize(np.ascontiguousarray(dy.T), 'tile'); x: requantize_tile_to_col(x_codes, "
                    "x_scales); then dequantize both (spec.dequantize(codes, scales, 1, 128)) and multiply")
        if not (_same_bits(args[0], dy) and _same_bits(args[1], xc) and _same_bits(args[2], xs)):
            fail(q, [f"{what}: your function changed its inputs"], "work on copies; the cache is read-only")
        try:
            got = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            fail(q, [f"{what}: returned {type(got).__name__}, expected an array dW ({N}, {K})"], "return dW")
        if got.shape != (N, K):
            hint = ("dW has W's shape (out, in) = (N, K): dy^T x, not x^T dy" if got.shape == (K, N)
                    else "dW = dy^T x: (N, M) @ (M, K)")
            fail(q, [f"{what}: returned dW of shape {got.shape}, expected ({N}, {K})"], hint)
        if not np.isfinite(got).all():
            fail(q, [f"{what}: dW holds {int((~np.isfinite(got)).sum())} NaN or Inf"],
                 "NaN in dW means a NaN scale or code: check the AMAX_FLOOR of requantize_tile_to_col")
        dtc, dts, _ = spec.quantize(np.ascontiguousarray(dy.T), "tile")
        xtc, xts = spec.requantize_tile_to_col(xc, xs)
        mag = np.abs(_deq_tiles(dtc, dts)).astype(np.float64) @ np.abs(_deq_tiles(xtc, xts)).astype(np.float64).T
        bound = 2 * M * 2.0**-24 * mag + 1e-30  # float32 accumulation in any order, ours and yours
        if not _close(got, want, bound):
            hint = next((h for h, v in _wgrad_variants(dy, xc, xs) if _close(got, v, bound)),
                        "dW = dequantize(dy^T in 1x128 tiles along the tokens) @ dequantize(x re-tiled 128x1)^T")
            n, k = np.unravel_index(np.argmax(np.abs(got - want) / bound), got.shape)
            rel = np.linalg.norm(got - want) / np.linalg.norm(want)
            fail(q, [f"{what}: dW[{n}, {k}] is {got[n, k]:.6g}, expected {want[n, k]:.6g} (beyond float32 rounding, "
                     f"{bound[n, k]:.2g}); normwise difference {rel:.2%}"], hint)
        exact += bool(np.array_equal(got, want))
    return (f"{len(cases)} layers (ragged M, K, N): dW equal to the NumPy engine's Linear('fp8-deepseek').backward's "
            f"({exact} bit for bit, {len(cases) - exact} within float32 rounding)")


# ------------------------------------------------------------------------------ Q3: what the re-tiling costs


def _wgrad_pair(x, dy):
    """(dW64, dy^T's dequantized 1x128 tiles, x's 1x128 tiles (codes, scales))."""
    exact = dy.astype(np.float64).T @ x.astype(np.float64)
    dtc, dts, _ = spec.quantize(np.ascontiguousarray(dy.T), "tile")
    xc, xs, _ = spec.quantize(x, "tile")
    return exact, _deq_tiles(dtc, dts), xc, xs


def _errors(x, dy):
    """(normwise error of Wgrad from the re-tiled cache, from x^T quantized afresh as 128x1 tiles), against
    float64."""
    exact, a, xc, xs = _wgrad_pair(x, dy)
    ftc, fts, _ = spec.quantize(np.ascontiguousarray(x.T), "tile")
    d_req, d_fresh = a @ _deq_tiles(*spec.requantize_tile_to_col(xc, xs)).T, a @ _deq_tiles(ftc, fts).T
    nrm = np.linalg.norm(exact)
    return float(np.linalg.norm(d_req - exact) / nrm), float(np.linalg.norm(d_fresh - exact) / nrm)


def _wrong_errors(x, dy):
    """The numbers of known mistakes, by name."""
    exact, a, xc, xs = _wgrad_pair(x, dy)
    ftc, fts, _ = spec.quantize(np.ascontiguousarray(x.T), "tile")
    ds = (a @ _deq_tiles(*spec.requantize_tile_to_col(xc, xs)).T - exact, a @ _deq_tiles(ftc, fts).T - exact)
    err = lambda d: float(np.linalg.norm(d - exact) / np.linalg.norm(exact))  # noqa: E731
    return {
        "not_retiled": err(a @ _deq_tiles(xc, xs)),
        "x_float": err(a @ x),
        "abs": tuple(float(np.linalg.norm(d)) for d in ds),
        "maxabs": tuple(float(np.abs(d).max() / np.abs(exact).max()) for d in ds),
    }


def _errors_cases(rng):
    shapes = [(768, 260, 96), (int(rng.integers(300, 600)), int(rng.integers(130, 260)), int(rng.integers(40, 100)))]
    out = []
    for M, K, N in shapes:
        x = (rng.standard_normal((M, K)) * np.exp(rng.normal(0, 0.5, (M, 1)))).astype(F32)  # log-normal tokens
        out.append((M, K, N, x, (rng.standard_normal((M, N)) * 1e-5).astype(F32)))
    return out


_WHY = ("re-tiling rounds x twice (float32 -> 1x128 tiles in Fprop, then -> 128x1 tiles), two roughly independent "
        "errors, so x's error grows by about sqrt(2); DeepSeek-V3 accepts it because the float32/BF16 x is gone by "
        "then: caching FP8 x (1 byte + 4/128 of scales per element) instead of BF16 (2 bytes) halves that memory")


@question
def wgrad_errors(fn, rng=None):
    """Check `fn(x, dy) -> (err_requantized, err_fresh)`: the normwise errors ||dW - dW64||_F / ||dW64||_F of the
    FP8 Wgrad (dy^T in 1x128 tiles along the tokens) with x re-tiled from its cached 1x128 tiles, and with float32 x
    quantized afresh as 128x1 tiles, against dW64 = dy^T x in float64; recomputed here (relative tolerance 1e-3)."""
    q = "wgrad_errors"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    first = None
    for M, K, N, x, dy in _errors_cases(rng):
        what = f"wgrad_errors(x ({M}, {K}), dy ({M}, {N}))"
        got = _call(q, fn, (x.copy(), dy.copy()), what, "return a pair of floats (err_requantized, err_fresh)")
        try:
            req, fresh = (float(v) for v in got)
        except (TypeError, ValueError):
            fail(q, [f"{what} returned {got!r}: expected a pair of numbers"], "return err_requantized, err_fresh")
        want_req, want_fresh = _errors(x, dy)

        def same(a, b):
            return math.isclose(a, b, rel_tol=RTOL_ERRORS)

        if same(req, want_req) and same(fresh, want_fresh):
            first = first or (want_req, want_fresh)
            continue
        line = [f"{what} returned ({req:.5g}, {fresh:.5g}), expected ({want_req:.5g}, {want_fresh:.5g})"]
        wrong = _wrong_errors(x, dy)
        bad_req, bad_fresh = not same(req, want_req), not same(fresh, want_fresh)

        def explains(pair):  # a wrong value that this mistake gives (a right one proves nothing)
            return (bad_req and same(req, pair[0])) or (bad_fresh and same(fresh, pair[1]))

        if same(req, want_fresh) and same(fresh, want_req):
            fail(q, line, "the order is (re-quantized, fresh): the re-quantized error is the larger one, since "
                 + _WHY)
        # every mistake that gives these values: two can coincide (a largest-element error scatters around the
        # normwise error of one rounding, which is also what x's own 1x128 tiles give)
        why = [h for hit, h in (
            (explains(wrong["abs"]), "normwise RELATIVE error: divide ||dW - dW64||_F by ||dW64||_F"),
            (explains(wrong["maxabs"]), "normwise error: the Frobenius norm of the whole difference (np.linalg.norm), "
                                        "not the largest element"),
            (same(fresh, wrong["not_retiled"]), "'fresh' quantizes the float32 x again, as 128x1 tiles: "
                                                "spec.quantize(x.T, 'tile'); what you computed uses x's 1x128 tiles, "
                                                "whose scales vary along the tokens: Wgrad's FP8 GEMM can't"),
            (same(fresh, wrong["x_float"]), "'fresh' still quantizes x, but from float32, as 128x1 tiles "
                                            "(spec.quantize(x.T, 'tile')): only the rounding twice is taken away, "
                                            "not FP8")) if hit]
        if why:
            fail(q, line, " Or: ".join(why))
        fail(q, line, "err = np.linalg.norm(dW - dW64) / np.linalg.norm(dW64), dW64 = dy.astype(np.float64).T @ "
             "x.astype(np.float64); re-quantized: fp8_wgrad(dy, *spec.quantize(x, 'tile')[:2]); fresh: dy^T's "
             "tiles as in fp8_wgrad with x^T quantized afresh, spec.quantize(x.T, 'tile')")
    return (f"the cached x re-tiled: {first[0]:.2%}, x quantized afresh in 128x1 tiles: {first[1]:.2%} "
            f"({first[0] / first[1]:.2f}x) for x (768, 260), dy (768, 96), and a random case, as recomputed here")


# ---------------------------------------------------------------------------- Q4: re-tiling with power-of-two scales


def _retile_values(x, pow2_fprop, pow2_wgrad):
    """(Fprop's cached values, the same values after the re-tiling), both in x's (M, K) layout."""
    c, s, _ = spec.quantize(x, "tile", mode="pow2" if pow2_fprop else "amax")
    ct, st = spec.requantize_tile_to_col(c, s, mode="pow2" if pow2_wgrad else "amax")
    return c, s, ct, st


def _retile_changes(x, pow2):
    c, s, ct, st = _retile_values(x, pow2, pow2)
    return float(np.mean(_deq_tiles(ct, st).T != _deq_tiles(c, s)))


@question
def retile_changes(fn, rng=None):
    """Check `fn(x, pow2) -> float`: the fraction of x's elements whose value (decode(code) * scale) the re-tiling
    changes, from Fprop's 1x128 tiles to 128x1 tiles, both with amax / 448 scales (pow2=False) or both with scales
    rounded up to a power of two (pow2=True, DeepSeek-V3's choice, section 3.3.3); recomputed here."""
    q = "retile_changes"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    cases = [_activations(rng, 300, 200), _activations(rng, int(rng.integers(129, 400)), int(rng.integers(1, 260)))]
    got_first = None
    for x in cases:
        for pow2 in (False, True):
            what = f"retile_changes(x {x.shape}, pow2={pow2})"
            got = _call(q, fn, (x.copy(), pow2), what, "return one number: a fraction of x's elements")
            try:
                got = float(got)
            except (TypeError, ValueError):
                fail(q, [f"{what} returned {got!r}: expected a number"], "return np.mean(changed), a float")
            want = _retile_changes(x, pow2)
            if math.isclose(got, want, rel_tol=SHARE_TOL, abs_tol=SHARE_TOL):
                got_first = got_first or {}
                got_first.setdefault(pow2, want)
                continue
            line = [f"{what} returned {got:.6g}, expected {want:.6g}"]
            c, s, ct, st = _retile_values(x, pow2, pow2)
            after, before = _deq_tiles(ct, st).T, _deq_tiles(c, s)
            mixed = [_retile_values(x, pow2, not pow2), _retile_values(x, not pow2, pow2)]
            hints = [
                (float(np.mean(ct.T != c)), "compare values, decode(code) * scale, not codes: with power-of-two "
                 "scales a code changes its exponent when the scale changes, and its value does not"),
                (float(np.mean(after != x)), "compare with what Fprop cached (its 1x128 tiles, dequantized), not with "
                 "the float32 x: the question is what the second rounding changes"),
                (_retile_changes(x, not pow2), f"pow2={pow2}: use mode='pow2' when pow2 is True, 'amax' otherwise"),
            ] + [(float(np.mean(_deq_tiles(m[2], m[3]).T != _deq_tiles(m[0], m[1]))),
                  "both roundings use the same rule: mode='pow2' (or 'amax') in spec.quantize and in "
                  "spec.requantize_tile_to_col") for m in mixed]
            for value, hint in hints:
                if math.isclose(got, value, rel_tol=SHARE_TOL, abs_tol=SHARE_TOL) and not math.isclose(value, want):
                    fail(q, line, hint)
            fail(q, line, "codes, scales = spec.quantize(x, 'tile', mode=...)[:2]; re-tile with "
                 "spec.requantize_tile_to_col(codes, scales, mode=...); compare spec.dequantize(..., 1, 128) of "
                 "both (the re-tiled one transposed back): np.mean(after != before)")
    return (f"the re-tiling changed {got_first[False]:.1%} of the values with amax / 448 scales and "
            f"{got_first[True]:.2%} with power-of-two scales, for x (300, 200), and a random case, as recomputed here")
