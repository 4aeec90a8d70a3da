#!/usr/bin/env bash
# Stage, here, FlashAttention's CuTe-DSL kernels (flash-attn-4: `flash_attn.cute`, FA3's Hopper design on sm90) for the
# H200, where `dm-kernel-bench` times them as the FA3-class BF16 baseline `fa4_cute_bf16` (kernels/bench.py).
#
#   bash tools/device/fetch_fa4.sh REPO [REV]
#
# REPO: a clone of Dao-AILab/flash-attention (a bare one will do: the `fetch` tool's mirror), REV its revision
# (default HEAD). flash-attn-4 is not on the package registries this machine reaches, so its pure-Python source comes
# from REPO (`git archive REV flash_attn/cute`, with an empty `flash_attn/__init__.py` so the package imports without
# FlashAttention-2's extension); its needs come from the registries (the H200 image has torch, einops, cuda-bindings,
# protobuf, typing-extensions): nvidia-cutlass-dsl with its base, core (the `cutlass` Python package: `cutlass.cute`)
# and CUDA 13 libraries, apache-tvm-ffi, torch-c-dlpack-ext, quack-kernels.
#
# The CUDA 13 library wheel is 92 MB and a device call carries 64 MiB with the working tree, so it travels in calls
# made back to back on one warm machine (a carried ignored folder stays there until the machine goes back): its files,
# recompressed with xz (≈ 61 MiB), split into parts. .fa4a/ holds the first, sized so that the first call also fits
# the working tree and CALL1_CARRY (default: build/cuda.xz, the CUDA library packed by pack_library.sh; add .carry for
# cuDNN FP8 and fla); .fa4b/ the other wheels, the source, MANIFEST (its last line "parts N") and the second part;
# .fa4c/ and on the rest, each sized to travel with the tree alone. tools/device/setup.sh installs them into /tmp/site
# once every part is there. The folders are git-ignored. Prints each call's size against the limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=${1:?usage: fetch_fa4.sh REPO [REV]}
rev=${2:-HEAD}
limit=$((64 * 1024 * 1024))
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
rm -rf .fa4?
mkdir -p .fa4a .fa4b "$stage/wheels" "$stage/libs" "$stage/src/flash_attn"

git -C "$repo" archive --format=tar "$rev" flash_attn/cute | tar x -C "$stage/src"
: > "$stage/src/flash_attn/__init__.py"
commit=$(git -C "$repo" rev-parse "$rev")
tar c -C "$stage/src" flash_attn | xz -9 > .fa4b/flash_attn_cute.tar.xz

for spec in nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
            nvidia-cutlass-dsl-libs-cu13==4.8.1 "apache-tvm-ffi>=0.1.12,<0.2" torch-c-dlpack-ext==0.1.5 \
            quack-kernels==0.6.5; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$stage/wheels" "$spec"
done
libs=$(ls "$stage"/wheels/nvidia_cutlass_dsl_libs_cu13-*.whl)
(cd "$stage/libs" && python3 -m zipfile -e "$libs" .)
rm "$libs"
cp "$stage"/wheels/*.whl .fa4b/
echo "xz of the CUDA 13 libraries (a few minutes)"
tar c -C "$stage/libs" . | xz -9e -T2 > "$stage/libs_cu13.tar.xz"

# sizes on disk (KiB blocks, as the device tool counts a call's 64 MiB: a tree of many small files takes more than
# their bytes)
bytes() { du -sk "$@" 2>/dev/null | awk '{s += $1} END {print s * 1024}'; }
tree=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- | tail -1 | cut -f1)
tree=$((tree * 1024))  # what travels
call1_extra=$(bytes ${CALL1_CARRY:-build/cuda.xz})
room=$((limit - tree - 1024 * 1024))  # a call's room beside the tree, 1 MiB to spare
total=$(bytes "$stage/libs_cu13.tar.xz")
# the parts' sizes: .fa4a's beside CALL1_CARRY, .fa4b's beside the wheels and the source (MANIFEST: 4 KB), then a
# whole call's room each
sizes=($((room - call1_extra)) $((room - $(bytes .fa4b) - 4096)))
(( sizes[0] > 0 && sizes[1] > 0 )) || { echo "no room for a part: tree $tree, CALL1_CARRY $call1_extra bytes" >&2; exit 1; }
left=$((total - sizes[0] - sizes[1]))
while (( left > 0 )); do sizes+=("$room"); left=$((left - room)); done
letters=(a b c d e f g h)
parts=0 offset=0
while (( offset < total )); do
  (( parts < ${#letters[@]} )) || { echo "more parts than the folders .fa4a .. .fa4h" >&2; exit 1; }
  mkdir -p ".fa4${letters[$parts]}"
  dd if="$stage/libs_cu13.tar.xz" of=".fa4${letters[$parts]}/libs_cu13.tar.xz.$parts" bs=1M status=none \
    iflag=skip_bytes,count_bytes skip="$offset" count="${sizes[$parts]}"
  offset=$((offset + sizes[parts])) parts=$((parts + 1))
done
{
  echo "flash-attention $commit (flash_attn/cute); $(cd .fa4b && ls *.whl | tr '\n' ' ')"
  echo "nvidia-cutlass-dsl-libs-cu13 4.8.1 as libs_cu13.tar.xz.0 .. .$((parts - 1)) in .fa4a .. .fa4${letters[$((parts - 1))]}" \
    "($total bytes, sha256 $(sha256sum "$stage/libs_cu13.tar.xz" | cut -d' ' -f1))"
  echo "parts $parts"
} > .fa4b/MANIFEST
over=0
for (( i = 0; i < parts; i++ )); do  # each call as the device counts it (carry_size.sh)
  echo "call $((i + 1)):"
  # shellcheck disable=SC2086  # CALL1_CARRY: paths, one word each
  bash tools/device/carry_size.sh $( (( i == 0 )) && echo "${CALL1_CARRY:-build/cuda.xz}") ".fa4${letters[$i]}" \
    | tail -1 || over=1
done
(( over == 0 )) || { echo "a call is over the limit" >&2; exit 1; }
echo "send the calls back to back on one warm machine (its 30 s idle window); setup.sh installs once all are there"
cat .fa4b/MANIFEST
