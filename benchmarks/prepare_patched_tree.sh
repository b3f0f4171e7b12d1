#!/bin/bash
# Build .gpu_run/NAME: the library, models, kernels, benchmark scripts and tests of HEAD with
# benchmarks/results/NAME.patch applied (results left out), for one GPU call that runs main and the patch side
# by side (carry .gpu_run; `gpu_e2e_variants.sh` runs a variant from it with TREE=.gpu_run/NAME):
#   bash benchmarks/prepare_patched_tree.sh merge_fewer_fusions
set -euo pipefail
name=$1
rm -rf ".gpu_run/$name"
mkdir -p ".gpu_run/$name"
git archive HEAD hyquant_jax models pallas_kernels benchmarks tests pyproject.toml \
  | tar -x -C ".gpu_run/$name" --exclude=benchmarks/results
(cd ".gpu_run/$name" && patch -s -p1 < "../../benchmarks/results/$name.patch")
du -sh ".gpu_run/$name"
