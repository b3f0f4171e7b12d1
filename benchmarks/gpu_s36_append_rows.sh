#!/bin/bash
# Session 36, call 1 (~8 min): the ring append that advances the counters in its kernel (`append_rows`).
# GPU tests of pallas_kernels/cache_write.py, then e2e B=1 at 1K and 32K: HEAD before the change
# (.gpu_run/base, built with `mkdir -p .gpu_run/base && git archive e5d1707 hyquant_jax models pallas_kernels
# benchmarks tests pyproject.toml | tar -x -C .gpu_run/base --exclude=benchmarks/results`, carried) against the
# working tree, each with bf16 in the same process.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 150 python3 -m pytest -m gpu tests/test_cache_write.py -q -p no:cacheprovider -rA \
  > "$OUT/cache_write_gpu_tests_s36.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/cache_write_gpu_tests_s36.log" | tail -4 | cut -c1-300
VARIANTS=$'.gpu_run/base|bf16,hyquant|\n.|bf16,hyquant,kivi4|' PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=220 \
  NAME=e2e_variants_s36 bash benchmarks/gpu_e2e_variants.sh
