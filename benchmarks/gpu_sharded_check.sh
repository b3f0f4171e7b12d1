#!/bin/bash
# One call on a 2-GPU box (kind nvidia-h200-x2) for the sharded path with the current kernels: the 2-GPU test
# (HybridAttention prefill + decode on a data=1,model=2 and a data=2,model=1 mesh against one GPU; each shard's
# decode takes the Mosaic low-bit kernel), then Qwen3-32B-shaped tensor-parallel decode at a 32K prefix
# (random weights) for hyquant at B=1 and 64 and bf16 at B=1 and 24, each timed against its own limit.
# Run from the repository root:  bash benchmarks/gpu_sharded_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-200} python3 -m pytest -m gpu tests/test_sharding.py -q -p no:cacheprovider -rA \
    -k gpu_sharded > "$OUT/sharded_gpu_tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|differ|error " "$OUT/sharded_gpu_tests.log" | tail -8 | cut -c1-300
for spec in "hyquant 1,64 ${HYQ_LIMIT:-190}" "bf16 1,24 ${BF16_LIMIT:-170}"; do
  set -- $spec
  timeout $3 python3 benchmarks/e2e.py --out "$OUT" --name "e2e_h200x2_qwen3_32b_tp2_s21_$1" --model qwen3-32b \
      --mesh data=1,model=2 --sections batch --methods "$1" --batches "$2" --no-until-oom --steps 16 --reps 2 \
      --no-plot > "$OUT/e2e_h200x2_qwen3_32b_tp2_s21_$1.log" 2>&1
  echo "$1 rc=$?"; grep -E '"step_ms"|oom' "$OUT/e2e_h200x2_qwen3_32b_tp2_s21_$1.log" | cut -c1-160
done
