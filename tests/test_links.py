"""Every relative link in the README, the docs and every notebook's markdown resolves to a file of the
repository (what `make lab` serves: its root is the repository, so links may leave notebooks/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|href=\"([^\"]+)\"")


def tracked(pattern: str) -> list[Path]:
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", pattern], capture_output=True, text=True)
    files = r.stdout.split() if r.returncode == 0 else []
    return sorted(ROOT / f for f in files) or sorted(ROOT.glob(pattern))


def markdown_of(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text(encoding="utf-8")
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


DOCS = [p for p in tracked("*.md") + tracked("*.ipynb") if "docs/executed" not in p.as_posix()]


def relative_links(text: str) -> list[str]:
    text = re.sub(r"```.*?```|`[^`\n]*`", "", text, flags=re.S)  # code is not a link: kernel[grid, block](...)
    found = [a or b for a, b in LINK.findall(text)]
    return [t for t in found if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", t, re.I)]


def test_the_link_finder_finds_links():
    text = "see [a](../x/y.ipynb#sec), [b](https://e.org), <a href=\"z.md\">z</a>, [c](#top), `k[g, b](x)`"
    assert relative_links(text) == ["../x/y.ipynb#sec", "z.md"]
    assert len(DOCS) >= 10 and any(p.name == "README.md" for p in DOCS)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    broken = []
    for target in relative_links(markdown_of(path)):
        file = target.split("#")[0]
        if file and not (path.parent / file).resolve().exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to missing files: {broken}"
