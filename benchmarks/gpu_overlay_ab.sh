#!/bin/bash
# One GPU call (~8 min): the B=1 decode step of main and of main with an overlay of changed files
# (.gpu_run/overlay, built by benchmarks/prepare_overlay.sh; carry [".gpu_run"]), in the same call: e2e.py's
# b1 section at 1K and 32K (bf16 and hyquant in each run, so each run has its own ratio), then the GPU tests
# selected by TESTS (a pytest -k expression over TEST_FILES, default tests/test_decode_kernel.py) with the
# overlay in place. DECODE_CASES (decode_kernel.py --cases) also times the whole decode, default tuning, for
# main and overlay (decode_kernel_ab_{main,overlay}.json), the overlay's after its tests. The timing runs' logs
# go into one overlay_ab.log: a device call returns at most 8 files.
#   TESTS="gpu_ring_logits" bash benchmarks/gpu_overlay_ab.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
decode_ab() {
    if [ -n "${DECODE_CASES:-}" ]; then
        timeout ${DECODE_LIMIT:-120} python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_kernel_ab_$1 \
            --cases "$DECODE_CASES" --compare-tunings ";" > "$OUT/decode_kernel_ab_$1.log" 2>&1
        echo "decode $1 rc=$?"; grep -o "'loop_ms': [0-9.]*" "$OUT/decode_kernel_ab_$1.log"
        cat "$OUT/decode_kernel_ab_$1.log" >> "$OUT/overlay_ab.log"; rm "$OUT/decode_kernel_ab_$1.log"
    fi
}
decode_ab main
for which in main overlay; do
    if [ $which = overlay ]; then
        cp -r .gpu_run/overlay/. .
        if [ -n "${TESTS:-}" ]; then
            timeout ${TEST_LIMIT:-150} python3 -m pytest -m gpu ${TEST_FILES:-tests/test_decode_kernel.py} -q \
                -p no:cacheprovider -rA -k "$TESTS" > "$OUT/overlay_gpu_tests.log" 2>&1
            echo "tests rc=$?"; tail -2 "$OUT/overlay_gpu_tests.log"
        fi
        decode_ab overlay
    fi
    timeout ${E2E_LIMIT:-200} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_b1_$which --sections b1 \
        --methods bf16,hyquant --prefixes ${PREFIXES:-1024,32768} --steps 32 --reps 3 --no-plot \
        > "$OUT/e2e_h200_b1_$which.log" 2>&1
    echo "$which rc=$?"; grep -A6 "^B=1" "$OUT/e2e_h200_b1_$which.log" | head -8
    cat "$OUT/e2e_h200_b1_$which.log" >> "$OUT/overlay_ab.log"; rm "$OUT/e2e_h200_b1_$which.log"
done
