#!/bin/bash
# One GPU call (~8 min): the decode step's norm/RoPE kernels (`pallas_kernels.norm_rope`), first their GPU
# tests (the compiled kernels against the reference math, and a bf16 decode step of Qwen3-8B's head shapes
# with and without them), then e2e.py's B=1 decode at 1K and 32K (bf16 and hyquant) with the XLA ops
# (--layer-kernels xla) and with the kernels (auto), two processes of the same call. Run from the repository
# root:
#   bash benchmarks/gpu_layer_kernels_check.sh            (PROFILE=1 adds the kernel breakdowns)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-150} python3 -m pytest -m gpu tests/test_norm_rope.py tests/test_models.py -q \
    -p no:cacheprovider -rA > "$OUT/layer_kernels_gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/layer_kernels_gpu_tests.log"
for kernels in ${KERNELS:-xla auto}; do
    timeout ${E2E_LIMIT:-200} python3 benchmarks/e2e.py --out "$OUT" --name "e2e_h200_b1_layer_kernels_$kernels" \
        --sections b1 --methods ${METHODS:-bf16,hyquant} --prefixes ${PREFIXES:-1024,32768} --steps 32 --reps 3 \
        --no-plot --layer-kernels $kernels > "$OUT/e2e_layer_kernels_$kernels.log" 2>&1
    echo "$kernels rc=$?"; grep -A6 "^B=1" "$OUT/e2e_layer_kernels_$kernels.log" | head -8
done
# PROFILE=1: also the decode step's kernel breakdown at B=1 1K for both settings (profile_e2e.py; ~2 min).
if [ "${PROFILE:-0}" = 1 ]; then
    for kernels in xla auto; do
        timeout ${PROFILE_LIMIT:-150} python3 benchmarks/profile_e2e.py --out "$OUT" \
            --name "profile_e2e_h200_b1_layer_kernels_$kernels" --methods ${METHODS:-bf16,hyquant} \
            --prefixes 1024 --steps 8 --top 60 --layer-kernels $kernels 2>&1 | grep -v "^ " | tail -4
    done
fi
