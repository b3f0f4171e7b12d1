#!/bin/bash
# One GPU call (~9 min): the GPU tests of the "auto" prefill backend and the Mosaic setting, then the full
# prefill benchmark of issue 4 in one run, the JSON the README's prefill table should come from: every kernel
# the library ships (Triton hybrid INT8 and FP8, SageAttention-style uniform INT8, the Mosaic kernel in the
# backend="mosaic" setting, alone and with VTI) against cuDNN and tuned Pallas mha, VTI alone, and the
# per-layer accuracy table. The JSON is written after every length (`complete` says whether it finished).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_prefill_full.sh
# All four lengths may not fit one 600 s call; then two calls, each length's ratios still from one process:
#   LENGTHS="4096 8192 16384" bash benchmarks/gpu_prefill_full.sh
#   LENGTHS=32768 NO_LAYERS=1 NAME=prefill_kernel_h200_32k TESTS=none bash benchmarks/gpu_prefill_full.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${TESTS:-}" != none ]; then
    timeout 120 python3 -m pytest -m gpu tests/test_prefill_mgpu.py -q -p no:cacheprovider -rA -k "auto or backend" \
        > "$OUT/prefill_auto_gpu_tests.log" 2>&1
    echo "GPU tests (auto backend, mosaic setting) rc=$?"
    grep -E "PASSED|FAILED|SKIPPED|passed|failed" "$OUT/prefill_auto_gpu_tests.log" | tail -4
fi
M=hybrid_int8,hybrid_fp8,uniform_int8,hybrid_int8_mgpu_2wg_fast_pp,hybrid_int8_mgpu_kernel,hybrid_e2e_mosaic,vti
M=$M,cudnn_bf16,pallas_mha_bf16
timeout ${LIMIT:-450} python3 benchmarks/prefill_kernel.py --out "$OUT" --name ${NAME:-prefill_kernel_h200} --no-sweep \
    --tuning 128,64,8,3 --mha-tuning 128,128,8,2 --methods $M --lengths ${LENGTHS:-4096 8192 16384 32768} \
    ${NO_LAYERS:+--no-layers} > "$OUT/${NAME:-prefill_kernel_h200}.log" 2>&1
echo "benchmark rc=$?"; sed -n '/=== speed and accuracy/,$p' "$OUT/${NAME:-prefill_kernel_h200}.log" | cut -c1-200
