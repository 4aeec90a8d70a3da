export DM_COMMIT=5f7050f
source tools/device/setup.sh >/dev/null
R=$(realpath -m $OUT/r); mkdir -p $R; date -u +"start %T" > $R/stamps.txt
(python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_triton_gpu.py > $R/triton_tests.log 2>&1; tail -1 $R/triton_tests.log) &
(python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_cuda_gpu.py > $R/cuda_tests.log 2>&1; tail -1 $R/cuda_tests.log) &
python3 tools/device/prewarm.py 128 1 > $R/prewarm.log 2>&1 &
DELTAMATCH_KERNEL_FWD_WIDE=1 python3 tools/device/prewarm.py 128 1 > $R/prewarm_wide.log 2>&1 &
wait; date -u +"tests %T" >> $R/stamps.txt
python3 tools/device/kernel_sweep.py --out $R/sweep --head-dims 128 --kinds fwd --factored-only > $R/sweep.log 2>&1
grep "D=128 fwd" $R/sweep.log | cut -c1-40,100-; date -u +"sweep %T" >> $R/stamps.txt
for w in 0 1 0 1; do DELTAMATCH_KERNEL_FWD_WIDE=$w python3 tools/device/attn_profile.py --out $R/prof$w --tag $w$RANDOM > $R/prof_$w.log 2>&1; grep -h "ms of kernels" $R/prof_$w.log; grep -h "attn_fwd" $R/prof_$w.log | head -1; done
date -u +"prof %T" >> $R/stamps.txt
for w in 0 1; do DELTAMATCH_KERNEL_FWD_WIDE=$w python3 -m deltamatch.kernels.bench --out $R/qb$w --head-dims 128 --seq-lens 8192 16384 --causal-only --methods matched_factored sdpa_cudnn_bf16 > $R/qb$w.log 2>&1; cat $R/qb$w/kernel_bench.md | head -8; done
date -u +"end %T" >> $R/stamps.txt
cd $OUT && tar -czf call1.tgz r && rm -rf r
