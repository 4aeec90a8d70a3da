#!/usr/bin/env bash
# One device call for kernel forms that have never run on a GPU: their own tests first, alone (NEW_K, a pytest -k
# expression over tests/kernels/test_cuda_gpu.py), so that a hang costs their timeout (cuda_gpu.sh's 300 s) and not
# the suite; if they all pass, the whole CUDA suite and CUPTI of the reference step under the default and each new form
# (NEW_VARIANTS: cuda_gpu.sh's VARIANTS settings besides "default", ';' between them), ROUNDS rounds (default 4) with
# the order alternating; else the suite without them and the default alone. Then the quick bench (kernel_gpu.sh).
# $OUT ends with three files: profiles.tgz, bench.tgz and logs.tgz (every log, the new forms' test log among them).
# SUITE=0 leaves the whole suite out (≈ 3 minutes less: for a call whose other kernels' SASS is that of a tree whose
# suite passed on a GPU, when device time is short); QUICK=0 the quick bench (≈ 2 minutes less).
#
#   NEW_K="<pytest -k expression>" \
#   NEW_VARIANTS="DELTAMATCH_KERNEL_CUDA_DKDV=<new form>;DELTAMATCH_KERNEL_CUDA_DKDV=<another new form>" \
#   bash tools/device/new_forms.sh
set -uo pipefail
: "${NEW_K:?set NEW_K (a pytest -k expression)}" "${NEW_VARIANTS:?set NEW_VARIANTS (VARIANTS settings)}"
OUT=${OUT:-/tmp/out}
export OUT
TESTS_K="$NEW_K" bash tools/device/cuda_gpu.sh tests 2>&1 | tail -3
mv "$OUT/gpu_tests.log" "$OUT/new_forms_tests.log" 2>/dev/null
if tail -1 "$OUT/new_forms_tests.log" 2>/dev/null | grep -E "^[0-9]+ passed" | grep -qv error; then
  echo "== the new forms' tests passed: the default against each of them (and the suite, unless SUITE=0)"
  variants="default;$NEW_VARIANTS" k=""
else
  echo "== the new forms' tests did not all pass (new_forms_tests.log): the suite without them, the default alone"
  variants="default" k="not ($NEW_K)"
fi
stages=variants
[[ ${SUITE:-1} == 0 ]] || stages=tests,variants
TESTS_K="$k" ROUNDS=${ROUNDS:-4} DELTA_BENCH=0 VARIANTS="$variants" bash tools/device/cuda_gpu.sh "$stages" 2>&1 \
  | grep -v "qgmma {" | grep -v " ok$" | tail -30
if [[ ${QUICK:-1} != 0 ]]; then
  bash tools/device/kernel_gpu.sh bench quick 2>&1 | tail -20
  tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
fi
(cd "$OUT" && shopt -s nullglob && logs=(*.log *.jsonl) && tar czf logs.tgz "${logs[@]}" && rm -f "${logs[@]}")
ls "$OUT"
