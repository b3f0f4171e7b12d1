#!/bin/bash
# Needs the patched tree: `bash benchmarks/prepare_patched_tree.sh decode_fixed_runs`, then run with .gpu_run carried.
# session 35 call 4: GPU kernel time against idle time of the decode step, nested vs flat loops (1K), and
# hyquant / bf16 at 32K, from the JAX profiler (benchmarks/profile_e2e.py); the fixed-runs tree's static too.
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 240 python3 benchmarks/profile_e2e.py --out $OUT --name profile_loops_s35_main \
  --methods static,static_flat,bf16_static --prefixes 1024 --steps 64 --top 12 > $OUT/profile_loops_s35_main.log 2>&1
echo "main rc=$?"; grep "==" $OUT/profile_loops_s35_main.log
(cd .gpu_run/decode_fixed_runs && PYTHONPATH=. timeout 120 python3 benchmarks/profile_e2e.py --out $OUT \
  --name profile_loops_s35_fixed --methods static --prefixes 1024 --steps 64 --top 12) > $OUT/profile_loops_s35_fixed.log 2>&1
echo "fixed rc=$?"; grep "==" $OUT/profile_loops_s35_fixed.log
PYTHONPATH=. timeout 200 python3 benchmarks/profile_e2e.py --out $OUT --name profile_e2e_s35_32k \
  --methods bf16,hyquant --prefixes 32768 --steps 64 --top 30 > $OUT/profile_e2e_s35_32k.log 2>&1
echo "32k rc=$?"; grep "==" $OUT/profile_e2e_s35_32k.log
