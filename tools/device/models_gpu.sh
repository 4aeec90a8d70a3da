#!/usr/bin/env bash
# One device call for the models and the trainer: their GPU tests, then the 569M 8K trainer benchmark (bf16 vs matched).
# Usage (repo root, on the H200): bash tools/device/models_gpu.sh [tests,bench]
# Needs the carried wheels (.carry, see tools/device/fetch_wheels.sh). Everything lands in $OUT: the pytest log (one line
# per test, with its outcome, so an interrupted run still names what finished) and the benchmark JSON.
set -uo pipefail
WHAT=${1:-tests,bench}
source tools/device/setup.sh
start=$(date +%s); stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
has() { [[ ",$WHAT," == *",$1,"* ]]; }
{ date -u +%FT%TZ; git rev-parse --short HEAD 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } \
  > "$OUT/provenance.txt"
if has tests; then
  # serial (-p no:xdist): xdist's quiet output hid which tests a time limit cut off; -rA prints every outcome
  timeout 300 python3 -m pytest -v -rA -p no:cacheprovider -p no:xdist --durations=15 --timeout 240 \
    tests/models/test_models_gpu.py tests/models/test_train_gpu.py tests/kernels/test_sdpa_gpu.py 2>&1 \
    | tee "$OUT/models_gpu_tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Timeout" | tail -40
  stamp tests done
fi
if has bench; then
  python3 benchmarks/train_bench.py h200 --steps 10 --timeout 120 --out "$OUT/train_569m_h200.json" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/train_bench.log" | tail -30
  stamp bench done
fi
