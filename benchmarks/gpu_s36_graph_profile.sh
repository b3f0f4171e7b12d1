#!/bin/bash
# Session 36, call 2 (~8 min). (1) Where the B=1 32K step idles when it runs as XLA's command buffers (CUDA
# graphs), as it does unprofiled: earlier profiles ran every thunk on its own (XLA turns command buffers off
# under the profiler by default), so their idle time included launch overhead the real step does not have.
# (2) e2e B=1, one process per variant: as timed so far (no stop tokens: XLA knows bf16's trip count), with a
# stop token that never occurs (as `generate` decodes: both loops stop on data), and at 32K with the custom
# calls (Pallas and Mosaic kernels) left out of the command buffers.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. timeout 200 python3 \
  benchmarks/profile_e2e.py --out "$OUT" --name profile_graphs_s36 --methods bf16,hyquant --prefixes 32768 \
  --steps 16 --top 30 --dump-events > "$OUT/profile_graphs_s36.log" 2>&1
echo "profile rc=$?"; grep "==" "$OUT/profile_graphs_s36.log"
rm -f "$OUT"/profile_graphs_s36_hlo_*
VARIANTS=$'.|bf16,hyquant||\n.|bf16,hyquant||--stop-token\n.|bf16,hyquant|--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN,DYNAMIC_SLICE_FUSION,CONDITIONAL|--prefixes 32768' \
  PREFIXES=1024,32768 STEPS=64 REPS=3 RUN_LIMIT=170 NAME=e2e_stop_token_s36 bash benchmarks/gpu_e2e_variants.sh
