"""Editable kernels in the lectures (fp8lab.course.notebook, scripts/editable.py) and short source dumps.

Every lecture has an editable copy of its central kernel, generated from the library: the cells must equal what the
generator makes of the library now (so the library stays the single source), and the cell after each runs the copy
through `try_kernel`. try_kernel must pass an unmodified copy, fail the change each lecture invites (with the
module's mismatch message) and always put the library's kernel back. No cell prints more than 60 lines of source.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fp8lab.course import notebook
from fp8lab.device import runtime
from fp8lab.kernels import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "editable.py"
LECTURES = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_LINES = 60

_spec = importlib.util.spec_from_file_location("fp8lab_editable_script", SCRIPT)
editable = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(editable)

# Each lecture's editable kernel: (module, version or op, the change its markdown invites: old text, new text).
# The change must make the module's check fail: that is what the lecture promises the learner.
KERNELS = {
    "fp8lab.kernels.elementwise.bias_add_kernel": ("elementwise", "bias_add", ("while i < y.size:",
                                                                              "while i < y.size - 1:")),
    "fp8lab.kernels.reduce.reduce_kernel2": ("reduce", 2, ("while half > 0:", "while half > 1:")),
    "fp8lab.kernels.rmsnorm.rmsnorm_forward_kernel2": ("rmsnorm", 2, ("ss / np.float32(N)", "ss / np.float32(N - 1)")),
    "fp8lab.kernels.cast.encode_e4m3_sat_hw_kernel": ("cast", 2, ("i = cuda.grid(1)", "i = cuda.grid(1) + 1")),
    "fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2": ("quantize_fine", 2, ("        m = warp_max(m)\n", "")),
    "fp8lab.kernels.gemm.gemm_kernel3": ("gemm", 3, ("range(0, K, T3)", "range(0, K - T3, T3)")),
    "fp8lab.kernels.fp8_gemm.simt.fp8_gemm_kernel1": ("fp8_gemm", 1, ("partial * group_scale(sa, sb, m, n, k0 // GROUP_K)",
                                                                 "partial * group_scale(sa, sb, m, n, 0)")),
    "fp8lab.kernels.tc_accum.mma_probe_kernel": ("tc_accum", 1, ("mma(_pack4(a, r, 4 * t), _pack4(a, r + 8, 4 * t)",
                                                                 "mma(_pack4(a, r + 8, 4 * t), _pack4(a, r, 4 * t)")),
    "fp8lab.kernels.wgmma_tile.wgmma_tile_kernel": ("wgmma_tile", 1, ("desc_a + 2 * kk, desc_b", "desc_a, desc_b")),
    "fp8lab.kernels.fp8_gemm.tensor_cores.fp8_gemm_kernel7": ("fp8_gemm", 7, ("while tm < tiles_m:",
                                                                          "while tm < tiles_m - 1:")),
    "fp8lab.kernels.swiglu.swiglu_quantize_kernel2": ("swiglu", 2, ("vals[j] = swiglu_value(va[j], vb[j])",
                                                                    "vals[j] = va[j] * vb[j]")),
    "fp8lab.comm.sm_budget.copy_kernel": ("sm_budget", "copy", ("        while i < n:\n            dst8[i] = src8[i]\n"
                                                           "            i += step", "")),
}


# What the markdown before each editable cell says to try (the change above, in the lecture's words).
INVITED = {
    "fp8lab.kernels.elementwise.bias_add_kernel": "`while i < y.size - 1:`",
    "fp8lab.kernels.reduce.reduce_kernel2": "`while half > 1:`",
    "fp8lab.kernels.rmsnorm.rmsnorm_forward_kernel2": "`ss / np.float32(N - 1)`",
    "fp8lab.kernels.cast.encode_e4m3_sat_hw_kernel": "`i = cuda.grid(1) + 1`",
    "fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2": "deleting `m = warp_max(m)`",
    "fp8lab.kernels.gemm.gemm_kernel3": "`for k0 in range(0, K - T3, T3):`",
    "fp8lab.kernels.fp8_gemm.simt.fp8_gemm_kernel1": "`group_scale(sa, sb, m, n, 0)`",
    "fp8lab.kernels.tc_accum.mma_probe_kernel": "swapping the first two A registers, rows `r` and `r + 8`",
    "fp8lab.kernels.wgmma_tile.wgmma_tile_kernel": "deleting the `+ 2 * kk` from `desc_a`",
    "fp8lab.kernels.fp8_gemm.tensor_cores.fp8_gemm_kernel7": "`while tm < tiles_m - 1:`",
    "fp8lab.kernels.swiglu.swiglu_quantize_kernel2": "`vals[j] = va[j] * vb[j]`",
    "fp8lab.comm.sm_budget.copy_kernel": "deleting the tail loop (the last `while i < n:` and its two lines)",
}


def _module(name: str):
    return importlib.import_module("fp8lab.comm.sm_budget") if name == "sm_budget" else load(name)


def _cells(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _compile(source: str):
    """Run an editable cell's text in a fresh namespace, as a notebook would; returns the kernel it defines."""
    ns: dict = {}
    exec(compile(source, "<editable cell>", "exec"), ns)
    return ns[ast.parse(source).body[-1].name]


def _held(module, kernel) -> bool:
    """Whether the library holds `kernel` anywhere try_kernel swaps (module globals and their tables, the cache)."""
    probe = notebook._swap(module, kernel, object())
    notebook._restore(probe)
    return bool(probe)


# ----------------------------------------------------------------------------------------------------- the cells


def test_editable_cells_are_generated_from_the_library():
    stale = editable.stale(ROOT)
    assert not stale, ("editable cells differ from the library; run `python scripts/editable.py --write`:\n"
                       + "\n".join(stale))


def test_the_script_checks_and_rewrites(tmp_path):
    (tmp_path / "notebooks").mkdir()
    src = ROOT / "notebooks" / "01_cuda_primer.ipynb"
    text = src.read_text(encoding="utf-8")
    cells = json.loads(text)["cells"]
    i, target = editable.editable_cells({"cells": cells})[0]
    assert target == "fp8lab.kernels.reduce.reduce_kernel2"
    old = "".join(cells[i]["source"])
    changed = text.replace(json.dumps(old.split("\n")[-1]), json.dumps(old.split("\n")[-1] + "  # edited"))
    assert changed != text
    (tmp_path / "notebooks" / src.name).write_text(changed, encoding="utf-8")
    run = [sys.executable, str(SCRIPT), "--root", str(tmp_path)]
    r = subprocess.run(run + ["--check"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and "01_cuda_primer.ipynb cell cp-12b" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(run + ["--write"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "notebooks" / src.name).read_text(encoding="utf-8") == text  # byte for byte as it was


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_every_lecture_has_an_editable_kernel_and_tries_it(path):
    cells = _cells(path)
    found = editable.editable_cells({"cells": cells})
    assert found, f"{path.name} has no editable kernel cell"
    for i, target in found:
        text = "".join(cells[i]["source"])
        assert target in KERNELS, f"{path.name}: {target} has no entry in KERNELS (its invited change)"
        assert len(text.splitlines()) <= MAX_LINES, f"{path.name}: the editable cell of {target} is too long"
        assert all(len(line) <= 120 for line in text.splitlines()), f"{path.name}: {target}: a line over 120"
        name = target.rsplit(".", 1)[1]
        nxt = "".join(cells[i + 1]["source"])
        assert cells[i + 1]["cell_type"] == "code" and "try_kernel(" in nxt and f", {name})" in nxt, \
            f"{path.name}: the cell after the editable {name} must run try_kernel(module, version, {name})"
        before = "".join(cells[i - 1]["source"]) if cells[i - 1]["cell_type"] == "markdown" else ""
        assert INVITED[target] in before, \
            f"{path.name}: the markdown before the editable {name} must invite its change ({INVITED[target]!r})"


def _show_calls(source: str):
    """The show(...) calls (ast.Call nodes) of a code cell's source."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "show"]


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_no_cell_prints_more_than_60_lines_of_source(path):
    """Every show(...) of every code cell, evaluated in a namespace made by the lecture's own imports: the lines of
    source one cell prints (excerpt headers included, the blank line after each object not) stay within MAX_LINES."""
    cells = [c for c in _cells(path) if c["cell_type"] == "code"]
    ns: dict = {}
    for c in cells:  # the lecture's imports (top-level import statements only: nothing else runs)
        try:
            tree = ast.parse("".join(c["source"]))
        except SyntaxError:
            continue
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(imports, []), path.name, "exec"), ns)
    too_long = []
    for c in cells:
        total = 0
        for call in _show_calls("".join(c["source"])):
            kw = {k.arg: eval(compile(ast.Expression(k.value), path.name, "eval"), ns) for k in call.keywords}
            objs = []
            for a in call.args:
                value = eval(compile(ast.Expression(a.value if isinstance(a, ast.Starred) else a), path.name, "eval"),
                             ns)
                objs += list(value) if isinstance(a, ast.Starred) else [value]
            total += sum(len(notebook.source_text(o, kw.get("lines")).splitlines()) for o in objs)
        if total > MAX_LINES:
            too_long.append(f"cell {c['id']}: {total} lines")
    assert not too_long, f"{path.name}: show() prints more than {MAX_LINES} lines: {too_long}"


# ------------------------------------------------------------------------------------------------- try_kernel


@pytest.mark.parametrize("target", sorted(KERNELS))
def test_try_kernel_passes_the_copy_and_fails_the_invited_change(target, rng, capsys):
    name, version, (old, new) = KERNELS[target]
    module = _module(name)
    library = notebook.library_kernel(target)
    source = notebook.editable_source(target)
    tried = notebook.try_kernel(module, version, _compile(source), rng=rng)
    assert tried.checks and all(len(r) == 2 for r in tried.checks)
    out = capsys.readouterr().out
    assert "checks against the reference" in out
    assert ("timing needs a GPU" in out) == runtime.IS_SIM
    assert source.count(old) == 1, f"the invited change of {target} no longer applies to the library's source"
    broken = _compile(source.replace(old, new))
    with pytest.raises(AssertionError) as e:
        notebook.try_kernel(module, version, broken, rng=rng)
    assert str(e.value).startswith(f"your {target.rsplit('.', 1)[1]} as ")
    assert notebook.library_kernel(target) is library and _held(module, library) and not _held(module, broken)


def test_try_kernel_puts_the_library_back_after_a_crash(rng, monkeypatch):
    from fp8lab.kernels import reduce as R

    library = R.reduce_kernel2
    copy = _compile(notebook.editable_source("fp8lab.kernels.reduce.reduce_kernel2"))

    def crash(rng, only=None):
        assert R.VERSIONS[2].kernel is copy and R.reduce_kernel2 is copy  # swapped in while the checks run
        raise RuntimeError("boom")

    monkeypatch.setattr(R, "checks", crash)
    with pytest.raises(RuntimeError, match="boom"):
        notebook.try_kernel(R, 2, copy, rng=rng)
    assert R.VERSIONS[2].kernel is library and R.reduce_kernel2 is library


def test_try_kernel_refuses_a_factory_copy_whose_constants_changed(rng):
    """Lecture 06 reuses `bits` as a loop variable after the editable cell: the copy must not run with it."""
    from fp8lab.kernels import fp8_gemm as fg

    target = "fp8lab.kernels.fp8_gemm.simt.fp8_gemm_kernel1"
    ns: dict = {}
    exec(notebook.editable_source(target), ns)
    ns["bits"] = 15
    with pytest.raises(ValueError, match=r"reads bits = 15, but the library compiles .* with bits = -1"):
        notebook.try_kernel(fg, 1, ns["fp8_gemm_kernel1"], rng=rng)
    assert fg.kernels(1, 2, -1, 0)[1] is notebook.library_kernel(target)


def test_try_kernel_swaps_a_factory_kernel_in_the_cache():
    from fp8lab.kernels import fp8_gemm as fg

    target = "fp8lab.kernels.fp8_gemm.simt.fp8_gemm_kernel1"
    library = notebook.library_kernel(target)
    assert library is fg.kernels(1, 2, -1, 0)[1]
    copy = _compile(notebook.editable_source(target))
    undo = notebook._swap(fg, library, copy)
    try:
        assert fg.kernels(1, 2, -1, 0)[1] is copy and fg.kernels(1, 2, -1, 0)[2] is not copy
    finally:
        notebook._restore(undo)
    assert fg.kernels(1, 2, -1, 0)[1] is library


def test_try_kernel_rejects_bad_input():
    from fp8lab.kernels import loss, reduce as R

    copy = _compile(notebook.editable_source("fp8lab.kernels.reduce.reduce_kernel2"))
    with pytest.raises(TypeError, match="module must be a kernel module"):
        notebook.try_kernel("reduce", 2, copy)
    with pytest.raises(ValueError, match="checks take no `only`"):
        notebook.try_kernel(loss, 1, copy)
    with pytest.raises(TypeError, match="kernel must be a CUDA kernel"):
        notebook.try_kernel(R, 2, lambda x, out: None)
    with pytest.raises(ValueError, match=r"version must be one of \[1, 2, 3\]"):
        notebook.try_kernel(R, 7, copy)
    with pytest.raises(ValueError, match="selects none of"):
        notebook.try_kernel(R, "no_such_op", copy)
    renamed = _compile(notebook.editable_source("fp8lab.kernels.reduce.reduce_kernel2")
                       .replace("def reduce_kernel2", "def my_sum"))
    with pytest.raises(ValueError, match="is not a kernel of fp8lab.kernels.reduce"):
        notebook.try_kernel(R, 2, renamed)
    assert R.VERSIONS[2].kernel is R.reduce_kernel2 and R.reduce_kernel2.py_func.__name__ == "reduce_kernel2"


# --------------------------------------------------------------------------------------- generator and helpers


def test_the_generated_cell_imports_what_the_kernel_reads():
    text = notebook.editable_source("fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2")
    lines = text.splitlines()
    assert lines[0] == ("# editable copy of fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2: change it, re-run "
                        "this cell and the next")
    assert "from fp8lab.device.runtime import WARP_SIZE, cuda" in lines  # from where the library module imports them
    assert "from fp8lab.kernels.common import nanmax, warp_max" in lines
    assert {"gk = 128", "per_lane = 4", "write_codes = False"} <= set(lines)  # the closure's constants
    assert ('group_scale, encode = closure("fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2", "group_scale", '
            '"encode")') in lines
    from fp8lab.kernels import quantize_fine as qf

    kernel = qf.tile_kernels("e4m3", 128, "amax")[2]
    cells = dict(zip(kernel.py_func.__code__.co_freevars, kernel.py_func.__closure__))
    assert notebook.closure("fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2", "encode") is \
        cells["encode"].cell_contents
    import inspect
    import textwrap

    assert text.endswith(textwrap.dedent(inspect.getsource(kernel.py_func)).rstrip("\n"))  # the source, exactly


def test_targets_and_closures_are_checked():
    with pytest.raises(ValueError, match="fp8lab.<module>.<kernel>"):
        notebook.editable_source("reduce_kernel2")
    with pytest.raises(ValueError, match="is not a kernel of fp8lab.kernels.reduce"):
        notebook.editable_source("fp8lab.kernels.reduce.reduce_sum")
    with pytest.raises(ValueError, match="there is no module"):
        notebook.library_kernel("fp8lab.kernels.nope.k")
    with pytest.raises(ValueError, match="names must be among the closure"):
        notebook.closure("fp8lab.kernels.tc_accum.mma_probe_kernel", "nope")
    assert notebook.editable_target("# editable copy of fp8lab.x.k: change it, re-run this cell and the next\n") \
        == "fp8lab.x.k"
    assert notebook.editable_target("show(x)") is None
    with pytest.raises(ValueError, match="first line must read"):
        notebook.editable_target("# editable copy of fp8lab.x.k\n")


def test_show_prints_an_excerpt_with_where_it_is(capsys):
    from fp8lab.kernels import fp8_gemm as fg

    notebook.show(fg.make_kernel4, lines=("for kt in range(nk):", "wait_copies()"))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# fp8lab/kernels/fp8_gemm/tensor_cores.py:") and out[0].endswith(
        f"(make_kernel4, {len(notebook._where(fg.make_kernel4)[2])} lines in all)")
    first, last = (int(x) for x in out[0].split(":")[1].split(" ")[0].split("-"))
    assert last - first + 1 == len(out) - 2 and out[1] == "for kt in range(nk):" and "wait_copies()" in out[-2]
    with pytest.raises(ValueError, match="anchor 'no such line' is not in the source of make_kernel4"):
        notebook.show(fg.make_kernel4, lines=("for kt in range(nk):", "no such line"))
    with pytest.raises(TypeError, match="exactly one object"):
        notebook.show(fg.make_kernel4, fg.make_kernel5, lines=("a", "b"))
    with pytest.raises(TypeError, match="lines must be a tuple"):
        notebook.show(fg.make_kernel4, lines="for kt")


def test_bench_only_limits_checks_to_some_versions(capsys, rng):
    assert load("cast").main(["--check-only", "--only", "2"]) == 0
    out = capsys.readouterr().out
    assert "v2 hardware" in out and "v1 software" not in out
    with pytest.raises(SystemExit):
        load("loss").main(["--check-only", "--only", "1"])  # its checks take no `only`
    assert "checks take no `only`" in capsys.readouterr().err
    rows = load("elementwise").checks(rng, only=("bias_add",))
    assert [r[0].split(",")[0] for r in rows] == ["bias_add"]
