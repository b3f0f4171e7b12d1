#!/bin/bash
# Session 36, call 3 (~3 min, what the device time left allowed): GPU tests of append_rows with all heads in one
# program, then e2e B=1 32K of the working tree and of the tree before append_rows (.gpu_run/base, built with
# `mkdir -p .gpu_run/base && git archive e5d1707 hyquant_jax models pallas_kernels benchmarks tests
# pyproject.toml | tar -x -C .gpu_run/base --exclude=benchmarks/results`, carried), bf16 in each process.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 60 python3 -m pytest -m gpu tests/test_cache_write.py -q -p no:cacheprovider -rA \
  > "$OUT/cache_write_gpu_tests_s36c.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/cache_write_gpu_tests_s36c.log" | tail -4 | cut -c1-300
VARIANTS=$'.|bf16,hyquant|\n.gpu_run/base|bf16,hyquant|' PREFIXES=32768 STEPS=64 REPS=3 RUN_LIMIT=95 \
  NAME=e2e_append_rows_s36c bash benchmarks/gpu_e2e_variants.sh
