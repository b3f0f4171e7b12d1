#!/bin/bash
# Session 36: GPU tests of pallas_kernels/cache_write.py, then e2e B=1 of the tree before `append_rows`
# (.gpu_run/base, carried; built with `mkdir -p .gpu_run/base && git archive e5d1707 hyquant_jax models
# pallas_kernels benchmarks tests pyproject.toml | tar -x -C .gpu_run/base --exclude=benchmarks/results`) against
# the working tree, bf16 in each process. Call 1 (~8 min, the first append_rows) ran it as is; call 3 (~3 min,
# append_rows with all heads in one program) as
#   TAG=s36c NAME=e2e_append_rows_s36c TEST_LIMIT=60 VARIANTS=$'.|bf16,hyquant|\n.gpu_run/base|bf16,hyquant|' \
#   PREFIXES=32768 RUN_LIMIT=95 bash benchmarks/gpu_s36_append_rows.sh
set -u
OUT=${OUT:-/tmp/out}
TAG=${TAG:-s36}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout ${TEST_LIMIT:-150} python3 -m pytest -m gpu tests/test_cache_write.py -q -p no:cacheprovider -rA \
  > "$OUT/cache_write_gpu_tests_$TAG.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" "$OUT/cache_write_gpu_tests_$TAG.log" | tail -4 | cut -c1-300
VARIANTS=${VARIANTS:-$'.gpu_run/base|bf16,hyquant|\n.|bf16,hyquant,kivi4|'} PREFIXES=${PREFIXES:-1024,32768} STEPS=64 \
  REPS=3 RUN_LIMIT=${RUN_LIMIT:-220} NAME=${NAME:-e2e_variants_s36} bash benchmarks/gpu_e2e_variants.sh
