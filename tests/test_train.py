"""The training program end to end, the teacher task: kernels vs the NumPy reference, FP8 vs FP32, divergence,
the CLI. The language model (task="chars"): test_train_chars.py, test_train_resume.py, test_train_outliers.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fp8lab
from fp8lab.device import runtime
from fp8lab.training import loop as T
from fp8lab.training import teacher

from _training import ENGINES, cli


@pytest.fixture(scope="module")
def runs():
    """Each recipe once with each engine, at the backend's default sizes (seconds under the simulator)."""
    return {(r, e): fp8lab.train(r, engine=e, progress=False) for r in T.RECIPES for e in ENGINES}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", T.RECIPES)
def test_kernels_follow_the_reference_curve(runs, recipe):
    k, ref = runs[recipe, "kernels"], runs[recipe, "reference"]
    assert len(k.loss) == len(ref.loss) == k.steps
    assert all(isinstance(v, float) for v in k.loss)
    rel = np.abs(np.array(k.loss) - ref.loss) / np.array(ref.loss)
    assert rel.max() < fp8lab.RECIPES[recipe].reference_rtol, f"max relative difference {rel.max():.2e} at step {rel.argmax() + 1}"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_loss_falls_and_fp8_stays_within_5_percent_of_fp32(runs, engine):
    h32, h8 = runs["fp32", engine], runs["fp8-tensor", engine]
    for h in (h32, h8):
        assert h.final_loss < 0.6 * h.loss[0], f"{h.recipe}: loss did not fall ({h.loss[0]:.3f} -> {h.final_loss:.3f})"
        assert h.final_loss > 0.9 * h.floor  # cannot beat the noise for long
        assert np.isfinite(h.eval_loss) and np.isfinite(h.ema_loss)
    assert abs(h8.final_loss - h32.final_loss) / h32.final_loss < 0.05


@pytest.mark.slow
def test_history_serializes(runs, tmp_path):
    h = runs["fp8-tensor", "reference"]
    path = tmp_path / "h.json"
    h.save_json(path)
    d = json.loads(path.read_text())
    assert d["loss"] == h.loss and d["recipe"] == "fp8-tensor" and d["floor"] == h.noise**2


@pytest.mark.slow
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


def test_cli_info():
    r = cli("info")
    assert r.returncode == 0, r.stderr
    assert "backend" in r.stdout and runtime.backend in r.stdout


def test_cli_train_prints_both_losses_and_writes_plot_and_json(tmp_path):
    r = cli("train", "--recipe", "fp8-tensor", "--steps", "3", "--plot", str(tmp_path / "p.png"),
             "--json", str(tmp_path / "h.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "fp32" in r.stdout and "fp8-tensor" in r.stdout and "vs fp32" in r.stdout
    assert (tmp_path / "p.png").exists()
    hs = json.loads((tmp_path / "h.json").read_text())
    assert [h["recipe"] for h in hs] == ["fp32", "fp8-tensor"] and len(hs[1]["loss"]) == 3


def test_cli_rejects_bad_arguments():
    r = cli("train", "--recipe", "fp4")
    assert r.returncode == 2 and "invalid choice: 'fp4'" in r.stderr
    r = cli("train", "--steps", "0", "--no-plot")
    assert r.returncode != 0 and "steps must be a positive int" in r.stderr


@pytest.mark.gpu
def test_default_task_on_gpu(runs):
    """On a GPU the defaults are the original program's: batch 64, 512 -> 256, 600 steps."""
    h32, h8 = runs["fp32", "kernels"], runs["fp8-tensor", "kernels"]
    assert (h8.batch, h8.d_in, h8.d_out) == (64, 512, 256)
    assert abs(h8.final_loss - h32.final_loss) / h32.final_loss < 0.05
    assert h8.final_loss < 1.2 * h8.floor
