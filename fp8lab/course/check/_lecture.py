"""What the lecture exercises' checks share (fp8lab.course.check.lecture00 ... lecture10).

A lecture runs top to bottom under nbval with its answer stubs untouched, so an answer of None (or a function that
still raises NotImplementedError) prints "not tried yet: ..." with a hint of where to start, and returns. A right
answer prints "passed: ...". A wrong one raises CheckFailed naming the answer, with the hint of the mistake it
matches (each check models the likely mistakes; right or wrong is decided by the truth the check computes from
the library). Every outcome is recorded for `fp8lab grade` like the worksheets' (._core.record).
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from ._core import CheckFailed, fail, record

__all__ = ["Wrong", "exercise", "as_number", "as_int", "as_tuple", "close", "matching_hint"]


class Wrong(Exception):
    """Raised by a check's body: `said` describes the answer, `hint` says what to look at."""

    def __init__(self, said: str, hint: str | None = None):
        super().__init__(said)
        self.said, self.hint = said, hint


def exercise(lecture: int, number: int, start: str):
    """Decorator of the check of exercise `number` of lecture `lecture`: body(answer) -> what was checked.

    start: the one-line hint printed while the answer is None (where to start)."""
    name = f"lecture{lecture:02d}.ex{number}"

    def wrap(body):
        @functools.wraps(body)
        def run(answer):
            if answer is None:
                return _not_tried(name, start)
            try:
                detail = body(answer)
            except NotImplementedError:  # a function answer still holding its placeholder
                return _not_tried(name, start)
            except Wrong as e:
                try:
                    fail(name, [e.said], e.hint)
                except CheckFailed as failed:
                    record(name, "failed", str(failed))
                    raise failed from None
            record(name, "passed", detail)
            print(f"passed: {name}: {detail}")
            return None

        run.question = name
        return run

    return wrap


def _not_tried(name: str, start: str) -> None:
    msg = f"not tried yet: {name}: {start}"
    record(name, "not attempted", msg)
    print(msg)
    return None


def _real(x) -> bool:
    return isinstance(x, (numbers.Real, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def as_number(answer, what: str) -> float:
    """answer as a float, or Wrong saying that `what` (e.g. "a float, FLOP per byte") was expected."""
    if isinstance(answer, np.ndarray) and answer.size == 1:
        answer = answer.reshape(()).item()
    if not _real(answer) or not math.isfinite(float(answer)):
        raise Wrong(f"your answer is {answer!r}: expected {what}")
    return float(answer)


def as_int(answer, what: str) -> int:
    """answer as an int (an integral float is accepted), or Wrong."""
    x = as_number(answer, what)
    if x != int(x):
        raise Wrong(f"your answer is {answer!r}: expected {what}, a whole number")
    return int(x)


def as_tuple(answer, n: int, what: str, item=as_number) -> tuple:
    """answer as a tuple of n items, each converted by item(value, what), or Wrong."""
    if isinstance(answer, (str, bytes, dict)) or not hasattr(answer, "__iter__"):
        raise Wrong(f"your answer is {answer!r}: expected {what}")
    items = list(answer)
    if len(items) != n:
        raise Wrong(f"your answer has {len(items)} item{'s' * (len(items) != 1)}: expected {what}")
    try:
        return tuple(item(v, what) for v in items)
    except Wrong:
        raise Wrong(f"your answer is {answer!r}: expected {what}") from None


def close(a, b, rel: float = 1e-6, abs_tol: float = 0.0) -> bool:
    """a and b (numbers, or equally long tuples of numbers) equal within rel / abs_tol."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(close(x, y, rel, abs_tol) for x, y in zip(a, b)))
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_tol)


def matching_hint(got, models, rel: float = 1e-6, abs_tol: float = 0.0, default: str | None = None):
    """The hint of the first (value, hint) in models whose value equals got (within rel / abs_tol), else default."""
    for value, hint in models:
        if close(got, value, rel, abs_tol):
            return hint
    return default
