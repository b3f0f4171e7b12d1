#!/bin/bash
# Session 39, call 1 (~6 min). Session 31's fused merge, rebased onto main (results/decode_fused_merge_s39.patch;
# `bash benchmarks/prepare_patched_tree.sh decode_fused_merge_s39` builds .gpu_run/decode_fused_merge_s39, carry
# it): the Triton launch's last program per (sequence, KV head) merges all splits, its own and the Mosaic
# kernel's, and adds the ring scores, replacing ~8 XLA fusions a layer. Session 31 timed it before CONCURRENT
# scheduling and device-side loops; session 36's graph profile now shows the merge chain (~7 us) and the
# ring-score fusion (~6 us, ahead of the next layer's projection) on each layer's critical path. (1) its GPU
# tests in the patched tree; (2) e2e B=1 at 32K and 128K, main and the patch, one process each.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
(cd .gpu_run/decode_fused_merge_s39 && PYTHONPATH=. timeout 170 python3 -m pytest -m gpu tests/test_decode_kernel.py -q \
    -p no:cacheprovider -rA -k "fused or ring_logits" > "$OUT/fused_merge_gpu_tests_s39.log" 2>&1)
echo "tests rc=$?"; tail -3 "$OUT/fused_merge_gpu_tests_s39.log"
VARIANTS=$'.|bf16,hyquant|\n.gpu_run/decode_fused_merge_s39|bf16,hyquant|' PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=200 \
  NAME=e2e_fused_merge_s39 bash benchmarks/gpu_e2e_variants.sh
