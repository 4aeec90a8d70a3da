#!/usr/bin/env bash
# One device call for GPU training work: fla verification, step profiles, GPU tests, the 569M benchmark.
# Usage (repo root, on the H200): bash tools/device/train_gpu.sh PHASES [PROFILE VARIANTS...]
#   PHASES: comma list of verify (fla vs FP64, GDN head dims 64/128 x wy warps 2/4), kda (fla KDA chunk vs naive),
#           profile (tools/device/profile_step.py VARIANTS), tests (GPU tests), bench (benchmarks/train_bench.py h200)
# Needs the carried wheels (.carry, tools/device/fetch_wheels.sh). Logs and JSON land in $OUT.
set -uo pipefail
PHASES=${1:-verify,profile}
shift || true
source tools/device/setup.sh
# A Triton cache packed by an earlier call (profile_step.py --triton-cache-out) spares minutes of fla autotuning.
export TRITON_CACHE_DIR=/tmp/triton_cache
if [ -f .carry/triton_cache.tar.gz ]; then tar -xzf .carry/triton_cache.tar.gz -C /tmp; echo "warm Triton cache"; fi
start=$(date +%s); stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
has() { [[ ",$PHASES," == *",$1,"* ]]; }
{ date -u +%FT%TZ; echo "commit ${DM_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } \
  > "$OUT/provenance.txt"
cat "$OUT/provenance.txt"
if has verify; then
  timeout ${VERIFY_S:-200} python3 tools/device/fla_verify.py --kda-lengths --out "$OUT/fla_verify.json" 2>&1 \
    | tee "$OUT/fla_verify.log" | cut -c1-400
  stamp verify done
fi
if has profile; then
  # one process for every item (compile once); stacks every 60 s and autotuning lines go to the log only
  TRITON_PRINT_AUTOTUNING=1 timeout ${PROFILE_S:-540} python3 tools/device/profile_step.py "$@" --watchdog 60 \
    --out "$OUT/profile.json" --triton-cache-out "$OUT/triton_cache.tar.gz" > "$OUT/profile.log" 2>&1
  grep -E '^\{|^ *(variant|[a-z]+:[0-9])|Triton autotuning for function' "$OUT/profile.log" | cut -c1-300 | tail -60
  echo "--- end of profile.log ---"; tail -25 "$OUT/profile.log" | cut -c1-200
  stamp profile done
fi
if has kda; then
  timeout ${KDA_S:-120} python3 tools/device/fla_verify.py --head-dims --lengths --kda-lengths 63 300 \
    --out "$OUT/kda_verify.json" 2>&1 | tee "$OUT/kda_verify.log" | cut -c1-400
  stamp kda done
fi
if has tests; then
  timeout ${TESTS_S:-420} python3 -m pytest -v -rA -p no:cacheprovider -p no:xdist --durations=20 -m gpu \
    tests/models tests/kernels/test_sdpa_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" \
    | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Timeout|s call" | tail -60
  stamp tests done
fi
if has bench; then
  python3 benchmarks/train_bench.py h200 ${BENCH_ARGS:-} --out "$OUT/train_569m_h200.json" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/train_bench.log" | tail -40
  stamp bench done
fi
