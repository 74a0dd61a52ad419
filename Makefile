# The two set-up commands of README.md. Each creates .venv and installs what it needs
# (torch pinned to 2.13.0, the CPU build on this machine kind).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m lossscale demo $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_torch.py $(ARGS)

clean:
	rm -rf $(VENV)
