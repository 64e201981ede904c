"""The language model's checkpoints: a run resumed (in process, or after a kill) continues to the same losses,
a checkpoint refuses another configuration and is never overwritten, `fp8lab generate` samples from one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fp8lab
from fp8lab.training import loop as T

from _training import ENGINES, SMALL, cli


@pytest.mark.parametrize("engine", [pytest.param(e, marks=[pytest.mark.slow] if e == "kernels" else [])
                                    for e in ENGINES])
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


# ------------------------------------------------------- a stopped comparison finished, Ctrl-C, generate

CLI_CHARS = ["--task", "chars", "--engine", "reference", "--batch", "8", "--context", "2", "--embed", "16", "--hidden",
             "16", "--blocks", "1", "--eval-every", "1", "--no-plot", "--no-progress"]


REF1 = dict(SMALL, engine="reference", progress=False, eval_every=1)


def _table(stdout: str) -> list:
    """The rows of the language model's table: recipe, moments, losses, step time."""
    import re

    return [line for line in stdout.splitlines() if re.match(r"(fp32|bf16|fp8-\S+) +(fp32|bf16) ", line)]


def test_cli_resume_finishes_an_interrupted_comparison(tmp_path):
    """The README's comparison stopped during bf16 (fp32 finished, bf16 at step 2 of 3): `--save lm --resume lm`
    reads fp32's row from its checkpoint, continues bf16 and starts fp8-deepseek; every row equals an uninterrupted
    comparison's. Without --resume it is refused before anything trains, in command-line words."""
    whole = {r: fp8lab.train(r, steps=3, **REF1) for r in ("fp32", "bf16", "fp8-deepseek")}
    fp8lab.train("fp32", steps=3, save=tmp_path / "lm" / "fp32", **REF1)
    fp8lab.train("bf16", steps=2, save=tmp_path / "lm" / "bf16", **REF1)
    args = ["train", *CLI_CHARS, "--recipe", "fp8-deepseek", "--save", "lm"]
    r = cli(*args, "--steps", "3", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == ("fp8lab train: error: --save lm: lm/fp32 already holds a "
                                                      "checkpoint; add --resume lm to continue that comparison "
                                                      "(finished recipes are kept), or choose another folder")
    assert not (tmp_path / "lm" / "fp8-deepseek").exists()
    r = cli(*args, "--steps", "3", "--resume", "lm", "--json", "h.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fp32: already trained to step 3 in lm/fp32 (its row is read from there)" in r.stdout
    hs = json.loads((tmp_path / "h.json").read_text())
    assert [h["recipe"] for h in hs] == ["fp32", "bf16", "fp8-deepseek"]
    for h in hs:
        w = whole[h["recipe"]]
        assert (h["loss"], h["val_loss"], h["eval_loss"], h["ema_loss"]) == (w.loss, w.val_loss, w.eval_loss,
                                                                             w.ema_loss), h["recipe"]
    again = cli(*args, "--steps", "3", "--resume", "lm", cwd=tmp_path)  # all finished: nothing trains
    assert again.returncode == 0 and again.stdout.count("already trained to step 3") == 3, again.stderr
    assert _table(again.stdout) == _table(r.stdout) and len(_table(r.stdout)) == 3
    fewer = cli(*args, "--steps", "2", "--resume", "lm", cwd=tmp_path)
    assert fewer.returncode == 2 and fewer.stderr.strip().endswith(
        "--steps 2: lm/fp32 has done 3 steps already (give --steps 3 or more)")
    for bad in (r, fewer):
        assert "PosixPath" not in bad.stderr and "resume='" not in bad.stderr


def test_cli_baselines_after_a_no_baseline_run(tmp_path):
    """--no-baseline first, the baselines after: the finished recipe's folder used to stop the run after both
    baselines had trained; now it is named before, and --resume keeps the finished recipe."""
    args = ["train", *CLI_CHARS, "--recipe", "fp8-deepseek", "--steps", "3", "--save", "nb"]
    first = cli(*args, "--no-baseline", "--resume", "nb", cwd=tmp_path)  # --save DIR --resume DIR from the start
    assert first.returncode == 0 and len(_table(first.stdout)) == 1, first.stderr
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and "--save nb: nb/fp8-deepseek already holds a checkpoint; add --resume nb" in r.stderr
    assert sorted(p.name for p in (tmp_path / "nb").iterdir()) == ["fp8-deepseek"]  # nothing trained
    r = cli(*args, "--resume", "nb", cwd=tmp_path)
    assert r.returncode == 0 and "fp8-deepseek: already trained to step 3" in r.stdout, r.stderr
    assert len(_table(r.stdout)) == 3 and sorted(p.name for p in (tmp_path / "nb").iterdir()) == [
        "bf16", "fp32", "fp8-deepseek"]
    one = cli("train", *CLI_CHARS, "--recipe", "fp8-deepseek", "--steps", "3", "--resume", "nb/fp32", cwd=tmp_path)
    assert one.returncode == 2 and one.stderr.strip().endswith(
        "--resume nb/fp32 is one recipe's folder (it holds checkpoint.npz): give the folder above it, --resume nb")
    other = cli(*args, "--resume", "nb", "--batch", "4", cwd=tmp_path)
    assert other.returncode == 2 and other.stderr.strip().endswith(
        "--resume nb: nb/fp32 holds a run of another configuration (--batch: checkpoint 8, this run 4)")


def test_cli_ctrl_c_names_the_last_checkpoint_and_the_command_that_resumes_it(tmp_path):
    import shlex
    import signal
    import time

    from fp8lab.training import checkpoint

    args = ["train", *CLI_CHARS, "--recipe", "fp32", "--no-baseline", "--steps", "100000", "--save", "runs/lm"]
    proc = subprocess.Popen([sys.executable, "-m", "fp8lab.cli", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "MPLBACKEND": "Agg"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # Python's own handler
    ckpt = tmp_path / "runs" / "lm" / "fp32" / "checkpoint.npz"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not ckpt.exists():
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    step = checkpoint.read(ckpt)[1]["step"]
    cmd = "fp8lab " + shlex.join(args + ["--resume", "runs/lm"])
    where = ckpt.relative_to(tmp_path)
    assert err.splitlines() == [f"fp8lab train: interrupted during fp32; its last checkpoint is {where} (step {step} "
                                f"of 100000): {cmd}"], err
    # the command printed continues the run (here to one step more) as if it had not been interrupted
    argv = shlex.split(cmd)[1:]
    argv[argv.index("100000")] = str(step + 1)
    r = cli(*argv, "--json", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    whole = fp8lab.train("fp32", steps=step + 1, **REF1)
    assert json.loads((tmp_path / "r.json").read_text())[0]["loss"] == whole.loss


def test_ctrl_c_without_a_checkpoint_says_nothing_was_saved():
    import argparse

    from fp8lab import cli
    from fp8lab.training import loop, preflight

    prepared = {"fp32": loop.prepare("fp32", **REF1)}
    part = preflight.Part("fp32", "train")
    chars = argparse.Namespace(task="chars", save=None, argv=["train"])
    assert cli._interrupted(chars, part, prepared) == ("fp8lab train: interrupted during fp32; nothing was saved (with "
                                                       "--save DIR, --resume DIR continues a run)")
    teacher_run = argparse.Namespace(task="teacher", save=None, argv=["train"])
    assert cli._interrupted(teacher_run, part, prepared).endswith("nothing was saved (the teacher task keeps no "
                                                                  "checkpoints)")
    early = argparse.Namespace(task="chars", save="runs", argv=["train", "--task", "chars", "--save", "runs"])
    assert cli._interrupted(early, preflight.Part("fp32", "train", Path("runs/fp32")), prepared) == (
        "fp8lab train: interrupted during fp32, before its first checkpoint (one every 1 steps); the recipes finished "
        "are kept: fp8lab train --task chars --save runs --resume runs")


def test_cli_says_when_it_replaces_the_loss_plot(tmp_path):
    """runs/train_loss.png used to be overwritten silently: it is replaced, and the output says so."""
    args = ["train", "--engine", "reference", "--no-baseline", "--recipe", "fp32", "--steps", "2", "--no-progress"]
    first = cli(*args, cwd=tmp_path)
    assert first.returncode == 0 and first.stdout.rstrip().endswith("wrote runs/train_loss.png"), first.stderr
    second = cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.rstrip().endswith("wrote runs/train_loss.png (replacing the file that was there)")


def test_generate_lists_the_recipe_folders_and_warns_when_the_model_is_barely_trained(tmp_path):
    for r in ("fp32", "fp8-deepseek"):
        fp8lab.train(r, steps=2, save=tmp_path / "lm" / r, **REF1)
    r = cli("generate", "--from", "lm", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == ("fp8lab generate: error: --from lm holds no checkpoint.npz, but "
                                                      "the runs of fp32, fp8-deepseek: give --from lm/fp8-deepseek")
    r = cli("generate", "--from", "lm/fp8-deepseek", "--chars", "20", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ROMEO:"), r.stderr
    (warning,) = r.stderr.strip().splitlines()
    assert warning.startswith("fp8lab generate: warning: lm/fp8-deepseek is barely trained (2 steps; validation ")
    assert "no better than letter frequencies alone" in warning and warning.endswith("train longer (--steps)")
    fp8lab.train("fp32", steps=100, save=tmp_path / "trained", **{**REF1, "batch": 64, "eval_every": 100, "lr": 1e-2})
    r = cli("generate", "--from", "trained", "--chars", "20", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = cli("generate", "--from", "trained", "--seed", "-1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "fp8lab generate: error: --seed must be a non-negative int, got -1"
