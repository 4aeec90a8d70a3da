#!/usr/bin/env bash
# Snakemake runs this inside the freshly created environment, from the workflow's working directory (the project
# root): install deltamatch there without touching the pinned dependencies above.
set -euo pipefail
python -m pip install --no-deps --no-build-isolation -e .
