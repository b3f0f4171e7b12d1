#!/bin/bash
# Prepared in session 39, not run yet (no device time left): one GPU call (~8 min) for the split-merge kernel
# that loads all splits of both decode launches at once (results/decode_merge_all_splits.patch:
# pallas_kernels/decode_merge.py, used by decode_kernel._run on the Mosaic path). Before the call, here:
#   bash benchmarks/prepare_patched_tree.sh decode_merge_all_splits    # then carry .gpu_run
# (1) the patch's GPU tests in the patched tree: the kernel against its float64 oracle, the decode tunings and
# ring logits through both kernels, generate's device loops; (2) e2e B=1 at 32K and 128K, main and the patch,
# one process each (bf16 in both). Merge the patch only if (1) passes and (2) is faster.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
(cd .gpu_run/decode_merge_all_splits && PYTHONPATH=. timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rA \
    tests/test_decode_merge.py tests/test_decode_kernel.py tests/test_generate.py \
    -k "merge or tunings or ring_logits or on_the_device" > "$OUT/merge_all_splits_gpu_tests.log" 2>&1)
echo "tests rc=$?"; tail -3 "$OUT/merge_all_splits_gpu_tests.log"
VARIANTS=$'.|bf16,hyquant|\n.gpu_run/decode_merge_all_splits|bf16,hyquant|' PREFIXES=32768,131072 STEPS=64 REPS=3 \
  RUN_LIMIT=180 NAME=e2e_merge_all_splits bash benchmarks/gpu_e2e_variants.sh
