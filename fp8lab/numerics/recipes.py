"""Training recipes as objects: the precision and scaling of every GEMM operand of a Linear layer, and the rest.

A Linear layer y = x W^T has three GEMMs (DeepSeek-V3, arXiv 2412.19437, section 3.3 and Figure 6): Fprop
y = x W^T, Dgrad dx = dy W and Wgrad dW = dy^T x. A recipe states each one as the kernels compute it, in the
NT layout a (rows, k) @ b (cols, k)^T, the contraction along the last axis of both operands:

    Fprop   a = x     (M, K)    b = W     (N, K)
    Dgrad   a = dy    (M, N)    b = W^T   (K, N)
    Wgrad   a = dy^T  (N, M)    b = x^T   (K, M)        (M tokens, K inputs, N outputs)

An operand is float32, bfloat16 (rounded to nearest even, float32 accumulation) or FP8 (e4m3, e5m2) with a
scaling granularity in that layout: "tensor" (one scale), "tile" (1 x 128 along the contraction) or "block"
(128 x 128). DeepSeek-V3's 128 x 1 tiles of x for Wgrad are therefore x^T "tile" in Wgrad.

How the engines get an operand: a tensor quantized per tensor or in 128 x 128 blocks is quantized once and its
codes transposed where another GEMM needs the transpose (exact); tiles are quantized afresh, in each GEMM's own
layout, from the float32 tensor, except x^T in Wgrad when `wgrad_x_from_fprop`: then the FP8 codes of x cached
by Fprop are re-quantized from 1 x 128 to 128 x 1 tiles, as DeepSeek-V3 does (the float32 x is not kept).

Power-of-two scales. DeepSeek-V3 (section 3.3.3, "Low-Precision Activation") caches the inputs of the Linear after
attention in a custom E5M6 format, and since "these activations will be converted from an 1x128 quantization tile to
an 128x1 tile in the backward pass", "to avoid introducing extra quantization error, all the scaling factors are
round scaled, i.e., integral power of 2"; its FP8 dispatch activations (the inputs of the MoE up-projections) and
the activation gradients before the MoE down-projections get power-of-two scales too ("Low-Precision
Communication"). The report asks for them nowhere else: weights and the other activations and gradients are scaled
by amax / 448. In this model every Linear's x is re-tiled for Wgrad (there is no attention and no dispatch), so
"fp8-deepseek-pow2" rounds the scales of x (Fprop's a, Wgrad's b) up to powers of two and keeps amax / 448 for W and
dy. Rescaling by a power of two only moves the exponent, so its re-tiling leaves every value that stays a normal
E4M3 number unchanged (lecture 04 counts the others). "fp8-deepseek" keeps amax / 448 everywhere: the capstone's
recorded GPU runs are of it, and the fused RMSNorm and SwiGLU quantization kernels (kernels.norm_quant,
kernels.swiglu) write amax scales only, so "fp8-deepseek-pow2" runs them unfused. The report's E5M6 cache is not
modelled (x stays E4M3).

`RECIPES` is the registry ({name: Recipe}); `register` adds one. The NumPy engine, the kernel engine, the
PyTorch rung, the teacher task and the command line all read it, and branch on a recipe's fields, never on its
name.
"""

from __future__ import annotations

import dataclasses

PRECISIONS = ("fp32", "bf16", "e4m3", "e5m2")
FP8 = ("e4m3", "e5m2")
GRANULARITIES = ("tensor", "tile", "block")  # the ones the FP8 GEMM takes (numerics.spec has more)
MOMENTS = ("fp32", "bf16")
# What every engine keeps in float32, whatever the recipe (DeepSeek-V3 keeps the embedding, the output head, the
# normalizations and attention in BF16/FP32; here they are float32, and so are master weights and gradients)
HIGH_PRECISION = ("embedding", "RMSNorm", "SwiGLU", "residual add", "output head", "softmax cross-entropy",
                  "master weights and gradients", "AdamW update")
GEMMS = ("fprop", "dgrad", "wgrad")


@dataclasses.dataclass(frozen=True)
class Operand:
    """One GEMM operand: precision "fp32", "bf16", "e4m3" or "e5m2"; for FP8 its scaling granularity and, for the
    fine-grained ones ("tile", "block"), pow2: each scale rounded up to a power of two (numerics.spec's "pow2" rule)
    instead of amax / FP8 max."""

    precision: str
    granularity: str | None = None
    pow2: bool = False

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.fp8 and self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES} for an FP8 operand ({self.precision}), "
                             f"got {self.granularity!r}")
        if not self.fp8 and self.granularity is not None:
            raise ValueError(f"granularity must be None for a {self.precision} operand (no scales), got "
                             f"{self.granularity!r}")
        if not isinstance(self.pow2, bool):
            raise TypeError(f"pow2 must be a bool, got {type(self.pow2).__name__} {self.pow2!r}")
        if self.pow2 and self.granularity not in ("tile", "block"):
            raise ValueError(f"pow2 needs a fine-grained FP8 operand (granularity 'tile' or 'block'): a per-tensor "
                             f"scale is not rounded to a power of two here, got {self.precision} {self.granularity}")

    @property
    def fp8(self) -> bool:
        return self.precision in FP8

    @property
    def exact_transpose(self) -> bool:
        """Its codes and scales can be transposed exactly (one scale, or square blocks): quantized once per tensor."""
        return self.granularity in ("tensor", "block")

    @property
    def scale_mode(self) -> str:
        """The scale rule of its groups (numerics.spec): "pow2" (rounded up to a power of two) or "amax"."""
        return "pow2" if self.pow2 else "amax"

    def __str__(self) -> str:
        return self.precision if not self.fp8 else f"{self.precision} {self.granularity}" + " pow2" * self.pow2


@dataclasses.dataclass(frozen=True)
class Gemm:
    """The two operands of one GEMM in its NT layout: out = a @ b^T (see the module docstring)."""

    a: Operand
    b: Operand


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training recipe. name: its key in RECIPES; summary: one line. fprop, dgrad, wgrad: the operands of a
    Linear's three GEMMs. wgrad_x_from_fprop: Wgrad's x^T re-tiled from the FP8 x cached by Fprop (DeepSeek-V3)
    instead of quantized afresh from float32 x (each Operand's pow2 says whether its scales are powers of two).
    moments: AdamW's moments stored as "fp32" or "bf16". high_precision: the ops kept in float32 (the engines
    keep HIGH_PRECISION so; a recipe can only say so). reference_rtol: how far the kernel engine's per-step loss
    may drift from the NumPy engine's (they sum in different orders; in FP8 a last-bit difference can move a
    value across a rounding boundary of the grid)."""

    name: str
    summary: str
    fprop: Gemm
    dgrad: Gemm
    wgrad: Gemm
    wgrad_x_from_fprop: bool = False
    moments: str = "fp32"
    high_precision: tuple = HIGH_PRECISION
    reference_rtol: float = 1e-4

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or self.name != self.name.strip():
            raise ValueError(f"name must be a non-empty string without surrounding spaces, got {self.name!r}")
        for g in GEMMS:
            gemm = getattr(self, g)
            if not isinstance(gemm, Gemm):
                raise TypeError(f"{g} must be a Gemm(a=Operand(...), b=Operand(...)), got {type(gemm).__name__}")
        precisions = {op.precision for op in self.operands().values()}
        families = {"fp8" if p in FP8 else p for p in precisions}
        if len(families) != 1:
            raise ValueError(f"{self.name}: every GEMM operand must be float32, every one bfloat16, or every one FP8 "
                             f"(the engines run a Linear in one of these), got {sorted(precisions)}")
        if self.moments not in MOMENTS:
            raise ValueError(f"{self.name}: moments must be one of {MOMENTS}, got {self.moments!r}")
        missing = [op for op in HIGH_PRECISION if op not in self.high_precision]
        if missing:
            raise ValueError(f"{self.name}: high_precision must include {missing}: the engines run those in float32 "
                             "whatever the recipe")
        if self.wgrad_x_from_fprop:
            x, xt = self.fprop.a, self.wgrad.b
            if not (x.fp8 and x.granularity == "tile" and xt == x):
                raise ValueError(f"{self.name}: wgrad_x_from_fprop re-tiles Fprop's 1 x 128 FP8 tiles of x into "
                                 f"128 x 1 tiles: fprop.a and wgrad.b must be the same FP8 'tile' operand, got {x} "
                                 f"and {xt}")
        if not (isinstance(self.reference_rtol, float) and 0 < self.reference_rtol < 1):
            raise ValueError(f"{self.name}: reference_rtol must be a float in (0, 1), got {self.reference_rtol!r}")

    def operands(self) -> dict:
        """{"fprop.a": Operand, ...} for the six operands."""
        return {f"{g}.{side}": getattr(getattr(self, g), side) for g in GEMMS for side in ("a", "b")}

    @property
    def gemm_precision(self) -> str:
        """"fp32", "bf16" or "fp8": what the Linear GEMMs' inputs are."""
        p = self.fprop.a.precision
        return "fp8" if p in FP8 else p

    @property
    def pow2_operands(self) -> tuple:
        """The operands ("fprop.a", ...) whose scales are rounded up to a power of two."""
        return tuple(name for name, op in self.operands().items() if op.pow2)

    def describe(self) -> str:
        """A few lines for people: the summary, each GEMM's operands, the rest."""
        rows = [f"{self.name}: {self.summary}"]
        for g, (a, b) in zip(GEMMS, (("x", "W"), ("dy", "W^T"), ("dy^T", "x^T"))):
            gemm = getattr(self, g)
            rows.append(f"  {g:<6} {a} {gemm.a}, {b} {gemm.b}")
        extra = [f"AdamW moments {self.moments}"]
        if self.wgrad_x_from_fprop:
            extra.append("Wgrad's x re-tiled from Fprop's FP8 codes")
        rows.append("  " + "; ".join(extra))
        return "\n".join(rows)


def _same(op: Operand) -> dict:
    return dict(fprop=Gemm(op, op), dgrad=Gemm(op, op), wgrad=Gemm(op, op))


_TILE, _BLOCK, _TENSOR = Operand("e4m3", "tile"), Operand("e4m3", "block"), Operand("e4m3", "tensor")
_TILE_POW2 = Operand("e4m3", "tile", pow2=True)

RECIPES: dict = {}


def register(recipe: Recipe) -> Recipe:
    """Add `recipe` to RECIPES under its name (ValueError if the name is taken); returns it."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe, got {type(recipe).__name__}")
    if recipe.name in RECIPES:
        raise ValueError(f"recipe {recipe.name!r} is already registered")
    RECIPES[recipe.name] = recipe
    return recipe


def unregister(name: str) -> None:
    """Remove a recipe added by `register` (tests, experiments); the built-in ones stay."""
    if name in BUILT_IN:
        raise ValueError(f"recipe {name!r} is built in and cannot be removed")
    RECIPES.pop(name, None)


def get(name) -> Recipe:
    """The registered Recipe called `name` (a Recipe passes through); a clear error otherwise."""
    if isinstance(name, Recipe):
        return name
    if not isinstance(name, str):
        raise TypeError(f"recipe must be one of {tuple(RECIPES)}, got {type(name).__name__} {name!r}")
    if name not in RECIPES:
        raise ValueError(f"recipe must be one of {tuple(RECIPES)}, got {name!r}")
    return RECIPES[name]


for _r in (
    Recipe("fp32", "float32 everywhere", **_same(Operand("fp32"))),
    Recipe("bf16", "the GEMM inputs rounded to bfloat16 (nearest even), float32 accumulation",
           **_same(Operand("bf16")), reference_rtol=1e-3),
    Recipe("fp8-tensor", "E4M3 with one current scale per tensor for x, W and dy (Transformer Engine's "
           "Float8CurrentScaling)", **_same(_TENSOR), reference_rtol=2e-2),
    Recipe("fp8-deepseek", "E4M3 as DeepSeek-V3: 1 x 128 tiles for activations and gradients, 128 x 128 blocks for "
           "weights, Wgrad from the cached FP8 x re-tiled to 128 x 1, bfloat16 AdamW moments",
           fprop=Gemm(_TILE, _BLOCK), dgrad=Gemm(_TILE, _BLOCK), wgrad=Gemm(_TILE, _TILE), wgrad_x_from_fprop=True,
           moments="bf16", reference_rtol=2e-2),
    Recipe("fp8-deepseek-pow2", "fp8-deepseek with the scales of x (1 x 128 tiles for Fprop, re-tiled to 128 x 1 "
           "for Wgrad) rounded up to powers of two, as the report does where it re-tiles",
           fprop=Gemm(_TILE_POW2, _BLOCK), dgrad=Gemm(_TILE, _BLOCK), wgrad=Gemm(_TILE, _TILE_POW2),
           wgrad_x_from_fprop=True, moments="bf16", reference_rtol=2e-2),
):
    register(_r)
BUILT_IN = tuple(RECIPES)
BASELINES = ("fp32", "bf16")
"""The recipes an FP8 run is compared with by default (the teacher task: the first only)."""
