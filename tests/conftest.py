"""Shared test setup. Tests marked `gpu` use realistic sizes and need a CUDA device: `make test-gpu`.

Every kernel test also runs unmarked, on small shapes, so CI (simulator) exercises every kernel.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fp8lab  # noqa: F401  (selects the backend before anything imports numba.cuda)
from fp8lab.device import runtime


def pytest_collection_modifyitems(config, items):
    if runtime.IS_SIM:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (backend is the simulator); run `make test-gpu` on one")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def rng(request):
    """Fresh random inputs each run; the seed is printed on failure (FP8LAB_TEST_SEED=... reproduces)."""
    seed = int(os.environ.get("FP8LAB_TEST_SEED", np.random.SeedSequence().entropy))
    request.node.user_properties.append(("seed", seed))
    print(f"seed {seed}")
    return np.random.default_rng(seed)
