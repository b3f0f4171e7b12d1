#!/bin/bash
# Prepared in sessions 47 and 48 (no GPU was lent in either) for the next GPU session; one H200 call per PART.
# Session 50 ran PART=a and PART=b on an H200 (results/e2e_states_first_s48.*, results/e2e_s48_b1.*; NOTES, session 50).
# Session 47 found (on the CPU, tests/test_generate.py::test_decode_updates_each_state_in_its_own_buffer) that
# before its fix every decode call moved the quantized caches' int32 [B] counters (ring_len, length, num_pages,
# ring_start, num_vl: 5 a layer) to other buffers: jit gave the counts output the first counter's donated
# buffer, that counter the next one's, and so on. XLA re-records the commands of a CUDA graph whose buffers
# moved before the call runs; bf16's state has no such arrays. Session 37 measured caches at new addresses on
# every call (`--fresh-states`) at ~0.2-0.3 ms a step more for hyquant (64-step calls), and session 46 left
# ~0.08 ms a step of the hybrid loops unexplained. `decode` now returns the states first.
# Session 48 added `generate.decode_in_place` (e2e.py --in-place): first, lengths and the previous call's
# tokens and step count are donated too, so that no array of a call moves (decode still gives its six other
# arrays new buffers every call: results/decode_buffer_moves_s48.json). With device loops the tokens, counts,
# positions and step counter are carried by the loops, so their moves may re-record commands inside them.
# Before PART=a or PART=c, build the tree with the old output order here and carry .gpu_run:
#   bash benchmarks/prepare_patched_tree.sh decode_states_last
# PART=a (~7 min): e2e at 1K and 32K, alternating: the fix (.), the old order (.gpu_run/decode_states_last) and
#   the fix with --in-place (bf16 with it too in the first round, for a ratio within one calling convention).
# PART=v (~3 min): XLA's command-buffer log (level 3) of hyquant at 1K in the three forms, summarized by
#   `vlog_command_buffers.py`: per call, how long the graph update took, which allocations changed and how many
#   commands it updated or skipped ("Skip updating command" lines, where this XLA logs them).
# PART=b (~8 min): the B=1 table with the fix (the command of sessions 44 and 46); E2E_ARGS=--in-place times
#   decode_in_place for both methods instead (if PART=a shows that it is faster).
# PART=c (~5 min): step ablation at 1K: the loop variants with the fix and with the old order (static is the
#   variant that showed the unexplained ~0.08 ms).
# PART=d (~5 min): per call or per step: the same variants with calls of 64 and of 256 steps
#   (gpu_next_s47.sh's PART=a, never run).
# PART=p (~4 min; added in session 49, also without a GPU): chunked prefill, whose attention now reads key
#   blocks only up to each chunk's end (models.prefix_attention). First, here:
#     git show 7cbf3c9:models/attention.py > .gpu_run/attention_s48.py   (the version before; carry .gpu_run)
#   The prefix-attention oracle tests on the GPU, the attention of a 32K prompt's chunks at the Qwen3-8B shape
#   (blocks / all slots / session 48's code), and e2e's prefill of a 32K prompt in 2048-token chunks.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
old=.gpu_run/decode_states_last
vlog() {  # vlog TREE NAME [ARGS]: hyquant at 1K with XLA's command-buffer log, summarized
  (cd "$1" && TF_CPP_MIN_LOG_LEVEL=0 \
    TF_CPP_VMODULE=command_buffer_thunk=3,while_thunk=3,command_buffer_cmd=3,command_buffer_cmd_executor=3 \
    PYTHONPATH=. timeout 120 python3 benchmarks/step_ablation_probe.py --out "$OUT" --name "$2" --prefixes 1024 \
    --steps 64 --reps 3 --variants hyquant ${3:-}) > "$OUT/$2.txt" 2>&1
  echo "$2 rc=$?"; python3 benchmarks/vlog_command_buffers.py "$OUT/$2.txt" | tee "$OUT/${2}_summary.txt" | head -30
  gzip -f "$OUT/$2.txt"
}
case "${PART:-a}" in
a)
  [ -d "$old" ] || { echo "missing $old: run prepare_patched_tree.sh decode_states_last and carry .gpu_run"; exit 1; }
  VARIANTS=".|bf16,hyquant|"$'\n'"$old|hyquant|"$'\n'".|bf16,hyquant||--in-place"$'\n'".|hyquant|"$'\n'"$old|hyquant|"$'\n'".|hyquant||--in-place" \
    PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=150 NAME=e2e_states_first_s48 \
    timeout 560 bash benchmarks/gpu_e2e_variants.sh
  ;;
v)
  [ -d "$old" ] || { echo "missing $old: run prepare_patched_tree.sh decode_states_last and carry .gpu_run"; exit 1; }
  vlog . vlog_states_first_s48
  vlog "$old" vlog_states_last_s48
  vlog . vlog_in_place_s48 --in-place
  ;;
b)
  PYTHONPATH=. timeout 560 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s48_b1 --sections b1 \
    --methods bf16,hyquant --prefixes 1024,8192,32768,131072 --steps 64 --reps 3 ${E2E_ARGS:-} \
    > "$OUT/e2e_s48_b1.log" 2>&1
  echo "rc=$?"; grep -A10 "^B=1" "$OUT/e2e_s48_b1.log"
  ;;
c)
  for run in "states_first:." "states_last:$old"; do
    name=${run%%:*}; tree=${run#*:}
    (cd "$tree" && PYTHONPATH=. timeout 170 python3 benchmarks/step_ablation_probe.py --out "$OUT" \
      --name "step_ablation_loops_s48_$name" --prefixes 1024 --steps 64 --reps 3 \
      --variants bf16_static,bf16_static_nested_carry,static_flat,static,hyquant) > "$OUT/step_ablation_loops_s48_$name.log" 2>&1
    echo "$name rc=$?"; grep -E "^ +[0-9]+ " "$OUT/step_ablation_loops_s48_$name.log"
  done
  ;;
d)
  for steps in 64 256; do
    PYTHONPATH=. timeout 200 python3 benchmarks/step_ablation_probe.py --out "$OUT" --name step_ablation_calls_$steps \
      --prefixes 1024 --steps $steps --reps 3 --variants bf16_static,bf16_static_nested_carry,static_flat,static \
      > "$OUT/step_ablation_calls_$steps.log" 2>&1
    echo "$steps rc=$?"; grep -E "^ +[0-9]+ " "$OUT/step_ablation_calls_$steps.log"
  done
  ;;
p)
  PYTHONPATH=. timeout 150 python3 -m pytest -q tests/test_models.py -k prefix_attention > "$OUT/prefix_attention_gpu_tests_s49.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/prefix_attention_gpu_tests_s49.log"
  base=.gpu_run/attention_s48.py
  [ -f "$base" ] || { echo "missing $base (see the header)"; base=""; }
  PYTHONPATH=. timeout 200 python3 benchmarks/chunked_prefill_attention.py --out "$OUT" \
    --name chunked_prefill_attention_h200_s49 --prompt 32768 --chunk 2048 --reps 3 ${base:+--baseline $base} \
    > "$OUT/chunked_prefill_attention_h200_s49.log" 2>&1
  echo "attention rc=$?"; tail -4 "$OUT/chunked_prefill_attention_h200_s49.log"
  PYTHONPATH=. timeout 200 python3 benchmarks/e2e.py --out "$OUT" --name e2e_chunked_prefill_s49 --sections prefill \
    --methods bf16,hyquant --prefill-prefixes 32768 --prefill-chunk 2048 --reps 2 --no-plot \
    > "$OUT/e2e_chunked_prefill_s49.log" 2>&1
  echo "e2e rc=$?"; grep -A4 "^prefill" "$OUT/e2e_chunked_prefill_s49.log"
  ;;
esac
