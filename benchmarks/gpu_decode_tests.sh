#!/bin/bash
# One GPU call (~6 min): every GPU test of the decode path (tests/test_decode_kernel.py and
# tests/test_decode_mgpu.py, `-m gpu`: shapes, schemes and bits, tunings, ring logits, the Mosaic kernel's
# oracle tests), then what EXTRA names (another script of benchmarks/, run with the same OUT).
# Run on the GPU box from the repository root:  [EXTRA="PART=profile bash benchmarks/gpu_schedule_check.sh"] bash benchmarks/gpu_decode_tests.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-420} python3 -m pytest -m gpu tests/test_decode_kernel.py tests/test_decode_mgpu.py -q \
    -p no:cacheprovider -rA --durations=5 > "$OUT/decode_gpu_tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/decode_gpu_tests.log" | tail -6 | cut -c1-300
if [ -n "${EXTRA:-}" ]; then eval "$EXTRA"; fi
