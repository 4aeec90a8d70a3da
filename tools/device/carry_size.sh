#!/usr/bin/env bash
# What a device call would send: the working tree (tracked and untracked-not-ignored files) and the carry paths given,
# on disk in KiB blocks (as the device tool counts its 64 MiB), against that limit; exit 1 when over.
#   bash tools/device/carry_size.sh build/cuda.xz .carry [.fa4a ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$((64 * 1024))  # KiB
tree=$(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- | tail -1 | cut -f1)
total=$tree
printf '%-40s %8d KiB\n' "the tree" "$tree"
for path in "$@"; do
  [[ -e $path ]] || { echo "$path: not here (the device would remove it there)" >&2; continue; }
  size=$(du -sk "$path" | cut -f1)
  total=$((total + size))
  printf '%-40s %8d KiB\n' "$path" "$size"
done
printf '%-40s %8d KiB of %d (%s)\n' "total" "$total" "$limit" "$( (( total <= limit )) && echo fits || echo OVER)"
(( total <= limit ))
