"""Worksheets: learner exercises generated from solutions/, and a grader.

`solutions/*.ipynb` are the single source of each worksheet. Answers sit between nbgrader's markers
`### BEGIN SOLUTION` and `### END SOLUTION` in code cells; a `### HINT: ...` line inside the region becomes the
hint the learner sees (a direction, no code), and `### HINT2: ...` lines the second hint, which gives the answer away:
stripped from the exercise, collected into exercises/.hints.json and printed only after a second failed check or on
request (fp8lab.course.hints). `exercises/*.ipynb` are generated from them; learners work in copies under `work/`,
which git ignores, so their answers never conflict with an update of the course and never break its tests:

    fp8lab worksheets start ws1                  # copy exercises/ws1_*.ipynb to work/ and say how to open it
    fp8lab grade ws1 [--hints]                   # grade work/ws1_*.ipynb (or: fp8lab grade PATH)
    fp8lab worksheets build [--force] [--no-run] # instructors: regenerate exercises/ from solutions/
    fp8lab worksheets build --check              # exit 1 if exercises/ is stale (CI)

start NAME
    NAME is ws1 .. wsN or an exercise's file name. Copies the exercise to work/ unless a copy is already there
    (then it says so and keeps it); `--fresh` starts over, moving the old copy to work/backup/ first. A copy under
    a worksheet's old name (before they were numbered in lecture order) is named, never renamed (course.renamed).

build
    1. runs every solution notebook headless (nbclient, kernel "python3" of this environment) and writes
       nothing if any cell fails (a solution that fails its own check must never become an exercise);
    2. replaces each answer region with its hint and `raise NotImplementedError(...)`, strips outputs and
       execution counts, and keeps only the kernelspec and language in the notebook metadata; writes the second
       hints (`### HINT2:`) of every question to exercises/.hints.json;
    3. refuses to overwrite an exercise that differs from what it generated last time (someone edited it):
       `exercises/.manifest.json` keeps the sha256 of each generated file; `--force` overwrites anyway,
       after copying each edited file to work/backup/<time>/.
    `--check` compares without running or writing anything.

grade NAME|PATH
    runs a worksheet headless (every cell, errors included) and prints one row per check call
    (fp8lab.course.check.*): passed, failed (first line of the message) or not attempted, and the first error of any
    other cell (listed, not scored). Exit status: 0 every question passed, 1 some did not, 2 not a worksheet
    or not runnable. `--hints` then prints the second hint (the one that gives the answer away) of each question
    that failed; without it, a line says how to ask for them.

Python API: `generate(nb)`, `second_hints(nb)`, `build(...)`, `stale_files(...)`, `start(name)`, `resolve(name)`,
`read_notebook(path)`, `run_notebook(path)`, `grade(path)`, `main(argv)`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from . import hints, renamed

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
HINT = "### HINT:"
DEFAULT_HINT = "read the description above; the check below says what it expects."
MANIFEST = ".manifest.json"
WORK = "work"  # learners' copies (in .gitignore)
TIMEOUT_S = 300  # per cell: generous for the simulator's slowest worksheet cell (about a minute on 2 cores)
_CHECK_CALL = re.compile(r"\bcheck\.([A-Za-z_]\w*)\s*\(")


class WorksheetError(Exception):
    """Something the user must fix (a stale or edited exercise, a failing solution, a malformed marker)."""


def _root() -> Path:
    """The repository root (where solutions/ lives) if this is a checkout, else the current directory."""
    return hints.course_root()


def _names(exercises: Path) -> list[str]:
    """Exercise file names in worksheet order (ws2 before ws10)."""
    def order(name: str):
        num = name[2:].split("_")[0]
        return (int(num) if num.isdigit() else 1 << 30, name)

    return sorted((p.name for p in exercises.glob("ws*.ipynb")), key=order)


def resolve(name, exercises=None) -> Path:
    """The exercise file that `name` means: ws1, ws1_rmsnorm_kernel or ws1_rmsnorm_kernel.ipynb."""
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"name must be a worksheet name such as 'ws1', got {type(name).__name__}")
    exercises = Path(exercises) if exercises else _root() / "exercises"
    stem = Path(name).name.removesuffix(".ipynb")
    names = _names(exercises)
    hits = [n for n in names if n.removesuffix(".ipynb") == stem or n.split("_")[0] == stem]
    if len(hits) != 1:
        short = ", ".join(n.split("_")[0] for n in names) or "none found"
        raise WorksheetError(f"no worksheet {str(name)!r} in {exercises} (worksheets: {short})")
    return exercises / hits[0]


def _backup(paths, work: Path) -> Path:
    """Copy `paths` into a new folder work/backup/<time>[-n]/ and return it (never one that exists)."""
    stem = work / "backup" / time.strftime("%Y%m%d-%H%M%S")
    dest, n = stem, 1
    (work / "backup").mkdir(parents=True, exist_ok=True)
    while True:
        try:
            dest.mkdir()
            break
        except FileExistsError:
            n += 1
            dest = stem.with_name(f"{stem.name}-{n}")
    for p in paths:
        shutil.copy2(p, dest / Path(p).name)
    return dest


def start(name, *, fresh: bool = False, exercises=None, work=None, log=print) -> Path:
    """Copy a fresh exercise into work/ (kept if already there, unless fresh) and return the copy's path."""
    src = resolve(name, exercises)
    work = Path(work) if work else _root() / WORK
    dst = work / src.name
    for p in [work, *work.parents]:  # work/ (or a folder above it) a file: nowhere to put the copy
        if p.exists() and not p.is_dir():
            raise WorksheetError(f"{p} is a file, not a folder: your worksheet copies go in {work}/; move or rename "
                                 f"{p}, then start again")
    if dst.is_dir():
        raise WorksheetError(f"{dst} is a folder, not your copy of the worksheet: move or rename it (nothing was "
                             "copied)")
    error, _ = renamed.on_start(src.name, work, _root(), have_copy=dst.exists(), fresh=fresh)
    if error:  # this worksheet's copy under its old name: the learner renames it, or asks for --fresh
        raise WorksheetError(error)
    if dst.exists() and not fresh:
        log(f"{dst} already exists: it is your copy, kept as it is (`--fresh` starts over, backing it up)")
    else:
        if dst.exists() and dst.read_bytes() != src.read_bytes():  # an untouched copy needs no backup
            log(f"your previous copy is saved in {_backup([dst], work)}")
        work.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        log(f"copied {src} to {dst}")
    for note in renamed.on_start(src.name, work, _root(), have_copy=True, fresh=fresh)[1]:  # after the copy
        log(f"note: {note}")
    rel = os.path.relpath(dst, _root()) if dst.resolve().is_relative_to(_root()) else str(dst)
    log(f"open it in JupyterLab (`make lab` shows the whole repository) at {rel}, or start the lab on it:\n"
        f"  make lab LAB_FIRST={rel}\n"
        f"grade it with:  fp8lab grade {src.name.split('_')[0]}")
    return dst


def _gradable(target, log=print) -> Path:
    """A path as given, or for a worksheet name (ws1) the learner's copy in work/, found by its full file name; a
    copy under a worksheet's old name (fp8lab.course.renamed) is named in a note or the error, never graded as
    another worksheet."""
    p = Path(target)
    if p.is_dir():
        raise WorksheetError(f"{p} is a folder: grade a worksheet by its name (ws1) or a notebook's path")
    if p.suffix == ".ipynb" or p.exists():
        if p.name in renamed.RENAMED:  # graded by its own check calls, rightly; say what it is called now
            log(f"note: {renamed.advice(p.name, p.parent, _root())}")
        return p
    copy = _root() / WORK / resolve(target).name
    if copy.is_dir():
        raise WorksheetError(f"{copy} is a folder, not your copy of the worksheet: move or rename it")
    if not copy.exists():
        raise WorksheetError(renamed.on_grade_missing(copy, _root()) or f"{copy} does not exist: start the worksheet "
                             f"first with `fp8lab worksheets start {target}` (or grade a notebook by its path)")
    for note in sum(renamed.notes_for(copy.name, copy.parent, _root()), []):
        log(f"note: {note}")
    return copy


# ----------------------------------------------------------------------------------------------------------------
# Generation (a pure text transform)
# ----------------------------------------------------------------------------------------------------------------


def strip_solution(source: str, where: str = "cell") -> str:
    """The exercise text of one code cell: every answer region replaced by its hint and a `raise`."""
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    for line in source.splitlines():
        stripped = line.strip()
        if region is None:
            if stripped == BEGIN:
                region, indent = [], line[: len(line) - len(line.lstrip())]
            elif stripped == END:
                raise WorksheetError(f"{where}: '{END}' without '{BEGIN}'")
            elif stripped.startswith(hints.HINT2):  # outside a region it would reach the exercise
                raise WorksheetError(f"{where}: '{hints.HINT2}' outside a '{BEGIN}' region")
            else:
                out.append(line)
            continue
        if stripped == BEGIN:
            raise WorksheetError(f"{where}: nested '{BEGIN}'")
        if stripped != END:
            region.append(line)
            continue
        shown = [ln.strip()[len(HINT):].strip() for ln in region if ln.strip().startswith(HINT)]
        for h in shown or [DEFAULT_HINT]:
            out.append(f"{indent}# Hint: {h}")
        out.append(f'{indent}raise NotImplementedError("your answer goes here: replace this line")')
        region = None
    if region is not None:
        raise WorksheetError(f"{where}: '{BEGIN}' without '{END}'")
    return "\n".join(out)


def second_hints(nb, name: str = "notebook") -> list[dict]:
    """[{"check": name, "hint": [lines]}] per question (questions(nb) order): the `### HINT2:` lines of the answer
    regions it grades, those of cells up to its own since the previous question's."""
    qs = questions(nb)
    found = [{"check": q, "hint": []} for _, q in qs]
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        lines = [ln.strip()[len(hints.HINT2):].strip() for ln in cell.source.splitlines()
                 if ln.strip().startswith(hints.HINT2)]
        if lines:
            j = next((j for j, (c, _) in enumerate(qs) if c >= i), None)
            if j is None:
                raise WorksheetError(f"{name}, cell {i}: '{hints.HINT2}' with no check call at or after its cell")
            found[j]["hint"] += lines
    return found


def _has_solution(source: str) -> bool:
    return any(line.strip() == BEGIN for line in source.splitlines())


def generate(nb, name: str = "notebook"):
    """The exercise notebook (a new nbformat node) made from a solution notebook."""
    import nbformat

    ex = copy.deepcopy(nb)
    n_regions = 0
    for i, cell in enumerate(ex.cells):
        if cell.cell_type == "code":
            if _has_solution(cell.source):
                n_regions += 1
                cell.source = strip_solution(cell.source, f"{name}, cell {i}")
            cell.outputs = []
            cell.execution_count = None
        cell.metadata = {k: v for k, v in cell.metadata.items() if k in ("tags",)}
    if n_regions == 0:
        raise WorksheetError(f"{name}: no '{BEGIN}' region: nothing for the learner to do")
    meta = nb.metadata
    ex.metadata = nbformat.from_dict({
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": meta.get("language_info", {}).get("name", "python")},
    })
    return ex


def _dumps(nb) -> bytes:
    import nbformat

    return (nbformat.writes(nb) + "\n").encode("utf-8")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def generated_files(solutions: Path) -> dict[str, bytes]:
    """{exercise file name: bytes} for every solution notebook, plus the manifest."""
    import nbformat

    files, second = {}, {}
    for path in sorted(solutions.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        files[path.name] = _dumps(generate(nb, str(path)))
        second[path.name.split("_")[0]] = {"file": path.name, "questions": second_hints(nb, str(path))}
    note = ("written by `fp8lab worksheets build` from the `### HINT2:` lines of solutions/; "
            "printed by fp8lab.course.check.hint, a second failed check and `fp8lab grade --hints`")
    second = {k: second[k] for k in sorted(second, key=lambda k: (int(k[2:]) if k[2:].isdigit() else 1 << 30, k))}
    files[hints.FILE] = (json.dumps({"note": note, "worksheets": second}, indent=1) + "\n").encode()
    manifest = {
        "note": "written by `fp8lab worksheets build` from solutions/; sha256 of each file as generated",
        "files": {k: _sha(v) for k, v in sorted(files.items())},
    }
    files[MANIFEST] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    return files


# ----------------------------------------------------------------------------------------------------------------
# Running notebooks
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    nb: object  # the executed notebook
    error: str | None  # first cell error, "cell N: Ename: message" (None if every cell ran cleanly)
    checks: list[dict]  # one dict per check call that ran: check, status, message


def _first_error(nb) -> str | None:
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {i}: {out.get('ename')}: {str(out.get('evalue', '')).splitlines()[0] if out.get('evalue') else ''}"
    return None


def read_notebook(path):
    """The notebook at path (nbformat 4); WorksheetError, naming the file, if it cannot be read."""
    import nbformat

    try:
        return nbformat.read(Path(path), as_version=4)
    except Exception as e:
        raise WorksheetError(f"cannot read {path}: {type(e).__name__}: {e}") from None


def run_notebook(path, *, timeout: int = TIMEOUT_S, allow_errors: bool = True, nb=None) -> RunResult:
    """Execute a notebook headless in its own directory, kernel "python3" of this environment.

    nb: the notebook already read from path (it is executed in place). With allow_errors=False execution stops
    at the first failing cell. A cell still running after `timeout` seconds (an answer that loops forever) is
    interrupted and gets an error saying so; with allow_errors=True the next cells still run. Raises WorksheetError
    if the notebook cannot be read or the kernel cannot run it (start failure, death).
    """
    timeout = _timeout(timeout)
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    nb = read_notebook(path) if nb is None else nb
    fd, report = tempfile.mkstemp(prefix="fp8lab-check-", suffix=".jsonl")
    os.close(fd)
    old = os.environ.get("FP8LAB_CHECK_REPORT")
    os.environ["FP8LAB_CHECK_REPORT"] = report  # the kernel inherits this process's environment
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                                interrupt_on_timeout=True, extra_arguments=["--IPKernelApp.log_level=ERROR"],
                                resources={"metadata": {"path": str(path.parent.resolve())}})
        try:
            client.execute()
        except CellExecutionError:
            pass  # allow_errors=False: the error is in the notebook's outputs
        except Exception as e:
            raise WorksheetError(f"could not run {path}: {type(e).__name__}: {str(e).strip()[:500]}") from None
        with open(report, encoding="utf-8") as f:
            checks = [json.loads(line) for line in f if line.strip()]
    finally:
        if old is None:
            os.environ.pop("FP8LAB_CHECK_REPORT", None)
        else:
            os.environ["FP8LAB_CHECK_REPORT"] = old
        os.unlink(report)
    return RunResult(nb, _first_error(nb), checks)


def _timeout(value) -> int:
    """A cell's time limit: a positive int (seconds)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise WorksheetError(f"timeout must be a positive number of seconds per cell, got {value!r}")
    return value


def _positive_seconds(text: str) -> int:
    """--timeout's type: a positive int."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds per cell, got {text!r}")
    return value


def questions(nb) -> list[tuple[int, str]]:
    """(cell index, check name) of every `check.<name>(...)` call in the notebook's code cells."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for line in cell.source.splitlines():
                if not line.lstrip().startswith("#"):
                    found += [(i, m) for m in _CHECK_CALL.findall(line)]
    return found


def grade(path, *, timeout: int = TIMEOUT_S) -> list[dict]:
    """Run a worksheet and return one row per question: question, cell, status, detail.

    A cell that raised outside a check (an import, a typo) adds a row with question "(cell error)".
    Raises WorksheetError if the notebook cannot be run or calls no check.
    """
    nb = read_notebook(path)
    if not questions(nb):
        raise WorksheetError(f"{path} calls no fp8lab.course.check function: it is not a worksheet")
    res = run_notebook(path, timeout=timeout, allow_errors=True, nb=nb)
    pending: dict[str, list[dict]] = {}
    for rec in res.checks:
        pending.setdefault(rec["check"], []).append(rec)
    rows = []
    for cell, name in questions(res.nb):
        recs = pending.get(name) or []
        if recs:
            rec = recs.pop(0)
            detail = " ".join(line.strip() for line in rec["message"].strip().splitlines() if line.strip())
            rows.append({"question": name, "cell": cell, "status": rec["status"], "detail": detail})
        else:
            err = _cell_error(res.nb.cells[cell], timeout)
            rows.append({"question": name, "cell": cell, "status": "failed",
                         "detail": f"the check did not run ({err or 'cell not reached'})"})
    asked = {cell for cell, _ in questions(res.nb)}
    for i, cell in enumerate(res.nb.cells):
        err = _cell_error(cell, timeout) if i not in asked else None
        if err and "your answer goes here" not in err:
            rows.append({"question": "(cell error)", "cell": i, "status": "error", "detail": err})
    return rows


def _cell_error(cell, timeout: int | None = None) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            if out.get("ename") == "KeyboardInterrupt" and timeout is not None:  # run_notebook's interrupt
                return f"timed out: still running after {timeout} s, interrupted (a loop that never ends?)"
            ev = str(out.get("evalue", "")).strip().splitlines()
            return f"{out.get('ename')}: {ev[0] if ev else ''}"
    return None


def print_grades(path, rows) -> None:
    """The score table: one line per question, then the total."""
    questions_ = [r for r in rows if r["status"] != "error"]
    passed = sum(r["status"] == "passed" for r in questions_)
    table = [["question", "cell", "status", "detail"]]
    table += [[r["question"], str(r["cell"]), r["status"], r["detail"]] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    indent = 2 + sum(w + 2 for w in widths)
    print(f"{path}")
    for j, row in enumerate(table):
        lines = textwrap.wrap(row[3], max(40, 120 - indent), break_long_words=False) or [""]  # the whole detail
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + lines[0])
        for line in lines[1:]:
            print(" " * indent + line)
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    print(f"score: {passed} of {len(questions_)} questions passed")


# ----------------------------------------------------------------------------------------------------------------
# build / check
# ----------------------------------------------------------------------------------------------------------------


def _read_manifest(exercises: Path) -> dict[str, str]:
    try:
        return json.loads((exercises / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def stale_files(solutions: Path, exercises: Path) -> list[str]:
    """Exercise files (and the manifest) that differ from what solutions/ generates; also orphans."""
    want = generated_files(solutions)
    stale = []
    for name, data in want.items():
        p = exercises / name
        if not p.is_file():
            stale.append(f"{p} (missing)")
        elif p.read_bytes() != data:
            stale.append(f"{p} (differs from what {solutions / name if name.endswith('.ipynb') else solutions} generates)")
    if exercises.is_dir():
        for p in sorted(exercises.glob("*.ipynb")):
            if p.name not in want:
                stale.append(f"{p} (no {solutions / p.name})")
    return stale


def build(solutions=None, exercises=None, *, force: bool = False, run: bool = True, timeout: int = TIMEOUT_S,
          log=print) -> list[str]:
    """Run the solutions, then write the exercises. Returns the names written. Raises WorksheetError."""
    root = _root()
    solutions = Path(solutions) if solutions else root / "solutions"
    exercises = Path(exercises) if exercises else root / "exercises"
    sources = sorted(solutions.glob("*.ipynb"))
    if not sources:
        raise WorksheetError(f"no notebooks in {solutions}")
    files = generated_files(solutions)  # malformed markers fail here, before the slow part
    if run:
        failures = []
        for src in sources:
            log(f"running {src} ...")
            res = run_notebook(src, timeout=timeout, allow_errors=False)
            bad = [c for c in res.checks if c["status"] != "passed"]
            if res.error or bad:
                why = res.error or f"{bad[0]['check']}: {bad[0]['status']}"
                failures.append(f"{src}: {why}")
            else:
                log(f"  {len(res.checks)} checks passed")
        if failures:
            raise WorksheetError("solutions fail their checks; nothing written:\n  " + "\n  ".join(failures))
    manifest = _read_manifest(exercises)
    edited = []
    for name, data in files.items():
        p = exercises / name
        if name == MANIFEST or not p.is_file():
            continue
        disk = p.read_bytes()
        if disk != data and _sha(disk) != manifest.get(name):
            edited.append(str(p))
    if edited and not force:
        raise WorksheetError(
            "refusing to overwrite exercises that were edited since they were generated (a learner's work?):\n  "
            + "\n  ".join(edited) + f"\nlearners work in copies (`fp8lab worksheets start ws1` puts one in {WORK}/); "
            "rerun with --force to overwrite these, after a backup copy in " + f"{WORK}/backup/")
    if edited:
        log(f"--force: the edited files are saved in {_backup(edited, exercises.parent / WORK)}")
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        p = exercises / name
        if not p.is_file() or p.read_bytes() != data:
            p.write_bytes(data)
            written.append(name)
    log(f"{exercises}: {len(written)} file(s) written, {len(files) - len(written)} already up to date"
        + (f" ({', '.join(written)})" if written else ""))
    return written


def _grade_parser(sub_or_none, prog=None):
    desc = ("Run a worksheet headless and print a score per question. Exit status 0: every question passed; "
            "1: some did not; 2: not a worksheet, or it cannot be run.")
    if sub_or_none is None:
        g = argparse.ArgumentParser(prog=prog, description=desc)
    else:
        g = sub_or_none.add_parser("grade", help="run a worksheet headless and print a score per question",
                                   description=desc)
    g.add_argument("target", metavar="NAME|PATH",
                   help="a worksheet name (ws1: your copy in work/) or a notebook's path")
    g.add_argument("--timeout", type=_positive_seconds, default=TIMEOUT_S,
                   help="seconds a cell may run before it is interrupted (default %(default)s)")
    g.add_argument("--hints", action="store_true",
                   help="also print the second hint, the one that gives the answer away, of each failed question")
    return g


def _grade_main(args) -> int:
    path = _gradable(args.target)
    rows = grade(path, timeout=args.timeout)
    print_grades(path, rows)
    hints.print_for_failed(args.target, rows, args.hints, _root() / "exercises")
    return 0 if all(r["status"] == "passed" for r in rows if r["status"] != "error") else 1


def main(argv=None, prog: str = "fp8lab worksheets") -> int:
    """`fp8lab worksheets start|build|grade ...`; with prog="fp8lab grade", argv are grade's own arguments."""
    if prog.endswith(" grade"):
        p = _grade_parser(None, prog)
        args = p.parse_args(argv)
        args.cmd = "grade"
    else:
        p = argparse.ArgumentParser(prog=prog, description="Start, grade and (instructors) generate worksheets.")
        sub = p.add_subparsers(dest="cmd", required=True)
        st = sub.add_parser("start", help="copy a fresh exercise into work/ (your copy) and say how to open it")
        st.add_argument("name", help="ws1, ws2, ... or an exercise's file name")
        st.add_argument("--fresh", action="store_true",
                        help="start over: back up your copy to work/backup/ and copy the exercise again")
        b = sub.add_parser("build", help="instructors: run solutions/, then generate exercises/ from them")
        b.add_argument("--force", action="store_true",
                       help="overwrite exercises that were edited by hand (backed up to work/backup/ first)")
        b.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 naming the files if exercises/ is out of date with solutions/")
        b.add_argument("--no-run", action="store_true", help="skip running the solutions first (not for releases)")
        b.add_argument("--solutions", type=Path, help="default: solutions/ of the repository")
        b.add_argument("--exercises", type=Path, help="default: exercises/ of the repository")
        b.add_argument("--timeout", type=_positive_seconds, default=TIMEOUT_S,
                   help="seconds a cell may run before it is interrupted (default %(default)s)")
        _grade_parser(sub)
        args = p.parse_args(argv)
    try:
        if args.cmd == "grade":
            return _grade_main(args)
        if args.cmd == "start":
            start(args.name, fresh=args.fresh)
            return 0
        root = _root()
        sol = args.solutions or root / "solutions"
        ex = args.exercises or root / "exercises"
        if args.check:
            stale = stale_files(sol, ex)
            if stale:
                print(f"{ex} is out of date with {sol}:\n  " + "\n  ".join(stale) + "\nrun `fp8lab worksheets build`; "
                      "an exercise edited by hand: `git checkout -- FILE` restores it, or `build --force` "
                      f"overwrites it after a backup in {WORK}/backup/", file=sys.stderr)
                return 1
            print(f"{ex} is up to date with {sol}")
            return 0
        build(sol, ex, force=args.force, run=not args.no_run, timeout=args.timeout)
        return 0
    except WorksheetError as e:
        who = prog if prog.endswith(" grade") else f"{prog} {args.cmd}"
        print(f"{who}: error: {e}", file=sys.stderr)
        return 2 if args.cmd == "grade" else 1


if __name__ == "__main__":
    sys.exit(main())
