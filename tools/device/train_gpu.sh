#!/usr/bin/env bash
# One device call for GPU training work on the H200. Usage (repo root): bash tools/device/train_gpu.sh PHASES [ITEMS...]
#   PHASES, a comma list, run in this order:
#     items      tools/device/profile_step.py ITEMS in one process: training-step timings/profiles
#                (method:micro_batch[:flags]) and fla checks (verify:K:T:h0:warps[:bf16], kda:T:h0[:fp32])
#     tests      the GPU tests (pytest -m gpu tests/models tests/kernels), each with its own time limit
#     bench      benchmarks/train_bench.py h200 (dm-train end to end, bf16 vs matched; BENCH_ARGS adds flags)
#     stability  benchmarks/train_bench.py h200-stability (200 steps x bf16/stale/consistent/matched)
#     big        benchmarks/train_bench.py h200 --size 1.67B (BIG_ARGS, default micro-batch 2, bf16 and matched)
#     pipeline   snakemake --cores all --resources local_gpus=1 --configfile config/h200.yaml, results packed without
#                checkpoints into $OUT/h200_pipeline.tgz
# Every process of a call shares Triton's on-disk cache (tools/device/setup.sh keeps it in .cache/triton, so a later
# call on the same warm machine reuses it too): only the first pays fla's compile and autotuning (about 4 minutes on a
# fresh machine). The call stops every phase by DEADLINE_S seconds (default 570) and leaves what it finished in $OUT,
# a few files only (a call returns at most 8). Set DM_COMMIT to the commit sent. Needs the carried wheels (.carry).
set -uo pipefail
PHASES=${1:-items}
shift || true
source tools/device/setup.sh
start=$(date +%s); stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
has() { [[ ",$PHASES," == *",$1,"* ]]; }
# seconds a phase may take: its own limit, or what is left before the deadline (less 20 s to pack), if that is less
budget() { local left=$(( ${DEADLINE_S:-570} - ($(date +%s) - start) - 20 )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
LOG="$OUT/log.txt"
{ date -u +%FT%TZ; echo "commit ${DM_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } \
  | tee "$LOG"
if has items; then
  # stacks every 60 s and Triton's autotuning lines go to the log only
  TRITON_PRINT_AUTOTUNING=1 timeout "$(budget ${ITEMS_S:-540})" python3 tools/device/profile_step.py "$@" \
    --watchdog 60 --out "$OUT/items.json" > "$OUT/items.log" 2>&1
  grep -E '^\{|^ *(variant|[a-z]+:[0-9])' "$OUT/items.log" | cut -c1-300 | tail -40
  echo "--- end of items.log ---"; tail -15 "$OUT/items.log" | cut -c1-200
  stamp items done | tee -a "$LOG"
fi
if has tests; then
  # TEST_WORKERS > 0 spreads the tests over that many xdist processes (Triton compiles on the CPU: fla's kernels for
  # several tests compile at once); $OUT/gpu_tests.jsonl gets each test's outcome, seconds and failure as it ends
  workers=${TEST_WORKERS:-4}; (( workers > 0 )) && xdist="-n $workers" || xdist="-p no:xdist"
  DELTAMATCH_TEST_REPORT="$OUT/gpu_tests.jsonl" timeout "$(budget ${TESTS_S:-480})" python3 -m pytest -v -rA \
    -p no:cacheprovider $xdist --durations=25 -m gpu tests/models tests/kernels > "$OUT/gpu_tests.log" 2>&1
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Timeout|s call|s setup" "$OUT/gpu_tests.log" | tail -70
  stamp tests done | tee -a "$LOG"
fi
bench() {  # name preset [flags...]
  local name=$1 limit=$2; shift 2
  timeout "$(budget "$limit")" python3 benchmarks/train_bench.py "$@" --out "$OUT/$name.json" 2>&1 \
    | grep -v "^\s*$" >> "$LOG"
  tail -8 "$LOG"; stamp "$name done" | tee -a "$LOG"
}
has bench && bench train_569m_h200 ${BENCH_S:-300} h200 ${BENCH_ARGS:-}
has stability && bench stability_569m_h200 ${STABILITY_S:-560} h200-stability ${STABILITY_ARGS:-}
has big && bench train_1p67b_h200 ${BIG_S:-300} h200 --size 1.67B ${BIG_ARGS:---micro-batch 2}
if has pipeline; then
  timeout "$(budget ${PIPELINE_S:-560})" snakemake --cores all --resources local_gpus=1 --rerun-incomplete \
    --configfile config/h200.yaml \
    ${PIPELINE_ARGS:-} > "$OUT/pipeline.log" 2>&1
  echo "snakemake exit $?" | tee -a "$LOG"; grep -E "steps|of [0-9]+ steps|Error|error" "$OUT/pipeline.log" | tail -15
  tar czf "$OUT/h200_pipeline.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*/checkpoints/*' \
    --exclude='*.bin' results/h200 .snakemake/log 2>/dev/null
  stamp pipeline done | tee -a "$LOG"
fi
if [[ -n "${PACK_CACHE:-}" && -d "$TRITON_CACHE_DIR" ]]; then  # Triton's cache back in parts of <16 MiB
  tar czf - -C "$(dirname "$TRITON_CACHE_DIR")" "$(basename "$TRITON_CACHE_DIR")" | split -b 15M - "$OUT/triton_cache.tgz."
  ls -la "$OUT" | tail -12
fi
