#!/bin/bash
# Build an overlay of the repository for one GPU call: .gpu_run/overlay/PATH is PATH with
# benchmarks/results/NAME.patch applied, for every file the patch touches (the patch is a diff against main).
# Run on this machine, from the repository root, before the call, then carry .gpu_run to it; a GPU script
# (e.g. benchmarks/gpu_overlay_ab.sh) copies the overlay over the tree for its "after" runs:
#   bash benchmarks/prepare_overlay.sh decode_ring_logits
set -euo pipefail
patch_file="benchmarks/results/$1.patch"
rm -rf .gpu_run/overlay
mkdir -p .gpu_run/overlay
for path in $(sed -n 's|^+++ b/||p' "$patch_file"); do
  mkdir -p ".gpu_run/overlay/$(dirname "$path")"
  if [ -e "$path" ]; then cp "$path" ".gpu_run/overlay/$path"; fi  # a file the patch creates has no copy yet
done
patch -s -p1 -d .gpu_run/overlay < "$patch_file"
find .gpu_run/overlay -type f | sort
