#!/usr/bin/env bash
# Session 42, call 4: the quick bench at D = 128 at this commit; D = 64 non-causal, the old forms against the new.
source tools/device/setup.sh
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp quick128
python3 -m deltamatch.kernels.bench --out $OUT/quick128 --head-dims 128 --seq-lens 4096 8192 16384 --causal-only \
  2>&1 | grep -v "shapes:" | tee $OUT/quick128.log
for tag in old new; do
  stamp "bench64 $tag"
  envs=()
  [[ $tag == old ]] && envs+=(DELTAMATCH_KERNEL_CUDA_FWD=0 DELTAMATCH_KERNEL_CUDA_DELTA=0)
  env "${envs[@]}" python3 kernels/bench.py --out $OUT/b64_$tag --head-dims 64 --seq-lens 8192 \
    --methods matched_factored sdpa_cudnn_bf16 2>&1 | grep -v "it/s" | tee $OUT/b64_$tag.log
done
stamp done
tar czf /tmp/all.tgz -C $OUT . && mv /tmp/all.tgz $OUT/all.tgz
