#!/usr/bin/env bash
# Session 43, call 1: the whole CUDA GPU suite (2cccc1e's host changes), the D = 64 dQ build alone, CUPTI and a
# bench A/B at D = 64 with and without DELTAMATCH_KERNEL_CUDA_DQ64=ws3.
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_dq64
timeout 120 python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "d64_dq or d64_backward" 2>&1 | tail -25 \
  | tee $OUT/tests_dq64.log
stamp dq_alone
timeout 90 python3 tools/device/cuda_dv_bench.py --head-dim 64 --dq-only --out $OUT/dq64.jsonl 2>&1 | tail -12 \
  | tee $OUT/dq64.log
for tag in old new; do
  stamp "profile $tag"
  envs=()
  [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DQ64=ws3)
  env "${envs[@]}" timeout 90 python3 tools/device/attn_profile.py --out $OUT/p --head-dim 64 --tag $tag \
    > $OUT/profile_$tag.log 2>&1 || tail -5 $OUT/profile_$tag.log
  grep -A12 "ms_per_step" $OUT/profile_$tag.log | head -14
done
python3 tools/device/variants_table.py $OUT/p 2>&1 | tee $OUT/variants.md
for tag in old new; do
  stamp "bench $tag"
  envs=()
  [[ $tag == new ]] && envs+=(DELTAMATCH_KERNEL_CUDA_DQ64=ws3)
  env "${envs[@]}" timeout 120 python3 kernels/bench.py --out $OUT/b64_$tag --head-dims 64 --seq-lens 8192 16384 \
    --causal-only --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_$tag.log
done
stamp tests_all
timeout 200 python3 -m pytest -q tests/kernels/test_cuda_gpu.py 2>&1 | tail -8 | tee $OUT/tests_all.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
