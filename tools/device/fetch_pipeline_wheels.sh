#!/usr/bin/env bash
# Download, here, the wheels the H200 image lacks for the whole pipeline (snakemake, lm-eval and their dependencies,
# fla, the cuDNN frontend) into .carry/ (git-ignored; tools/device/setup.sh installs .carry/*.whl there): every
# package of envs/pip-cpu.lock.txt not in tools/device/h200_image_packages.txt, for CPython 3.12 on x86-64.
# A call may carry 64 MiB in all; the script prints the total.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry
norm() { tr 'A-Z_.' 'a-z--'; }
have=$(grep -v '^#' tools/device/h200_image_packages.txt | norm)
grep -v -E '^(#|$)' envs/pip-cpu.lock.txt | while read -r spec; do
  name=$(echo "${spec%%==*}" | norm)
  if ! grep -qx "$name" <<<"$have"; then echo "$spec"; fi
done > .carry/needed.txt
echo "nvidia-cudnn-frontend==1.32.0" >> .carry/needed.txt
while read -r spec; do  # a wheel for CPython 3.12 on x86-64, else one built here from the sdist (pure Python)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .carry "$spec" 2>/dev/null \
    || python3 -m pip wheel -q --no-deps -w .carry "$spec" 2>/dev/null || echo "no wheel for $spec" >&2
done < .carry/needed.txt
echo "$(wc -l < .carry/needed.txt) packages; $(du -sh .carry | cut -f1) in .carry"
