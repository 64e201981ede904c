#!/usr/bin/env python3
"""The course as a website: run every notebook, keep the executed copies, render them to static HTML.

    scripts/site.py execute [--backend gpu|sim] [--only NAME ...] [--out DIR] [--record JSON]
        Run each source notebook (notebooks/*.ipynb, solutions/*.ipynb) headless with nbclient, in its own
        folder, and write the executed copy to DIR/notebooks/ and DIR/solutions/ (default docs/executed),
        stamped with metadata.fp8lab_executed = {source_sha256, backend, device, date, ...}. Stops at the first
        failing cell (exit 1, naming notebook and cell). --record JSON: the lectures' measured figures are
        written there too (fp8lab.course.recorded). On a GPU machine: `make executed`, i.e. FP8LAB_BACKEND=gpu
        scripts/site.py execute --record fp8lab/data/h200_lectures.json; then commit both.
    scripts/site.py build [--out site] [--allow-missing]
        nbconvert (template "lab") every executed copy into site/notebooks/*.html and site/solutions/*.html,
        plus site/index.html: the notebook map, i.e. README.md's tables of lectures and worksheets, linking the
        rendered pages. Links between notebooks are rewritten to the rendered pages (a link to a worksheet in
        exercises/ goes to its rendered solution). Exit 1 when a notebook has no executed copy, unless
        --allow-missing (the index then says which ones are missing). Needs nbconvert (`make site`).
    scripts/site.py check
        Exit 1 listing every source notebook whose executed copy is missing, or older than the source (its
        code cells differ from the source's: outputs depend on the code only, and `build` takes the prose from
        the source, so a markdown edit needs no new run). tests/test_site.py runs the same check.
        A notebook listed in docs/executed/PENDING.md (written by a session without a GPU: "- `path`: why")
        may lack a current copy; the index marks it as not rendered. The check fails when a listed notebook
        does not exist or already has a current copy, so the list cannot outlive the run it waits for.

Every subcommand takes --root DIR (the repository; default: the one this script is in), for tests on copies.
Standard library plus nbformat and nbclient (fp8lab's own dependencies); nbconvert only for `build`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import html
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("notebooks", "solutions")  # lectures; worksheets (the single source, answers included)
EXECUTED = Path("docs") / "executed"
META = "fp8lab_executed"
REFRESH = "on a GPU machine run `make executed` (FP8LAB_BACKEND=gpu scripts/site.py execute), then commit docs/executed"
CELL_TIMEOUT_S = 1800  # per cell; a lecture's longest cell takes seconds on a GPU
TEXT_LIMIT = 100_000  # characters of one text output kept in an executed copy
SIZE_WARN = 2_000_000  # bytes: an executed copy larger than this is reported
PENDING = EXECUTED / "PENDING.md"
WIDGET_MIMES = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json")


class SiteError(Exception):
    """A failure with a message for the user (printed without a traceback, exit 1)."""


# ---------------------------------------------------------------------------------------------- sources


def sources(root: Path) -> list[str]:
    """Source notebooks, as paths relative to root ("notebooks/00_start_here.ipynb", ...), in order."""
    return [f"{d}/{p.name}" for d in SOURCE_DIRS for p in sorted((root / d).glob("*.ipynb"))]


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_digest(nb) -> str:
    """sha256 of a notebook's code cells, in order: what its outputs depend on (prose is taken from the source)."""
    code = [c.get("source", "") for c in nb["cells"] if c.get("cell_type") == "code"]
    code = ["".join(c) if isinstance(c, list) else c for c in code]
    return hashlib.sha256(json.dumps(code).encode("utf-8")).hexdigest()


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def with_outputs(source, executed):
    """The source notebook (its prose as it is now) with the outputs of the executed copy's code cells."""
    ran = [c for c in executed.cells if c.cell_type == "code"]
    mine = [c for c in source.cells if c.cell_type == "code"]
    if [c.source for c in ran] != [c.source for c in mine]:
        raise SiteError("the code cells differ from the executed copy's")
    for c, r in zip(mine, ran):
        c.outputs, c.execution_count = r.outputs, r.execution_count
    source.metadata[META] = executed.metadata.get(META, {})
    return source


def stamp(nb) -> dict | None:
    return nb.metadata.get(META)


def read_stamp(path: Path) -> dict | None:
    """metadata.fp8lab_executed of an executed copy (None when absent or unreadable)."""
    return _stamp_of(_read_json(path))


def _stamp_of(nb_json: dict | None) -> dict | None:
    return (nb_json or {}).get("metadata", {}).get(META)


def status(root: Path, executed: Path) -> list[tuple[str, str | None]]:
    """(source, problem) for every source notebook; problem is None when its executed copy is current."""
    rows = []
    for rel in sources(root):
        copy = executed / rel
        if not copy.exists():
            rows.append((rel, f"no executed copy ({_show(copy, root)} is missing)"))
            continue
        ran, src = _read_json(copy), _read_json(root / rel)
        st = _stamp_of(ran)
        if not st or ran is None:
            rows.append((rel, f"{_show(copy, root)} has no metadata.{META} (not written by `execute`)"))
        elif src is None or code_digest(ran) != code_digest(src):
            rows.append((rel, f"its code changed since its executed copy was made ({st.get('date', '?')}, "
                              f"{st.get('backend', '?')}): {_show(copy, root)} is out of date"))
        else:  # prose edits need no new run: `build` takes the prose from the source
            rows.append((rel, None))
    return rows


def pending(root: Path) -> dict[str, str]:
    """{source: why} of the notebooks docs/executed/PENDING.md lists as awaiting a run on a GPU."""
    path = root / PENDING
    if not path.exists():
        return {}
    found = re.findall(r"^- `?([\w./-]+\.ipynb)`?:?\s*(.*)$", path.read_text(encoding="utf-8"), re.M)
    return {rel: why.strip() for rel, why in found}


def _show(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def select(names: list[str] | None, all_sources: list[str]) -> list[str]:
    """The sources that --only names: a stem ("00_start_here"), a file name, or a path relative to root."""
    if not names:
        return list(all_sources)
    chosen = []
    for name in names:
        n = name[:-6] if name.endswith(".ipynb") else name
        hits = [s for s in all_sources if n in (s[:-6], posixpath.basename(s)[:-6])]
        if not hits:
            stems = ", ".join(posixpath.basename(s)[:-6] for s in all_sources)
            raise SiteError(f"--only {name}: no such notebook (choose from: {stems})")
        chosen += [h for h in hits if h not in chosen]
    return [s for s in all_sources if s in chosen]


# ---------------------------------------------------------------------------------------------- execute

_PROBE = """
import json, fp8lab
d = fp8lab.info()
print(json.dumps({"backend": d["backend"], "device": d["device_name"], "fp8lab": d["fp8lab"]}))
"""


def probe(cwd: Path, env: dict) -> dict:
    """What a fresh kernel in this environment gets from `import fp8lab`: backend, device, version."""
    r = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
        raise SiteError(f"fp8lab cannot start in this environment (`import fp8lab; fp8lab.info()` from {cwd}):\n{tail}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def strip_outputs(nb) -> list[str]:
    """Drop widget state and views (keeping their text fallback) and cut very long text outputs.
    Returns what was changed, for the report."""
    notes = []
    if nb.metadata.pop("widgets", None) is not None:
        notes.append("widget state dropped")
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                for mime in WIDGET_MIMES:
                    if data.pop(mime, None) is not None:
                        notes.append(f"cell {i}: widget view dropped")
                if not data:
                    continue
                if isinstance(data.get("text/plain"), str) and len(data["text/plain"]) > TEXT_LIMIT:
                    data["text/plain"] = _cut(data["text/plain"])
                    notes.append(f"cell {i}: long text/plain output cut")
            if out.get("output_type") == "stream" and len(out.get("text", "")) > TEXT_LIMIT:
                out["text"] = _cut(out["text"])
                notes.append(f"cell {i}: long {out.get('name', 'stream')} output cut")
            kept.append(out)
        cell.outputs = kept
    return notes


def _cut(text: str) -> str:
    return text[:TEXT_LIMIT] + f"\n... [{len(text) - TEXT_LIMIT} more characters cut by scripts/site.py]\n"


def first_error(nb) -> tuple[int, object, dict] | None:
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return i, cell, out
    return None


def execute_one(root: Path, rel: str, out_dir: Path, meta: dict, timeout: int) -> tuple[float, int, list[str]]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    src = root / rel
    nb = nbformat.read(src, as_version=4)
    digest = sha256(src)  # of the bytes that were run
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False, record_timing=False,
                            store_widget_state=False, extra_arguments=["--IPKernelApp.log_level=ERROR"],
                            resources={"metadata": {"path": str(src.parent.resolve())}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as e:
        found = first_error(nb)
        if found is None:
            raise SiteError(f"{rel}: a cell failed: {str(e).strip()[-1500:]}") from None
        i, cell, out = found
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        tb = "\n".join(_ANSI.sub("", ln) for ln in out.get("traceback", [])[-8:])
        raise SiteError(f"{rel}: cell {i} (id {cell.get('id', '?')}, `{first[:80]}`) failed: "
                        f"{out.get('ename')}: {out.get('evalue')}\n{tb}") from None
    except (CellTimeoutError, TimeoutError) as e:
        raise SiteError(f"{rel}: a cell ran past {timeout} s (--timeout): {str(e).strip()[:300]}") from None
    except DeadKernelError as e:
        raise SiteError(f"{rel}: the kernel died: {str(e).strip()[:300]}") from None
    secs = time.perf_counter() - t0
    notes = strip_outputs(nb)
    nb.metadata[META] = {"source_sha256": digest, **meta, "seconds": round(secs, 1)}
    dest = out_dir / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, dest)
    return secs, dest.stat().st_size, notes


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def cmd_execute(args) -> int:
    root = args.root
    todo = select(args.only, sources(root))
    if not todo:
        raise SiteError(f"no notebooks in {root}/{{{','.join(SOURCE_DIRS)}}}")
    # The kernels inherit this process's environment.
    if args.backend:
        os.environ["FP8LAB_BACKEND"] = args.backend
    # Plots must come back as outputs: ipykernel picks the inline backend only when MPLBACKEND is unset
    # (device scripts set MPLBACKEND=Agg for headless runs).
    os.environ.pop("MPLBACKEND", None)
    if args.record:
        os.environ["FP8LAB_RECORD"] = str(Path(args.record).resolve())  # fp8lab.course.recorded.RECORD_ENV
    info = probe(root / todo[0].split("/")[0], dict(os.environ))
    if args.backend and info["backend"] != args.backend:
        raise SiteError(f"--backend {args.backend}, but `import fp8lab` chose {info['backend']}")
    out_dir = Path(args.out)
    meta = {"backend": info["backend"], "device": info["device"], "fp8lab": info["fp8lab"],
            "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat()}
    print(f"executing {len(todo)} notebook(s) on {info['backend']} ({info['device']}) into {out_dir}", flush=True)
    total = time.perf_counter()
    for rel in todo:
        print(f"  {rel} ...", end=" ", flush=True)
        try:
            secs, size, notes = execute_one(root, rel, out_dir, meta, args.timeout)
        except SiteError:
            print("FAILED", flush=True)
            raise
        big = f"  LARGER THAN {SIZE_WARN // 1_000_000} MB: look at its outputs" if size > SIZE_WARN else ""
        print(f"{secs:.1f} s, {size / 1e3:.0f} kB{big}" + (f" ({'; '.join(notes)})" if notes else ""), flush=True)
    print(f"done in {time.perf_counter() - total:.0f} s", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ links

_MD_LINK = re.compile(r"(\]\(\s*<?)([^)\s>]+)(>?(?:\s+\"[^\"]*\")?\s*\))")
_REF_DEF = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(>?(?:\s.*)?)$", re.M)
_HTML_REF = re.compile(r"""((?:href|src)\s*=\s*["'])([^"']+)(["'])""", re.I)


def page_of(rel_target: str) -> str:
    """The site page of a notebook path relative to root: exercises/ws2.ipynb -> solutions/ws2.html."""
    if rel_target.startswith("exercises/"):
        rel_target = "solutions/" + rel_target[len("exercises/"):]
    return rel_target[:-6] + ".html"


def rewrite_links(text: str, page: str, known: set[str] | None = None, dead: list | None = None) -> str:
    """Point every relative link to a .ipynb in `text` (markdown of the page `page`, e.g.
    "notebooks/01_x.html") at the rendered page. Targets not in `known` are collected in `dead`."""
    here = posixpath.dirname(page)

    def fix(target: str) -> str:
        if "://" in target or target.startswith(("#", "mailto:", "/")):
            return target
        path, sep, frag = target.partition("#")
        if not path.endswith(".ipynb"):
            return target
        resolved = posixpath.normpath(posixpath.join(here, path))
        new = page_of(resolved)
        if known is not None and dead is not None and new not in known:
            dead.append(f"{page}: {target}")
        return posixpath.relpath(new, here or ".") + sep + frag

    text = _MD_LINK.sub(lambda m: m.group(1) + fix(m.group(2)) + m.group(3), text)
    text = _REF_DEF.sub(lambda m: m.group(1) + fix(m.group(2)) + m.group(3), text)
    return _HTML_REF.sub(lambda m: m.group(1) + fix(m.group(2)) + m.group(3), text)


_HREF_IPYNB = re.compile(r"""href\s*=\s*["']([^"']*\.ipynb(?:#[^"']*)?)["']""", re.I)


def ipynb_links(html_text: str) -> list[str]:
    """hrefs in a built page that still point at a .ipynb file."""
    return [h for h in _HREF_IPYNB.findall(html_text) if "://" not in h]


# ------------------------------------------------------------------------------------------------ index


def readme_tables(readme: str) -> list[tuple[str, list[str]]]:
    """(section heading, table lines) of every table in README.md that links a notebook: the notebook map."""
    found, heading, block = [], "", []
    for line in readme.splitlines() + [""]:
        if line.lstrip().startswith("|"):
            block.append(line.strip())
            continue
        if block and any(".ipynb)" in ln for ln in block):
            found.append((heading, block))
        block = []
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            heading = m.group(1).strip()
    return found


def _split_row(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def index_markdown(readme: str, pages: dict[str, dict | None]) -> tuple[str, set[str]]:
    """Markdown of the index: README's notebook tables, links pointing at the rendered pages, one column
    added that says where each page's outputs come from. pages: site page -> its executed stamp (None when
    there is no executed copy). Returns the markdown and the pages it links."""
    linked, parts = set(), []
    link = re.compile(r"\[([^\]]+)\]\(([^)\s]+\.ipynb)\)")
    for heading, lines in readme_tables(readme):
        header, rows = lines[0], lines[2:]
        out = [header.rstrip("|").rstrip() + " | outputs from |",
               lines[1].rstrip("|").rstrip() + "|---|"]
        for row in rows:
            cells = _split_row(row)
            ran = []

            def sub(m):
                page = page_of(posixpath.normpath(m.group(2)))
                linked.add(page)
                st = pages.get(page, "unknown")
                if st == "unknown":
                    ran.append("not in the site")
                    return m.group(1)
                if st is None:
                    ran.append("**not rendered: no executed copy**")
                    return m.group(1)
                ran.append(_ran_on(st))
                return f"[{m.group(1)}]({page})"

            cells = [link.sub(sub, c) for c in cells]
            out.append("| " + " | ".join(cells + ["; ".join(ran)]) + " |")
        parts.append((heading, "\n".join(out)))
    md = []
    for heading, table in parts:
        md += [f"## {heading}", "", table, ""]
    others = [p for p in pages if p not in linked]
    if others:
        md += ["## Other notebooks", "", "Not in README.md's tables yet:", ""]
        for p in others:
            st = pages[p]
            name = posixpath.basename(p)[:-5]
            md.append(f"- [{name}]({p}) ({_ran_on(st)})" if st else f"- {name} (**not rendered: no executed copy**)")
            linked.add(p)
        md.append("")
    return "\n".join(md), linked


def _ran_on(st: dict) -> str:
    return f"{st.get('device', '?')}, {st.get('date', '?')}"


_INDEX = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fp8lab: the course</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; line-height: 1.5; color: #1b1b1b; }}
table {{ border-collapse: collapse; margin: 1rem 0; }}
th, td {{ border: 1px solid #ccc; padding: .4rem .6rem; vertical-align: top; text-align: left; }}
th {{ background: #f3f3f3; }}
code {{ background: #f3f3f3; padding: 0 .2rem; border-radius: 3px; }}
.note {{ color: #555; }}
</style>
</head>
<body>
<h1>fp8lab: the course</h1>
<p>FP8 mixed-precision training the way DeepSeek-V3 trained on H800 GPUs, from a few lines of PyTorch down through
CUDA kernels written in Python (Numba-CUDA) to PTX. Every lecture and worksheet below is rendered with the
outputs of a run on {ran}.</p>
<p class="note">Worksheet pages show the solutions, executed; the worksheets to fill in are the same notebooks
without the answers, in <code>exercises/</code>. To run any of this yourself: <code>make lab</code> in a clone of
the repository (README.md).</p>
{body}
<p class="note">Built by <code>scripts/site.py build</code> from the executed copies in <code>docs/executed/</code>
on {built}.</p>
</body>
</html>
"""


# ------------------------------------------------------------------------------------------------ build


def cmd_build(args) -> int:
    try:
        import nbformat
        from nbconvert import HTMLExporter
        from nbconvert.filters.markdown import markdown2html
    except ImportError as e:
        raise SiteError(f"`build` needs nbconvert ({e}): `make site` installs it "
                        "(or: pip install -e '.[site]')") from None
    root, executed, out = args.root, Path(args.executed or args.root / EXECUTED), Path(args.out)
    rows = status(root, executed)
    waiting = {rel for rel, problem in rows if problem and rel in pending(root)}  # rendered as missing
    missing = [rel for rel, _ in rows if not (executed / rel).exists() or rel in waiting]
    if set(missing) - waiting and not args.allow_missing:
        raise SiteError("no executed copy of:\n" + "\n".join(f"  {m}" for m in missing)
                        + f"\n{REFRESH}; or build without them: scripts/site.py build --allow-missing")
    for rel, problem in rows:
        if problem and rel not in missing:
            print(f"warning: {rel}: {problem}", file=sys.stderr)

    pages = {page_of(rel): (None if rel in missing else read_stamp(executed / rel) or {}) for rel, _ in rows}
    known = {p for p, st in pages.items() if st is not None}
    out.mkdir(parents=True, exist_ok=True)
    for d in SOURCE_DIRS:  # pages of notebooks that no longer exist must not linger
        for old in (out / d).glob("*.html") if (out / d).is_dir() else []:
            old.unlink()
    exporter = HTMLExporter(template_name="lab")
    dead, written = [], []
    for rel, _ in rows:
        page = page_of(rel)
        if pages[page] is None:
            continue
        nb = nbformat.read(executed / rel, as_version=4)
        if (root / rel).exists():
            try:
                nb = with_outputs(nbformat.read(root / rel, as_version=4), nb)
            except SiteError:
                pass  # code changed (warned above): the executed copy as it is
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = rewrite_links(cell.source, page, known, dead)
        st = pages[page]
        up = posixpath.relpath("index.html", posixpath.dirname(page))
        nav = nbformat.v4.new_markdown_cell(f"[← fp8lab: the course]({up}) · `{rel}` · outputs from a run on "
                                            f"{_ran_on(st)}")
        nav.metadata["tags"] = ["fp8lab-site-nav"]
        nb.cells.insert(0, nav)
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": f"{Path(rel).stem} · fp8lab"}})
        dest = out / page
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(body, encoding="utf-8")
        written.append(dest)
        print(f"  {page}  ({len(body) / 1e3:.0f} kB)", flush=True)

    for d in SOURCE_DIRS:  # static figures the markdown embeds (notebooks/figures/*.svg: scripts/diagrams.py)
        if (root / d / "figures").is_dir():
            shutil.copytree(root / d / "figures", out / d / "figures", dirs_exist_ok=True)

    md, linked = index_markdown((root / "README.md").read_text(encoding="utf-8"), pages)
    devices = sorted({st.get("device", "?") for st in pages.values() if st})
    ran = html.escape(" and ".join(devices) if devices else "no machine yet (no executed copies)")
    built = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    body = re.sub(r'<a class="anchor-link"[^>]*>.*?</a>', "", markdown2html(md))
    index = _INDEX.format(ran=ran, built=built, body=body)
    (out / "index.html").write_text(index, encoding="utf-8")
    written.append(out / "index.html")

    problems = [f"{p.relative_to(out)} links to {h}" for p in written for h in ipynb_links(p.read_text("utf-8"))]
    problems += [f"{p} is in the site but not on the index" for p in known - linked]
    for d in dict.fromkeys(dead):
        print(f"warning: link to a page that is not in the site: {d}", file=sys.stderr)
    if problems:
        raise SiteError("the built site is inconsistent:\n" + "\n".join(f"  {p}" for p in problems))
    print(f"{out / 'index.html'}: {len(known)} page(s)"
          + (f"; {len(missing)} without an executed copy (marked on the index)" if missing else ""))
    return 0


# ------------------------------------------------------------------------------------------------ check


def cmd_check(args) -> int:
    root = args.root
    executed = Path(args.executed or root / EXECUTED)
    rows = status(root, executed)
    srcs = {rel for rel, _ in rows}
    waits = pending(root)
    bad = [(rel, p) for rel, p in rows if p and rel not in waits]
    for rel, why in waits.items():
        if rel not in srcs:
            bad.append((rel, f"listed in {PENDING} but there is no such notebook"))
        elif dict(rows)[rel] is None:
            bad.append((rel, f"its executed copy is current: remove it from {PENDING}"))
        else:
            print(f"{rel}: pending a run on a GPU ({why or 'no reason given'}): {dict(rows)[rel]}")
    for copy in sorted(executed.glob("*/*.ipynb")) if executed.is_dir() else []:
        rel = copy.relative_to(executed).as_posix()
        if rel not in srcs:
            print(f"note: {_show(copy, root)} has no source notebook (left over? delete it)")
    for rel, problem in bad:
        print(f"{rel}: {problem}")
    if bad:
        print(f"{len(bad)} of {len(rows)} executed copies missing or out of date: {REFRESH}")
        return 1
    print(f"all {len(rows) - len(waits)} executed copies are current"
          + (f"; {len(waits)} notebook(s) pending a run on a GPU ({PENDING})" if waits else ""))
    return 0


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=ROOT, help="the repository (default: %(default)s)")
    ap = argparse.ArgumentParser(prog="scripts/site.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("execute", parents=[common], help="run the notebooks, write executed copies")
    e.add_argument("--backend", choices=("gpu", "sim"),
                   help="sets FP8LAB_BACKEND for the kernels (default: as the environment has it, else probe)")
    e.add_argument("--only", nargs="+", metavar="NAME",
                   help="only these notebooks (e.g. 00_start_here ws2_fp8_encode_decode)")
    e.add_argument("--out", type=Path, help="where the executed copies go (default: ROOT/docs/executed)")
    e.add_argument("--record", type=Path, metavar="JSON",
                   help="also write the lectures' measured figures to this file (fp8lab.course.recorded; GPU only)")
    e.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell (default %(default)s)")
    b = sub.add_parser("build", parents=[common], help="render the executed copies to HTML, with an index")
    b.add_argument("--out", type=Path, default=None, help="the site's folder (default: ROOT/site)")
    b.add_argument("--executed", type=Path, help="the executed copies (default: ROOT/docs/executed)")
    b.add_argument("--allow-missing", action="store_true", help="build even when some executed copies are missing")
    c = sub.add_parser("check", parents=[common], help="exit 1 if an executed copy is missing or out of date")
    c.add_argument("--executed", type=Path, help="the executed copies (default: ROOT/docs/executed)")
    args = ap.parse_args(argv)
    args.root = args.root.resolve()
    if args.cmd == "execute" and args.out is None:
        args.out = args.root / EXECUTED
    if args.cmd == "build" and args.out is None:
        args.out = args.root / "site"
    try:
        return {"execute": cmd_execute, "build": cmd_build, "check": cmd_check}[args.cmd](args)
    except SiteError as err:
        print(f"{ap.prog} {args.cmd}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
