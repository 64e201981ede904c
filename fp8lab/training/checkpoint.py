"""Training checkpoints of the language model (`fl.train(task="chars", save=DIR, resume=DIR)`), NumPy only.

One file, DIR/checkpoint.npz: the arrays of the run (master weights, AdamW's moments and step count t, the EMA) and,
as JSON in the array `__meta__`, what makes the run continue exactly: its configuration, the step reached, the state
of the random stream that draws the batches, the history so far, and the SHA-256 of each array's bytes.

Writing (`save`): to DIR/checkpoint.npz.tmp, flushed and fsynced, then renamed over the previous file (os.replace is
atomic) and the folder fsynced where the platform allows: a run killed at any moment leaves the previous checkpoint
whole, and the new one replaces it only once complete.

Reading (`load`, `model_of`) trusts nothing: the file must be a complete .npz archive of plain arrays (nothing is
unpickled), hold the metadata, every array that the run's engine and model need at its shape and dtype and no other
array, each with the checksum written beside it, and come from a run of the same settings. Anything else raises a
CheckpointError (a ValueError) of one line naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import zipfile

import numpy as np

from .. import _validate as V
from . import model as lm

FILE = "checkpoint.npz"
FORMAT = 2  # 2: with checksums (format 1, before them, is refused: nothing in it can be verified)
ENGINES = ("kernels", "reference")  # the engines that save (engine="torch" keeps no checkpoints)
GROUPS = ("params", "m", "v", "ema")  # master weights, AdamW's moments, the EMA
# options the command line has (`fp8lab train --batch ...`): messages for it name them so
FLAGS = ("recipe", "engine", "steps", "seed", "batch", "lr", "optimizer", "d_in", "d_out", "noise", "context", "embed",
         "hidden", "blocks", "moments", "eval_every", "eval_batches", "outliers", "save", "resume", "from")
_NO = object()


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted: not a checkpoint, damaged, or not of this run's shapes."""


def option(name: str, value=_NO, cli: bool = False) -> str:
    """How a message names an option: fl.train's words (batch=8, save='runs/lm') or, with cli=True, the command
    line's (--batch 8, --save runs/lm; a name the command line has no option for stays a name)."""
    if cli and name in FLAGS:
        flag = "--" + name.replace("_", "-")
        return flag if value is _NO else f"{flag} {value}"
    if value is _NO:
        return name
    return f"{name}={str(value)!r}" if isinstance(value, (str, os.PathLike)) else f"{name}={value!r}"


def _dir(name: str, path) -> pathlib.Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a folder path (str or os.PathLike), got {V.describe(path)}")
    return pathlib.Path(path)


def check_writable(what: str, d: pathlib.Path) -> None:
    """ValueError `what: ...` unless d is a folder this process can write in, or one it can create; leaves nothing
    behind (a folder made to try is removed again)."""
    made, p = [], d
    while not os.path.lexists(p) and p != p.parent:
        made.append(p)
        p = p.parent
    if not p.is_dir():
        raise ValueError(f"{what}: {p} is a file, not a folder")
    try:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"{what}: cannot create {d} ({e.strerror})") from None
        probe = d / f".fp8lab-write-test-{os.getpid()}"
        try:
            probe.open("wb").close()
            probe.unlink()
        except OSError as e:
            raise ValueError(f"{what}: cannot write in {d} ({e.strerror})") from None
    finally:
        for m in made:  # deepest first
            try:
                m.rmdir()
            except OSError:
                pass


def check_save_dir(name: str, path, same_as=None, cli: bool = False) -> pathlib.Path:
    """The folder to save into, checked before training: a folder (or one that can be made) this process can write
    in, holding no other run's checkpoint (nothing written is overwritten without being asked: resume from it, or
    choose another folder), unless it is the folder resumed from."""
    d = _dir(name, path)
    what = option(name, d, cli)
    if d.exists() and not d.is_dir():
        raise ValueError(f"{what}: {d} is a file, not a folder")
    check_writable(what, d)
    if (d / FILE).exists() and (same_as is None or _dir("resume", same_as).resolve() != d.resolve()):
        raise ValueError(f"{what} already holds a checkpoint; pass {option('resume', d, cli)} to continue that run, "
                         "or save into another folder")
    return d


def recipe_folders(d: pathlib.Path) -> list[str]:
    """The names of d's folders that hold a checkpoint (train --save DIR writes DIR/RECIPE/), sorted."""
    try:
        return sorted(p.name for p in d.iterdir() if (p / FILE).is_file())
    except OSError:
        return []


def check_resume_dir(name: str, path, cli: bool = False) -> pathlib.Path:
    """The folder to resume (or read) from: it must hold checkpoint.npz. If it holds recipe folders instead (the
    folder given to train --save), they are named."""
    d = _dir(name, path)
    if (d / FILE).is_file():
        return d
    inside = recipe_folders(d) if d.is_dir() else []
    if inside:
        pick = next((r for r in inside if r not in ("fp32", "bf16")), inside[0])
        raise ValueError(f"{option(name, d, cli)} holds no {FILE}, but the runs of {', '.join(inside)}: give "
                         f"{option(name, d / pick, cli)}")
    where = "train --save DIR" if cli else "train(..., save=DIR)"
    raise ValueError(f"{option(name, d, cli)} holds no {FILE} (written by {where})")


def layout(meta: dict) -> dict:
    """{array name: (shape, dtype)} of a checkpoint of the run `meta` describes (its engine, model and moments): the
    kernel engine saves flat buffers (moments in bfloat16 as uint16 bit patterns, or float32), the reference engine
    an array per parameter (its moments float32, bfloat16-rounded or not)."""
    m = dict(meta["model"])
    moments = m.pop("moments")
    shapes = lm.param_shapes(lm.Config(**m))
    f32 = np.dtype(np.float32)
    out = {}
    if meta["engine"] == "kernels":
        n = int(sum(int(np.prod(s)) for s in shapes.values()))
        mom = np.dtype(np.uint16 if moments == "bf16" else np.float32)
        out.update(params=((n,), f32), m=((n,), mom), v=((n,), mom), ema=((n,), f32))
    else:
        out.update({f"{g}/{k}": (tuple(s), f32) for g in GROUPS for k, s in shapes.items()})
    out["t"] = ((), np.dtype(np.int64))
    return out


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).data).hexdigest()


def _fsync_dir(d: pathlib.Path) -> None:
    """Make the rename durable; not every platform can open a folder (Windows cannot), and that is no error."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save(folder, arrays: dict, meta: dict) -> pathlib.Path:
    """Write arrays (name -> NumPy array) and meta (JSON-serializable) to folder/checkpoint.npz: a temporary file
    first, fsynced, then renamed over the previous checkpoint (which stays whole until then)."""
    d = pathlib.Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(a) for k, a in arrays.items()}
    meta = dict(meta, format=FORMAT, sha256={k: _digest(a) for k, a in arrays.items()})
    tmp = d / (FILE + ".tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, __meta__=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / FILE)
    except BaseException:  # an error or Ctrl-C while writing: the previous checkpoint is untouched
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(d)
    return d / FILE


def _read_arrays(path: pathlib.Path) -> dict:
    """{name: array} of an .npz file, plain arrays only; CheckpointError for anything that is not one, whole."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror})") from None
    if size == 0:
        raise CheckpointError(f"{path}: empty (0 bytes), not a checkpoint")
    if head != b"PK\x03\x04":
        raise CheckpointError(f"{path}: not a checkpoint (not an .npz archive)")
    out, name = {}, None
    try:
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if not name.endswith(".npy"):
                    raise CheckpointError(f"{path}: holds {name!r}, not an array: not a checkpoint")
                with z.open(name) as f:
                    out[name[:-4]] = np.lib.format.read_array(f, allow_pickle=False)
    except CheckpointError:
        raise
    except zipfile.BadZipFile as e:
        if name is None:  # no readable directory at the end of the file
            raise CheckpointError(f"{path}: truncated (the .npz archive is incomplete)") from None
        if "CRC" in str(e):
            raise CheckpointError(f"{path}: damaged: the bytes of {name[:-4]} changed after it was written (the "
                                  "archive's CRC check fails)") from None
        raise CheckpointError(f"{path}: damaged ({name}: {e})") from None
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise CheckpointError(f"{path}: {name[:-4]!r} is an object array (pickled Python objects, refused: "
                                  "loading them could run code)") from None
        raise CheckpointError(f"{path}: damaged ({name}: {e})") from None
    except Exception as e:  # whatever else bytes that are not an archive make zipfile or NumPy raise
        raise CheckpointError(f"{path}: damaged ({name}: {type(e).__name__}: {e})") from None
    return out


def _read_meta(path: pathlib.Path, arrays: dict) -> dict:
    raw = arrays.pop("__meta__", None)
    if raw is None:
        raise CheckpointError(f"{path}: no metadata (__meta__), not a checkpoint of fp8lab")
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise CheckpointError(f"{path}: its metadata is {raw.dtype} {raw.shape}, not JSON bytes")
    try:
        meta = json.loads(raw.tobytes().decode())
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: its metadata is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: its metadata is not valid JSON ({e.msg}, character {e.pos})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: its metadata is a JSON {type(meta).__name__}, not an object")
    if "sha256" not in meta or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: no checksums in its metadata (a checkpoint of an older fp8lab, or not of "
                              f"fp8lab): it cannot be verified")
    kinds = dict(recipe=str, engine=str, model=dict, step=int, rng=dict, loss=list, val_loss=list,
                 step_seconds=list, sha256=dict)
    for k, kind in kinds.items():
        if not isinstance(meta.get(k), kind) or isinstance(meta.get(k), bool):
            problem = "missing" if k not in meta else f"not a {kind.__name__}"
            raise CheckpointError(f"{path}: its metadata's {k!r} is {problem}")
    if meta["engine"] not in ENGINES:
        raise CheckpointError(f"{path}: its metadata's engine is {meta['engine']!r}, not one of {ENGINES}")
    return meta


def read(path) -> tuple[dict, dict]:
    """(arrays, meta) of the checkpoint file at path, verified (see the module docstring); CheckpointError if not."""
    path = pathlib.Path(path)
    arrays = _read_arrays(path)
    meta = _read_meta(path, arrays)
    try:
        want = layout(meta)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: its metadata's model is not a model ({e})") from None
    for k, (shape, dtype) in want.items():
        if k not in arrays:
            raise CheckpointError(f"{path}: the array {k!r} is missing")
        a = arrays[k]
        if a.shape != shape:
            raise CheckpointError(f"{path}: {k} has shape {a.shape}, not {shape} (the model it says it holds)")
        if a.dtype != dtype:
            raise CheckpointError(f"{path}: {k} has dtype {a.dtype}, not {dtype}")
    extra = sorted(set(arrays) - set(want))
    if extra:
        raise CheckpointError(f"{path}: holds arrays no run of it has: {', '.join(extra)}")
    for k, a in arrays.items():
        if meta["sha256"].get(k) != _digest(a):
            raise CheckpointError(f"{path}: checksum mismatch in {k} (its bytes changed after it was written)")
    step = meta["step"]
    if step < 1 or int(arrays["t"]) != step or len(meta["loss"]) != step or len(meta["step_seconds"]) != step:
        raise CheckpointError(f"{path}: inconsistent: step {step}, AdamW's t {int(arrays['t'])}, "
                              f"{len(meta['loss'])} losses")
    return arrays, meta


def peek(folder) -> dict | None:
    """The metadata of folder/checkpoint.npz without reading or verifying its arrays (what step a run saved last),
    or None if there is none readable."""
    try:
        with zipfile.ZipFile(pathlib.Path(folder) / FILE) as z, z.open("__meta__.npy") as f:
            return json.loads(np.lib.format.read_array(f, allow_pickle=False).tobytes().decode())
    except Exception:  # anything unreadable: no checkpoint to point to
        return None


def differences(meta: dict, expect: dict, cli: bool = False) -> list[str]:
    """What the checkpoint's run (meta) had otherwise than `expect` ({setting: value}, the model's sizes one by
    one), as "batch: checkpoint 8, this run 4"."""
    def flat(d):
        out = {k: v for k, v in d.items() if k != "model"}
        out.update(d.get("model") or {})
        return out

    got = flat(meta)
    want = json.loads(json.dumps(flat(expect) if "model" in expect else expect))
    return [f"{option(k, cli=cli)}: checkpoint {got.get(k)!r}, this run {v!r}" for k, v in want.items()
            if v != got.get(k)]


def load(folder, expect: dict, cli: bool = False, name: str = "resume") -> tuple[dict, dict]:
    """(arrays, meta) of folder/checkpoint.npz, verified (CheckpointError naming the file if it cannot be trusted);
    ValueError naming every setting in `expect` that the checkpoint's run had otherwise (a checkpoint from another
    configuration cannot continue this one)."""
    arrays, meta = read(pathlib.Path(folder) / FILE)
    differ = differences(meta, expect, cli)
    if differ:
        raise ValueError(f"{option(name, folder, cli)} holds a checkpoint of another configuration ("
                         + "; ".join(differ) + ")")
    return arrays, meta


def weights(arrays: dict, meta: dict) -> tuple:
    """(fp8lab.training.model.Config, recipe, {name: master weights}) of a checkpoint read by `read` (either
    engine's layout)."""
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


def model_of(folder, cli: bool = False, name: str = "folder") -> tuple:
    """(fp8lab.training.model.Config, recipe, {name: master weights}) of the run saved in folder (either engine's
    layout), verified like `load`."""
    folder = check_resume_dir(name, folder, cli)
    return weights(*read(folder / FILE))
