#!/usr/bin/env python3
"""The lectures' editable kernel cells, generated from the library (fp8lab.course.notebook.editable_source).

    scripts/editable.py --check
        Exit 1 listing every editable cell of notebooks/*.ipynb whose source differs from what the generator makes
        of the library now (a kernel changed and the cell was not regenerated, or the cell was edited by hand).
        tests/test_editable.py runs the same check.
    scripts/editable.py --write
        Regenerate those cells in place (only their source; the rest of each notebook is rewritten byte for byte
        as it was, in its own JSON style).
    scripts/editable.py --show TARGET
        Print the cell for TARGET (e.g. fp8lab.kernels.reduce.reduce_kernel2), to paste into a new code cell.

An editable cell is a code cell whose first line is fp8lab.course.notebook.EDITABLE_MARK + target + EDITABLE_TAIL; the
cell after it runs the learner's copy through `fp8lab.course.notebook.try_kernel`. Run from the repository root (or with
--root DIR) in the environment fp8lab is installed in.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dump(nb, like: str) -> str:
    """nb as JSON in the style of the file's text `like` (indent 1; non-ASCII escaped or not, as it was)."""
    for ascii_ in (False, True):
        if json.dumps(json.loads(like), indent=1, ensure_ascii=ascii_) + "\n" == like:
            return json.dumps(nb, indent=1, ensure_ascii=ascii_) + "\n"
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def _lines(text: str) -> list[str]:
    return [line + "\n" for line in text.split("\n")[:-1]] + [text.split("\n")[-1]]


def editable_cells(nb) -> list[tuple[int, str]]:
    """[(cell index, target)] of a notebook's (a parsed .ipynb's) editable cells."""
    from fp8lab.course.notebook import editable_target

    return [(i, t) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
            and (t := editable_target("".join(c["source"]))) is not None]


def stale(root: Path = ROOT, write: bool = False) -> list[str]:
    """'path cell-id (target)' for every editable cell that differs from the generator's text; rewrites them when
    `write`."""
    from fp8lab.course.notebook import editable_source

    out = []
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        nb = json.loads(text)
        changed = False
        for i, target in editable_cells(nb):
            want = editable_source(target)
            cell = nb["cells"][i]
            if "".join(cell["source"]) != want:
                out.append(f"{path.relative_to(root).as_posix()} cell {cell.get('id', i)} ({target})")
                cell["source"] = _lines(want)
                changed = True
        if write and changed:
            path.write_text(_dump(nb, text), encoding="utf-8")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="exit 1 if an editable cell differs from the library")
    what.add_argument("--write", action="store_true", help="regenerate the editable cells that differ")
    what.add_argument("--show", metavar="TARGET", help="print the editable cell of a library kernel")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.root))
    if args.show:
        from fp8lab.course.notebook import editable_source

        print(editable_source(args.show))
        return 0
    found = stale(args.root, write=args.write)
    for line in found:
        print(("regenerated: " if args.write else "differs from the library: ") + line)
    if found and not args.write:
        print("run `python scripts/editable.py --write` to regenerate them from the library")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
