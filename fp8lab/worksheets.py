"""Worksheets: learner exercises generated from solutions/, and a grader.

`solutions/*.ipynb` are the single source of each worksheet. Answers sit between nbgrader's markers
`### BEGIN SOLUTION` and `### END SOLUTION` in code cells; a `### HINT: ...` line inside the region becomes the
hint the learner sees. `exercises/*.ipynb` are generated from them:

    python -m fp8lab.worksheets build [--force] [--no-run]   # (or: fp8lab worksheets build)
    python -m fp8lab.worksheets build --check                # exit 1 if exercises/ is stale (CI)
    python -m fp8lab.worksheets grade exercises/ws1_fp8_encode_decode.ipynb

build
    1. runs every solution notebook headless (nbclient, kernel "python3" of this environment) and writes
       nothing if any cell fails (a solution that fails its own check must never become an exercise);
    2. replaces each answer region with its hint and `raise NotImplementedError(...)`, strips outputs and
       execution counts, and keeps only the kernelspec and language in the notebook metadata;
    3. refuses to overwrite an exercise that differs from what it generated last time (a learner edited it):
       `exercises/.manifest.json` keeps the sha256 of each generated file; `--force` overwrites anyway.
    `--check` compares without running or writing anything.

grade PATH
    runs a worksheet headless (every cell, errors included) and prints one row per check call
    (fp8lab.check.*): passed, failed (first line of the message) or not attempted. Exit status 0 even when
    questions fail (it is a report); 1 only if the notebook cannot be run.

Python API: `generate(nb)`, `build(...)`, `stale_files(...)`, `run_notebook(path)`, `grade(path)`,
`main(argv)`.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
HINT = "### HINT:"
DEFAULT_HINT = "read the description above; the check below says what it expects."
MANIFEST = ".manifest.json"
TIMEOUT_S = 600  # per cell: kernels run slowly under the simulator
_CHECK_CALL = re.compile(r"\bcheck\.([A-Za-z_]\w*)\s*\(")


class WorksheetError(Exception):
    """Something the user must fix (a stale or edited exercise, a failing solution, a malformed marker)."""


def _root() -> Path:
    """The repository root (where solutions/ lives) if this is a checkout, else the current directory."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "solutions").is_dir() else Path.cwd()


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
            else:
                out.append(line)
            continue
        if stripped == BEGIN:
            raise WorksheetError(f"{where}: nested '{BEGIN}'")
        if stripped != END:
            region.append(line)
            continue
        hints = [ln.strip()[len(HINT):].strip() for ln in region if ln.strip().startswith(HINT)]
        for h in hints or [DEFAULT_HINT]:
            out.append(f"{indent}# Hint: {h}")
        out.append(f'{indent}raise NotImplementedError("your answer goes here: replace this line")')
        region = None
    if region is not None:
        raise WorksheetError(f"{where}: '{BEGIN}' without '{END}'")
    return "\n".join(out)


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

    files = {}
    for path in sorted(solutions.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        files[path.name] = _dumps(generate(nb, str(path)))
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


def run_notebook(path, *, timeout: int = TIMEOUT_S, allow_errors: bool = True) -> RunResult:
    """Execute a notebook headless in its own directory, kernel "python3" of this environment.

    With allow_errors=False execution stops at the first failing cell. Raises WorksheetError if the
    notebook cannot be read or the kernel cannot run it (start failure, death, a cell over `timeout`).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        raise WorksheetError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    fd, report = tempfile.mkstemp(prefix="fp8lab-check-", suffix=".jsonl")
    os.close(fd)
    old = os.environ.get("FP8LAB_CHECK_REPORT")
    os.environ["FP8LAB_CHECK_REPORT"] = report  # the kernel inherits this process's environment
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                                extra_arguments=["--IPKernelApp.log_level=ERROR"],
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
    """Run a worksheet and return one row per question: question, cell, status, detail."""
    res = run_notebook(path, timeout=timeout, allow_errors=True)
    pending: dict[str, list[dict]] = {}
    for rec in res.checks:
        pending.setdefault(rec["check"], []).append(rec)
    rows = []
    for cell, name in questions(res.nb):
        recs = pending.get(name) or []
        if recs:
            rec = recs.pop(0)
            msg = rec["message"].strip().splitlines()
            rows.append({"question": name, "cell": cell, "status": rec["status"], "detail": msg[0] if msg else ""})
        else:
            err = _cell_error(res.nb.cells[cell])
            rows.append({"question": name, "cell": cell, "status": "failed",
                         "detail": f"the check did not run ({err or 'cell not reached'})"})
    return rows


def _cell_error(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            ev = str(out.get("evalue", "")).strip().splitlines()
            return f"{out.get('ename')}: {ev[0] if ev else ''}"
    return None


def print_grades(path, rows) -> None:
    """The score table: one line per question, then the total."""
    passed = sum(r["status"] == "passed" for r in rows)
    table = [["question", "cell", "status", "detail"]]
    table += [[r["question"], str(r["cell"]), r["status"],
               r["detail"] if len(r["detail"]) <= 110 else r["detail"][:107] + "..."] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    print(f"{path}")
    for j, row in enumerate(table):
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3])
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    print(f"score: {passed} of {len(rows)} questions passed")


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
            stale.append(f"{p} (differs from what {solutions / name if name != MANIFEST else solutions} generates)")
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
            + "\n  ".join(edited) + "\nsave them elsewhere, or rerun with --force to overwrite them")
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


def main(argv=None) -> int:
    """`fp8lab worksheets build [--force] [--check] [--no-run]` and `fp8lab worksheets grade PATH`."""
    p = argparse.ArgumentParser(prog="fp8lab worksheets", description="Generate and grade the worksheets.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="run solutions/, then generate exercises/ from them")
    b.add_argument("--force", action="store_true", help="overwrite exercises that were edited by hand")
    b.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming the files if exercises/ is out of date with solutions/")
    b.add_argument("--no-run", action="store_true", help="skip running the solutions first (not for releases)")
    b.add_argument("--solutions", type=Path, help="default: solutions/ of the repository")
    b.add_argument("--exercises", type=Path, help="default: exercises/ of the repository")
    b.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per cell (default %(default)s)")
    g = sub.add_parser("grade", help="run a worksheet and print a score per question")
    g.add_argument("path", type=Path)
    g.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per cell (default %(default)s)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "grade":
            rows = grade(args.path, timeout=args.timeout)
            print_grades(args.path, rows)
            return 0
        root = _root()
        sol = args.solutions or root / "solutions"
        ex = args.exercises or root / "exercises"
        if args.check:
            stale = stale_files(sol, ex)
            if stale:
                print(f"{ex} is out of date with {sol} (run `fp8lab worksheets build`):\n  " + "\n  ".join(stale),
                      file=sys.stderr)
                return 1
            print(f"{ex} is up to date with {sol}")
            return 0
        build(sol, ex, force=args.force, run=not args.no_run, timeout=args.timeout)
        return 0
    except WorksheetError as e:
        print(f"fp8lab worksheets {args.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
