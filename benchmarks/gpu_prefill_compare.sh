#!/bin/bash
# One GPU call comparing a branch's prefill against main's on the same machine: the GPU tests in $TESTS (a
# pytest -k pattern over tests/test_prefill_mgpu.py and tests/test_prefill_kernel.py; TESTS=none skips them),
# then the prefill benchmark of this tree and of main's tree in .gpu_run/main_tree, back to back, cuDNN timed in
# both as the anchor. Prepare main's tree here first and carry .gpu_run:
#   rm -rf .gpu_run/main_tree && mkdir -p .gpu_run/main_tree && git archive main | tar -x -C .gpu_run/main_tree
# Run on the GPU box from the repository root:  NAME=prefill_glue bash benchmarks/gpu_prefill_compare.sh
# TRACE=method,... also profiles one call of those methods (GPU kernel breakdown in each JSON).
# Writes under $OUT (default /tmp/out): ${NAME}_gpu_tests.log, ${NAME}_h200.{json,log}, ${NAME}_main_h200.{json,log}.
set -u
OUT=${OUT:-/tmp/out}
NAME=${NAME:-prefill_compare}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
LENGTHS=${LENGTHS:-"8192 16384"}
METHODS=${METHODS:-hybrid_int8_mgpu_2wg_fast_pp,hybrid_int8_mgpu_kernel,hybrid_e2e_mosaic,cudnn_bf16}
if [ "${TESTS:-}" != none ]; then
    PYTHONPATH=. timeout 240 python3 -m pytest -m gpu tests/test_prefill_mgpu.py tests/test_prefill_kernel.py -q \
        -p no:cacheprovider -rA -k "${TESTS:-qwen3_heads_ragged or smollm or backend or auto}" \
        > "$OUT/${NAME}_gpu_tests.log" 2>&1
    echo "GPU tests rc=$?"; grep -E "PASSED|FAILED|passed|failed" "$OUT/${NAME}_gpu_tests.log" | tail -15
fi
bench() {  # $1 tree, $2 name
    (cd "$1" && PYTHONPATH=. timeout ${LIMIT:-150} python3 benchmarks/prefill_kernel.py --out "$OUT" --name "$2" \
        --no-sweep --no-layers --tuning 128,64,8,3 --lengths $LENGTHS --methods "$METHODS" \
        ${TRACE:+--trace "$TRACE"} > "$OUT/$2.log" 2>&1)
    echo "$2 rc=$?"; grep -E "^T=[0-9]+ " "$OUT/$2.log" | sed -E "s/'call_ms'.*'rel_mse'/'rel_mse'/" | cut -c1-140
}
bench . "${NAME}_h200"
if [ -d .gpu_run/main_tree ]; then bench .gpu_run/main_tree "${NAME}_main_h200"; fi
