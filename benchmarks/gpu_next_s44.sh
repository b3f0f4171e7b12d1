#!/bin/bash
# Prepared in session 43 for the next GPU session; one call each. Before PART=a, here:
#   mkdir -p .gpu_run/before_fused_qkv && git archive 1370b99 hyquant_jax models pallas_kernels benchmarks tests \
#     pyproject.toml | tar -x -C .gpu_run/before_fused_qkv --exclude=benchmarks/results
#   (and copy benchmarks/decode_memory.py into it: it is newer than that commit), then run with carry [".gpu_run"].
# PART=a (~5 min): the ~1.1 GiB rise of the B=1 hyquant process's peak memory with the fused q/k/v weights
#   (benchmarks/NOTES.md, session 43). The compiled decode's own memory and the large buffers XLA keeps outside
#   its loops (a hoisted weight copy or slice would show), for main and the tree before the fused weights, hyquant
#   and bf16 at 32K (benchmarks/decode_memory.py; shapes only, nothing is allocated).
# PART=b (~8 min): the batch rows at 32K with this session's code (hyquant B=76, the largest that fitted in
#   session 26, and B=74, bf16 B=25; e2e.py now also writes decode_temp_bytes and peak_after_init_bytes), for the
#   best-throughput and largest-batch targets (2.53x and 76 vs 25 before the fused weights).
# PART=c (~3 min): fewer Mosaic splits at B=1. Session 20's sweep (the kernel alone) got faster with every
#   halving it tried: B1 32K 132 / 66 / 44 / 33 splits 0.0518 / 0.0396 / 0.0370 / 0.0352 ms, 128K 132 / 66 / 33
#   0.0998 / 0.0920 / 0.0862, and `default_splits` stopped at 2 blocks per multiprocessor (33 splits at B=1);
#   1 block per multiprocessor (17 splits) was never timed. The whole decode, default first and last.
# PART=d (~7 min): the same end to end (`e2e.py --mosaic-blocks-per-sm 1`, HybridAttention.decode_tuning since
#   session 43), B=1 32K and 128K, order default, 1, default, 1. Change `DecodeTuning.mosaic_blocks_per_sm` (and
#   `default_splits`' docstring and tests) only if 1 wins in both orders.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-a}" = a ]; then
  for tree in . .gpu_run/before_fused_qkv; do
    tag=$([ "$tree" = . ] && echo main || echo before)
    for method in hyquant bf16; do
      (cd "$tree" && PYTHONPATH=. timeout 150 python3 benchmarks/decode_memory.py --method $method --prefix 32768 \
          --out "$OUT/$tag") > "$OUT/decode_memory_${tag}_${method}.log" 2>&1
      echo "$tag $method rc=$?"; tail -6 "$OUT/decode_memory_${tag}_${method}.log"
    done
  done
elif [ "${PART:-a}" = c ]; then
  PYTHONPATH=. timeout 280 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_b1_fewer_splits_s44 \
    --cases 'qwen3-8b B1 32K,qwen3-8b B1 128K' \
    --compare-tunings ';mosaic_per_sm=1;mosaic_splits=22;mosaic_splits=25;' > "$OUT/decode_b1_fewer_splits_s44.log" 2>&1
  echo "splits rc=$?"; tail -14 "$OUT/decode_b1_fewer_splits_s44.log" | cut -c1-200
elif [ "${PART:-a}" = d ]; then
  VARIANTS=$'.|bf16,hyquant|\n.|hyquant||--mosaic-blocks-per-sm 1\n.|hyquant|\n.|hyquant||--mosaic-blocks-per-sm 1' \
    PREFIXES=32768,131072 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_blocks_per_sm_s44 bash benchmarks/gpu_e2e_variants.sh
else
  PYTHONPATH=. timeout 280 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_batch_hyquant --sections batch \
    --methods hyquant --batches 74,76 --no-until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s44_batch_hyquant.log" 2>&1
  echo "hyquant rc=$?"; tail -8 "$OUT/e2e_s44_batch_hyquant.log"
  PYTHONPATH=. timeout 150 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s44_batch_bf16 --sections batch \
    --methods bf16 --batches 25 --no-until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s44_batch_bf16.log" 2>&1
  echo "bf16 rc=$?"; tail -6 "$OUT/e2e_s44_batch_bf16.log"
fi
