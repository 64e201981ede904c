"""The capstone's named sizes (`fl.train(size=...)`, `fp8lab train --size`) and its speed harness against PyTorch
peers (`fp8lab bench train`, fp8lab.training.speed): the harness end to end on a tiny model under the simulator,
its tables and plot, the peers' availability; the timings themselves on a GPU (`gpu`)."""

from __future__ import annotations

import contextlib
import importlib.util
import math

import numpy as np
import pytest

from fp8lab import cli
from fp8lab.training import engine_torch, loop, speed
from fp8lab.training import model as lm

from _training import cli as run_cli

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_large_preset_and_overrides(monkeypatch):
    monkeypatch.setattr(loop.runtime, "_SIM_WARNED", set())  # it warns once per process: whatever ran before
    with pytest.warns(Warning) if loop.runtime.IS_SIM else contextlib.nullcontext():  # the simulator's estimate
        s = loop.prepare("fp8-deepseek", task="chars", size="large", batch=32, steps=1)
    assert (s.cfg.width, s.cfg.hidden, s.cfg.blocks) == (2048, 5632, 4)
    assert (s.batch, s.steps, s.lr) == (32, 1, loop.PRESETS["large"]["lr"])  # arguments override the preset
    assert s.defaults["batch"] == 16384  # the preset is what the messages call the default
    assert loop.sizes("chars", "default") == loop.sizes("chars")


@pytest.mark.parametrize("kwargs, words", [
    (dict(task="teacher", size="large"), ["size", "task='chars'", "'large'"]),
    (dict(task="chars", size="huge"), ["size must be one of", "'huge'"]),
])
def test_bad_size_names_the_argument(kwargs, words):
    with pytest.raises(ValueError) as e:
        loop.prepare("fp32", **kwargs)
    for w in words:
        assert w in str(e.value)


def test_command_line_sizes_are_the_presets():
    assert cli.SIZES == tuple(loop.PRESETS)


def test_command_line_size_reaches_the_run(tmp_path):
    done = run_cli("train", "--task", "chars", "--recipe", "fp32", "--no-baseline", "--engine", "reference",
                   "--size", "large", "--batch", "4", "--context", "2", "--embed", "8", "--hidden", "16", "--blocks",
                   "1", "--steps", "1", "--eval-every", "1", "--eval-batches", "1", "--no-plot", "--no-progress",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "lr 0.0005" in done.stdout  # the large preset's lr, no option given for it


def test_at_width_keeps_the_large_shape():
    a = speed.at_width(1024, 512)
    assert (a["context"] * a["embed"], a["hidden"], a["batch"], a["blocks"]) == (1024, 2816, 512, 4)
    assert speed.at_width(2048, 8)["hidden"] == loop.PRESETS["large"]["hidden"]
    with pytest.raises(ValueError, match="multiple of 16"):
        speed.at_width(1000, 8)


def test_tables_show_speedups_parity_and_why_a_peer_did_not_run():
    bf16, fp8 = speed.course_label("bf16"), speed.course_label("fp8-deepseek")
    runs = [speed.Run(bf16, 20.0, 1.80), speed.Run(fp8, 10.0, 1.8018, gpu_busy=0.934),
            speed.Run(speed.PEERS[0][0], 12.5, 1.79), speed.Run("torchao float8", why_not="torchao is not installed")]
    head, body = speed.table("default", speed.preset("default"), runs, 250).columns(None)
    rows = {r[0]: r for r in body}
    assert head[2] == "GPU busy" and rows[fp8][2] == "93%" and rows[bf16][2] == "-"
    assert rows[fp8][3] == "2.00x" and rows[fp8][4] == "1.25x" and rows[fp8][6] == "+0.10%"
    assert rows["torchao float8"][-1] == "torchao is not installed"
    head, body = speed.crossover_table((512, 1024), {bf16: [4.0, 9.0], fp8: [5.0, 6.0]}, 16384).columns(None)
    assert body[-1] == ["fp8lab: bf16 / fp8-deepseek", "0.80x", "1.50x"]  # FP8 pays from width 1024 on


def test_crossover_plot(tmp_path):
    path = tmp_path / "sub" / "x.png"
    speed_series = {speed.course_label("bf16"): [4.0, 9.0], "PyTorch": [3.0, None]}
    from fp8lab.course.plotting import plot_crossover

    plot_crossover((512, 1024), speed_series, str(path), "test")
    assert path.stat().st_size > 1000


def test_fp8_peers_say_why_they_do_not_run_here():
    for name in engine_torch.FLOAT8:
        ok, why = engine_torch.peer_status(float8=name)
        if not ok:
            assert why and ("GPU" in why or "not installed" in why)
    with pytest.raises(ValueError, match="float8 must be"):
        engine_torch.peer_status(float8="mx")


@pytest.mark.slow
def test_harness_checks_end_to_end():
    rows = speed.checks(None)
    assert rows[-1] == ("tables", "built")
    assert any(r[0].startswith("fp8lab fp8-deepseek") and r[1].startswith("val ") for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is optional: the peer needs it")
def test_torch_compile_peer_trains_like_eager():
    cfg = lm.Config(65, 4, 16, 32, 1)
    eager = engine_torch.train(cfg, 3, 8, 3e-3, eval_batches=1, autocast=False)
    compiled = engine_torch.train(cfg, 3, 8, 3e-3, eval_batches=1, autocast=False, compile=True)
    assert math.isfinite(compiled["val_loss"])
    np.testing.assert_allclose(compiled["loss"], eager["loss"], rtol=1e-4)


@pytest.mark.gpu
def test_gpu_bench_train_prints_both_tables(capsys):
    assert speed.main(["--sizes", "default", "--widths", "512,1024", "--steps", "8", "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "train --task chars --size default" in out and "step time (ms) against width" in out


@pytest.mark.parametrize("argv, words", [
    (["--sizes", "default,huge"], ["--sizes", "huge", "one of default, large"]),
    (["--widths", "512,1000"], ["--widths", "'1000'", "multiple of 16"]),
    (["--widths", "abc"], ["--widths", "'abc'"]),
])
def test_bench_train_options_are_checked_before_any_run(argv, words, capsys):
    with pytest.raises(SystemExit):
        speed.main(argv)
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
