"""The training program on task="chars", the character-level language model (fp8lab.training.model,
fp8lab.training.engine_kernels): kernels vs the NumPy reference, its history, bad arguments, the CLI, PyTorch."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fp8lab
from fp8lab.training import loop as T
from fp8lab.training.ema import CpuEma

from _training import ENGINES, SMALL, cli


@pytest.fixture(scope="module")
def chars_runs():
    """Each recipe once with each engine on the language model, 3 steps."""
    return {(r, e): fp8lab.train(r, steps=3, engine=e, progress=False, **SMALL) for r in T.RECIPES for e in ENGINES}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", T.RECIPES)
def test_chars_kernels_follow_the_reference(chars_runs, recipe):
    k, ref = chars_runs[recipe, "kernels"], chars_runs[recipe, "reference"]
    assert len(k.loss) == len(ref.loss) == k.steps and k.task == "chars"
    rel = np.abs(np.array(k.loss) - ref.loss) / np.array(ref.loss)
    assert rel.max() < fp8lab.RECIPES[recipe].reference_rtol, f"max relative difference {rel.max():.2e} at step {rel.argmax() + 1}"
    assert abs(k.eval_loss - ref.eval_loss) / ref.eval_loss < fp8lab.RECIPES[recipe].reference_rtol
    assert k.val_loss[-1][0] == k.steps and np.isfinite(k.ema_loss)
    assert abs(k.ema_loss - ref.ema_loss) / ref.ema_loss < fp8lab.RECIPES[recipe].reference_rtol  # the CPU EMA, both engines


@pytest.mark.parametrize("chunk", [CpuEma.CHUNK, 1000])  # one slice; 5 slices on the thread pool
def test_cpu_ema_adds_snapshots_in_order_off_the_main_thread(rng, monkeypatch, chunk):
    monkeypatch.setattr(CpuEma, "CHUNK", chunk)
    snaps = [rng.standard_normal(4321).astype(np.float32) for _ in range(30)]
    ema = CpuEma(snaps[0], 0.9)
    assert (ema.pool is None) == (chunk > 4321)
    want = snaps[0].copy()
    for x in snaps[1:]:
        ema.push(lambda buf, x=x: np.copyto(buf, x))
        want *= np.float32(0.9)
        want += np.float32(1 - 0.9) * x
    assert np.array_equal(ema.value(), want)  # the same bits as the synchronous average, in push order


@pytest.mark.slow
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
    r = cli("train", "--task", "chars", "--recipe", "fp8-deepseek", "--steps", "2", "--engine", "reference",
             "--batch", "8", "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1",
             "--no-plot", "--json", str(tmp_path / "h.json"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Tiny Shakespeare" in r.stdout and "val bpc" in r.stdout and "vs bf16" in r.stdout
    assert [h["recipe"] for h in json.loads((tmp_path / "h.json").read_text())] == ["fp32", "bf16", "fp8-deepseek"]
    r = cli("train", "--task", "chars", "--d-in", "8", "--no-plot")
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
                     progress=False, graph=False)  # every step eager: the profile and the step time alike
    assert h.breakdown is not None and all(v > 0 for v in h.breakdown.values()), h.breakdown
    assert {"GEMM Fprop", "GEMM Dgrad", "GEMM Wgrad", "AdamW", "quantize"} <= set(h.breakdown)
    assert 0.3 * h.step_ms < sum(h.breakdown.values()) < 3 * h.step_ms, (sum(h.breakdown.values()), h.step_ms)
    kw = dict(task="chars", steps=40, batch=1024, eval_every=20, progress=False)
    g = fp8lab.train("fp8-deepseek", **kw)  # the step a graph: its forward and backward timed once more as one
    assert g.graph and g.graph_breakdown and all(v > 0 for v in g.graph_breakdown.values()), g.graph_breakdown
    assert {"GEMM Fprop", "GEMM Dgrad", "GEMM Wgrad", "quantize"} <= set(g.graph_breakdown)
    assert sum(g.graph_breakdown.values()) < g.step_ms, (g.graph_breakdown, g.step_ms)  # no launch gaps in it
    base = fp8lab.train("fp32", **kw).eval_loss
    gap = {r: (fp8lab.train(r, outliers=2.0**18, **kw).eval_loss - base) / base for r in ("fp8-tensor", "fp8-deepseek")}
    assert gap["fp8-tensor"] > 2 * abs(gap["fp8-deepseek"]) and abs(gap["fp8-deepseek"]) < 0.02, gap


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
    r = cli("train", "--task", "chars", "--recipe", "fp32", "--no-baseline", "--torch", "--steps", "2", "--engine",
             "reference", "--batch", "8", "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1",
             "--no-plot")
    assert r.returncode == 0 and "PyTorch bf16" in r.stdout, r.stderr


@pytest.mark.slow
def test_step_breakdown_names_every_op(chars_runs, monkeypatch):
    """The simulator times nothing (breakdown None); with its events standing in for a GPU's (each interval 1 ms),
    every op class of a step is marked, and the intervals per step add up to the marks made; graph_breakdown
    profiles the forward and backward again as one graph."""
    from fp8lab.training import engine_kernels as lm_engine

    assert chars_runs["fp8-deepseek", "kernels"].breakdown is None and chars_runs["fp32", "reference"].breakdown is None
    monkeypatch.setattr(lm_engine.StepProfile, "timed", staticmethod(lambda: True))
    monkeypatch.setattr(lm_engine.cuda, "event_elapsed_time", lambda a, b: 1.0, raising=False)
    h = fp8lab.train("fp8-deepseek", steps=T.PROFILE_SKIP + 1, progress=False, **SMALL)
    # no "residual add": W2's GEMM and the RMSNorm backward add the residual in their epilogues
    want = {"batch to device", "embedding", "RMSNorm", "quantize", "GEMM Fprop", "SwiGLU",
            "output head (float32)", "softmax cross-entropy", "RMSNorm backward", "SwiGLU backward", "GEMM Dgrad",
            "GEMM Wgrad", "cast and transpose", "embedding backward", "loss to host", "AdamW", "EMA copy to host"}
    assert set(h.breakdown) == want, set(h.breakdown) ^ want
    assert list(h.breakdown.values()) == sorted(h.breakdown.values(), reverse=True)
    assert h.breakdown["GEMM Fprop"] == 2 * SMALL["blocks"] and h.breakdown["AdamW"] == 1  # 1 ms per mark
    # a step's forward and backward profiled as one graph (what fl.train does after the capture): the same marks,
    # but those outside net.run, and the eager profile left as it was
    from fp8lab.training import model

    cfg = T.prepare("fp8-deepseek", **SMALL).cfg
    net = lm_engine.KernelModel(cfg, "fp8-deepseek", SMALL["batch"], model.init_params(cfg, 0))
    rng = np.random.default_rng(0)
    net.loss(rng.integers(0, cfg.vocab, (SMALL["batch"], cfg.context)), rng.integers(0, cfg.vocab, SMALL["batch"]))
    graphed = lm_engine.graph_breakdown(net, 2)
    outside = {"batch to device", "loss to host", "AdamW", "EMA copy to host"}
    assert set(graphed) == want - outside, set(graphed) ^ (want - outside)
    assert all(graphed[k] == h.breakdown[k] for k in graphed), (graphed, h.breakdown)
    assert net.prof.steps == 0 and all(lin.prof is net.prof for lin in net.lin1 + net.lin2)
