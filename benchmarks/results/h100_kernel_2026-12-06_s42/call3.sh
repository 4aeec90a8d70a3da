#!/usr/bin/env bash
# Session 42, call 3: the D = 64 defaults (forward w4p, δ pass w4pm over 128-key tiles): tests, bench A/B, profile.
source tools/device/setup.sh
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_cuda_d64
python3 -m pytest -q tests/kernels/test_cuda_gpu.py tests/kernels/test_cuda_build.py -k d64 2>&1 | tail -6 \
  | tee $OUT/tests_cuda_d64.log
stamp tests_triton
python3 -m pytest -q tests/kernels/test_triton_gpu.py 2>&1 | tail -8 | tee $OUT/tests_triton.log
for r in 1 2; do
  for tag in old new; do
    stamp "bench $tag $r"
    envs=()
    [[ $tag == old ]] && envs+=(DELTAMATCH_KERNEL_CUDA_FWD=0 DELTAMATCH_KERNEL_CUDA_DELTA=0)
    env "${envs[@]}" python3 kernels/bench.py --out $OUT/bench_${tag}_$r --head-dims 64 --seq-lens 8192 16384 \
      --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/bench_${tag}_$r.log
  done
done
stamp profile
python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag default > $OUT/profile_default.log 2>&1
grep -B2 -A14 "matched_factored" $OUT/profile_default.log | head -24
stamp done
tar czf /tmp/all.tgz -C $OUT . && mv /tmp/all.tgz $OUT/all.tgz
