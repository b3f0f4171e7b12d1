#!/bin/bash
# Build variants of the Mosaic decode kernel for one GPU call: .gpu_run/variants/NAME.py is
# pallas_kernels/decode_mgpu.py with benchmarks/results/decode_mgpu_NAME.patch applied (the patches are diffs
# against main's module). Run on this machine, from the repository root, before the call, then carry
# .gpu_run (git-ignored through .git/info/exclude) to it:
#   bash benchmarks/prepare_decode_variants.sh fewer_instructions fewer_instructions_128_registers \
#       fewer_instructions_key_shifts_128_registers
set -euo pipefail
mkdir -p .gpu_run/variants
for name in "$@"; do
  patch -s -p1 -o ".gpu_run/variants/$name.py" pallas_kernels/decode_mgpu.py < "benchmarks/results/decode_mgpu_$name.patch"
  echo ".gpu_run/variants/$name.py"
done
