"""What a training run needs, checked before its first step: memory, and a comparison's checkpoint folders.

`check_memory(settings)`: the bytes a run will hold, estimated from its sizes (parameters and optimizer state,
activations per window, the validation windows; on the host for the NumPy engine, on the GPU for the kernels, on
the host again under the simulator, whose device arrays are NumPy arrays) against what is free now (the host:
/proc/meminfo's MemAvailable, else os.sysconf's free pages; the GPU: runtime.device_info()). More than is free: a
ValueError naming the options that set the largest part; more than WARN_BYTES: a LargeRunWarning. The per-window
and per-parameter factors are upper estimates of the engines' buffers and NumPy's temporaries.

`comparison(prepared, save, resume)`: the command line's plan for `fp8lab train --save DIR --resume DIR`, every
recipe's folder checked before the first one trains: which recipes are finished (skipped, their rows read from
the checkpoint), which resume, which start.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings

import numpy as np

from .. import _validate as V
from ..device import runtime
from . import checkpoint, model
from .checkpoint import option

WARN_BYTES = 4 * 10**9
F32 = 4
MODEL_OPTIONS = ("context", "embed", "hidden", "blocks")


class LargeRunWarning(UserWarning):
    """A training run is estimated to need more than WARN_BYTES of memory (preflight.check_memory)."""


def available_host() -> int | None:
    """Bytes of host memory available now, or None where this platform does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_device() -> int | None:
    """Bytes free on the GPU, or None under the simulator (its arrays are the host's)."""
    free = runtime.device_info()["memory_free_gib"]
    return None if free is None else int(free * 2**30)


def estimate(s) -> dict:
    """{"host" or "device": [(what, bytes, options that set it), ...]} for the run of Settings s
    (fp8lab.training.loop.prepare)."""
    kernels = s.engine == "kernels"
    if s.task == "teacher":
        p = s.d_in * s.d_out
        rows = 9 * s.batch * (s.d_in + s.d_out) * F32 * 3  # a held-out set of 8 batches, a batch, temporaries
        host = [("the weights, the teacher's and the optimizer's state", 32 * p, ("d_in", "d_out")),
                ("the data (9 batches) and its temporaries", rows, ("batch", "d_in", "d_out"))]
        return {"host": host, "device": [("the data and the weights", rows // 3 + 24 * p, ("batch",))]
                if kernels else []}
    cfg = s.cfg
    P = sum(int(np.prod(x)) for x in model.param_shapes(cfg).values())
    C, D, F, L, V = cfg.context, cfg.width, cfg.hidden, cfg.blocks, cfg.vocab
    windows = s.eval_batches * s.batch * 13 * (C + 1)  # int32 ids and targets, and the int64 positions they came from
    host = [("the validation windows", windows, ("eval_batches", "batch"))]
    if kernels:  # device: weights, gradients, moments, transposes and codes; buffers for `batch` windows
        per_param = 24 + (4 if s.moments == "fp32" else 0) + 8  # 8: the two snapshots the EMA is copied from
        per_window = F32 * (L * (8 * D + 11 * F) + 6 * D + 4 * V + 2 * C)
        device = [("the weights, their gradients, AdamW's moments and the GEMMs' copies", per_param * P,
                   MODEL_OPTIONS),
                  (f"the buffers of {s.batch} windows", per_window * s.batch, ("batch",) + MODEL_OPTIONS)]
        host.append(("the EMA and the host copies of the weights", 32 * P, MODEL_OPTIONS))
        return {"host": host, "device": device}
    per_window = F32 * (L * (2 * D + 3 * F) + max(16 * F, 8 * D) + 4 * V + 8 * C + 2 * D)
    host += [("the weights, their gradients, AdamW's moments and the EMA", 32 * P, MODEL_OPTIONS),
             (f"the activations of {s.batch} windows", per_window * s.batch, ("batch",) + MODEL_OPTIONS)]
    return {"host": host, "device": []}


def _gb(n: float) -> str:
    return f"{n / 1e6:.0f} MB" if n < 1e9 else f"{n / 1e9:.1f} GB" if n < 1e12 else f"{n / 1e12:.1f} TB"


def _value(s, name):
    return getattr(s.cfg, name) if name in MODEL_OPTIONS else getattr(s, name)


def check_memory(s, cli: bool = False) -> None:
    """ValueError if the run of Settings s needs more memory than is free (naming the options that set the largest
    part), LargeRunWarning above WARN_BYTES; nothing where the free memory is unknown."""
    parts = estimate(s)
    if runtime.IS_SIM:  # the simulator's device arrays are host arrays
        parts = {"host": parts["host"] + parts["device"], "device": []}
    for where, terms in parts.items():
        if not terms:
            continue
        need = sum(b for _, b, _ in terms)
        what, big, names = max(terms, key=lambda t: t[1])
        changed = [n for n in names if _value(s, n) != s.defaults.get(n)] or list(names[:1])
        said = ", ".join(option(n, _value(s, n), cli) for n in changed)
        lower = " or ".join(option(n, cli=cli) for n in changed)
        have = available_host() if where == "host" else available_device()
        memory = "host" if where == "host" else "GPU"
        if have is not None and need > have:
            raise ValueError(f"{said}: this run needs about {_gb(need)} of {memory} memory ({_gb(big)} for {what}), "
                             f"{_gb(have)} is free: lower {lower}")
        if need > WARN_BYTES:
            warnings.warn(f"{said}: this run needs about {_gb(need)} of {memory} memory ({_gb(big)} for {what})",
                          LargeRunWarning, stacklevel=V.user_stacklevel())


@dataclasses.dataclass(frozen=True)
class Part:
    """One recipe of a comparison: action "train" (from the start), "resume" (from the checkpoint in `resume`) or
    "done" (its checkpoint has reached the steps asked for: `meta` is its verified metadata); `save` the folder to
    save into, or None."""

    recipe: str
    action: str
    save: pathlib.Path | None = None
    resume: pathlib.Path | None = None
    meta: dict | None = None


def comparison(prepared: dict, save=None, resume=None, cli: bool = True) -> list:
    """The plan of a comparison of recipes, [Part, ...], prepared: {recipe name: Settings}, save / resume: the
    folders holding a folder per recipe (train --save DIR writes DIR/RECIPE/). Checked for every recipe before any
    trains: the save folder can be written and holds no checkpoint unless it is the one resumed; each checkpoint to
    resume is whole, of this configuration, and has not passed --steps. Recipes whose checkpoint has reached --steps
    are done; those without one start (a resume folder without any checkpoint is refused, unless it is the save
    folder: --save DIR --resume DIR works from the first run on)."""
    save = None if save is None else pathlib.Path(save)
    resume = None if resume is None else pathlib.Path(resume)
    names = list(prepared)
    if save is not None:
        if save.exists() and not save.is_dir():
            raise ValueError(f"{option('save', save, cli)}: {save} is a file, not a folder")
        checkpoint.check_writable(option("save", save, cli), save)
    if resume is not None:
        if (resume / checkpoint.FILE).is_file():
            raise ValueError(f"{option('resume', resume, cli)} is one recipe's folder (it holds {checkpoint.FILE}): "
                             f"give the folder above it, {option('resume', resume.parent, cli)}")
        same = save is not None and save.resolve() == resume.resolve()  # the documented way, from the first run on
        if not same and not any((resume / r / checkpoint.FILE).is_file() for r in names):
            raise ValueError(f"{option('resume', resume, cli)} holds no checkpoint of {', '.join(names)} (train "
                             f"--save DIR writes DIR/RECIPE/{checkpoint.FILE})")
    plan = []
    for r, s in prepared.items():
        sd = None if save is None else save / r
        rd = None if resume is None or not (resume / r / checkpoint.FILE).is_file() else resume / r
        if sd is not None:
            if sd.exists() and not sd.is_dir():
                raise ValueError(f"{option('save', save, cli)}: {sd} is a file, not a folder")
            if (sd / checkpoint.FILE).exists() and (rd is None or sd.resolve() != rd.resolve()):
                raise ValueError(f"{option('save', save, cli)}: {sd} already holds a checkpoint; add "
                                 f"{option('resume', save, cli)} to continue that comparison (finished recipes are "
                                 "kept), or choose another folder")
        if rd is None:
            plan.append(Part(r, "train", sd))
            continue
        _, meta = checkpoint.read(rd / checkpoint.FILE)
        differ = checkpoint.differences(meta, s.identity(), cli)
        if differ:
            raise ValueError(f"{option('resume', resume, cli)}: {rd} holds a run of another configuration ("
                             + "; ".join(differ) + ")")
        if meta["step"] > s.steps:
            raise ValueError(f"{option('steps', s.steps, cli)}: {rd} has done {meta['step']} steps already (give "
                             f"{option('steps', meta['step'], cli)} or more)")
        plan.append(Part(r, "done" if meta["step"] == s.steps else "resume", sd, rd, meta))
    return plan
