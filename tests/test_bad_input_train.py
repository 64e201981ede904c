"""Bad input to fl.train (continued from tests/test_bad_input.py): wrong types, out-of-range options, folders and
memory checked before the first step, divergence of the training and the validation loss. Each raises a TypeError or
ValueError naming the argument, or has the documented behaviour asserted here. Sizes are tiny (simulator)."""

from __future__ import annotations

import fractions
import warnings

import numpy as np
import pytest

import fp8lab as fl
from test_bad_input import numpy_warnings_fail  # noqa: F401  (a fixture: the test takes it by name)

TRAIN = [
    # wrong types
    (dict(recipe=8), TypeError, r"^recipe must be one of"),
    (dict(steps=2.5), TypeError, r"^steps must be a positive int"),
    (dict(batch="8"), TypeError, r"^batch must be a positive int"),
    (dict(d_in=None, d_out=16.0), TypeError, r"^d_out must be a positive int"),
    (dict(seed=1.5), TypeError, r"^seed must be a non-negative int"),
    (dict(seed=True), TypeError, r"^seed must be a non-negative int"),
    (dict(lr="0.1"), TypeError, r"^lr must be a positive number"),
    (dict(ema_decay="0.9"), TypeError, r"^ema_decay must be a number in \[0, 1\)"),
    (dict(ema_decay=True), TypeError, r"^ema_decay must be a number in \[0, 1\)"),
    (dict(optimizer=3), TypeError, r"^optimizer must be one of"),
    (dict(progress="no"), TypeError, r"^progress must be a bool, got str 'no'"),
    (dict(progress=1), TypeError, r"^progress must be a bool"),
    (dict(progress=None), TypeError, r"^progress must be a bool"),
    # empty (zero-sized) problems
    (dict(batch=0), ValueError, r"^batch must be a positive int"),
    (dict(d_in=0), ValueError, r"^d_in must be a positive int"),
    (dict(steps=0), ValueError, r"^steps must be a positive int"),
    # non-finite options
    (dict(lr=float("nan")), ValueError, r"^lr must be a positive finite number"),
    (dict(lr=np.inf), ValueError, r"^lr must be a positive finite number"),
    (dict(noise=float("inf")), ValueError, r"^noise must be a positive finite number"),
    (dict(ema_decay=float("nan")), ValueError, r"^ema_decay must be a number in \[0, 1\)"),
    # out of range
    (dict(recipe="fp16"), ValueError, r"^recipe must be one of"),
    (dict(engine="jax"), ValueError, r"^engine must be one of"),
    (dict(engine="torch"), ValueError, r"^engine='torch' trains task='chars'"),
    (dict(optimizer="lion"), ValueError, r"^optimizer must be one of"),
    (dict(seed=-1), ValueError, r"^seed must be a non-negative int, got -1"),
    (dict(batch=-1), ValueError, r"^batch must be a positive int"),
    (dict(lr=-0.1), ValueError, r"^lr must be a positive finite number"),
    (dict(noise=0), ValueError, r"^noise must be a positive finite number"),
    (dict(ema_decay=1.0), ValueError, r"^ema_decay must be a number in \[0, 1\)"),
    (dict(ema_decay=np.float32(-0.5)), ValueError, r"^ema_decay must be a number in \[0, 1\)"),
]
SMALL = dict(steps=2, batch=4, d_in=8, d_out=4, engine="reference", progress=False)


@pytest.mark.parametrize("kwargs, exc, words", TRAIN)
def test_train(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        fl.train(**{**SMALL, **kwargs})


@pytest.mark.parametrize(
    "kwargs",
    [dict(ema_decay=np.float32(0.9)), dict(ema_decay=np.float64(0.5)), dict(ema_decay=fractions.Fraction(9, 10)),
     dict(ema_decay=0), dict(seed=np.int64(3), steps=np.int32(2), lr=np.float32(0.05), noise=np.float64(0.5)),
     dict(progress=np.bool_(False))],
)
def test_train_accepts_numpy_and_other_real_numbers(kwargs):
    h = fl.train(**{**SMALL, **kwargs})
    assert len(h.loss) == h.steps == 2 and np.isfinite(h.loss).all()


@pytest.mark.parametrize("engine", ["reference", "kernels"])
def test_train_exploding_loss_raises_training_diverged(numpy_warnings_fail, engine):
    """Adam at lr 1e10 used to finish with a loss near 1e20 and no word; now the step is named."""
    with pytest.raises(fl.TrainingDiverged, match=r"at step 2 of 3, more than 1000 times the first step's") as e:
        fl.train("fp8-tensor", steps=3, lr=1e10, batch=8, d_in=32, d_out=16, engine=engine, progress=False)
    assert len(e.value.history.loss) == 1 and e.value.history.lr == 1e10


CHARS = dict(task="chars", batch=8, context=2, embed=16, hidden=16, blocks=1, eval_every=1, engine="reference",
             progress=False)


@pytest.fixture
def no_step(monkeypatch):
    """Any training step fails the test: what is checked must be checked before the first one."""
    from fp8lab.training import corpus

    def never(*args, **kwargs):
        raise AssertionError("a training step ran before the arguments were checked")

    monkeypatch.setattr(corpus.Corpus, "batch", never)


@pytest.mark.parametrize("where, words", [
    ("file", r"^save='.*file': .*file is a file, not a folder$"),
    ("file/sub", r"^save='.*file/sub': .*file is a file, not a folder$"),
    ("/proc/fp8lab-run", r"^save='/proc/fp8lab-run': cannot create /proc/fp8lab-run \("),
])
def test_train_save_folder_is_checked_before_the_first_step(tmp_path, no_step, where, words):
    """The first checkpoint used to fail with a traceback after eval_every steps; now before the first one."""
    (tmp_path / "file").write_text("not a folder")
    path = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(ValueError, match=words):
        fl.train("fp32", steps=3, save=path, **CHARS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing made


def test_train_memory_is_checked_before_the_first_step(no_step):
    """--batch 1000000000 was killed by the kernel's OOM killer without a word."""
    with pytest.raises(ValueError, match=r"^batch=1000000000: this run needs about .* TB of host memory \(.* for the "
                                         r"activations of 1000000000 windows\), .* is free: lower batch$"):
        fl.train("fp32", steps=3, **{**CHARS, "batch": 10**9})
    with pytest.raises(ValueError, match=r"^context=10000000: this run needs about .* for the weights, their "
                                         r"gradients, AdamW's moments and the EMA.* lower context$"):
        fl.train("fp32", steps=3, **{**CHARS, "context": 10**7})


def test_train_warns_above_a_few_gigabytes(monkeypatch):
    from fp8lab.training import preflight

    monkeypatch.setattr(preflight, "WARN_BYTES", 1000)
    with pytest.warns(preflight.LargeRunWarning, match=r"^batch=4096: this run needs about 1\d MB of host memory "
                                                       r"\(1\d MB for the activations of 4096 windows\)$"):
        fl.train("fp32", steps=1, **{**CHARS, "batch": 4096})


def test_train_checks_the_gpu_memory_for_the_kernels(monkeypatch):
    from fp8lab.training import loop, preflight

    with warnings.catch_warnings():  # the simulator would take hours: nothing is trained here
        warnings.simplefilter("ignore", fl.SimulatorSlowWarning)
        s = loop.prepare("fp8-deepseek", steps=2, **{**CHARS, "engine": "kernels", "batch": 10**6})
    monkeypatch.setattr(preflight.runtime, "IS_SIM", False)
    monkeypatch.setattr(preflight, "available_device", lambda: 2 * 10**9)
    with pytest.raises(ValueError, match=r"^batch=1000000: this run needs about .* GB of GPU memory \(.* for the "
                                         r"buffers of 1000000 windows\), 2.0 GB is free: lower batch$"):
        preflight.check_memory(s)
    with pytest.raises(ValueError, match=r"^--batch 1000000: .* GPU memory .* lower --batch$"):
        preflight.check_memory(s, cli=True)
    preflight.check_memory(loop.prepare("fp8-deepseek", steps=2, **{**CHARS, "engine": "kernels"}))


def test_train_validation_loss_is_watched_for_divergence(tmp_path):
    """--context 100000 used to finish at a validation loss of 1625 nats without a word: lr x width too large."""
    with pytest.raises(fl.TrainingDiverged, match=r"^validation loss became .* at step 1 of 3 \(recipe='fp32', "
                                                  r"task='chars', lr=10.0\), more than 10 times the first step's "
                                                  r".*: lower the learning rate$") as e:
        fl.train("fp32", steps=3, lr=10.0, save=tmp_path / "run", **CHARS)
    assert e.value.command_line.endswith(": lower --lr (now 10)") and e.value.history.loss
    assert not (tmp_path / "run" / "checkpoint.npz").exists()  # nothing saved from the diverged step
    with pytest.raises(fl.TrainingDiverged, match=r"lower the learning rate, or the width \(context x embed = "
                                                  r"160000\)$") as e:
        fl.train("fp32", steps=3, **{**CHARS, "context": 10**4})
    assert "or --context / --embed (width 160000)" in e.value.command_line


def test_train_nonfinite_validation_loss_stops_the_run(monkeypatch):
    from fp8lab.training import engine_reference

    real = engine_reference.Model.loss

    def nan_when_evaluating(self, p, ids, targets, grads=True):
        return real(self, p, ids, targets, grads) if grads else float("nan")

    monkeypatch.setattr(engine_reference.Model, "loss", nan_when_evaluating)
    with pytest.raises(fl.TrainingDiverged, match=r"^validation loss became nan at step 2 of 3"):
        fl.train("fp32", steps=3, **{**CHARS, "eval_every": 2})
