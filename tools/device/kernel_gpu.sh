#!/usr/bin/env bash
# One device call for the kernel work: install, GPU tests, benchmark; logs and tables under $OUT.
# Usage (from the repo root, on the H200): bash tools/device/kernel_gpu.sh STAGES [quick|full]
#   STAGES: comma-separated of tests, tma, dqatomic, promote, quant, memory, sweep, bench (or all = tests,bench)
#   tma, dqatomic: A/B of DELTAMATCH_KERNEL_TMA / DELTAMATCH_KERNEL_DQ_ATOMIC: the GPU kernel tests with the switch on,
#        then the bench at D = 128, causal, N 8K and 16K, off and on in one run (kernels/NOTES.md)
#   promote: the same for DELTAMATCH_KERNEL_ACC_PROMOTE, tests with it at 0 (the factored dots unpromoted)
#   stores: the same for DELTAMATCH_KERNEL_STORE_UNUSED (matched_factored's passes writing both code layouts again)
#   ptxas: the store-mode GPU test of the unverified modes under CUDA's own ptxas (TRITON_PTXAS_PATH; NOTES.md)
#   profile: matched_factored's (and matched's) fwd+bwd kernel by kernel (tools/device/attn_profile.py), and
#        matched_factored again with DELTAMATCH_KERNEL_STORE_UNUSED=1
#   fa4: whether flash-attn-4 (the fa4_cute_bf16 baseline, tools/device/fetch_fa4.sh) imports, then the bench at
#        D = 128, causal, N 8K and 16K of matched_factored, cuDNN BF16 and it ($OUT/fa4.log, $OUT/fa4/kernel_bench.md)
#   cuda: the same for DELTAMATCH_KERNEL_CUDA (matched_factored's dK, dV and dQ by kernels/cuda/dkdv_factored.cu and
#        dq_factored.cu), tests with it unset; AB_TESTS_K narrows the tests (pytest -k)
set -uo pipefail
WHAT=${1:-all}
SIZE=${2:-quick}
source tools/device/setup.sh
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1 | tail -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
stamp installed

[[ $WHAT == all ]] && WHAT=tests,bench
has() { [[ ",$WHAT," == *",$1,"* ]]; }

if has fa4; then  # the FA3-class BF16 baseline, staged by tools/device/fetch_fa4.sh and installed by setup.sh
  python3 -c "import flash_attn.cute, cutlass; print('flash-attn-4 imports; cutlass', cutlass.__version__)" 2>&1 \
    | tail -3 | tee "$OUT/fa4.log"
  python3 -m deltamatch.kernels.bench --out "$OUT/fa4" --head-dims 128 --seq-lens 8192 16384 --causal-only \
    --methods matched_factored sdpa_cudnn_bf16 fa4_cute_bf16 2>&1 | grep -v "shapes:" | tee -a "$OUT/fa4.log"
  rm -f "$OUT/fa4/kernel_bench.csv"  # the table is in the .md; the device tool returns 8 files
  stamp "fa4 done"
fi

if has tests; then
  python3 -m pytest -q -p no:cacheprovider -n 8 -rfE --durations=8 \
    tests/kernels/test_triton_gpu.py tests/kernels/test_cudnn_fp8.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  stamp tests done
fi

# A/B of a kernel switch in one call: the GPU kernel tests with the switch at TESTED (default 1), then the bench at
# D = 128 (causal, N 8K and 16K) of METHODS with it off and on; files $OUT/{gpu_tests,bench}_<name>*.
ab() {  # name switch [tested [methods...]]
  local name=$1 switch=$2 tested=${3-1}; shift 3 2>/dev/null || shift $#
  local methods=${*:-stale matched sdpa_cudnn_bf16}
  env "$switch=$tested" python3 -m pytest -q -p no:cacheprovider -n 8 -rfE --durations=5 ${AB_TESTS_K:+-k "$AB_TESTS_K"} \
    tests/kernels/test_triton_gpu.py > "$OUT/gpu_tests_$name.log" 2>&1; tail -8 "$OUT/gpu_tests_$name.log"
  stamp "$name tests done"
  for t in 0 1; do env "$switch=$t" python3 tools/device/prewarm.py 128 1 & done; wait
  for t in 0 1; do
    env "$switch=$t" python3 -m deltamatch.kernels.bench --out "$OUT/bench_$name$t" --head-dims 128 \
      --seq-lens 8192 16384 --causal-only --methods $methods 2>&1 | grep -v "shapes:" \
      | tee "$OUT/bench_$name$t.log"
    rm -f "$OUT/bench_$name$t"/*.md
  done
  stamp "$name bench done"
}
has tma && ab tma DELTAMATCH_KERNEL_TMA  # TMA loads (kernels/NOTES.md v5; launched at D = 128 since)
# dQ inside the dK/dV launch: matched_factored's CUDA dK/dV with its bulk reduce-add (Triton's atomic dK launch for
# stale and matched was timed slower in 2026-12-01's call: DQ_METHODS="stale matched sdpa_cudnn_bf16" times it again)
has dqatomic && ab dqatomic DELTAMATCH_KERNEL_DQ_ATOMIC 1 ${DQ_METHODS:-matched_factored sdpa_cudnn_bf16}
# the factored dots without per-tile promotion: its tests (the 8K one says whether it is accurate enough), then timed
has promote && ab promote DELTAMATCH_KERNEL_ACC_PROMOTE 0 matched matched_factored sdpa_cudnn_bf16
# matched_factored's backward by the CUDA kernels (carry build/cuda): the tests with the switch unset (CUDA where they
# can run, Triton for D ≠ 128 and the ds_stats diagnostics), then the bench with Triton's launches (0) and CUDA's (1)
has cuda && ab cuda DELTAMATCH_KERNEL_CUDA "" matched matched_factored sdpa_cudnn_bf16

# matched_factored's quantisation passes writing only the code layouts its kernels read (triton_quant.LAYOUTS), against
# all of them (1: as before)
has stores && ab stores DELTAMATCH_KERNEL_STORE_UNUSED 1 matched_factored sdpa_cudnn_bf16

if has ptxas; then  # triton-lang/triton#11111: do the unverified store modes store the right bits under ptxas 13.x?
  TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas DELTAMATCH_TEST_STORE_MODES=narrow_convert,tma_channel,tma_both \
    TRITON_CACHE_DIR=/tmp/triton_ptxas13 timeout 240 python3 -m pytest -q -p no:cacheprovider -n 6 -rfE -k store_mode \
    tests/kernels/test_triton_gpu.py > "$OUT/ptxas_tests.log" 2>&1
  /usr/local/cuda/bin/ptxas --version | tail -1; tail -12 "$OUT/ptxas_tests.log"
  stamp ptxas done
fi

if has profile; then
  python3 tools/device/attn_profile.py --out "$OUT" --methods matched_factored matched
  DELTAMATCH_KERNEL_STORE_UNUSED=1 python3 tools/device/attn_profile.py --out "$OUT" --methods matched_factored \
    --tag store_unused
  stamp profile done
fi

if has quant; then  # the quantisation passes alone at D = 128, with the store diagnostics (which store costs what)
  python3 tools/device/kernel_sweep.py --out "$OUT" --quant-only --head-dims 128 2>&1 | tee "$OUT/quant.log" | tail -20
  stamp quant done
fi

if has memory; then  # the backward's peak extra memory at 16K and 64K (B 1, H 16, D 128), after one short timing row
  python3 -m deltamatch.kernels.bench --out "$OUT/memory" --head-dims 128 --seq-lens 8192 --causal-only --memory \
    --methods stale consistent matched matched_factored sdpa_cudnn_bf16 sdpa_flash_bf16 2>&1 | grep -v "shapes:" \
    | tee "$OUT/memory.log" | tail -12
  cat "$OUT/memory/kernel_memory.md" 2>/dev/null | tail -14
  stamp memory done
fi

if has sweep; then
  python3 tools/device/kernel_sweep.py --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | grep -v "^\[" | tee "$OUT/sweep.log" | tail -60
  stamp sweep done
fi

if has bench; then
  for d in 64 128 256; do for c in 0 1; do python3 tools/device/prewarm.py $d $c & done; done; wait
  stamp prewarmed
  if [[ $SIZE == quick ]]; then
    python3 -m deltamatch.kernels.bench --out "$OUT/bench" --head-dims 128 --seq-lens 4096 8192 16384 \
      --causal-only 2>&1 | grep -v "shapes:" | tee "$OUT/bench.log"
  else
    python3 -m deltamatch.kernels.bench --out "$OUT/bench" --memory --profile 2>&1 | grep -v "shapes:" \
      | tee "$OUT/bench.log"
    tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"  # six tables, one file back (the tool returns 8)
  fi
  stamp bench done
fi
