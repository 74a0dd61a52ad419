# The two set-up commands of README.md, and what CI runs (.ci/run).
#   make demo   its own venv (.venv-demo) with lossscale[demo] only, then `python -m lossscale demo`
#   make test   .venv with lossscale[dev], then the whole suite: one pytest run, then tests/keras once per backend
# Both pin torch with constraints.txt (the extras state ranges). CI adds `make lint` and `make test-core` (numpy
# and pytest only, in .venv-core), and the release checks:
#   make docs        no internal words on the user pages (.ci/docs_words.py: issue numbers, commit hashes,
#                    results folders, private modules), then the site from docs/ into site/ (mkdocs build --strict, in .venv-docs with the docs extra only:
#                    the API pages come from griffe's static analysis of src/, no framework imported); then the API
#                    reference's coverage of every public name (.ci/api_coverage.py)
#   make docs-check  the built site in headless Chromium (Debian's chromium; apt-get installs it when missing)
#   make wheel-check sdist + wheel, twine check, the wheel in a numpy-only venv (.ci/wheel_check.sh)
#   make wheel       the wheel alone into dist/ (pip wheel), to install where there is no checkout (README)
#   make typecheck   mypy over src/ with every framework (.venv), zero errors (config: pyproject.toml)
# and the version matrix (.ci/test_matrix.py; CI runs its quick half, `make test-matrix ARGS=--ci`):
#   make test-matrix each binding's tests against the oldest and newest release of each stated range, one venv
#                    per cell under .venv-matrix/; `make test-matrix ARGS="--cells jax-floor,py313"` runs some
PYTHON ?= python3
VENV ?= .venv
DEMO_VENV ?= .venv-demo
CORE_VENV ?= .venv-core
DOCS_VENV ?= .venv-docs
CHROMIUM ?= /usr/bin/chromium
PY := $(VENV)/bin/python
PIP_FLAGS := -q -c constraints.txt
KERAS_BACKENDS := tensorflow jax torch
# Keras fixes its backend once per process, so tests/keras and the Keras binding's doctests run apart.
KERAS_PATHS := $(wildcard tests/keras src/lossscale/keras)
MAIN_IGNORES := --ignore=tests/keras --ignore=src/lossscale/keras

.PHONY: demo test test-matrix test-main test-keras test-keras-distributed test-fast test-core lint ci bench clean docs docs-check wheel wheel-check typecheck

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -e '.[dev]'
	touch $@

$(DEMO_VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install $(PIP_FLAGS) -e '.[demo]'
	touch $@

$(DOCS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q --upgrade pip
	$(DOCS_VENV)/bin/python -m pip install -q -e '.[docs,check]'
	touch $@

$(CORE_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install -q -e . pytest
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/python -m lossscale demo $(ARGS)

# The README's test command: everything, slow tests included. `make test ARGS=tests/core` runs a part.
test: test-main
ifeq ($(ARGS),)
test: test-keras
endif

test-main: $(VENV)/.installed
	$(PY) -m pytest -q $(MAIN_IGNORES) $(ARGS)

# One pytest process per Keras backend; no tests/keras yet, or none collected (exit 5), is not a failure.
test-keras: $(VENV)/.installed
ifneq ($(KERAS_PATHS),)
	@set -e; for backend in $(KERAS_BACKENDS); do \
	    echo "KERAS_BACKEND=$$backend pytest $(KERAS_PATHS)"; \
	    rc=0; KERAS_BACKEND=$$backend $(PY) -m pytest -q $(KERAS_PATHS) || rc=$$?; \
	    if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; \
	done
endif

# The Keras distributed scenarios alone (tf.distribute on the TF pass, keras.distribution on the JAX pass);
# `make test-keras` runs them too, as part of tests/keras.
test-keras-distributed: $(VENV)/.installed
	@set -e; for backend in tensorflow jax; do \
	    echo "KERAS_BACKEND=$$backend pytest tests/keras/distributed"; \
	    KERAS_BACKEND=$$backend $(PY) -m pytest -q tests/keras/distributed $(ARGS); \
	done

# Without the slow tests, for a quick loop while developing (CI runs them all).
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" $(MAIN_IGNORES) $(ARGS)

# The core with numpy and pytest only: its tests and doctests; the bindings' are not collected.
test-core: $(CORE_VENV)/.installed
	$(CORE_VENV)/bin/python -m pytest -q $(ARGS)

# The version matrix (docs/development.md): `python3 .ci/test_matrix.py --list` names the cells.
test-matrix:
	$(PYTHON) .ci/test_matrix.py $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

docs: $(DOCS_VENV)/.installed
	$(DOCS_VENV)/bin/python .ci/docs_words.py
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict
	$(DOCS_VENV)/bin/python .ci/api_coverage.py site

docs-check: docs
	@[ -x $(CHROMIUM) ] || (apt-get update -q && apt-get install -y -q chromium)
	CHROMIUM=$(CHROMIUM) $(DOCS_VENV)/bin/python .ci/docs_browser_check.py site

# The wheel (and nothing else) into dist/, to install lossscale where there is no checkout: pip's own build, in
# an isolated environment; no venv of this project is needed.
wheel:
	rm -rf dist
	$(PYTHON) -m pip wheel --no-deps --wheel-dir dist .

wheel-check: $(DOCS_VENV)/.installed
	TOOLS_PY=$(DOCS_VENV)/bin/python PYTHON=$(PYTHON) bash .ci/wheel_check.sh

typecheck: $(VENV)/.installed
	$(PY) -m mypy

ci: lint test-core test docs docs-check wheel-check typecheck

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_torch.py $(ARGS)

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(CORE_VENV) $(DOCS_VENV) .venv-wheel .venv-matrix site site-screenshots dist
