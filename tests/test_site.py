"""The course as a website (scripts/site.py): executed copies of every notebook are kept in docs/executed/
and must be current; `build` renders them with an index (README's notebook map); `check` finds stale ones.

The first two tests read the committed executed copies: they fail while a source notebook is newer than its
executed copy, until someone refreshes them on a GPU machine with `make executed`. The others run the
script on temporary copies (the lecture 00 run is on the simulator, a few seconds) and never touch the sources.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "site.py"

_spec = importlib.util.spec_from_file_location("fp8lab_site_script", SCRIPT)  # not `site`: the stdlib has one
site = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site)

EXECUTED = ROOT / site.EXECUTED
SOURCES = site.sources(ROOT)
HREF = re.compile(r"""href\s*=\s*["']([^"']*)["']""", re.I)


def run(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def hrefs(page: Path) -> list[str]:
    return HREF.findall(page.read_text(encoding="utf-8"))


def test_sources_are_the_lectures_and_worksheets():
    assert "notebooks/00_start_here.ipynb" in SOURCES
    assert any(s.startswith("solutions/ws2") for s in SOURCES)
    assert len(SOURCES) == sum(len(list((ROOT / d).glob("*.ipynb"))) for d in ("notebooks", "solutions"))


# -------------------------------------------------------------------- the committed executed copies (a), (b)


def test_executed_copies_are_current():
    """Fails when a source notebook changed after its executed copy was made (or has none)."""
    r = run("check")
    assert r.returncode == 0, (
        "executed copies in docs/executed/ are missing or older than their notebooks; refresh them on a GPU "
        "machine with `make executed` (FP8LAB_BACKEND=gpu scripts/site.py execute) and commit docs/executed:\n"
        + r.stdout + r.stderr
    )


def test_executed_copies_ran_cleanly_on_a_gpu():
    copies = [(rel, EXECUTED / rel) for rel in SOURCES if (EXECUTED / rel).exists()]
    if not copies:
        pytest.skip("no executed copies yet (test_executed_copies_are_current says how to make them)")
    problems = []
    for rel, path in copies:
        nb = nbformat.read(path, as_version=4)
        st = nb.metadata.get(site.META) or {}
        missing = {"source_sha256", "backend", "device", "date"} - set(st)
        if missing:
            problems.append(f"{rel}: metadata.{site.META} lacks {sorted(missing)}")
        if st.get("backend") != "gpu":
            problems.append(f"{rel}: executed on backend {st.get('backend')!r} ({st.get('device')}), not on a GPU")
        for i, cell in enumerate(nb.cells):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    problems.append(f"{rel}: cell {i} has an error output: {out.get('ename')}: {out.get('evalue')}")
        if not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"):
            problems.append(f"{rel}: no outputs at all")
        size = path.stat().st_size
        if size > site.SIZE_WARN:
            problems.append(f"{rel}: {size / 1e6:.1f} MB, more than {site.SIZE_WARN / 1e6:.0f} MB")
    assert not problems, "\n".join(problems)


def test_build_the_committed_site(tmp_path):
    pytest.importorskip("nbconvert")
    waiting = site.pending(ROOT)  # rendered as "not rendered" on the index
    if not all((EXECUTED / rel).exists() for rel in SOURCES if rel not in waiting):
        pytest.skip("some executed copies are missing (test_executed_copies_are_current says which)")
    out = tmp_path / "site"
    r = run("build", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    linked = set(hrefs(out / "index.html"))
    assert {site.page_of(rel) for rel in SOURCES if rel not in waiting} <= linked
    for page in out.rglob("*.html"):
        assert not [h for h in hrefs(page) if h.split("#")[0].endswith(".ipynb")], page
    # lecture 02 links its worksheets (exercises/...ipynb in the source) to their rendered solutions
    lecture = out / "notebooks" / "02_from_pytorch_to_kernels.html"
    if lecture.exists() and "exercises/ws2" in (ROOT / "notebooks" / "02_from_pytorch_to_kernels.ipynb").read_text():
        assert "../solutions/ws2_fp8_encode_decode.html" in hrefs(lecture)


# ------------------------------------------------------------------------ the pipeline on a small run (c)


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory):
    """`execute --backend sim --only 00_start_here` into a temporary folder (MPLBACKEND=Agg is set on
    purpose: device scripts set it, and the plots must still come back as outputs)."""
    out = tmp_path_factory.mktemp("executed")
    env = {**os.environ, "MPLBACKEND": "Agg"}
    r = run("execute", "--backend", "sim", "--only", "00_start_here", "--out", out, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r


def test_execute_writes_a_stamped_copy(sim_run):
    out, r = sim_run
    copy = out / "notebooks" / "00_start_here.ipynb"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ipynb")) == ["notebooks/00_start_here.ipynb"]
    nb = nbformat.read(copy, as_version=4)
    st = nb.metadata[site.META]
    assert st["source_sha256"] == site.sha256(ROOT / "notebooks" / "00_start_here.ipynb")
    assert st["backend"] == "sim" and "simulator" in st["device"].lower()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", st["date"])
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot came back (MPLBACKEND?)"
    assert "notebooks/00_start_here.ipynb" in r.stdout and " kB" in r.stdout  # the per-notebook report
    assert copy.stat().st_size < site.SIZE_WARN


def test_build_from_a_partial_run(sim_run, tmp_path):
    pytest.importorskip("nbconvert")
    executed, _ = sim_run
    # on a copy of the sources with no docs/executed/PENDING.md: the repository's list of notebooks waiting for a
    # GPU run (a session without one) would excuse the copies missing here
    root = tmp_path / "repo"
    for d in site.SOURCE_DIRS:
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copy(ROOT / "README.md", root / "README.md")
    out = tmp_path / "site"
    r = run("build", "--root", root, "--executed", executed, "--out", out)
    assert r.returncode == 1 and "no executed copy of" in r.stderr
    assert "notebooks/03_fp8_formats.ipynb" in r.stderr and "--allow-missing" in r.stderr

    r = run("build", "--root", root, "--executed", executed, "--out", out, "--allow-missing")
    assert r.returncode == 0, r.stdout + r.stderr
    index = (out / "index.html").read_text(encoding="utf-8")
    assert "notebooks/00_start_here.html" in hrefs(out / "index.html")
    assert index.count("no executed copy") == len(SOURCES) - 1  # each missing page is named as such
    assert "ws3_tile_quantize_kernel" in index and "what you learn" in index  # both README tables
    page = out / "notebooks" / "00_start_here.html"
    text = page.read_text(encoding="utf-8")
    assert re.search(r"<img[^>]*src=\"data:image/png;base64,", text), "the plot is not on the page"
    assert "../index.html" in hrefs(page)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html")) == [
        "index.html", "notebooks/00_start_here.html"]
    for p in out.rglob("*.html"):
        assert not [h for h in hrefs(p) if h.split("#")[0].endswith(".ipynb")], p


def test_execute_stops_at_the_first_failing_cell(tmp_path):
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('fine')"), nbformat.v4.new_code_cell("x = 1\n1 / 0"),
                nbformat.v4.new_code_cell("print('never')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "notebooks" / "broken.ipynb")
    out = tmp_path / "executed"
    r = run("execute", "--root", tmp_path, "--backend", "sim", "--out", out)
    assert r.returncode == 1
    assert "notebooks/broken.ipynb: cell 1" in r.stderr and "ZeroDivisionError" in r.stderr, r.stderr
    assert not list(out.rglob("*.ipynb*"))  # nothing half-written
    r = run("execute", "--root", tmp_path, "--only", "nope")
    assert r.returncode == 1 and "--only nope: no such notebook" in r.stderr


# ---------------------------------------------------------------------------------- check on a copy (d)


def test_check_detects_a_changed_or_missing_copy(tmp_path):
    for d in site.SOURCE_DIRS:
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    executed = tmp_path / "docs" / "executed"
    for rel in SOURCES:  # stand-ins for executed copies: the sources, stamped
        nb = nbformat.read(tmp_path / rel, as_version=4)
        nb.metadata[site.META] = {"source_sha256": site.sha256(tmp_path / rel), "backend": "gpu",
                                  "device": "test", "date": "2000-01-01"}
        (executed / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, executed / rel)
    r = run("check", "--root", tmp_path)
    assert r.returncode == 0 and f"all {len(SOURCES)} executed copies are current" in r.stdout, r.stdout

    prose = "notebooks/00_start_here.ipynb"  # a markdown edit needs no new run: the site takes prose from the source
    nb = nbformat.read(tmp_path / prose, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("A sentence written after the GPU run."))
    nbformat.write(nb, tmp_path / prose)
    changed, gone = "notebooks/03_fp8_formats.ipynb", "solutions/ws1_rmsnorm_kernel.ipynb"
    nb = nbformat.read(tmp_path / changed, as_version=4)
    next(c for c in nb.cells if c.cell_type == "code").source += "\nx_new = 1  # an edit after the GPU run"
    nbformat.write(nb, tmp_path / changed)
    (executed / gone).unlink()
    r = run("check", "--root", tmp_path)
    assert r.returncode == 1
    bad = [ln.split(":")[0] for ln in r.stdout.splitlines() if ln.endswith((".ipynb is missing)", "is out of date"))]
    assert bad == [changed, gone], r.stdout
    assert "make executed" in r.stdout

    # a session without a GPU lists what waits for a run; the list may not name a current or unknown notebook
    pending = tmp_path / site.PENDING
    pending.write_text(f"# waiting for a GPU\n\n- `{changed}`: new code, no GPU in this session\n- `{gone}`:\n")
    r = run("check", "--root", tmp_path)
    assert r.returncode == 0 and f"{changed}: pending a run on a GPU (new code, no GPU in this session)" in r.stdout
    assert f"{len(SOURCES) - 2} executed copies are current; 2 notebook(s) pending" in r.stdout, r.stdout
    for extra, says in ((prose, "its executed copy is current: remove it from"),
                        ("notebooks/99_nope.ipynb", "but there is no such notebook")):
        pending.write_text(f"- `{changed}`: x\n- `{gone}`: y\n- `{extra}`: z\n")
        r = run("check", "--root", tmp_path)
        assert r.returncode == 1 and says in r.stdout, r.stdout


# --------------------------------------------------------------------------------------- pure functions


def test_build_takes_prose_from_the_source_and_outputs_from_the_run():
    ran = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("old words"), nbformat.v4.new_code_cell("1 + 1")])
    ran.cells[1].outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "2"}, execution_count=1)]
    ran.cells[1].execution_count = 1
    src = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("new words"), nbformat.v4.new_code_cell("1 + 1"),
                                          nbformat.v4.new_markdown_cell("a new paragraph")])
    assert site.code_digest(src) == site.code_digest(ran)
    merged = site.with_outputs(src, ran)
    assert [c.source for c in merged.cells] == ["new words", "1 + 1", "a new paragraph"]
    assert merged.cells[1].outputs[0]["data"]["text/plain"] == "2" and merged.cells[1].execution_count == 1
    src.cells[1].source = "1 + 2"
    assert site.code_digest(src) != site.code_digest(ran)
    with pytest.raises(site.SiteError, match="code cells differ"):
        site.with_outputs(src, ran)


def test_links_to_notebooks_become_links_to_pages():
    text = ("[ws2](../exercises/ws2_fp8_encode_decode.ipynb), [next](04_scaling_and_quantization.ipynb#delayed), "
            "[nb](https://example.org/x.ipynb), [top](#top), `kernel[grid, block](x)`, "
            '<a href="../notebooks/03_fp8_formats.ipynb">02</a>, [back](../notebooks/01_x.ipynb "title")')
    out = site.rewrite_links(text, "notebooks/02_from_pytorch_to_kernels.html")
    assert "(../solutions/ws2_fp8_encode_decode.html)" in out
    assert "(04_scaling_and_quantization.html#delayed)" in out
    assert "(https://example.org/x.ipynb)" in out and "(#top)" in out and "kernel[grid, block](x)" in out
    assert 'href="03_fp8_formats.html"' in out and '(01_x.html "title")' in out
    dead = []
    site.rewrite_links("[w](../notebooks/zz.ipynb)", "solutions/ws2.html", {"notebooks/aa.html"}, dead)
    assert dead == ["solutions/ws2.html: ../notebooks/zz.ipynb"]


def test_the_index_is_readmes_notebook_map():
    readme = "\n".join([
        "# x", "## The notebooks", "", "| notebook | what |", "|---|---|",
        "| [00_a](notebooks/00_a.ipynb) | A |", "| [01_b](notebooks/01_b.ipynb) | B |", "",
        "## Other table", "| not | notebooks |", "|---|---|", "| 1 | 2 |", "",
        "## Worksheets", "| worksheet | you write |", "|---|---|", "| [ws2](exercises/ws2.ipynb) | W |",
    ])
    assert [h for h, _ in site.readme_tables(readme)] == ["The notebooks", "Worksheets"]
    stamp = {"device": "NVIDIA H200", "date": "2026-01-01", "backend": "gpu"}
    pages = {"notebooks/00_a.html": stamp, "notebooks/01_b.html": None, "solutions/ws2.html": stamp,
             "notebooks/02_c.html": stamp}
    md, linked = site.index_markdown(readme, pages)
    assert "[00_a](notebooks/00_a.html)" in md and "[ws2](solutions/ws2.html)" in md
    assert "| 01_b | B | **not rendered: no executed copy** |" in md
    assert "NVIDIA H200, 2026-01-01" in md and "[02_c](notebooks/02_c.html)" in md  # not in README: still listed
    assert ".ipynb" not in md and linked == set(pages)
    # the real README has both tables, and they name every source notebook
    tables = site.readme_tables((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(tables) == 2
    named = {site.page_of(m) for _, t in tables for m in re.findall(r"\]\(([^)]+\.ipynb)\)", "\n".join(t))}
    assert named == {site.page_of(rel) for rel in SOURCES}
