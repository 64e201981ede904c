# Two commands do all set-up from a fresh clone (Python 3.10+):
#   make lab    create .venv, install fp8lab with the lab extras, open the course in JupyterLab
#   make test   create .venv, install fp8lab with the test extras, run the tests (simulator or GPU)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Tests that need no GPU run everywhere (on the simulator without one); `make test-gpu` runs the rest.
# Tiers (tests/conftest.py says more): `make test` (CI) is the whole suite, notebooks included, on fixed seeds;
# `make test-fuzz` the same on fresh seeds (a failure prints FP8LAB_TEST_SEED=<n>, which replays it); `make test-fast`
# (development) leaves out the notebooks and the tests marked `slow` (the browser test among them).
# `make test` spreads test files and notebooks over one process per CPU core, at most 4 (pytest-xdist; loadscope
# keeps a file's tests, and a notebook's cells, in one process; the heaviest files go first: tests/conftest.py):
# WORKERS=0 runs them in this process.
PYTEST_ARGS ?=
WORKERS ?= auto
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --maxprocesses 4 --dist loadscope --no-loadscope-reorder)

.PHONY: lab test test-fuzz test-fast test-gpu train bench clean site executed

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -e ".[$*]"
	touch $@

# Jupyter refuses to run as root unless told (containers often run as root).
JUPYTER_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# The server's root is the repository (lectures, worksheets and work/ all reachable); lecture 00 opens first.
LAB_FIRST ?= notebooks/00_start_here.ipynb
# .venv/bin first on PATH, so that `fp8lab ...` works in the lab's terminal.
LAB_CMD = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyter lab $(JUPYTER_ROOT) --ServerApp.root_dir="$(CURDIR)" \
	--LabApp.default_url=/lab/tree/$(LAB_FIRST) $(JUPYTER_ARGS)

lab: $(VENV)/.installed-lab
	$(LAB_CMD)

SUITE = -m "not gpu" --nbval-lax --nbval-current-env -p no:cacheprovider $(XDIST) tests notebooks $(PYTEST_ARGS)

test: $(VENV)/.installed-test
	$(PY) -m pytest $(SUITE)

test-fuzz: $(VENV)/.installed-test
	FP8LAB_TEST_SEED=fresh $(PY) -m pytest $(SUITE)

test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -m "not gpu and not slow" -p no:cacheprovider $(XDIST) tests $(PYTEST_ARGS)

test-gpu: $(VENV)/.installed-test
	FP8LAB_BACKEND=gpu $(PY) -m pytest -m gpu -p no:cacheprovider tests $(PYTEST_ARGS)

train: $(VENV)/.installed-lab
	$(VENV)/bin/fp8lab train --recipe fp8-tensor

bench: $(VENV)/.installed-lab
	$(VENV)/bin/fp8lab bench all

# The course as a website: site/index.html (the notebook map) and every lecture and worksheet rendered with
# the outputs of a GPU run, from the executed copies kept in docs/executed/.
site: $(VENV)/.installed-site
	$(PY) scripts/site.py build

# On a GPU machine: re-run every notebook and refresh docs/executed/ (then commit it); tests/test_site.py fails
# while a source notebook is newer than its executed copy. The lectures' measured figures go to RECORD too
# (fp8lab.course.recorded: what the lectures show under the simulator); RECORD= records nothing.
RECORD ?= fp8lab/data/h200_lectures.json
executed: $(VENV)/.installed-site $(VENV)/.installed-torch
	FP8LAB_BACKEND=gpu $(PY) scripts/site.py execute $(if $(RECORD),--record $(RECORD))

clean:
	rm -rf $(VENV) runs .pytest_cache site
