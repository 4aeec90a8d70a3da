#!/usr/bin/env bash
# Session 42, call 1: the D = 64 CUDA δ pass and forward (opt-in): tests, CUPTI by switch, bench A/B.
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_d64
python3 -m pytest -q -x tests/kernels/test_cuda_gpu.py -k d64 2>&1 | tail -25 | tee $OUT/tests_d64.log
stamp tests_d128
python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "wide_delta or wide_forward" 2>&1 | tail -8 | tee $OUT/tests_d128.log
for r in 1 2; do
  for tag in default fwd delta both; do
    stamp "profile $tag $r"
    envs=()
    [[ $tag == fwd || $tag == both ]] && envs+=(DELTAMATCH_KERNEL_CUDA_FWD=w4p)
    [[ $tag == delta || $tag == both ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DELTA=w4p)
    env "${envs[@]}" python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag ${tag}_$r \
      > $OUT/profile_${tag}_$r.log 2>&1 || tail -5 $OUT/profile_${tag}_$r.log
  done
done
python3 tools/device/variants_table.py $OUT/p 2>&1 | tee $OUT/variants.md
for r in 1 2; do
  for tag in default both; do
    stamp "bench $tag $r"
    envs=()
    [[ $tag == both ]] && envs+=(DELTAMATCH_KERNEL_CUDA_FWD=w4p DELTAMATCH_KERNEL_CUDA_DELTA=w4p)
    env "${envs[@]}" python3 kernels/bench.py --out $OUT/bench_${tag}_$r --head-dims 64 --seq-lens 8192 16384 \
      --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/bench_${tag}_$r.log
  done
done
stamp done
