#!/bin/bash
# Session 39, call 3 (~8 min): main with the Mosaic launch after the ring append (decode_kernel._run).
# (1) GPU tests of the hybrid decode through both kernels (the -k's "device_loops" matched no test; call 4,
# gpu_s39_generate_tests.sh, ran generate's device-loop test); (2) e2e B=1 at
# 1K / 32K / 128K (the README's table rows), and at 32K / 128K with a stop token (generate's case).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_decode_kernel.py tests/test_generate.py \
    -k "tunings or ring_logits or device_loops" > "$OUT/append_first_gpu_tests_s39.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/append_first_gpu_tests_s39.log"
timeout 200 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s39_b1 --sections b1 --methods bf16,hyquant \
    --prefixes 1024,32768,131072 --steps 64 --reps 3 --no-plot > "$OUT/e2e_s39_b1.log" 2>&1
echo "b1 rc=$?"; grep -A7 "^B=1" "$OUT/e2e_s39_b1.log"
timeout 170 python3 benchmarks/e2e.py --out "$OUT" --name e2e_s39_stop_token --sections b1 --methods bf16,hyquant \
    --prefixes 32768,131072 --steps 64 --reps 3 --stop-token --no-plot > "$OUT/e2e_s39_stop_token.log" 2>&1
echo "stop-token rc=$?"; grep -A5 "^B=1" "$OUT/e2e_s39_stop_token.log"
