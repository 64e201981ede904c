"""Training checkpoints of the language model (`fl.train(task="chars", save=DIR, resume=DIR)`), NumPy only.

One file, DIR/checkpoint.npz: the arrays of the run (master weights, AdamW's moments and step count, the EMA) and,
as JSON, what makes the run continue exactly: its configuration, the step reached, the state of the random stream
that draws the batches, and the history so far. It is written to a temporary file in DIR and renamed over the old
one (os.replace is atomic), so a run killed while saving leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from .. import _validate as V
from . import model as lm

FILE = "checkpoint.npz"


def _dir(name: str, path) -> pathlib.Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str or os.PathLike), got {V.describe(path)}")
    return pathlib.Path(path)


def check_save_dir(name: str, path, same_as=None) -> pathlib.Path:
    """The folder to save into: refused if it holds another run's checkpoint (nothing written is overwritten without
    being asked: resume from it, or choose another folder), unless it is the folder resumed from."""
    d = _dir(name, path)
    if d.exists() and not d.is_dir():
        raise ValueError(f"{name} must be a folder, got the file {str(d)!r}")
    if (d / FILE).exists() and (same_as is None or _dir("resume", same_as).resolve() != d.resolve()):
        raise ValueError(f"{name}={str(d)!r} already holds a checkpoint; pass resume={str(d)!r} to continue that run, "
                         "or save into another folder")
    return d


def check_resume_dir(name: str, path) -> pathlib.Path:
    d = _dir(name, path)
    if not (d / FILE).is_file():
        raise ValueError(f"{name}={str(d)!r} holds no {FILE} (written by train(..., save=DIR))")
    return d


def save(folder, arrays: dict, meta: dict) -> pathlib.Path:
    """Write arrays (name -> NumPy array) and meta (JSON-serializable) to folder/checkpoint.npz atomically."""
    d = pathlib.Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (FILE + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, d / FILE)
    return d / FILE


def load(folder, expect: dict) -> tuple[dict, dict]:
    """(arrays, meta) of folder/checkpoint.npz; ValueError naming every setting in `expect` that the checkpoint's run
    had otherwise (a checkpoint from another configuration cannot continue this one)."""
    path = pathlib.Path(folder) / FILE
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
        meta = json.loads(bytes(z["__meta__"]).decode())
    differ = [f"{k}: checkpoint {meta.get(k)!r}, this run {v!r}" for k, v in expect.items()
              if json.loads(json.dumps(v)) != meta.get(k)]
    if differ:
        raise ValueError(f"resume={str(folder)!r} holds a checkpoint of another configuration (" + "; ".join(differ)
                         + ")")
    return arrays, meta


def model_of(folder) -> tuple:
    """(fp8lab.training.model.Config, recipe, {name: master weights}) of the run saved in folder (either engine's
    layout)."""
    folder = check_resume_dir("folder", folder)
    arrays, meta = load(folder, {})
    m = dict(meta["model"])
    m.pop("moments", None)
    cfg = lm.Config(**m)
    shapes = lm.param_shapes(cfg)
    if "params" in arrays:  # the kernels engine: one flat buffer
        flat, out, o = arrays["params"], {}, 0
        for k, shape in shapes.items():
            n = int(np.prod(shape))
            out[k] = flat[o:o + n].reshape(shape)
            o += n
    else:
        out = {k: arrays[f"params/{k}"] for k in shapes}
    return cfg, meta["recipe"], out
