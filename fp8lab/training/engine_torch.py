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


def _model(torch, cfg: lm.Config, params: dict):
    nn, F = torch.nn, torch.nn.functional

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
            self.w1 = nn.Linear(cfg.width, 2 * cfg.hidden, bias=False)
            self.w2 = nn.Linear(cfg.hidden, cfg.width, bias=False)
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


def train(cfg: lm.Config, steps: int, batch: int, lr: float, seed: int = 0, *, autocast: bool = True,
          device: str | None = None, eval_batches: int = 4) -> dict:
    """Train the PyTorch model; returns {"loss": per-step losses, "val_loss": final validation loss (nats, on
    eval_batches batches of the validation windows fl.train uses), "step_seconds": wall time of each step,
    "step_ms": their median, "device": ...}. autocast: BF16 autocast of the forward (the GEMMs in bfloat16, as
    mixed-precision training does it); device: "cuda" when available."""
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    c = corpus.load()
    model = _model(torch, cfg, lm.init_params(cfg, seed)).to(device)
    decayed = [p for n, p in model.named_parameters() if n.endswith(("w1.weight", "w2.weight", "head.weight"))]
    other = [p for n, p in model.named_parameters() if not n.endswith(("w1.weight", "w2.weight", "head.weight"))]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    stream = np.random.default_rng([seed, 2])
    losses, times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        ids, tgt = (torch.from_numpy(a).long().to(device) for a in c.batch(stream, "train", batch, cfg.context))
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    ids, tgt = c.eval_windows("val", eval_batches * batch, cfg.context)
    with torch.no_grad(), torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=autocast):
        logits = model(torch.from_numpy(ids).long().to(device))
        val = torch.nn.functional.cross_entropy(logits.float(), torch.from_numpy(tgt).long().to(device)).item()
    return {"loss": losses, "val_loss": val, "step_seconds": times, "step_ms": 1e3 * float(np.median(times)),
            "device": device}
