"""Worksheets: solutions pass their checks, exercises fail them as "not attempted", wrong answers are caught
with a specific message, and the generator protects a learner's edits. Small shapes: runs on the simulator.

Each notebook is executed once per session (module-scoped fixtures); generator tests work on tmp_path copies
and never write to the repository's exercises/.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import nbformat
import numpy as np
import pytest

from fp8lab.course import check, worksheets
from fp8lab.numerics import formats
from fp8lab.device import ptx
from fp8lab.kernels.common import encode_e4m3_sat
from fp8lab.device.runtime import FULL_MASK, cuda, shfl_down_sync, shfl_xor_sync

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


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_every_check(graded_solutions, name):
    """(`fp8lab grade` exits 0 exactly when every row passed: _grade_main.)"""
    rows = graded_solutions[name]
    assert rows, f"{name} calls no fp8lab.course.check function"
    assert all(r["status"] == "passed" for r in rows), rows


def test_every_check_has_a_worksheet(graded_solutions):
    asked = {r["question"] for rows in graded_solutions.values() for r in rows}
    assert CHECKS <= asked, f"no worksheet calls {sorted(CHECKS - asked)}"


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
# Wrong answers: each must be rejected with a specific message
# ----------------------------------------------------------------------------------------------------------------


def encode_ties_away(x):
    """Rounds ties away from zero (int(q + 0.5)): wrong on exact ties."""
    x = float(x)
    if math.isnan(x):
        return 0x7F
    s = 0x80 if math.copysign(1, x) < 0 else 0
    a = min(abs(x), 448.0)
    if a < 2.0**-6:
        return s | int(a * 2**9 + 0.5)
    m, e = math.frexp(a)
    return s | min(((e + 5) << 3) + int(m * 16 + 0.5), 0x7E)


def encode_no_saturation(x):
    """Right everywhere except overflow, where it returns NaN (like ml_dtypes) instead of saturating."""
    from fp8lab.numerics import formats

    return int(formats.encode(np.float32(x), formats.E4M3, saturate=False))


def decode_no_subnormals(code):
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    v = (1 + m / 8) * 2.0 ** (e - 7)  # forgets that e == 0 means 0.mmm * 2^-6
    return -v if s else v


def decode_unsigned_zero(code):
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    v = m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10)
    return -v if s and v else v  # 0x80 -> +0.0


THREADS = check.RMSNORM_THREADS
EPS = check.RMSNORM_EPS
TILE = check.GEMM_TILE
QT = check.QUANT_TILE
PER_LANE = QT // 32
E4M3_MAX = check.E4M3_MAX
AMAX_FLOOR = check.AMAX_FLOOR


@cuda.jit
def rmsnorm_without_eps(y, g, z, rstd):
    partial = cuda.shared.array(THREADS, np.float32)
    m = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    N = y.shape[1]
    ss = np.float32(0)
    for n in range(tid, N, cuda.blockDim.x):
        ss += y[m, n] * y[m, n]
    partial[tid] = ss
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            partial[tid] += partial[tid + s]
        cuda.syncthreads()
        s //= 2
    mean = partial[0] / np.float32(N)
    r = np.float32(1) / math.sqrt(mean) if mean > 0 else np.float32(0)
    if tid == 0:
        rstd[m] = r
    for n in range(tid, N, cuda.blockDim.x):
        z[m, n] = y[m, n] * r * g[n]


@cuda.jit
def rmsnorm_one_element_per_thread(y, g, z, rstd):
    partial = cuda.shared.array(THREADS, np.float32)
    m = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    N = y.shape[1]
    v = y[m, tid] if tid < N else np.float32(0)  # assumes N <= blockDim.x
    partial[tid] = v * v
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            partial[tid] += partial[tid + s]
        cuda.syncthreads()
        s //= 2
    r = np.float32(1) / math.sqrt(partial[0] / np.float32(N) + EPS)
    if tid == 0:
        rstd[m] = r
    if tid < N:
        z[m, tid] = v * r * g[tid]


@cuda.jit
def gemm_skips_last_k_tile(a, b, c):
    ta = cuda.shared.array((TILE, TILE), np.float32)
    tb = cuda.shared.array((TILE, TILE), np.float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    m = cuda.blockIdx.y * TILE + ty
    n = cuda.blockIdx.x * TILE + tx
    n_load = cuda.blockIdx.x * TILE + ty
    M, K = a.shape
    N = b.shape[0]
    acc = np.float32(0)
    for k0 in range(0, K - K % TILE, TILE):  # drops the partial tile
        ta[ty, tx] = a[m, k0 + tx] if m < M else np.float32(0)
        tb[ty, tx] = b[n_load, k0 + tx] if n_load < N else np.float32(0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += ta[ty, kk] * tb[tx, kk]
        cuda.syncthreads()
    if m < M and n < N:
        c[m, n] = acc


@cuda.jit
def gemm_naive(a, b, c):
    n, m = cuda.grid(2)
    if m < c.shape[0] and n < c.shape[1]:
        acc = np.float32(0)
        for k in range(a.shape[1]):
            acc += a[m, k] * b[n, k]
        c[m, n] = acc


@cuda.jit
def tile_quantize_without_amax_floor(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, abs(vals[j]))
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_xor_sync(FULL_MASK, amax, offset))
            offset //= 2
        inv = E4M3_MAX / amax  # an all-zero tile: 448 / 0 = Inf, and 0 * Inf = NaN
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] * inv)
        if lane == 0:
            scale[r, t] = amax / E4M3_MAX


@cuda.jit
def tile_quantize_shfl_down(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, abs(vals[j]))
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_down_sync(FULL_MASK, amax, offset))  # only lane 0 ends with the tile's max
            offset //= 2
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        inv = E4M3_MAX / safe
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] * inv)
        if lane == 0:
            scale[r, t] = safe / E4M3_MAX


@cuda.jit
def tile_quantize_divides_by_scale(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, abs(vals[j]))
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_xor_sync(FULL_MASK, amax, offset))
            offset //= 2
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        s = safe / E4M3_MAX
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] / s)  # rounds differently from vals[j] * (448 / safe)
        if lane == 0:
            scale[r, t] = s


@cuda.jit
def tile_quantize_signed_max(x, codes, scale):
    vals = cuda.local.array(PER_LANE, np.float32)
    K = x.shape[1]
    ntk = scale.shape[1]
    lane = cuda.threadIdx.x % 32
    w = cuda.grid(1) // 32
    if w < scale.size:
        r, t = w // ntk, w % ntk
        amax = np.float32(0)
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            vals[j] = x[r, c] if c < K else np.float32(0)
            amax = max(amax, vals[j])  # forgets abs(): a negative outlier is missed
        offset = 16
        while offset > 0:
            amax = max(amax, shfl_xor_sync(FULL_MASK, amax, offset))
            offset //= 2
        safe = amax if amax > AMAX_FLOOR else AMAX_FLOOR
        inv = E4M3_MAX / safe
        for j in range(PER_LANE):
            c = t * QT + lane + 32 * j
            if c < K:
                codes[r, c] = encode_e4m3_sat(vals[j] * inv)
        if lane == 0:
            scale[r, t] = safe / E4M3_MAX


WRONG = [
    (check.encode_e4m3, encode_ties_away, "ties to even"),
    (check.encode_e4m3, encode_no_saturation, "[overflow]"),
    (check.decode_e4m3, decode_no_subnormals, "exponent field 0 means subnormal"),
    (check.decode_e4m3, decode_unsigned_zero, "0x80 is -0.0"),
    (check.rmsnorm_forward_kernel, rmsnorm_without_eps, "eps = RMSNORM_EPS inside the sqrt"),
    (check.rmsnorm_forward_kernel, rmsnorm_one_element_per_thread, "range(cuda.threadIdx.x, N, cuda.blockDim.x)"),
    (check.tiled_gemm_kernel, gemm_skips_last_k_tile, "the last, partial tile of K is missing"),
    (check.tiled_gemm_kernel, gemm_naive, "uses no shared memory"),
    (check.tile_quantize_kernel, tile_quantize_without_amax_floor, "at most AMAX_FLOOR: floor it first"),
    (check.tile_quantize_kernel, tile_quantize_shfl_down, "shfl_down_sync leaves it in lane 0 only"),
    (check.tile_quantize_kernel, tile_quantize_divides_by_scale, "not divide by scale"),
    (check.tile_quantize_kernel, tile_quantize_signed_max, "take abs() of each element before the max"),
]


# the simulator runs kernels on NumPy scalars, which warn where a GPU silently gives Inf/NaN (no amax floor)
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("checker, answer, says", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg, msg
    assert "hint:" in msg and "passed" not in capsys.readouterr().out


def test_not_attempted_function_and_kernel():
    def encode_e4m3(x):
        raise NotImplementedError("your answer goes here: replace this line")

    @cuda.jit
    def tiled_gemm_kernel(a, b, c):
        raise NotImplementedError("your answer goes here: replace this line")

    @cuda.jit
    def tile_quantize_kernel(x, codes, scale):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.encode_e4m3, encode_e4m3), (check.tiled_gemm_kernel, tiled_gemm_kernel),
                            (check.tile_quantize_kernel, tile_quantize_kernel)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


def test_check_report_file(tmp_path, monkeypatch, capsys):
    report = tmp_path / "r.jsonl"
    monkeypatch.setenv(check.REPORT_ENV, str(report))
    check.decode_e4m3(lambda c: float(formats.value_table()[c]))
    with pytest.raises(check.CheckFailed):
        check.decode_e4m3(decode_no_subnormals)
    recs = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(r["check"], r["status"]) for r in recs] == [("decode_e4m3", "passed"), ("decode_e4m3", "failed")]
    assert capsys.readouterr().out.startswith("passed: decode_e4m3")


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


# ------------------------------------------------------------------------------------ ws5: inline PTX and twins


def _a_fragment_rows_swapped(lane, i):
    g, t = lane >> 2, lane & 3
    r = i >> 2
    return g + 8 * (r >> 1), 4 * t + (i & 3) + 16 * (r & 1)  # registers 1 and 2 exchanged


def _cvt_twin(hi, lo):
    def code(x):
        return int(formats.encode(np.float32(x), saturate=True))

    return (code(hi) << 8) | code(lo)


def _cvt_twin_swapped(hi, lo):
    return _cvt_twin(lo, hi)


def _cvt_intrinsic(text, constraints):
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def cvt(typingctx, hi, lo):
        sig = types.uint16(hi, lo)

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.IntType(16), [ir.FloatType(), ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, text, constraints), list(args))

        return sig, codegen

    return intrinsic(cvt)


def test_ws5_right_answers_pass(rng, capsys):
    layout = ptx.mma_m16n8k32_layout()["a"]
    check.mma_a_fragment(lambda lane, i: tuple(int(v) for v in layout[lane, i]))
    check.cvt_e4m3x2_intrinsic(_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f"), _cvt_twin, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 2


@pytest.mark.parametrize("answer, says", [
    ((_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,f,f"), _cvt_twin), "hi, then lo"),
    ((_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=r,f,f"), _cvt_twin), "16-bit register"),
    ((_cvt_intrinsic("cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f"), _cvt_twin_swapped), "upper byte"),
], ids=["operands swapped", "wrong constraint", "twin swapped"])
def test_ws5_wrong_answers_are_rejected(answer, says, rng):
    from fp8lab.device import runtime

    if not runtime.IS_SIM and says != "upper byte":
        pytest.skip("on a GPU a wrong asm shows up as wrong results or a compile error, checked by the run")
    with pytest.raises(check.CheckFailed) as info:
        check.cvt_e4m3x2_intrinsic(*answer, rng=rng)
    assert says in str(info.value) and "hint:" in str(info.value)


def test_ws5_wrong_fragment_and_placeholder():
    with pytest.raises(check.CheckFailed, match="lane 0, value 4"):
        check.mma_a_fragment(_a_fragment_rows_swapped)

    def a_fragment(lane, i):
        raise NotImplementedError("your answer goes here")

    with pytest.raises(check.NotAttempted):
        check.mma_a_fragment(a_fragment)


# --------------------------------------------------------------------------- ws6: pipeline schedules (no kernels)


def _ws6_orders(stages, microbatches, warm):
    """1F1B's shape with warm(s) warm-up forwards on stage s (clamped to 0..N)."""
    out = []
    for s in range(stages):
        w = max(0, min(warm(s), microbatches))
        order = [("F", m) for m in range(w)]
        for i in range(microbatches - w):
            order += [("F", w + i), ("B", i)]
        out.append(order + [("B", m) for m in range(microbatches - w, microbatches)])
    return out


def ws6_one_f_one_b(stages, microbatches):
    return _ws6_orders(stages, microbatches, lambda s: stages - 1 - s)


def ws6_gpipe(stages, microbatches):
    return [[("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
            for _ in range(stages)]


def ws6_one_warmup_too_many(stages, microbatches):
    return _ws6_orders(stages, microbatches, lambda s: stages - s)


def ws6_one_warmup_too_few(stages, microbatches):
    return _ws6_orders(stages, microbatches, lambda s: stages - 2 - s)


def ws6_warmups_reversed(stages, microbatches):
    return _ws6_orders(stages, microbatches, lambda s: s)


def ws6_backward_before_forward(stages, microbatches):
    orders = ws6_one_f_one_b(stages, microbatches)
    orders[-1][0], orders[-1][1] = orders[-1][1], orders[-1][0]  # the last stage: ("B", 0) before ("F", 0)
    return orders


def ws6_no_cooldown(stages, microbatches):
    return [o[: len(o) - (stages - 1 - s)] for s, o in enumerate(ws6_one_f_one_b(stages, microbatches))]


def ws6_split_backwards(stages, microbatches):
    return [o + [("W", m) for m in range(microbatches)] for o in ws6_one_f_one_b(stages, microbatches)]


def ws6_table2(PP, F, B, W, FB):
    return (PP - 1) * (F + B), (PP / 2 - 1) * (FB + B - 3 * W)


def ws6_memory(timeline):
    out = []
    for s, events in enumerate(timeline.events):
        stages, held, peak = set(), 0, 0
        for e in events:
            stages |= {s if d == 0 else timeline.stages - 1 - s for d in (e.direction, e.b_direction) if d is not None}
            if e.kind in ("F", "FB"):
                held += 1
                peak = max(peak, held)
            if e.kind in ("W", "FB") or (e.kind == "B" and not e.split):
                held -= 1
        out.append((len(stages), peak))
    return out


def ws6_memory_freed_at_split_b(timeline):
    out = []
    for stages, _ in ws6_memory(timeline):
        held = peak = 0
        for e in timeline.events[len(out)]:
            held += e.kind in ("F", "FB")
            peak = max(peak, held)
            held -= e.kind in ("B", "FB")  # forgets that W still needs them
        out.append((stages, peak))
    return out


def ws6_memory_fb_frees_first(timeline):
    out = []
    for stages, _ in ws6_memory(timeline):
        held = peak = 0
        for e in timeline.events[len(out)]:
            held -= e.kind == "FB" or e.kind == "W" or (e.kind == "B" and not e.split)
            held += e.kind in ("F", "FB")  # an FB's backward freed before its forward counted
            peak = max(peak, held)
        out.append((stages, peak))
    return out


def ws6_memory_per_direction(timeline):
    out = []
    for stages, _ in ws6_memory(timeline):
        held, peak = [0, 0], [0, 0]
        for e in timeline.events[len(out)]:
            if e.kind in ("F", "FB"):
                held[e.direction] += 1
                peak[e.direction] = max(peak[e.direction], held[e.direction])
            if e.kind in ("W", "FB") or (e.kind == "B" and not e.split):
                held[e.b_direction if e.kind == "FB" else e.direction] -= 1
        out.append((stages, max(peak)))
    return out


def ws6_memory_one_stage_each(timeline):
    return [(1, peak) for _, peak in ws6_memory(timeline)]


def ws6_memory_from_summary(timeline):
    return [(timeline.parameters, p) for p in timeline.peak_activations]


def test_ws6_right_answers_pass(rng, capsys):
    check.one_f_one_b(ws6_one_f_one_b, rng=rng)
    check.table2_bubbles(ws6_table2, rng=rng)
    check.memory_per_device(ws6_memory, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS6_WRONG = [
    (check.one_f_one_b, ws6_gpipe, "GPipe's order"),
    (check.one_f_one_b, ws6_one_warmup_too_many, "too many warm-up forwards"),
    (check.one_f_one_b, ws6_one_warmup_too_few, "too few warm-up forwards"),
    (check.one_f_one_b, ws6_warmups_reversed, "warm-up counts are reversed"),
    (check.one_f_one_b, ws6_backward_before_forward, "lists ('B', 0) before ('F', 0)"),
    (check.one_f_one_b, ws6_no_cooldown, "exactly once"),
    (check.one_f_one_b, ws6_split_backwards, "runs each backward whole"),
    (check.one_f_one_b, lambda stages, microbatches: None, "expected a list of"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B), (PP - 1) * (FB + B - 3 * W)),
     "(PP/2-1), not (PP-1)"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B), (PP / 2 - 1) * (FB + B)), "-3W is missing"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B), (PP / 2 - 1) * (F + 2 * B - 3 * W)),
     "not F + B"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ((PP - 1) * (F + B - 2 * W), ws6_table2(PP, F, B, W, FB)[1]),
     "ZB1P's bubble"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: ws6_table2(PP, F, B, W, FB)[::-1], "order is (1F1B, DualPipe)"),
    (check.table2_bubbles, lambda PP, F, B, W, FB: PP * (F + B), "expected a pair of numbers"),
    (check.memory_per_device, ws6_memory_freed_at_split_b, "freed at the end of the W"),
    (check.memory_per_device, ws6_memory_fb_frees_first, "DualPipe's PP+1"),
    (check.memory_per_device, ws6_memory_per_direction, "not a maximum over directions"),
    (check.memory_per_device, ws6_memory_one_stage_each, "DualPipe's 2x parameters"),
    (check.memory_per_device, ws6_memory_from_summary, "summary fields are hidden"),
]


@pytest.mark.parametrize("checker, answer, says", WS6_WRONG, ids=[f"ws6-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS6_WRONG)])
def test_ws6_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws6_placeholders_are_not_attempted():
    def one_f_one_b(stages, microbatches):
        raise NotImplementedError("your answer goes here: replace this line")

    def table2_bubbles(PP, F, B, W, FB):
        raise NotImplementedError("your answer goes here: replace this line")

    def memory_per_device(timeline):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.one_f_one_b, one_f_one_b), (check.table2_bubbles, table2_bubbles),
                            (check.memory_per_device, memory_per_device)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


# ------------------------------------------------------------------ ws10: the training recipe (no kernels, NumPy)


def ws10_memory(recipe):
    moment = 2 if recipe == "fp8-deepseek" else 4
    return 4 + 4 + 2 * moment


WS10_PRECISION = {"embedding": "fp32", "RMSNorm": "fp32", "SwiGLU": "fp32", "output head": "fp32", "softmax": "fp32",
                  "weight gradients": "fp32", "master weights": "fp32", "AdamW moments": "bf16"}


def ws10_precision(op):
    return WS10_PRECISION.get(op, "fp8")  # the six GEMMs of W1 and W2


def ws10_breaks(errors_by_log2):
    t0, d0 = errors_by_log2[0]["fp8-tensor"], errors_by_log2[0]["fp8-deepseek"]
    for e in sorted(errors_by_log2):
        v = errors_by_log2[e]
        if v["fp8-tensor"] > 2 * t0 and v["fp8-deepseek"] <= 1.5 * d0:
            return e
    return None


def ws10_breaks_ignoring_deepseek(errors_by_log2):
    t0 = errors_by_log2[0]["fp8-tensor"]
    return next((e for e in sorted(errors_by_log2) if errors_by_log2[e]["fp8-tensor"] > 2 * t0), None)


def ws10_breaks_at_or_above(errors_by_log2):
    t0, d0 = errors_by_log2[0]["fp8-tensor"], errors_by_log2[0]["fp8-deepseek"]
    return next((e for e in sorted(errors_by_log2) if errors_by_log2[e]["fp8-tensor"] >= 2 * t0
                 and errors_by_log2[e]["fp8-deepseek"] <= 1.5 * d0), None)


def ws10_breaks_unsorted(errors_by_log2):
    t0, d0 = errors_by_log2[0]["fp8-tensor"], errors_by_log2[0]["fp8-deepseek"]
    return next((e for e, v in errors_by_log2.items() if v["fp8-tensor"] > 2 * t0
                 and v["fp8-deepseek"] <= 1.5 * d0), None)


def ws10_breaks_stop_at_first(errors_by_log2):
    t0, d0 = errors_by_log2[0]["fp8-tensor"], errors_by_log2[0]["fp8-deepseek"]
    for e in sorted(errors_by_log2):
        if errors_by_log2[e]["fp8-tensor"] > 2 * t0:
            return e if errors_by_log2[e]["fp8-deepseek"] <= 1.5 * d0 else None
    return None


def ws10_breaks_vs_previous(errors_by_log2):
    keys = sorted(errors_by_log2)
    for a, b in zip(keys, keys[1:]):
        pa, pb = errors_by_log2[a], errors_by_log2[b]
        if pb["fp8-tensor"] > 2 * pa["fp8-tensor"] and pb["fp8-deepseek"] <= 1.5 * pa["fp8-deepseek"]:
            return b
    return None


def ws10_breaks_returns_s(errors_by_log2):
    e = ws10_breaks(errors_by_log2)
    return None if e is None else 2**e


def test_ws10_right_answers_pass(rng, capsys):
    check.memory_per_parameter(ws10_memory, rng=rng)
    check.which_precision(ws10_precision, rng=rng)
    check.per_tensor_breaks_at(ws10_breaks, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


def test_ws10_precisions_are_measured_per_recipe(rng):
    """The check's reference is measured on fp8lab.training.model, not a table: each recipe gives its own answers."""
    from fp8lab.course.check import ws10

    gemms = [op for op in ws10.OPS if op.split()[-1] in ("Fprop", "Dgrad", "Wgrad")]
    assert len(gemms) == 6
    for recipe, gemm, moments in (("fp8-deepseek", "fp8", "bf16"), ("fp8-tensor", "fp8", "fp32"),
                                  ("bf16", "bf16", "fp32"), ("fp32", "fp32", "fp32")):
        got = ws10.precisions(rng, recipe)
        assert {got[op] for op in gemms} == {gemm}, (recipe, got)
        assert got["AdamW moments"] == moments, (recipe, got)
        assert {v for op, v in got.items() if op not in gemms and op != "AdamW moments"} == {"fp32"}, (recipe, got)
    assert {r: sum(ws10.state_bytes(r).values()) for r in ("fp32", "bf16", "fp8-tensor", "fp8-deepseek")} == \
        {"fp32": 16, "bf16": 16, "fp8-tensor": 16, "fp8-deepseek": 12}


def test_ws10_sweep_breaks_where_lecture_08_says(rng):
    """Per-tensor scaling holds to about 2^12 and fails past 2^15 (lecture 08 (f)); DeepSeek's tiles hold longer."""
    from fp8lab.course.check import ws10

    E = ws10.sweep(range(21), rng, 24, 64, 520)  # large enough that the break does not move with the draw
    assert sorted(E) == list(range(21)) and all(np.isfinite(v[r]) for v in E.values() for r in v)
    b, at15 = ws10._breaks(E), E[15]["fp8-tensor"] / E[0]["fp8-tensor"]
    # per-tensor's error doubles right at 2^15: in about 1 draw in 200 it is just under 2x there, and at 2^16
    # DeepSeek's own error is past 1.5x, so no magnitude qualifies (the check compares answers with _breaks on the
    # same sweep, so that case is a fair question too)
    assert b in (14, 15, 16, 17) or (b is None and 1.9 < at15 <= ws10.TENSOR_FACTOR), (b, at15, E)
    assert E[12]["fp8-tensor"] < 1.3 * E[0]["fp8-tensor"] and E[18]["fp8-tensor"] > 2 * E[18]["fp8-deepseek"], E


WS10_WRONG = [
    (check.memory_per_parameter, lambda recipe: 4 + 4 + (2 if recipe == "fp8-deepseek" else 4),
     "two moments per parameter"),
    (check.memory_per_parameter, lambda recipe: 4 + 2 * (2 if recipe == "fp8-deepseek" else 4), "gradient is kept too"),
    (check.memory_per_parameter, lambda recipe: ws10_memory(recipe) + recipe.startswith("fp8"),
     "FP8 copy of a weight is not kept"),
    (check.memory_per_parameter, lambda recipe: 4 + 4 + 2 * 2, "only fp8-deepseek stores AdamW's moments in BF16"),
    (check.memory_per_parameter, lambda recipe: 16, "moments in BF16, 2 bytes each"),
    (check.memory_per_parameter, lambda recipe: 8 * ws10_memory(recipe), "that is bits"),
    (check.memory_per_parameter, lambda recipe: f"{ws10_memory(recipe)} bytes", "expected a number of bytes"),
    (check.which_precision, lambda op: "fp8" if op == "output head" else ws10_precision(op), "keeps the output head"),
    (check.which_precision, lambda op: "fp32" if op == "AdamW moments" else ws10_precision(op),
     "moments in BF16 (section 3.3.3)"),
    (check.which_precision, lambda op: "bf16" if op.endswith("Wgrad") else ws10_precision(op),
     "the FP8 x cached by Fprop"),
    (check.which_precision, lambda op: "bf16" if op == "embedding" else ws10_precision(op), "fp8lab keeps it in FP32"),
    (check.which_precision, lambda op: "fp8" if op == "weight gradients" else ws10_precision(op),
     "stores its output, the gradient, in FP32"),
    (check.which_precision, lambda op: "bf16" if op == "master weights" else ws10_precision(op),
     "a BF16 weight would round it away"),
    (check.which_precision, lambda op: "fp8" if op == "RMSNorm" else ws10_precision(op), "belongs to the GEMM"),
    (check.which_precision, lambda op: "e4m3", "expected one of"),
    (check.per_tensor_breaks_at, ws10_breaks_ignoring_deepseek, "per-tensor breaking is not enough"),
    (check.per_tensor_breaks_at, ws10_breaks_at_or_above, "is strictly more"),
    (check.per_tensor_breaks_at, ws10_breaks_unsorted, "sorted(errors_by_log2)"),
    (check.per_tensor_breaks_at, ws10_breaks_stop_at_first, "keep looking"),
    (check.per_tensor_breaks_at, ws10_breaks_vs_previous, "not with the previous magnitude"),
    (check.per_tensor_breaks_at, ws10_breaks_returns_s, "not s itself"),
    (check.per_tensor_breaks_at, lambda errors_by_log2: ws10_breaks(errors_by_log2) or -1, "return None"),
]


@pytest.mark.parametrize("checker, answer, says", WS10_WRONG, ids=[f"ws10-{i}-{w[0].__name__}" for i, w in
                                                                    enumerate(WS10_WRONG)])
def test_ws10_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws10_placeholders_are_not_attempted():
    def memory_per_parameter(recipe):
        raise NotImplementedError("your answer goes here: replace this line")

    def which_precision(op):
        raise NotImplementedError("your answer goes here: replace this line")

    def per_tensor_breaks_at(errors_by_log2):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.memory_per_parameter, memory_per_parameter),
                            (check.which_precision, which_precision),
                            (check.per_tensor_breaks_at, per_tensor_breaks_at)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


# -------------------------------------------------------------- ws8: delayed scaling (amax history), no kernels


def ws8_scale(history, fmt_max, margin):
    return np.float32(max(float(np.max(history)), 1e-12) * 2.0**margin / fmt_max)


def _ws8_steps(scale_of=None, cast=None, window=0, inclusive=False, first=1.0):
    """delayed_quantize_steps, right by default; each argument puts in one mistake."""
    import collections

    scale_of = scale_of or (lambda history, x: ws8_scale(np.array(history), 448.0, 0))
    cast = cast or (lambda x, s: formats.encode(x / s))

    def steps(tensors, history_len):
        history = collections.deque(maxlen=history_len + window)
        codes, scales = [], []
        for x in tensors:
            if inclusive:
                history.append(float(np.max(np.abs(x))))
            s = scale_of(history, x) if history else np.float32(first)
            codes.append(cast(x, s))
            scales.append(s)
            if not inclusive:
                history.append(float(np.max(np.abs(x))))
        return codes, np.array(scales, np.float32)

    return steps


ws8_steps = _ws8_steps()


def _ws8_clipped(x, s):
    return int(np.count_nonzero((formats.encode(x / np.float32(s), saturate=False) & 0x7F) == 0x7F))


def _ws8_spike_scales(tensors, k, hl):
    x = tensors[k]
    return x, ws8_steps(tensors[: k + 1], hl)[1][k], np.float32(np.max(np.abs(x)) / np.float32(448))


def ws8_spike(tensors, k, hl):
    x, s_del, s_cur = _ws8_spike_scales(tensors, k, hl)
    return _ws8_clipped(x, s_del), _ws8_clipped(x, s_cur)


def ws8_spike_over_448(tensors, k, hl):
    x, s_del, s_cur = _ws8_spike_scales(tensors, k, hl)
    return int(np.sum(np.abs(x / s_del) > 448)), int(np.sum(np.abs(x / s_cur) > 448))


def ws8_spike_codes_at_448(tensors, k, hl):
    x, s_del, s_cur = _ws8_spike_scales(tensors, k, hl)
    return tuple(int(np.sum((formats.encode(x / s) & 0x7F) == 0x7E)) for s in (s_del, s_cur))


def ws8_spike_current_for_both(tensors, k, hl):
    x, _, s_cur = _ws8_spike_scales(tensors, k, hl)
    return _ws8_clipped(x, s_cur), _ws8_clipped(x, s_cur)


def ws8_spike_next_step(tensors, k, hl):
    return _ws8_clipped(tensors[k + 1], ws8_steps(tensors, hl)[1][k + 1]), 0


def _ws8_ml_dtypes_cast(x, s):
    import ml_dtypes

    return (x / s).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)  # overflow gives NaN


def test_ws8_right_answers_pass(rng, capsys):
    check.scale_from_history(ws8_scale, rng=rng)
    check.delayed_quantize_steps(ws8_steps, rng=rng)
    check.clipped_at_spike(ws8_spike, rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS8_WRONG = [
    (check.scale_from_history, lambda h, fm, m: ws8_scale(h[-1:], fm, m), "most recent amax"),
    (check.scale_from_history, lambda h, fm, m: np.float32(1 / ws8_scale(h, fm, m)), "this is the inverse"),
    (check.scale_from_history, lambda h, fm, m: ws8_scale(h, fm, 0), "the margin is missing"),
    (check.scale_from_history, lambda h, fm, m: np.float32(float(np.max(h)) * 2.0**m / fm), "AMAX_FLOOR"),
    (check.scale_from_history, lambda h, fm, m: [ws8_scale(h, fm, m)] * 2, "expected one number"),
    (check.delayed_quantize_steps, _ws8_steps(scale_of=lambda h, x: ws8_scale(np.abs(x), 448.0, 0)),
     "that is current scaling"),
    (check.delayed_quantize_steps, _ws8_steps(inclusive=True), "already holds this step's amax"),
    (check.delayed_quantize_steps, _ws8_steps(window=-1), "off by -1 in the history window"),
    (check.delayed_quantize_steps, _ws8_steps(window=1), "off by +1 in the history window"),
    (check.delayed_quantize_steps, _ws8_steps(first=1 / 448), "initial scale is 1.0"),
    (check.delayed_quantize_steps, _ws8_steps(cast=lambda x, s: formats.encode(x / s, saturate=False)),
     "the cast saturates"),
    (check.delayed_quantize_steps, _ws8_steps(cast=_ws8_ml_dtypes_cast), "the cast saturates"),
    (check.delayed_quantize_steps, _ws8_steps(cast=lambda x, s: formats.encode(x * (np.float32(1) / s))),
     "multiplied by 1 / scale"),
    (check.delayed_quantize_steps, _ws8_steps(cast=lambda x, s: formats.encode(x.astype(np.float64) / float(s))),
     "divided in float64"),
    (check.delayed_quantize_steps, lambda tensors, history_len: ws8_steps(tensors, history_len)[1],
     "expected a pair (codes, scales)"),
    (check.clipped_at_spike, ws8_spike_current_for_both, "delayed scaling clips most of the spike"),
    (check.clipped_at_spike, ws8_spike_next_step, "delayed scaling clips most of the spike"),
    (check.clipped_at_spike, ws8_spike_over_448, "rounds to 448 anyway"),
    (check.clipped_at_spike, ws8_spike_codes_at_448, "not clipping by itself"),
    (check.clipped_at_spike, lambda tensors, k, hl: ws8_spike(tensors, k, hl)[::-1], "the order is (delayed, "),
    (check.clipped_at_spike, lambda tensors, k, hl: (ws8_spike(tensors, k, hl)[0] / tensors[k].size, 0),
     "not a fraction"),
]


@pytest.mark.parametrize("checker, answer, says", WS8_WRONG, ids=[f"ws8-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS8_WRONG)])
def test_ws8_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws8_check_does_not_pass_inputs_it_reuses(rng):
    """An answer that scribbles over its inputs (NaN) changes neither the reference nor the next case."""
    def scribbling_steps(tensors, history_len):
        out = ws8_steps(tensors, history_len)
        for x in tensors:
            x[...] = np.nan
        return out

    check.delayed_quantize_steps(scribbling_steps, rng=rng)


def test_ws8_placeholders_are_not_attempted():
    def scale_from_history(history, fmt_max, margin):
        raise NotImplementedError("your answer goes here: replace this line")

    def delayed_quantize_steps(tensors, history_len):
        raise NotImplementedError("your answer goes here: replace this line")

    def clipped_at_spike(tensors, spike_step, history_len):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.scale_from_history, scale_from_history),
                            (check.delayed_quantize_steps, delayed_quantize_steps),
                            (check.clipped_at_spike, clipped_at_spike)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


# ------------------------------------------------------- ws9: the FP8 Linear's Wgrad from the cached x (NumPy)


def ws9_requantize(codes, scales, divide=False, floor=True):
    """The re-tiling, right by default; divide=True encodes v / scale, floor=False drops AMAX_FLOOR."""
    from fp8lab.numerics import spec

    M, K = codes.shape
    v_t = np.ascontiguousarray((formats.decode(codes) * np.repeat(scales, 128, axis=1)[:, :K]).T)
    n = -(-M // 128)
    a = np.zeros((K, n * 128), np.float32)
    a[:, :M] = np.abs(v_t)
    amax = a.reshape(K, n, 128).max(axis=2)
    amax = np.maximum(amax, spec.AMAX_FLOOR) if floor else amax
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale_t = (amax / np.float32(448)).astype(np.float32)
        inv = (np.float32(448) / amax).astype(np.float32)
        by = v_t / np.repeat(scale_t, 128, axis=1)[:, :M] if divide else v_t * np.repeat(inv, 128, axis=1)[:, :M]
        return formats.encode(by.astype(np.float32)), scale_t


def _ws9_deq(codes, scales):
    from fp8lab.numerics import spec

    return spec.dequantize(codes, scales, 1, 128)


def _ws9_tiles(a):
    """dequantized 1x128 tiles of a, float32."""
    from fp8lab.numerics import spec

    return _ws9_deq(*spec.quantize(np.ascontiguousarray(a), "tile")[:2])


def ws9_wgrad(dy, x_codes, x_scales):
    return _ws9_tiles(dy.T) @ _ws9_deq(*ws9_requantize(x_codes, x_scales)).T


def ws9_wgrad_float64(dy, x_codes, x_scales):  # right: the same operands, float64 sums
    return _ws9_tiles(dy.T).astype(np.float64) @ _ws9_deq(*ws9_requantize(x_codes, x_scales)).astype(np.float64).T


def _ws9_errors(x, dy, fresh_x_t=None, reference=None, norm=np.linalg.norm):
    """wgrad_errors, right by default; fresh_x_t (K, M) replaces x^T's fresh tiles, reference the float64 dW."""
    from fp8lab.numerics import spec

    exact = dy.astype(np.float64).T @ x.astype(np.float64) if reference is None else reference(x, dy)
    fresh_x_t = _ws9_tiles(x.T) if fresh_x_t is None else fresh_x_t
    dws = (ws9_wgrad(dy, *spec.quantize(x, "tile")[:2]), _ws9_tiles(dy.T) @ fresh_x_t.T)
    return tuple(float(norm(d - exact) / norm(exact)) for d in dws)


def ws9_errors(x, dy):
    return _ws9_errors(x, dy)


def ws9_errors_float32_reference(x, dy):  # right within the tolerance
    return _ws9_errors(x, dy, reference=lambda x, dy: (dy.T @ x).astype(np.float64))


def _ws9_requantize_from(values_of):
    """requantize_tile_to_col of the values values_of(codes, scales) (M, K) instead of decode(codes) * scale."""
    from fp8lab.numerics import spec

    def answer(codes, scales):
        c, s, _ = spec.quantize(np.ascontiguousarray(values_of(codes, scales).T), "tile")
        return c, s

    return answer


def ws9_requantize_along_k(codes, scales):
    from fp8lab.numerics import spec

    return spec.quantize(_ws9_deq(codes, scales), "tile")[:2]  # x's own layout again, not x^T's


def ws9_requantize_calls_library(codes, scales):
    from fp8lab.numerics import spec

    return spec.requantize_tile_to_col(codes, scales)


def ws9_requantize_changes_inputs(codes, scales):
    out = ws9_requantize(codes, scales)
    scales[...] = np.nan
    return out


def ws9_requantize_last_group_overlaps(codes, scales):
    """The last, ragged token group takes its amax over the last 128 tokens (some from the group before)."""
    M, K = codes.shape
    c, s = ws9_requantize(codes, scales)
    v_t = np.ascontiguousarray(_ws9_deq(codes, scales).T)
    amax = np.maximum(np.abs(v_t[:, M - 128:]).max(axis=1), np.float32(1e-12))
    s[:, -1] = amax / np.float32(448)
    c[:, M - M % 128:] = formats.encode(v_t[:, M - M % 128:] * (np.float32(448) / amax)[:, None])
    return c, s


def ws9_requantize_k_not_trimmed(codes, scales):
    M, K = codes.shape
    return formats.decode(codes) * np.repeat(scales, 128, axis=1), None  # (M, 128 ceil(K/128)): raises


WS9_WRONG = [
    (check.requantize_tile_to_col, lambda c, s: tuple(a.T for a in ws9_requantize(c, s)), "this is x's layout"),
    (check.requantize_tile_to_col, ws9_requantize_along_k, "1x128 tiles along the channels again"),
    (check.requantize_tile_to_col, lambda c, s: (np.ascontiguousarray(c.T), ws9_requantize(c, s)[1]),
     "your codes are the old codes"),
    (check.requantize_tile_to_col, _ws9_requantize_from(lambda c, s: formats.decode(c)),
     "multiply it by its tile's old scale"),
    (check.requantize_tile_to_col,
     _ws9_requantize_from(lambda c, s: formats.decode(c) / np.repeat(s, 128, axis=1)[:, :c.shape[1]]),
     "not decode(code) / scale"),
    (check.requantize_tile_to_col, lambda c, s: ws9_requantize(c, s, divide=True), "not encode(v / scale)"),
    (check.requantize_tile_to_col, lambda c, s: ws9_requantize(c, s, floor=False), "floor it at spec.AMAX_FLOOR"),
    (check.requantize_tile_to_col, lambda c, s: (lambda ct, st: (ct, st[:, : c.shape[0] // 128]))(
        *ws9_requantize(c, s)), "not M // 128"),
    (check.requantize_tile_to_col, ws9_requantize_last_group_overlaps, "only the last column group is wrong"),
    (check.requantize_tile_to_col, ws9_requantize_k_not_trimmed, "the last row tile has K % 128 channels"),
    (check.requantize_tile_to_col, ws9_requantize_calls_library, "calls the library's requantize_tile_to_col"),
    (check.requantize_tile_to_col, ws9_requantize_changes_inputs, "changed its input codes or scales"),
    (check.fp8_wgrad, lambda dy, c, s: _ws9_tiles(dy).T @ _ws9_deq(*ws9_requantize(c, s)).T,
     "quantized along the wrong axis"),
    (check.fp8_wgrad, lambda dy, c, s: _ws9_tiles(dy.T) @ _ws9_deq(c, s), "dequantized from its 1x128 tiles"),
    (check.fp8_wgrad, lambda dy, c, s: dy.T @ _ws9_deq(*ws9_requantize(c, s)).T, "dy is used in float32"),
    (check.fp8_wgrad, lambda dy, c, s: ws9_wgrad(dy, c, s).T, "dy^T x, not x^T dy"),
    (check.fp8_wgrad, lambda dy, c, s: ws9_wgrad(dy, c, s) * np.where(np.arange(c.shape[1]) == 7, np.nan, 1),
     "NaN or Inf"),
    (check.wgrad_errors, lambda x, dy: ws9_errors(x, dy)[::-1], "the order is (re-quantized, fresh)"),
    (check.wgrad_errors, lambda x, dy: _ws9_errors(x, dy, fresh_x_t=_ws9_tiles(x).T), "x's 1x128 tiles"),
    (check.wgrad_errors, lambda x, dy: _ws9_errors(x, dy, fresh_x_t=np.ascontiguousarray(x.T)),
     "from float32, as 128x1 tiles"),
    (check.wgrad_errors, lambda x, dy: _ws9_errors(x, dy, norm=lambda d: np.abs(d).max()), "not the largest element"),
    (check.wgrad_errors, lambda x, dy: tuple(e * np.linalg.norm(dy.astype(np.float64).T @ x) for e in
                                             ws9_errors(x, dy)), "normwise RELATIVE error"),
]


def test_ws9_right_answers_pass(rng, capsys):
    check.requantize_tile_to_col(ws9_requantize, rng=rng)
    check.fp8_wgrad(ws9_wgrad, rng=rng)
    check.fp8_wgrad(ws9_wgrad_float64, rng=rng)
    check.wgrad_errors(ws9_errors, rng=rng)
    check.wgrad_errors(ws9_errors_float32_reference, rng=rng)
    out = capsys.readouterr().out
    assert out.count("passed:") == 5 and "(3 bit for bit" in out and "(0 bit for bit" in out


@pytest.mark.parametrize("checker, answer, says", WS9_WRONG, ids=[f"ws9-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS9_WRONG)])
def test_ws9_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(answer, rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws9_placeholders_are_not_attempted():
    def requantize_tile_to_col(codes, scales):
        raise NotImplementedError("your answer goes here: replace this line")

    def fp8_wgrad(dy, x_codes, x_scales):
        raise NotImplementedError("your answer goes here: replace this line")

    def wgrad_errors(x, dy):
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, answer in ((check.requantize_tile_to_col, requantize_tile_to_col), (check.fp8_wgrad, fp8_wgrad),
                            (check.wgrad_errors, wgrad_errors)):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(answer)


def test_ws9_wgrad_before_question_1_is_not_attempted():
    def requantize_tile_to_col(codes, scales):
        raise NotImplementedError("your answer goes here: replace this line")

    def fp8_wgrad(dy, x_codes, x_scales):
        return dy.T @ formats.decode(requantize_tile_to_col(x_codes, x_scales)[0]).T

    with pytest.raises(check.NotAttempted, match="^not attempted yet: fp8_wgrad.*question 1's"):
        check.fp8_wgrad(fp8_wgrad)


# ------------------------------------------------ ws7: the limited accumulator and promotion (NumPy, no kernels)


def ws7_sum(products, bits, *, rnd=np.trunc, final_rnd=None, extra=0, group=32, with_acc=True, zero_exp=False,
            final=True, own=False, tail=True):
    """A learner's accumulate_limited, one rule changeable (the defaults are right)."""
    final_rnd = rnd if final_rnd is None else final_rnd
    kept = bits + extra
    p = np.asarray(products, np.float64)
    group = group or max(len(p), 1)
    end = len(p) if tail else len(p) - len(p) % group
    acc = 0.0
    for k0 in range(0, end, group):
        terms = list(p[k0:k0 + group]) + ([acc] if with_acc else [])
        exps = [math.frexp(t)[1] for t in terms if t != 0 or zero_exp]
        if not exps:
            continue
        ulp = 2.0 ** (max(exps) - kept - 1)
        if own:  # each term cut to its own kept bits
            s = sum(math.ldexp(float(rnd(math.ldexp(m, kept + 1))), e - kept - 1) for m, e in map(math.frexp, terms))
        else:
            s = sum(float(rnd(t / ulp)) for t in terms) * ulp
        if not with_acc:
            s += acc
        if final:
            m, e = math.frexp(s)
            s = math.ldexp(float(final_rnd(math.ldexp(m, kept + 1))), e - kept - 1)
        acc = s
    return acc


def ws7_promoted(a, b, bits, promote_every, *, first=None, reset=True, fp64=False, add=True):
    """A learner's promoted_dot: chunk ends at first, first + promote_every, ..., and K."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    if promote_every is None:
        return ws7_sum(p, bits)
    bounds = list(range(promote_every if first is None else first, len(p), promote_every)) + [len(p)]
    total, start = (0.0 if fp64 else np.float32(0)), 0
    for stop in bounds:
        part = ws7_sum(p[(start if reset else 0):stop], bits)
        total = (total + part if fp64 else np.float32(total + np.float32(part))) if add else np.float32(part)
        start = stop
    return float(np.float32(total))


def ws7_errors(a, b, *, exact_of=None, bits=13, P=(None, 128), form=lambda y, ex: abs(y - ex) / abs(ex)):
    ex = math.fsum(np.asarray(a, np.float64) * b) if exact_of is None else exact_of(a, b)
    return tuple(form(ws7_promoted(a, b, bits, p), ex) for p in P)


def _ws7_wrong_sum(fixed13=False, **kw):
    return lambda products, bits: ws7_sum(products, 13 if fixed13 else bits, **kw)


def _ws7_wrong_dot(scale=1, late=0, **kw):
    def promoted_dot(a, b, bits, promote_every):
        if promote_every is None:
            return ws7_promoted(a, b, bits, None)
        P = promote_every * scale
        return ws7_promoted(a, b, bits, P, **({"first": P + late} | kw))

    return promoted_dot


def _ws7_wrong_errors(letter="C", **kw):
    return (lambda a, b: ws7_errors(a, b, **kw)), (lambda: letter)


def test_ws7_right_answers_pass(rng, capsys):
    check.accumulate_limited(lambda products, bits: ws7_sum(products, bits), rng=rng)
    check.promoted_dot(ws7_promoted, rng=rng)
    check.promotion_errors(ws7_errors, lambda: " c", rng=rng)
    assert capsys.readouterr().out.count("passed:") == 3


WS7_WRONG = [
    (check.accumulate_limited, _ws7_wrong_sum(rnd=np.rint), "truncate toward zero"),
    (check.accumulate_limited, _ws7_wrong_sum(final_rnd=np.rint), "truncate toward zero"),
    (check.accumulate_limited, _ws7_wrong_sum(rnd=np.floor), "not down (np.floor"),
    (check.accumulate_limited, _ws7_wrong_sum(extra=1), "one bit too many"),
    (check.accumulate_limited, _ws7_wrong_sum(extra=-1), "one bit too few"),
    (check.accumulate_limited, _ws7_wrong_sum(own=True), "LARGEST exponent"),
    (check.accumulate_limited, _ws7_wrong_sum(with_acc=False), "running accumulator is one more addend"),
    (check.accumulate_limited, _ws7_wrong_sum(zero_exp=True), "zero terms take no part"),
    (check.accumulate_limited, _ws7_wrong_sum(final=False), "normalize and truncate the sum"),
    (check.accumulate_limited, _ws7_wrong_sum(group=1), "not added one at a time"),
    (check.accumulate_limited, _ws7_wrong_sum(group=0), "not the whole array at once"),
    (check.accumulate_limited, _ws7_wrong_sum(tail=False), "the last group may be short"),
    (check.accumulate_limited, _ws7_wrong_sum(fixed13=True), "use the `bits` argument"),
    (check.accumulate_limited, lambda products, bits: math.fsum(products), "this is the exact sum"),
    (check.accumulate_limited, lambda products, bits: np.full(2, 1.0), "expected one number"),
    (check.promoted_dot, _ws7_wrong_dot(first=10**9), "was ignored"),
    (check.promoted_dot, lambda a, b, bits, P: ws7_promoted(a, b, bits, P and 32), "not after every group of 32"),
    (check.promoted_dot, _ws7_wrong_dot(first=32), "not after the first group"),  # ends at 32, 32 + P, ...
    (check.promoted_dot, _ws7_wrong_dot(scale=32), "counts elements of K"),
    (check.promoted_dot, _ws7_wrong_dot(late=32), "AFTER adding the group"),
    (check.promoted_dot, _ws7_wrong_dot(reset=False), "reset the limited accumulator"),
    (check.promoted_dot, _ws7_wrong_dot(add=False), "ADD each promoted"),
    (check.promoted_dot, _ws7_wrong_dot(fp64=True), "add the partial sums in float32"),
    (check.promotion_errors, _ws7_wrong_errors(P=(128, None)), "the order is"),
    (check.promotion_errors, _ws7_wrong_errors(form=lambda y, ex: 100 * abs(y - ex) / abs(ex)), "not percentages"),
    (check.promotion_errors, _ws7_wrong_errors(form=lambda y, ex: abs(y - ex)), "not |y - exact|"),
    (check.promotion_errors, _ws7_wrong_errors(form=lambda y, ex: (y - ex) / ex), "take the absolute value"),
    (check.promotion_errors, _ws7_wrong_errors(exact_of=lambda a, b: float(np.dot(a, b))), "sum in float64"),
    (check.promotion_errors, _ws7_wrong_errors(bits=14), "bits = 13"),
    (check.promotion_errors, _ws7_wrong_errors(P=(None, 32)), "every N_C = 128"),
    (check.promotion_errors, _ws7_wrong_errors("A"), "at most 4 x 4 = 8 significant bits"),
    (check.promotion_errors, _ws7_wrong_errors("B"), "Range is not the problem"),
    (check.promotion_errors, _ws7_wrong_errors("D"), "truncation is not random"),
    (check.promotion_errors, _ws7_wrong_errors("E"), "expected one of"),
    (check.promotion_errors, ((lambda a, b: 0.05), lambda: "C"), "expected a pair"),
]


@pytest.mark.parametrize("checker, answer, says", WS7_WRONG, ids=[f"ws7-{i}-{w[0].__name__}" for i, w in
                                                                  enumerate(WS7_WRONG)])
def test_ws7_wrong_answer_is_rejected(checker, answer, says, rng, capsys):
    with pytest.raises(check.CheckFailed) as info:
        checker(*(answer if isinstance(answer, tuple) else (answer,)), rng=rng)
    msg = str(info.value)
    assert says in msg and "hint:" in msg, msg
    assert "passed" not in capsys.readouterr().out


def test_ws7_reference_calls_are_refused():
    from fp8lab.numerics import accum

    def accumulate_limited(products, bits):
        return float(accum.dot_limited(products, np.ones_like(products), bits)[0, 0])

    def promoted_dot(a, b, bits, promote_every):
        return float(accum.dot_limited(a, b, bits, promote_every=promote_every)[0, 0])

    with pytest.raises(check.CheckFailed, match="calls dot_limited"):
        check.accumulate_limited(accumulate_limited)
    with pytest.raises(check.CheckFailed, match="calls dot_limited"):
        check.promoted_dot(promoted_dot)


def test_ws7_placeholders_are_not_attempted():
    def accumulate_limited(products, bits):
        raise NotImplementedError("your answer goes here: replace this line")

    def promoted_dot(a, b, bits, promote_every):
        raise NotImplementedError("your answer goes here: replace this line")

    def promotion_errors(a, b):
        raise NotImplementedError("your answer goes here: replace this line")

    def why_error_grows():
        raise NotImplementedError("your answer goes here: replace this line")

    for checker, args in ((check.accumulate_limited, (accumulate_limited,)), (check.promoted_dot, (promoted_dot,)),
                          (check.promotion_errors, (promotion_errors, why_error_grows))):
        with pytest.raises(check.NotAttempted, match="^not attempted yet"):
            checker(*args)
    with pytest.raises(check.NotAttempted, match="^not attempted yet: why_error_grows"):
        check.promotion_errors(ws7_errors, why_error_grows)

    def promoted_dot_written(a, b, bits, promote_every):  # question 2 answered, question 1 not
        return accumulate_limited(np.asarray(a, np.float64) * b, bits)

    with pytest.raises(check.NotAttempted, match="^not attempted yet: .*answer question 1 first"):
        check.promoted_dot(promoted_dot_written)
