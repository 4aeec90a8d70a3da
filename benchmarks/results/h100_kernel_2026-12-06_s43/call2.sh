#!/usr/bin/env bash
# Session 43, call 2: dQ inside the D = 64 dK/dV launch (ws3xfd at D = 64): tests, CUPTI and bench A/B by the switch.
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_new
timeout 200 python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "d64_dkdv_with_dq or d64_ordered_dq or d64_backward_with_dq" 2>&1 \
  | tail -30 | tee $OUT/tests_new.log
for r in 1 2; do
  for tag in old new any; do
    stamp "profile $tag $r"
    envs=()
    [[ $tag != old ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfd)
    [[ $tag == any ]] && envs+=(DELTAMATCH_KERNEL_DQ_ATOMIC=1)
    env "${envs[@]}" timeout 90 python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag ${tag}_$r \
      > $OUT/profile_${tag}_$r.log 2>&1 || tail -5 $OUT/profile_${tag}_$r.log
    grep -B2 -A8 "ms_per_step" $OUT/profile_${tag}_$r.log | head -12
  done
done
for r in 1 2; do
  for tag in old new; do
    stamp "bench $tag $r"
    envs=()
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DKDV64=ws3xfd)
    env "${envs[@]}" timeout 120 python3 kernels/bench.py --out $OUT/b64_${tag}_$r --head-dims 64 --seq-lens 8192 16384 \
      --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_${tag}_$r.log
  done
done
stamp tests_d64
timeout 150 python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "d64" 2>&1 | tail -4 | tee $OUT/tests_d64.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
