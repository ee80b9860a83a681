# moeplane: `make demo` runs the main job, `make test` runs the tests.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip

.PHONY: demo test test-fast services test-tools proto lint bench clean torch

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

$(VENV)/.torch: $(STAMP)
	$(PIP) install -q 'torch==2.13.0'
	touch $(VENV)/.torch

torch: $(VENV)/.torch

demo: $(STAMP)
	@# the planner's compiled kernel: about 8 s the first time on a machine, then cached
	$(BIN)/python -c 'from moeplane.controlplane.balancing.repair import warm_up; warm_up()'
	$(BIN)/moeplane demo

proto: $(STAMP)
	$(BIN)/python -m moeplane.controlplane.wire.generate

services:
	@scripts/start-services.sh

test-tools:
	@scripts/install-test-tools.sh

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(VENV)/.torch services test-tools
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser"

bench: $(STAMP) $(VENV)/.torch
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
