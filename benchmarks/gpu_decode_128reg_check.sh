#!/bin/bash
# One GPU call for the 128-register decode kernel (benchmarks/results/decode_mgpu_128_registers.patch: the value
# codes unpacked after the softmax, just before P.V, with a warpgroup barrier before the slot's refill; offline
# SASS: 128 registers instead of 136, so 4 blocks per multiprocessor instead of 3, and 657 loop instructions
# instead of 635, results/mosaic_sass_decode_128_registers.json). Before the call, on this machine:
#   cp pallas_kernels/decode_mgpu.py .gpu_run/decode_mgpu_prev.py
#   git apply benchmarks/results/decode_mgpu_128_registers.patch
# then run this with carry [".gpu_run"]: the GPU oracle tests, the whole-decode tunings (Mosaic ones
# included), and the same-process A/B against the previous kernel at 2, 3 and 4 blocks per multiprocessor.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-150} python3 -m pytest -m gpu tests/test_decode_mgpu.py tests/test_decode_kernel.py -q \
    -p no:cacheprovider -rA -k "gpu_kernel or gpu_tunings" > "$OUT/decode_mgpu_128reg_gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/decode_mgpu_128reg_gpu_tests.log"
timeout ${AB_LIMIT:-300} python3 benchmarks/decode_mgpu_ab.py --prev .gpu_run/decode_mgpu_prev.py --per-sm 2,3,4 \
    --out "$OUT" --name decode_mgpu_128reg_ab_h200 2>&1 | grep '^{' | tee "$OUT/decode_mgpu_128reg_ab_h200.log" | cut -c1-160
