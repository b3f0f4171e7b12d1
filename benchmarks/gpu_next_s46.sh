#!/bin/bash
# Prepared in session 45 for the next GPU session; one H200 call each, no carried trees needed.
# Session 45 tried the loop forms and the flush (benchmarks/NOTES.md, session 45); what is left of hyquant's
# B=1 step above bf16's at 1K (~0.25-0.3 ms) is not located since session 34's ablations, which ran before
# the device loops, the one-kernel append, the token split, the merge kernel and the fused q/k/v weights.
# PART=a (~8 min): the B=1 table with session 45's code (the stacked flush merged): both methods in one
#   process, as the README's table.
# PART=b (~7 min): where the hybrid step's time goes now, `step_ablation_probe.py` at 1K and 32K in one process
#   per prefix: bf16 as is / writes only / static, hyquant as is / append only / static / static in one flat
#   loop / without the Mosaic launch / without the merge. hyquant - append_only is the attention path,
#   append_only - static the append and flush, static - bf16_static the loops and carried state.
# PART=c (~7 min): the graph profile of the current step at 1K and 32K (both methods), read one layer in start
#   order as session 43 did (`profile_graphs_s43.json`): what sits between the norm + RoPE kernel and the o
#   projection now that the q conversion is inside the Mosaic kernel, and at 1K (Triton kernel only, below
#   MOSAIC_MIN_PAGES) how hyquant's ~8 us a layer over bf16 divide between its launches.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-a}" = a ]; then
  PYTHONPATH=. timeout 560 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s46_b1 --sections b1 \
    --methods bf16,hyquant --prefixes 1024,8192,32768,131072 --steps 64 --reps 3 --no-plot \
    > "$OUT/e2e_s46_b1.log" 2>&1
  echo "table rc=$?"; grep -A10 "^B=1" "$OUT/e2e_s46_b1.log" | tail -10
elif [ "${PART:-a}" = b ]; then
  for prefix in 1024 32768; do
    PYTHONPATH=. timeout 270 python3 benchmarks/step_ablation_probe.py --out "$OUT/ablation_$prefix" \
      --prefixes $prefix --steps 64 --reps 3 \
      --variants bf16,bf16_write_only,bf16_static,hyquant,append_only,static,static_flat,no_mosaic,no_merge \
      > "$OUT/step_ablation_s46_$prefix.log" 2>&1
    echo "$prefix rc=$?"; grep -E "^ +[0-9]+ " "$OUT/step_ablation_s46_$prefix.log"
  done
else
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. timeout 500 python3 \
    benchmarks/profile_e2e.py --out "$OUT" --name profile_graphs_s46 --methods bf16,hyquant --prefixes 1024,32768 \
    --steps 16 --top 30 --dump-events > "$OUT/profile_graphs_s46.log" 2>&1
  echo "profile rc=$?"; grep "==" "$OUT/profile_graphs_s46.log"; ls -la "$OUT"
fi
