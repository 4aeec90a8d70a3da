#!/usr/bin/env bash
# Snakemake runs this inside the freshly created environment, from the workflow's working directory (the project
# root): install deltamatch there without touching the pinned dependencies above.
set -euo pipefail
# The lock's `# no-deps:` lines (Triton 3.7.1 over torch's own pin, the cuDNN frontend), then deltamatch.
sed -n 's/^# no-deps: //p' envs/pip-gpu.lock.txt | xargs python -m pip install --no-deps
python -m pip install --no-deps --no-build-isolation -e .
