#!/usr/bin/env bash
# One device call for the CUDA C++ kernels (kernels/cuda/, kernels/CUDA_BACKWARD.md): use the carried
# build/cuda/libdm_attn_sm90.so (or build it here when it is missing or stale), show what it links, check its SASS,
# run its GPU tests (tests/kernels/test_cuda_gpu.py: M1 primitives, the swapped dP̂ᵀ tile, the M2 factored dV), time
# the CUDA dV against Triton's factored dV at B·H = 64, N = 8192, D = 128, causal (tools/device/cuda_dv_bench.py), and
# print a summary. About 2 minutes on a fresh machine (Triton compiles its kernels for the tests and the bench).
# Stages (first argument, comma-separated; default tests,bench): tests, bench, variants: the opt-in kernel forms
# against the defaults in one call — tools/device/delta_bench.py (every δ variant, do_bench), then CUPTI of the
# reference step (tools/device/attn_profile.py) under each setting of VARIANTS (default: none, the dK/dV's ws3 byte
# stores), the settings interleaved, twice ($OUT/profiles.tgz, a summary line each); and ncu: an Nsight Compute
# profile of Triton's dV and each CUDA dV kernel ($OUT/ncu.txt: speed of light, occupancy, the scheduler, every stall
# reason per issued instruction, L2 sectors and requests, shared-memory bank conflicts; ncu reads counters on
# Firecracker machines). The build, ldd and SASS check always run. Files under $OUT (at most 8; the device tool
# returns at most 8): install.log, build.log (build, ldd, SASS-check log), cuda_check.jsonl, gpu_tests.log,
# gpu_tests.jsonl, dv_bench.jsonl, profiles.tgz, ncu.txt.
# ab: this tree against another commit's (.ab: `git archive REV deltamatch kernels models evals reports tools setup.py
# pyproject.toml | tar -x -C .ab`, its library built by `python tools/device/ab_tree.py .ab kernels/cuda_build.py --out
# build/cuda`; carry .ab): CUPTI of the reference step, the trees interleaved, and each kernel's time side by side
# ($OUT/ab.tgz; tools/device/ab_compare.py).
# hostab: the host's cost a step (tools/device/host_gap.py, GPU held busy) of this tree against .ab's, the rounds
# interleaved ($OUT/host_ab.log): for Python-only changes .ab needs no library (this tree's is loaded).
# Usage (repo root, on the H200; carry build/cuda so the library built on the CPU machine is the one tested):
#   [TESTS_K=<pytest -k expression>] [BENCH_ARGS="--fused-only"] [NCU_KERNELS=<regex>] [VARIANTS="default;VAR=x ..."]
#   [AB_ROUNDS=2] [ROUNDS=2 DELTA_BENCH=1 VARIANTS_BUDGET_S=480 PROFILE_ARGS="--head-dim 64" (variants)]
#   [HOST_N=2048 HOST_METHODS=matched_factored HOST_ROUNDS=2 (hostab)]
#   bash tools/device/cuda_gpu.sh [tests,bench,variants,ab,hostab,ncu]
set -uo pipefail
WHAT=${1:-tests,bench}
has() { [[ ",$WHAT," == *",$1,"* ]]; }
source tools/device/setup.sh
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
LIB=build/cuda/libdm_attn_sm90.so
LOG="$OUT/build.log"
before=$(stat -c %Y "$LIB" 2>/dev/null || echo none)
python3 -m deltamatch.kernels.cuda_build 2>&1 | tee "$LOG"  # keeps a carried build whose stamp matches
after=$(stat -c %Y "$LIB" 2>/dev/null || echo none)
if [[ $after == none ]]; then origin="missing (build failed)"
elif [[ $before == "$after" ]]; then origin="carried"
else origin="built on the device"; fi
stamp "library: $origin"
echo "== ldd" >> "$LOG"
ldd "$LIB" 2>&1 | tee -a "$LOG"
not_found=$(ldd "$LIB" 2>&1 | grep -c 'not found')
echo "== dm-kernel-check --cuda" >> "$LOG"
python3 -m deltamatch.kernels.check --cuda --out "$OUT/cuda_check.jsonl" >> "$LOG" 2>&1
check_rc=$?
python3 - "$OUT/cuda_check.jsonl" <<'PY' 2>/dev/null || tail -5 "$LOG"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(f"  {r['name']:30} qgmma {r['qgmma_forms'] or '-'} regs {r['registers']} stack {r['stack_bytes']} "
          f"{'ok' if r['ok'] else r['problems']}")
PY
stamp "SASS check rc $check_rc"
if has tests; then
  DELTAMATCH_TEST_REPORT="$OUT/gpu_tests.jsonl" timeout 300 python3 -m pytest -q -p no:cacheprovider -rfEs \
    ${TESTS_K:+-k "$TESTS_K"} tests/kernels/test_cuda_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  stamp "tests done"
fi
if has bench; then
  timeout 240 python3 tools/device/cuda_dv_bench.py ${BENCH_ARGS:-} --out "$OUT/dv_bench.jsonl" 2>&1 | tail -12
  stamp "bench done"
fi
if has variants; then  # each setting a space-separated list of VAR=value (or "default"), settings separated by ';'
  if [[ ${DELTA_BENCH:-1} == 1 ]]; then  # DELTA_BENCH=0: the profiles alone
    timeout 180 python3 tools/device/delta_bench.py 128 2>&1 | tail -12
    stamp "delta bench done"
  fi
  mkdir -p "$OUT/profiles"
  IFS=';' read -ra settings <<< "${VARIANTS:-default;DELTAMATCH_KERNEL_CUDA_DKDV=ws3}"
  # VARIANTS_BUDGET_S (default 480): no profile starts after that many seconds of the call, so a long list still ends
  # with its table and one tgz inside the device's 600 s (the rounds are interleaved: a cut leaves whole rounds first)
  # a setting whose profile fails (a crash, or its 120 s timeout: a kernel that hangs) is not run again in a later
  # round, so one hung form costs the call 120 s, not 120 s a round
  declare -A failed=()
  # the order of the settings alternates by round (as the ab stage's trees: the first in odd rounds, the last in even
  # ones), so a bias towards the first profile of a round falls on each setting alike
  reversed=()
  for (( i = ${#settings[@]} - 1; i >= 0; i-- )); do reversed+=("${settings[$i]}"); done
  for round in $(seq 1 "${ROUNDS:-2}"); do
    if (( round % 2 )); then order=("${settings[@]}"); else order=("${reversed[@]}"); fi
    for setting in "${order[@]}"; do
      if (( $(date +%s) - start > ${VARIANTS_BUDGET_S:-480} )); then
        echo "  budget: ${VARIANTS_BUDGET_S:-480} s spent, $setting (round $round) and the settings after it skipped"
        break 2
      fi
      if [[ -n ${failed[$setting]:-} ]]; then
        echo "  $setting (round $round): skipped, its profile failed in round ${failed[$setting]}"
        continue
      fi
      tag=$(echo "$setting" | tr -c 'A-Za-z0-9=\n' '_' | sed 's/DELTAMATCH_KERNEL_//g; s/=/-/g')_$round
      if [[ $setting == default ]]; then envs=(); else read -ra envs <<< "$setting"; fi
      t0=$(date +%s)
      # shellcheck disable=SC2086  # PROFILE_ARGS: attn_profile.py's options, one word each
      env "${envs[@]}" timeout 120 python3 tools/device/attn_profile.py ${PROFILE_ARGS:-} --out "$OUT/profiles" \
        --tag "$tag" > "$OUT/profiles/$tag.log" 2>&1
      rc=$?
      if (( rc != 0 )); then
        failed[$setting]=$round
        echo "  $setting (round $round): profile rc $rc$( ((rc == 124)) && echo ' (timed out: a hang?)'), its log's end:"
        tail -3 "$OUT/profiles/$tag.log" | sed 's/^/    /'
        continue
      fi
      echo "  $setting (round $round, $(( $(date +%s) - t0 )) s):" \
        "$(grep -m1 -o '[0-9.]* ms of kernels per step' "$OUT/profiles/$tag.log")"
      # the step's three big kernels (forward, δ pass, dK/dV + dQ), so the call's output says which one moved
      grep -E '^\| (dm_fwd|dm_delta|dm_dkdv_factored)' "$OUT/profiles/$tag.log" \
        | awk -F'|' '{gsub(/ /, "", $2); gsub(/ /, "", $4); printf "    %s %s ms\n", $2, $4}'
    done
  done
  # the settings side by side (each part's mean over the rounds, and its change against the default)
  python3 tools/device/variants_table.py "$OUT/profiles" | tee "$OUT/profiles/table.md"
  tar czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -rf "$OUT/profiles"  # one file back (the tool returns 8)
  stamp "variants done"
fi
if has ab && [[ ! -f .ab/deltamatch/__init__.py || ! -f .ab/build/cuda/libdm_attn_sm90.so ]]; then
  echo "ab: no .ab tree with its library here (build it on the CPU machine and carry .ab; see the header)"
elif has ab; then  # this tree against the .ab tree (another commit's files and library, carried): CUPTI of the step,
  # interleaved, AB_ROUNDS rounds (default 2), then the kernels side by side. The order alternates by round (this
  # tree first in odd rounds, .ab first in even ones): with this tree always first, kernels whose SASS was the same in
  # both trees came out ≈ 1% slower in this tree (the δ pass in session 34's calls 1 and 8, dK/dV + dQ in call 8)
  mkdir -p "$OUT/ab"
  ab_new() {
    timeout 120 python3 tools/device/attn_profile.py --out "$OUT/ab" --tag "new_$1" > "$OUT/ab/new_$1.log" 2>&1
    echo "  this tree (round $1): $(grep -m1 -o '[0-9.]* ms of kernels per step' "$OUT/ab/new_$1.log")"
  }
  ab_old() {
    timeout 120 python3 tools/device/ab_tree.py .ab tools/device/attn_profile.py --out "$OUT/ab" --tag "old_$1" \
      > "$OUT/ab/old_$1.log" 2>&1
    echo "  .ab tree (round $1): $(grep -m1 -o '[0-9.]* ms of kernels per step' "$OUT/ab/old_$1.log")"
  }
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    if (( round % 2 )); then ab_new "$round"; ab_old "$round"; else ab_old "$round"; ab_new "$round"; fi
  done
  python3 tools/device/ab_compare.py "$OUT/ab" | tee "$OUT/ab/compare.txt"
  tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
  stamp "ab done"
fi
if has hostab && [[ ! -f .ab/deltamatch/__init__.py ]]; then
  echo "hostab: no .ab tree here (git archive the other commit into .ab on the CPU machine and carry .ab)"
elif has hostab; then  # the host's cost a step, this tree against .ab (Python changes: the same .cu sources, so .ab
  # may come without a library and loads this tree's, DELTAMATCH_CUDA_LIB): tools/device/host_gap.py at HOST_N
  # (default 2048) for HOST_METHODS (default matched_factored), HOST_ROUNDS rounds (default 2), the order alternating
  lib=.ab/build/cuda/libdm_attn_sm90.so
  [[ -f $lib ]] || lib=$LIB
  lib=$(realpath "$lib")
  host_new() { python3 tools/device/host_gap.py --seq-len "${HOST_N:-2048}" ${HOST_METHODS:-matched_factored} \
    | sed "s/^/new $1 /"; }
  host_old() { DELTAMATCH_CUDA_LIB=$lib python3 tools/device/ab_tree.py .ab tools/device/host_gap.py \
    --seq-len "${HOST_N:-2048}" ${HOST_METHODS:-matched_factored} | sed "s/^/old $1 /"; }
  for round in $(seq 1 "${HOST_ROUNDS:-2}"); do
    if (( round % 2 )); then host_new "$round"; host_old "$round"; else host_old "$round"; host_new "$round"; fi
  done 2>&1 | tee "$OUT/host_ab.log"
  stamp "hostab done"
fi
if has ncu; then  # hardware counters of Triton's dV and each CUDA loop, where ncu can read them
  metrics='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,lts__t_sectors.sum'
  metrics+=',lts__t_requests.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum'
  metrics+=',l1tex__data_pipe_lsu_wavefronts_mem_shared.sum'
  timeout 240 ncu --clock-control none --section SpeedOfLight --section SchedulerStats --section Occupancy \
    --section LaunchStats --metrics "$metrics" \
    -k "regex:${NCU_KERNELS:-dm_dv_factored|dm_dk_factored|dm_dkdv_factored|_attn_bwd_dkdv}" python3 tools/device/cuda_dv_bench.py --once \
    > "$OUT/ncu.txt" 2>&1
  stamp "ncu rc $?"
fi
echo "== summary: library $origin; ldd $not_found not found; SASS check rc $check_rc;" \
  "tests: $(tail -1 "$OUT/gpu_tests.log" 2>/dev/null)"
python3 - "$OUT/dv_bench.jsonl" <<'PY' 2>/dev/null || echo "  (no dV timings)"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    extra = f" equal {r['equal']} rel {r['rel']:.1e}" if "equal" in r else ""
    print(f"  {r['kernel']:20} {r.get('variant', ''):9} {'promoted  ' if r['promoted'] else 'unpromoted'} {r['ms']:.3f} ms "
          f"{r['tflops']:6.1f} TFLOP/s{extra}")
PY
