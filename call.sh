export DM_COMMIT=dff6993
source tools/device/setup.sh >/dev/null
R=$(realpath -m $OUT/r); mkdir -p $R; date -u +"start %T" > $R/stamps.txt
python3 tools/device/prewarm.py 128 1 > $R/prewarm.log 2>&1 &
python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/test_cuda_gpu.py > $R/cuda_tests.log 2>&1; tail -1 $R/cuda_tests.log; grep -E "^FAILED|Error:" $R/cuda_tests.log | cut -c1-300 | head -12
wait; date -u +"tests %T" >> $R/stamps.txt
for f in "" w4 w4p "" w4p; do DELTAMATCH_KERNEL_CUDA_FWD=$f python3 tools/device/attn_profile.py --out $R/prof --tag f$f$RANDOM > $R/prof_$f.log 2>&1; grep -h "ms of kernels" $R/prof_$f.log | cut -c1-20,60-; grep -h "fwd" $R/prof_$f.log | head -1; done
date -u +"prof %T" >> $R/stamps.txt
for f in "" w4p; do DELTAMATCH_KERNEL_CUDA_FWD=$f python3 -m deltamatch.kernels.bench --out $R/qb$f --head-dims 128 --seq-lens 8192 16384 --causal-only --methods matched_factored sdpa_cudnn_bf16 > $R/qb$f.log 2>&1; grep "| matched\|| sdpa" $R/qb$f/kernel_bench.md; done
date -u +"bench %T" >> $R/stamps.txt
timeout 120 python3 tools/device/graph_step.py matched_factored sdpa_cudnn_bf16 2>&1 | tee $R/graph_step.log | cut -c1-220
timeout 60 python3 tools/device/host_gap.py --seq-len 2048 matched_factored stale sdpa_cudnn_bf16 2>&1 | tee $R/host_gap_2k.log
date -u +"end %T" >> $R/stamps.txt
cd $OUT && tar -czf call2.tgz r && rm -rf r
