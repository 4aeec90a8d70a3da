# Sourced by the device scripts: makes deltamatch importable on the H200 image (no network there).
# Carried wheels (.carry/*.whl: flash-linear-attention, fla-core, nvidia-cudnn-frontend) go to /tmp/site.
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# Triton's cache (fla's compiled kernels and, with fla's cache_results, its autotuning choices) in the working tree's
# git-ignored .cache/: a later call on the same warm machine finds it there instead of recompiling for ~4 minutes.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.cache/triton}
export PATH=/tmp/site/bin:$PATH  # console scripts of the carried wheels (snakemake)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .carry/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1; then
  mkdir -p /tmp/shim/deltamatch && cp deltamatch/__init__.py /tmp/shim/deltamatch/
  for sub in kernels models evals reports; do ln -sfn "$PWD/$sub" "/tmp/shim/deltamatch/$sub"; done
  export PYTHONPATH=/tmp/shim${PYTHONPATH:+:$PYTHONPATH}
  echo "pip install -e . failed; using the PYTHONPATH shim" | tee -a "$OUT/install.log"
fi
python3 -c "import importlib.util, torch, triton; fla = importlib.util.find_spec('fla') and __import__('fla'); print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__ if fla else '(not carried)', torch.cuda.get_device_name())"
