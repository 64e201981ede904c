"""The capstone's PyTorch engine: fp8lab.training.model's model in a few lines of PyTorch, the loss and speed peer of
the kernel engine (`fl.train(recipe, task="chars", engine="torch")`; PyTorch is optional: only this imports it).

A recipe whose GEMMs are bfloat16 trains with BF16 autocast (the GEMMs in bfloat16, as mixed-precision training does
it), a float32 one without; FP8 recipes are not PyTorch's (check_recipe says so). Same initial weights
(model.init_params), same batches (the corpus stream seeded as fl.train seeds it), same AdamW (betas 0.9 / 0.95,
weight decay 0.1 on the Linear weights only); with autocast=False it follows the reference engine's fp32 recipe
step for step (tests/test_train.py checks it).
"""

from __future__ import annotations

import time

import numpy as np

from ..numerics import ops, recipes
from . import corpus, model as lm


def _model(torch, cfg: lm.Config, params: dict, linear=None):
    """The model as torch modules; `linear(in, out)` makes the blocks' Linears (default nn.Linear without bias)."""
    nn, F = torch.nn, torch.nn.functional
    linear = linear or (lambda i, o: nn.Linear(i, o, bias=False))

    class RMSNorm(nn.Module):
        def __init__(self, g):
            super().__init__()
            self.g = nn.Parameter(torch.from_numpy(g.copy()))

        def forward(self, x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + float(ops.EPS)).to(x.dtype) * self.g

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.norm = RMSNorm(params[f"g{i}"])
            self.w1 = linear(cfg.width, 2 * cfg.hidden)
            self.w2 = linear(cfg.hidden, cfg.width)
            self.w1.weight.data.copy_(torch.from_numpy(params[f"w1_{i}"]))
            self.w2.weight.data.copy_(torch.from_numpy(params[f"w2_{i}"]))

        def forward(self, x):
            a, b = self.w1(self.norm(x)).chunk(2, dim=-1)
            return x + self.w2(F.silu(a) * b)

    class CharModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(cfg.vocab, cfg.embed)
            self.emb.weight.data.copy_(torch.from_numpy(params["emb"]))
            self.blocks = nn.ModuleList(Block(i) for i in range(cfg.blocks))
            self.norm = RMSNorm(params["gf"])
            self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
            self.head.weight.data.copy_(torch.from_numpy(params["head"]))

        def forward(self, ids):
            x = self.emb(ids).flatten(1)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x)).float()

    return CharModel()


def check_recipe(recipe: recipes.Recipe) -> None:
    """ValueError unless PyTorch's autocast can run `recipe`: its Linear GEMMs float32 or bfloat16."""
    if recipe.gemm_precision not in ("fp32", "bf16"):
        raise ValueError(f"engine='torch' runs recipes whose GEMMs are float32 or bfloat16 (autocast), got recipe "
                         f"{recipe.name!r} ({recipe.gemm_precision} GEMMs): use engine='kernels' or 'reference'")


FLOAT8 = {
    "rowwise": "torchao float8 training, one scale per row (power-of-two scales)",
    "tensorwise": "torchao float8 training, one scale per tensor",
    "te-blockwise": "Transformer Engine, Float8BlockScaling (1 x 128 activations, 128 x 128 weights: DeepSeek-V3's)",
}
"""The FP8 training peers `train(float8=...)` runs, on an sm_89+ GPU where their library is installed (peer_status
says which): the blocks' Linears in FP8, the embedding and the head in BF16, as DeepSeek-V3 keeps them."""


def peer_status(compile: bool = False, float8: str | None = None) -> tuple[bool, str]:
    """(can train(compile=..., float8=...) run here, why not). Imports nothing heavy beyond PyTorch."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False, "PyTorch is not installed"
    import torch

    if float8 is None:
        return True, "PyTorch " + torch.__version__
    if float8 not in FLOAT8:
        raise ValueError(f"float8 must be None or one of {tuple(FLOAT8)}, got {float8!r}")
    need = (9, 0) if float8 == "te-blockwise" else (8, 9)  # TE's block scaling: Hopper and newer
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < need:
        return False, f"{FLOAT8[float8]} needs an NVIDIA GPU of compute capability {need[0]}.{need[1]} or newer"
    lib = "transformer_engine" if float8 == "te-blockwise" else "torchao"
    if importlib.util.find_spec(lib) is None:
        return False, f"{lib} is not installed (pip install {lib.replace('_', '-')})"
    return True, lib


def _float8(torch, model, float8: str):
    """The blocks' Linears converted to FP8 training (torchao), in place; the head stays BF16."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(float8),
                               module_filter_fn=lambda module, fqn: fqn.startswith("blocks."))


def train(cfg: lm.Config, steps: int, batch: int, lr: float, seed: int = 0, *, autocast: bool = True,
          device: str | None = None, eval_batches: int = 4, compile: bool = False, float8: str | None = None) -> dict:
    """Train the PyTorch model; returns {"loss": per-step losses, "val_loss": final validation loss (nats, on
    eval_batches batches of the validation windows fl.train uses), "step_seconds": wall time of each step,
    "step_ms": their median, "device": ...}. autocast: BF16 autocast of the forward (the GEMMs in bfloat16, as
    mixed-precision training does it); device: "cuda" when available. compile: the model under torch.compile (its
    first steps compile: the median skips them when steps is large enough). float8: an FP8 peer of FLOAT8 for the
    blocks' Linears (peer_status says whether it runs here), with BF16 autocast for the rest."""
    import torch

    ok, why = peer_status(compile, float8)
    if not ok:
        raise RuntimeError(f"float8={float8!r}: {why}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    c = corpus.load()
    linear = None
    if float8 == "te-blockwise":
        import transformer_engine.pytorch as te

        linear = lambda i, o: te.Linear(i, o, bias=False, params_dtype=torch.float32)  # noqa: E731
    model = _model(torch, cfg, lm.init_params(cfg, seed), linear).to(device)
    if float8 in ("rowwise", "tensorwise"):
        _float8(torch, model, float8)
    fp8_context = _te_autocast if float8 == "te-blockwise" else _no_context
    step_model = torch.compile(model) if compile else model
    decayed = [p for n, p in model.named_parameters() if n.endswith(("w1.weight", "w2.weight", "head.weight"))]
    other = [p for n, p in model.named_parameters() if not n.endswith(("w1.weight", "w2.weight", "head.weight"))]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    stream = np.random.default_rng([seed, 2])
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        ids, tgt = (torch.from_numpy(a).long().to(device) for a in c.batch(stream, "train", batch, cfg.context))
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast), fp8_context():
            logits = step_model(ids)
        loss = torch.nn.functional.cross_entropy(logits, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    ids, tgt = c.eval_windows("val", eval_batches * batch, cfg.context)
    with torch.no_grad(), torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast), \
            fp8_context():
        logits = model(torch.from_numpy(ids).long().to(device))
        val = torch.nn.functional.cross_entropy(logits.float(), torch.from_numpy(tgt).long().to(device)).item()
    return {"loss": losses, "val_loss": val, "step_seconds": times, "step_ms": 1e3 * float(np.median(times)),
            "device": device}


def _no_context():
    import contextlib

    return contextlib.nullcontext()


def _te_autocast():
    """Transformer Engine's FP8 region with its block-scaling recipe (1 x 128 / 128 x 128 scales)."""
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe

    return te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8BlockScaling())
