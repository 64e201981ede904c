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

from fp8lab import check, formats, ptx, worksheets
from fp8lab.kernels.common import encode_e4m3_sat
from fp8lab.runtime import FULL_MASK, cuda, shfl_down_sync, shfl_xor_sync

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
NAMES = sorted(p.name for p in SOLUTIONS.glob("*.ipynb"))
CHECKS = {"encode_e4m3", "decode_e4m3", "rmsnorm_forward_kernel", "tiled_gemm_kernel", "tile_quantize_kernel",
          "mma_a_fragment", "cvt_e4m3x2_intrinsic", "one_f_one_b", "table2_bubbles", "memory_per_device"}
LECTURES = {  # the lecture each worksheet links to (and back to)
    "ws1_fp8_encode_decode.ipynb": "01_from_pytorch_to_kernels",
    "ws2_rmsnorm_kernel.ipynb": "01_from_pytorch_to_kernels",
    "ws3_tiled_gemm.ipynb": "01_from_pytorch_to_kernels",
    "ws4_tile_quantize_kernel.ipynb": "03_scaling_and_quantization",
    "ws5_inline_ptx.ipynb": "06_ptx_sass_and_tensor_cores",
    "ws6_pipeline_schedules.ipynb": "08_overlap_and_communication",
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
    assert rows, f"{name} calls no fp8lab.check function"
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
    from fp8lab import formats

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
    from fp8lab import runtime

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
