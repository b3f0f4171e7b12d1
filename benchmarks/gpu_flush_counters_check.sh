#!/bin/bash
# GPU A/B (issue 5, session 31): the flush's counters (num_pages, num_vl, ring_start, ring_len) updated
# outside `flush_full_rings`' lax.cond, so the branch that flushes nothing no longer passes them through
# (XLA copied three s32[B] counters per layer and step there: `memcpy32_post` in the B=1 profile).
# The change is benchmarks/results/flush_counters.patch; build the overlay here first
#   bash benchmarks/prepare_overlay.sh flush_counters
# then, with carry [".gpu_run"]:  PART=1 bash benchmarks/gpu_flush_counters_check.sh   (~8 min)
#                                 PART=2 bash benchmarks/gpu_flush_counters_check.sh   (~4 min)
# PART=1: the decode loop's copies and launches for main (compile only, 2 layers, 32K prefix), then
# gpu_overlay_ab.sh (e2e B=1 1K/32K for main, the cache-write GPU tests with the overlay, e2e for it).
# PART=2: the overlay's copies and launches, then the layer kernels' GPU tests (norm/RoPE kernels and the
# compiled decode step, not run since session 29's refactor). One log, flush_ab.log, for the compile runs.
# Session 31 ran PART=1 only (the patch was slower); the layer tests ran in benchmarks/gpu_s31_checks.sh.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
hlo() {
    timeout ${HLO_LIMIT:-150} python3 benchmarks/decode_hlo_copies.py --out "$OUT/hlo_$1" \
        --name "decode_hlo_copies_h200_$1" --prefix 32768 > "$OUT/hlo_$1.log" 2>&1
    echo "hlo $1 rc=$?"; grep copies "$OUT/hlo_$1.log"
    tar -czf "$OUT/decode_hlo_copies_h200_$1.tgz" -C "$OUT" "hlo_$1" && rm -r "$OUT/hlo_$1"
    cat "$OUT/hlo_$1.log" >> "$OUT/flush_ab.log"; rm "$OUT/hlo_$1.log"
}
if [ "${PART:-1}" = 1 ]; then
    hlo main
    TESTS="gpu" TEST_FILES="tests/test_cache_write.py" OUT="$OUT" bash benchmarks/gpu_overlay_ab.sh
else
    cp -r .gpu_run/overlay/. .
    hlo overlay
    timeout ${TEST_LIMIT:-200} python3 -m pytest -m gpu tests/test_norm_rope.py tests/test_models.py -q \
        -p no:cacheprovider -rA > "$OUT/layer_kernels_gpu_tests.log" 2>&1
    echo "layer tests rc=$?"; tail -2 "$OUT/layer_kernels_gpu_tests.log"
fi
