# The two commands of the README: `make run` (the embedded default, end to end) and `make test` (the suite).
# Both create .venv on first use: CPU torch 2.13.0 from the machine's local wheel, then the pinned lock, then deltamatch.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deltamatch-installed
PYTEST_ARGS ?=

.PHONY: run test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py envs/pip-cpu.lock.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "setuptools>=69" wheel
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r envs/pip-cpu.lock.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

run: $(STAMP)
	$(BIN)/dm-sweep --out results/default/sweep.csv

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results .snakemake
