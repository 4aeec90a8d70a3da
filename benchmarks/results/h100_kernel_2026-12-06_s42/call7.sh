#!/usr/bin/env bash
# Session 42, call 7: matched_factored at D = 64 with the CUDA dK/dV's D = 64 build by default.
source tools/device/setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_bits
python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "d64_backward" 2>&1 | tail -6 | tee $OUT/tests_bits.log
for tag in new old; do
  stamp "bench $tag"
  envs=()
  [[ $tag == old ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=0)
  env "${envs[@]}" python3 kernels/bench.py --out $OUT/b64_$tag --head-dims 64 --seq-lens 8192 16384 --causal-only \
    --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_$tag.log
done
stamp profile
python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag default > $OUT/profile.log 2>&1
grep -A8 "ms_per_step" $OUT/profile.log | head -10
stamp tests_rest
timeout 150 python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "d64_forward_against or d64_forms" 2>&1 | tail -4 \
  | tee $OUT/tests_rest.log
stamp done
