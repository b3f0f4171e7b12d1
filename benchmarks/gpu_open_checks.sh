#!/bin/bash
# One GPU call for the checks left open in session 20 (benchmarks/NOTES.md, "Mosaic GPU low-bit decode, session
# 20"): (1) the Mosaic prefill against the reference at 16K, which accumulates P.V in the tensor cores over every
# key step as the decode kernel did before its fix; (2) whether MOSAIC_MIN_PAGES (4096, set with the session-19
# decode kernel) still holds: the whole decode at B1 4K-16K with the low-bit pages forced to each kernel.
# Run on the GPU box from the repository root:  bash benchmarks/gpu_open_checks.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-200} python3 -m pytest -m gpu tests/test_prefill_mgpu.py -q -p no:cacheprovider -rA \
    -k "16k or backend_mosaic_setting_ragged" > "$OUT/prefill_mgpu_16k_gpu_tests.log" 2>&1
echo "prefill tests rc=$?"; grep -E "passed|failed|relative error" "$OUT/prefill_mgpu_16k_gpu_tests.log" | tail -4 | cut -c1-300
timeout ${BENCH_LIMIT:-300} python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_mosaic_threshold_h200 \
    --cases "qwen3-8b B1 4K,qwen3-8b B1 8K,qwen3-8b B1 16K,qwen3-8b B1 32K" --compare-tunings "low=triton;low=mosaic" \
    > "$OUT/decode_mosaic_threshold_h200.log" 2>&1
echo "threshold rc=$?"; tail -12 "$OUT/decode_mosaic_threshold_h200.log" | cut -c1-200
