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
# FlashAttention's CuTe-DSL kernels (the fa4_cute_bf16 baseline), staged by tools/device/fetch_fa4.sh in folders
# .fa4a, .fa4b, ... that back-to-back calls carry: installed once every part MANIFEST counts is here (the wheels first,
# then the CUDA 13 libraries' files over them, then the source).
# The CUTLASS DSL finds its packages through a .pth file, which a PYTHONPATH folder does not run: its folder goes on
# PYTHONPATH by name.
fa4_parts() {  # the parts' paths in order, if every one is here
  local n i letters=(a b c d e f g h) paths=()
  n=$(sed -n 's/^parts \([0-9]*\)$/\1/p' .fa4b/MANIFEST 2>/dev/null)
  [[ -n $n ]] || return 1
  for (( i = 0; i < n; i++ )); do
    [[ -f .fa4${letters[$i]}/libs_cu13.tar.xz.$i ]] || return 1
    paths+=(".fa4${letters[$i]}/libs_cu13.tar.xz.$i")
  done
  echo "${paths[@]}"
}
if fa4_paths=$(fa4_parts); then
  [[ :${PYTHONPATH:-}: == *:/tmp/site:* ]] || export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
  if ! python3 -c "import flash_attn.cute" 2>/dev/null; then
    # shellcheck disable=SC2086  # the parts' paths, one word each
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .fa4b/*.whl && cat $fa4_paths | xz -d | tar x -C /tmp/site \
      && tar xJf .fa4b/flash_attn_cute.tar.xz -C /tmp/site && python3 -c "import flash_attn.cute" \
      && echo "flash-attn-4 staged: $(head -1 .fa4b/MANIFEST)" || echo "flash-attn-4: staging failed (see above)"
  fi
elif [[ -d .fa4a || -d .fa4b ]]; then
  echo "flash-attn-4: not every part of .fa4a, .fa4b, ... is here yet (MANIFEST's parts); not installed"
fi
# The CUDA library carried packed (build/cuda.xz: tools/device/pack_library.sh, 2.8 MB where the library is 30) is
# unpacked into build/cuda, where cuda_lib looks for it, unless the one there has its stamp (carry one or the other:
# a packed one left by an earlier call on this machine would replace a library carried unpacked).
if [[ -f build/cuda.xz/libdm_attn_sm90.so.xz ]] && \
   ! cmp -s build/cuda.xz/libdm_attn_sm90.so.stamp build/cuda/libdm_attn_sm90.so.stamp 2>/dev/null; then
  mkdir -p build/cuda && xz -dc build/cuda.xz/libdm_attn_sm90.so.xz > build/cuda/libdm_attn_sm90.so.tmp \
    && mv build/cuda/libdm_attn_sm90.so.tmp build/cuda/libdm_attn_sm90.so \
    && cp build/cuda.xz/libdm_attn_sm90.so.stamp build/cuda/libdm_attn_sm90.so.stamp \
    && echo "CUDA library unpacked from build/cuda.xz ($(cut -c1-12 build/cuda/libdm_attn_sm90.so.stamp))"
fi
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/install.log" 2>&1; then
  mkdir -p /tmp/shim/deltamatch && cp deltamatch/__init__.py /tmp/shim/deltamatch/
  for sub in kernels models evals reports; do ln -sfn "$PWD/$sub" "/tmp/shim/deltamatch/$sub"; done
  export PYTHONPATH=/tmp/shim${PYTHONPATH:+:$PYTHONPATH}
  echo "pip install -e . failed; using the PYTHONPATH shim" | tee -a "$OUT/install.log"
fi
python3 -c "import importlib.util, torch, triton; fla = importlib.util.find_spec('fla') and __import__('fla'); print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__ if fla else '(not carried)', torch.cuda.get_device_name())"
# The machine's .git may predate the commit sent (the tree is copied, the history not always): every table written here
# names DM_COMMIT where the command sets it (deltamatch/provenance.py), else that older HEAD.
[[ -n ${DM_COMMIT:-} ]] || echo "DM_COMMIT unset: tables written here name this copy's git HEAD," \
  "$(git rev-parse --short HEAD 2>/dev/null || echo unknown), which may predate the commit sent"
