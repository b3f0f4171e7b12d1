#!/bin/bash
# Session 39, call 4 (~1 min): generate's GPU test of the device-side decode loops (bf16 and hyquant through the
# Triton and Mosaic kernels, with and without a stop token) on main with the Mosaic launch after the ring append.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PYTHONPATH=. timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_generate.py \
    -k "on_the_device" > "$OUT/generate_gpu_tests_s39.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/generate_gpu_tests_s39.log"
