"""`fl.train`: a recipe trained on a task with an engine, and its History.

Recipes (fp8lab.numerics.recipes, `fl.RECIPES`): the precision and scaling of every GEMM operand of a Linear layer,
the AdamW moments' format, the tolerance to the reference engine. Built in: fp32, bf16, fp8-tensor, fp8-deepseek.

Tasks: "teacher" (the default: one Linear + bias + RMSNorm layer fitted to a fixed random teacher, fp8lab.training.
teacher) and "chars": a character-level language model of Tiny Shakespeare (fp8lab.training.model: embedding,
residual SwiGLU blocks, RMSNorm, output head, cross-entropy) trained with AdamW, validation loss in bits per character,
checkpoints (fp8lab.training.checkpoint).

Engines: "kernels" runs the Numba-CUDA kernels (GPU or simulator, engine_kernels); "reference" runs the same
arithmetic in NumPy float32 (engine_reference); both draw the same batches from `seed`, so their curves agree to
within the recipe's reference_rtol. "torch" (task "chars", PyTorch installed) trains the same model in PyTorch
(engine_torch): the loss and speed peer, for recipes whose GEMMs are float32 or bfloat16 (autocast).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import pathlib
import time

import numpy as np

from .. import _validate as V
from ..device import runtime
from ..kernels import optim
from ..numerics import recipes
from . import checkpoint, corpus, engine_kernels, engine_reference, model, preflight, teacher
from .ema import CpuEma
from .ema import average as ema_average

RECIPES = recipes.RECIPES
TASKS = ("teacher", "chars")
ENGINES = ("kernels", "reference", "torch")
OPTIMIZERS = ("adam", "sgd", "adamw")
# A loss this many times the first step's counts as diverged. Runs that learn stay below 1.2x (the first step's
# loss is the initial weights'); under the simulator's defaults Adam at lr 10 peaks near 40x and recovers, while
# lr 100 reaches 4000x and lr 1e10 1e19x (the RMSNorm gain explodes).
DIVERGENCE_FACTOR = 1000.0
# task "chars": a validation loss this many times the lower of the first step's loss (the untrained model's, about
# ln 65 nats) and the first validation loss counts as diverged: the model is confidently wrong on held-out text, as
# when lr times the model's width is so large that one step moves the logits by tens (the training loss of the
# same steps can stay under DIVERGENCE_FACTOR)
VAL_DIVERGENCE_FACTOR = 10.0
# the width (context x embed) past which a divergence message names it too: this many times the backend's default
WIDE = 8

# Each task's defaults: tiny under the simulator (every thread a Python thread), realistic on a GPU
SIZES = {
    "teacher": {"sim": dict(batch=8, d_in=32, d_out=16, steps=20, lr=5e-2, ema_decay=0.9),
                # the original program's batch 64, 512 -> 256
                "gpu": dict(batch=64, d_in=512, d_out=256, steps=600, lr=1e-3, ema_decay=0.99)},
    # 4096 windows of 16 characters, width 512, 4 blocks: the validation loss is lowest after about one pass over
    # the 1 MB corpus (250 steps; BENCHMARKS.md); wider models or batches memorize it sooner
    "chars": {"sim": dict(batch=8, context=2, embed=16, hidden=16, blocks=1, steps=3, lr=3e-3, ema_decay=0.9,
                          eval_every=3, eval_batches=1),
              "gpu": dict(batch=4096, context=16, embed=32, hidden=1024, blocks=4, steps=250, lr=1e-3,
                          ema_decay=0.99, eval_every=50, eval_batches=8)},
}
SIM_COST = runtime.SimCost(1.2, 1.5e-5, 5.0e-4, step=True, names="batch x d_in x d_out = ")
"""Seconds of one teacher-task step under the simulator, dims (batch, d_in, d_out) (docs/notes/simulator.md); the
language model's step is estimated as one of (batch, width, 2 * hidden)."""


PRESETS = {
    "default": {},
    # sized so that the GEMMs, not the launches, should take most of a step (not yet timed): width 2048 (16 characters
    # x 128), SwiGLU 5632 (TinyLlama's at width 2048), 16,384 windows a step; 300 steps see the 1 MB corpus about 4
    # times, so its validation loss stops falling early: this size is for speed. lr halved for the width (not tuned)
    "large": dict(batch=16384, context=16, embed=128, hidden=5632, blocks=4, steps=300, lr=5e-4, eval_every=50,
                  eval_batches=2),
}
"""Named model sizes of task "chars" (fl.train(size=...), `fp8lab train --size`): "default" is the backend's
(sizes("chars")); the others replace those values on any backend (under the simulator a large run would take far
longer than anyone waits: fl.train warns with its estimate before the first step)."""


def sizes(task: str, size: str = "default") -> dict:
    """The defaults of `task` ("teacher" or "chars") on this backend: sizes, steps, lr, ema_decay, ...; for task
    "chars", `size` a name in PRESETS."""
    defaults = dict(runtime.per_backend(SIZES[V.choice("task", task, TASKS)]))
    V.choice("size", size, tuple(PRESETS))
    if size != "default" and task != "chars":
        raise ValueError(f"size: a named size is for task='chars' (the language model), got size={size!r} with "
                         f"task={task!r}")
    defaults.update(PRESETS[size])
    return defaults


class TrainingDiverged(FloatingPointError):
    """The loss became NaN or Inf, or more than DIVERGENCE_FACTOR times the first step's; or (task "chars") the
    validation loss became NaN or Inf, or more than VAL_DIVERGENCE_FACTOR times the lower of the first step's loss
    and the first validation loss.

    `history` holds the run up to the step before (its losses, the arguments); `command_line` is the message in the
    command line's words (--lr rather than lr=)."""

    def __init__(self, message: str, history=None, command_line: str | None = None):
        super().__init__(message)
        self.history = history
        self.command_line = message if command_line is None else command_line


@dataclasses.dataclass
class History:
    recipe: str
    engine: str
    backend: str
    batch: int
    d_in: int
    d_out: int
    steps: int
    seed: int
    lr: float
    optimizer: str
    noise: float
    loss: list = dataclasses.field(default_factory=list)  # per-step training loss (floats)
    eval_loss: float = float("nan")  # final weights, held-out data (teacher: FP32 forward; chars: the recipe's)
    ema_loss: float = float("nan")  # EMA weights, same data
    seconds: float = 0.0
    task: str = "teacher"
    model: dict = dataclasses.field(default_factory=dict)  # chars: the model's Config and the moments' format
    val_loss: list = dataclasses.field(default_factory=list)  # chars: [step, validation loss in nats] pairs
    # chars: wall time of each training step (graph: the steps whose losses were read together share their mean)
    step_seconds: list = dataclasses.field(default_factory=list)
    # chars, kernels on a GPU: GPU milliseconds per step by op (after PROFILE_SKIP steps), largest first, else None
    breakdown: dict | None = None
    # graph on a GPU: the same for the forward and backward replayed as one CUDA graph (no gaps between launches)
    graph_breakdown: dict | None = None
    device: str | None = None  # engine "torch": the device PyTorch ran on ("cuda", "cpu")
    graph: bool = False  # chars, kernels: whether steps were replayed as a CUDA graph (train's graph; set at capture)
    # graph on a GPU: the GPU time of the replayed steps over their wall time (how busy the GPU was), else None
    gpu_busy: float | None = None

    @property
    def floor(self) -> float:
        """The loss a perfect student reaches: the variance of the target noise (teacher task; NaN for chars)."""
        return self.noise**2 if self.task == "teacher" else float("nan")

    @property
    def eval_bpc(self) -> float:
        """chars: the final validation loss in bits per character."""
        return corpus.bits_per_char(self.eval_loss)

    @property
    def step_ms(self) -> float:
        """Median wall time of a training step in milliseconds (the first steps compile kernels; the median skips
        them), or the mean when steps were not timed one by one."""
        if self.step_seconds:
            return 1e3 * float(np.median(self.step_seconds))
        return 1e3 * self.seconds / max(1, len(self.loss))

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10% of steps (one step's loss is noisy)."""
        k = max(1, len(self.loss) // 10)
        return float(np.mean(self.loss[-k:]))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(floor=self.floor, final_loss=self.final_loss)
        return d

    def save_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)


def train(
    recipe: str = "fp8-tensor",
    steps: int | None = None,
    seed: int = 0,
    *,
    task: str = "teacher",
    batch: int | None = None,
    d_in: int | None = None,
    d_out: int | None = None,
    lr: float | None = None,
    optimizer: str | None = None,
    noise: float = 0.5,
    ema_decay: float | None = None,
    engine: str = "kernels",
    progress: bool = True,
    context: int | None = None,
    embed: int | None = None,
    hidden: int | None = None,
    blocks: int | None = None,
    moments: str | None = None,
    eval_every: int | None = None,
    save=None,
    resume=None,
    outliers: float | None = None,
    eval_batches: int | None = None,
    size: str = "default",
    graph: bool | None = None,
) -> History:
    """Train on `task` with `recipe` and return its History (per-step losses in `history.loss`).

    recipe: a name in RECIPES (fp8lab.numerics.recipes; `recipes.register` adds one) or a Recipe.
    task="teacher" (default): the Linear + bias + RMSNorm layer fitted to a teacher (d_in, d_out, noise; optimizer
    "adam" or "sgd"). task="chars": the character-level language model of fp8lab.training.model on Tiny
    Shakespeare (context, embed, hidden, blocks; AdamW; `moments` "bf16" or "fp32", default the recipe's;
    validation loss every `eval_every` steps in history.val_loss and at the end in history.eval_loss, nats;
    save=DIR writes a checkpoint there at every validation, resume=DIR continues the run saved there to `steps`,
    with the same losses as an uninterrupted run; see fp8lab.training.checkpoint; `outliers` a power of two s:
    W1's input gets OUTLIER_CHANNELS channels s times larger and W1 those columns s times smaller, the same
    product, a controlled test of the FP8 scales, see fp8lab.training.model; `eval_batches` batches of validation
    windows, the same windows in every run; `size` "default" or "large", PRESETS: the defaults of the sizes, steps and
    lr, which arguments still override). Options of the other task raise a ValueError naming them.
    engine: "kernels" (default), "reference" (NumPy) or "torch" (task "chars" only; float32 or bfloat16 GEMMs;
    no checkpoints, no EMA; its validation loss once, at the end).
    graph (task "chars", engine "kernels"): after the first steps (which compile the kernels, then are profiled op
    by op) the step, forward, backward and AdamW, is captured once as a CUDA graph and replayed, its losses read
    every LOSS_READ_EVERY steps (fp8lab.training.engine_kernels.GraphedStep); the same losses, bit for bit, as
    graph=False, which launches every kernel from Python. None (default): on a GPU; under the simulator, which has
    no graphs, off (graph=True runs the simulator's twin: the same loop, each replay run eagerly).

    Sizes, steps, lr and ema_decay default to the backend's (sizes("teacher")): on a GPU the original
    program's batch 64, input 512, output 256, lr 1e-3 (600 steps); under the simulator batch 8, 32 -> 16,
    lr 5e-2, 20 steps, so a run takes about half a minute. Raises TrainingDiverged naming the
    step if the loss becomes NaN or Inf or exceeds DIVERGENCE_FACTOR (1000) times the first step's loss, or (chars)
    the validation loss becomes NaN or Inf or exceeds VAL_DIVERGENCE_FACTOR (10) times the first step's loss or the
    first validation loss, whichever is lower.

    Checked before the first step (ValueError or TypeError naming the argument): every argument; the folders
    (save: a folder this process can write in, holding no other run's checkpoint; resume: a checkpoint of this
    configuration, whole and unchanged since it was written, see fp8lab.training.checkpoint); the memory the run
    needs against what the host (and the GPU, for the kernels) has free (fp8lab.training.preflight; a
    preflight.LargeRunWarning above a few GB).

    seed: an int >= 0. lr, noise: positive finite numbers; ema_decay: a real number in [0, 1) (Python or NumPy
    numbers alike); progress: a bool.
    """
    s = prepare(**locals())
    preflight.check_memory(s)
    return s.run()


@dataclasses.dataclass(frozen=True)
class Settings:
    """fl.train's arguments checked, with the backend's defaults filled in (`prepare` makes one); `run()` trains.
    The fields of the other task are None; `defaults` are the backend's (sizes(task))."""

    recipe: recipes.Recipe
    task: str
    engine: str
    steps: int
    seed: int
    batch: int
    lr: float
    ema_decay: float
    progress: bool
    optimizer: str
    defaults: dict
    d_in: int | None = None
    d_out: int | None = None
    noise: float | None = None
    cfg: model.Config | None = None
    moments: str | None = None
    eval_every: int | None = None
    eval_batches: int | None = None
    save: pathlib.Path | None = None
    resume: pathlib.Path | None = None
    graph: bool = False

    def identity(self) -> dict:
        """task "chars": what a checkpoint of this run records as its configuration, and a resumed run must match."""
        return dict(recipe=self.recipe.name, engine=self.engine, model=dict(dataclasses.asdict(self.cfg),
                    moments=self.moments), batch=self.batch, seed=self.seed, lr=self.lr, ema_decay=self.ema_decay,
                    eval_every=self.eval_every, eval_batches=self.eval_batches)

    def run(self) -> History:
        """Train (see fl.train) and return the History."""
        if self.task == "chars":
            if self.engine == "torch":
                return _train_torch(self)
            return _train_chars(self)
        return teacher.run(self.recipe, self.steps, self.seed, self.batch, self.d_in, self.d_out, self.lr,
                           self.optimizer, self.noise, self.ema_decay, self.engine, self.progress,
                           History(self.recipe.name, self.engine, runtime.backend, self.batch, self.d_in, self.d_out,
                                   self.steps, self.seed, self.lr, self.optimizer, self.noise),
                           TrainingDiverged, DIVERGENCE_FACTOR)


def prepare(recipe="fp8-tensor", steps=None, seed=0, *, task="teacher", batch=None, d_in=None, d_out=None, lr=None,
            optimizer=None, noise=0.5, ema_decay=None, engine="kernels", progress=True, context=None, embed=None,
            hidden=None, blocks=None, moments=None, eval_every=None, save=None, resume=None, outliers=None,
            eval_batches=None, size="default", graph=None) -> Settings:
    """fl.train's checks of its arguments and folders, without training (fl.train's arguments; the memory is
    checked by fp8lab.training.preflight.check_memory): the Settings whose run() trains."""
    recipe = recipes.get(recipe)
    V.choice("task", task, TASKS)
    V.choice("engine", engine, ENGINES)
    if engine == "torch":
        from . import engine_torch

        if task != "chars":
            raise ValueError(f"engine='torch' trains task='chars' (the language model), got task={task!r}")
        engine_torch.check_recipe(recipe)
        if save is not None or resume is not None:
            raise ValueError("save, resume: checkpoints are for engine='kernels' or 'reference', got engine='torch'")
        if moments == "bf16":
            raise ValueError("moments: engine='torch' keeps AdamW's moments in float32 (torch.optim.AdamW), got "
                             "moments='bf16'")
    if graph is not None:
        graph = V.boolean("graph", graph)
        if graph and (task, engine) != ("chars", "kernels"):
            raise ValueError(f"graph=True: a CUDA graph captures the kernel engine's step of task='chars', got "
                             f"task={task!r}, engine={engine!r}")
    other = {"teacher": (("context", context), ("embed", embed), ("hidden", hidden), ("blocks", blocks),
                         ("moments", moments), ("eval_every", eval_every), ("save", save), ("resume", resume),
                         ("outliers", outliers), ("eval_batches", eval_batches)),
             "chars": (("d_in", d_in), ("d_out", d_out), ("noise", None if noise == 0.5 else noise))}[task]
    given = [n for n, v in other if v is not None]
    if given:
        owner = "chars" if task == "teacher" else "teacher"
        raise ValueError(f"{', '.join(given)}: only for task={owner!r}, got task={task!r}")
    defaults = sizes(task, size)
    steps = V.positive_int("steps", defaults["steps"] if steps is None else steps)
    batch = V.positive_int("batch", defaults["batch"] if batch is None else batch)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a non-negative int, got {V.describe(seed)}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed}")
    seed = int(seed)  # History stores it: a NumPy integer would not serialize to JSON
    lr = V.positive_float("lr", defaults["lr"] if lr is None else lr)
    ema_decay = defaults["ema_decay"] if ema_decay is None else ema_decay
    if isinstance(ema_decay, (bool, np.bool_)) or not isinstance(ema_decay, numbers.Real):
        raise TypeError(f"ema_decay must be a number in [0, 1), got {V.describe(ema_decay)}")
    if not 0 <= ema_decay < 1:  # NaN fails too
        raise ValueError(f"ema_decay must be a number in [0, 1), got {ema_decay!r}")
    ema_decay = float(ema_decay)
    progress = V.boolean("progress", progress)
    optimizer = ("adam" if task == "teacher" else "adamw") if optimizer is None else optimizer
    V.choice("optimizer", optimizer, OPTIMIZERS)
    if (optimizer == "adamw") != (task == "chars"):
        raise ValueError(f"optimizer must be {'adamw' if task == 'chars' else 'adam or sgd'} for task={task!r}, got "
                         f"{optimizer!r}")
    common = dict(recipe=recipe, task=task, engine=engine, steps=steps, seed=seed, batch=batch, lr=lr,
                  ema_decay=ema_decay, progress=progress, optimizer=optimizer, defaults=defaults)
    if task == "chars":
        cfg = model.Config(corpus.load().vocab_size,
                           *(V.positive_int(n, defaults[n] if v is None else v) for n, v in
                             (("context", context), ("embed", embed), ("hidden", hidden), ("blocks", blocks))),
                           outliers=1.0 if outliers is None else outliers)
        moments = recipe.moments if moments is None else moments
        V.choice("moments", moments, recipes.MOMENTS)
        eval_every = V.positive_int("eval_every", defaults["eval_every"] if eval_every is None else eval_every)
        eval_batches = V.positive_int("eval_batches", defaults["eval_batches"] if eval_batches is None else
                                      eval_batches)
        graph = (engine == "kernels" and not runtime.IS_SIM) if graph is None else graph
        s = Settings(**common, cfg=cfg, moments=moments, eval_every=eval_every, eval_batches=eval_batches,
                     graph=graph)
        if save is not None:
            save = checkpoint.check_save_dir("save", save, same_as=resume)
        if resume is not None:
            resume = checkpoint.check_resume_dir("resume", resume)
        if engine == "kernels":  # warns once if the simulator would take minutes
            runtime.sim_check("fl.train", (batch, cfg.width, 2 * cfg.hidden), SIM_COST, steps=steps)
        return dataclasses.replace(s, save=save, resume=resume)
    d_in = V.positive_int("d_in", defaults["d_in"] if d_in is None else d_in)
    d_out = V.positive_int("d_out", defaults["d_out"] if d_out is None else d_out)
    noise = V.positive_float("noise", noise)
    if engine == "kernels":  # warns once if the simulator would take minutes
        runtime.sim_check("fl.train", (batch, d_in, d_out), SIM_COST, steps=steps)
    return Settings(**common, d_in=d_in, d_out=d_out, noise=noise)


def finished(s: Settings, meta: dict) -> History:
    """The History of a task "chars" run whose verified checkpoint (its metadata `meta`, fp8lab.training.checkpoint)
    has reached s.steps: what train would have returned, without training again (its EMA loss is NaN if the
    checkpoint is not the end of a run of s.steps)."""
    hist = History(s.recipe.name, s.engine, runtime.backend, s.batch, 0, 0, s.steps, s.seed, s.lr, "adamw", 0.0,
                   task="chars", model=dict(dataclasses.asdict(s.cfg), moments=s.moments))
    hist.loss, hist.val_loss, hist.step_seconds = meta["loss"], meta["val_loss"], meta["step_seconds"]
    hist.eval_loss = hist.val_loss[-1][1]
    hist.ema_loss = float(meta.get("ema_loss", float("nan")))
    hist.seconds = float(sum(hist.step_seconds))
    return hist


def _first_nonfinite(named) -> str | None:
    """The name of the first array in `named` ({name: NumPy array}) holding NaN or Inf, else None."""
    return next((k for k, a in named.items() if not np.isfinite(a).all()), None)


PROFILE_SKIP = 2
"""task="chars" on the kernels: the steps after these are profiled by op (History.breakdown)."""
PROFILE_STEPS = 3
"""graph=True: the profiled steps run eagerly, this many of them, before the step is captured."""
LOSS_READ_EVERY = 25
"""graph=True: the losses are read (the host waits for the GPU) every this many steps, and at each validation."""


def _train_chars(s: Settings) -> History:
    """task="chars" (see train): AdamW on fp8lab.training.model's model, validation loss on fixed windows; a
    checkpoint in `s.save` at every validation (fp8lab.training.checkpoint), or the run continued from the one in
    `s.resume`."""
    recipe, cfg, steps, seed, batch, lr, ema_decay, engine, progress, moments, eval_every, eval_batches, save, \
        resume = (s.recipe, s.cfg, s.steps, s.seed, s.batch, s.lr, s.ema_decay, s.engine, s.progress, s.moments,
                  s.eval_every, s.eval_batches, s.save, s.resume)
    c = corpus.load()
    params = model.init_params(cfg, seed)
    if engine == "kernels":
        net = engine_kernels.KernelModel(cfg, recipe, batch, params)
        P = net.params
        opt = optim.AdamW(P.size, lr=lr, decay=P.mask(model.DECAYED), moments=moments)

        def step(ids, tgt):
            return net.loss(ids, tgt), lambda: P.host(P.grad)

        def update():
            net.prof.mark("AdamW")
            opt.step(P.flat, P.grad)

        def weights():
            return P.host()

        pinned = [runtime.cuda.pinned_array(P.size, np.float32) for _ in range(2)]
        ema = CpuEma(P.flat.copy_to_host(), ema_decay, pinned)

        def push_ema():
            net.prof.mark("EMA copy to host")
            ema.push(P.flat.copy_to_host)
            net.prof.stop()

        def evaluate():
            return np.mean([net.loss(i, t, grads=False) for i, t in val])

        def evaluate_ema():  # the EMA weights in the model's own buffers for a moment (no second model)
            current = P.flat.copy_to_host()
            P.flat.copy_to_device(ema.value())
            try:
                return evaluate()
            finally:
                P.flat.copy_to_device(current)

        def get_state():
            return {"params": P.flat.copy_to_host(), "m": opt.m.copy_to_host(), "v": opt.v.copy_to_host(),
                    "ema": ema.value().copy(), "t": np.int64(opt.t)}

        def set_state(st):
            P.flat.copy_to_device(st["params"])
            opt.m.copy_to_device(st["m"])
            opt.v.copy_to_device(st["v"])
            opt.t = int(st["t"])
            ema.value()[...] = st["ema"]
    else:
        net = engine_reference.Model(cfg, recipe)
        opt = engine_reference.AdamW(params, lr, moments=moments)
        grads = {}

        def step(ids, tgt):
            loss, g = net.loss(params, ids, tgt)
            grads.update(g)
            return loss, lambda: grads

        def update():
            opt.step(params, grads)

        def weights():
            return {k: v.copy() for k, v in params.items()}

        ema = {k: v.copy() for k, v in params.items()}

        def push_ema():  # the reference engine: CpuEma's average, synchronously
            for k, w in params.items():
                ema_average(ema[k].reshape(-1), w.reshape(-1), np.float32(ema_decay), np.float32(1 - ema_decay))

        def evaluate(p=params):
            return np.mean([net.loss(p, i, t, False) for i, t in val])

        def evaluate_ema():
            return evaluate(ema)

        def get_state():
            st = {"t": np.int64(opt.t)}
            for group, d in (("params", params), ("m", opt.m), ("v", opt.v), ("ema", ema)):
                st.update({f"{group}/{k}": a for k, a in d.items()})
            return st

        def set_state(st):
            for group, d in (("params", params), ("m", opt.m), ("v", opt.v), ("ema", ema)):
                for k in d:
                    d[k][...] = st[f"{group}/{k}"]
            opt.t = int(st["t"])

    ids_all, tgt_all = c.eval_windows("val", eval_batches * batch, cfg.context)
    val = [(ids_all[k * batch:(k + 1) * batch], tgt_all[k * batch:(k + 1) * batch]) for k in range(eval_batches)]
    stream = np.random.default_rng([seed, 2])
    hist = History(recipe.name, engine, runtime.backend, batch, 0, 0, steps, seed, lr, "adamw", 0.0,
                   task="chars", model=dict(dataclasses.asdict(cfg), moments=moments))

    run = s.identity()
    first = 1
    if resume is not None:
        st, meta = checkpoint.load(resume, run)
        set_state(st)
        stream.bit_generator.state = meta["rng"]
        hist.loss, hist.val_loss, hist.step_seconds = meta["loss"], meta["val_loss"], meta["step_seconds"]
        first = meta["step"] + 1
        if first > steps:
            raise ValueError(f"steps must be more than the {meta['step']} steps the checkpoint in "
                             f"resume={str(resume)!r} has done, got {steps}")

    def save_now(i):
        meta = dict(run, step=i, rng=stream.bit_generator.state, loss=hist.loss, val_loss=hist.val_loss,
                    step_seconds=hist.step_seconds)
        if i == steps:  # the end of the run: its row can be printed from the checkpoint alone (cli: --resume)
            meta["ema_loss"] = hist.ema_loss
        checkpoint.save(save, get_state(), meta)

    def diverged(what, value, i, where="", ref=None):
        wide = cfg.width > WIDE * s.defaults["context"] * s.defaults["embed"]
        more = "" if ref is None else (f", more than {VAL_DIVERGENCE_FACTOR:g} times the first "
                                       f"{'step' if ref == hist.loss[0] else 'validation'}'s {ref:.4g}")
        api = (f"{what} became {value:.4g} at step {i} of {steps} (recipe={recipe.name!r}, task='chars', lr={lr})"
               f"{more}{where}: lower the learning rate"
               + (f", or the width (context x embed = {cfg.width})" if wide else ""))
        cli = (f"{what} became {value:.4g} at step {i} of {steps} ({recipe.name}){more}{where}: lower --lr "
               f"(now {lr:g})" + (f", or --context / --embed (width {cfg.width})" if wide else ""))
        bar.close()
        return TrainingDiverged(api, hist, cli)

    from tqdm.auto import tqdm  # a widget in Jupyter, text in a terminal

    bar = tqdm(range(first, steps + 1), desc=f"{recipe.name} (chars, {engine}, {runtime.backend})",
               disable=not progress, unit="step", leave=True, initial=first - 1, total=steps)

    def check_loss(value, i, grads_of, read_at=None):
        if not np.isfinite(value) or (hist.loss and value > DIVERGENCE_FACTOR * hist.loss[0]):
            bad_w, bad_g = _first_nonfinite(weights()), _first_nonfinite(grads_of())
            when = "" if read_at in (None, i) else f" (read after step {read_at})"  # the graph's losses come in groups
            where = (f"; parameter {bad_w!r} is not finite{when}" if bad_w else
                     f"; the first non-finite gradient is {bad_g!r}{when}" if bad_g else "")
            raise diverged("loss", value, i, where)

    graphed, queued = None, []  # s.graph: the captured step once made; the steps whose loss is not read yet
    busy = [0.0, 0.0]  # graph on a GPU: milliseconds of GPU time in the replays, of wall time of those steps
    start = time.perf_counter()
    for i in bar:
        t0 = time.perf_counter()
        ids, tgt = c.batch(stream, "train", batch, cfg.context)
        if s.graph and graphed is None and i - first == PROFILE_SKIP + PROFILE_STEPS:
            try:
                graphed = engine_kernels.GraphedStep(net, opt, steps - i + 1)
                hist.graph = True
                hist.graph_breakdown = engine_kernels.graph_breakdown(net, PROFILE_STEPS)
            except RuntimeError as e:  # the run goes on as graph=False would: the same losses
                import warnings

                warnings.warn(f"fl.train(graph=True): the step could not be captured as a CUDA graph ({e}); every "
                              "kernel is launched from Python instead", RuntimeWarning,
                              stacklevel=V.user_stacklevel())
            t0 = time.perf_counter()  # the capture is not a step's time
        if graphed is not None:  # queued on the GPU; the losses read every LOSS_READ_EVERY steps
            graphed(ids, tgt)
            ema.push(graphed.copy_weights, graphed.copy_stream)
            queued.append((i, t0))
            if len(queued) < LOSS_READ_EVERY and i % eval_every and i != steps:
                continue
            values, now = graphed.losses(), time.perf_counter()
            per_step = (now - queued[0][1]) / len(queued)
            if graphed.timed:
                busy[0] += graphed.gpu_ms
                busy[1] += 1e3 * (now - queued[0][1])
                hist.gpu_busy = busy[0] / busy[1]
            for (j, _), value in zip(queued, values):
                check_loss(value, j, lambda: P.host(P.grad), read_at=i)
                hist.loss.append(value)
                hist.step_seconds.append(per_step)
            queued = []
        else:
            if engine == "kernels" and i - first >= PROFILE_SKIP:  # steady state: the first steps compile kernels
                net.prof.start()
            with V.no_float_warnings():
                value, grads_of = step(ids, tgt)
            check_loss(value, i, grads_of)
            update()
            hist.loss.append(value)
            push_ema()
            hist.step_seconds.append(time.perf_counter() - t0)  # the loss was read back: the step's kernels are done
        if i % eval_every == 0 or i == steps:
            v = float(evaluate())
            ref = min(hist.loss[0], hist.val_loss[0][1]) if hist.val_loss else hist.loss[0]
            if not np.isfinite(v) or v > VAL_DIVERGENCE_FACTOR * ref:  # before the checkpoint: it keeps the last good
                raise diverged("validation loss", v, i, ref=ref)
            hist.val_loss.append([i, v])
            bar.set_postfix(loss=f"{value:.3f}", val_bpc=f"{corpus.bits_per_char(hist.val_loss[-1][1]):.3f}")
            if i == steps:
                hist.ema_loss = float(evaluate_ema())
            if save is not None:
                save_now(i)
    hist.seconds = time.perf_counter() - start
    if graphed is not None:
        graphed.graph.close()
    if engine == "kernels":
        ema.close()
        hist.breakdown = net.prof.ms_per_step()
    hist.eval_loss = hist.val_loss[-1][1]
    return hist


def _train_torch(s: Settings) -> History:
    """task="chars", engine="torch" (see train): the same model, weights and batches in PyTorch (engine_torch)."""
    from . import engine_torch

    recipe, cfg, steps, seed, batch, lr, moments = s.recipe, s.cfg, s.steps, s.seed, s.batch, s.lr, s.moments
    eval_batches = s.eval_batches

    hist = History(recipe.name, "torch", runtime.backend, batch, 0, 0, steps, seed, lr, "adamw", 0.0, task="chars",
                   model=dict(dataclasses.asdict(cfg), moments=moments))
    out = engine_torch.train(cfg, steps, batch, lr, seed, autocast=recipe.gemm_precision == "bf16",
                             eval_batches=eval_batches)
    hist.loss, hist.step_seconds, hist.seconds = out["loss"], out["step_seconds"], float(sum(out["step_seconds"]))
    hist.val_loss = [[steps, out["val_loss"]]]
    hist.eval_loss = out["val_loss"]
    hist.device = out["device"]
    return hist
