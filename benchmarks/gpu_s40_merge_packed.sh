#!/bin/bash
# Session 40, one GPU call (~7 min; merged since, so the patch file is gone: on main it is pallas_kernels/decode_merge.py)
# the split-merge kernel, second version (results/decode_merge_packed.patch as it was then:
# the Mosaic kernel's o and (m, l) read as it writes them, no slices between the kernels; 8 channels a program;
# no load waits for the maxima). Before it, here: `bash benchmarks/prepare_patched_tree.sh decode_merge_packed`,
# then run with carry [".gpu_run"].
# (1) its GPU tests in the patched tree: the kernel against its float64 oracle, the decode tunings and ring logits
#     through both kernels, generate's device loops; (2) e2e B=1 at 32K and 128K, main and the patch, one process
#     each, one XLA autotune cache for both (the same GEMM kernels). Merge only if (1) passes and (2) is faster.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
(cd .gpu_run/decode_merge_packed && PYTHONPATH=. timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA \
    tests/test_decode_merge.py tests/test_decode_kernel.py tests/test_generate.py \
    -k "merge or tunings or ring_logits or on_the_device" > "$OUT/merge_packed_gpu_tests_s40.log" 2>&1)
echo "tests rc=$?"; tail -3 "$OUT/merge_packed_gpu_tests_s40.log"
VARIANTS=$'.|bf16,hyquant|\n.gpu_run/decode_merge_packed|bf16,hyquant|' PREFIXES=32768,131072 STEPS=64 REPS=3 \
  RUN_LIMIT=170 NAME=e2e_merge_packed_s40 bash benchmarks/gpu_e2e_variants.sh
