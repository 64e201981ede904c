"""The worksheets' hints, in two steps.

Step 1 gives a direction without code: the `### HINT:` lines of an answer region in solutions/, shown in the
exercise's cell, and the message of a failed check, which names the mistake it detected. Step 2 gives the answer
away: the `### HINT2:` lines of the region. They are stripped from the exercise's cell, and `fp8lab worksheets build`
collects them into exercises/.hints.json (generated, like the exercises; `build --check` and the tests compare it
with solutions/), keyed by the check that grades the region: the first `check.<name>(...)` call at or after its cell.

A learner gets step 2 in three ways:
- on request: `check.hint("ws8", 2)` prints it for question 2 of ws8 (questions are numbered in the order the
  worksheet calls its checks, as `fp8lab grade` lists them; a check's name works too);
- by itself, once, after the second failed check of the same question: failures are counted per question in the
  running Python process (one kernel session: restarting the kernel starts the count again);
- `fp8lab grade ws8 --hints` prints it for each question that failed (never without the flag).

Pure Python: `course_root`, `load`, `lookup`, `for_check`, `describe`, `call`, `print_for_failed`.
"""

from __future__ import annotations

import json
from pathlib import Path

HINT2 = "### HINT2:"
FILE = ".hints.json"  # in exercises/, written with the exercises


def course_root() -> Path:
    """The repository root (where solutions/ lives) if this is a checkout, else the current directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "solutions").is_dir() else Path.cwd()


def load(exercises=None) -> dict:
    """{worksheet: {"file": exercise file name, "questions": [{"check": name, "hint": [lines]}, ...]}} from
    exercises/.hints.json. FileNotFoundError (saying how to make it) if there is none."""
    path = Path(exercises if exercises is not None else course_root() / "exercises") / FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))["worksheets"]
    except (OSError, ValueError, KeyError, TypeError):
        raise FileNotFoundError(f"no readable {path}: the second hints are generated there, with the exercises, "
                                "by `fp8lab worksheets build` in the course's repository") from None


def lookup(data: dict, worksheet, question) -> tuple[str, int, str, list[str]]:
    """(worksheet, question number, check name, hint lines) for `worksheet` ("ws8", or its file name) and `question`
    (1-based in the worksheet's order, or the check's name). ValueError/TypeError naming the bad argument."""
    names = list(data)
    if not isinstance(worksheet, str):
        raise TypeError(f"worksheet must be a worksheet's name such as 'ws8', got {type(worksheet).__name__} "
                        f"{worksheet!r}")
    stem = worksheet.strip().removesuffix(".ipynb")
    ws = next((w for w in names if stem in (w, data[w]["file"].removesuffix(".ipynb"))), None)
    if ws is None:
        raise ValueError(f"worksheet must be one of {', '.join(names)}, got {worksheet!r}")
    qs = data[ws]["questions"]
    checks = [q["check"] for q in qs]
    expected = f"a number 1..{len(qs)} or a check's name of {ws} ({', '.join(checks)})"
    if isinstance(question, bool) or not isinstance(question, (int, str)):
        raise TypeError(f"question must be {expected}, got {type(question).__name__} {question!r}")
    if isinstance(question, str):
        if question not in checks:
            raise ValueError(f"question must be {expected}, got {question!r}")
        number = checks.index(question) + 1
    else:
        number = question
        if not 1 <= number <= len(qs):
            raise ValueError(f"question must be {expected}, got {question!r}")
    q = qs[number - 1]
    return ws, number, q["check"], list(q["hint"])


def for_check(data: dict, check: str) -> list[tuple[str, int, str, list[str]]]:
    """lookup(...) of every question that `check` grades (one, unless two worksheets call the same check)."""
    return [(ws, i + 1, check, list(q["hint"])) for ws, entry in data.items()
            for i, q in enumerate(entry["questions"]) if q["check"] == check]


def describe(ws: str, number: int, check: str, lines: list[str]) -> str:
    """The text printed for one question's second hint."""
    if not lines:
        return (f"{ws} question {number} ({check}) has no second hint: the hint in its exercise cell and the "
                "check's message are all there is")
    return (f"{ws} question {number} ({check}), second hint (it gives the answer away):\n"
            + "\n".join(f"    {line}" for line in lines))


def call(ws: str, number: int) -> str:
    """How a learner asks for a question's second hint."""
    return f'check.hint("{ws}", {number})'


def print_for_failed(target, rows, show: bool, exercises=None) -> None:
    """After `fp8lab grade`'s table (rows: worksheets.grade's): each failed question's second hint when `show`, else
    one line saying how to ask for them. Nothing when no question failed."""
    failed = list(dict.fromkeys(r["question"] for r in rows if r["status"] == "failed"))
    if not failed:
        return
    if not show:
        print(f"stuck? `fp8lab grade {target} --hints` prints the hint that gives the answer away, for each failed "
              "question")
        return
    try:
        data = load(exercises)
    except FileNotFoundError as e:
        print(f"no second hints: {e}")
        return
    print("second hints (they give the answer away):")
    for name in failed:
        for found in for_check(data, name) or [None]:
            print(describe(*found) if found else f"{name}: no second hint (no worksheet calls this check)")
