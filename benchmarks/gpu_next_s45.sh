#!/bin/bash
# Prepared in session 44 for the next GPU session; one call each (session 44's calls: benchmarks/gpu_s44.sh).
# PART=a (~3 min): the Mosaic kernel alone at B=1 with a balanced single wave. Session 44's
#   `--mosaic-blocks-per-sm 1` was much slower end to end (e2e_blocks_per_sm_s44.json), but it launched ceil(132 / 8)
#   = 17 splits, 136 blocks on 132 multiprocessors (4 of them run two). 16 splits (128 blocks) were never timed;
#   24 and 33 (the default, 264 = 2 x 132 blocks) for comparison, at B1 32K and 128K, default first and last.
#   Then B16 32K, where `default_splits`' ceil(264 / 128) = 3 splits launch 384 blocks (2 or 3 a multiprocessor)
#   against 2 splits, 256 blocks (the floor); session 20's "2 per SM beat 4 and 8" compared 3, 6 and 11 there.
# PART=b (~7 min): the same end to end (`e2e.py --mosaic-splits 16`), B=1 32K and 128K, order default, 16,
#   default, 16. Change `default_splits` (floor: the largest split count whose blocks fit sms x per_sm, and per_sm
#   1 at B=1 if 16 wins) only if it wins in both orders, and re-run its tests.
# PART=c (~8 min): the window flush with all layers' block quantization stacked (results/flush_stacked.patch:
#   `flush_full_rings` computes the blocks' top-k, reorder and quantization once, vmapped over the layers while
#   the stacked blocks stay under 64 MiB, and only the writes per layer; bit-identical caches in its CPU test).
#   Before the call: `bash benchmarks/prepare_patched_tree.sh flush_stacked`, carry [".gpu_run"]. First the
#   launches of the outer loop body (decode_memory.py, 4 layers: main vs patch), then e2e B=1 at 1K and 32K,
#   order main, patch, main, patch (~3 ms every 64 steps before). On the CPU (interpret mode, decode_memory.py
#   at 4 and 8 layers, results/decode_memory_cpu_s44_{main,stacked}_{4,8}layers.json) the flush branch has 57
#   launches a layer on main and 38 with the patch: the ~10 writes a
#   layer stay, so expect ~1/3 of the flush's ~0.05 ms a step, if the GPU's fusion counts scale the same way.
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
else
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant||--mosaic-splits 16\n.|hyquant|\n.|hyquant||--mosaic-splits 16' \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_splits16_s45 bash benchmarks/gpu_e2e_variants.sh
fi
