#!/usr/bin/env bash
# One device call for the CUDA C++ kernels (kernels/cuda/, kernels/CUDA_BACKWARD.md): use the carried
# build/cuda/libdm_attn_sm90.so (or build it here when it is missing or stale), show what it links, check its SASS,
# run its GPU tests (tests/kernels/test_cuda_gpu.py: M1 primitives, the swapped dP̂ᵀ tile, the M2 factored dV), time
# the CUDA dV against Triton's factored dV at B·H = 64, N = 8192, D = 128, causal (tools/device/cuda_dv_bench.py), and
# print a summary. About 2 minutes on a fresh machine (Triton compiles its kernels for the tests and the bench).
# NCU=1 adds an Nsight Compute profile of each dV kernel ($OUT/ncu.txt; ncu reads counters on Firecracker machines).
# Files under $OUT (6, 7 with NCU=1; the device tool returns at most 8): install.log, build.log (build, ldd, SASS-check log),
# cuda_check.jsonl, gpu_tests.log, gpu_tests.jsonl, dv_bench.jsonl.
# Usage (repo root, on the H200; carry build/cuda so the library built on the CPU machine is the one tested):
#   bash tools/device/cuda_gpu.sh
set -uo pipefail
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
DELTAMATCH_TEST_REPORT="$OUT/gpu_tests.jsonl" python3 -m pytest -q -p no:cacheprovider -rfEs \
  tests/kernels/test_cuda_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
stamp "tests done"
python3 tools/device/cuda_dv_bench.py --out "$OUT/dv_bench.jsonl" 2>&1 | tail -8
stamp "bench done"
if [[ ${NCU:-0} == 1 ]]; then  # hardware counters of Triton's dV and each CUDA loop, where ncu can read them
  timeout 240 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats -k 'regex:dm_dv_factored|_attn_bwd_dkdv' \
    python3 tools/device/cuda_dv_bench.py --once > "$OUT/ncu.txt" 2>&1
  stamp "ncu rc $?"
fi
echo "== summary: library $origin; ldd $not_found not found; SASS check rc $check_rc;" \
  "tests: $(tail -1 "$OUT/gpu_tests.log")"
python3 - "$OUT/dv_bench.jsonl" <<'PY' 2>/dev/null || echo "  (no dV timings)"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    extra = f" equal {r['equal']} rel {r['rel']:.1e}" if "equal" in r else ""
    print(f"  {r['kernel']:20} {r.get('variant', ''):9} {'promoted  ' if r['promoted'] else 'unpromoted'} {r['ms']:.3f} ms "
          f"{r['tflops']:6.1f} TFLOP/s{extra}")
PY
