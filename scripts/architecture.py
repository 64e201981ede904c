#!/usr/bin/env python3
"""ARCHITECTURE.md's layers: read its table, map every module of fp8lab to a layer, draw the picture.

    scripts/architecture.py --check   exit 1 when the picture in ARCHITECTURE.md is not the one the table draws
    scripts/architecture.py --write   redraw it

tests/test_contract.py uses `layers()` and `module_layers()` to check the table against the code.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "ARCHITECTURE.md"
PKG = ROOT / "fp8lab"
GROUPS = ("numerics", "device", "bench", "kernels", "training", "comm", "course")  # the picture's columns
START, END = "<!-- picture: scripts/architecture.py --write -->", "<!-- end of picture -->"
WIDTH = 16  # characters a column of the picture takes


def layers(text: str | None = None) -> dict[int, list[str]]:
    """{layer: [module names as the table writes them, `pkg.*` wildcards included]} from ARCHITECTURE.md."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    out = {}
    for m in re.finditer(r"^\| (\d+) \| (.+?) \| .+\|$", text, re.M):
        out[int(m.group(1))] = re.findall(r"`([\w.*]+)`", m.group(2))
    if not out:
        raise ValueError(f"{DOC.name}: no layer table found")
    return out


def modules() -> list[str]:
    """Every module of the package, dotted relative to fp8lab ("numerics.spec"; a package by its own name)."""
    out = []
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out.append(".".join(parts))
    return sorted(out)


def module_layers(table: dict[int, list[str]] | None = None, names=None) -> tuple[dict[str, int], list[str]]:
    """({module: layer} for every module, [problems]): a name listed twice, a name listed that is no module, a
    wildcard that matches nothing, a module no row covers. Names take precedence over wildcards; the longest
    wildcard wins."""
    table = layers() if table is None else table
    names = modules() if names is None else names
    exact, wild, problems = {}, {}, []
    for layer, listed in table.items():
        for n in listed:
            target = wild if n.endswith(".*") else exact
            key = n[:-2] if n.endswith(".*") else n
            if key in target:
                problems.append(f"{n} is listed twice (layers {target[key]} and {layer})")
            target[key] = layer
    problems += [f"{n} is listed but is no module of fp8lab" for n in exact if n not in names]
    out = {}
    for n in names:
        if n in exact:
            out[n] = exact[n]
            continue
        prefixes = [p for p in wild if n.startswith(p + ".")]
        if prefixes:
            out[n] = wild[max(prefixes, key=len)]
        else:
            problems.append(f"{n} is in no row of the layer table")
    problems += [f"{p}.* matches no module" for p in wild if not any(n.startswith(p + ".") for n in names)]
    return out, problems


def _column(name: str) -> str:
    head = name.split(".")[0]
    return head if head in GROUPS else "top level"


def _does_something(folder: str) -> bool:
    """Whether fp8lab/<folder>/__init__.py holds code (imports or definitions) beyond its docstring."""
    lines = (PKG / folder / "__init__.py").read_text(encoding="utf-8").splitlines()
    return any(re.match(r"(from |import |def |class |[A-Z_]+ = )", line) and "__future__" not in line for line in lines)


def picture(table: dict[int, list[str]] | None = None) -> str:
    """The layers as a grid: a row per layer (top: 5), a column per folder, the table's names in each cell."""
    table = layers() if table is None else table
    cols = list(GROUPS) + ["top level"]
    cells = {}
    for layer, listed in table.items():
        for n in listed:
            col = _column(n)
            if n == col and not _does_something(col):  # a folder's __init__ that only names its folder
                continue
            short = n if col == "top level" else ("__init__" if n == col else n[len(col) + 1:])
            if short == "*":
                short = "each module"
            elif short.endswith(".*"):
                short = short[:-2] + "/*"
            cells.setdefault((layer, col), []).append(short)
    # each column as wide as its longest name (at least WIDTH), so that no name runs into the next column
    width = {c: max([WIDTH] + [len(s) + 3 for (_, col), names in cells.items() if col == c for s in names])
             for c in cols}
    lines = ["layer  " + "".join(c.ljust(width[c]) for c in cols).rstrip(), ""]
    for layer in sorted(table, reverse=True):
        wrapped = {c: textwrap.wrap(", ".join(cells.get((layer, c), [])), width[c] - 2, break_long_words=False,
                                    break_on_hyphens=False) or [""] for c in cols}
        for i in range(max(len(w) for w in wrapped.values())):
            row = "".join((wrapped[c][i] if i < len(wrapped[c]) else "").ljust(width[c]) for c in cols)
            lines.append((f"  {layer}    " if i == 0 else "       ") + row.rstrip())
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render(text: str) -> str:
    """ARCHITECTURE.md's text with the picture redrawn from its table."""
    i, j = text.index(START), text.index(END)
    return text[:i] + START + "\n```text\n" + picture(layers(text)) + "```\n" + text[j:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="exit 1 when the picture is stale")
    what.add_argument("--write", action="store_true", help="redraw the picture")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = render(text)
    if args.write:
        DOC.write_text(new, encoding="utf-8")
        return 0
    if new != text:
        print(f"{DOC.name}: the picture is not the one its table draws: run scripts/architecture.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
