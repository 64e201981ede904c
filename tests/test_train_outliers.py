"""The controlled outlier experiment (train(..., outliers=d)): W1's input x d and W1 / d, d a power of two on a
few channels."""

from __future__ import annotations

import numpy as np
import pytest

import fp8lab
from fp8lab.training import loop as T

from _training import ENGINES, SMALL


# the controlled outlier experiment: W1's input x d and W1 / d, d a power of two on a few channels
@pytest.mark.slow
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


@pytest.mark.slow
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
