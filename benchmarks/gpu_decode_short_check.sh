#!/bin/bash
# One GPU call (~5 min) on the short-context decode (issue 3's target: faster than the best bf16 kernel from
# 4K; main is 0.65x-0.75x of XLA's at 1K-8K): (1) the kernel breakdown of one decode call at B=1 1K/4K/8K
# (profile_decode.py --trace: decode kernel, XLA's q fusion and merge, gaps), (2) split counts against the
# heuristic's (at B=1 it launches up to 64 low-bit splits per KV head, one 128-token tile each below 8K).
# Run on the GPU box from the repository root:  bash benchmarks/gpu_decode_short_check.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=. PYTHONUNBUFFERED=1
timeout 150 python3 benchmarks/profile_decode.py --out "$OUT" --name decode_profile_short_h200 \
    --trace "B1 1K,B1 4K,B1 8K" > "$OUT/decode_profile_short_h200.log" 2>&1
echo "profile rc=$?"; grep -E "us/call|^ +[0-9]" "$OUT/decode_profile_short_h200.log" | cut -c1-120
SPLITS=${SPLITS:-";n_low=2,n_vl=1;n_low=4,n_vl=1;n_low=8,n_vl=2;n_low=16,n_vl=4;n_low=32,n_vl=8"}
timeout 240 python3 benchmarks/decode_kernel.py --out "$OUT" --name decode_short_splits_h200 \
    --cases "B1 1K,B1 4K,B1 8K" --compare-tunings "$SPLITS" > "$OUT/decode_short_splits_h200.log" 2>&1
echo "split compare rc=$?"; grep -vE "^\{|^read|^case" "$OUT/decode_short_splits_h200.log" | cut -c1-160 | tail -30
