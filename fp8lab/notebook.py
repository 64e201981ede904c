"""Helpers for the lecture notebooks."""

from __future__ import annotations

import inspect
import textwrap


def show(*objs) -> None:
    """Print the source of package objects; for a kernel, the Python function it was compiled from."""
    for obj in objs:
        print(textwrap.dedent(inspect.getsource(getattr(obj, "py_func", obj))))
