#!/usr/bin/env bash
# Session 44, call 1: the Triton GPU and api tests whole; the CUDA quantisation passes at D = 64: bit tests, CUPTI and
# bench A/B by DELTAMATCH_KERNEL_CUDA_QUANT=1 DELTAMATCH_KERNEL_CUDA_QPRIME=1, two rounds each.
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_quant
timeout 150 python3 -m pytest -q -rfE tests/kernels/test_cuda_gpu.py -k "quantisation or q_prime" 2>&1 | tail -30 \
  | tee $OUT/tests_quant.log
for r in 1 2; do
  for tag in old new; do
    stamp "profile $tag $r"
    envs=(X=0)
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_QUANT=1 DELTAMATCH_KERNEL_CUDA_QPRIME=1)
    env "${envs[@]}" timeout 90 python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag ${tag}_$r \
      > $OUT/profile_${tag}_$r.log 2>&1 || tail -5 $OUT/profile_${tag}_$r.log
    grep -B2 -A12 "ms_per_step" $OUT/profile_${tag}_$r.log | head -16
  done
done
for r in 1 2; do
  for tag in old new; do
    stamp "bench $tag $r"
    envs=(X=0)
    [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_QUANT=1 DELTAMATCH_KERNEL_CUDA_QPRIME=1)
    env "${envs[@]}" timeout 120 python3 kernels/bench.py --out $OUT/b64_${tag}_$r --head-dims 64 --seq-lens 8192 16384 \
      --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_${tag}_$r.log
  done
done
stamp tests_triton
timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 tests/kernels/test_triton_gpu.py tests/kernels/test_api.py \
  2>&1 | tail -12 | tee $OUT/tests_triton.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
