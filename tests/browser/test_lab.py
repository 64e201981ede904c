"""What a learner sees: `make lab` serving the course, driven by a real headless Chromium.

The server is started by `make lab` itself (so this tests the learner's command, default page included), in a
temporary copy of the repository (so running cells never touches the real files), with the Makefile's .venv
linked in. A browser opens the default page (lecture 00), runs all cells from the Run menu, saves, and the test
asks both the page and the saved .ipynb for errors; then a learner's finished copy of worksheet 2 in work/ runs
the same way and every check cell must print its "passed:" line.

Needs Chromium from the operating system (`apt-get install chromium` on Debian/Ubuntu; or FP8LAB_CHROMIUM=PATH)
and the Python driver `playwright` (in the `test` extra); skipped, saying which is missing, without them.
Playwright's own browser download (`playwright install`) is never used.

    .venv/bin/python -m pytest -m browser tests/browser -p no:cacheprovider      # or: make test (runs it too)

Screenshots of each notebook after its run go to pytest's temporary directory (the paths are in the failure
message, with the server log's tail).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LECTURE = "notebooks/00_start_here.ipynb"  # the Makefile's LAB_FIRST: the page `make lab` opens
WORKSHEET = "ws2"
WS_FILE = "ws2_fp8_encode_decode.ipynb"

INSTALL_TIMEOUT_S = 900  # `make .venv/.installed-lab` on a fresh clone (jupyterlab from PyPI)
SERVER_TIMEOUT_S = 180
KERNEL_TIMEOUT_S = 180  # page load + kernel start (imports numpy, numba)
RUN_TIMEOUT_S = 420  # one notebook's "Run All Cells" under the simulator (~5-40 s when the machine is not busy)
SAVE_TIMEOUT_S = 30

CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # No connections of its own: the network is closed here, and a test should not depend on one.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# A Python error as JupyterLab renders an error output: IPython's traceback header, or the "SomeError: ..." line
# alone (a SyntaxError has no traceback). JupyterLab shows error outputs with the stderr MIME type, as warnings.
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*(?:\w+\.)*\w*(?:Error|Exception)(?::|$)", re.M)
STDERR = "application/vnd.jupyter.stderr"


# ----------------------------------------------------------------------------------------------------------------
# What is needed, or a skip that says how to get it
# ----------------------------------------------------------------------------------------------------------------


def find_chromium() -> str | None:
    env = os.environ.get("FP8LAB_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if not path:
        pytest.skip("browser test: no Chromium found (looked for $FP8LAB_CHROMIUM, chromium, chromium-browser on "
                    "PATH); install the operating system's: `apt-get install chromium` (Debian/Ubuntu)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser test: the Python package `playwright` is missing; `make test` installs it (the `test` "
                    "extra), or: .venv/bin/pip install playwright (no `playwright install`: it uses the OS Chromium)")
    if not shutil.which("make"):
        pytest.skip("browser test: `make` is missing (it starts the lab the way learners do: `make lab`)")
    if not (ROOT / "Makefile").is_file() or not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("browser test: needs a checkout with the Makefile's .venv (run it through `make test`)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


# ----------------------------------------------------------------------------------------------------------------
# The server: `make lab` in a temporary copy of the repository
# ----------------------------------------------------------------------------------------------------------------


def copy_repository(dest: Path) -> None:
    """The files git knows (tracked, or new and not ignored) as they are in the working tree; .venv linked."""
    try:
        r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=False)
    except OSError:  # no git
        r = None
    if r is not None and r.returncode == 0:
        for name in r.stdout.decode().split("\0"):
            src = ROOT / name
            if name and src.is_file():  # skips files deleted in the working tree
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)  # keeps mtimes: make must see .installed-lab as up to date
    else:  # not a git checkout
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "work", "runs", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "*.egg-info"))
    (dest / ".venv").symlink_to(ROOT / ".venv")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


class Lab:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.tree = tmp / "repo"
        self.tree.mkdir()
        self.shots = tmp / "screenshots"
        self.shots.mkdir()
        self.log = tmp / "server.log"
        self.runtime_dir = tmp / "jupyter-runtime"
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict:
        e = dict(os.environ)
        # The kernel imports fp8lab from the copy, not from the editable install that points at the real checkout.
        e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tree), e.get("PYTHONPATH")]))
        # Nothing of the user's own Jupyter set-up (settings, saved layouts, config) changes what is tested.
        for var, sub in (("JUPYTER_RUNTIME_DIR", self.runtime_dir), ("JUPYTER_CONFIG_DIR", "jupyter-config"),
                         ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"), ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces")):
            e[var] = str(self.tmp / sub)
        return e

    def start(self) -> None:
        args = (f"--no-browser --ip=127.0.0.1 --port={self.port} --port-retries=0 "
                f"--IdentityProvider.token={self.token}")
        # -o: the lab extra was installed from the real checkout just before; make must not reinstall it from the
        # copy (that would point the shared editable install at a temporary directory).
        cmd = ["make", "-C", str(self.tree), "-o", ".venv/.installed-lab", "lab", f"JUPYTER_ARGS={args}"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"`make lab` exited with {self.proc.returncode} before serving:\n{tail(self.log)}")
            try:
                with self.api("GET", "/api/status", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"`make lab` did not answer on {self.base} within {SERVER_TIMEOUT_S} s:\n{tail(self.log)}")

    def api(self, method: str, path: str, timeout: float = 10):
        req = urllib.request.Request(self.base + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        return urllib.request.urlopen(req, timeout=timeout)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:  # kernels run in sessions of their own: shut them down through the server first
            with self.api("GET", "/api/kernels") as r:
                for k in json.load(r):
                    self.api("DELETE", f"/api/kernels/{k['id']}", timeout=20).close()
        except OSError:
            pass
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)  # make, jupyter-lab and anything else in their process group
                self.proc.wait(wait)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill_leftover_kernels()

    def kill_leftover_kernels(self) -> None:
        """Kernels whose command line names this server's runtime directory (ours alone), killed by pid."""
        mark = str(self.runtime_dir).encode()
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if mark in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def url(self, path: str) -> str:
        return f"{self.base}{path}{'&' if '?' in path else '?'}token={self.token}"

    def diagnostics(self, shots: list[Path] = ()) -> str:
        s = "".join(f"\nscreenshot: {p}" for p in shots)
        return f"{s}\nserver log ({self.log}), last lines:\n{tail(self.log)}"


@pytest.fixture(scope="module")
def lab(chromium, tmp_path_factory):
    # What `make lab` does first: install the lab extra (jupyterlab) into .venv (a no-op once its stamp is fresh).
    r = subprocess.run(["make", "-C", str(ROOT), ".venv/.installed-lab"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=INSTALL_TIMEOUT_S)
    assert r.returncode == 0, f"`make .venv/.installed-lab` failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    server = Lab(tmp_path_factory.mktemp("lab"))
    copy_repository(server.tree)
    try:
        server.start()
        yield server
    finally:
        server.stop()


# ----------------------------------------------------------------------------------------------------------------
# Driving the notebook on screen
# ----------------------------------------------------------------------------------------------------------------

# The notebook on screen (the current tab of the main area) and what JupyterLab shows of it.
STATE_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const tab = document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current');
  const ind = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    tab: tab ? tab.querySelector('.lm-TabBar-tabLabel').textContent : null,
    dirty: tab ? tab.classList.contains('jp-mod-dirty') : null,
    status: ind ? ind.getAttribute('data-status') : null,
    prompts: [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim()),
    outputs: [...panel.querySelectorAll('.jp-CodeCell')].map(cell =>
      [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => [o.getAttribute('data-mime-type') || '',
                                                                    o.textContent])),
    links: [...panel.querySelectorAll('.jp-RenderedMarkdown a[href]')].map(a => a.href),
  };
}"""

DONE = re.compile(r"\[\d+\]:")


def state(page) -> dict:
    return page.evaluate(STATE_JS) or {}


def open_notebook(page, lab: Lab, path: str | None) -> dict:
    """Load the lab (the default page when path is None) and wait until the notebook's kernel is idle."""
    page.goto(lab.url("/" if path is None else f"/lab/tree/{path}"), timeout=KERNEL_TIMEOUT_S * 1000)
    name = Path(path or LECTURE).name
    page.wait_for_function(
        """name => { const t = document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current');
                     const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
                     const i = p && p.querySelector('.jp-Notebook-ExecutionIndicator');
                     return t && t.textContent.includes(name) && i && i.getAttribute('data-status') === 'idle'; }""",
        arg=name, timeout=KERNEL_TIMEOUT_S * 1000, polling=500)
    return state(page)


def menu(page, top: str, command: str) -> None:
    """Click into the notebook (making it the lab's current widget, which menu commands act on), then choose
    `command` (a JupyterLab command id) from the menu bar's `top` menu."""
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first.click()
    page.locator("#jp-MainMenu").get_by_role("menuitem", name=top, exact=True).click()
    page.locator(f'.lm-Menu [data-command="{command}"]').click()


def run_all_cells(page) -> dict:
    """Run menu -> Run All Cells; return the state once the kernel is idle and no cell is queued or running."""
    started = False
    for _ in range(3):  # a click that lands before the notebook is the current widget does nothing: try again
        menu(page, "Run", "runmenu:run-all")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            s = state(page)
            if s.get("status") == "busy" or any(p == "[*]:" or DONE.fullmatch(p) for p in s.get("prompts", [])):
                started = True
                break
            time.sleep(0.2)
        if started:
            break
    assert started, "Run All Cells started nothing (no cell queued, kernel never busy)"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    settled = 0
    while time.monotonic() < deadline:
        s = state(page)
        if s.get("status") == "idle" and "[*]:" not in s.get("prompts", []):
            settled += 1
            if settled >= 3:  # idle for 1.5 s: not just between two cells
                return s
        else:
            settled = 0
        time.sleep(0.5)
    raise AssertionError(f"the notebook was still running after {RUN_TIMEOUT_S} s: {state(page).get('prompts')}")


def save(page, file: Path) -> None:
    """File menu -> Save, then wait until the file on disk is new and the tab is no longer marked dirty."""
    before = file.stat().st_mtime_ns
    for _ in range(3):  # as for Run All Cells: a menu command that did nothing is chosen again
        menu(page, "File", "docmanager:save")
        deadline = time.monotonic() + SAVE_TIMEOUT_S / 3
        while time.monotonic() < deadline:
            if file.stat().st_mtime_ns != before and not state(page).get("dirty"):
                return
            time.sleep(0.3)
    raise AssertionError(f"the notebook was not saved to {file} (File -> Save, three times)")


def screenshot(page, dest: Path) -> Path:
    """The whole notebook: a viewport as tall as the notebook's content (JupyterLab scrolls inside the page)."""
    height = page.evaluate("""() => { const p = document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');  // the notebook's scrolling box
        return p ? p.scrollHeight : 0; }""")
    size = page.viewport_size
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(height + 200, 16000))})
    try:
        page.evaluate("""() => { const p = document.querySelector(
            '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer'); if (p) p.scrollTop = 0; }""")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(dest))
    finally:
        page.set_viewport_size(size)
    return dest


def problems_of(s: dict, file: Path, lab: Lab, page) -> list[str]:
    """Everything wrong with a run: on screen (unrun cells, tracebacks, dead links) and in the saved .ipynb."""
    found = []
    nb = json.loads(file.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if len(s["prompts"]) != len(code):
        found.append(f"the page shows {len(s['prompts'])} code cells, the file has {len(code)}")
    for i, (prompt, outs) in enumerate(zip(s["prompts"], s["outputs"]), 1):
        if not DONE.fullmatch(prompt):
            found.append(f"code cell {i} on screen was not run (prompt {prompt!r})")
        for mime, text in outs:
            if mime == STDERR and TRACEBACK.search(text):
                found.append(f"code cell {i} on screen shows an error ({mime}):\n{text[-1500:]}")
    for i, c in enumerate(code, 1):
        if c.get("execution_count") is None:
            found.append(f"code cell {i} in the saved file has no execution count")
        for o in c.get("outputs", []):
            if o["output_type"] == "error":
                found.append(f"code cell {i} in the saved file has an error output: {o['ename']}: {o['evalue']}")
    # Links in the rendered markdown that the server serves (other notebooks, files): each must be there.
    for href in sorted(set(s["links"])):
        if href.startswith(lab.base) and "/files/" in href:
            r = page.request.get(href, fail_on_status_code=False)
            if r.status != 200:
                found.append(f"link {href} answers {r.status}")
    return found


def run_and_check(page, lab: Lab, path: str | None, file: Path) -> tuple[dict, list[str], list[Path]]:
    open_notebook(page, lab, path)
    s = run_all_cells(page)
    save(page, file)
    shot = screenshot(page, lab.shots / f"{file.stem}.png")
    return s, problems_of(s, file, lab, page), [shot]


@pytest.fixture
def page(chromium, lab):
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("response", lambda r: errors.append(f"HTTP {r.status} {r.url}")
            if r.status >= 400 and r.url.startswith(lab.base) else None)
    try:
        yield page
    finally:
        if errors:  # shown with the test's output: not failures by themselves
            print("browser:\n  " + "\n  ".join(errors))
        context.close()


# ----------------------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------------------


def test_lecture_00_runs_without_errors(lab, page):
    """The page `make lab` opens is lecture 00; Run All Cells finishes with every cell run and no error."""
    t0 = time.monotonic()
    s, found, shots = run_and_check(page, lab, None, lab.tree / LECTURE)
    assert page.url.split("?")[0].endswith(f"/lab/tree/{LECTURE}"), f"`make lab` opened {page.url}, not {LECTURE}"
    assert not found, "lecture 00 in the lab:\n" + "\n".join(found) + lab.diagnostics(shots)
    print(f"lecture 00: {len(s['prompts'])} code cells run in the lab in {time.monotonic() - t0:.0f} s")


def start_worksheet(lab: Lab) -> Path:
    """`fp8lab worksheets start ws2` in the copy (the learner's command): exercises/ws2_... -> work/ws2_...."""
    work = lab.tree / "work" / WS_FILE
    r = subprocess.run([str(lab.tree / ".venv" / "bin" / "fp8lab"), "worksheets", "start", WORKSHEET],
                       cwd=lab.tree, env=lab.env(), capture_output=True, text=True, timeout=120)
    if "invalid choice" in r.stderr:
        # TODO: drop this fallback once `fp8lab worksheets start` is in every checkout that runs this test.
        work.parent.mkdir(exist_ok=True)
        shutil.copyfile(lab.tree / "exercises" / WS_FILE, work)
    else:
        assert r.returncode == 0, f"`fp8lab worksheets start {WORKSHEET}` failed:\n{r.stdout}\n{r.stderr}"
    assert work.is_file(), f"`fp8lab worksheets start {WORKSHEET}` made no {work}:\n{r.stdout}\n{r.stderr}"
    return work


def finish_like_a_learner(work: Path, solution: Path) -> list[str]:
    """Put the solution's answers into the learner's copy (each placeholder cell, matched by cell id), as a learner
    who finished the worksheet would have; return the names of the checks the worksheet calls."""
    nb = json.loads(work.read_text(encoding="utf-8"))
    answers = {c.get("id"): c for c in json.loads(solution.read_text(encoding="utf-8"))["cells"]}
    filled = 0
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and "NotImplementedError" in src:
            answer = "".join(answers[cell.get("id")]["source"])
            cell["source"] = "\n".join(line for line in answer.splitlines()
                                       if not line.strip().startswith(("### BEGIN SOLUTION", "### END SOLUTION",
                                                                        "### HINT:")))
            filled += 1
    assert filled, f"{work} has no answer cell to fill (no `raise NotImplementedError` placeholder)"
    work.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    calls = re.findall(r"\bcheck\.([A-Za-z_]\w*)\s*\(",
                       "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"))
    assert calls, f"{work} calls no fp8lab.course.check function"
    return calls


def test_finished_worksheet_passes_its_checks(lab, page):
    """A learner's finished copy of worksheet 2 (work/, as `fp8lab worksheets start` makes it) runs in the lab
    without errors, and every check cell prints its "passed: <check>:" line."""
    t0 = time.monotonic()
    work = start_worksheet(lab)
    checks = finish_like_a_learner(work, lab.tree / "solutions" / WS_FILE)
    s, found, shots = run_and_check(page, lab, f"work/{WS_FILE}", work)
    on_screen = "\n".join(text for outs in s["outputs"] for _, text in outs)
    nb = json.loads(work.read_text(encoding="utf-8"))
    saved = "\n".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                      for o in c.get("outputs", []) if o["output_type"] == "stream")
    for name in checks:
        line = re.compile(rf"^passed: {re.escape(name)}:", re.M)
        if not line.search(on_screen):
            found.append(f"no 'passed: {name}:' line on screen")
        if not line.search(saved):
            found.append(f"no 'passed: {name}:' line in the saved file")
    assert not found, f"work/{WS_FILE} in the lab:\n" + "\n".join(found) + lab.diagnostics(shots)
    print(f"{WORKSHEET}: checks {', '.join(checks)} passed in the lab in {time.monotonic() - t0:.0f} s")
