"""Probes a new user tried (issue "Runs a user can trust"): each one was cryptic or silent and now gives a clear error
naming the argument, or has a documented behaviour. The training and checkpoint probes are in tests/test_checkpoint.py
and tests/test_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.comm import pipeline
from fp8lab.course import worksheets

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, timeout=600):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "fp8lab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


# --------------------------------------------------------------------------------------------- the public API


def test_a_masked_array_is_refused_not_read_under_its_mask():
    x = np.ma.masked_array(np.ones((4, 8), np.float32), mask=np.eye(4, 8, dtype=bool))
    with pytest.raises(TypeError, match=r"x must be a plain array, got a masked array .* x.filled\(value\)"):
        fl.quantize(x)
    with pytest.raises(TypeError, match="a must be a plain array, got a masked array"):
        fl.gemm(x, np.ones((8, 3), np.float32))


def test_a_read_only_out_is_named():
    a = np.ones((5, 7), np.float32)
    out = np.zeros((5, 5), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writable .* got a read-only ndarray of shape"):
        fl.gemm(a, a.T.copy(), out=out)


def test_a_fraction_is_a_learning_rate_like_any_real_number():
    h = fl.train("fp32", steps=1, lr=Fraction(1, 1000), ema_decay=Fraction(9, 10), engine="reference",
                 progress=False)
    assert h.lr == 1e-3 and np.isfinite(h.loss).all()
    with pytest.raises(ValueError, match="lr must be a positive finite number, got 10"):
        fl.train("fp32", steps=1, lr=Fraction(10**400, 1), engine="reference", progress=False)
    with pytest.raises(TypeError, match="lr must be a positive number, got str"):
        fl.train("fp32", steps=1, lr="1e-3", engine="reference", progress=False)


def test_alltoall_without_pytorch_says_how_to_install_the_extra(monkeypatch):
    from fp8lab.comm import moe_alltoall

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ImportError, match=r"pip install -e '\.\[torch\]'"):
        moe_alltoall.run_alltoall(2, 8, 16, 4, 2)


# ---------------------------------------------------------------------------------------- the pipeline simulator


def test_pipeline_times_too_large_for_a_float_are_named():
    with pytest.raises(ValueError, match="F, B, W, FB: times this large .* overflow a float over 20 micro-batches"):
        pipeline.simulate("1f1b", 8, 20, 1e308, 1e308, 0)
    with pytest.raises(ValueError, match="overflow a float over 8 stages"):
        pipeline.table2(8, 1e308, 1e308, 0)
    assert pipeline.simulate("1f1b", 8, 20, 10**400, 10**400, 0).makespan > 10**400  # ints stay exact
    r = _cli("pipeline", "--F", "1e308", "--B", "1e308", "--W", "0")
    assert r.returncode == 2 and "fp8lab pipeline: error: F, B, W, FB: times this large" in r.stderr
    assert "Traceback" not in r.stderr


def test_pipeline_estimates_its_work_and_refuses_or_warns_with_a_number():
    with pytest.raises(ValueError, match=r"stages=64 x microbatches=20000 is 3,840,000 operations .* at most "
                                         r"3,000,000"):
        pipeline.simulate("1f1b", 64, 20000, 1, 2, 1)
    with pytest.warns(UserWarning, match=r"stages=16 x microbatches=7000 is 336,000 operations to simulate per "
                                         r"schedule \(about \d+ s"):
        assert pipeline.check_size(16, 7000) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # below WARN_OPS: silent
        pipeline.simulate("zb1p", 8, 20, 1, 2, 1)
    r = _cli("pipeline", "--stages", "64", "--microbatches", "20000")
    assert r.returncode == 2 and "3,840,000 operations" in r.stderr and "fewer micro-batches" in r.stderr


# ------------------------------------------------------------------------------------------------ worksheets


def _ws2_with(tmp_path, before_answer: str) -> Path:
    """The ws2 solution with `before_answer` inserted at the top of its first answer."""
    nb = json.loads((ROOT / "solutions" / "ws2_fp8_encode_decode.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if worksheets.BEGIN in src:
            lines = src.split("\n")
            i = next(k for k, line in enumerate(lines) if worksheets.BEGIN in line)
            indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
            lines.insert(i + 1, "\n".join(indent + line for line in before_answer.split("\n")))
            cell["source"] = "\n".join(lines)
            break
    path = tmp_path / "ws2_probe.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_grade_reports_a_cell_that_never_ends_and_still_prints_the_table(tmp_path):
    path = _ws2_with(tmp_path, "while True:\n    pass")
    r = _cli("grade", str(path), "--timeout", "5", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "timed out: still running after 5 s, interrupted" in r.stdout and "score: 1 of 2 questions passed" in \
        r.stdout, r.stdout
    assert "Traceback" not in r.stderr and "ZMQError" not in r.stderr


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_grade_timeout_must_be_positive(value):
    r = _cli("grade", "ws2", "--timeout", value)
    assert r.returncode == 2 and "--timeout: must be a positive number of seconds per cell" in r.stderr


def test_grade_prints_a_failed_checks_whole_detail(capsys):
    detail = ("your codes differ at 3 of 261 inputs; e.g. " + "x = 1.25 should encode to 0x3A, got 0x3B; " * 4).strip()
    worksheets.print_grades("ws.ipynb", [{"question": "encode_e4m3", "cell": 7, "status": "failed",
                                          "detail": detail}])
    out = capsys.readouterr().out
    assert " ".join(out.split()).count("should encode to 0x3A") == 4 and "..." not in out
    assert all(len(line) <= 120 for line in out.splitlines())


def test_start_and_grade_refuse_files_and_folders_in_the_wrong_place(tmp_path):
    work = tmp_path / "work"
    work.write_text("not a folder")
    with pytest.raises(worksheets.WorksheetError, match=r"work is a file, not a folder: your worksheet copies go in"):
        worksheets.start("ws2", work=work, log=lambda *a: None)
    work.unlink()
    (work / "ws2_fp8_encode_decode.ipynb").mkdir(parents=True)
    with pytest.raises(worksheets.WorksheetError, match="ws2_fp8_encode_decode.ipynb is a folder, not your copy"):
        worksheets.start("ws2", work=work, log=lambda *a: None)
    assert (work / "ws2_fp8_encode_decode.ipynb").is_dir()  # nothing touched
    r = _cli("grade", str(work))
    assert r.returncode == 2 and "is a folder: grade a worksheet by its name" in r.stderr


# ------------------------------------------------------------------------------------------------ the commands


def test_bench_help_lists_the_ops():
    r = _cli("bench", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert all(op in text for op in ("reduce", "fp8_gemm", "norm_quant", "overhead", "overlap"))
