#!/bin/bash
# One GPU call (~7 min): the B=1 decode step before and after a change to the per-step cache glue, in the same
# call. The tree's version runs second; the version before it must be put at $BEFORE (a copy of the old
# hyquant_jax/cache.py, e.g. `git show HEAD~1:hyquant_jax/cache.py > .gpu_run/cache_before.py`, carried along).
# Each run: e2e.py's b1 section at 1K and 32K, bf16 and hyquant (ratios within one run).
# Run on the GPU box from the repository root:  BEFORE=.gpu_run/cache_before.py bash benchmarks/gpu_ring_append_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
cp hyquant_jax/cache.py /tmp/cache_after.py
for which in before after; do
    if [ $which = before ]; then cp "$BEFORE" hyquant_jax/cache.py; else cp /tmp/cache_after.py hyquant_jax/cache.py; fi
    timeout ${E2E_LIMIT:-200} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_b1_glue_$which --sections b1 \
        --methods bf16,hyquant --prefixes 1024,32768 --steps 32 --reps 3 --no-plot > "$OUT/e2e_h200_b1_glue_$which.log" 2>&1
    echo "$which rc=$?"; grep -A6 "^B=1" "$OUT/e2e_h200_b1_glue_$which.log" | head -8
done
cp /tmp/cache_after.py hyquant_jax/cache.py
