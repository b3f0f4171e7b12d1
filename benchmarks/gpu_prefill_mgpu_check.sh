#!/bin/bash
# One GPU call: the Mosaic prefill kernel's GPU tests, then the prefill benchmark of the kernel settings in
# $METHODS against cuDNN (same run). Run on the GPU box from the repository root:
#   [METHODS=...] [NAME=...] bash benchmarks/gpu_prefill_mgpu_check.sh
# Writes under $OUT (default /tmp/out): prefill_mgpu_gpu_tests.log, $NAME.{json,log,png}.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 270 python3 -m pytest -m gpu tests/test_prefill_mgpu.py -q -p no:cacheprovider -rA \
    > "$OUT/prefill_mgpu_gpu_tests.log" 2>&1
echo "GPU tests rc=$?"; grep -E "PASSED|FAILED|passed|failed" "$OUT/prefill_mgpu_gpu_tests.log" | tail -15
timeout 340 python3 benchmarks/prefill_kernel.py --out "$OUT" --name ${NAME:-prefill_mgpu_next_h200} --no-sweep --no-layers \
    --tuning 128,64,8,3 \
    --methods ${METHODS:-hybrid_int8_mgpu_2wg_nopp,hybrid_int8_mgpu_2wg_fast,hybrid_int8_mgpu_2wg_fast_pp,cudnn_bf16} \
    > "$OUT/${NAME:-prefill_mgpu_next_h200}.log" 2>&1
echo "benchmark rc=$?"; grep -E "^  +[0-9]+ |T=[0-9]+:|ERROR" "$OUT/${NAME:-prefill_mgpu_next_h200}.log" | tail -30
