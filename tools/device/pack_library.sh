#!/usr/bin/env bash
# Packs the CUDA library for a device call: build/cuda/libdm_attn_sm90.so (≈ 30 MB, 158 kernels) xz-compressed into
# build/cuda.xz/ (≈ 2.8 MB) with its stamp, so that it travels beside .carry and the flash-attn-4 parts within a call's
# 64 MiB (carry "build/cuda.xz" instead of the library and its stamp); tools/device/setup.sh unpacks it on the device.
# Repacks only when the stamp changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib=build/cuda/libdm_attn_sm90.so
[[ -f $lib && -f $lib.stamp ]] || { echo "no $lib (or its stamp): build it first (dm-cuda-build)" >&2; exit 1; }
mkdir -p build/cuda.xz
if cmp -s "$lib.stamp" build/cuda.xz/libdm_attn_sm90.so.stamp && [[ -f build/cuda.xz/libdm_attn_sm90.so.xz ]]; then
  echo "build/cuda.xz is current ($(cut -c1-12 "$lib.stamp"))"
  exit 0
fi
xz -T2 -6 -c "$lib" > build/cuda.xz/libdm_attn_sm90.so.xz.tmp
mv build/cuda.xz/libdm_attn_sm90.so.xz.tmp build/cuda.xz/libdm_attn_sm90.so.xz
cp "$lib.stamp" build/cuda.xz/libdm_attn_sm90.so.stamp.tmp
mv build/cuda.xz/libdm_attn_sm90.so.stamp.tmp build/cuda.xz/libdm_attn_sm90.so.stamp
echo "packed: $(du -b build/cuda.xz/libdm_attn_sm90.so.xz | cut -f1) bytes from $(du -b "$lib" | cut -f1)"
