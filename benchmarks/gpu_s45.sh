#!/bin/bash
# Session 45's GPU calls (one H200 each; results in benchmarks/results/*_s45*, read in benchmarks/NOTES.md, session 45).
# Prepared in session 44 as gpu_next_s45.sh; PART=a and c ran in one call (call 1), PART=b was not run (the kernel
# alone already lost with 16 splits), PART=2-4 were added during the session.
# PART=a (call 1): the Mosaic kernel alone at B=1 with 16 and 24 splits against the default 33 (264 blocks, 2 a
#   multiprocessor), B1 32K and 128K, default first and last; then B16 32K with 2 splits (256 blocks) against the
#   default 3 (decode_b1_balanced_splits_s45.json, decode_b16_floor_splits_s45.json).
# PART=b (not run): the same end to end, `e2e.py --mosaic-splits 16`.
# PART=c (call 1): the stacked window flush (results/flush_stacked.patch, merged after call 4). Before the call:
#   `bash benchmarks/prepare_patched_tree.sh flush_stacked`, carry [".gpu_run"]. decode_memory.py at 4 layers
#   (main vs patch), then e2e B=1 at 1K and 32K, order main, patch, main, patch (e2e_flush_stacked_s45.json;
#   its first variant, bf16 + hyquant in one process, ran past its 110 s limit).
# PART=2 (call 2): device-loop iterations of 2 and 4 steps (results/decode_loop_unroll.patch, DEVICE_LOOP_UNROLL
#   = 2 / 4 in trees .gpu_run/unroll2 and .gpu_run/unroll4: `bash benchmarks/prepare_patched_tree.sh` does not
#   set the constant; the session built them by hand). e2e_unroll_s45.{json,log}; the call's 585 s limit ended
#   it during variant 7, so the JSON was merged from the per-variant files afterwards.
# PART=3 (call 3): runs of the usual length as loops of known trip count, driven from the host
#   (results/decode_fixed_runs_host.patch in .gpu_run/fixed_host), e2e_fixed_host_s45.json.
# PART=4 (call 4): the stacked flush again at 32K, order patch, main, patch, main (e2e_flush_stacked2_s45.json).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-a}" = a ]; then
  PYTHONPATH=. timeout 280 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_b1_balanced_splits_s45 \
    --cases 'qwen3-8b B1 32K,qwen3-8b B1 128K' \
    --compare-tunings ';mosaic_splits=16;mosaic_splits=24;' > "$OUT/decode_b1_balanced_splits_s45.log" 2>&1
  echo "splits rc=$?"; tail -14 "$OUT/decode_b1_balanced_splits_s45.log" | cut -c1-200
  PYTHONPATH=. timeout 150 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_b16_floor_splits_s45 \
    --cases 'qwen3-8b B16 32K' --compare-tunings ';mosaic_splits=2;' > "$OUT/decode_b16_floor_splits_s45.log" 2>&1
  echo "b16 rc=$?"; tail -8 "$OUT/decode_b16_floor_splits_s45.log" | cut -c1-200
elif [ "${PART:-a}" = c ]; then
  for tree in . .gpu_run/flush_stacked; do
    (cd "$tree" && PYTHONPATH=. timeout 90 python3 benchmarks/decode_memory.py --method hyquant --prefix 32768 \
        --layers 4 --out "$OUT/memory_$(basename $tree)") > "$OUT/decode_memory_flush_$(basename $tree).log" 2>&1
    echo "$tree rc=$?"; grep -A3 "^copies" "$OUT/decode_memory_flush_$(basename $tree).log"
  done
  VARIANTS=$'.|bf16,hyquant|\n.gpu_run/flush_stacked|hyquant|\n.|hyquant|\n.gpu_run/flush_stacked|hyquant|' \
    PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=110 NAME=e2e_flush_stacked_s45 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-a}" = b ]; then
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant||--mosaic-splits 16\n.|hyquant|\n.|hyquant||--mosaic-splits 16' \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_splits16_s45 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-a}" = 2 ]; then
  VARIANTS=$'.|bf16|\n.|hyquant|\n.gpu_run/unroll2|hyquant|\n.gpu_run/unroll4|hyquant|\n.|hyquant|\n.gpu_run/unroll2|hyquant|\n.gpu_run/unroll4|hyquant|\n.gpu_run/unroll4|bf16,hyquant||--stop-token\n.|bf16,hyquant||--stop-token' \
    PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=130 NAME=e2e_unroll_s45 timeout 585 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-a}" = 3 ]; then
  VARIANTS=$'.|bf16,hyquant|\n.gpu_run/fixed_host|hyquant|\n.|hyquant|\n.gpu_run/fixed_host|hyquant|' \
    PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_fixed_host_s45 timeout 500 bash benchmarks/gpu_e2e_variants.sh
elif [ "${PART:-a}" = 4 ]; then
  VARIANTS=$'.gpu_run/flush_stacked|hyquant|\n.|hyquant|\n.gpu_run/flush_stacked|hyquant|\n.|hyquant|' \
    PREFIXES=32768 STEPS=64 REPS=3 RUN_LIMIT=80 NAME=e2e_flush_stacked2_s45 timeout 260 bash benchmarks/gpu_e2e_variants.sh
fi
