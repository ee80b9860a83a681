# moeplane: `make demo` runs the main job, `make test` runs the tests.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip

.PHONY: demo test test-fast services test-tools proto lint lint-imports wheel bench clean torch

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

$(VENV)/.torch: $(STAMP)
	$(PIP) install -q 'torch==2.13.0'
	@# frameworks moeplane.torch.attach is tested against (pins: pyproject.toml extras); torch is
	@# already satisfied, so pip keeps it
	$(PIP) install -q -e '.[hf,deepspeed,megatron]'  # transformers: HF adapters and expert parallelism
	@# torchtitan for tests/adapters/test_torchtitan.py: the titan extra's pins, --no-deps, in an
	@# overlay put on PYTHONPATH by that test only (its triton, ~0.9 GB, from the local index)
	rm -rf $(VENV)/titan
	$(PIP) install -q --no-deps --target $(VENV)/titan $$($(BIN)/python -c 'import tomllib; \
		print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["titan"])')
	@# transformers 4.x for tests/adapters/test_transformers4.py, an overlay put on PYTHONPATH
	rm -rf $(VENV)/transformers4
	$(PIP) install -q --no-deps --target $(VENV)/transformers4 'transformers==4.57.3' \
		'tokenizers==0.22.1' 'huggingface-hub==0.36.0'
	touch $(VENV)/.torch

torch: $(VENV)/.torch

# the demo's second job trains a real model on CPU: the pinned torch, as for the tests
demo: $(STAMP) $(VENV)/.torch
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

# the wheel, built from the tree as it is (the wheel test installs it into a fresh virtualenv)
wheel: $(STAMP)
	rm -rf build/wheel && $(PIP) wheel -q --no-deps -w build/wheel .

# import-linter runs on the package as the wheel lays it out (one moeplane/ tree)
lint-imports: wheel
	rm -rf build/lint && mkdir -p build/lint && $(BIN)/python -m zipfile -e build/wheel/moeplane-*.whl build/lint
	cd build/lint && PYTHONPATH=. $(abspath $(BIN))/lint-imports --config $(abspath pyproject.toml)

test: $(STAMP) $(VENV)/.torch services test-tools
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory lint-imports
	scripts/run-tests.sh $(BIN)/python

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser"

bench: $(STAMP) $(VENV)/.torch
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
