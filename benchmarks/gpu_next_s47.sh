#!/bin/bash
# Not run: session 47 had no GPU. Superseded by gpu_next_s48.sh (its PART=d is PART=a here; its PART=a logs the
# command-buffer updates of PART=c here, for the fix of session 47 and the old output order side by side).
# Prepared in session 46 for the next GPU session; one H200 call each, no carried trees needed.
# Session 46 (benchmarks/NOTES.md) put ~0.2 ms of hyquant's B=1 step in the hybrid cache's loops and carried
# state: at 1K static (nested device loops, hybrid state, no attention) 4.264 ms a step against 4.182 for bf16
# in the same nested loops with 15 small carried arrays a layer, 4.166 for static in one flat loop and 4.133
# for bf16_static. Every timed loop of e2e.py is one `decode` call of --steps steps (64: one run between two
# window flushes), so a cost paid once per call is charged to 64 steps.
# PART=a (~5 min): the same variants with calls of 64 and of 256 steps (one process each): if static's excess
#   over bf16_static_nested_carry shrinks ~4x at 256, it is paid per call (e.g. the outer body or the graph's
#   conditional nodes), not per step.
# PART=b (~6 min): the B=1 ratio at 32K with calls of 64 and of 256 steps, bf16 and hyquant in one process per
#   call length. A user's `generate` call decodes its max_new_tokens in one call; the README reports the step
#   time of 64-step calls.
# PART=c (~3 min): XLA's command-buffer log of the same 1K variants (64-step calls): whether each call updates
#   (re-records) the decode's one CUDA graph and for how long (`vlog_command_buffers.py` counts the
#   "Updated command buffer ... num_commands=N" lines per variant; session 34's host loops updated only small
#   graphs, session 37 logged the device loops at command_buffer_thunk=2, which hides them). XLA re-records a
#   command buffer when a buffer address its commands use changed (NOTES, session 46), and each timed call
#   passes new `first` / `lengths` arrays and gets new output buffers.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${PART:-a}" = a ]; then
  for steps in 64 256; do
    PYTHONPATH=. timeout 200 python3 benchmarks/step_ablation_probe.py --out "$OUT" --name step_ablation_calls_$steps \
      --prefixes 1024 --steps $steps --reps 3 \
      --variants bf16_static,bf16_static_nested_carry,static_flat,static \
      > "$OUT/step_ablation_calls_$steps.log" 2>&1
    echo "$steps rc=$?"; grep -E "^ +[0-9]+ " "$OUT/step_ablation_calls_$steps.log"
  done
elif [ "${PART:-a}" = c ]; then
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,while_thunk=3,command_buffer_cmd=3 PYTHONPATH=. \
    timeout 240 python3 benchmarks/step_ablation_probe.py --out "$OUT" --name step_ablation_vlog_s47 --prefixes 1024 \
    --steps 64 --reps 3 --variants bf16_static_nested_carry,static > "$OUT/step_ablation_vlog_s47.txt" 2>&1
  echo "rc=$?"; python3 benchmarks/vlog_command_buffers.py "$OUT/step_ablation_vlog_s47.txt" | tee "$OUT/step_ablation_vlog_s47_summary.txt" | head -40
  gzip "$OUT/step_ablation_vlog_s47.txt"
else
  for steps in 64 256; do
    PYTHONPATH=. timeout 250 python3 benchmarks/e2e.py --out "$OUT" --name e2e_calls_$steps --sections b1 \
      --methods bf16,hyquant --prefixes 32768 --steps $steps --reps 3 --no-plot > "$OUT/e2e_calls_$steps.log" 2>&1
    echo "$steps rc=$?"; grep -A3 "^B=1" "$OUT/e2e_calls_$steps.log" | tail -3
  done
fi
