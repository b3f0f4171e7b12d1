#!/bin/bash
# Session 43's GPU calls (one H200 each; run with carry [".gpu_run"] after
# `bash benchmarks/prepare_patched_tree.sh fused_qkv_probe`).
# PART=1 (~7 min): the graph profile of the hyquant B=1 32K step as it runs since session 42
#   (benchmarks/gpu_next_s43.sh PART=a), then the fused q/k/v probe against main at 32K, the probe's
#   process first (session 42's order effect: the first process tends to be slower), and the check that XLA
#   hoists the probe's weight concatenation out of the decode loop (gpu_next_s42.sh PART=b's second half).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-1}" = 1 ]; then
  PART=a bash benchmarks/gpu_next_s43.sh
  VARIANTS=$'.gpu_run/fused_qkv_probe|bf16,hyquant|\n.|bf16,hyquant|' PREFIXES=32768 STEPS=64 REPS=3 \
    RUN_LIMIT=150 NAME=e2e_fused_qkv_probe_s43 bash benchmarks/gpu_e2e_variants.sh
fi
# PART=2 (~5 min): the fused q/k/v probe against main at 32K again, four processes in the order main, probe,
#   main, probe (PART=1's pair gave probe 5.42 / main 5.62 ms with main second; one order is not enough).
if [ "${PART:-1}" = 2 ]; then
  VARIANTS=$'.|bf16,hyquant|\n.gpu_run/fused_qkv_probe|bf16,hyquant|\n.|hyquant|\n.gpu_run/fused_qkv_probe|hyquant|' \
    PREFIXES=32768 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_fused_qkv_probe2_s43 bash benchmarks/gpu_e2e_variants.sh
fi
# PART=3 (~9 min): fused q/k/v weights (LayerParams.wqkv, this session) against the tree before them
#   (.gpu_run/before_fused_qkv: `git archive` of the commit before, as the summary in benchmarks/NOTES.md says),
#   B=1 at 32K and 128K, in the order before, new, before, new; first the GPU tests of the model code.
if [ "${PART:-1}" = 3 ]; then
  PYTHONPATH=. timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_models.py \
    > "$OUT/fused_qkv_gpu_tests_s43.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/fused_qkv_gpu_tests_s43.log"
  VARIANTS=$'.gpu_run/before_fused_qkv|bf16,hyquant|\n.|bf16,hyquant|\n.gpu_run/before_fused_qkv|hyquant|\n.|hyquant|' \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=170 NAME=e2e_fused_qkv_s43 bash benchmarks/gpu_e2e_variants.sh
fi
# PART=4 (~7 min): the Mosaic kernel prepares the step's bf16 q itself (`low_bit_splits(..., query_scale=...)`,
#   this session) instead of an XLA conversion launch before it: its GPU tests, then B=1 32K against the tree
#   before it (.gpu_run/before_query_prep, `git archive` of 647bfa0), order before, new, before, new.
if [ "${PART:-1}" = 4 ]; then
  PYTHONPATH=. timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_decode_mgpu.py \
    tests/test_decode_kernel.py -k "mgpu or prepared or oracle or new_token or ring_logits or gpu_tunings" \
    > "$OUT/query_prep_gpu_tests_s43.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/query_prep_gpu_tests_s43.log"
  VARIANTS=$'.gpu_run/before_query_prep|bf16,hyquant|\n.|bf16,hyquant|\n.gpu_run/before_query_prep|hyquant|\n.|hyquant|' \
    PREFIXES=32768 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_query_prep_s43 bash benchmarks/gpu_e2e_variants.sh
fi
# PART=5 (~5.5 min): the B=1 table with this session's code (fused q/k/v, the q prepared in the Mosaic kernel):
#   bf16 and hyquant at 1K / 8K / 32K / 128K in one process, then hyquant at 32K / 128K in a second one (the
#   spread between processes, benchmarks/NOTES.md session 41).
if [ "${PART:-1}" = 5 ]; then
  PYTHONPATH=. timeout 330 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s43_b1 --sections b1 --methods bf16,hyquant \
    --prefixes 1024,8192,32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_s43_b1.log" 2>&1
  echo "table rc=$?"; grep -A12 "^B=1" "$OUT/e2e_s43_b1.log" | tail -12
  PYTHONPATH=. timeout ${SECOND_LIMIT:-120} python3 benchmarks/e2e.py --out "$OUT" --name e2e_s43_b1_second --sections b1 \
    --methods hyquant --prefixes 32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_s43_b1_second.log" 2>&1
  echo "second rc=$?"; grep -A6 "^B=1" "$OUT/e2e_s43_b1_second.log" | tail -6
fi
