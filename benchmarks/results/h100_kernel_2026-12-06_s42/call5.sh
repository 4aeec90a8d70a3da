#!/usr/bin/env bash
# Session 42, call 5: the fused dK/dV's D = 64 build: its bit test against Triton's, then its time against Triton's.
source tools/device/setup.sh
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests
python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "d64_dkdv" 2>&1 | tail -25 | tee $OUT/tests_dkdv64.log
stamp bench
python3 tools/device/cuda_dv_bench.py --head-dim 64 --dkdv-only --out $OUT/dkdv64.jsonl 2>&1 | tail -12
stamp done
