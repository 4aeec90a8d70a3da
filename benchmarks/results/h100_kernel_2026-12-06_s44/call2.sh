#!/usr/bin/env bash
# Session 44, call 2: ws3xfdt at D = 64 (46af993, opt-in DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt: dK and dV by tensor
# stores): its GPU tests, then CUPTI and bench against the default ws3xfd, two rounds each; then the kernel GPU suite
# (pytest -m gpu tests/kernels, 8 xdist workers) in the time left. Carries build/cuda.xz (the library packed) and .carry.
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_new
timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_cuda_gpu.py -k "d64_tma_epilogue" 2>&1 \
  | tail -25 | tee $OUT/tests_new.log
for r in $(seq 1 ${ROUNDS:-2}); do
  for tag in old new; do
    stamp "profile $tag $r"
    envs=(X=0)
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt)
    env "${envs[@]}" timeout 90 python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag ${tag}_$r \
      > $OUT/profile_${tag}_$r.log 2>&1 || tail -5 $OUT/profile_${tag}_$r.log
    grep -B2 -A6 "ms_per_step" $OUT/profile_${tag}_$r.log | head -9
  done
done
for r in $(seq 1 ${ROUNDS:-2}); do
  for tag in old new; do
    stamp "bench $tag $r"
    envs=(X=0)
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt)
    env "${envs[@]}" timeout 120 python3 kernels/bench.py --out $OUT/b64_${tag}_$r --head-dims 64 --seq-lens 8192 16384 \
      --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_${tag}_$r.log
  done
done
stamp suite
[[ ${LIMIT:-300} -gt 0 ]] && DELTAMATCH_TEST_REPORT=$OUT/gpu_tests.jsonl timeout ${LIMIT:-300} python3 -m pytest -q -rfE -p no:cacheprovider -n 8 \
  --durations=10 -m gpu tests/kernels > $OUT/gpu_tests.log 2>&1
echo "pytest exit $?"; tail -30 $OUT/gpu_tests.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
