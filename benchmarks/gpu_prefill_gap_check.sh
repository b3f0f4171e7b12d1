#!/bin/bash
# One GPU call (~6-9 min) on the 42-45 ms idle stretch of a 4K whole-prompt hyquant prefill (Mosaic kernel;
# benchmarks/NOTES.md, "End-to-end"). Suspect: XLA re-recording the CUDA graph ("command buffer") that holds the
# 36 Mosaic GPU calls (they are recorded by stream capture, so a graph update after a buffer address changes
# redoes the capture on the host). For each XLA_FLAGS variant: the whole-prompt prefill time at 4K (e2e.py, bf16
# and hyquant, no profiler) and the hyquant prefill's kernel / idle breakdown (profile_e2e.py, with
# --xla_enable_command_buffers_during_profiling=true: in the XLA sources read, the flag defaults to false and the
# runtime then runs thunks one by one under the profiler; yet earlier decode profiles list `set_case_condition`,
# a command-buffer kernel, so which mode they ran in is not certain, and this pins it). Variants: 0 XLA's default; 1 command buffers without
# CUSTOM_CALL (Mosaic kernels launched directly); 2 command buffers off. RUN picks variants (default all three,
# which may not fit one 600 s call).
# Run on the GPU box from the repository root:  RUN="0 1" bash benchmarks/gpu_prefill_gap_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
VARIANTS=("" "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN,DYNAMIC_SLICE_FUSION"
          "--xla_gpu_enable_command_buffer=")
for i in ${RUN:-0 1 2}; do
    flags=${VARIANTS[$i]}
    echo "== variant $i: XLA_FLAGS='$flags'"
    XLA_FLAGS="$flags" timeout ${E2E_LIMIT:-150} python3 benchmarks/e2e.py --out "$OUT" --name prefill_gap_e2e_v$i \
        --sections prefill --methods bf16,hyquant --prefill-backend mosaic --prefill-block 128 \
        --prefill-prefixes 4096 --no-plot > "$OUT/prefill_gap_e2e_v$i.log" 2>&1
    echo "e2e rc=$?"; grep -A3 "^prefill (B=" "$OUT/prefill_gap_e2e_v$i.log"
    XLA_FLAGS="$flags --xla_enable_command_buffers_during_profiling=true" XLA_PYTHON_CLIENT_PREALLOCATE=false \
        timeout ${PROFILE_LIMIT:-90} python3 \
        benchmarks/profile_e2e.py --out "$OUT" --name prefill_gap_profile_v$i --sections prefill --prefixes 4096 \
        --methods hyquant --prefill-backend mosaic --prefill-block 128 --top 30 \
        > "$OUT/prefill_gap_profile_v$i.log" 2>&1
    echo "profile rc=$?"; grep -E "^== prefill|idle " -A3 "$OUT/prefill_gap_profile_v$i.log" | cut -c1-120
done
