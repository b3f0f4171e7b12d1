#!/bin/bash
# One GPU call (~7 min) for the Mosaic prefill kernel with prefill_block 64 (two 64-row blocks per CTA, each
# masking the stream's keys that are not its own), which makes it the "auto" prefill on Hopper for the default
# HyQuantConfig: every Mosaic GPU test (`pytest -m gpu tests/test_prefill_mgpu.py`), then the e2e prefill section
# with default settings (auto backend, prefill_block 64) at 4K and 32K.
# Run on the GPU box from the repository root:  bash benchmarks/gpu_prefill_block64_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-300} python3 -m pytest -m gpu tests/test_prefill_mgpu.py -q -p no:cacheprovider -rA \
    > "$OUT/prefill_mgpu_gpu_tests_block64.log" 2>&1
echo "tests rc=$?"; tail -25 "$OUT/prefill_mgpu_gpu_tests_block64.log" | cut -c1-160
timeout ${E2E_LIMIT:-240} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_prefill_auto_block64 --sections prefill \
    --methods bf16,hyquant --prefill-prefixes 4096,32768 --no-plot > "$OUT/e2e_h200_prefill_auto_block64.log" 2>&1
echo "e2e rc=$?"; grep -A6 "^prefill (B=" "$OUT/e2e_h200_prefill_auto_block64.log"
