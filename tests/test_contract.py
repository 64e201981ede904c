"""The package's shape: the kernel-module contract (fp8lab/kernels/README.md), the layers of the import graph, and
the facts that must live in one place. These tests read the source (ast) and the registry; the registry-driven
test runs every kernel module's own checks."""

from __future__ import annotations

import ast
import functools
import inspect
import pathlib
import re
import sys

import numpy as np
import pytest

import fp8lab
from fp8lab import bench
from fp8lab.device import runtime
from fp8lab.kernels import MODULES, load, versions

PKG = pathlib.Path(fp8lab.__file__).parent

# The layer of every module, from ARCHITECTURE.md's table (scripts/architecture.py reads it): lower layers never
# import higher ones.
sys.path.insert(0, str(PKG.parent / "scripts"))
import architecture  # noqa: E402

LAYER, LAYER_PROBLEMS = architecture.module_layers()


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODS = _modules()


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    """The fp8lab-relative module an ImportFrom names ('' for the package itself), or None if outside fp8lab."""
    if node.level == 0:
        if not (node.module or "").startswith("fp8lab"):
            return None
        return (node.module or "")[len("fp8lab"):].lstrip(".")
    pkg = mod.split(".")
    if not MODS[mod].name == "__init__.py":
        pkg = pkg[:-1]
    if mod == "__init__":
        pkg = []
    pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
    return ".".join(pkg + ([node.module] if node.module else []))


@functools.cache  # parsed once per session: every test below reads the same modules
def _imports(mod: str):
    """[(imported fp8lab module, names imported from it, alias map)] for every import in mod, function bodies too."""
    tree = ast.parse(MODS[mod].read_text())
    edges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node)
            if base is None:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}".strip(".")
                if sub in MODS:  # `from . import runtime`: a module
                    edges.append((sub, None, a.asname or a.name))
                else:
                    edges.append((base or "__init__", a.name, a.asname or a.name))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fp8lab"):
                    edges.append((a.name[len("fp8lab"):].lstrip(".") or "__init__", None, a.asname or a.name))
    return edges, tree


@functools.cache
def _graph():
    return {m: {t for t, _, _ in _imports(m)[0] if t != m} for m in MODS}


def test_every_module_has_a_layer():
    assert not LAYER_PROBLEMS, "ARCHITECTURE.md's layer table: " + "; ".join(LAYER_PROBLEMS)
    assert set(MODS) == set(LAYER)


def test_the_architecture_picture_is_drawn_from_the_table():
    text = architecture.DOC.read_text(encoding="utf-8")
    assert architecture.render(text) == text, "ARCHITECTURE.md's picture is stale: run scripts/architecture.py --write"


def test_import_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [m, t]))
            if not state.get(t):
                visit(t, path + [m])
        state[m] = 2

    for m in graph:
        if not state.get(m):
            visit(m, [])


def test_lower_layers_never_import_higher_ones():
    bad = [f"{m} (layer {LAYER[m]}) imports {t} (layer {LAYER[t]})"
           for m, targets in _graph().items() for t in targets if LAYER[t] > LAYER[m]]
    assert not bad, "\n".join(bad)


def test_numpy_spec_modules_import_no_numba():
    for m in {m for m, layer in LAYER.items() if layer == 0} - {"device.select"}:  # device.select re-reads numba's config
        tree = _imports(m)[1]
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith(("numba", "llvmlite")) for n in names), f"{m} imports numba"


def test_kernel_modules_import_no_other_kernel_module():
    graph = _graph()
    for name in MODULES:
        own = f"kernels.{name}"
        for m in (m for m in graph if m == own or m.startswith(own + ".")):  # a package's files import each other
            others = {t for t in graph[m] if t.startswith("kernels.") and t != own and not t.startswith(own + ".")
                      and t not in ("kernels.common", "kernels.versions")}
            assert not others, f"{m} imports {others}: shared device code belongs in kernels.common"


def test_no_module_uses_another_modules_private_names():
    bad = []
    for m in MODS:
        edges, tree = _imports(m)
        aliases = {alias: t for t, name, alias in edges if name is None}
        for t, name, _ in edges:
            if name and name.startswith("_") and not name.startswith("__"):
                bad.append(f"{m}: from {t} import {name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id] != m):
                bad.append(f"{m}: {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("value", [448, 57344, 1e-12])
def test_numbers_live_in_one_place(value):
    """FP8 maxima and the amax floor are stated in formats.py / spec.py only; everything else refers to them."""
    found = []
    for m in MODS:
        if m in ("numerics.formats", "numerics.spec"):
            continue
        for node in ast.walk(_imports(m)[1]):
            if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                    and not isinstance(node.value, bool) and node.value == value:
                found.append(f"{m}:{node.lineno}")
    assert not found, f"{value} written as a literal in {found}"


# ----------------------------------------------------------------------------------------------------------------
# The kernel-module contract
# ----------------------------------------------------------------------------------------------------------------


def test_registry_lists_every_kernel_module():
    files = {p.stem for p in (PKG / "kernels").glob("*.py")} - {"__init__", "common", "versions"}
    packages = {p.parent.name for p in (PKG / "kernels").glob("*/__init__.py")}  # a kernel module split into files
    assert files | packages == set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_honours_the_contract(name):
    mod = load(name)
    versions.check_table(mod.VERSIONS, mod.BEST)  # keys 1..n, each a Version row, BEST among them
    for v in mod.VERSIONS:
        assert f"version {v}:" in mod.__doc__, f"the module docstring must list 'version {v}: ...'"
    assert callable(mod.reference)
    params = inspect.signature(mod.checks).parameters
    assert list(params) in (["rng"], ["rng", "only"]), "checks(rng) or, to check some versions, checks(rng, only=None)"
    if "only" in params:
        assert params["only"].default is None
    assert list(inspect.signature(mod.timings).parameters) == ["rng", "args"]
    params = inspect.signature(mod.main).parameters
    assert list(params) == ["argv"] and params["argv"].default is None
    assert "bench.main(__name__, argv)" in inspect.getsource(mod.main), "main runs the shared harness"
    for flag, kwargs in getattr(mod, "OPTIONS", {}).items():
        assert flag.startswith("--") and "help" in kwargs


@pytest.mark.parametrize("name", MODULES)
def test_module_checks_pass(name, rng):
    """Every module's own checks (every version against the reference, poisoned outputs, odd shapes)."""
    rows = load(name).checks(rng)
    assert rows and all(len(r) == 2 and all(isinstance(c, str) and c for c in r) for r in rows)


def test_harness_runs_checks_and_reports(capsys):
    assert load("loss").main(["--check-only"]) == 0
    out = capsys.readouterr().out
    assert "loss: checks against the reference" in out and "v1 loss and dz" in out


def test_harness_fails_when_a_check_fails(monkeypatch):
    mod = load("elementwise")
    monkeypatch.setattr(mod, "reference", lambda a: np.ascontiguousarray(np.asarray(a).T) + 1)
    with pytest.raises(AssertionError, match="transpose v1"):
        mod.main(["--check-only"])


def test_table_columns_and_markdown():
    t = bench.Table("t", "GB/s", [bench.Row("k", 2.0, 8e9)], ceiling=5000.0)
    head, body = t.columns("NVIDIA H200")
    assert head == ["kernel", "time", "GB/s", "of copy", "of H200 HBM 4,800 GB/s"]
    assert body == [["k", "2.000 ms", "4,000", "80.0%", "83.3%"]]
    head, body = t.columns(None)
    assert head == ["kernel", "time", "GB/s", "of copy"] and body[0][3] == "80.0%"
    t = bench.Table("t", "TFLOP/s", [bench.Row("k", 1.0, 2e12), bench.Row("sim", None, 1.0)], ceiling=4000.0,
                    peak_kind="fp8")
    head, body = t.columns("NVIDIA H100 80GB HBM3")
    assert body[0][2:] == ["2,000.0", "50.0%", "101.1%"] and body[1][1:] == ["not measured (simulator)", "-", "-", "-"]
    # the markdown section names the command as run, module options included
    md = bench._markdown(load("fp8_gemm"), "fp8_gemm", [("c", "ok")], [t], 1.0, ["--deepseek"])
    assert "`fp8lab bench fp8_gemm --markdown --deepseek`" in md and "| k |" in md


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODULES)
def test_module_checks_pass_on_gpu(name, rng):
    assert not runtime.IS_SIM
    assert load(name).checks(rng)


# Measurements live in BENCHMARKS.md and docs/notes/, dated, with their command and device: never in the code, where
# they go stale (a docstring says what the op computes, its versions in a line each, and how to run it).
_DATED = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_MEASURED_ON = re.compile(r"measured (?:on|here)\b[^.\n]{0,40}\b(?:H100|H200|H800|A100|A6000|V100|GPU|NVIDIA|machine)",
                          re.I)


def test_no_dates_or_measured_figures_in_the_code():
    found = []
    for m, path in MODS.items():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if _DATED.search(line) or _MEASURED_ON.search(line):
                found.append(f"fp8lab/{path.relative_to(PKG)}:{i}: {line.strip()[:80]}")
    assert not found, "dated or measured figures in the code (move them to docs/notes/ or BENCHMARKS.md):\n" + \
        "\n".join(found)


def test_the_date_check_catches_what_it_should():
    assert _DATED.search("Measured on an NVIDIA H200 on 2026-12-04") and _MEASURED_ON.search("measured on the H200")
    assert _MEASURED_ON.search("Measured on an NVIDIA H200 (percent of a copy)")
    assert not _MEASURED_ON.search("the GPUs the course is measured on, and an occupancy model")
    assert not _DATED.search("version 2026 of the spec") and not _MEASURED_ON.search("measured in the same run")
