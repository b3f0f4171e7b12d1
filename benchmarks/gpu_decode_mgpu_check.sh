#!/bin/bash
# One GPU call for the Mosaic GPU low-bit decode kernel (pallas_kernels/decode_mgpu.py): first its correctness
# cases with PTX and ptxas dumps (registers, spills), then correctness again and the speed comparison against
# the Triton kernel's whole decode and cuDNN on the same caches (benchmarks/decode_mgpu_check.py).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_decode_mgpu_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
DUMP=$(mktemp -d)
MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$DUMP" timeout ${FIRST_LIMIT:-150} \
    python3 benchmarks/decode_mgpu_check.py --out "$DUMP/run" --skip-speed > "$OUT/decode_mgpu_first.log" 2>&1
echo "first rc=$?"; tail -8 "$OUT/decode_mgpu_first.log" | cut -c1-400
tar czf "$OUT/decode_mgpu_dump.tgz" -C "$DUMP" . 
grep -h -i "registers\|spill" "$DUMP"/*ptxas* 2>/dev/null | sort | uniq -c | head -10
timeout ${SPEED_LIMIT:-420} python3 benchmarks/decode_mgpu_check.py --out "$OUT" ${SPEED_ARGS:-} 2>&1 | tail -40 | cut -c1-400
