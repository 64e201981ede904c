"""What the training tests (test_train*.py) share: the small language model, the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

# the simulator's default language model on every backend: a test, not a training run (test_chars_on_gpu trains)
SMALL = dict(task="chars", batch=8, context=2, embed=16, hidden=16, blocks=1, eval_every=3)
ENGINES = ("kernels", "reference")  # the two that must agree step by step ("torch" is a peer, not a twin)


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "fp8lab.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, env={**os.environ, "MPLBACKEND": "Agg"})
