#!/usr/bin/env bash
# Session 44, call 2: the GPU suite's first half, pytest -m gpu ${TESTS:-tests/kernels} (8 xdist workers), at the
# commit the full bench will time (call 3 runs the other half: TESTS="tests/models tests/evals"); carries the CUDA library, its stamp, .carry and the first flash-attn-4 part (.fa4a).
source tools/device/setup.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
t0=$SECONDS; stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
stamp suite
DELTAMATCH_TEST_REPORT=$OUT/gpu_tests.jsonl timeout ${LIMIT:-400} python3 -m pytest -q -rfE -p no:cacheprovider -n ${WORKERS:-8} \
  --durations=15 -m gpu ${TESTS:-tests/kernels} > $OUT/gpu_tests.log 2>&1
echo "pytest exit $?"; tail -40 $OUT/gpu_tests.log
stamp done
cd $OUT && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz $OUT/all.tgz
