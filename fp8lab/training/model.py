"""The capstone's model: a character-level language model, its sizes and its initial weights (every engine's).

    ids (M, C) --embedding--> x (M, D = C * E)        the last C characters, each embedded in E numbers, side by side
    L times:   x = x + W2 · SwiGLU(W1 · RMSNorm(x))    W1 (2F, D), W2 (D, F): a pre-norm residual MLP block
    logits = Wh · RMSNorm(x)  (M, V);  loss = softmax cross-entropy against the next character

A Bengio-style (2003) fixed-context model rather than a Transformer: every GEMM is a Linear layer as in
DeepSeek-V3's MLPs, and the context lives in the concatenated embeddings, so no attention kernel is needed while
the model still has to use the preceding characters (a single character predicts the next one at about 3.5 bits, the
bigram model of this corpus; a context of 16 gets well below).

The engines that train it: `engine_reference` (NumPy float32, the spec), `engine_kernels` (fp8lab's kernels) and
`engine_torch` (PyTorch, the peer). Which precision each GEMM of a Linear runs in is the recipe's
(fp8lab.numerics.recipes); in every recipe the embedding, the output head, the norms, SwiGLU and the softmax stay in
float32, master weights and gradients are float32, and an EMA of the weights is kept on the CPU.

Outlier channels (Config.outliers = s, a power of two): W1's GEMMs run on z * d and W1 / d, where d is s on
OUTLIER_CHANNELS fixed channels (inside one 1 x 128 tile of W1's input) and 1 elsewhere. The product is the same in
exact arithmetic, and bit for bit in fp32 and bf16 (scaling by a power of two is exact), so only the FP8 scales see
the change. Large activation channels are what LLMs grow (LLM.int8(), arXiv 2208.07339: outliers concentrated in 6
feature dimensions at 6.7B parameters; "massive activations", arXiv 2402.17762, up to 10^4-10^5 times the median,
on a few tokens); here the weights that read them are made small so that the layer computes the same function.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import _validate as V
from ..numerics import spec

DECAYED = ("w1_", "w2_", "head")  # AdamW's weight decay: the Linear weights, not the embedding or the norm gains
F32 = np.float32
# LLM.int8() finds about 6 systematic outlier dimensions of 4096 (6.7B parameters); 2 of 512 is denser. They sit in
# one 1 x 128 tile of W1's input, so every other tile of a row is free of them
OUTLIER_CHANNELS = 2
OUTLIER_SEED = 2208
MAX_OUTLIER_LOG2 = 20


@dataclasses.dataclass(frozen=True)
class Config:
    """Model sizes: vocabulary V, context C characters, embedding E per character (width D = C * E), SwiGLU width
    F, and the number of residual blocks."""

    vocab: int
    context: int
    embed: int
    hidden: int
    blocks: int
    outliers: float = 1.0  # the magnitude of the outlier channels of W1's input (1: none); see the module docstring

    def __post_init__(self):
        for name in ("vocab", "context", "embed", "hidden", "blocks"):
            V.positive_int(name, getattr(self, name))
        s = self.outliers
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, float, np.integer, np.floating)):
            raise TypeError(f"outliers must be a power of two from 1 to 2**{MAX_OUTLIER_LOG2}, got {V.describe(s)}")
        if not (1 <= s <= 2**MAX_OUTLIER_LOG2 and math.frexp(s)[0] == 0.5):  # NaN fails too
            raise ValueError(f"outliers must be a power of two from 1 to 2**{MAX_OUTLIER_LOG2} (exact scaling keeps "
                             f"fp32 and bf16 unchanged), got {s!r}")
        object.__setattr__(self, "outliers", float(s))

    @property
    def width(self) -> int:
        return self.context * self.embed


def outlier_scales(cfg: Config) -> np.ndarray | None:
    """float32 (D,): cfg.outliers on OUTLIER_CHANNELS channels of one 1 x 128 tile, drawn once (the same in every
    block and every run), 1 elsewhere; None when cfg.outliers is 1."""
    if cfg.outliers == 1:
        return None
    d = np.ones(cfg.width, F32)
    rng = np.random.default_rng(OUTLIER_SEED)
    lo = spec.GROUP_K * int(rng.integers(-(-cfg.width // spec.GROUP_K)))  # one tile of the row, drawn once
    hi = min(cfg.width, lo + spec.GROUP_K)
    d[lo + rng.choice(hi - lo, min(OUTLIER_CHANNELS, hi - lo), replace=False)] = cfg.outliers
    return d


def param_shapes(cfg: Config) -> dict:
    """{name: shape} of the parameters, in init_params' order (the layout of a flat buffer of them)."""
    D, F = cfg.width, cfg.hidden
    shapes = {"emb": (cfg.vocab, cfg.embed)}
    for i in range(cfg.blocks):
        shapes.update({f"g{i}": (D,), f"w1_{i}": (2 * F, D), f"w2_{i}": (D, F)})
    shapes.update({"gf": (D,), "head": (cfg.vocab, D)})
    return shapes


def init_params(cfg: Config, seed: int) -> dict:
    """float32 parameters: normal embeddings, Linear weights scaled by 1 / sqrt(fan-in) (W2 further by
    1 / sqrt(2 L), so the residual stream does not grow with depth), norm gains 1."""
    rng = np.random.default_rng(seed)
    D, F = cfg.width, cfg.hidden

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(F32)

    p = {"emb": normal((cfg.vocab, cfg.embed), 1.0)}
    for i in range(cfg.blocks):
        p[f"g{i}"] = np.ones(D, F32)
        p[f"w1_{i}"] = normal((2 * F, D), 1 / math.sqrt(D))
        p[f"w2_{i}"] = normal((D, F), 1 / math.sqrt(F * 2 * cfg.blocks))
    p["gf"] = np.ones(D, F32)
    p["head"] = normal((cfg.vocab, D), 1 / math.sqrt(D))
    return p
