#!/usr/bin/env bash
# One device call for the kernel work: install, GPU tests, benchmark; logs and tables under $OUT.
# Usage (from the repo root, on the H200): bash tools/device/kernel_gpu.sh STAGES [quick|full]
#   STAGES: comma-separated of tests, sweep, bench (or all = tests,bench)
set -uo pipefail
WHAT=${1:-all}
SIZE=${2:-quick}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }

# nvidia-cudnn-frontend travels as a wheel in .carry (no network on the device machine)
if ls .carry/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1; then
  # fallback: a deltamatch package made of links to the top-level folders
  mkdir -p /tmp/shim/deltamatch && cp deltamatch/__init__.py /tmp/shim/deltamatch/
  for sub in kernels models evals reports; do ln -sfn "$PWD/$sub" "/tmp/shim/deltamatch/$sub"; done
  export PYTHONPATH=/tmp/shim${PYTHONPATH:+:$PYTHONPATH}
  echo "pip install -e . failed; using the PYTHONPATH shim" | tee -a "$OUT/install.log"
fi
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1 | tail -1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
stamp installed

[[ $WHAT == all ]] && WHAT=tests,bench
has() { [[ ",$WHAT," == *",$1,"* ]]; }

if has tests; then
  python3 -m pytest -q -p no:cacheprovider -n 8 -rfE --durations=8 \
    tests/kernels/test_triton_gpu.py tests/kernels/test_cudnn_fp8.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
  stamp tests done
fi

if has sweep; then
  python3 tools/device/kernel_sweep.py --out "$OUT" 2>&1 | grep -v "^\[" | tee "$OUT/sweep.log" | tail -60
  stamp sweep done
fi

if has bench; then
  for d in 64 128 256; do for c in 0 1; do python3 tools/device/prewarm.py $d $c & done; done; wait
  stamp prewarmed
  if [[ $SIZE == quick ]]; then
    python3 -m deltamatch.kernels.bench --out "$OUT/bench" --head-dims 128 --seq-lens 4096 8192 16384 \
      --causal-only 2>&1 | grep -v "shapes:" | tee "$OUT/bench.log"
  else
    python3 -m deltamatch.kernels.bench --out "$OUT/bench" --memory 2>&1 | grep -v "shapes:" | tee "$OUT/bench.log"
  fi
  stamp bench done
fi
