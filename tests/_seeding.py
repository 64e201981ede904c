"""Unseeded draws made reproducible under the test suite (tests/conftest.py says why and when).

`install(entropy)` swaps np.random.default_rng for a stand-in: called with a seed it is the real function; called
without one (a test's own draw, a worksheet check's fresh inputs, a lecture cell's `np.random.default_rng()`) it
returns the next generator of a sequence seeded by `entropy`, so the draws repeat whatever else runs in the process.
Learners never see this: only the test suite installs it.

This file imports nothing but NumPy: the IPython kernels that run notebooks (nbval, `worksheets.grade`) load it
by path from the startup file conftest.py writes, and install the entropy that DRAWS_ENV holds.
"""

from __future__ import annotations

import os

import numpy as np

DRAWS_ENV = "FP8LAB_TEST_DRAWS"  # comma-separated ints: the entropy of a kernel's unseeded draws
# the real function, also if this module is imported again after an install
_default_rng = getattr(np.random.default_rng, "real", np.random.default_rng)


class Draws:
    """Stands in for np.random.default_rng: unseeded calls get successive children of SeedSequence(entropy)."""

    real = _default_rng

    def __init__(self, entropy: list[int]):
        self.entropy = list(entropy)
        self._seq = np.random.SeedSequence(self.entropy)

    def __call__(self, seed=None) -> np.random.Generator:
        return _default_rng(self._seq.spawn(1)[0] if seed is None else seed)

    def env(self) -> str:
        """The value of DRAWS_ENV that gives a kernel started now the same entropy."""
        return ",".join(map(str, self.entropy))


def install(entropy: list[int]) -> Draws:
    np.random.default_rng = draws = Draws(entropy)
    return draws


def install_from_env() -> None:
    """In a notebook's kernel: seed its unseeded draws from DRAWS_ENV (set by conftest.py), if set."""
    value = os.environ.get(DRAWS_ENV)
    if value:
        install([int(v) for v in value.split(",")])
