#!/usr/bin/env bash
# One device call for the CUDA C++ kernels (kernels/cuda/, kernels/CUDA_BACKWARD.md): use the carried
# build/cuda/libdm_attn_sm90.so (or build it here when it is missing or stale), show what it links, check its SASS,
# run its GPU tests (tests/kernels/test_cuda_gpu.py), print a summary; logs under $OUT. About 1 minute.
# Usage (repo root, on the H200; carry build/cuda so the library built on the CPU machine is the one tested):
#   bash tools/device/cuda_gpu.sh
set -uo pipefail
source tools/device/setup.sh
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
LIB=build/cuda/libdm_attn_sm90.so
before=$(stat -c %Y "$LIB" 2>/dev/null || echo none)
python3 -m deltamatch.kernels.cuda_build 2>&1 | tee "$OUT/build.log"  # keeps a carried build whose stamp matches
after=$(stat -c %Y "$LIB" 2>/dev/null || echo none)
if [[ $after == none ]]; then origin="missing (build failed)"
elif [[ $before == "$after" ]]; then origin="carried"
else origin="built on the device"; fi
stamp "library: $origin"
ldd "$LIB" 2>&1 | tee "$OUT/ldd.txt"
python3 -m deltamatch.kernels.check --cuda --out "$OUT/cuda_check.jsonl" > "$OUT/cuda_check.log" 2>&1
check_rc=$?
python3 - "$OUT/cuda_check.jsonl" <<'PY' 2>/dev/null || tail -5 "$OUT/cuda_check.log"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(f"  {r['name']:30} qgmma {r['qgmma_forms'] or '-'} regs {r['registers']} stack {r['stack_bytes']} "
          f"{'ok' if r['ok'] else r['problems']}")
PY
stamp "SASS check rc $check_rc"
DELTAMATCH_TEST_REPORT="$OUT/gpu_tests.jsonl" python3 -m pytest -q -p no:cacheprovider -rfEs \
  tests/kernels/test_cuda_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
stamp "tests done"
echo "== summary: library $origin; ldd $(grep -c 'not found' "$OUT/ldd.txt") not found; SASS check rc $check_rc;" \
  "tests: $(tail -1 "$OUT/gpu_tests.log")"
