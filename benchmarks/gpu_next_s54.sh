#!/bin/bash
# Session 54's device plan: does the B=1 128K target (hyquant >= 1.5x bf16 tokens/s, issue 5) fit inside what
# the GPU's memory system gives a read of the hybrid attention's size at all? One process each:
#   1. the step at 128K with its attention taken out (step_ablation_probe.py): bf16, hyquant, append_only (the
#      hybrid step without its attention: append + flush + loops) and bf16_write_only, so that
#      bf16 / 1.5 - append_only is the most the hybrid attention may take a step, and hyquant - append_only what
#      it takes;
#   2. XLA's own reads of the hybrid attention's bytes a layer (167 MB at 128K: 6.015 GB / 36 layers,
#      e2e_s48_b1.json) and of 2 GiB (the yardstick);
#   3. the low-bit kernel's copy-only floor at B1 128K and 256K (stream_probe.py w64_p1_s2). (The call also ran
#      decode_mgpu_ab.py, which refused its arguments: it needs a variant to compare; taken out.)
# PART=e2e instead: issue 5's e2e table on the machine at hand (every call of sessions 52-54 asking for an H200
# got an H100): B=1 at 1K / 32K / 128K, then the 32K batch sweeps up to out of memory, one process a method.
# PART=tests: the whole `gpu` test marker on the machine at hand, one pytest process per file (each with its own
# time limit, the most important first; FILES= picks files, BUDGET= the call's seconds), logs
# gpu_tests_<file>_s54.log. Ran twice on an H100: the default list (BUDGET 520: decode_mgpu 43/43 and
# prefix_kernel 9/9 passed; decode_kernel 10, prefill_mgpu 8 and generate 1 passed before their 150 s limits;
# the rest not reached), then FILES="norm_rope decode_merge models" (8/8, 8/8, 2/2).
# PACK=1 packs everything into one tar (the device tool returns at most 8 files).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
trap '[ -n "${PACK:-}" ] && tar -czf /tmp/s54_pack.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/s54_pack.tgz "$OUT/"' EXIT
export PYTHONUNBUFFERED=1
if [ "${PART:-}" = tests ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu_tests_s54.txt" 2>&1; cat "$OUT/gpu_tests_s54.txt"
  for f in ${FILES:-decode_mgpu decode_kernel prefill_mgpu prefix_kernel generate models norm_rope prefill_kernel \
      decode_merge cache_write sharding}; do
    left=$(( ${BUDGET:-520} - SECONDS )); [ $left -gt 150 ] && left=150
    [ $left -lt 20 ] && { echo "$f: skipped (the call's time is spent)"; continue; }
    PYTHONPATH=. timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider "tests/test_$f.py" \
      > "$OUT/gpu_tests_${f}_s54.log" 2>&1
    echo "$f rc=$?: $(tail -1 "$OUT/gpu_tests_${f}_s54.log")"
  done
  exit 0
fi
if [ "${PART:-}" = e2e ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu_e2e_s54.txt" 2>&1; cat "$OUT/gpu_e2e_s54.txt"
  PYTHONPATH=. timeout 280 python3 benchmarks/e2e.py --out "$OUT" --name e2e_b1_h100_s54 --sections b1 \
    --methods bf16,hyquant --prefixes 1024,32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_b1_h100_s54.log" 2>&1
  echo "b1 rc=$?"; grep -h '^{' "$OUT/e2e_b1_h100_s54.log" | cut -c1-90
  PYTHONPATH=. timeout 80 python3 benchmarks/e2e.py --out "$OUT" --name e2e_batch_bf16_h100_s54 --sections batch \
    --methods bf16 --batches ${BF16_BATCHES:-11,12,13} --until-oom --steps 64 --reps 2 --no-plot \
    > "$OUT/e2e_batch_bf16_h100_s54.log" 2>&1
  echo "bf16 batch rc=$?"; grep -h '^{' "$OUT/e2e_batch_bf16_h100_s54.log" | cut -c1-90
  PYTHONPATH=. timeout 200 python3 benchmarks/e2e.py --out "$OUT" --name e2e_batch_hyquant_h100_s54 --sections batch \
    --methods hyquant --batches ${HQ_BATCHES:-36,37,38,39} --until-oom --steps 64 --reps 2 --no-plot \
    > "$OUT/e2e_batch_hyquant_h100_s54.log" 2>&1
  echo "hyquant batch rc=$?"; grep -h '^{' "$OUT/e2e_batch_hyquant_h100_s54.log" | cut -c1-90
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu_s54.txt" 2>&1
cat "$OUT/gpu_s54.txt"
for gib in 0.1556 2; do
  PYTHONPATH=. timeout 60 python3 benchmarks/read_bandwidth.py --gib "$gib" --out "$OUT" \
    --name "read_bandwidth_${gib}gib_s54" > "$OUT/read_bandwidth_${gib}gib_s54.log" 2>&1
  echo "$gib GiB rc=$?: $(grep -o "'tb_s': {[^}]*}" "$OUT/read_bandwidth_${gib}gib_s54.log")"
done
PYTHONPATH=. timeout 100 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_s54 \
  --cases 1x131072,1x262144 --configs w64_p1_s2,w64_p1_s2_codes > "$OUT/stream_probe_s54.log" 2>&1
echo "stream rc=$?"; grep -v Warning "$OUT/stream_probe_s54.log" | tail -8
PYTHONPATH=. timeout ${ABLATION_LIMIT:-330} python3 benchmarks/step_ablation_probe.py --out "$OUT" \
  --name step_ablation_128k_s54 --variants ${VARIANTS:-bf16,hyquant,append_only,bf16_write_only} \
  --prefixes 131072 --steps 64 --reps 3 --no-plot > "$OUT/step_ablation_128k_s54.log" 2>&1
echo "ablation rc=$?"; grep "^ *131072" "$OUT/step_ablation_128k_s54.log"
