#!/usr/bin/env bash
# One device call for GPU training work on the H200. Usage (repo root): bash tools/device/train_gpu.sh PHASES [ITEMS...]
#   PHASES, a comma list of:
#     items      tools/device/profile_step.py ITEMS in one process: training-step timings/profiles
#                (method:micro_batch[:flags]) and fla checks (verify:K:T:h0:warps[:bf16], kda:T:h0)
#     tests      the GPU tests (pytest -m gpu tests/models tests/kernels), each with its own time limit
#     bench      benchmarks/train_bench.py h200 (dm-train end to end, bf16 vs matched)
#     stability  benchmarks/train_bench.py h200-stability (200 steps x bf16/stale/consistent/matched)
# Every process of a call shares Triton's on-disk cache, so only the first pays fla's compile and autotuning (about
# 4 minutes on a fresh machine): put the phases that belong together into one call. Set DM_COMMIT to the commit sent.
# Needs the carried wheels (.carry, tools/device/fetch_wheels.sh). Logs and JSON land in $OUT.
set -uo pipefail
PHASES=${1:-items}
shift || true
source tools/device/setup.sh
start=$(date +%s); stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
has() { [[ ",$PHASES," == *",$1,"* ]]; }
{ date -u +%FT%TZ; echo "commit ${DM_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } \
  > "$OUT/provenance.txt"
cat "$OUT/provenance.txt"
if has items; then
  # stacks every 60 s and Triton's autotuning lines go to the log only
  TRITON_PRINT_AUTOTUNING=1 timeout ${ITEMS_S:-540} python3 tools/device/profile_step.py "$@" --watchdog 60 \
    --out "$OUT/items.json" > "$OUT/items.log" 2>&1
  grep -E '^\{|^ *(variant|[a-z]+:[0-9])' "$OUT/items.log" | cut -c1-300 | tail -40
  echo "--- end of items.log ---"; tail -15 "$OUT/items.log" | cut -c1-200
  stamp items done
fi
if has tests; then
  timeout ${TESTS_S:-480} python3 -m pytest -v -rA -p no:cacheprovider -p no:xdist --durations=20 -m gpu \
    tests/models tests/kernels 2>&1 | tee "$OUT/gpu_tests.log" \
    | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Timeout|s call" | tail -60
  stamp tests done
fi
if has bench; then
  python3 benchmarks/train_bench.py h200 ${BENCH_ARGS:-} --out "$OUT/train_569m_h200.json" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/train_bench.log" | tail -20
  stamp bench done
fi
if has stability; then
  python3 benchmarks/train_bench.py h200-stability ${BENCH_ARGS:-} --out "$OUT/stability_569m_h200.json" 2>&1 \
    | grep -v "^\s*$" | tee "$OUT/stability.log" | tail -20
  stamp stability done
fi
