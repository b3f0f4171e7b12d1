#!/bin/bash
# Prepared in session 42 for the next GPU session; one call each, ~3-6 min.
# PART=a (~3 min): the hyquant B=1 32K step as it runs since session 42 (the step's token as its own split, the
#   append after the Triton launch): each layer's kernels in order under XLA's command buffers, to see what now
#   separates the Mosaic kernel's end from the o projection (session 39: the merge, ~10.8 us; session 40's merge
#   kernel: ~6.6 us) and where the append landed.
# PART=b (~6 min): the fused q/k/v GEMM probe, `PART=b bash benchmarks/gpu_next_s42.sh` (build
#   .gpu_run/fused_qkv_probe first with `bash benchmarks/prepare_patched_tree.sh fused_qkv_probe`; the patch
#   still applies at session 42's HEAD).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ "${PART:-a}" = a ]; then
  XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. PYTHONUNBUFFERED=1 timeout 240 python3 \
    benchmarks/profile_e2e.py --out "$OUT" --name profile_graphs_s43 --methods hyquant --prefixes 32768 \
    --steps 16 --top 30 --dump-events > "$OUT/profile_graphs_s43.log" 2>&1
  echo "profile rc=$?"; grep "==" "$OUT/profile_graphs_s43.log"; ls -la "$OUT"
else
  PART=b bash benchmarks/gpu_next_s42.sh
fi
