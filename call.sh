export DM_COMMIT=0f01401
source tools/device/setup.sh >/dev/null
R=$(realpath -m $OUT/r); mkdir -p $R; date -u +"start %T" > $R/stamps.txt
for d in 64 128 256; do for c in 1 0; do python3 tools/device/prewarm.py $d $c >> $R/prewarm.log 2>&1 & done; done
python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/test_triton_gpu.py > $R/triton_tests.log 2>&1; tail -1 $R/triton_tests.log; grep -E "^FAILED" $R/triton_tests.log | cut -c1-250 | head
python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/test_cuda_gpu.py > $R/cuda_tests.log 2>&1; tail -1 $R/cuda_tests.log; grep -E "^FAILED" $R/cuda_tests.log | cut -c1-250 | head
wait; date -u +"tests %T" >> $R/stamps.txt
python3 -m deltamatch.kernels.bench --out $R/bench --memory > $R/bench.log 2>&1; grep "| matched_f\|| sdpa_cudnn_bf16" $R/bench/kernel_bench.md | cut -c1-200; grep "matched_factored\|cudnn_bf16" $R/bench/kernel_memory.md | head -4
date -u +"bench %T" >> $R/stamps.txt
python3 tools/device/attn_profile.py --out $R/prof > $R/prof.log 2>&1; grep -h "ms of kernels" $R/prof.log; head -12 $R/prof.log | tail -9
date -u +"end %T" >> $R/stamps.txt
cd $OUT && tar -czf call3.tgz r && rm -rf r
