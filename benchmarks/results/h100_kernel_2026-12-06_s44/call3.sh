#!/usr/bin/env bash
# Session 44, call 3 (back to back with call 2, carrying .fa4b): ws3xfdt at D = 64 (DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt:
# dK and dV by tensor stores) against the default ws3xfd, CUPTI and bench, two rounds each; then the GPU suite's other
# half (tests/models tests/evals) in what time is left.
source tools/device/setup.sh
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
for r in 1 2; do
  for tag in old new; do
    stamp "profile $tag $r"
    envs=(X=0)
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt)
    env "${envs[@]}" timeout 90 python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag ${tag}_$r \
      > $OUT/profile_${tag}_$r.log 2>&1 || tail -5 $OUT/profile_${tag}_$r.log
    grep -B2 -A6 "ms_per_step" $OUT/profile_${tag}_$r.log | head -9
  done
done
for r in 1 2; do
  for tag in old new; do
    stamp "bench $tag $r"
    envs=(X=0)
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfdt)
    env "${envs[@]}" timeout 120 python3 kernels/bench.py --out $OUT/b64_${tag}_$r --head-dims 64 --seq-lens 8192 16384 \
      --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_${tag}_$r.log
  done
done
stamp "suite's other half"
LIMIT=${LIMIT:-240} TESTS="tests/models tests/evals" bash benchmarks/results/h100_kernel_2026-12-06_s44/call2.sh
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
