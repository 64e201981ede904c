"""Worksheets: solutions pass their checks, exercises fail them as "not attempted", `fp8lab grade` reports, and
the generator protects a learner's edits. The checks' answers, right and wrong, are tested per worksheet in
test_worksheet_checks_*.py.

Each notebook is executed once per session (module-scoped fixtures); generator tests work on tmp_path copies
and never write to the repository's exercises/.
"""

from __future__ import annotations

import collections
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from fp8lab.course import check, hints, renamed, worksheets


ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
NAMES = sorted(p.name for p in SOLUTIONS.glob("*.ipynb"))
CHECKS = {"encode_e4m3", "decode_e4m3", "rmsnorm_forward_kernel", "tiled_gemm_kernel", "tile_quantize_kernel",
          "mma_a_fragment", "cvt_e4m3x2_intrinsic", "one_f_one_b", "table2_bubbles", "memory_per_device",
          "scale_from_history", "delayed_quantize_steps", "clipped_at_spike", "requantize_tile_to_col", "fp8_wgrad",
          "wgrad_errors", "memory_per_parameter", "which_precision", "per_tensor_breaks_at",
          "accumulate_limited", "promoted_dot", "promotion_errors", "swizzled_offset", "wgmma_tile_kernel",
          "scaled_group_sum", "fp8_gemm_promoted_kernel", "promotion_vs_k", "issue_overlap", "pipeline", "time_ms"}
LECTURES = {  # the lecture each worksheet links to (and back to)
    "ws1_rmsnorm_kernel.ipynb": "01_cuda_primer",
    "ws2_fp8_encode_decode.ipynb": "03_fp8_formats",
    "ws3_tile_quantize_kernel.ipynb": "04_scaling_and_quantization",
    "ws4_delayed_scaling.ipynb": "04_scaling_and_quantization",
    "ws5_tiled_gemm.ipynb": "05_cuda_through_gemm",
    "ws6_limited_accumulation.ipynb": "06_fp8_gemm_and_accumulation",
    "ws7_fp8_gemm_promotion.ipynb": "06_fp8_gemm_and_accumulation",
    "ws8_inline_ptx.ipynb": "07_ptx_sass_and_tensor_cores",
    "ws9_wgmma_tile.ipynb": "07_ptx_sass_and_tensor_cores",
    "ws10_fp8_linear_backward.ipynb": "09_training_the_deepseek_way",
    "ws11_training_recipe.ipynb": "09_training_the_deepseek_way",
    "ws12_pipeline_schedules.ipynb": "10_overlap_and_communication",
    "ws13_two_stream_overlap.ipynb": "10_overlap_and_communication",
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
    """A learner started ws2 (a copy in work/), answered one question wrongly and left the other; a typo in
    another cell. `fp8lab grade ws2` grades the copy: one failed row (with the message's first line), one not
    attempted, the cell error, exit status 1; a line points to --hints, which adds the failed question's second
    hint."""
    root = tmp_path / "course"
    shutil.copytree(generated, root / "exercises")
    monkeypatch.setattr(worksheets, "_root", lambda: root)
    path = worksheets.start("ws2", log=lambda *a: None)
    assert path == root / "work" / "ws2_fp8_encode_decode.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and "def decode_e4m3" in c.source)
    cell.source = cell.source.replace('raise NotImplementedError("your answer goes here: replace this line")',
                                      "return float(code)")
    nb.cells.append(nbformat.v4.new_code_cell("prnt('a typo')"))
    nbformat.write(nb, path)
    assert worksheets.main(["ws2"], prog="fp8lab grade") == 1
    out = capsys.readouterr().out
    assert "(cell error)" in out and "NameError: name 'prnt' is not defined" in out
    assert "score: 0 of 2 questions passed" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip().startswith(("decode_e4m3", "encode_e4m3"))}
    assert "failed" in lines["decode_e4m3"] and "codes decode wrongly" in lines["decode_e4m3"]
    assert "not attempted" in lines["encode_e4m3"]
    # the second hints only with --hints, and only for the failed question
    second = json.loads((root / "exercises" / hints.FILE).read_text())["worksheets"]["ws2"]["questions"]
    assert "`fp8lab grade ws2 --hints` prints" in out and second[0]["hint"][0] not in out
    assert worksheets.main(["ws2", "--hints"], prog="fp8lab grade") == 1
    out = capsys.readouterr().out
    assert "ws2 question 1 (decode_e4m3), second hint" in out
    assert all(line in out for line in second[0]["hint"]) and second[1]["hint"][0] not in out


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
    target = ex / "ws1_rmsnorm_kernel.ipynb"
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
    (backup,) = (sol.parent / "work" / "backup").glob("*/ws1_rmsnorm_kernel.ipynb")  # --force kept the edit
    assert backup.read_text() == edited


def test_build_updates_generated_exercise_when_solution_changes(tree, capsys):
    sol, ex = tree
    src = sol / "ws2_fp8_encode_decode.ipynb"
    nb = nbformat.read(src, as_version=4)
    nb.cells[0].source += "\n\nA new sentence."
    nbformat.write(nb, src)
    check_args = ["build", "--check", "--solutions", str(sol), "--exercises", str(ex)]
    assert worksheets.main(check_args) == 1
    assert "ws2_fp8_encode_decode.ipynb" in capsys.readouterr().err
    # the exercise on disk is what the generator wrote last time, so it is replaced without --force
    written = worksheets.build(sol, ex, run=False, log=lambda *a: None)
    assert written == ["ws2_fp8_encode_decode.ipynb", worksheets.MANIFEST]
    assert "A new sentence." in (ex / "ws2_fp8_encode_decode.ipynb").read_text()
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


# ----------------------------------------------------------------------------------------------------------------
# Hints in two steps: `### HINT:` in the exercise, `### HINT2:` (the answer) in exercises/.hints.json
# ----------------------------------------------------------------------------------------------------------------

def _second_hints() -> dict:
    return json.loads(worksheets.generated_files(SOLUTIONS)[hints.FILE])["worksheets"]


def test_exercises_hold_no_second_hint(generated):
    data = _second_hints()
    assert sorted(data, key=lambda w: int(w[2:])) == [n.split("_")[0] for n in worksheets._names(SOLUTIONS)]
    for ws, entry in data.items():
        text = (generated / entry["file"]).read_text()
        source = nbformat.read(generated / entry["file"], as_version=4)
        code = "\n".join(c.source for c in source.cells if c.cell_type == "code")
        assert "HINT2" not in text
        for q in entry["questions"]:
            assert q["hint"], f"{ws} {q['check']}: no ### HINT2: line in its answer regions"
            for line in q["hint"]:
                assert line not in code, f"{ws} {q['check']}: the second hint {line!r} is in the exercise"
        assert [q["check"] for q in entry["questions"]] == [
            name for _, name in worksheets.questions(nbformat.read(SOLUTIONS / entry["file"], as_version=4))]


@pytest.mark.parametrize("name", NAMES)
def test_worksheet_intro_says_how_to_get_the_second_hint(name):
    ws = name.split("_")[0]
    intro = nbformat.read(SOLUTIONS / name, as_version=4).cells[0].source
    assert f'check.hint("{ws}", ' in intro and f"fp8lab grade {ws} --hints" in intro


def test_second_hints_go_to_the_next_check():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    ### HINT: think\n"
                                          "    ### HINT2: return 1\n    return 1\n    ### END SOLUTION"),
                nbformat.v4.new_markdown_cell("check.not_this(f)"),
                nbformat.v4.new_code_cell("check.first(f)\ncheck.second(f)"),
                nbformat.v4.new_code_cell("### BEGIN SOLUTION\n### HINT2: g = 2\ng = 2\n### END SOLUTION"),
                nbformat.v4.new_code_cell("check.third(g)")]
    assert worksheets.second_hints(nb) == [{"check": "first", "hint": ["return 1"]},
                                           {"check": "second", "hint": []},
                                           {"check": "third", "hint": ["g = 2"]}]
    assert "# Hint: think" in worksheets.strip_solution(nb.cells[0].source)
    assert "return 1" not in worksheets.strip_solution(nb.cells[0].source)
    nb.cells.append(nbformat.v4.new_code_cell("### BEGIN SOLUTION\n### HINT2: late\n### END SOLUTION"))
    with pytest.raises(worksheets.WorksheetError, match="cell 5: '### HINT2:' with no check call"):
        worksheets.second_hints(nb, "wsx")


def test_second_hint_outside_a_region_is_refused():
    with pytest.raises(worksheets.WorksheetError, match="'### HINT2:' outside"):
        worksheets.strip_solution("### HINT2: the answer\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION")


@pytest.fixture
def fresh_counts(monkeypatch):
    from fp8lab.course.check import _core

    monkeypatch.setattr(_core, "_FAILURES", collections.Counter())


def test_second_failure_prints_the_revealing_hint_once(fresh_counts, capsys):
    ws, number, name, lines = hints.lookup(hints.load(), "ws2", "decode_e4m3")
    assert (ws, number) == ("ws2", 1) and lines

    def decode_e4m3(code):
        return float(code)  # wrong

    messages = []
    for _ in range(3):
        with pytest.raises(check.CheckFailed) as info:
            check.decode_e4m3(decode_e4m3)
        messages.append(str(info.value))
        out = capsys.readouterr().out
        assert out.count(lines[0]) == (1 if len(messages) == 2 else 0), (len(messages), out)
    assert 'check.hint("ws2", 1)' in messages[0] and lines[0] not in messages[0]
    assert all(lines[0] not in m for m in messages)
    assert "above" in messages[1]


def test_hint_on_request(capsys):
    data = hints.load()
    ws8 = data["ws8"]["questions"]
    check.hint("ws8", 2)
    out = capsys.readouterr().out
    assert out.startswith("ws8 question 2 (cvt_e4m3x2_intrinsic)")
    assert all(line in out for line in ws8[1]["hint"]) and ws8[0]["hint"][0] not in out
    assert "ir.InlineAsm(" in out  # issue 29: the line that used to sit in the exercise
    check.hint("ws8_inline_ptx", "cvt_e4m3x2_intrinsic")
    assert capsys.readouterr().out == out


@pytest.mark.parametrize("args, error, says", [
    (("ws99", 1), ValueError, "worksheet must be one of ws1, ws2, "),
    ((5, 1), TypeError, "worksheet must be a worksheet's name such as 'ws8', got int 5"),
    (("ws8", 3), ValueError, "question must be a number 1..2 or a check's name of ws8 (mma_a_fragment, "),
    (("ws8", 0), ValueError, "got 0"),
    (("ws8", "encode_e4m3"), ValueError, "got 'encode_e4m3'"),
    (("ws8", 1.0), TypeError, "question must be a number 1..2"),
    (("ws8", True), TypeError, "got bool True"),
])
def test_hint_bad_input_names_the_argument(args, error, says):
    with pytest.raises(error) as info:
        check.hint(*args)
    assert says in str(info.value)


def test_hint_without_the_generated_file(tmp_path, monkeypatch, fresh_counts, capsys):
    monkeypatch.setattr(hints, "course_root", lambda: tmp_path)
    with pytest.raises(FileNotFoundError, match=r"\.hints\.json.*fp8lab worksheets build"):
        check.hint("ws2", 1)
    for _ in range(2):  # a failing check still fails as before, without a hint to offer
        with pytest.raises(check.CheckFailed) as info:
            check.decode_e4m3(lambda code: 0.0)
        assert "check.hint" not in str(info.value)
    assert capsys.readouterr().out == ""


def test_build_leaves_work_copies_alone(tree):
    sol, ex = tree
    work = sol.parent / "work"
    work.mkdir()
    mine = work / "ws8_inline_ptx.ipynb"
    shutil.copyfile(ex / mine.name, mine)
    nb = nbformat.read(mine, as_version=4)
    nb.cells[0].source += "\n\nmy notes"
    nbformat.write(nb, mine)
    before = mine.read_bytes()
    src = nbformat.read(sol / mine.name, as_version=4)
    src.cells[0].source += "\n\nA new sentence."
    nbformat.write(src, sol / mine.name)
    assert worksheets.build(sol, ex, run=False, log=lambda *a: None) == [mine.name, worksheets.MANIFEST]
    assert mine.read_bytes() == before and sorted(p.name for p in work.iterdir()) == [mine.name]


def test_renamed_table_matches_the_exercises():
    """Every old name maps to a worksheet that exists now, and no old name is a current one (so a copy's full file
    name always says which worksheet it is)."""
    now = {p.name for p in EXERCISES.glob("ws*.ipynb")}
    assert set(renamed.RENAMED.values()) <= now and not set(renamed.RENAMED) & now
    assert len(set(renamed.RENAMED.values())) == len(renamed.RENAMED)


def test_old_numbered_copies_are_named_never_graded_as_another(tmp_path, monkeypatch, capsys):
    """A learner's copies from before the renumbering (work/ws5_inline_ptx.ipynb is today's ws8, and ws5 is now the
    tiled GEMM): `fp8lab grade` and `fp8lab worksheets start` say what each is and how to rename it, never grade it as
    the worksheet that now carries its number, and never rename, overwrite or delete it."""
    root = tmp_path / "course"
    shutil.copytree(EXERCISES, root / "exercises")
    monkeypatch.setattr(worksheets, "_root", lambda: root)
    work = root / "work"
    work.mkdir()
    old_ptx, old_e4m3 = work / "ws5_inline_ptx.ipynb", work / "ws1_fp8_encode_decode.ipynb"
    shutil.copyfile(root / "exercises" / "ws8_inline_ptx.ipynb", old_ptx)
    shutil.copyfile(root / "exercises" / "ws2_fp8_encode_decode.ipynb", old_e4m3)
    old_ptx.write_text(old_ptx.read_text().replace("raise NotImplementedError", "raise  NotImplementedError"))
    before = {p.name: p.read_bytes() for p in work.iterdir()}

    # grade ws5: the tiled GEMM has no copy; the old ws5 is named as today's ws8, and nothing is graded
    assert worksheets.main(["ws5"], prog="fp8lab grade") == 2
    out, err = capsys.readouterr()
    assert "score" not in out
    assert ("work/ws5_tiled_gemm.ipynb does not exist. work/ws5_inline_ptx.ipynb is your copy of what is now "
            "ws8_inline_ptx") in err
    assert "rename it to work/ws8_inline_ptx.ipynb" in err and "it is not ws5 (ws5_tiled_gemm)" in err
    # grade ws8: its copy carries the old name
    assert worksheets.main(["ws8"], prog="fp8lab grade") == 2
    err = capsys.readouterr().err
    assert "work/ws8_inline_ptx.ipynb does not exist. work/ws5_inline_ptx.ipynb is your copy of what is now" in err
    # start ws8 / ws2: no fresh copy beside the learner's own without being asked
    for name, old in (("ws8", old_ptx), ("ws2", old_e4m3)):
        with pytest.raises(worksheets.WorksheetError, match=rf"{old.name} is your copy of what is now .*--fresh"):
            worksheets.start(name, log=lambda *a: None)
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before
    # start ws1 (now the RMSNorm kernel): copied, with a note that the old ws1 is another worksheet
    said = []
    assert worksheets.start("ws1", log=said.append) == work / "ws1_rmsnorm_kernel.ipynb"
    assert any(s.startswith("note: work/ws1_fp8_encode_decode.ipynb is your copy of what is now "
                            "ws2_fp8_encode_decode") and "it is not ws1" in s for s in said)
    # asked with --fresh: a new ws8 beside the old copy, which is kept; grading ws8 grades the new one, with a note
    said = []
    worksheets.start("ws8", fresh=True, log=said.append)
    assert any("work/ws8_inline_ptx.ipynb exists too" in s for s in said)
    assert worksheets._gradable("ws8", log=said.append) == work / "ws8_inline_ptx.ipynb"
    assert "grade the old one with `fp8lab grade work/ws5_inline_ptx.ipynb`" in said[-1]
    # graded by its path, the old copy runs its own checks (by name): allowed, with a note
    said = []
    assert worksheets._gradable(str(old_ptx), log=said.append) == old_ptx and "ws8_inline_ptx" in said[0]
    assert all((work / n).read_bytes() == b for n, b in before.items())
