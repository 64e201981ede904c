"""ws11: the training recipe: the bytes a parameter keeps between steps, the precision each op of the language model
runs in, and the outlier magnitude at which per-tensor scaling breaks, each checked against what the NumPy engine
(fp8lab.training.engine_reference) and fl.train do (DeepSeek-V3 technical report, arXiv 2412.19437, sections 3.3.1
and 3.3.3).

The references are measured, not tabulated: state_bytes(recipe) reads the dtypes of fp8lab's arrays,
precisions(rng, recipe) runs each op of the NumPy engine against float64, sweep(logs, ...) measures lecture 09 (f)'s
GEMM error over the outlier magnitude."""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from ...numerics import formats, ops, recipes
from ...training import engine_reference as numpy_engine
from ...training import model as lm
from ._core import NotAttempted, fail, not_attempted_message, question, still_a_placeholder, call_answer

__all__ = ["memory_per_parameter", "which_precision", "per_tensor_breaks_at", "OPS", "PRECISIONS", "state_bytes",
           "precisions", "sweep"]

OPS = ("embedding", "RMSNorm", "W1 Fprop", "W1 Dgrad", "W1 Wgrad", "SwiGLU", "W2 Fprop", "W2 Dgrad", "W2 Wgrad",
       "output head", "softmax", "weight gradients", "AdamW moments", "master weights")
"""The ops of one training step of fp8lab.training.model's model that which_precision is asked about."""
PRECISIONS = ("fp8", "bf16", "fp32")
F32 = np.float32


def _attempted(q, fn):
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))


# ------------------------------------------------------------------------------- what fp8lab keeps, measured


def _tiny_step(rng, recipe="fp8-deepseek"):
    """A small model (width 150, not a multiple of 128), one batch: (cfg, params, ids, targets, loss, grads)."""
    cfg = lm.Config(vocab=7, context=3, embed=50, hidden=70, blocks=1)
    p = lm.init_params(cfg, int(rng.integers(0, 2**31)))
    ids = rng.integers(0, cfg.vocab, (37, cfg.context))
    tgt = rng.integers(0, cfg.vocab, 37)
    loss, g = numpy_engine.Model(cfg, recipe).loss(p, ids, tgt)
    return cfg, p, ids, tgt, loss, g


def _default_moments(recipe: str) -> str:
    """The format fl.train gives AdamW's moments in `recipe` when not told: the recipe's own."""
    return recipes.get(recipe).moments


@functools.lru_cache(maxsize=None)
def state_bytes(recipe: str) -> dict:
    """{"master weight", "gradient", "moments": bytes per parameter} that fp8lab keeps from one step to the next in
    `recipe`, read from the dtypes of its arrays: lm.init_params' master weights, the NumPy engine's Model.loss's
    gradients, and the
    two moments of the kernel engine's AdamW (kernels.optim.AdamW) in the format fl.train picks for the recipe."""
    from ...kernels import optim

    _, p, _, _, _, g = _tiny_step(np.random.default_rng(0), recipe)
    opt = optim.AdamW(8, moments=_default_moments(recipe))
    return {"master weight": max(a.dtype.itemsize for a in p.values()),
            "gradient": max(a.dtype.itemsize for a in g.values()),
            "moments": opt.m.dtype.itemsize + opt.v.dtype.itemsize}


def _rounding(got, exact) -> str:
    """The precision whose rounding explains got's normwise error against the float64 `exact`: float32 leaves about
    1e-7, bfloat16 inputs (8 significant bits) about 1e-3, E4M3 (4 bits) a few percent; 2^-16 and 2^-7 split them."""
    rel = float(np.linalg.norm(np.asarray(got, np.float64) - exact) / np.linalg.norm(exact))
    return "fp32" if rel < 2.0**-16 else "bf16" if rel < 2.0**-7 else "fp8"


def _stored(arrays) -> str:
    """The precision the values of `arrays` are stored in: uint16 bfloat16 bits, or float32 arrays that hold only
    bfloat16 values (numpy_engine.AdamW's rounded moments), or genuine float32."""
    arrays = list(arrays)
    if all(a.dtype == np.uint16 for a in arrays):
        return "bf16"
    if all(np.array_equal(formats.round_bf16(a), a) for a in arrays):
        return "bf16"
    return "fp32"


def precisions(rng=None, recipe: str = "fp8-deepseek") -> dict:
    """{op: "fp8" | "bf16" | "fp32"} for every op of OPS, measured on fp8lab.training.model's model in `recipe`: each
    GEMM's
    and each float op's error against float64 on random inputs, and the stored values of the master weights, the
    gradients and AdamW's moments (in the format fl.train picks for the recipe) after one step."""
    rng = np.random.default_rng() if rng is None else rng
    f64 = np.float64
    cfg, p, ids, tgt, _, g = _tiny_step(rng, recipe)
    model = numpy_engine.Model(cfg, recipe)
    out = {}
    for name, lin in (("W1", model.lin1[0]), ("W2", model.lin2[0])):
        N, K = p[f"{name.lower()}_0"].shape
        x = rng.standard_normal((37, K)).astype(F32)
        w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32)
        dy = rng.standard_normal((37, N)).astype(F32)
        y = lin.forward(x, w)
        dx, dw = lin.backward(dy)
        out[f"{name} Fprop"] = _rounding(y, x.astype(f64) @ w.T.astype(f64))
        out[f"{name} Dgrad"] = _rounding(dx, dy.astype(f64) @ w.astype(f64))
        out[f"{name} Wgrad"] = _rounding(dw, dy.T.astype(f64) @ x.astype(f64))
    x = rng.standard_normal((37, cfg.width)).astype(F32) * F32(3)
    gain = rng.uniform(0.5, 1.5, cfg.width).astype(F32)
    z, _ = ops.rmsnorm(x, gain)
    x64 = x.astype(f64)
    out["RMSNorm"] = _rounding(z, x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + ops.EPS) * gain)
    u = rng.standard_normal((37, 2 * cfg.hidden)).astype(F32) * F32(2)
    a, b = u[:, :cfg.hidden].astype(f64), u[:, cfg.hidden:].astype(f64)
    out["SwiGLU"] = _rounding(ops.swiglu(u), a / (1 + np.exp(-a)) * b)
    logits = rng.standard_normal((37, cfg.vocab)).astype(F32) * F32(4)
    t = rng.integers(0, cfg.vocab, 37)
    e = np.exp(logits.astype(f64) - logits.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    want[np.arange(37), t] -= 1
    out["softmax"] = _rounding(ops.cross_entropy(logits, t)[1], want / 37)
    _, _, zf, _, head_logits = model._forward(p, ids)
    out["output head"] = _rounding(head_logits, zf.astype(f64) @ p["head"].T.astype(f64))
    out["weight gradients"] = _stored(g.values())
    opt = numpy_engine.AdamW(p, 1e-3, moments=_default_moments(recipe))
    opt.step(p, g)
    out["AdamW moments"] = _stored([*opt.m.values(), *opt.v.values()])
    out["master weights"] = _stored(p.values())
    out["embedding"] = _stored([p["emb"]])  # a lookup: the table's precision is the op's
    return {op: out[op] for op in OPS}


# ------------------------------------------------------------------------------- Q1: bytes per parameter


def _memory_variants(recipe, parts):
    """(total, why) of the usual miscounts for `recipe`, the likeliest first; several can give the same total."""
    M, G, mom = parts["master weight"], parts["gradient"], parts["moments"]
    one = mom // 2
    right = M + G + mom
    out = []
    if one == 4:
        out.append((M + G + 4, "only fp8-deepseek (and its pow2 variant) stores AdamW's moments in BF16 (the table of "
                               f"lecture 09 (c)); {recipe} keeps them in FP32, 4 bytes each"))
    if one == 2:
        out.append((M + G + 8, "fp8-deepseek stores AdamW's two moments in BF16, 2 bytes each, as DeepSeek-V3 does "
                               "(section 3.3.3): that is the saving of (g)"))
    out += [
        (M + G + one, "AdamW keeps two moments per parameter, m (the running mean of the gradients) and v (of their "
                      "squares): count both"),
        (M + mom, "the gradient is kept too, from the backward pass to the optimizer step (in FP32: DeepSeek-V3 "
                  "accumulates gradients over micro-batches in FP32, section 3.3.3)"),
    ]
    precision = recipes.get(recipe).gemm_precision
    if precision == "fp8":
        out.append((right + 1, "the FP8 copy of a weight is not kept between steps: the NumPy engine's Linear.forward "
                               "quantizes the FP32 master weight at every forward (spec.quantize(w, 'block')) and the "
                               "copy lives only until the backward, like an activation; (g) counts 16 -> 12 bytes "
                               "without it"))
    if precision == "bf16":
        out.append((right + 2, "the BF16 copy of a weight is made from the FP32 master at every forward and lives only "
                               "until the backward, like an activation: (g) does not count it"))
    out += [
        (right + 4, "the EMA of the weights lives in CPU memory (DeepSeek-V3 section 3.2.3; fl.train keeps it on the "
                    "CPU as well): (g) counts what the GPU keeps, master weight, gradient and the two moments"),
        (right * 8, "that is bits: the answer is in bytes (FP32 is 4 bytes, BF16 2)"),
    ]
    for low in (2, 1):  # master weight and gradient in BF16 or FP8
        if precision != "fp32":
            out.append((2 * low + mom, f"the {recipe} recipe lowers only the GEMMs' inputs: master weights and "
                                       "gradients stay FP32 in every recipe, and each step quantizes the GEMM inputs "
                                       "afresh from the FP32 master"))
    return out


@question
def memory_per_parameter(fn, rng=None):
    """Check `fn(recipe) -> bytes` (a number) for the four recipes: the bytes each parameter keeps on the GPU from
    one step to the next (master weight + gradient + AdamW's two moments, as lecture 09 (g) counts), against
    state_bytes(recipe), read from fp8lab's own arrays."""
    q = "memory_per_parameter"
    _attempted(q, fn)
    order = ["fp8-deepseek", "fp32", "bf16", "fp8-tensor"]  # fp8-deepseek first: its miscounts are all distinct
    rows = []
    for recipe in order:
        got = call_answer(q, fn, (recipe,), "return the bytes per parameter as a number, e.g. 4 + 4 + ...")
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, numbers.Real) or not math.isfinite(got):
            fail(q, [f"memory_per_parameter({recipe!r}) returned {got!r}: expected a number of bytes"],
                 "return an int such as 4 + 4 + 2 * 4 (master weight, gradient, two moments)")
        parts = state_bytes(recipe)
        want = sum(parts.values())
        if got != want:
            why = [h for v, h in _memory_variants(recipe, parts) if v == got]
            hint = " Or: ".join(why) if why else (
                "count per parameter the master weight (FP32), its gradient (FP32) and AdamW's two moments (BF16 in "
                "the fp8-deepseek recipes, FP32 in the others)")
            fail(q, [f"memory_per_parameter({recipe!r}) = {got!r} bytes, expected {want} "
                     f"({' + '.join(f'{k} {v}' for k, v in parts.items())})"], hint)
        rows.append(f"{recipe} {want}")
    return ", ".join(rows) + " bytes per parameter, as fp8lab's arrays hold them"


# ------------------------------------------------------------------------------- Q2: which precision


def _precision_hint(op, got, want):
    gemm = op.split()[-1] in ("Fprop", "Dgrad", "Wgrad")
    if gemm:
        which = {"Fprop": "Fprop (y = x W^T: x in 1x128 tiles, W in 128x128 blocks)",
                 "Dgrad": "Dgrad (dx = dy W: dy in 1x128 tiles against W's FP8 blocks)",
                 "Wgrad": "Wgrad (dW = dy^T x: dy^T in 1x128 tiles and the FP8 x cached by Fprop, re-tiled 128x1; "
                          "only its output, the gradient, is FP32)"}[op.split()[-1]]
        return (f"DeepSeek-V3 runs all three GEMMs of a Linear in FP8 E4M3 (section 3.3.1, Figure 6; every Linear but "
                f"the output head), and so does the NumPy engine's Linear('fp8-deepseek') for W1 and W2 alike: {which}")
    if op == "output head" and got == "fp8":
        return ("only the block Linears W1 and W2 go to FP8: DeepSeek-V3 keeps the output head (and the embedding) in "
                "BF16/FP32 (section 3.3.1), and fp8lab's Model computes logits = RMSNorm(x) head^T in FP32 in every "
                "recipe")
    if op in ("embedding", "output head", "RMSNorm", "softmax", "SwiGLU") and got == "bf16":
        return (f"DeepSeek-V3 allows BF16 or FP32 for the {op}; fp8lab keeps it in FP32 (lecture 09 (b): 'here the "
                "embedding, head, norms, SwiGLU and softmax stay in FP32'), and the question asks what fp8lab does")
    if op == "embedding":
        return "the embedding is a lookup, not a GEMM; its table stays FP32 (DeepSeek-V3: BF16/FP32, section 3.3.1)"
    if op in ("RMSNorm", "softmax", "SwiGLU"):
        fn = {"RMSNorm": "rmsnorm", "softmax": "cross_entropy", "SwiGLU": "swiglu"}[op]
        return (f"the {op} computes in FP32 (fp8lab.numerics.ops.{fn} "
                "works in float32): in fp8-deepseek its output is then quantized to FP8 as the next GEMM's input "
                "(on the kernels, fused into the same kernel), but that quantization belongs to the GEMM; DeepSeek-V3 "
                "keeps normalization in high precision")
    if op == "AdamW moments":
        return ("DeepSeek-V3 stores AdamW's first and second moments in BF16 (section 3.3.3), and fl.train gives "
                "fp8-deepseek moments='bf16' by default: half the bytes of FP32, precise enough for an average"
                if want == "bf16" else f"fl.train keeps this recipe's moments in {want}")
    if op == "master weights":
        return ("master weights stay FP32 (DeepSeek-V3 section 3.3.3): an update lr m/sqrt(v) is often smaller than "
                "half of BF16's spacing near the weight (2^-8 of it), and a BF16 weight would round it away")
    if op == "weight gradients":
        return ("the Wgrad GEMM's inputs are FP8, but it accumulates and stores its output, the gradient, in FP32 "
                "(DeepSeek-V3 section 3.3.3: gradients kept in FP32 for accumulation across micro-batches)")
    return f"fp8lab's fp8-deepseek recipe runs the {op} in {want}"


@question
def which_precision(fn, rng=None):
    """Check `fn(op) -> "fp8" | "bf16" | "fp32"` for every op of OPS (asked in a random order) against
    precisions(): what fp8lab.training.model's model does in the fp8-deepseek recipe, measured."""
    q = "which_precision"
    _attempted(q, fn)
    rng = np.random.default_rng() if rng is None else rng
    want = precisions(rng)
    for i in rng.permutation(len(OPS)):
        op = OPS[i]
        got = call_answer(q, fn, (op,), "return 'fp8', 'bf16' or 'fp32' for each op name listed above")
        g = got.strip().lower() if isinstance(got, str) else got
        if g not in PRECISIONS:
            fail(q, [f"which_precision({op!r}) returned {got!r}: expected one of {', '.join(map(repr, PRECISIONS))}"],
                 "return the string 'fp8', 'bf16' or 'fp32' (float32 is 'fp32', E4M3 is 'fp8')")
        if g != want[op]:
            fail(q, [f"which_precision({op!r}) = {got!r}, expected {want[op]!r} (what fp8-deepseek does in fp8lab)"],
                 _precision_hint(op, g, want[op]))
    n8 = sum(v == "fp8" for v in want.values())
    return (f"{len(OPS)} ops of a training step: {n8} in FP8 (the three GEMMs of W1 and W2), AdamW's moments in BF16, "
            "everything else FP32, as measured on fp8lab.training.model")


# ------------------------------------------------------------------------------- Q3: where per-tensor breaks

TENSOR_FACTOR = 2.0   # per-tensor "breaks": its error exceeds this times its error at s = 1
DEEPSEEK_FACTOR = 1.5  # while DeepSeek's stays within this times its own at s = 1


def sweep(logs, rng=None, M=16, N=40, K=512) -> dict:
    """{log2 s: {"fp8-tensor": error, "fp8-deepseek": error}}: the normwise error of the NumPy engine's
    Linear(recipe).forward on z * d, w / d against float64 z w^T, with d = lm.outlier_scales(...) (s on
    lm.OUTLIER_CHANNELS channels of the K inputs), as lecture 09 (f) measures it; z (M, K) normal, w (N, K) normal /
    sqrt(K)."""
    rng = np.random.default_rng() if rng is None else rng
    z = rng.standard_normal((M, K)).astype(F32)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32)
    exact = z.astype(np.float64) @ w.T.astype(np.float64)
    out = {}
    for e in logs:
        d = lm.outlier_scales(lm.Config(65, 1, K, 8, 1, outliers=2.0**int(e)))
        d = np.ones(K, F32) if d is None else d
        out[int(e)] = {r: float(np.linalg.norm(numpy_engine.Linear(r).forward(z * d, w / d) - exact)
                                / np.linalg.norm(exact))
                       for r in ("fp8-tensor", "fp8-deepseek")}
    return out


def _breaks(E, *, gt=True, le=True, need_ds=True, ft=TENSOR_FACTOR, fd=DEEPSEEK_FACTOR, order=sorted,
            base=None, stop=False, prev=False):
    """The rule with its knobs; the defaults are the question's, the others are known mistakes."""
    keys = list(order(E))
    t0 = E[0]["fp8-tensor"] if base is None else base(E, "fp8-tensor")
    d0 = E[0]["fp8-deepseek"] if base is None else base(E, "fp8-deepseek")
    last = None
    for e in keys:
        t, d = E[e]["fp8-tensor"], E[e]["fp8-deepseek"]
        if prev and last is not None:
            t0, d0 = E[last]["fp8-tensor"], E[last]["fp8-deepseek"]
        last = e
        if e == 0 and not prev:
            continue
        broke = t > ft * t0 if gt else t >= ft * t0
        held = (d <= fd * d0 if le else d < fd * d0) or not need_ds
        if broke and held:
            return e
        if broke and stop:
            return None
    return None


def _breaks_variants(E):
    lowest = lambda E, r: min(v[r] for v in E.values())  # noqa: E731
    return [
        (_breaks(E, need_ds=False), "per-tensor breaking is not enough: DeepSeek's error at that s must also stay "
                                    f"within {DEEPSEEK_FACTOR:g}x its own error at s = 1"),
        (_breaks(E, gt=False), f"'exceeds {TENSOR_FACTOR:g}x' is strictly more: an error of exactly "
                               f"{TENSOR_FACTOR:g}x its s = 1 value has not broken yet (use >)"),
        (_breaks(E, le=False), f"'stays within {DEEPSEEK_FACTOR:g}x' includes exactly {DEEPSEEK_FACTOR:g}x "
                               "(use <=)"),
        (_breaks(E, ft=DEEPSEEK_FACTOR, fd=TENSOR_FACTOR), f"the factors are swapped: per-tensor must exceed "
                                                            f"{TENSOR_FACTOR:g}x, DeepSeek stay within "
                                                            f"{DEEPSEEK_FACTOR:g}x"),
        (_breaks(E, stop=True), "keep looking after a magnitude where per-tensor broke but DeepSeek did not hold: "
                                "a larger s may satisfy both"),
        (_breaks(E, order=list), "the dict's keys are not in increasing order: go through sorted(errors_by_log2) "
                                 "to find the smallest"),
        (_breaks(E, order=lambda E: sorted(E, reverse=True)), "the smallest log2(s), not the largest"),
        (_breaks(E, prev=True), "compare every error with the same recipe's error at s = 1 (key 0), not with the "
                                "previous magnitude"),
        (_breaks(E, base=lowest), "compare with the error at s = 1 (key 0), not with the lowest error of the sweep"),
    ]


def _show(E, keys=()):
    """The sweep as {log2 s: (per-tensor, DeepSeek)}; a long one only at key 0 and `keys`."""
    shown = sorted(E) if len(E) <= 8 else sorted({0, *(k for k in keys if k in E)})
    body = ", ".join(f"{e}: ({E[e]['fp8-tensor']:.4g}, {E[e]['fp8-deepseek']:.4g})" for e in shown)
    if len(E) > 8:
        return f"the sweep measured over log2(s) = {min(E)}..{max(E)}, (per-tensor, DeepSeek) errors at {{{body}, ...}}"
    return "{" + body + "}"


def _synthetic(rng):
    """Small hand-made sweeps (dyadic values: the factors 2 and 1.5 are exact) that separate the rule's edges."""
    t0 = 2.0**-5 * (1 + int(rng.integers(0, 8)) / 8)
    d0 = 2.0**-5 * (1 + int(rng.integers(0, 8)) / 8)
    cases = [
        # exactly 2x has not broken; 3x with DeepSeek unchanged has
        ([1, 2, 3], [1, 1, 1]),
        # exactly 1.5x is within
        ([1, 4, 8], [1, 1.5, 1.25]),
        # the first per-tensor break has DeepSeek at 1.75x: keep looking
        ([1, 1.125, 2.5, 4], [1, 1, 1.75, 1.25]),
        # the s = 1 error is not the lowest
        ([1, 0.75, 1.75, 2.5], [1, 1, 1, 1]),
        # creeping up: never 2x the previous point, 2.25x the first
        ([1, 1.5, 2.25, 3.375], [1, 1, 1, 1.25]),
        # never breaks
        ([1, 1.25, 1.5, 1.75], [1, 1.25, 1.5, 2]),
    ]
    out = []
    for ts, ds in cases:
        logs = [0] + sorted(int(v) for v in rng.choice(np.arange(1, 21), len(ts) - 1, replace=False))
        out.append({e: {"fp8-tensor": t0 * t, "fp8-deepseek": d0 * d} for e, t, d in zip(logs, ts, ds)})
    # several qualify, the keys inserted largest first
    logs = [0] + sorted(int(v) for v in rng.choice(np.arange(1, 21), 3, replace=False))
    E = {e: {"fp8-tensor": t0 * t, "fp8-deepseek": d0 * d} for e, t, d in zip(logs, [1, 3, 5, 9], [1, 1.25, 1, 1])}
    out.append(dict(reversed(list(E.items()))))
    return out


@question
def per_tensor_breaks_at(fn, rng=None):
    """Check `fn(errors_by_log2) -> smallest log2(s) or None` on sweeps measured with the NumPy engine's Linear (odd
    shapes, fresh random inputs, all or some of log2(s) = 0..20, keys shuffled) and on small hand-made sweeps that
    separate the rule's edges."""
    q = "per_tensor_breaks_at"
    _attempted(q, fn)
    rng = np.random.default_rng() if rng is None else rng
    full = list(range(21))
    some = [0] + sorted(int(v) for v in rng.choice(np.arange(1, 21), 7, replace=False))
    K = int(rng.choice([300, 384, 520, 640]))
    cases = [sweep(full, rng, int(rng.integers(5, 20)), int(rng.integers(17, 60)), K)]
    cases += _synthetic(rng)
    cases += [sweep(some, rng, int(rng.integers(5, 20)), int(rng.integers(17, 60)), 512),
              sweep([0, 4, 8, 12, 16, 20], rng, 9, 33, 512)]
    seen = []
    for E in cases:
        keys = list(E)
        if len(E) > 8:  # the measured sweeps: in a random order too
            keys = [keys[i] for i in rng.permutation(len(keys))]
        E = {e: dict(E[e]) for e in keys}
        got = call_answer(q, fn, ({e: dict(v) for e, v in E.items()},),
                    "errors_by_log2[e] is a dict {'fp8-tensor': error, 'fp8-deepseek': error}")
        want = _breaks(E)
        ok = (got is None and want is None) or (
            got is not None and not isinstance(got, (bool, np.bool_)) and isinstance(got, numbers.Real)
            and want is not None and got == want)
        if ok:
            seen.append(want)
            continue
        if got is not None and (isinstance(got, (bool, np.bool_)) or not isinstance(got, numbers.Real)):
            fail(q, [f"per_tensor_breaks_at({_show(E, [want])}) returned {got!r}: expected an int log2(s) or None"],
                 "return the key e (an int, log2 of s), or None when no magnitude qualifies")
        # every modelled mistake that gives this answer, likeliest first: on a measured sweep several can coincide
        # (the largest key and a comparison with the previous magnitude both give 15 where 14 and 15 qualify)
        why = [h for v, h in _breaks_variants(E) if v == got and v != want]
        if want is not None and got == 2**want:  # as likely as a variant that also gives 2**want: name both
            why += [f"return log2(s), the dict's key ({want}), not s itself ({2**want})"]
        if want is None and got is not None and not why:
            why = ["when no magnitude satisfies both conditions, return None"]
        if want is not None and got is None and not why:
            why = [f"at log2(s) = {want}: per-tensor {E[want]['fp8-tensor']:.4g} > {TENSOR_FACTOR:g} x "
                   f"{E[0]['fp8-tensor']:.4g} and DeepSeek {E[want]['fp8-deepseek']:.4g} <= {DEEPSEEK_FACTOR:g} x "
                   f"{E[0]['fp8-deepseek']:.4g}: both hold"]
        hint = " Or: ".join(why) if why else (
            f"the smallest key e with errors_by_log2[e]['fp8-tensor'] > {TENSOR_FACTOR:g} * errors_by_log2[0]"
            f"['fp8-tensor'] and errors_by_log2[e]['fp8-deepseek'] <= {DEEPSEEK_FACTOR:g} * errors_by_log2[0]"
            "['fp8-deepseek']")
        fail(q, [f"per_tensor_breaks_at({_show(E, [want, got])}) returned {got!r}, expected {want!r}"], hint)
    return (f"{len(cases)} sweeps (3 measured with the NumPy engine's Linear, per-tensor breaking at log2(s) = "
            f"{seen[0]} in the full "
            f"one; {len(cases) - 3} hand-made edge cases)")
