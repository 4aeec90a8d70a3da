#!/usr/bin/env bash
# Download, here (package registries are reachable), the wheels the H200 image lacks into .carry/ (git-ignored), for
# device calls made with carry: [".carry"]; tools/device/setup.sh installs them there. 64 MiB may travel per call.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry
for spec in flash-linear-attention==0.6.0 fla-core==0.6.0 nvidia-cudnn-frontend==1.32.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .carry "$spec"
done
du -sh .carry && ls .carry
