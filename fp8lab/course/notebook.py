"""Helpers for the lecture notebooks: library source to read, and library kernels to change and try.

- `show(*objs, lines=None)`: print the source of package objects (for a kernel, the Python function it was
  compiled from); `lines=(first, last)` prints only the lines from the one holding `first` to the next one holding
  `last`, under a header naming the file, the line numbers and the function's length.
- `editable_source(target)`: the text of an *editable cell* for a library kernel, e.g.
  "fp8lab.kernels.reduce.reduce_kernel2": a marker line (EDITABLE_MARK), an import for every global name the
  kernel uses (from the library module that defines it), for a kernel built by a factory its closure's constants
  as assignments and its closure's device functions through `closure`, then the kernel's source exactly as in the
  library. `scripts/editable.py --write` regenerates every editable cell of the lectures from the library and
  tests/test_editable.py fails when one differs: the library stays the single source.
- `try_kernel(module, version, kernel)`: the learner's copy, run where the library runs its own kernel for that
  version: the module's checks of that version (`module.checks(rng, only=[version])`: fresh random inputs, odd
  shapes, poisoned outputs) and, on a GPU, its timings next to the library's kernel at the module's benchmark
  size. The library's kernel is put back afterwards, whatever happened.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import importlib
import inspect
import pathlib
import textwrap
import time

import numpy as np

from .. import bench
from ..device import runtime
from ..kernels import versions

ROOT = pathlib.Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------------------------------------------
# Reading the library's source
# ----------------------------------------------------------------------------------------------------------------


def _function(obj):
    return getattr(obj, "py_func", obj)  # a kernel: the Python function it was compiled from


def _where(obj) -> tuple[str, int, list[str]]:
    """(path from the repository root, first line number, source lines) of a package object."""
    fn = _function(obj)
    lines, first = inspect.getsourcelines(fn)
    path = pathlib.Path(inspect.getsourcefile(fn)).resolve()
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    return path.as_posix(), first, lines


def _find(anchor: str, lines: list[str], start: int, what: str) -> int:
    if not isinstance(anchor, str) or not anchor:
        raise TypeError(f"lines must be two non-empty strings (anchor texts), got {anchor!r}")
    for i in range(start, len(lines)):
        if anchor in lines[i]:
            return i
    after = f" at or after line {start + 1} of it" if start else ""
    raise ValueError(f"lines: anchor {anchor!r} is not in the source of {what}{after}")


def source_text(obj, lines=None) -> str:
    """What `show(obj, lines=lines)` prints (without the final newline)."""
    path, first, src = _where(obj)
    name = getattr(_function(obj), "__qualname__", getattr(obj, "__name__", repr(obj)))
    if lines is None:
        return textwrap.dedent("".join(src)).rstrip("\n")
    if not (isinstance(lines, tuple) and len(lines) == 2):
        raise TypeError(f"lines must be a tuple (first anchor, last anchor) of texts in the source, got {lines!r}")
    what = f"{name} ({path}:{first}-{first + len(src) - 1})"
    i = _find(lines[0], src, 0, what)
    j = _find(lines[1], src, i, what)
    head = f"# {path}:{first + i}-{first + j} ({name}, {len(src)} lines in all)"
    return head + "\n" + textwrap.dedent("".join(src[i:j + 1])).rstrip("\n")


def show(*objs, lines=None) -> None:
    """Print the source of package objects; for a kernel, the Python function it was compiled from.

    lines: (first, last) anchor texts: print only one object's lines from the first that contains `first` to the
    next that contains `last` (both included), under a header "# path:from-to (name, N lines in all)". ValueError
    naming the anchor when it is not in the source.
    """
    if lines is not None and len(objs) != 1:
        raise TypeError(f"lines needs exactly one object to excerpt, got {len(objs)}")
    for obj in objs:
        print(source_text(obj, lines) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# Editable copies of library kernels
# ----------------------------------------------------------------------------------------------------------------

EDITABLE_MARK = "# editable copy of "
"""First line of an editable cell: EDITABLE_MARK + target + EDITABLE_TAIL."""
EDITABLE_TAIL = ": change it, re-run this cell and the next"

FACTORY_KERNELS = {
    # kernels a `make_*` factory builds: how to reach the library's cached copy, in its module's namespace. The
    # arguments are the configuration that module's checks run for that version, so the learner's copy (compiled
    # with these constants) is the one they launch
    "fp8lab.kernels.quantize_fine.tile.tile_fused_kernel2": 'tile_kernels("e4m3", 128, "amax")[2]',
    "fp8lab.kernels.fp8_gemm.simt.fp8_gemm_kernel1": "kernels(1, 2, -1, 0)[1]",
    "fp8lab.kernels.tc_accum.mma_probe_kernel": 'kernel(1, "e4m3", "e4m3")',
    # fp8_gemm's checks of version 7: A in 1 x 128 tiles (1), B in 128 x 128 blocks (2), E4M3, K = 300 (byte loads)
    "fp8lab.kernels.fp8_gemm.tensor_cores.fp8_gemm_kernel7": 'overlapped_kernel(7, 1, 2, "e4m3", "e4m3", 0)',
}


def _split(target: str):
    if not isinstance(target, str) or target.count(".") < 2 or not target.startswith("fp8lab."):
        raise ValueError(f"target must name a library kernel as 'fp8lab.<module>.<kernel>', got {target!r}")
    mod_name, name = target.rsplit(".", 1)
    try:
        module = importlib.import_module(mod_name)
    except ImportError:
        raise ValueError(f"target {target!r}: there is no module {mod_name}") from None
    return module, name


def library_kernel(target: str):
    """The library's kernel object that `target` ("fp8lab.<module>.<kernel>") names: a module-level kernel, or for
    a factory's kernel (FACTORY_KERNELS) the one the kernel cache holds for the configuration the checks run."""
    module, name = _split(target)
    if target in FACTORY_KERNELS:
        kernel = eval(FACTORY_KERNELS[target], vars(module))  # a call the library writes, never user input
    else:
        kernel = getattr(module, name, None)
    if not hasattr(kernel, "py_func") or kernel.py_func.__name__ != name:
        raise ValueError(f"target {target!r} is not a kernel of {module.__name__} (editable: its module-level "
                         f"kernels and {sorted(FACTORY_KERNELS)})")
    return kernel


def closure(target: str, *names):
    """The values a factory's kernel closes over (its device functions), by name: one value for one name, else a
    tuple. Editable cells of factory kernels fetch their closure's device functions this way."""
    fn = library_kernel(target).py_func
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    missing = [n for n in names if n not in cells]
    if missing or not names:
        raise ValueError(f"names must be among the closure of {target} {sorted(cells)}, got {list(names)}")
    values = tuple(cells[n].cell_contents for n in names)
    return values[0] if len(values) == 1 else values


def _is_constant(value) -> bool:
    """A closure value the editable cell writes as an assignment (anything else comes through `closure`)."""
    return isinstance(value, (bool, int, float, str, np.generic))


def _module_imports(module) -> dict:
    """{name: import line} for the names module binds by import statements at its top level (absolute form)."""
    tree = ast.parse(inspect.getsource(module))
    package = module.__package__  # a module's parent; a package's __init__: the package itself
    out = {}
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            stack[:0] = node.body + getattr(node, "orelse", [])
        elif isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name] = (f"import {a.name}" + (f" as {a.asname}" if a.asname else ""), None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                out[a.asname or a.name] = (base, a.name + (f" as {a.asname}" if a.asname else ""))
    return out


def _free_names(fn_node: ast.FunctionDef) -> list[str]:
    """Names a function (decorators included) reads that it neither takes nor assigns, in order of first use."""
    local = {a.arg for a in fn_node.args.args + fn_node.args.kwonlyargs}
    loads = []
    for node in ast.walk(fn_node):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.append(node.id)
            else:
                local.add(node.id)
    seen = []
    for n in loads:
        if n not in local and not hasattr(builtins, n) and n not in seen:
            seen.append(n)
    return seen


def editable_source(target: str) -> str:
    """The text of the editable cell of `target` (see the module docstring); raises ValueError for a name that is
    not a library kernel, or a global the generator cannot import."""
    module, name = _split(target)
    fn = library_kernel(target).py_func
    src = textwrap.dedent(inspect.getsource(fn)).rstrip("\n")
    node = ast.parse(src).body[0]
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    imports = _module_imports(module)
    plain, froms, consts, devices = set(), {}, [], []
    for n in _free_names(node):
        if n in cells:
            value = cells[n].cell_contents
            if _is_constant(value):
                consts.append(f"{n} = {value!r}")
                if isinstance(value, np.generic):
                    plain.add("import numpy as np")
            else:
                devices.append(n)
        elif n in imports:
            base, what = imports[n]
            if what is None:
                plain.add(base)
            else:
                froms.setdefault(base, set()).add(what)
        elif n in vars(module):
            froms.setdefault(module.__name__, set()).add(n)
        else:
            raise ValueError(f"{target} reads {n!r}, which {module.__name__} neither defines nor imports")
    if devices:
        froms.setdefault(__name__, set()).add("closure")
    out = [EDITABLE_MARK + target + EDITABLE_TAIL]
    if target in FACTORY_KERNELS:
        out.append(f"# (built by {module.__name__.rsplit('.', 1)[1]}.{FACTORY_KERNELS[target]}: the constants it "
                   "compiles in are set below)")
    out += sorted(plain)
    out += [f"from {base} import {', '.join(sorted(froms[base]))}" for base in sorted(froms)]
    if consts or devices:
        out.append("")
        out += consts
        if devices:
            quoted = ", ".join(f'"{n}"' for n in [target] + devices)
            out.append(f"{', '.join(devices)} = closure({quoted})")
    return "\n".join(out + ["", "", src])


def editable_target(cell_source: str) -> str | None:
    """The target an editable cell's first line names, or None for any other cell."""
    first = cell_source.split("\n", 1)[0]
    if not first.startswith(EDITABLE_MARK):
        return None
    if not first.endswith(EDITABLE_TAIL):
        raise ValueError(f"an editable cell's first line must read {EDITABLE_MARK!r} + target + {EDITABLE_TAIL!r}, "
                         f"got {first!r}")
    return first[len(EDITABLE_MARK):-len(EDITABLE_TAIL)]


# ----------------------------------------------------------------------------------------------------------------
# Trying a learner's kernel in the library's place
# ----------------------------------------------------------------------------------------------------------------


def _modules_of(module) -> list:
    """[module] for a kernel module; for a package (fp8lab.kernels.fp8_gemm), it and its imported submodules."""
    import sys

    prefix = module.__name__ + "."
    return [module] + [m for n, m in sorted(sys.modules.items()) if n.startswith(prefix) and m is not None]


def _library_target(module, name: str) -> str:
    """The editable target of the library's kernel `name` in `module`: module.name, or for a package the submodule
    that defines it (e.g. fp8lab.kernels.fp8_gemm.simt.fp8_gemm_kernel1)."""
    for mod in _modules_of(module):
        target = f"{mod.__name__}.{name}"
        if target in FACTORY_KERNELS or hasattr(getattr(mod, name, None), "py_func"):
            return target
    return f"{module.__name__}.{name}"


def _swap(module, old, new) -> list:
    """Put `new` wherever `module`'s globals (and the dicts, tuples and Version rows they hold) or the kernel cache
    (runtime.cached) hold `old`; returns the undo list [(dict, key, previous value)]."""
    undo = []

    def swapped(value):  # value with `new` for `old` (itself, in a tuple, or in a Version row's fields), else None
        if value is old:
            return new
        if isinstance(value, tuple) and any(v is old for v in value):
            return tuple(new if v is old else v for v in value)
        if isinstance(value, versions.Version):
            fields = {f.name: swapped(getattr(value, f.name)) for f in dataclasses.fields(value)}
            fields = {k: v for k, v in fields.items() if v is not None}
            return dataclasses.replace(value, **fields) if fields else None
        return None

    def visit(d, key, value, depth):
        replacement = swapped(value)
        if replacement is not None:
            undo.append((d, key, value))
            d[key] = replacement
        elif isinstance(value, dict) and depth < 3:
            for k, v in list(value.items()):
                visit(value, k, v, depth + 1)

    for mod in _modules_of(module):
        g = vars(mod)
        for name, value in list(g.items()):
            if not name.startswith("__"):
                visit(g, name, value, 1)
    cache = runtime.kernel_cache()
    for key, value in list(cache.items()):
        visit(cache, key, value, 1)
    return undo


def _restore(undo) -> None:
    for d, key, value in reversed(undo):
        d[key] = value


@dataclasses.dataclass
class Tried:
    """What try_kernel found: the checks passed (what was checked, result) and, on a GPU, the timing tables (the
    learner's rows, then the library's); tables is empty under the simulator."""

    checks: list
    tables: list


def _timing_args(module, version):
    """The argparse namespace the module's timings expect: its OPTIONS at their defaults, `only` = [version]."""
    parser = argparse.ArgumentParser()
    for flag, kwargs in getattr(module, "OPTIONS", {}).items():
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args([])
    args.only = (version,)
    return args


def try_kernel(module, version, kernel, *, rng=None) -> Tried:
    """Run `kernel` (a learner's copy of one of the library's kernels, the same name) as `version` of `module`
    (a kernel module, e.g. fp8lab.kernels.reduce): the module's checks of that version only (fresh random
    inputs, shapes that are not tile multiples, poisoned outputs), then on a GPU its timings at the module's
    benchmark size next to the library's kernel. version: a version number, or the name of an op without versions
    that the module's checks select (e.g. "bias_add"). The library's kernel is put back afterwards, also when a
    check fails: then an AssertionError carries the module's mismatch message."""
    if not inspect.ismodule(module) or not callable(getattr(module, "checks", None)):
        raise TypeError(f"module must be a kernel module (with checks and timings), e.g. fp8lab.kernels.reduce, "
                        f"got {type(module).__name__} {module!r}")
    if "only" not in inspect.signature(module.checks).parameters:
        raise ValueError(f"module {module.__name__} has no editable kernels: its checks take no `only`")
    if not hasattr(kernel, "py_func"):
        raise TypeError(f"kernel must be a CUDA kernel (a function decorated with @cuda.jit), got "
                        f"{type(kernel).__name__} {kernel!r}")
    name = kernel.py_func.__name__
    target = _library_target(module, name)
    old = library_kernel(target)  # ValueError when the module has no kernel of that name
    seen = kernel.py_func.__globals__
    for n, cell in zip(old.py_func.__code__.co_freevars, old.py_func.__closure__ or ()):
        value = cell.cell_contents
        if _is_constant(value) and n in seen and not (seen[n] == value and type(seen[n]) is type(value)):
            # a later cell may reuse the name (a loop variable `bits`), or the learner changed the constant
            raise ValueError(f"your {name} reads {n} = {seen[n]!r}, but the library compiles {target} with {n} = "
                             f"{value!r}, the configuration its checks run: re-run the editable cell (it sets {n})")
    versions = list(getattr(module, "VERSIONS", {}))
    if isinstance(version, bool) or not isinstance(version, (int, str)):
        raise TypeError(f"version must be a version number of {module.__name__} {versions} or the name of one of "
                        f"its ops, got {version!r}")
    if isinstance(version, int) and version not in versions:
        raise ValueError(f"version must be one of {versions} for {module.__name__}, got {version}")
    rng = np.random.default_rng() if rng is None else rng
    short = module.__name__.rsplit(".", 1)[1]
    what = f"your {name} as {short} {'version ' if isinstance(version, int) else ''}{version}"
    t0 = time.perf_counter()
    undo = _swap(module, old, kernel)
    try:
        if not undo:
            raise RuntimeError(f"{target}: the library holds its kernel nowhere try_kernel can swap it")
        try:
            rows = module.checks(rng, only=(version,))
        except AssertionError as e:
            raise AssertionError(f"{what}: {e}") from None
        if not rows:
            raise ValueError(f"version {version!r} selects none of {module.__name__}'s checks")
        bench.print_table(f"{what}: checks against the reference ({runtime.backend}, "
                          f"{time.perf_counter() - t0:.1f} s)", ["check", "result"], [list(r) for r in rows])
        if runtime.IS_SIM:
            print("\ntiming needs a GPU: under the simulator every CUDA thread is a Python thread, so nothing is "
                  "timed here")
            return Tried(rows, [])
        args = _timing_args(module, version)
        yours = module.timings(rng, args)
    finally:
        _restore(undo)
    library = module.timings(rng, args)
    tables = []
    for mine, lib in zip(yours, library):
        if mine.unit is None:
            tables += [dataclasses.replace(mine, title="yours: " + mine.title),
                       dataclasses.replace(lib, title="library: " + lib.title)]
        else:
            rows_ = [dataclasses.replace(r, label="yours: " + r.label) for r in mine.rows]
            rows_ += [dataclasses.replace(r, label="library: " + r.label) for r in lib.rows]
            tables.append(dataclasses.replace(lib, rows=rows_))
    device = runtime.device_info()["name"]
    for t in tables:
        head, body = t.columns(device)
        bench.print_table(t.heading(), head, body)
    return Tried(rows, tables)
