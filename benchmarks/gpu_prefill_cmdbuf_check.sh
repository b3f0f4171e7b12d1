#!/bin/bash
# One GPU call (~8 min) after `generate.prefill` stopped putting custom calls into command buffers
# (hyquant_jax.generate.prefill_compiler_options): the 4K profile and e2e prefill with that default (gap
# check variant 0) and with command buffers off entirely through XLA_FLAGS (variant 2), then the e2e prefill
# section at 4K and 32K with the Mosaic prefill kernel (the README's e2e prefill table, same command).
# PART=b runs the prefill section with the default backends instead (Triton prefill, kivi4 too).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_prefill_cmdbuf_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${PART:-a}" = a ]; then
    RUN="0 2" bash benchmarks/gpu_prefill_gap_check.sh
    timeout 240 python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_prefill_mosaic_cmdbuf --sections prefill \
        --methods bf16,hyquant --prefill-backend mosaic --prefill-block 128 --prefill-prefixes 4096,32768 --no-plot \
        > "$OUT/e2e_h200_prefill_mosaic_cmdbuf.log" 2>&1
    echo "e2e mosaic rc=$?"; grep -A6 "^prefill (B=" "$OUT/e2e_h200_prefill_mosaic_cmdbuf.log"
else
    timeout 300 python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_prefill_cmdbuf --sections prefill \
        --methods bf16,hyquant,kivi4 --prefill-prefixes 4096,32768 --no-plot > "$OUT/e2e_h200_prefill_cmdbuf.log" 2>&1
    echo "e2e default rc=$?"; grep -A8 "^prefill (B=" "$OUT/e2e_h200_prefill_cmdbuf.log"
fi
