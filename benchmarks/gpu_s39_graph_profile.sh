#!/bin/bash
# Session 39, call 5 (~3 min): the hyquant B=1 32K decode step as it runs (XLA's command buffers kept under the
# profiler), with the Mosaic launch after the ring append: each layer's kernels in order, and the compiled
# loop's HLO kept this time (its fusion names are the kernel names; session 36 dropped it) to tell the merge
# and ring-score fusions apart.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
XLA_FLAGS=--xla_enable_command_buffers_during_profiling=true PYTHONPATH=. PYTHONUNBUFFERED=1 timeout 240 python3 \
  benchmarks/profile_e2e.py --out "$OUT" --name profile_graphs_s39 --methods hyquant --prefixes 32768 \
  --steps 16 --top 30 --dump-events > "$OUT/profile_graphs_s39.log" 2>&1
echo "profile rc=$?"; grep "==" "$OUT/profile_graphs_s39.log"; ls -la "$OUT"
