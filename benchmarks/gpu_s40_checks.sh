#!/bin/bash
# Session 40, one GPU call (~9 min). Before it, here: `bash benchmarks/prepare_patched_tree.sh
# decode_merge_all_splits`, then run with carry [".gpu_run"].
# (1) Graph profile of the hyquant B=1 32K step with the split-merge kernel (results/decode_merge_all_splits.patch):
#     its e2e A/B (e2e_merge_all_splits_s40.json) gained ~0.04 ms a step where the XLA merge's ~10.8 us a layer
#     predicted ~0.3; where did the time go?
# (2) Graph profile of main's hyquant B=1 step at 128K: the Mosaic kernel's time in the step there.
# (3) The batch sweep's best and largest batches at 32K with today's code (session 33's rows predate the
#     device loops and the launch order): bf16 B=25, hyquant B=25, 74, 76.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
(cd .gpu_run/decode_merge_all_splits && XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. \
  timeout 200 python3 benchmarks/profile_e2e.py --out "$OUT" --name profile_graphs_merge_kernel_s40 --methods hyquant \
  --prefixes 32768 --steps 16 --top 30 --dump-events > "$OUT/profile_graphs_merge_kernel_s40.log" 2>&1)
echo "profile merge kernel rc=$?"
XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. timeout 200 python3 \
  benchmarks/profile_e2e.py --out "$OUT" --name profile_graphs_128k_s40 --methods hyquant --prefixes 131072 \
  --steps 16 --top 30 --dump-events > "$OUT/profile_graphs_128k_s40.log" 2>&1
echo "profile 128K rc=$?"
PYTHONPATH=. timeout 100 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s40_batch_bf16 --sections batch \
  --methods bf16 --batches 25 --no-until-oom --steps 64 --reps 2 --no-plot > "$OUT/e2e_s40_batch.log" 2>&1
echo "batch bf16 rc=$?"
PYTHONPATH=. timeout 220 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s40_batch_hyquant --sections batch \
  --methods hyquant --batches 25,74,76 --no-until-oom --steps 64 --reps 2 --no-plot >> "$OUT/e2e_s40_batch.log" 2>&1
echo "batch hyquant rc=$?"
grep -A8 "^batch sweep" "$OUT/e2e_s40_batch.log"
ls -la "$OUT"
