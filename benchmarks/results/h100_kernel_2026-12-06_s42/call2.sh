#!/usr/bin/env bash
# Session 42, call 2: the D = 64 forms (emulated exponentials, row maxima): tests, CUPTI by setting, the sweep.
source tools/device/setup.sh
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp tests_d64
python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k d64 2>&1 | tail -15 | tee $OUT/tests_d64.log
stamp tests_wide128
python3 -m pytest -q tests/kernels/test_cuda_gpu.py -k "(wide or factored_forward) and not d64" 2>&1 | tail -6 \
  | tee $OUT/tests_wide128.log
settings="w4p:w4p w4p:w4pm w4p:w4pme8 w4p:w4pme4 w4p:w4pe2 w4pe8:w4pm w4pe4:w4pm w4pe2:w4pm"
for r in 1 2; do
  for fd in $settings; do
    f=${fd%%:*}; d=${fd##*:}; stamp "profile f_$f+d_$d $r"
    DELTAMATCH_KERNEL_CUDA_FWD=$f DELTAMATCH_KERNEL_CUDA_DELTA=$d python3 tools/device/attn_profile.py --out $OUT/p \
      --head-dim 64 --tag f_$f+d_${d}_$r > $OUT/profile_f_$f+d_${d}_$r.log 2>&1 || tail -5 $OUT/profile_f_$f+d_${d}_$r.log
  done
done
python3 tools/device/variants_table.py $OUT/p 2>&1 | tee $OUT/variants.md
if (( SECONDS - t0 < 400 )); then
  stamp sweep
  python3 tools/device/kernel_sweep.py --out $OUT/sweep --head-dims 64 --factored-only --kinds dkdv 2>&1 \
    | grep -v "it/s" > $OUT/sweep64.log; tail -4 $OUT/sweep64.log | cut -c1-220
fi
stamp done
tar czf $OUT/all.tgz -C $OUT --exclude all.tgz .
