#!/bin/bash
# One GPU call (~8 min): does XLA's CONCURRENT command-buffer scheduling (CUDA-graph nodes ordered only by data
# dependencies) let the hybrid decode's independent kernels overlap (the Mosaic low-bit kernel and the Triton
# VL/ring launch), against XLA's default (LHS: the thunks' order)?
#   1. decode_kernel.py --compare-schedules: hybrid and bf16 baselines under both modes, one process;
#   2. e2e.py's B=1 section at 1K and 32K (bf16 and hyquant each run) without and with
#      XLA_FLAGS=--xla_gpu_command_buffer_scheduling_mode=CONCURRENT.
# PART=profile instead profiles e2e's B=1 decode step (profile_e2e.py, hyquant and bf16 at 1K) under both modes,
# with command buffers kept on under the profiler, to see which kernels the mode changes.
# Run on the GPU box from the repository root:  [PART=profile] bash benchmarks/gpu_schedule_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ "${PART:-measure}" = profile ]; then
    for mode in default CONCURRENT; do
        flags="--xla_enable_command_buffers_during_profiling=true"
        if [ $mode = CONCURRENT ]; then flags="$flags --xla_gpu_command_buffer_scheduling_mode=CONCURRENT"; fi
        XLA_FLAGS="$flags" timeout ${PROFILE_LIMIT:-110} python3 benchmarks/profile_e2e.py --out "$OUT" \
            --name profile_e2e_h200_schedule_$mode --methods ${METHODS:-hyquant,bf16} --prefixes ${PREFIXES:-1024} \
            --steps 8 --top 60 > "$OUT/profile_e2e_h200_schedule_$mode.log" 2>&1
        echo "profile $mode rc=$?"; tail -3 "$OUT/profile_e2e_h200_schedule_$mode.log" | cut -c1-300
    done
    exit 0
fi
timeout ${KERNEL_LIMIT:-170} python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_schedules_h200 \
    --cases "${CASES:-B1 4K,B1 8K,B1 32K,B1 128K,B16 32K}" --compare-schedules LHS,CONCURRENT \
    > "$OUT/decode_schedules_h200.log" 2>&1
echo "kernel rc=$?"; grep "schedules" "$OUT/decode_schedules_h200.log" | cut -c1-400
for mode in default CONCURRENT; do
    flags=""
    if [ $mode = CONCURRENT ]; then flags="--xla_gpu_command_buffer_scheduling_mode=CONCURRENT"; fi
    XLA_FLAGS="$flags" timeout ${E2E_LIMIT:-170} python3 benchmarks/e2e.py --out "$OUT" --name e2e_h200_b1_schedule_$mode \
        --sections b1 --methods bf16,hyquant --prefixes ${PREFIXES:-1024,32768} --steps 32 --reps 3 --no-plot \
        > "$OUT/e2e_h200_b1_schedule_$mode.log" 2>&1
    echo "$mode rc=$?"; grep -A6 "^B=1" "$OUT/e2e_h200_b1_schedule_$mode.log" | head -8
done
