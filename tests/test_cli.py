"""The command line as a learner meets it: --backend applied before the backend is chosen, one clear line
(exit 2, no traceback) for a bad backend, and the worksheet flow start -> work/ copy -> grade."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.device import runtime
from fp8lab.course import worksheets

ROOT = Path(__file__).resolve().parents[1]


def fp8lab_cli(*args, cwd=None, **env):
    e = dict(os.environ)
    e.pop("FP8LAB_BACKEND", None)
    e.update(env)
    return subprocess.run([sys.executable, "-m", "fp8lab.cli", *args], capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=300)


def one_line_error(r, *words):
    assert r.returncode in (1, 2), (r.stdout, r.stderr)  # 1: worksheets' own errors
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_backend_flag_is_applied_before_the_backend_is_chosen():
    other = "gpu" if runtime.IS_SIM else "sim"  # the backend this machine would not pick by itself
    r = fp8lab_cli("--backend", other, "info")
    if other == "sim":
        assert r.returncode == 0 and "backend" in r.stdout and " sim" in r.stdout, r.stderr
    else:
        one_line_error(r, "fp8lab: error:", "--backend gpu, but", "simulator")
        one_line_error(fp8lab_cli("info", "--backend", "gpu"), "--backend gpu, but")  # after the command too
        one_line_error(fp8lab_cli("info", FP8LAB_BACKEND="gpu"), "FP8LAB_BACKEND=gpu, but")
        # checked before a notebook runs: grading must not report every question failed instead
        one_line_error(fp8lab_cli("--backend", "gpu", "grade", "ws2"), "--backend gpu, but")
    r = fp8lab_cli(f"--backend={runtime.backend}", "info")
    assert r.returncode == 0 and f" {runtime.backend}" in r.stdout, r.stderr


@pytest.mark.parametrize("args, env, words", [
    (["info"], {"FP8LAB_BACKEND": "bogus"}, ["FP8LAB_BACKEND must be one of ('gpu', 'sim')", "'bogus'"]),
    (["--backend", "cpu", "info"], {}, ["--backend must be one of ('gpu', 'sim')", "'cpu'"]),
    (["--backend", "cpu", "grade", "ws2"], {}, ["--backend must be one of"]),
    (["grade", "ws2"], {"FP8LAB_BACKEND": "bogus"}, ["FP8LAB_BACKEND must be one of"]),
    (["grade", "ws99"], {}, ["no worksheet 'ws99'", "ws1, ws2"]),
    (["grade", str(ROOT / "notebooks" / "00_start_here.ipynb")], {}, ["not a worksheet"]),
    (["grade", "missing.ipynb"], {}, ["cannot read missing.ipynb"]),
    (["worksheets", "start", "ws0"], {}, ["no worksheet 'ws0'"]),
    (["train", "--steps", "2", "--plot", "/proc/no/x.png"], {}, ["--plot /proc/no/x.png", "cannot"]),
    (["train", "--steps", "2", "--no-plot", "--json", str(ROOT)], {}, ["--json", "cannot write it"]),
    (["train", "--steps", "0", "--no-plot"], {}, ["steps must be"]),
    (["train", "--lr", "nan", "--steps", "2", "--no-plot"], {}, ["lr must be", "nan"]),
    (["train", "--lr", "-1", "--steps", "2", "--no-plot"], {}, ["lr must be", "-1"]),
    (["train", "--noise", "inf", "--steps", "2", "--no-plot"], {}, ["noise must be", "inf"]),
    (["train", "--batch", "0", "--steps", "2", "--no-plot"], {}, ["batch must be", "0"]),
    (["train", "--d-in", "-3", "--steps", "2", "--no-plot"], {}, ["d_in must be", "-3"]),
    # the folders and the memory, before the first step (issue 27)
    (["train", "--task", "chars", "--save", str(ROOT / "README.md"), "--no-plot"], {},
     [f"--save {ROOT / 'README.md'}: {ROOT / 'README.md'} is a file, not a folder"]),
    (["train", "--task", "chars", "--save", str(ROOT / "README.md" / "runs"), "--no-plot"], {},
     [f"--save {ROOT / 'README.md' / 'runs'}: {ROOT / 'README.md'} is a file, not a folder"]),
    (["train", "--task", "chars", "--save", "/proc/fp8lab-runs", "--no-plot"], {},
     ["--save /proc/fp8lab-runs: cannot create /proc/fp8lab-runs ("]),
    (["train", "--save", "runs", "--no-plot"], {}, ["--save: only for --task chars, got --task teacher"]),
    (["train", "--task", "chars", "--resume", str(ROOT / "docs"), "--no-plot"], {},
     [f"--resume {ROOT / 'docs'} holds no checkpoint of fp32, bf16, fp8-tensor"]),
    (["train", "--task", "chars", "--engine", "reference", "--batch", "1000000000", "--no-plot"], {},
     ["--batch 1000000000: this run needs about", "TB of host memory", "is free: lower --batch"]),
    (["generate", "--from", "nowhere", "--seed", "-1"], {}, ["--seed must be a non-negative int, got -1"]),
    (["generate", "--from", str(ROOT / "docs")], {}, [f"--from {ROOT / 'docs'} holds no checkpoint.npz"]),
])
def test_bad_command_lines_give_one_clear_line(args, env, words):
    one_line_error(fp8lab_cli(*args, **env), *words)


@pytest.mark.parametrize("args, words", [
    (["bench", "nope"], ["invalid choice: 'nope'"]),
    (["bench", "gemm", "--nope"], ["unrecognized arguments: --nope"]),
    (["train", "--recipe", "fp4"], ["invalid choice: 'fp4'"]),
    (["train", "--steps", "two"], ["invalid int value: 'two'"]),
])
def test_argparse_errors_name_the_argument(args, words):
    r = fp8lab_cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.mark.parametrize("args, usage", [
    (["--backend", "sim", "grade", "--help"], "usage: fp8lab grade"),
    (["grade", "--help"], "usage: fp8lab grade"),
    (["--backend", "sim", "worksheets", "--help"], "usage: fp8lab worksheets"),
    (["worksheets", "start", "--help"], "usage: fp8lab worksheets start"),
    (["bench", "--help"], "usage: fp8lab bench"),
    (["train", "--help"], "usage: fp8lab train"),
])
def test_help_names_the_command_typed(args, usage):
    r = fp8lab_cli(*args)
    assert r.returncode == 0 and r.stdout.startswith(usage), (r.stdout, r.stderr)


def test_start_copies_an_exercise_once_and_fresh_keeps_a_backup(tmp_path, capsys):
    ex = ROOT / "exercises"
    work = tmp_path / "work"
    dst = worksheets.start("ws1", exercises=ex, work=work)
    assert dst == work / "ws1_rmsnorm_kernel.ipynb"
    assert dst.read_bytes() == (ex / dst.name).read_bytes()
    dst.write_text(dst.read_text().replace("your answer goes here", "my answer"))
    mine = dst.read_text()
    assert worksheets.start("ws1_rmsnorm_kernel.ipynb", exercises=ex, work=work) == dst
    assert dst.read_text() == mine and "already exists" in capsys.readouterr().out
    worksheets.start("ws1", fresh=True, exercises=ex, work=work)
    assert dst.read_bytes() == (ex / dst.name).read_bytes()
    (backup,) = (work / "backup").glob("*/ws1_rmsnorm_kernel.ipynb")
    assert backup.read_text() == mine
    worksheets.start("ws1", fresh=True, exercises=ex, work=work)  # an untouched copy: nothing to back up
    assert len(list((work / "backup").glob("*/*.ipynb"))) == 1
    dst.write_text(dst.read_text().replace("your answer goes here", "second try"))
    worksheets.start("ws1", fresh=True, exercises=ex, work=work)  # within the same second: a new folder
    saved = sorted(p.read_text() for p in (work / "backup").glob("*/ws1_rmsnorm_kernel.ipynb"))
    assert len(saved) == 2 and mine in saved and any("second try" in t for t in saved)
    with pytest.raises(worksheets.WorksheetError, match="no worksheet 'ws77'"):
        worksheets.start("ws77", exercises=ex, work=work)
    with pytest.raises(TypeError, match="name must be a worksheet name"):
        worksheets.start(1, exercises=ex, work=work)


def test_work_folder_is_ignored_by_git():
    r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "work/ws2_fp8_encode_decode.ipynb"])
    assert r.returncode == 0, "work/ (learners' copies) must be in .gitignore"
