"""Worksheets: solutions pass their checks, exercises fail them as "not attempted", `fp8lab grade` reports, and
the generator protects a learner's edits. The checks' answers, right and wrong, are tested per worksheet in
test_worksheet_checks_*.py.

Each notebook is executed once per session (module-scoped fixtures); generator tests work on tmp_path copies
and never write to the repository's exercises/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from fp8lab.course import worksheets


ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
NAMES = sorted(p.name for p in SOLUTIONS.glob("*.ipynb"))
CHECKS = {"encode_e4m3", "decode_e4m3", "rmsnorm_forward_kernel", "tiled_gemm_kernel", "tile_quantize_kernel",
          "mma_a_fragment", "cvt_e4m3x2_intrinsic", "one_f_one_b", "table2_bubbles", "memory_per_device",
          "scale_from_history", "delayed_quantize_steps", "clipped_at_spike", "requantize_tile_to_col", "fp8_wgrad",
          "wgrad_errors", "memory_per_parameter", "which_precision", "per_tensor_breaks_at",
          "accumulate_limited", "promoted_dot", "promotion_errors"}
LECTURES = {  # the lecture each worksheet links to (and back to)
    "ws1_fp8_encode_decode.ipynb": "03_fp8_formats",
    "ws2_rmsnorm_kernel.ipynb": "01_cuda_primer",
    "ws3_tiled_gemm.ipynb": "05_cuda_through_gemm",
    "ws4_tile_quantize_kernel.ipynb": "04_scaling_and_quantization",
    "ws5_inline_ptx.ipynb": "07_ptx_sass_and_tensor_cores",
    "ws6_pipeline_schedules.ipynb": "09_overlap_and_communication",
    "ws7_limited_accumulation.ipynb": "06_fp8_gemm_and_accumulation",
    "ws8_delayed_scaling.ipynb": "04_scaling_and_quantization",
    "ws9_fp8_linear_backward.ipynb": "08_training_the_deepseek_way",
    "ws10_training_recipe.ipynb": "08_training_the_deepseek_way",
}


def test_worksheets_exist():
    assert NAMES == sorted(LECTURES)


@pytest.fixture(scope="module")
def graded_solutions():
    return {name: worksheets.grade(SOLUTIONS / name) for name in NAMES}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """exercises/ as solutions/ generate them, in a tmp folder: the tests judge these, never the files in
    exercises/, which a learner may have edited in place."""
    d = tmp_path_factory.mktemp("exercises")
    for name, data in worksheets.generated_files(SOLUTIONS).items():
        (d / name).write_bytes(data)
    return d


@pytest.fixture(scope="module")
def graded_exercises(generated):
    return {name: worksheets.grade(generated / name) for name in NAMES}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_every_check(graded_solutions, name):
    """(`fp8lab grade` exits 0 exactly when every row passed: _grade_main.)"""
    rows = graded_solutions[name]
    assert rows, f"{name} calls no fp8lab.course.check function"
    assert all(r["status"] == "passed" for r in rows), rows


@pytest.mark.slow
def test_every_check_has_a_worksheet(graded_solutions):
    asked = {r["question"] for rows in graded_solutions.values() for r in rows}
    assert CHECKS <= asked, f"no worksheet calls {sorted(CHECKS - asked)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_exercise_is_not_attempted(graded_exercises, graded_solutions, name):
    rows = graded_exercises[name]
    assert [r["question"] for r in rows] == [r["question"] for r in graded_solutions[name]]
    for r in rows:
        assert r["status"] == "not attempted" and r["detail"].startswith("not attempted yet"), r


def test_grade_report_mixes_outcomes(tmp_path, generated, monkeypatch, capsys):
    """A learner started ws1 (a copy in work/), answered one question wrongly and left the other; a typo in
    another cell. `fp8lab grade ws1` grades the copy: one failed row (with the message's first line), one not
    attempted, the cell error, exit status 1."""
    root = tmp_path / "course"
    shutil.copytree(generated, root / "exercises")
    monkeypatch.setattr(worksheets, "_root", lambda: root)
    path = worksheets.start("ws1", log=lambda *a: None)
    assert path == root / "work" / "ws1_fp8_encode_decode.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "def decode_e4m3" in c.source)
    cell.source = cell.source.replace('raise NotImplementedError("your answer goes here: replace this line")',
                                      "return float(code)")
    nb.cells.append(nbformat.v4.new_code_cell("prnt('a typo')"))
    nbformat.write(nb, path)
    assert worksheets.main(["ws1"], prog="fp8lab grade") == 1
    out = capsys.readouterr().out
    assert "(cell error)" in out and "NameError: name 'prnt' is not defined" in out
    assert "score: 0 of 2 questions passed" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip().startswith(("decode_e4m3", "encode_e4m3"))}
    assert "failed" in lines["decode_e4m3"] and "codes decode wrongly" in lines["decode_e4m3"]
    assert "not attempted" in lines["encode_e4m3"]


def test_grade_unreadable_notebook_is_an_error(tmp_path, capsys):
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{not json")
    assert worksheets.main(["grade", str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_grade_non_worksheet_is_exit_2(tmp_path, capsys):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    path = tmp_path / "not_a_worksheet.ipynb"
    nbformat.write(nb, path)
    assert worksheets.main(["grade", str(path)]) == 2
    assert "not a worksheet" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# The generator
# ----------------------------------------------------------------------------------------------------------------


def _versions(path: Path) -> list[bytes]:
    """The file in the work tree and as committed: a learner's edits in place do not count against the course,
    an instructor's rebuild counts before it is committed."""
    import subprocess

    r = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{path.relative_to(ROOT).as_posix()}"],
                       capture_output=True)
    return [path.read_bytes() if path.is_file() else b""] + ([r.stdout] if r.returncode == 0 else [])


def test_committed_exercises_are_what_solutions_generate():
    want = worksheets.generated_files(SOLUTIONS)
    stale = [name for name, data in want.items() if data not in _versions(EXERCISES / name)]
    assert not stale, f"exercises/ is out of date with solutions/ (run `fp8lab worksheets build`): {stale}"
    assert sorted(p.name for p in EXERCISES.glob("*.ipynb")) == sorted(n for n in want if n.endswith(".ipynb"))


def test_strip_solution():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    ### HINT: add one\n    return x + 1\n    ### END SOLUTION\n\nf(1)"
    out = worksheets.strip_solution(src)
    assert out == ('def f(x):\n    # Hint: add one\n'
                   '    raise NotImplementedError("your answer goes here: replace this line")\n\nf(1)')
    assert "# Hint: " + worksheets.DEFAULT_HINT in worksheets.strip_solution("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")
    for bad in ("### BEGIN SOLUTION\nx = 1", "x = 1\n### END SOLUTION", "### BEGIN SOLUTION\n### BEGIN SOLUTION"):
        with pytest.raises(worksheets.WorksheetError):
            worksheets.strip_solution(bad)


def test_exercises_are_clean(generated):
    for name in NAMES:
        text = (generated / name).read_text()
        assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
        nb = nbformat.read(generated / name, as_version=4)
        assert set(nb.metadata) == {"kernelspec", "language_info"}
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None
        assert f"../notebooks/{LECTURES[name]}.ipynb" in text


@pytest.fixture
def tree(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(SOLUTIONS, sol)
    worksheets.build(sol, ex, run=False, log=lambda *a: None)
    return sol, ex


def test_build_protects_edited_exercise(tree, capsys):
    sol, ex = tree
    assert worksheets.stale_files(sol, ex) == []
    target = ex / "ws2_rmsnorm_kernel.ipynb"
    nb = nbformat.read(target, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "NotImplementedError" in c.source)
    cell.source = cell.source.replace("raise NotImplementedError", "pass  # my answer\n    # raise NotImplementedError")
    nbformat.write(nb, target)
    edited = target.read_text()
    args = ["build", "--no-run", "--solutions", str(sol), "--exercises", str(ex)]
    assert worksheets.main(args) == 1
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and str(target) in err
    assert target.read_text() == edited
    assert worksheets.main(["build", "--check", "--solutions", str(sol), "--exercises", str(ex)]) == 1
    assert str(target) in capsys.readouterr().err
    assert worksheets.main(args + ["--force"]) == 0
    assert worksheets.stale_files(sol, ex) == []
    (backup,) = (sol.parent / "work" / "backup").glob("*/ws2_rmsnorm_kernel.ipynb")  # --force kept the edit
    assert backup.read_text() == edited


def test_build_updates_generated_exercise_when_solution_changes(tree, capsys):
    sol, ex = tree
    src = sol / "ws1_fp8_encode_decode.ipynb"
    nb = nbformat.read(src, as_version=4)
    nb.cells[0].source += "\n\nA new sentence."
    nbformat.write(nb, src)
    check_args = ["build", "--check", "--solutions", str(sol), "--exercises", str(ex)]
    assert worksheets.main(check_args) == 1
    assert "ws1_fp8_encode_decode.ipynb" in capsys.readouterr().err
    # the exercise on disk is what the generator wrote last time, so it is replaced without --force
    written = worksheets.build(sol, ex, run=False, log=lambda *a: None)
    assert written == ["ws1_fp8_encode_decode.ipynb", worksheets.MANIFEST]
    assert "A new sentence." in (ex / "ws1_fp8_encode_decode.ipynb").read_text()
    assert worksheets.main(check_args) == 0
    assert worksheets.build(sol, ex, run=False, log=lambda *a: None) == []


def test_build_refuses_when_a_solution_fails(tmp_path):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION"),
                nbformat.v4.new_code_cell("assert x == 2, 'the solution is wrong'")]
    nbformat.write(nb, sol / "wsx.ipynb")
    with pytest.raises(worksheets.WorksheetError, match="wsx.ipynb: cell 1: AssertionError"):
        worksheets.build(sol, ex, log=lambda *a: None)
    assert not ex.exists()
