#!/usr/bin/env bash
# Session 43, call 3: ws3xfd the default at D = 64: the CUDA and Triton GPU suites, the api tests, one bench round.
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_cuda
timeout 260 python3 -m pytest -q tests/kernels/test_cuda_gpu.py 2>&1 | tail -12 | tee $OUT/tests_cuda.log
stamp bench
timeout 60 python3 kernels/bench.py --out $OUT/b64 --head-dims 64 --seq-lens 8192 16384 --causal-only \
  --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64.log
stamp tests_triton
timeout 210 python3 -m pytest -q tests/kernels/test_triton_gpu.py tests/kernels/test_api.py 2>&1 | tail -8 | tee $OUT/tests_triton.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
