"""What every worksheet check shares: outcomes, reporting to `fp8lab grade`, placeholder detection, launching."""

from __future__ import annotations

import ast
import collections
import functools
import inspect
import json
import os
import textwrap

import numpy as np

from ...numerics import formats, spec
from ...device import runtime
from .. import hints

REPORT_ENV = "FP8LAB_CHECK_REPORT"


class CheckFailed(AssertionError):
    """The answer ran but gave a wrong result; the message says where, and hints why."""


class NotAttempted(AssertionError):
    """The answer is still the exercise's `raise NotImplementedError` placeholder."""


def record(question: str, status: str, message: str) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"check": question, "status": status, "message": message}) + "\n")


def question(body):
    """Wrap a check body: print/record the outcome; NotImplementedError -> NotAttempted."""
    name = body.__name__

    @functools.wraps(body)
    def run(answer, *args, **kwargs):
        try:
            detail = body(answer, *args, **kwargs)
        except NotImplementedError as e:
            msg = not_attempted_message(name, answer, str(e))
            record(name, "not attempted", msg)
            raise NotAttempted(msg) from None
        except NotAttempted as e:
            record(name, "not attempted", str(e))
            raise
        except CheckFailed as e:
            record(name, "failed", str(e))
            more = after_failure(name)
            if more:
                e.args = (f"{e}\n{more}",)
            raise
        record(name, "passed", detail)
        print(f"passed: {name}: {detail}")
        return None

    return run


_FAILURES: collections.Counter = collections.Counter()  # failed checks per question, in this process


def after_failure(question: str) -> str:
    """Count a failure of `question`. The second one prints its second hint (the one that gives the answer away);
    returns a line for the failure's message saying how to ask for it ("" if there is none to ask for)."""
    _FAILURES[question] += 1
    try:
        found = [f for f in hints.for_check(hints.load(), question) if f[3]]
    except FileNotFoundError:
        return ""
    if not found:
        return ""
    ws, number = found[0][:2]
    if _FAILURES[question] == 2:
        for f in found:
            print(hints.describe(*f))
        return f"(the second hint above gives the answer away; {hints.call(ws, number)} prints it again)"
    if _FAILURES[question] == 1:
        return (f"still stuck? {hints.call(ws, number)} prints a hint that gives the answer away (a second failed "
                "check prints it too)")
    return f"{hints.call(ws, number)} prints the hint that gives the answer away again"


def hint(worksheet, question) -> None:
    """Print the second hint, the one that gives the answer away, of `question` of `worksheet`: check.hint("ws8", 2)
    for ws8's question 2 (numbered in the order the worksheet calls its checks, as `fp8lab grade` lists them), or
    check.hint("ws8", "cvt_e4m3x2_intrinsic") by the check's name. ValueError/TypeError naming the bad argument."""
    print(hints.describe(*hints.lookup(hints.load(), worksheet, question)))


def not_attempted_message(question: str, answer, raised: str = "") -> str:
    what = getattr(getattr(answer, "py_func", answer), "__name__", repr(answer))
    msg = f"not attempted yet: {what} still raises NotImplementedError"
    if raised:
        msg += f" ({raised})"
    return msg + ". Write your answer in its cell (replace the `raise` line), run that cell, then this check again."


def fail(question: str, lines, hint: str | None = None) -> None:
    text = f"{question}: " + "\n".join(lines)
    if hint:
        text += f"\nhint: {hint}"
    raise CheckFailed(text)


def still_a_placeholder(fn) -> bool:
    """True if the function's source contains `raise NotImplementedError` (kernels: checked before any launch,
    since a GPU kernel cannot raise)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                return True
    return False


def uses_shared_memory(fn) -> bool | None:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None  # source unknown: give the benefit of the doubt
    return "shared.array" in src


def require_kernel(question: str, kernel):
    py = getattr(kernel, "py_func", None)
    if py is None or not callable(kernel):
        fail(question, [f"expected a kernel made with @cuda.jit, got {type(kernel).__name__} {kernel!r}"],
              "put @cuda.jit (from fp8lab.device.runtime import cuda) on the line above `def`")
    if still_a_placeholder(py):
        raise NotAttempted(not_attempted_message(question, kernel))
    return py


def launch(question: str, case: str, kernel, config, *args) -> None:
    try:
        kernel[config](*args)
        runtime.synchronize()
    except Exception as e:  # the simulator raises what a thread raised, with its thread/block ids
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        fail(question, [f"case {case}: the kernel raised {type(e).__name__}: {first}"[:600]],
              "an IndexError means a thread read or wrote outside an array: guard every access with the "
              "bounds (if m < M and k < K ...); a TypingError means Numba could not compile a line")


_E4M3_MAX = spec.FP8_MAX["e4m3"]


def tie_traps(amax, rng, n: int) -> np.ndarray:
    """Up to n float32 values below amax whose code differs between encode(x * inv) (the package's rule, inv =
    _E4M3_MAX / amax) and encode(x / scale) (scale = amax / _E4M3_MAX): x * inv lands on or next to an E4M3
    rounding tie, and the two float32 roundings fall on different sides of it."""
    f = np.float32
    inv, scale = f(_E4M3_MAX / amax), f(amax / _E4M3_MAX)
    table = formats.value_table(formats.E4M3).astype(np.float64)
    mids = (table[0:0x7E] + table[1:0x7F]) / 2  # every tie between neighbouring non-negative codes
    x0 = (mids / np.float64(inv)).astype(np.float32)
    cands = np.concatenate([np.nextafter(x0, f(np.inf)), x0, np.nextafter(x0, f(-np.inf))])
    cands = cands[(cands > 0) & (cands < amax)]
    with np.errstate(over="ignore"):
        by_inv = formats.encode((cands * inv).astype(np.float32), formats.E4M3)
        by_div = formats.encode((cands / scale).astype(np.float32), formats.E4M3)
    traps = cands[by_inv != by_div]
    traps = rng.permutation(traps)[:n]
    return (traps * np.where(rng.random(len(traps)) < 0.5, f(-1), f(1))).astype(np.float32)


def call_answer(q, fn, args, hint, shown: str | None = None):
    """fn(*args) for a learner's function: an exception other than NotImplementedError (not attempted) becomes a
    failure of question q naming the call (`shown`, else the function and its arguments), with the hint."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as e:
        call = shown or f"{getattr(fn, '__name__', 'your function')}({', '.join(map(repr, args))})"
        fail(q, [f"{call} raised {type(e).__name__}: {e}"[:600]], hint)
