"""The training program end to end: kernels vs the NumPy reference, FP8 vs FP32, divergence, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fp8lab
from fp8lab.device import runtime

from fp8lab.training import loop as T
from fp8lab.training import teacher

ENGINES = ("kernels", "reference")  # the two that must agree step by step


@pytest.fixture(scope="module")
def runs():
    """Each recipe once with each engine, at the backend's default sizes (seconds under the simulator)."""
    return {(r, e): fp8lab.train(r, engine=e, progress=False) for r in T.RECIPES for e in ENGINES}


@pytest.mark.parametrize("recipe", T.RECIPES)
def test_kernels_follow_the_reference_curve(runs, recipe):
    k, ref = runs[recipe, "kernels"], runs[recipe, "reference"]
    assert len(k.loss) == len(ref.loss) == k.steps
    assert all(isinstance(v, float) for v in k.loss)
    rel = np.abs(np.array(k.loss) - ref.loss) / np.array(ref.loss)
    assert rel.max() < fp8lab.RECIPES[recipe].reference_rtol, f"max relative difference {rel.max():.2e} at step {rel.argmax() + 1}"


@pytest.mark.parametrize("engine", ENGINES)
def test_loss_falls_and_fp8_stays_within_5_percent_of_fp32(runs, engine):
    h32, h8 = runs["fp32", engine], runs["fp8-tensor", engine]
    for h in (h32, h8):
        assert h.final_loss < 0.6 * h.loss[0], f"{h.recipe}: loss did not fall ({h.loss[0]:.3f} -> {h.final_loss:.3f})"
        assert h.final_loss > 0.9 * h.floor  # cannot beat the noise for long
        assert np.isfinite(h.eval_loss) and np.isfinite(h.ema_loss)
    assert abs(h8.final_loss - h32.final_loss) / h32.final_loss < 0.05


def test_history_serializes(runs, tmp_path):
    h = runs["fp8-tensor", "reference"]
    path = tmp_path / "h.json"
    h.save_json(path)
    d = json.loads(path.read_text())
    assert d["loss"] == h.loss and d["recipe"] == "fp8-tensor" and d["floor"] == h.noise**2


def test_plot_losses(runs, tmp_path):
    from fp8lab.course.plotting import plot_losses

    fig = plot_losses([runs["fp32", "kernels"], runs["fp8-tensor", "kernels"]], path=tmp_path / "loss.png")
    assert (tmp_path / "loss.png").stat().st_size > 1000
    assert len(fig.axes[0].lines) == 3  # two curves and the floor


@pytest.mark.parametrize("engine", ENGINES)
def test_nan_stops_training_naming_the_step(monkeypatch, engine):
    calls = {"n": 0}
    orig = teacher.Data.next

    def next_with_nan(self):
        calls["n"] += 1
        x, t = orig(self)
        if calls["n"] == 2:
            x[0, 0] = np.nan
        return x, t

    monkeypatch.setattr(teacher.Data, "next", next_with_nan)
    with pytest.raises(fp8lab.TrainingDiverged, match="at step 2 of 3"):
        fp8lab.train("fp8-tensor", steps=3, engine=engine, progress=False)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(recipe="fp16"), ValueError, "recipe must be one of"),
        (dict(recipe=8), TypeError, "recipe must be one of"),
        (dict(steps=0), ValueError, "steps must be a positive int"),
        (dict(steps=2.5), TypeError, "steps must be a positive int"),
        (dict(batch=-1), ValueError, "batch must be"),
        (dict(lr=float("nan")), ValueError, "lr must be a positive finite number"),
        (dict(engine="jax"), ValueError, "engine must be one of"),
        (dict(engine="torch"), ValueError, "engine='torch' trains task='chars'"),
        (dict(recipe="fp8-deepseek", task="chars", engine="torch"), ValueError, "engine='torch' runs recipes whose GEMMs"),
        (dict(optimizer="lion"), ValueError, "optimizer must be one of"),
        (dict(seed=-3), ValueError, "seed must be a non-negative int"),
        (dict(ema_decay=1.0), ValueError, "ema_decay must be a number in"),
        (dict(noise=0), ValueError, "noise must be a positive"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fp8lab.train(**{"steps": 2, "progress": False, **kwargs})


def test_sgd_runs():
    def run(steps=3, lr=0.1, optimizer="sgd", engine="reference"):  # the simulator's small task on any backend
        return fp8lab.train("fp32", steps=steps, optimizer=optimizer, lr=lr, engine=engine, progress=False,
                            batch=8, d_in=32, d_out=16)

    h, k = run(), run(engine="kernels")
    assert len(h.loss) == len(k.loss) == 3 and np.isfinite(h.loss).all() and np.isfinite(k.loss).all()
    # the kernels' SGD step follows the reference engine's
    rel = np.abs(np.array(k.loss) - h.loss) / np.array(h.loss)
    assert rel.max() < fp8lab.RECIPES["fp32"].reference_rtol, f"max relative difference {rel.max():.2e}"
    # the optimizer is SGD, not Adam: the same first loss (same batch, same initial weights), then not
    adam = run(optimizer="adam")
    assert h.loss[0] == adam.loss[0] and h.loss[1] != adam.loss[1] and h.loss[2] != adam.loss[2]
    # and it learns: the held-out loss falls with every step from the initial weights' (lr ~ 0)
    initial = run(steps=1, lr=1e-12).eval_loss
    assert h.eval_loss < run(steps=2).eval_loss < run(steps=1).eval_loss < initial


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fp8lab.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env={**os.environ, "MPLBACKEND": "Agg"})


def test_cli_info():
    r = _cli("info")
    assert r.returncode == 0, r.stderr
    assert "backend" in r.stdout and runtime.backend in r.stdout


def test_cli_train_prints_both_losses_and_writes_plot_and_json(tmp_path):
    r = _cli("train", "--recipe", "fp8-tensor", "--steps", "3", "--plot", str(tmp_path / "p.png"),
             "--json", str(tmp_path / "h.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fp32" in r.stdout and "fp8-tensor" in r.stdout and "vs fp32" in r.stdout
    assert (tmp_path / "p.png").exists()
    hs = json.loads((tmp_path / "h.json").read_text())
    assert [h["recipe"] for h in hs] == ["fp32", "fp8-tensor"] and len(hs[1]["loss"]) == 3


def test_cli_rejects_bad_arguments():
    r = _cli("train", "--recipe", "fp4")
    assert r.returncode == 2 and "invalid choice: 'fp4'" in r.stderr
    r = _cli("train", "--steps", "0", "--no-plot")
    assert r.returncode != 0 and "steps must be a positive int" in r.stderr


@pytest.mark.gpu
def test_default_task_on_gpu(runs):
    """On a GPU the defaults are the original program's: batch 64, 512 -> 256, 600 steps."""
    h32, h8 = runs["fp32", "kernels"], runs["fp8-tensor", "kernels"]
    assert (h8.batch, h8.d_in, h8.d_out) == (64, 512, 256)
    assert abs(h8.final_loss - h32.final_loss) / h32.final_loss < 0.05
    assert h8.final_loss < 1.2 * h8.floor


# ---------------------------------------------------------------------------------------------------------------
# task="chars": the character-level language model (fp8lab.training.model, fp8lab.training.engine_kernels)
# ---------------------------------------------------------------------------------------------------------------


# the simulator's default language model on every backend: a test, not a training run (test_chars_on_gpu trains)
SMALL = dict(task="chars", batch=8, context=2, embed=16, hidden=16, blocks=1, eval_every=3)


@pytest.fixture(scope="module")
def chars_runs():
    """Each recipe once with each engine on the language model, 3 steps."""
    return {(r, e): fp8lab.train(r, steps=3, engine=e, progress=False, **SMALL) for r in T.RECIPES for e in ENGINES}


@pytest.mark.parametrize("recipe", T.RECIPES)
def test_chars_kernels_follow_the_reference(chars_runs, recipe):
    k, ref = chars_runs[recipe, "kernels"], chars_runs[recipe, "reference"]
    assert len(k.loss) == len(ref.loss) == k.steps and k.task == "chars"
    rel = np.abs(np.array(k.loss) - ref.loss) / np.array(ref.loss)
    assert rel.max() < fp8lab.RECIPES[recipe].reference_rtol, f"max relative difference {rel.max():.2e} at step {rel.argmax() + 1}"
    assert abs(k.eval_loss - ref.eval_loss) / ref.eval_loss < fp8lab.RECIPES[recipe].reference_rtol
    assert k.val_loss[-1][0] == k.steps and np.isfinite(k.ema_loss)
    assert abs(k.ema_loss - ref.ema_loss) / ref.ema_loss < fp8lab.RECIPES[recipe].reference_rtol  # the CPU EMA, both engines


def test_cpu_ema_adds_snapshots_in_order_off_the_main_thread(rng):
    snaps = [rng.standard_normal(5000).astype(np.float32) for _ in range(30)]
    ema = T.CpuEma(snaps[0], 0.9)
    want = snaps[0].copy()
    for x in snaps[1:]:
        ema.push(lambda buf, x=x: np.copyto(buf, x))
        want *= np.float32(0.9)
        want += np.float32(1 - 0.9) * x
    assert np.array_equal(ema.value(), want)  # the same bits as the synchronous average, in push order


def test_chars_history(chars_runs, tmp_path):
    h = chars_runs["fp8-deepseek", "kernels"]
    assert h.model["moments"] == "bf16" and chars_runs["fp32", "kernels"].model["moments"] == "fp32"
    assert np.isnan(h.floor) and h.eval_bpc == pytest.approx(h.eval_loss / np.log(2))
    assert 3.0 < h.loss[0] / np.log(2) < 8.0  # about log2(65) = 6.0 bits at the start
    h.save_json(tmp_path / "h.json")
    d = json.loads((tmp_path / "h.json").read_text())
    assert d["task"] == "chars" and d["val_loss"] == h.val_loss and d["model"]["context"] == h.model["context"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(d_in=32), "d_in: only for task='teacher'"),
    (dict(noise=0.3), "noise: only for task='teacher'"),
    (dict(optimizer="adam"), "optimizer must be adamw for task='chars'"),
    (dict(moments="fp16"), "moments must be one of"),
    (dict(context=0), "context must be a positive int"),
    (dict(eval_every=-1), "eval_every must be a positive int"),
    (dict(task="words"), "task must be one of"),
])
def test_chars_bad_arguments_name_the_argument(kwargs, words):
    with pytest.raises(ValueError, match=words):
        fp8lab.train("fp32", **{**SMALL, "steps": 1, "progress": False, "engine": "reference", **kwargs})


def test_teacher_rejects_language_model_options():
    with pytest.raises(ValueError, match="blocks: only for task='chars'"):
        fp8lab.train("fp32", steps=1, blocks=2, progress=False)


def test_chars_nan_names_the_step_and_the_tensor(monkeypatch):
    from fp8lab.training import model as lm

    real = lm.init_params

    def poisoned(cfg, seed):
        p = real(cfg, seed)
        p["w2_0"][0, 0] = np.nan
        return p

    monkeypatch.setattr(lm, "init_params", poisoned)
    with pytest.raises(T.TrainingDiverged, match=r"at step 1 of 2 .*parameter 'w2_0' is not finite"):
        fp8lab.train("fp8-deepseek", steps=2, engine="reference", progress=False, **SMALL)


def test_cli_train_chars_prints_the_recipes_against_both_baselines(tmp_path):
    r = _cli("train", "--task", "chars", "--recipe", "fp8-deepseek", "--steps", "2", "--engine", "reference",
             "--batch", "8", "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1",
             "--no-plot", "--json", str(tmp_path / "h.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Tiny Shakespeare" in r.stdout and "val bpc" in r.stdout and "vs bf16" in r.stdout
    assert [h["recipe"] for h in json.loads((tmp_path / "h.json").read_text())] == ["fp32", "bf16", "fp8-deepseek"]
    r = _cli("train", "--task", "chars", "--d-in", "8", "--no-plot")
    assert r.returncode == 2 and "d_in: only for task='teacher'" in r.stderr


@pytest.mark.gpu
def test_chars_on_gpu_every_recipe_learns():
    """Realistic widths (the defaults), a short run: every recipe learns, the FP8 ones stay near bf16."""
    hs = {r: fp8lab.train(r, task="chars", steps=60, batch=4096, eval_every=30, progress=False) for r in T.RECIPES}
    for r, h in hs.items():
        assert h.loss[-1] < 0.8 * h.loss[0], f"{r}: {h.loss[0]:.3f} -> {h.loss[-1]:.3f}"
    for r in ("fp8-tensor", "fp8-deepseek"):
        assert abs(hs[r].eval_loss - hs["bf16"].eval_loss) / hs["bf16"].eval_loss < 0.02


@pytest.mark.gpu
def test_chars_on_gpu_breakdown_is_measured_and_outliers_split_the_recipes():
    """Real CUDA events: every op class of fp8-deepseek's step takes GPU time and together they account for the
    step; at the default widths, outlier channels x2^18 cost per-tensor scaling far more than 1x128 tiles."""
    h = fp8lab.train("fp8-deepseek", task="chars", steps=T.PROFILE_SKIP + 8, batch=1024, eval_every=100,
                     progress=False)
    assert h.breakdown is not None and all(v > 0 for v in h.breakdown.values()), h.breakdown
    assert {"GEMM Fprop", "GEMM Dgrad", "GEMM Wgrad", "AdamW", "quantize"} <= set(h.breakdown)
    assert 0.3 * h.step_ms < sum(h.breakdown.values()) < 3 * h.step_ms, (sum(h.breakdown.values()), h.step_ms)
    kw = dict(task="chars", steps=40, batch=1024, eval_every=20, progress=False)
    base = fp8lab.train("fp32", **kw).eval_loss
    gap = {r: (fp8lab.train(r, outliers=2.0**18, **kw).eval_loss - base) / base for r in ("fp8-tensor", "fp8-deepseek")}
    assert gap["fp8-tensor"] > 2 * abs(gap["fp8-deepseek"]) and abs(gap["fp8-deepseek"]) < 0.02, gap


@pytest.mark.parametrize("engine", ENGINES)
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
    r = _cli(*args, "--steps", str(done + 2), "--resume", str(tmp_path / "run"), "--json", str(tmp_path / "r.json"),
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    resumed = json.loads((tmp_path / "r.json").read_text())[0]
    whole = fp8lab.train("fp32", engine="reference", steps=done + 2, progress=False, **{**SMALL, "eval_every": 1})
    assert resumed["loss"] == whole.loss and resumed["val_loss"] == whole.val_loss


def test_generate_samples_text_from_a_saved_model(tmp_path):
    fp8lab.train("fp32", steps=2, engine="reference", progress=False, save=tmp_path / "lm", **SMALL)
    r = _cli("generate", "--from", str(tmp_path / "lm"), "--prompt", "ROMEO:", "--chars", "40", "--seed", "3")
    assert r.returncode == 0, r.stderr
    text = r.stdout.rstrip("\n")
    assert text.startswith("ROMEO:") and len(text) >= len("ROMEO:") + 30  # 40 sampled characters (some may be \n)
    again = _cli("generate", "--from", str(tmp_path / "lm"), "--prompt", "ROMEO:", "--chars", "40", "--seed", "3")
    assert again.stdout == r.stdout  # the seed fixes the sample
    bad = _cli("generate", "--from", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and "holds no checkpoint.npz" in bad.stderr
    bad = _cli("generate", "--from", str(tmp_path / "lm"), "--prompt", "naïve")
    assert bad.returncode == 2 and "outside the corpus vocabulary" in bad.stderr


def test_pytorch_rung_follows_the_reference_engine():
    pytest.importorskip("torch")
    from fp8lab.training import corpus, model as lm, engine_torch as lm_torch

    cfg = lm.Config(corpus.load().vocab_size, SMALL["context"], SMALL["embed"], SMALL["hidden"], SMALL["blocks"])
    t = lm_torch.train(cfg, 4, SMALL["batch"], 3e-3, autocast=False, device="cpu")
    h = fp8lab.train("fp32", steps=4, lr=3e-3, engine="reference", progress=False, **SMALL)
    # same weights, batches and AdamW: float32 PyTorch follows the NumPy engine to rounding
    np.testing.assert_allclose(t["loss"], h.loss, rtol=1e-5)
    b = lm_torch.train(cfg, 4, SMALL["batch"], 3e-3, autocast=True, device="cpu")  # BF16 autocast: close, not equal
    assert b["loss"] != t["loss"] and np.allclose(b["loss"], t["loss"], rtol=0.02)
    r = _cli("train", "--task", "chars", "--recipe", "fp32", "--no-baseline", "--torch", "--steps", "2", "--engine",
             "reference", "--batch", "8", "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1",
             "--no-plot")
    assert r.returncode == 0 and "PyTorch bf16" in r.stdout, r.stderr


# the controlled outlier experiment: W1's input x d and W1 / d, d a power of two on a few channels
def test_outliers_leave_fp32_and_bf16_bit_for_bit_and_move_fp8():
    kw = dict(SMALL, steps=2, progress=False)
    for recipe, engine in (("fp32", "reference"), ("bf16", "reference"), ("fp32", "kernels")):
        a = fp8lab.train(recipe, engine=engine, **kw)
        b = fp8lab.train(recipe, engine=engine, outliers=2.0**12, **kw)
        assert a.loss == b.loss and a.eval_loss == b.eval_loss, (recipe, engine)
        assert b.model["outliers"] == 2.0**12
    a = fp8lab.train("fp8-tensor", engine="reference", **kw)
    b = fp8lab.train("fp8-tensor", engine="reference", outliers=2.0**12, **kw)
    assert a.loss != b.loss  # the per-tensor scales now see the large channels


def test_outliers_kernels_follow_the_reference():  # the fused path (norm gain x d) and the scaled W1 and gradients
    recipe = "fp8-deepseek"
    kw = dict(SMALL, steps=2, progress=False, outliers=2.0**10)
    k, ref = (fp8lab.train(recipe, engine=e, **kw) for e in ENGINES)
    rel = np.abs(np.array(k.loss) - ref.loss) / np.array(ref.loss)
    assert rel.max() < fp8lab.RECIPES[recipe].reference_rtol, f"max relative difference {rel.max():.2e} at step {rel.argmax() + 1}"


@pytest.mark.parametrize("value, exc", [(3.0, ValueError), (0.5, ValueError), (float("nan"), ValueError),
                                        (2.0**21, ValueError), (True, TypeError), ("big", TypeError)])
def test_outliers_must_be_a_power_of_two(value, exc):
    with pytest.raises(exc, match="outliers must be a power of two"):
        fp8lab.train("fp32", **{**SMALL, "steps": 1, "progress": False, "engine": "reference", "outliers": value})
    with pytest.raises(ValueError, match="outliers: only for task='chars'"):
        fp8lab.train("fp32", steps=1, progress=False, outliers=4.0)


def test_step_breakdown_names_every_op(chars_runs, monkeypatch):
    """The simulator times nothing (breakdown None); with its events standing in for a GPU's (each interval 1 ms),
    every op class of a step is marked, and the intervals per step add up to the marks made."""
    from fp8lab.training import engine_kernels as lm_engine

    assert chars_runs["fp8-deepseek", "kernels"].breakdown is None and chars_runs["fp32", "reference"].breakdown is None
    monkeypatch.setattr(lm_engine.StepProfile, "timed", staticmethod(lambda: True))
    monkeypatch.setattr(lm_engine.cuda, "event_elapsed_time", lambda a, b: 1.0, raising=False)
    h = fp8lab.train("fp8-deepseek", steps=T.PROFILE_SKIP + 1, progress=False, **SMALL)
    want = {"batch to device", "embedding", "RMSNorm", "quantize", "GEMM Fprop", "SwiGLU", "residual add",
            "output head (float32)", "softmax cross-entropy", "RMSNorm backward", "SwiGLU backward", "GEMM Dgrad",
            "GEMM Wgrad", "cast and transpose", "embedding backward", "loss to host", "AdamW", "EMA copy to host"}
    assert set(h.breakdown) == want, set(h.breakdown) ^ want
    assert list(h.breakdown.values()) == sorted(h.breakdown.values(), reverse=True)
    assert h.breakdown["GEMM Fprop"] == 2 * SMALL["blocks"] and h.breakdown["AdamW"] == 1  # 1 ms per mark


# ---------------------------------------------------------------------------------------------------------------
# Runs a user can trust (issue 27): a comparison finished by one command, Ctrl-C, the loss plot, generate
# ---------------------------------------------------------------------------------------------------------------

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
    r = _cli(*args, "--steps", "3", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == ("fp8lab train: error: --save lm: lm/fp32 already holds a "
                                                      "checkpoint; add --resume lm to continue that comparison "
                                                      "(finished recipes are kept), or choose another folder")
    assert not (tmp_path / "lm" / "fp8-deepseek").exists()
    r = _cli(*args, "--steps", "3", "--resume", "lm", "--json", "h.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fp32: already trained to step 3 in lm/fp32 (its row is read from there)" in r.stdout
    hs = json.loads((tmp_path / "h.json").read_text())
    assert [h["recipe"] for h in hs] == ["fp32", "bf16", "fp8-deepseek"]
    for h in hs:
        w = whole[h["recipe"]]
        assert (h["loss"], h["val_loss"], h["eval_loss"], h["ema_loss"]) == (w.loss, w.val_loss, w.eval_loss,
                                                                             w.ema_loss), h["recipe"]
    again = _cli(*args, "--steps", "3", "--resume", "lm", cwd=tmp_path)  # all finished: nothing trains
    assert again.returncode == 0 and again.stdout.count("already trained to step 3") == 3, again.stderr
    assert _table(again.stdout) == _table(r.stdout) and len(_table(r.stdout)) == 3
    fewer = _cli(*args, "--steps", "2", "--resume", "lm", cwd=tmp_path)
    assert fewer.returncode == 2 and fewer.stderr.strip().endswith(
        "--steps 2: lm/fp32 has done 3 steps already (give --steps 3 or more)")
    for bad in (r, fewer):
        assert "PosixPath" not in bad.stderr and "resume='" not in bad.stderr


def test_cli_baselines_after_a_no_baseline_run(tmp_path):
    """--no-baseline first, the baselines after: the finished recipe's folder used to stop the run after both
    baselines had trained; now it is named before, and --resume keeps the finished recipe."""
    args = ["train", *CLI_CHARS, "--recipe", "fp8-deepseek", "--steps", "3", "--save", "nb"]
    first = _cli(*args, "--no-baseline", "--resume", "nb", cwd=tmp_path)  # --save DIR --resume DIR from the start
    assert first.returncode == 0 and len(_table(first.stdout)) == 1, first.stderr
    r = _cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and "--save nb: nb/fp8-deepseek already holds a checkpoint; add --resume nb" in r.stderr
    assert sorted(p.name for p in (tmp_path / "nb").iterdir()) == ["fp8-deepseek"]  # nothing trained
    r = _cli(*args, "--resume", "nb", cwd=tmp_path)
    assert r.returncode == 0 and "fp8-deepseek: already trained to step 3" in r.stdout, r.stderr
    assert len(_table(r.stdout)) == 3 and sorted(p.name for p in (tmp_path / "nb").iterdir()) == [
        "bf16", "fp32", "fp8-deepseek"]
    one = _cli("train", *CLI_CHARS, "--recipe", "fp8-deepseek", "--steps", "3", "--resume", "nb/fp32", cwd=tmp_path)
    assert one.returncode == 2 and one.stderr.strip().endswith(
        "--resume nb/fp32 is one recipe's folder (it holds checkpoint.npz): give the folder above it, --resume nb")
    other = _cli(*args, "--resume", "nb", "--batch", "4", cwd=tmp_path)
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
    r = _cli(*argv, "--json", "r.json", cwd=tmp_path)
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
    first = _cli(*args, cwd=tmp_path)
    assert first.returncode == 0 and first.stdout.rstrip().endswith("wrote runs/train_loss.png"), first.stderr
    second = _cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.rstrip().endswith("wrote runs/train_loss.png (replacing the file that was there)")


def test_generate_lists_the_recipe_folders_and_warns_when_the_model_is_barely_trained(tmp_path):
    for r in ("fp32", "fp8-deepseek"):
        fp8lab.train(r, steps=2, save=tmp_path / "lm" / r, **REF1)
    r = _cli("generate", "--from", "lm", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == ("fp8lab generate: error: --from lm holds no checkpoint.npz, but "
                                                      "the runs of fp32, fp8-deepseek: give --from lm/fp8-deepseek")
    r = _cli("generate", "--from", "lm/fp8-deepseek", "--chars", "20", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ROMEO:"), r.stderr
    (warning,) = r.stderr.strip().splitlines()
    assert warning.startswith("fp8lab generate: warning: lm/fp8-deepseek is barely trained (2 steps; validation ")
    assert "no better than letter frequencies alone" in warning and warning.endswith("train longer (--steps)")
    fp8lab.train("fp32", steps=100, save=tmp_path / "trained", **{**REF1, "batch": 64, "eval_every": 100, "lr": 1e-2})
    r = _cli("generate", "--from", "trained", "--chars", "20", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = _cli("generate", "--from", "trained", "--seed", "-1", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "fp8lab generate: error: --seed must be a non-negative int, got -1"
