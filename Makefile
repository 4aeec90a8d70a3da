# The two commands of the README: `make run` (the embedded default, end to end) and `make test` (the suite).
# Both create .venv on first use: CPU torch 2.13.0 from the machine's local wheel, then the pinned lock, then deltamatch.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deltamatch-installed
# Two xdist workers (the suite spends much of its time waiting on subprocesses, SLURM's one-minute granularity
# above all); tests sharing an expensive fixture or a file run on one worker (tests/xdist_groups.py). The 25 slowest
# tests are named at the end (the budget is 20 minutes on a 2-core machine).
PYTEST_ARGS ?= -n 2 --dist loadgroup --durations=25

.PHONY: run test test-cluster kernel-check setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py envs/pip-cpu.lock.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "setuptools>=69" wheel
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r envs/pip-cpu.lock.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# The rules call the dm-* console scripts through PATH.
run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --profile profiles/local

# As root (CI, a fresh machine) the suite also installs Debian's SLURM for the real-cluster tests (tests/cluster/)
# and Debian's Chromium for the report page rendered as a person sees it (tests/reports/test_page_in_browser.py).
test: $(STAMP)
	if [ "$$(id -u)" = 0 ]; then bash tests/cluster/slurm.sh install; bash tests/reports/chromium.sh install; fi
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-cluster: $(STAMP)
	bash tests/cluster/slurm.sh install
	$(BIN)/python -m pytest -q -m cluster tests/cluster

kernel-check: $(STAMP)
	$(BIN)/dm-kernel-check --out results/kernel/check.jsonl

clean:
	rm -rf $(VENV) results .snakemake
