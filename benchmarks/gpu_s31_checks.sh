#!/bin/bash
# One GPU call (~7 min, session 31): (1) the layer kernels' GPU tests (norm/RoPE kernels, the compiled bf16
# decode step with and without them; not run since session 29's `_add_norm` refactor and 16-warp default);
# (2) bf16's B=1 step with XLA's autotuner kept off cuBLAS (--xla_gpu_cublas_fallback=false: the gate/up GEMVs
# ran as cuBLAS nvjet at 3.67 TB/s while the Triton down GEMV reached 4.12 TB/s), default flags then the flag,
# one process each; (3) the B=1 32K step's kernel breakdown for bf16 and hyquant with today's code.
#   bash benchmarks/gpu_s31_checks.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout ${TEST_LIMIT:-200} python3 -m pytest -m gpu tests/test_norm_rope.py tests/test_models.py -q \
    -p no:cacheprovider -rA > "$OUT/s31_layer_kernels_gpu_tests.log" 2>&1
echo "layer tests rc=$?"; tail -2 "$OUT/s31_layer_kernels_gpu_tests.log"
for variant in default no_cublas; do
    flags=""
    [ $variant = no_cublas ] && flags="--xla_gpu_cublas_fallback=false"
    XLA_FLAGS="$flags" timeout ${E2E_LIMIT:-150} python3 benchmarks/e2e.py --out "$OUT" \
        --name "e2e_h200_s31_bf16_$variant" --sections b1 --methods bf16 --prefixes 1024,32768 --steps 32 \
        --reps 3 --no-plot > "$OUT/e2e_$variant.log" 2>&1
    echo "$variant rc=$?"; grep -A3 "^B=1" "$OUT/e2e_$variant.log" | head -4
    cat "$OUT/e2e_$variant.log" >> "$OUT/s31_e2e.log"; rm "$OUT/e2e_$variant.log"
done
timeout ${PROFILE_LIMIT:-200} python3 benchmarks/profile_e2e.py --out "$OUT" --name profile_e2e_h200_s31_b1_32k \
    --methods bf16,hyquant --prefixes 32768 --steps 8 --top 60 > "$OUT/profile_e2e_h200_s31_b1_32k.log" 2>&1
echo "profile rc=$?"; grep "^==" "$OUT/profile_e2e_h200_s31_b1_32k.log"
