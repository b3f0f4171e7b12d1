#!/bin/bash
# Session 46's GPU calls (one H200 each; benchmarks/NOTES.md, session 46).
# Call 1: `PART=a bash benchmarks/gpu_next_s46.sh`, the B=1 table (results/e2e_s46_b1.{json,log}).
# Call 2: `PART=b bash benchmarks/gpu_next_s46.sh`, the step ablation at 1K and 32K
#   (results/step_ablation_s46_{1024,32768}.{json,log}).
# Call 3 (PART=profile): the graph profile of the attention-free probe variants and of hyquant at 32K
#   (results/profile_static_s46*; read with `python benchmarks/layer_timeline.py`).
# Call 4 (PART=order): results/decode_after_queries.patch (the Mosaic launch takes the Triton launch's queries
#   as an operand it does not read) against main, alternating, then the patched tree's Mosaic GPU tests
#   (results/e2e_after_queries_s46.{json,log}, after_queries_gpu_tests_s46.log). Build the tree first, here:
#     bash benchmarks/prepare_patched_tree.sh decode_after_queries
#   and carry .gpu_run. (In the session's call the patch was the working tree and main the carried one, in the
#   same order: patch with bf16, main, patch, main.)
# Call 5 (PART=loops): the loop variants at 1K (results/step_ablation_loops_s46.{json,log}).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-order}" = loops ]; then
  PYTHONPATH=. timeout 175 python3 benchmarks/step_ablation_probe.py --out "$OUT" --name step_ablation_loops_s46 \
    --prefixes 1024 --steps 64 --reps 3 \
    --variants bf16_static,bf16_static_nested,bf16_static_nested_carry,static_flat,static,bf16_static_nested \
    > "$OUT/step_ablation_loops_s46.log" 2>&1
  echo "rc=$?"; grep -E "^ +[0-9]+ " "$OUT/step_ablation_loops_s46.log"
elif [ "${PART:-order}" = profile ]; then
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. timeout 470 python3 \
    benchmarks/profile_e2e.py --out "$OUT" --name profile_static_s46 --methods bf16_static,static_flat,static,hyquant \
    --prefixes 32768 --steps 16 --top 30 --dump-events > "$OUT/profile_static_s46.log" 2>&1
  echo "profile rc=$?"; grep "==" "$OUT/profile_static_s46.log"
else
  patched=.gpu_run/decode_after_queries
  VARIANTS="$patched|bf16,hyquant|"$'\n'".|hyquant|"$'\n'"$patched|hyquant|"$'\n'".|hyquant|" \
    PREFIXES=32768 STEPS=64 REPS=3 RUN_LIMIT=130 NAME=e2e_after_queries_s46 \
    timeout 420 bash benchmarks/gpu_e2e_variants.sh
  (cd "$patched" && PYTHONPATH=. timeout 100 python3 -m pytest -q -m gpu tests/test_decode_mgpu.py) \
    > "$OUT/after_queries_gpu_tests_s46.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/after_queries_gpu_tests_s46.log"
fi
