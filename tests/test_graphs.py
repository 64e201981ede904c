"""A training step as one CUDA graph (fp8lab.device.graphs, engine_kernels.GraphedStep, fl.train(graph=)):
a replay is the captured launches on the buffers' contents at replay time; training with the graph gives the same
losses, bit for bit, as launching every kernel from Python; AdamW's scheduled bias corrections; bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import fp8lab
from fp8lab import bench
from fp8lab.device import graphs, runtime
from fp8lab.device.runtime import cuda
from fp8lab.kernels import elementwise, optim
from fp8lab.training import loop as T

from _training import SMALL


def _chain(a, b, tmp, out):
    """tmp = a + b; out = tmp + a: two launches, the second reading what the first wrote."""
    elementwise.add(a, b, tmp)
    elementwise.add(tmp, a, out)


def _replays_follow_the_buffers(rng, n):
    a_h, b_h = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    a, b = cuda.to_device(a_h), cuda.to_device(b_h)
    tmp, out = bench.poisoned(n, np.float32), bench.poisoned(n, np.float32)
    g = graphs.Graph()
    g.capture(lambda: _chain(a, b, tmp, out))
    assert np.isnan(out.copy_to_host()).all(), "capture must not run the launches"
    for _ in range(3):  # new inputs in the same buffers before each replay: the replay reads them then
        a_h, b_h = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        a.copy_to_device(a_h)
        b.copy_to_device(b_h)
        out.copy_to_device(np.full(n, np.nan, np.float32))
        g.replay()
        runtime.synchronize()
        assert np.array_equal(out.copy_to_host(), (a_h + b_h) + a_h)
    g.close()


def test_replay_runs_the_captured_launches_on_the_buffers_as_they_are_then(rng):
    _replays_follow_the_buffers(rng, 1000 + int(rng.integers(0, 37)))


@pytest.mark.gpu
def test_gpu_replay_runs_the_captured_launches_on_the_buffers_as_they_are_then(rng):
    _replays_follow_the_buffers(rng, (1 << 24) + 7)


def test_replay_before_capture_raises():
    with pytest.raises(RuntimeError, match="nothing was captured"):
        graphs.Graph().replay()


def test_adamw_schedule_gives_the_same_steps_and_stops_at_its_end(rng):
    n = 257
    p0 = rng.standard_normal(n).astype(np.float32)
    gs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    decay = (rng.random(n) < 0.5).astype(np.float32)
    got = []
    for scheduled in (False, True):
        opt = optim.AdamW(n, lr=1e-2, decay=decay)
        if scheduled:
            opt.schedule(3)
        p = cuda.to_device(p0)
        for g in gs:
            opt.step(p, cuda.to_device(g))
        got.append(p.copy_to_host())
    assert np.array_equal(got[0], got[1]) and opt.t == 3
    with pytest.raises(RuntimeError, match="past the schedule"):
        opt.step(p, cuda.to_device(gs[0]))


def _graph_and_eager(recipe, **kw):
    return (fp8lab.train(recipe, graph=False, progress=False, **kw),
            fp8lab.train(recipe, graph=True, progress=False, **kw))


def _assert_same_run(eager, graphed):
    assert graphed.graph and not eager.graph
    assert graphed.loss == eager.loss, "the losses differ"  # floats of the same float32 bits
    assert graphed.val_loss == eager.val_loss and graphed.ema_loss == eager.ema_loss
    assert len(graphed.step_seconds) == graphed.steps and all(t > 0 for t in graphed.step_seconds)


STEPS = T.PROFILE_SKIP + T.PROFILE_STEPS + 3  # three steps replayed: two losses read together at the validation
SIM_RUN = dict(SMALL, steps=STEPS, eval_every=STEPS - 1)


@pytest.fixture(scope="module")
def eager_run():
    return fp8lab.train("fp8-deepseek", graph=False, progress=False, **SIM_RUN)


@pytest.mark.slow
def test_graph_training_gives_the_eager_losses_bit_for_bit(eager_run):
    """Under the simulator the Graph twin replays the step eagerly: the loop's graph path (pinned batches, the
    scheduled AdamW, losses read in groups, the EMA copied on the graph's stream) against the eager loop."""
    _assert_same_run(eager_run, fp8lab.train("fp8-deepseek", graph=True, progress=False, **SIM_RUN))


@pytest.mark.slow
def test_a_step_that_cannot_be_captured_runs_eagerly_with_a_warning(eager_run, monkeypatch):
    def refuse(self, fn):
        raise RuntimeError("cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")

    monkeypatch.setattr(graphs.Graph, "capture", refuse)
    steps = T.PROFILE_SKIP + T.PROFILE_STEPS + 1  # the capture fails at the last step, which runs eagerly
    with pytest.warns(RuntimeWarning, match="could not be captured as a CUDA graph.*CAPTURE_INVALIDATED") as w:
        h = fp8lab.train("fp8-deepseek", graph=True, progress=False, **dict(SIM_RUN, steps=steps))
    assert w[0].filename == __file__  # the warning points at the caller's line
    assert not h.graph and h.loss == eager_run.loss[:steps]  # no validation before: the same first steps


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["fp8-deepseek", "bf16", "fp32"])
def test_gpu_graph_training_gives_the_eager_losses_bit_for_bit(recipe):
    """The default model and batch: 60 steps, the losses read in several groups, two validations."""
    eager, graphed = _graph_and_eager(recipe, task="chars", steps=60, eval_every=30)
    _assert_same_run(eager, graphed)
    assert eager.gpu_busy is None and 0 < graphed.gpu_busy <= 1.05, graphed.gpu_busy  # events' resolution: ~us


def test_graph_is_checked():
    with pytest.raises(TypeError, match="graph must be"):
        fp8lab.train("fp32", graph="yes", **SMALL)
    with pytest.raises(ValueError, match="graph=True.*task='teacher'"):
        fp8lab.train("fp32", graph=True)
    with pytest.raises(ValueError, match="graph=True.*engine='reference'"):
        fp8lab.train("fp32", graph=True, engine="reference", **SMALL)


def test_graph_defaults_to_the_gpu():
    assert T.prepare("fp32", **SMALL).graph is (not runtime.IS_SIM)
    assert T.prepare("fp32", engine="reference", **SMALL).graph is False


def test_an_ema_worker_error_reaches_the_caller():
    from fp8lab.training.ema import CpuEma

    ema = CpuEma(np.zeros(10, np.float32), 0.9, buffers=[np.zeros(5, np.float32), np.zeros(5, np.float32)])
    ema.push(lambda buf: None)  # a snapshot of the wrong size: the worker's arithmetic fails
    with pytest.raises(RuntimeError, match="the CPU EMA's worker failed: ValueError"):
        ema.value()
    with pytest.raises(RuntimeError, match="worker failed"):
        ema.push(lambda buf: None)
    with pytest.raises(RuntimeError, match="worker failed"):
        ema.close()
