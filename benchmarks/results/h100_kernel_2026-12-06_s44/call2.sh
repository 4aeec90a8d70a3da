#!/usr/bin/env bash
# Session 44, call 2 (not run: no machine; the next session's first call): ws3xfdt at D = 64 (46af993, opt-in
# DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt: dK and dV by tensor stores): its GPU tests, then CUPTI against the default
# ws3xfd (cuda_gpu.sh variants: interleaved rounds, the side-by-side table in $OUT/profiles.tgz) and the bench, two
# rounds each; then the kernel GPU suite (pytest -m gpu tests/kernels, 8 xdist workers) in the time left (LIMIT s,
# 0: none). Carries build/cuda.xz (the library packed) and .carry.
source tools/device/setup.sh
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_new
timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/kernels/test_cuda_gpu.py -k "d64_tma_epilogue" 2>&1 \
  | tail -25 | tee $OUT/tests_new.log
stamp profiles
VARIANTS="default;DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt" PROFILE_ARGS="--head-dim 64" ROUNDS=${ROUNDS:-2} DELTA_BENCH=0 \
  VARIANTS_BUDGET_S=300 bash tools/device/cuda_gpu.sh variants 2>&1 | tail -20
for r in $(seq 1 ${ROUNDS:-2}); do
  for setting in X=0 DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt; do
    stamp "bench $setting $r"
    env $setting timeout 120 python3 kernels/bench.py --out $OUT/b64_${r}_${setting%%=*} --head-dims 64 \
      --seq-lens 8192 16384 --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" \
      | tee $OUT/b64_${r}_${setting%%=*}.log
  done
done
stamp suite
[[ ${LIMIT:-300} -gt 0 ]] && DELTAMATCH_TEST_REPORT=$OUT/gpu_tests.jsonl timeout ${LIMIT:-300} python3 -m pytest -q \
  -rfE -p no:cacheprovider -n 8 --durations=10 -m gpu tests/kernels > $OUT/gpu_tests.log 2>&1
echo "pytest exit $?"; tail -30 $OUT/gpu_tests.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
