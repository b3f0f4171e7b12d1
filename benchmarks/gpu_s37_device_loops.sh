#!/bin/bash
# Session 37, call 2 (~9 min): `generate.decode` now runs loops that stop on data as device-side loops
# (`uses_device_loops`: stop tokens, or the hybrid cache's runs between window flushes).
# (A) One process, B=1 32K, ms per step: the default choice against forced host loops (@host), with and
#     without a stop token; then the same with --fresh-states (every timed call gets its caches at new
#     addresses, as each request's prefill gives generate: does the device-side loop's graph update cost?).
# (B) e2e.py's B=1 rows at 32K and 128K with today's default (one process per method).
# Run on the GPU box from the repository root: bash benchmarks/gpu_s37_device_loops.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${A_LIMIT:-170} python3 benchmarks/step_ablation_probe.py --out "$OUT" --name device_loops_s37_32k \
  --prefixes 32768 --steps 64 --reps 5 \
  --variants bf16,hyquant,hyquant@host,bf16@stop,bf16@host@stop,hyquant@host@stop,hyquant@stop,hyquant \
  > "$OUT/device_loops_s37_32k.log" 2>&1
echo "probe rc=$?"; grep -E "^ +[0-9]+ " "$OUT/device_loops_s37_32k.log"
timeout ${F_LIMIT:-110} python3 benchmarks/step_ablation_probe.py --out "$OUT" --name device_loops_s37_fresh \
  --prefixes 32768 --steps 64 --reps 5 --fresh-states --variants bf16,hyquant,hyquant@host,hyquant \
  > "$OUT/device_loops_s37_fresh.log" 2>&1
echo "fresh rc=$?"; grep -E "^ +[0-9]+ " "$OUT/device_loops_s37_fresh.log"
timeout ${B_LIMIT:-280} python3 benchmarks/e2e.py --out "$OUT" --name e2e_s37_b1 --sections b1 \
  --methods bf16,hyquant --prefixes 32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_s37_b1.log" 2>&1
echo "e2e rc=$?"; grep -A6 "B=1 decode" "$OUT/e2e_s37_b1.log"
