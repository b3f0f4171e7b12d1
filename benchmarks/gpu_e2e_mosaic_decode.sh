#!/bin/bash
# One GPU call: end-to-end decode with the Mosaic low-bit decode kernel (the default on Hopper from
# decode_kernel.MOSAIC_MIN_PAGES), Qwen3-8B shapes with random weights: B=1 at a 128K prefix and the batch sweep
# points that set the throughput targets at 32K (bf16's best batch 24; hyquant 64 and 72), bf16 and hyquant in
# the same call. Run on the GPU box from the repository root:  bash benchmarks/gpu_e2e_mosaic_decode.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${BF16_LIMIT:-200} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_mosaic_decode_bf16 --sections b1,batch \
    --methods bf16 --prefixes 131072 --batches 24 --no-until-oom --no-plot > "$OUT/e2e_h200_mosaic_decode_bf16.log" 2>&1
echo "bf16 rc=$?"; grep -iE "tokens/s|step|error" "$OUT/e2e_h200_mosaic_decode_bf16.log" | tail -6 | cut -c1-200
timeout ${HYQ_LIMIT:-300} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_mosaic_decode_hyquant --sections b1,batch \
    --methods hyquant --prefixes 131072 --batches 64,72 --no-until-oom --no-plot > "$OUT/e2e_h200_mosaic_decode_hyquant.log" 2>&1
echo "hyquant rc=$?"; grep -iE "tokens/s|step|error" "$OUT/e2e_h200_mosaic_decode_hyquant.log" | tail -8 | cut -c1-200
