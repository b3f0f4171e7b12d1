#!/bin/bash
# One GPU call (~8 min): the B=1 decode step of main and of main with an overlay of changed files
# (.gpu_run/overlay, built by benchmarks/prepare_overlay.sh; carry [".gpu_run"]), in the same call: e2e.py's
# b1 section at 1K and 32K (bf16 and hyquant in each run, so each run has its own ratio), then the GPU tests
# selected by TESTS (a pytest -k expression over tests/test_decode_kernel.py) with the overlay in place.
#   TESTS="gpu_ring_logits" bash benchmarks/gpu_overlay_ab.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
for which in main overlay; do
    if [ $which = overlay ]; then cp -r .gpu_run/overlay/. .; fi
    timeout ${E2E_LIMIT:-200} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_b1_$which --sections b1 \
        --methods bf16,hyquant --prefixes ${PREFIXES:-1024,32768} --steps 32 --reps 3 --no-plot \
        > "$OUT/e2e_h200_b1_$which.log" 2>&1
    echo "$which rc=$?"; grep -A6 "^B=1" "$OUT/e2e_h200_b1_$which.log" | head -8
done
if [ -n "${TESTS:-}" ]; then
    timeout ${TEST_LIMIT:-150} python3 -m pytest -m gpu tests/test_decode_kernel.py -q -p no:cacheprovider -rA \
        -k "$TESTS" > "$OUT/overlay_gpu_tests.log" 2>&1
    echo "tests rc=$?"; tail -2 "$OUT/overlay_gpu_tests.log"
fi
