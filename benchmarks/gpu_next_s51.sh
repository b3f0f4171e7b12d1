#!/bin/bash
# Prepared in session 51 (its one device call ran gpu_next_s50.sh PART=k; no device was lent after it). One GPU
# call per PART, in this order of value:
# PART=m (~8 min): `PART=m bash benchmarks/gpu_next_s50.sh`: the prefix kernel's GPU tests (chunk_impl "auto" and
#   block_q 128 against the references), the launch sweep, e2e chunked prefill at 32K and 128K.
# PART=s (~3 min): `benchmarks/stream_probe.py`: how fast a copy-only Mosaic kernel streams the low-bit pages in
#   other copy shapes (wider box rows, several pages a copy, more slots). The decode kernel's own streaming
#   floor (~2.9 TB/s, session 38) bounds B1 128K; if a shape streams near read_bandwidth.py's ~4.3 TB/s, the
#   kernel could take its pages that way (the only lead big enough for the 128K target).
# PART=t (~6 min): the per-call cost: the B=1 step at 32K and 128K with decode calls of 64 and of 256 steps,
#   bf16 and hyquant in one call (sessions 46-48 suspected a per-call command-buffer cost that 64-step calls
#   charge to 64 steps).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${PART:-m}" in
m)
  PART=m bash benchmarks/gpu_next_s50.sh
  ;;
s)
  PYTHONPATH=. timeout 300 python3 benchmarks/stream_probe.py --out "$OUT" --name stream_probe_s51 \
    > "$OUT/stream_probe_s51.log" 2>&1
  echo "rc=$?"; cat "$OUT/stream_probe_s51.log" | grep -v Warning | tail -45
  PYTHONPATH=. timeout 120 python3 benchmarks/read_bandwidth.py --out "$OUT" --name read_bandwidth_s51 > "$OUT/read_bandwidth_s51.log" 2>&1
  echo "read rc=$?"; tail -4 "$OUT/read_bandwidth_s51.log"
  ;;
t)
  for steps in 64 256; do
    PYTHONPATH=. timeout 270 python3 benchmarks/e2e.py --out "$OUT" --name e2e_b1_steps${steps}_s51 --sections b1 \
      --methods bf16,hyquant --prefixes 32768,131072 --steps $steps --reps 3 --no-plot \
      > "$OUT/e2e_b1_steps${steps}_s51.log" 2>&1
    echo "steps $steps rc=$?"; grep -A6 "^B=1" "$OUT/e2e_b1_steps${steps}_s51.log"
  done
  ;;
esac
