#!/bin/bash
# One GPU call (~8-9 min): the full prefill benchmark of issue 4 in one run, the JSON the README's prefill table
# should come from: every kernel the library ships (Triton hybrid INT8 and FP8, SageAttention-style uniform INT8,
# the Mosaic kernel in the backend="mosaic" setting, alone and with VTI) against cuDNN and Pallas mha, VTI alone,
# and the per-layer accuracy table. The JSON is written after every length (`complete` says whether it finished).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_prefill_full.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
M=hybrid_int8,hybrid_fp8,uniform_int8,hybrid_int8_mgpu_2wg_fast_pp,hybrid_int8_mgpu_kernel,hybrid_e2e_mosaic,vti
M=$M,cudnn_bf16,pallas_mha_bf16
timeout ${LIMIT:-540} python3 benchmarks/prefill_kernel.py --out "$OUT" --name ${NAME:-prefill_kernel_h200} --no-sweep \
    --tuning 128,64,8,3 --mha-tuning 128,128,8,2 --methods $M > "$OUT/${NAME:-prefill_kernel_h200}.log" 2>&1
echo "benchmark rc=$?"; sed -n '/=== speed and accuracy/,$p' "$OUT/${NAME:-prefill_kernel_h200}.log" | cut -c1-200
