"""The language model's checkpoints: a run resumed (in process, or after a kill) continues to the same losses,
a checkpoint refuses another configuration and is never overwritten, `fp8lab generate` samples from one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import fp8lab
from fp8lab.training import loop as T

from _training import SMALL, cli


@pytest.mark.parametrize("engine", [pytest.param(e, marks=[pytest.mark.slow] if e == "kernels" else [])
                                    for e in T.ENGINES])
def test_chars_resume_continues_to_the_same_losses(tmp_path, engine):
    kw = dict(SMALL, engine=engine, progress=False, eval_every=1)
    whole = fp8lab.train("fp8-deepseek", steps=3, **kw)
    # a run stopped after step 2 (its checkpoint written at every validation), then resumed to step 3
    fp8lab.train("fp8-deepseek", steps=2, save=tmp_path / "run", **kw)
    resumed = fp8lab.train("fp8-deepseek", steps=3, resume=tmp_path / "run", save=tmp_path / "run", **kw)
    assert resumed.loss == whole.loss and resumed.val_loss == whole.val_loss
    assert resumed.ema_loss == whole.ema_loss
    from fp8lab.training import checkpoint, model as lm

    cfg, recipe, w = checkpoint.model_of(tmp_path / "run")  # either engine's layout
    assert recipe == "fp8-deepseek" and cfg.context == SMALL["context"]
    assert {k: v.shape for k, v in w.items()} == lm.param_shapes(cfg) and all(np.isfinite(v).all() for v in w.values())


def test_checkpoint_is_refused_by_another_configuration_and_never_overwritten(tmp_path):
    kw = dict(SMALL, engine="reference", progress=False)
    fp8lab.train("fp32", steps=1, save=tmp_path / "a", **kw)
    before = (tmp_path / "a" / "checkpoint.npz").read_bytes()
    with pytest.raises(ValueError, match="already holds a checkpoint"):
        fp8lab.train("fp32", steps=1, save=tmp_path / "a", **kw)
    with pytest.raises(ValueError, match=r"another configuration \(recipe: checkpoint 'fp32', this run 'bf16'"):
        fp8lab.train("bf16", steps=2, resume=tmp_path / "a", **kw)
    with pytest.raises(ValueError, match="batch: checkpoint 8"):
        fp8lab.train("fp32", steps=2, resume=tmp_path / "a", **{**kw, "batch": 4})
    with pytest.raises(ValueError, match="steps must be more than the 1 steps"):
        fp8lab.train("fp32", steps=1, resume=tmp_path / "a", **kw)
    with pytest.raises(ValueError, match="holds no checkpoint.npz"):
        fp8lab.train("fp32", steps=2, resume=tmp_path / "b", **kw)
    assert (tmp_path / "a" / "checkpoint.npz").read_bytes() == before  # nothing lost
    with pytest.raises(ValueError, match="save: only for task='chars'"):
        fp8lab.train("fp32", steps=1, save=tmp_path / "c", progress=False)


def test_chars_run_killed_mid_way_resumes_to_the_same_losses(tmp_path):
    import signal
    import time

    from fp8lab.training import checkpoint

    args = ["train", "--task", "chars", "--recipe", "fp32", "--no-baseline", "--engine", "reference", "--batch", "8",
            "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1", "--eval-every", "1", "--no-plot",
            "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "fp8lab.cli", *args, "--steps", "100000", "--save",
                             str(tmp_path / "run")], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    ckpt = tmp_path / "run" / "fp32" / "checkpoint.npz"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            with np.load(ckpt) as z:
                if json.loads(bytes(z["__meta__"]).decode())["step"] >= 3:
                    break
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)  # mid-way: possibly while it writes the next checkpoint
    proc.wait()
    _, meta = checkpoint.load(tmp_path / "run" / "fp32", {})
    done = meta["step"]
    assert done >= 3
    r = cli(*args, "--steps", str(done + 2), "--resume", str(tmp_path / "run"), "--json", str(tmp_path / "r.json"),
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    resumed = json.loads((tmp_path / "r.json").read_text())[0]
    whole = fp8lab.train("fp32", engine="reference", steps=done + 2, progress=False, **{**SMALL, "eval_every": 1})
    assert resumed["loss"] == whole.loss and resumed["val_loss"] == whole.val_loss


def test_generate_samples_text_from_a_saved_model(tmp_path):
    fp8lab.train("fp32", steps=2, engine="reference", progress=False, save=tmp_path / "lm", **SMALL)
    r = cli("generate", "--from", str(tmp_path / "lm"), "--prompt", "ROMEO:", "--chars", "40", "--seed", "3")
    assert r.returncode == 0, r.stderr
    text = r.stdout.rstrip("\n")
    assert text.startswith("ROMEO:") and len(text) >= len("ROMEO:") + 30  # 40 sampled characters (some may be \n)
    again = cli("generate", "--from", str(tmp_path / "lm"), "--prompt", "ROMEO:", "--chars", "40", "--seed", "3")
    assert again.stdout == r.stdout  # the seed fixes the sample
    bad = cli("generate", "--from", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and "holds no checkpoint.npz" in bad.stderr
    bad = cli("generate", "--from", str(tmp_path / "lm"), "--prompt", "naïve")
    assert bad.returncode == 2 and "outside the corpus vocabulary" in bad.stderr
