#!/bin/bash
# One GPU call (~6 min): does the Mosaic kernel's split count explain the e2e batch cliffs at 32K?
# Session 26 measured hyquant at B=24 17.60 ms and B=25 23.19 ms per step in one process
# (results/e2e_h200_s26_b24_b25.json), and B=74 42.55 against B=76 47.32 ms. With 2 splits per (sequence,
# KV head) (`decode_mgpu.default_splits`) and ~3 resident blocks per multiprocessor (135 registers), B=24
# launches 384 blocks (one wave of 396) and B=25 400 (a second wave of 4). This times the decode attention
# alone at those batches for several explicit split counts (DecodeTuning.mosaic_splits), then runs the
# decode GPU tunings tests (they include mosaic_splits=5). Run from the repository root:
#   bash benchmarks/gpu_split_waves_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${SWEEP_LIMIT:-420} python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_split_waves_h200 \
    --cases "${CASES:-B24 32K,B25 32K,B28 32K,B64 32K,B74 32K,B76 32K}" \
    --compare-tunings "${TUNINGS:-;mosaic_splits=1;mosaic_splits=3;mosaic_splits=4;mosaic_splits=5;mosaic_splits=8}" \
    > "$OUT/decode_split_waves_h200.log" 2>&1
echo "sweep rc=$?"; grep -E "loop_ms|error" "$OUT/decode_split_waves_h200.log" | sed -E 's/DecodeTuning\(.*mosaic_splits=([0-9None]+)\)/splits=\1/' | cut -c1-160
timeout ${TEST_LIMIT:-150} python3 -m pytest -m gpu tests/test_decode_kernel.py -q -p no:cacheprovider -rA \
    -k gpu_tunings > "$OUT/split_waves_gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/split_waves_gpu_tests.log"
