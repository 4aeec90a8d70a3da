#!/usr/bin/env bash
# One device call for the models and the trainer: their GPU tests, then the 569M 8K trainer benchmark (bf16 vs matched).
# Usage (repo root, on the H200): bash tools/device/models_gpu.sh [tests,bench]
set -uo pipefail
WHAT=${1:-tests,bench}
source tools/device/setup.sh
start=$(date +%s); stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
has() { [[ ",$WHAT," == *",$1,"* ]]; }
if has tests; then
  timeout 230 python3 -m pytest -q -s -p no:cacheprovider -rfE --durations=12 -n 4 --timeout 200 \
    tests/models/test_models_gpu.py tests/models/test_train_gpu.py tests/kernels/test_sdpa_gpu.py 2>&1 \
    | tee "$OUT/models_gpu_tests.log" | tail -30
  stamp tests done
fi
if has bench; then
  timeout 210 python3 benchmarks/train_bench.py h200 --out "$OUT/train_569m_h200.json" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/train_bench.log" | tail -30
  stamp bench done
fi
