"""Shared test setup: the tiers, the seeds, the GPU-only tests.

Tiers (Makefile targets; `make test` is what CI runs):
- `make test`: the whole suite (notebooks too) on fixed seeds: every run draws the same inputs, whatever the order
  of the tests or the xdist process a test lands in.
- `make test-fuzz`: the whole suite on fresh seeds (FP8LAB_TEST_SEED=fresh): new inputs every run, to find the rare
  draw that breaks a test. A failure's report ends with the line that replays it (FP8LAB_TEST_SEED=<n> ...).
- `make test-fast`: for development: neither the items marked `slow` (the heavy training runs, worksheet
  grading, the tensor-core simulations, the browser test) nor the notebooks; fixed seeds.
- `make test-gpu`: tests marked `gpu` (realistic sizes, need a CUDA device); every kernel test also runs unmarked
  on small shapes, so CI (simulator) exercises every kernel.

Seeds. FP8LAB_TEST_SEED is the run's seed: unset means 0 (fixed), an int replays a run, "fresh" draws one (printed
in the header, the summary and every failure). Each test's inputs come from (run seed, a hash of the test's node
id): the `rng` fixture (`module_rng` for module-scoped fixtures), every np.random.default_rng() called without a
seed while the test runs (a worksheet check's or a bench harness's fresh inputs: tests/_seeding.py) and
hypothesis's examples. Notebooks (nbval) and the worksheets that `worksheets.grade` runs draw in IPython kernels:
a startup file seeds their unseeded draws from (run seed, notebook). Learners keep their fresh draws: nothing
outside the test suite is seeded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import hypothesis
import numpy as np
import pytest

import fp8lab  # noqa: F401  (selects the backend before anything imports numba.cuda)
from fp8lab.device import runtime

import _seeding

SEED_ENV = "FP8LAB_TEST_SEED"
_RAW = os.environ.get(SEED_ENV, "").strip().lower()
FRESH = _RAW == "fresh"
if FRESH:
    # one seed for the run; xdist's workers, started after this, inherit it through the environment
    os.environ[SEED_ENV] = str(int.from_bytes(os.urandom(4), "little"))
try:
    RUN_SEED = int(os.environ.get(SEED_ENV) or 0)
except ValueError:
    raise ValueError(f"{SEED_ENV} must be an int >= 0 or 'fresh', got {os.environ[SEED_ENV]!r}") from None
if RUN_SEED < 0:
    raise ValueError(f"{SEED_ENV} must be an int >= 0 or 'fresh', got {RUN_SEED}")

# hypothesis: examples from the seed alone (no database of past failures); no deadline: on a loaded CI machine a
# 200 ms deadline fails on the machine's load, not on the code
hypothesis.settings.register_profile("fp8lab", database=None, deadline=None, print_blob=True)
hypothesis.settings.load_profile("fp8lab")


def entropy(name: str) -> list[int]:
    """The seed of `name` (a node id) in this run."""
    return [RUN_SEED, zlib.crc32(name.encode())]


def _replay(item) -> str:
    if isinstance(item, pytest.Function):
        return f"{SEED_ENV}={RUN_SEED} python -m pytest '{item.nodeid}'"
    # a notebook's cell: the whole notebook (the cell's kernel state comes from the cells before it), with this file
    # (which seeds the notebook's kernel) named too: a run of notebooks/ alone would not read it
    return (f"{SEED_ENV}={RUN_SEED} python -m pytest --nbval-lax --nbval-current-env tests/conftest.py "
            f"'{item.parent.nodeid}'")


@contextlib.contextmanager
def _draws(name: str):
    """Unseeded draws (in this process, and in kernels started meanwhile) from `name`'s seed, then as before."""
    before, env = np.random.default_rng, os.environ.get(_seeding.DRAWS_ENV)
    os.environ[_seeding.DRAWS_ENV] = _seeding.install(entropy(name) + [1]).env()
    try:
        yield
    finally:
        np.random.default_rng = before
        if env is None:
            os.environ.pop(_seeding.DRAWS_ENV, None)
        else:
            os.environ[_seeding.DRAWS_ENV] = env


_STARTUP = """# written by tests/conftest.py: this kernel's unseeded draws are seeded (the test suite runs it)
import importlib.util as _u
_s = _u.spec_from_file_location("_fp8lab_test_seeding", {path!r})
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_m.install_from_env()
del _u, _s, _m
"""


def pytest_configure(config):
    # IPython kernels started by this run (nbval, worksheets.grade) read a profile with the seeding startup file
    startup = Path(os.environ.get("IPYTHONDIR", "")) / "profile_default" / "startup" / "00-fp8lab-test-seeds.py"
    if not (os.environ.get("IPYTHONDIR") and startup.is_file()):
        ipython_dir = tempfile.mkdtemp(prefix="fp8lab-ipython-")
        startup = Path(ipython_dir) / "profile_default" / "startup" / "00-fp8lab-test-seeds.py"
        startup.parent.mkdir(parents=True)
        startup.write_text(_STARTUP.format(path=str(Path(_seeding.__file__).resolve())))
        config._fp8lab_ipython_dir = ipython_dir
        os.environ["IPYTHONDIR"] = ipython_dir
    config._fp8lab_draws = _draws("session")
    config._fp8lab_draws.__enter__()


def pytest_unconfigure(config):
    draws = getattr(config, "_fp8lab_draws", None)
    if draws is not None:
        draws.__exit__(None, None, None)
    ipython_dir = getattr(config, "_fp8lab_ipython_dir", None)
    if ipython_dir:
        shutil.rmtree(ipython_dir, ignore_errors=True)


def pytest_report_header(config):
    how = "fresh" if FRESH else "fixed" if SEED_ENV not in os.environ else "given"
    return f"fp8lab seeds: {how}, {SEED_ENV}={RUN_SEED} replays them"


def pytest_terminal_summary(terminalreporter):
    if FRESH:
        terminalreporter.write_line(f"fresh seeds: {SEED_ENV}={RUN_SEED} replays this run (or one test of it)")


def pytest_collection_modifyitems(config, items):
    if runtime.IS_SIM:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (backend is the simulator); run `make test-gpu` on one")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if hasattr(config, "workerinput"):  # an xdist worker: what it collects is the order the tests are handed out
        _heaviest_first(items)


def _heaviest_first(items):
    """Order the files (xdist's loadscope units) heaviest first: those with `slow` items (most first), then the
    notebooks, then the rest by number of items; a file's own order is kept. With --no-loadscope-reorder (the
    Makefile's) xdist hands them out in this order, so that no heavy file starts last and runs alone at the end
    (xdist's own order, by number of items, puts the heavy files with few items last)."""
    scopes: dict[str, list] = {}
    for item in items:
        scopes.setdefault(item.nodeid.rsplit("::", 1)[0], []).append(item)

    def weight(scope):
        slow = sum(1 for item in scopes[scope] if item.get_closest_marker("slow"))
        return (0 if slow else 1 if scope.endswith(".ipynb") else 2, -slow, -len(scopes[scope]))

    items[:] = [item for scope in sorted(scopes, key=weight) for item in scopes[scope]]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # a notebook's cell (nbval). notebooks/ lies outside this file's folder, so its cells reach only the hooks that
    # every item goes through, like this one. The cells share one kernel, started with the first: the kernel's
    # draws come from the notebook's seed.
    if not isinstance(item, pytest.Function) and item.parent is not None:
        os.environ[_seeding.DRAWS_ENV] = ",".join(map(str, entropy(item.parent.nodeid) + [1]))
        item.add_report_section("call", "seed", f"inputs drawn with {SEED_ENV}={RUN_SEED}; replay: {_replay(item)}")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        report.sections.append(("seed", f"inputs drawn with {SEED_ENV}={RUN_SEED}; replay: {_replay(item)}"))


@pytest.fixture(scope="module", autouse=True)
def _module_draws(request):
    with _draws(request.node.nodeid):
        yield


@pytest.fixture(autouse=True)
def _test_draws(request):
    fn = getattr(request.function, "__func__", request.function)
    if getattr(fn, "is_hypothesis_test", False):
        hypothesis.seed(RUN_SEED << 32 | zlib.crc32(request.node.nodeid.encode()))(fn)
    with _draws(request.node.nodeid):
        yield


@pytest.fixture
def rng(request):
    """This test's random inputs: the same every run unless FP8LAB_TEST_SEED says otherwise (see above)."""
    request.node.user_properties.append(("seed", RUN_SEED))
    return _seeding.Draws.real(entropy(request.node.nodeid))


@pytest.fixture(scope="module")
def module_rng(request):
    """`rng` for module-scoped fixtures: seeded by the module's node id."""
    return _seeding.Draws.real(entropy(request.node.nodeid))
